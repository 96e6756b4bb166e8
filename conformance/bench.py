"""Throughput against plain decoding, measured in the same process, paired and interleaved (doc §4).

Procedure (one engine, one prompt set, greedy unless the requests say otherwise):

1. warm-up: one untimed call of plain and of every (mode, budget) on the first request;
2. repeats: each repeat runs every request once under plain and once under every method, one
   request per ``generate`` call, alternating: for request i of repeat r, plain runs first when
   ``r + i`` is even and last when it is odd, and the methods rotate, so neither order nor drift
   favours a side;
3. times come from the best clock the engine offers, per call (``clock`` in the report):
   ``device`` (``timings.stages["round_device"]``: the engine's decode loop timed with CUDA
   events), ``engine`` (``stages["round_wall"]`` or ``timings.decode``: the engine's host clock
   around its decode loop), else ``call`` (the wall clock of the ``generate`` call, prefill
   included). An engine's time may not exceed the wall time of the call around it;
4. the cost model, per repeat: ``step`` = plain decode seconds / plain decode tokens (one per
   step), ``round`` = method decode seconds / rounds, ``tau`` = decode tokens emitted / rounds;
   the measured ratio is ``step / round`` and the repeat's speedup is ``tau x step / round``,
   which is exactly the decode tokens/s ratio: the engine's rounds cancel, so nothing it reports
   but its clock moves the speedup, and tokens are counted from its outputs. At T=0 tau is the
   same in every repeat (the acceptance run is deterministic), so the noise is in the time ratio,
   and a shortfall splits into "accepts less" (tau) and "costs more" (round time in plain steps).
   This tau counts emitted tokens, so it sits slightly under the acceptance tau (bonus included)
   when the last round of a request is cut at ``max_new_tokens``. An engine that reports no rounds
   gets tau 1 (its cost view is left out);
5. the interval and the stopping rule are :mod:`ddtree_conformance.sequential`'s: with lower
   edges (from baselines) the repeats go on until every method's interval clears its edge or the
   plan's time budget or repeat cap is spent; without, ``repeats`` repeats and one look.

Acceptance metrics (tau pooled over all rounds of all prompts, per-position acceptance,
acceptance-length histogram) come from the first timed repeat; at T=0 every repeat is identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from ddtree_conformance.adapters.interface import Engine, Request, RequestResult, RunConfig

from . import run as run_identity
from .machine_state import Sampler, describe, summarise
from .metrics import acceptance_histogram, emitted_lengths, mean_tau, per_position_acceptance
from .paired import (
    MIXED,
    Arm,
    BenchError,
    CallTiming,
    Measured,
    Repeat,
    Stream,
    WarmupRule,
    anchored_rotation,
    call_timing,
    measure,
    merge_settings,
    run_settings,
)
from .sequential import (
    DEFAULT_POWER,
    METHOD,
    SPENDING,
    Interval,
    SequentialPlan,
    cv,
    detectable_drop,
    look_alpha,
    ratio_interval,
)

__all__ = [
    "MIXED",
    "Arm",
    "BenchError",
    "CallTiming",
    "Measured",
    "Repeat",
    "Stream",
    "WarmupRule",
    "acceptance_summary",
    "machine_part",
    "anchored_rotation",
    "busy_shares",
    "call_timing",
    "describe_settings",
    "measure",
    "merge_settings",
    "run_bench",
    "run_settings",
    "settings_warnings",
]

Run = tuple[str, "int | None"]


def acceptance_summary(results: Sequence[RequestResult]) -> dict:
    """tau (pooled and per-response mean), per-position acceptance and histogram of one run.

    A last round cut short by the length limit or a stop token counts the tokens it emitted, not
    the length the engine reports for it: engines differ in what they report there, and a length
    past the output's end is a claim nobody can check (claimed as the block size, it would lift the
    gate's tau by about one token per round on 64-token outputs)."""
    lengths = [emitted_lengths(r.acceptance_lengths, len(r.output_ids)) for r in results if r.acceptance_lengths]
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
    return run_identity.Run(mode, budget).label


def settings_warnings(settings: dict, device: str) -> list[str]:
    """What a reader of a bench must know about its settings: eager GPU runs, settings that changed
    within the run, GPU engines that do not say whether they used CUDA graphs."""
    out = []
    changed = sorted(k for k, v in settings.items() if v == MIXED)
    if changed:
        out.append(f"settings changed within the run ({', '.join(changed)}): its calls are not alike")
    if device.startswith("cuda"):
        graphs = settings.get("cuda_graphs")
        if graphs is False:
            out.append(
                "eager-mode GPU run (cuda_graphs off): an eager decode loop is launch-bound and its host "
                "jitter hides regressions (one port's eager bench hid a 31.6 % loss); bench with CUDA graphs "
                "on, as the engine ships"
            )
        elif graphs is None:
            out.append(
                "the engine does not report whether it ran under CUDA graphs (engine_settings); an eager GPU "
                "bench is launch-bound and hides regressions"
            )
    return out


def run_bench(
    engine: Engine,
    requests: list[Request],
    make_config: Callable[[str, int | None], RunConfig],
    runs: Sequence[Run],
    *,
    repeats: int = 5,
    edges: dict[str, float] | None = None,
    plan: SequentialPlan | None = None,
    warmup: bool | WarmupRule = True,
    on_step: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
    probe_busy: bool | None = None,
    spreads: dict[str, tuple[float, int]] | None = None,
    sampler: Sampler | None = None,
    one_run: Sequence[str] = (),
) -> dict:
    """Measure ``runs`` against plain; returns the ``bench`` and ``runs`` parts of a run report.

    ``edges`` maps a run label (``ddtree-B32``) to the lower edge of its speedup band: those runs go
    sequential under ``plan`` (default :class:`SequentialPlan`); without edges, ``repeats`` fixed
    repeats and one look at ``plan.alpha``. One :func:`measure` with the arms plain + each run and
    one stream per run: its speedup ``tau x step / round`` against plain. The report records the
    engine settings every call ran under (``bench.engine_settings``, ``warnings``) and, with
    ``probe_busy`` (default: on CUDA), each run's GPU-busy share from one profiled call after the
    timed repeats. ``spreads`` (label -> between-run variance of the log speedup and its degrees of
    freedom, from a baseline of several runs) widen those runs' sequential intervals
    (:func:`ddtree_conformance.sequential.combined_interval`); ``one_run``: labels whose baseline has one
    run, whose interval below the edge stops inconclusive, as the gate judges it. The machine is sampled after every
    warm-up round and repeat (``sampler``, default a :class:`~ddtree_conformance.machine_state.Sampler` of
    the run's device) into ``bench.machine``; the warm-up's rounds and why it stopped into ``bench.warmup``.
    """
    plan = plan or SequentialPlan()
    labels = [_label(*run) for run in runs]
    edges = {k: v for k, v in (edges or {}).items() if k in labels}
    arms = [Arm("plain", engine, make_config("plain", None))]
    arms += [Arm(label, engine, make_config(mode, budget)) for label, (mode, budget) in zip(labels, runs)]
    streams = [
        Stream(
            label,
            ("plain", label),
            lambda rep, label=label: rep.sample(label)["speedup"],
            edges.get(label),
            (spreads or {}).get(label) if label in edges else None,
            label not in one_run,
        )
        for label in labels
    ]
    device = arms[0].config.device
    sampler = sampler if sampler is not None else Sampler(device)
    measured = measure(
        arms, requests, streams, repeats=repeats, plan=plan, warmup=warmup, on_step=on_step, now=now, sampler=sampler
    )
    plan = measured.plan or plan  # as re-planned within the time budget: the report's looks and levels
    report = _report(
        measured.history, measured.first, list(zip(labels, runs)), measured.stop, edges, plan, bool(edges), repeats
    )
    report["bench"].update(machine_part(measured, sampler))
    for label in labels:
        if (spreads or {}).get(label) and label in edges:
            entry = next(r for r in report["runs"] if r["label"] == label)
            entry["speedup"]["spread"] = {"log_var": spreads[label][0], "df": spreads[label][1]}
    busy = (
        busy_shares(arms, requests[:1]) if (probe_busy if probe_busy is not None else device.startswith("cuda")) else {}
    )
    describe_settings(report, measured.settings, busy, device)
    return report


def busy_shares(arms: Sequence[Arm], requests: list[Request]) -> dict[str, float | None]:
    """One profiled call per arm (``RunConfig.profile``): the share of its decode loop the device was busy
    (``stages["gpu_busy"]`` over the decode span), or None where the engine does not measure it."""
    shares: dict[str, float | None] = {}
    for arm in arms:
        results = arm.engine.generate(requests, arm.config.model_copy(update={"profile": True}))
        busy = [r.timings.stages.get("gpu_busy") for r in results]
        span = [r.timings.stages.get("round_device", r.timings.stages.get("round_wall")) for r in results]
        ok = all(b is not None for b in busy) and all(s for s in span)
        shares[arm.label] = sum(busy) / sum(span) if ok and busy else None
    return shares


def describe_settings(report: dict, settings: dict[str, dict], busy: dict[str, float | None], device: str) -> None:
    """Put the run's engine settings, their warnings and the GPU-busy shares into ``report`` (also into
    ``bench.timing_basis``, the line every report format prints)."""
    merged: dict = {}
    for arm_settings in settings.values():
        merged = merge_settings(merged, arm_settings)
    warnings = settings_warnings(merged, device)
    bench = report["bench"]
    bench["engine_settings"] = merged
    bench["warnings"] = warnings
    for run in report["runs"]:
        run["engine_settings"] = settings.get(run["label"], {})
        run["gpu_busy_share"] = None if busy.get(run["label"]) is None else round(busy[run["label"]], 4)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(merged.items()))
    line = f"{bench['timing_basis']}; engine settings: {shown or 'none reported'}"
    shares = [f"{r['label']} {r['gpu_busy_share']:.0%}" for r in report["runs"] if r["gpu_busy_share"] is not None]
    if shares:
        line += "; GPU busy (one profiled call): " + ", ".join(shares)
    if bench.get("machine"):
        line += f"; machine: {describe(bench['machine'])}"
    if bench.get("warmup", {}).get("reason"):
        line += f"; warm-up: {bench['warmup']['reason']}"
    bench["timing_basis"] = line + "".join(f"; WARNING: {w}" for w in warnings)


def machine_part(measured: Measured, sampler: Sampler | None) -> dict:
    """``machine`` (the state over the timed repeats: :func:`~ddtree_conformance.machine_state.summarise`,
    plus each repeat's sample) and ``warmup`` (rounds, seconds, steady, why it stopped) of a report."""
    states = [h.state for h in measured.history if h.state]
    machine = summarise(states, sampler) if states else {"gpu": "not sampled", "host": {}, "samples": 0}
    machine["per_repeat"] = states
    if sampler is not None:
        machine["identity"] = sampler.identity
    warm = {k: v for k, v in measured.warmup.items() if k != "states"}
    warm["last_state"] = (measured.warmup.get("states") or [None])[-1]
    return {"machine": machine, "warmup": warm}


def _report(history, first, methods, stop, edges, plan, sequential, repeats) -> dict:
    out_runs = [_plain_run(history, first)]
    for label, (mode, budget) in methods:
        banded = sequential and label in edges
        out_runs.append(_method_run(label, mode, budget, history, first, stop[label], edges, plan, banded))
    return {"bench": _bench_part(history, first, plan, sequential, repeats), "runs": out_runs}


def _plain_run(history, first) -> dict:
    """The report's run of plain decoding: its throughput per repeat and its step time."""
    plain_runs = [h.totals["plain"] for h in history]
    return {
        "mode": "plain",
        "budget": None,
        "label": "plain",
        "tau": 1.0,
        "tau_per_response_mean": 1.0,
        "per_position": [],
        "histogram": {},
        "rounds": sum(r.rounds or 0 for r in first["plain"]),
        "aggregate_only": False,
        "tokens": plain_runs[0].tokens,
        "tokens_per_s": [round(t.tokens / t.seconds, 3) for t in plain_runs],
        "step_s": [t.seconds / t.tokens for t in plain_runs],
        "cost_model": {"step_s": float(np.exp(np.mean(np.log([t.seconds / t.tokens for t in plain_runs]))))},
    }


def _looks(plan, banded: bool, repeats: int) -> tuple[int, int]:
    """(looks planned, looks taken) of a run that stopped after ``repeats``: one of each unless banded."""
    if not banded:
        return 1, 1
    taken = sum(1 for point in plan.looks() if point <= repeats)
    if not plan.is_look(repeats):
        taken += 1  # the final look when the budget ran out between planned looks
    return len(plan.looks()), taken


def _method_run(label, mode, budget, history, first, stop: dict, edges, plan, banded: bool) -> dict:
    """The report's run of one method: acceptance, throughput, cost model and speedup interval."""
    rows = [h.sample(label) for h in history[: stop["repeats"]]]
    speedups = [row["speedup"] for row in rows]
    looks_planned, looks_taken = _looks(plan, banded, len(rows))
    alpha_k = look_alpha(plan.alpha, looks_planned, banded)
    interval = _interval(speedups, alpha_k)
    totals = [h.totals[label] for h in history[: len(rows)]]
    return {
        "mode": mode,
        "budget": budget,
        "label": label,
        **acceptance_summary(first[label]),
        "tokens": totals[0].tokens,
        "tokens_per_s": [round(t.tokens / t.seconds, 3) for t in totals],
        "cost_model": _cost_model(rows, alpha_k),
        "speedup": {
            **interval,
            "median": round(float(np.median(speedups)), 4),
            "samples": [round(float(x), 6) for x in speedups],
            "wall_ratio_samples": [round(float(row["wall_ratio"]), 6) for row in rows],
            "cv": None if cv(speedups) is None else round(cv(speedups), 5),
            # the smallest change of the speedup this run's own noise and repeats resolve (80 % power)
            "resolution": _round(detectable_drop(speedups, alpha_k, 0.0, DEFAULT_POWER)),
            "alpha": plan.alpha,
            "sequential": banded,
            "min_repeats": plan.min_repeats,
            "max_repeats": plan.max_repeats,
            "growth": plan.growth,
            "looks": looks_taken,
            "looks_planned": looks_planned,
            "edge": edges.get(label),
            "stop": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in stop.items()},
        },
    }


def _cost_model(rows: list[dict], alpha_k: float) -> dict:
    """A method run's cost model from its per-repeat samples: tau, step and round times, step/round."""
    taus = [row["tau"] for row in rows]
    ratio_iv = _interval([row["ratio"] for row in rows], alpha_k)
    return {
        "definition": "speedup = tau x step / round; tau = decode tokens / rounds, step = plain decode s "
        "/ plain decode tokens, round = decode s / rounds",
        "tau": float(np.mean(taus)) if all(row["rounds_reported"] for row in rows) else None,
        "tau_constant": max(taus) - min(taus) <= 1e-9 * max(taus),
        "step_s": float(np.exp(np.mean(np.log([row["step_s"] for row in rows])))),
        "round_s": float(np.exp(np.mean(np.log([row["round_s"] for row in rows])))),
        "step_over_round": {**ratio_iv, "samples": [round(row["ratio"], 6) for row in rows]},
    }


def _bench_part(history, first, plan, sequential, repeats) -> dict:
    """The report's ``bench`` part: repeats, clocks, definitions and the plan."""
    clocks = {t.clock for h in history for t in h.totals.values()}
    return {
        "repeats": len(history),
        "interleaving": "per request, plain first or last in alternation, methods rotated per repeat",
        "timing_basis": "+".join(sorted(clocks)),
        "clock": "+".join(sorted(clocks)),
        "speedup_definition": "tau x (plain step time / round time) per repeat; geometric mean over repeats",
        "ci": f"{METHOD}; {SPENDING}" if sequential else f"{METHOD}; one look at alpha {plan.alpha}",
        "sequential": sequential,
        "plan": plan.as_report() if sequential else {"alpha": plan.alpha, "repeats": repeats},
        "tau_definition": "pooled: generated tokens / verification rounds over all prompts, bonus included",
        "requests": len(first["plain"]),
    }


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(float(x), digits)


def _interval(samples: list[float], alpha_k: float) -> dict:
    if len(samples) < 2:  # no interval from one sample: the gate reads it as inconclusive
        return {
            "estimate": float(samples[0]),
            "ci_low": None,
            "ci_high": None,
            "confidence": 1 - alpha_k,
            "n": len(samples),
        }
    iv: Interval = ratio_interval(samples, alpha_k)
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in iv.as_dict().items()}
