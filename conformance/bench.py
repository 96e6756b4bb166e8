"""Throughput as a ratio against plain decoding, measured in the same process (doc §4).

Procedure (one engine, one prompt set, greedy unless the requests say otherwise):

1. one untimed warm-up run of plain and of every (mode, budget), so lazy loading and first-call
   allocations are not timed;
2. ``repeats`` rounds; each round runs plain, then every method, in a rotated order so no method
   always runs right after plain;
3. tokens/s of a run = output tokens / sum over requests of (prefill + decode) seconds from
   :class:`RequestResult.timings`, or the wall-clock seconds of the ``generate`` call when an
   engine reports no timings (the report's ``timing_basis`` says which);
4. speedup of a method in round r = its tokens/s / plain tokens/s of round r; the result is the
   median over rounds with a seeded percentile-bootstrap confidence interval of that median.

Acceptance metrics (tau pooled over all rounds of all prompts, per-position acceptance,
acceptance-length histogram) come from the first timed round; at T=0 every round is identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ddtree_conformance.adapters.interface import Engine, Request, RequestResult, RunConfig

from .metrics import acceptance_histogram, mean_tau, per_position_acceptance

__all__ = ["BenchError", "Measurement", "bootstrap_median_ci", "acceptance_summary", "run_bench"]

Run = tuple[str, "int | None"]


class BenchError(RuntimeError):
    """A benchmark run failed (engine error, failed requests)."""


@dataclass
class Measurement:
    tokens: int
    seconds: float
    basis: str

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("nan")


def bootstrap_median_ci(samples: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95,
                        seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): percentile bootstrap of the median, numpy-seeded."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("no samples")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[idx], axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(medians, [alpha, 1 - alpha])
    return float(np.median(x)), float(low), float(high)


def measure(results: Sequence[RequestResult], wall_s: float) -> Measurement:
    tokens = sum(len(r.output_ids) for r in results)
    if all(r.timings.prefill is not None and r.timings.decode is not None for r in results):
        return Measurement(tokens, sum(r.timings.prefill + r.timings.decode for r in results), "prefill+decode")
    return Measurement(tokens, wall_s, "wall")


def acceptance_summary(results: Sequence[RequestResult]) -> dict:
    """tau (pooled and per-response mean), per-position acceptance and histogram of one run."""
    lengths = [r.acceptance_lengths for r in results if r.acceptance_lengths]
    if lengths and len(lengths) == len(results):
        per_response = [sum(ls) / len(ls) for ls in lengths]
        return {
            "tau": mean_tau(lengths),
            "tau_per_response_mean": sum(per_response) / len(per_response),
            "per_position": per_position_acceptance(lengths),
            "histogram": {str(k): v for k, v in acceptance_histogram(lengths).items()},
            "rounds": sum(len(ls) for ls in lengths),
            "aggregate_only": False,
        }
    taus = [r.tau for r in results if r.tau is not None]
    positions = [r.per_position_acceptance for r in results if r.per_position_acceptance]
    depth = max((len(p) for p in positions), default=0)
    mean_pos = [float(np.mean([p[d] if d < len(p) else 0.0 for p in positions])) for d in range(depth)]
    return {
        "tau": float(np.mean(taus)) if taus else None,
        "tau_per_response_mean": float(np.mean(taus)) if taus else None,
        "per_position": mean_pos,
        "histogram": {},
        "rounds": sum(r.rounds or 0 for r in results),
        "aggregate_only": True,
    }


def _label(mode: str, budget: int | None) -> str:
    return mode if budget is None else f"{mode}-B{budget}"


def run_bench(
    engine: Engine,
    requests: list[Request],
    make_config: Callable[[str, int | None], RunConfig],
    runs: Sequence[Run],
    *,
    repeats: int = 5,
    warmup: bool = True,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    on_step: Callable[[str], None] | None = None,
) -> dict:
    """Measure ``runs`` against plain; returns the ``bench`` and ``runs`` parts of a run report."""
    if repeats < 1:
        raise BenchError(f"repeats must be >= 1, got {repeats}")
    configs: dict[Run, RunConfig] = {("plain", None): make_config("plain", None)}
    for mode, budget in runs:
        configs[(mode, budget)] = make_config(mode, budget)

    def once(key: Run) -> tuple[list[RequestResult], Measurement]:
        started = time.perf_counter()
        results = engine.generate(requests, configs[key])
        wall = time.perf_counter() - started
        failed = [r for r in results if r.finish_reason == "error"]
        if failed:
            first = (failed[0].error or "").strip().splitlines()
            raise BenchError(f"{_label(*key)}: {len(failed)} of {len(results)} requests failed"
                             f" ({first[-1] if first else 'no message'})")
        if on_step:
            on_step(_label(*key))
        return results, measure(results, wall)

    if warmup:
        for key in configs:
            once(key)
    methods = list(configs)[1:]
    plain_m: list[Measurement] = []
    method_m: dict[Run, list[Measurement]] = {k: [] for k in methods}
    first_results: dict[Run, list[RequestResult]] = {}
    for r in range(repeats):
        order = methods[r % len(methods):] + methods[: r % len(methods)] if methods else []
        results, m = once(("plain", None))
        first_results.setdefault(("plain", None), results)
        plain_m.append(m)
        for key in order:
            results, m = once(key)
            first_results.setdefault(key, results)
            method_m[key].append(m)

    bases = {m.basis for m in plain_m} | {m.basis for ms in method_m.values() for m in ms}
    plain_tps = np.array([m.tokens_per_s for m in plain_m])
    out_runs = []
    for key in [("plain", None), *methods]:
        mode, budget = key
        summary = acceptance_summary(first_results[key]) if mode != "plain" else {
            "tau": 1.0, "tau_per_response_mean": 1.0, "per_position": [], "histogram": {},
            "rounds": sum(len(r.output_ids) for r in first_results[key]), "aggregate_only": False,
        }
        ms = plain_m if mode == "plain" else method_m[key]
        tps = np.array([m.tokens_per_s for m in ms])
        entry = {
            "mode": mode,
            "budget": budget,
            "label": _label(mode, budget),
            **summary,
            "tokens": ms[0].tokens,
            "tokens_per_s": [round(float(t), 3) for t in tps],
        }
        if mode != "plain":
            ratios = tps / plain_tps
            median, low, high = bootstrap_median_ci(ratios, resamples=resamples, confidence=confidence, seed=seed)
            cv = float(np.std(ratios, ddof=1) / np.mean(ratios)) if ratios.size > 1 else None
            entry["speedup"] = {
                "median": round(median, 4),
                "ci_low": round(low, 4),
                "ci_high": round(high, 4),
                "confidence": confidence,
                "resamples": resamples,
                "samples": [round(float(x), 4) for x in ratios],
                "cv": None if cv is None else round(cv, 4),
            }
            if ms[0].tokens != plain_m[0].tokens:
                entry["note"] = (f"generated {ms[0].tokens} tokens vs plain {plain_m[0].tokens}: "
                                 "tokens/s ratio is not a pure time-per-token ratio")
        out_runs.append(entry)
    bench = {
        "repeats": repeats,
        "warmup": warmup,
        "interleaving": "per round: plain, then the methods in rotated order",
        "timing_basis": "+".join(sorted(bases)),
        "speedup_definition": "method tokens/s / plain tokens/s of the same round; median over rounds",
        "ci": f"{int(confidence * 100)}% percentile bootstrap of the median, {resamples} resamples, seed {seed}",
        "tau_definition": "pooled: generated tokens / verification rounds over all prompts, bonus included",
        "requests": len(requests),
    }
    return {"bench": bench, "runs": out_runs}
