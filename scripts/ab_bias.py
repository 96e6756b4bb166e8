#!/usr/bin/env python
"""Is an A/A run unbiased? One build against itself, with the causes of a bias told apart.

An A/B run (``bench --against``) of a build against the same code must measure a ratio of 1. This script
runs exactly what ``bench --against`` runs (two engines, each in its own process, the bench's paired
measurement and sequential test) and records every ``generate`` call: its arm, whether it went first or
second in its pair, the process that ran just before it, and its decode seconds on the engine's clock. It
then splits the log ratio candidate / baseline into

* the **arm effect** (what the verdict sees: candidate over baseline, order balanced),
* the **order effect** (the first call of a pair over the second, arm balanced), and
* the **switch effect** (a call right after the other process over a call right after its own),

so an A/A bias reads as "the installed build is slower" (install kind), "whoever goes first is slower"
(warm caches, first-arm penalty) or neither. ``--against`` takes what ``bench --against`` takes: an engine
here (``reference``: the same installed code, so install kind is ruled out) or a folder / wheel /
requirement installed into an overlay environment (:func:`ddtree_conformance.ab.overlay_environment`).
``--candidate-from`` installs the candidate the same way, so both arms have the same install kind.
``--order`` picks the call order: ``pairs`` (the bench's: who goes first alternates per request and
repeat), ``fixed`` (the candidate always first: shows what an unbalanced order would do), ``random``
(seeded coin per pair).

    python scripts/ab_bias.py --against reference --repeats 30 --out /tmp/aa/same-install.json
    python scripts/ab_bias.py --against . --repeats 30 --out /tmp/aa/editable-vs-folder.json
    python scripts/ab_bias.py --candidate-from . --against . --repeats 30 --out /tmp/aa/folder-vs-folder.json
    python scripts/ab_bias.py --shape 8b --device cuda --dtype bfloat16 --repeats 40 --out /tmp/aa/8b.json

``--shape`` (a ``shaped_pair`` shape: ``8b``, ``tiny``) times a random-weight pair of a real model's shape
instead of the fixture: it is built once, written to a scratch folder as safetensors, and each engine
process loads it from there, as it would load a real checkpoint; its prompts are ``--prompt-len`` random ids.

``--pool RUN.json ... [--out POOLED.json]`` pools earlier runs: the between-run spread (``ab_spread``, ready for
``--ab-spread``), the bias with an interval that counts that spread (``bias_pct``, ``bias_ci_pct``), each run
judged as the A/B gate would judge it, and what the spread costs (:func:`pool`).

    python scripts/ab_bias.py --pool /tmp/aa/run-*.json --out /tmp/aa/pooled.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from ddtree_conformance.ab import baseline_for, measure_ab, pair_order
from ddtree_conformance.adapters.interface import Engine
from ddtree_conformance.adapters.process import IsolatedEngine
from ddtree_conformance.adapters.registry import create_engine
from ddtree_conformance.files import atomic_write
from ddtree_conformance.run import Run
from ddtree_conformance.sequential import SequentialPlan, combined_interval, verdict
from ddtree_conformance.session import SuiteSession
from ddtree_conformance.settings import DEFAULT_TORCH_THREADS, build_settings


def write_shaped_pair(shape: str, dtype: str | None, device: str | None, root: Path) -> dict:
    """Build the random-weight ``shape`` pair on ``device`` and write it under ``root`` (target in
    transformers' format, drafter in z-lab's), unless ``root`` already holds it: the settings that point
    the engines at it."""
    import torch

    from ddtree_conformance.adapters.reference.dflash import save_drafter
    from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair

    if shape not in SHAPES:
        raise SystemExit(f"ab_bias: --shape {shape!r} is not one of {sorted(SHAPES)}")
    written = root / "written.json"  # last, so a half-written pair is never reused
    settings = {"model_dir": str(root / "target"), "drafter_dir": str(root / "drafter")}
    if written.exists():
        if json.loads(written.read_text()) != {"shape": shape, "dtype": dtype}:
            held = written.read_text().strip()
            raise SystemExit(f"ab_bias: {root} holds another pair ({held}); use another --shape-dir")
        return settings
    target_dir, drafter_dir, target, drafter = build_shaped_pair(
        shape, getattr(torch, dtype or "float32"), device or "cpu", root
    )
    target.save_pretrained(str(target_dir), safe_serialization=True)
    save_drafter(drafter, drafter_dir)
    del target, drafter
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    written.write_text(json.dumps({"shape": shape, "dtype": dtype}))
    return settings


def factory(settings, build):
    """What ``bench --against`` starts for a build (``cli/ab.py``), without the CLI's modules (typer, rich:
    not on every GPU image): an engine process under the build's interpreter, or in this process."""

    def make(model_dir, drafter_dir):
        if build.installed or settings.isolate:
            return IsolatedEngine(
                build.spec,
                model_dir,
                drafter_dir,
                timeout_s=settings.engine_timeout_s,
                start_timeout_s=settings.engine_timeout_s,
                torch_threads=settings.torch_threads,
                python=build.python,
                sys_path=None if build.sys_path is None else list(build.sys_path),
                **settings.engine_options,
            )
        return create_engine(build.spec, model_dir, drafter_dir, **settings.engine_options)

    return make


class Recorded(Engine):
    """Passes calls through to ``inner`` and logs each one (shared log, so the order is the real one)."""

    def __init__(self, inner: Engine, side: str, log: list) -> None:
        self.inner, self.side, self.log = inner, side, log
        self.name = inner.name

    def capabilities(self):
        return self.inner.capabilities()

    def generate(self, requests, config):
        started = time.perf_counter()
        results = self.inner.generate(requests, config)
        wall = time.perf_counter() - started
        stages = [r.timings.stages for r in results]
        seconds = sum(s.get("round_device", s.get("round_wall", 0.0)) for s in stages)
        self.log.append({"side": self.side, "prompt": requests[0].prompt_ids[:4], "s": seconds, "wall": wall})
        return results

    def close(self):
        self.inner.close()


def _t_interval(values: list[float]) -> dict:
    x = np.asarray(values)
    half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    m = float(x.mean())
    return {"pct": 100 * (math.exp(m) - 1), "ci_pct": [100 * (math.exp(m - half) - 1), 100 * (math.exp(m + half) - 1)]}


def analyse(log: list[dict], prompts: int = 2) -> dict:
    """Split the per-pair log ratios into arm, order and switch effects (module doc)."""
    pairs = [
        (log[k], log[k + 1])
        for k in range(0, len(log) - 1, 2)
        if {log[k]["side"], log[k + 1]["side"]} == {"candidate", "baseline"}
    ]
    cand_first = [math.log(a["s"] / b["s"]) for a, b in pairs if a["side"] == "candidate"]
    base_first = [math.log(b["s"] / a["s"]) for a, b in pairs if a["side"] == "baseline"]  # still cand / base
    arm = cand_first + base_first  # log(candidate / baseline) per pair
    # order: log(first / second) per pair, whichever arm went first
    order = [math.log(a["s"] / b["s"]) for a, b in pairs]
    # switch: a call right after the other process vs right after its own, per arm and per prompt (prompts
    # differ in length, and which prompt follows a switch is fixed by the order): the pair's index k gives
    # repeat k // n and request k % n, so the prompt is (request + repeat) % n
    n = max(1, prompts)
    after_other: dict[tuple, list[float]] = {}
    after_own: dict[tuple, list[float]] = {}
    for j in range(1, len(log)):
        k = j // 2
        prompt = (k % n + k // n) % n
        key = (log[j]["side"], prompt)
        (after_own if log[j - 1]["side"] == log[j]["side"] else after_other).setdefault(key, []).append(
            math.log(log[j]["s"])
        )
    switch: dict[str, float] = {}
    for side in ("candidate", "baseline"):
        diffs = [
            np.mean(after_other[key]) - np.mean(after_own[key])
            for key in after_other
            if key[0] == side and key in after_own
        ]
        if diffs:
            switch[side] = round(100 * (math.exp(float(np.mean(diffs))) - 1), 2)
    return {
        "pairs": len(pairs),
        "candidate_over_baseline": _t_interval(arm),
        "candidate_over_baseline_when_candidate_first": _t_interval(cand_first) if len(cand_first) > 1 else None,
        "candidate_over_baseline_when_baseline_first": _t_interval(base_first) if len(base_first) > 1 else None,
        "first_over_second": _t_interval(order),
        "after_other_over_after_own_pct": switch,
    }


def pool(paths: list[Path]) -> dict:
    """Across A/A runs: each run's arm effect (mean log candidate/baseline per pair) with its standard
    error, the inverse-variance pooled effect, Cochran's Q (are the runs' effects more different than
    their own noise allows?), the DerSimonian-Laird between-run sd (the part of a run's A/A offset
    that its own interval does not cover) and the bias with that sd counted (:func:`random_effects_bias`).
    Then how the A/B gate would judge each run at its last look: without a spread, with this project's CPU
    spread, and with the spread of the *other* runs (left out in turn, as a gate configured from earlier A/A
    runs meets a new one)."""
    runs = [_read_run(path) for path in paths]
    effects, ses = [], []
    for data in runs:
        calls = data["calls"]
        logs = [
            math.log(a["s"] / b["s"]) if a["side"] == "candidate" else math.log(b["s"] / a["s"])
            for a, b in zip(calls[0::2], calls[1::2])
            if {a["side"], b["side"]} == {"candidate", "baseline"}
        ]
        effects.append(float(np.mean(logs)))
        ses.append(float(np.std(logs, ddof=1) / math.sqrt(len(logs))))
    k = len(effects)
    mean, q, tau2, w = between_runs(effects, ses)
    verdicts = []
    for i, data in enumerate(runs):
        spreads = {f"spread {CPU_SPREAD[0]:.1%}": CPU_SPREAD}
        if k >= 3:  # the others' spread needs two others (one degree of freedom)
            others = [j for j in range(k) if j != i]
            tau2_others = between_runs([effects[j] for j in others], [ses[j] for j in others])[2]
            spreads["spread of the other runs"] = (math.sqrt(tau2_others), k - 2)
        verdicts.append(_verdicts(data, spreads))
    bias, bias_ci = random_effects_bias(effects, ses, tau2)
    caught = {}
    if k > 1:  # with the pool's own spread: the slowdown from which each run, made that much slower, fails
        for tolerance in (0.05, 0.02):
            found = [failing_slowdown(data, tolerance, (math.sqrt(tau2), k - 1)) for data in runs]
            known = sorted(x for x in found if x is not None)
            caught[f"tolerance {tolerance:.0%}"] = {
                "median_pct": round(100 * known[len(known) // 2], 1) if known else None,
                "max_pct": round(100 * known[-1], 1) if known else None,
                "beyond_40_pct": len(found) - len(known),
            }
    return {
        "runs": k,
        "effects_pct": [round(100 * (math.exp(e) - 1), 2) for e in effects],
        "se_pct": [round(100 * s, 2) for s in ses],
        # inverse-variance (fixed-effect): its se counts only the runs' own noise, too small when Q says they differ
        "pooled_pct": round(100 * (math.exp(mean) - 1), 2),
        "pooled_se_pct": round(100 / math.sqrt(float(np.sum(w))), 2),
        # the bias question: is a new process pair off on average? Random effects (each run weighted by its own
        # variance plus the between-run one), 95 % interval on k - 1 degrees of freedom
        "bias_pct": bias,
        **({"bias_ci_pct": bias_ci} if bias_ci else {}),
        "q": round(q, 2),
        "q_p": float(stats.chi2.sf(q, k - 1)) if k > 1 else None,
        "between_run_sd_pct": round(100 * math.sqrt(tau2), 2),
        "ab_spread": f"{math.sqrt(tau2):.4f}:{k - 1}" if k > 1 else None,  # as bench --ab-spread takes it
        # how the A/B gate would judge each run at its last look (the bench's 3..60 plan: alpha / 8), per
        # tolerance, without and with a between-process spread as --ab-spread
        # computed from the runs' own ratios made slower, not trials: how slow a build must be to read FAIL
        "fails_from_slowdown_with_this_spread": caught,
        "verdicts_at_last_look": {
            key: {v: sum(run[key] == v for run in verdicts) for v in ("pass", "fail", "inconclusive")}
            for key in verdicts[0]
        },
    }


class PoolInputError(ValueError):
    """A file given to --pool that is not an A/A run this script wrote (the message names it)."""


def _read_run(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PoolInputError(f"--pool: cannot read {path}: {err}") from None
    calls = data.get("calls") if isinstance(data, dict) else None
    if not isinstance(calls, list) or not isinstance(data.get("ab"), dict):
        raise PoolInputError(f"--pool: {path} is not an A/A run written by ab_bias.py --out (no 'calls' or 'ab')")
    bad = next((i for i, c in enumerate(calls) if not (isinstance(c, dict) and {"side", "s"} <= c.keys())), None)
    if bad is not None:
        raise PoolInputError(f"--pool: {path}: calls[{bad}] has no 'side' and 's' (seconds)")
    return data


CPU_SPREAD = (0.019, 17)  # this project's CPU, 18 A/A runs (docs/reference/bench-and-gates.md)


def between_runs(effects: list[float], ses: list[float]) -> tuple[float, float, float, np.ndarray]:
    """Inverse-variance pooled mean, Cochran's Q, the DerSimonian-Laird between-run variance and the weights."""
    w = 1 / np.square(ses)
    mean = float(np.sum(w * effects) / np.sum(w))
    q = float(np.sum(w * np.square(np.asarray(effects) - mean)))
    k = len(effects)
    tau2 = max(0.0, (q - (k - 1)) / (np.sum(w) - np.sum(w**2) / np.sum(w))) if k > 1 else 0.0
    return mean, q, float(tau2), w


def random_effects_bias(effects: list[float], ses: list[float], tau2: float) -> tuple[float, list[float] | None]:
    """The runs' mean effect with each run weighted by 1 / (its se^2 + the between-run variance), as per cent,
    and its 95 % interval (Student-t on k - 1 degrees of freedom; none for one run). With no between-run
    variance it is the inverse-variance mean; with some, every run counts more alike and the interval is as
    wide as the process offsets make it, not as narrow as the runs' own noise."""
    w = 1 / (np.square(ses) + tau2)
    mean = float(np.sum(w * effects) / np.sum(w))
    pct = round(100 * (math.exp(mean) - 1), 2)
    if len(effects) < 2:
        return pct, None
    half = float(stats.t.ppf(0.975, len(effects) - 1)) / math.sqrt(float(np.sum(w)))
    return pct, [round(100 * (math.exp(mean - half) - 1), 2), round(100 * (math.exp(mean + half) - 1), 2)]


def _verdicts(data: dict, spreads: dict[str, tuple[float, int]]) -> dict:
    """This run's per-repeat ratios judged at tolerance 5 % and 2 %, without and with each between-process
    spread (sd, degrees of freedom)."""
    ratios = _ratios(data)
    out = {}
    for tolerance in (0.05, 0.02):
        for name, (sd, df) in {"": (0.0, 0), **spreads}.items():
            iv = combined_interval(ratios, 0.05 / 8, sd**2, df)
            found = {"pass": "pass", "regression": "fail", None: "inconclusive"}[verdict(iv, 1 - tolerance)]
            out[f"tolerance {tolerance:.0%}" + (f", {name}" if name else "")] = found
    return out


def failing_slowdown(data: dict, tolerance: float, spread: tuple[float, int]) -> float | None:
    """The smallest slowdown (0.1 % steps, up to 40 %) at which this A/A run's ratios, each divided by
    ``1 + slowdown``, would fail at ``tolerance`` with ``spread`` (sd, df) in the interval: what the gate
    can still catch with that spread. Computed from the run's own ratios, not a trial."""
    ratios = _ratios(data)
    for step in range(401):
        slow = step / 1000
        iv = combined_interval([r / (1 + slow) for r in ratios], 0.05 / 8, spread[0] ** 2, spread[1])
        if verdict(iv, 1 - tolerance) == "regression":
            return slow
    return None


def _ratios(data: dict) -> list[float]:
    """The run's per-repeat throughput ratios, baseline seconds over candidate seconds (its last repeats;
    each repeat's calls in order)."""
    argv = data.get("argv") or []
    limit = int(argv[argv.index("--limit") + 1]) if "--limit" in argv else 2
    per_repeat = 2 * (limit if limit % 2 == 0 else 2 * limit)
    repeats = (data["ab"].get("stop") or {}).get("repeats") or len(data["calls"]) // per_repeat
    calls = data["calls"][-repeats * per_repeat :]
    ratios = []
    for r in range(repeats):
        chunk = calls[r * per_repeat : (r + 1) * per_repeat]
        cand = sum(c["s"] for c in chunk if c["side"] == "candidate")
        base = sum(c["s"] for c in chunk if c["side"] == "baseline")
        ratios.append(base / cand)  # same tokens on both sides: the decode tokens/s ratio
    return ratios


def _pcts(effect: dict) -> str:
    return "[" + ", ".join(f"{x:+.2f}" for x in effect["ci_pct"]) + "]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="reference", help="the baseline: an engine here, or a folder/wheel to install")
    p.add_argument("--candidate-from", default=None, help="install the candidate too (same install kind)")
    p.add_argument("--order", choices=["pairs", "fixed", "random"], default="pairs")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--limit", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--pair", default=None, help="named pair (default: the fixture)")
    p.add_argument("--shape", default=None, help="a random-weight shaped pair instead (8b, tiny; module doc)")
    p.add_argument("--shape-dir", type=Path, default=None, help="keep the shaped pair here (reused)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens with --shape (random ids)")
    p.add_argument("--device", default=None, help="cpu (default), cuda, cuda:N")
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--pin", type=int, default=None, help="pin both engine processes (and their threads) to this core")
    p.add_argument(
        "--in-process",
        action="store_true",
        help="both engines in this process (no engine processes; --against an engine here)",
    )
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument(
        "--start-first",
        choices=["candidate", "baseline"],
        default="candidate",
        help="which engine process starts first",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=Path, nargs="*", default=None, help="only pool these runs' outputs")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.pool is not None:
        if not args.pool:
            p.error("--pool needs the runs' outputs (ab_bias.py --out files)")
        try:
            pooled = pool(args.pool)
        except PoolInputError as err:
            p.error(str(err))
        print(json.dumps(pooled))
        if args.out is not None:  # the pool as a file too, written whole or not at all
            atomic_write(args.out, json.dumps(pooled, indent=1) + "\n")
        return 0
    if args.out is None:
        p.error("--out is required")

    if args.shape and args.pair:
        p.error("--shape and --pair are alternatives")
    scratch = tempfile.TemporaryDirectory(prefix="ab-bias-pair-")
    root = args.shape_dir or Path(scratch.name)
    shaped = write_shaped_pair(args.shape, args.dtype, args.device, root) if args.shape else {}
    settings, _ = build_settings(
        dict(
            engine="reference",
            pair=args.pair,
            **shaped,
            device=args.device,
            dtype=args.dtype,
            modes="ddtree",
            budgets=str(args.budget),
            limit=args.limit,
            max_new_tokens=args.new_tokens,
            held_out_prompts=0,
            torch_threads=args.threads or DEFAULT_TORCH_THREADS,
            isolate=False if args.in_process else None,
        )
    )
    log: list[dict] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ab-bias-") as work:
        base_build = baseline_for(args.against, settings.engine, Path(work) / "baseline")
        cand_build = (
            baseline_for(args.candidate_from, settings.engine, Path(work) / "candidate")
            if args.candidate_from
            else baseline_for("reference", settings.engine, Path(work) / "candidate")
        )
        setup_s = time.perf_counter() - started
        sessions = [
            SuiteSession(settings, engine_factory=factory(settings, cand_build)),
            SuiteSession(settings, engine_factory=factory(settings, base_build)),
        ]
        try:
            for k in (0, 1) if args.start_first == "candidate" else (1, 0):
                sessions[k].engine.capabilities()  # starts that engine's process (engines start on first use)
            candidate = Recorded(sessions[0].engine, "candidate", log)
            baseline = Recorded(sessions[1].engine, "baseline", log)
            if args.pin is not None:
                import os

                for engine in (candidate.inner, baseline.inner):
                    pid = getattr(engine, "pid", None)
                    for tid in os.listdir(f"/proc/{pid}/task") if pid else []:
                        os.sched_setaffinity(int(tid), {args.pin})
            requests = sessions[0].requests()
            if args.shape:  # random prompts inside the shape's vocabulary (the fixture's ids need not be)
                from ddtree_conformance.testing.shaped_pair import SHAPES, random_prompts

                ids = random_prompts(len(requests), args.prompt_len, SHAPES[args.shape]["vocab"], seed=args.seed)
                requests = [r.model_copy(update={"prompt_ids": i}) for r, i in zip(requests, ids, strict=True)]
            configs = {Run("ddtree", args.budget).label: sessions[0].config("ddtree", args.budget)}
            rng = random.Random(args.seed)
            orders = {
                "pairs": pair_order,
                "fixed": lambda running, r, i: sorted(running, key=lambda n: not n.startswith("candidate")),
                "random": lambda running, r, i: sorted(
                    running, key=lambda n: n.startswith("candidate") ^ (rng.random() < 0.5)
                ),
            }
            import ddtree_conformance.ab as ab

            plan = SequentialPlan(min_repeats=args.repeats, max_repeats=args.repeats, time_budget_s=1e6)
            original = ab.pair_order
            ab.pair_order = orders[args.order]
            try:
                part = measure_ab(candidate, baseline, requests, configs, plan=plan, warmup=not args.no_warmup)
            finally:
                ab.pair_order = original
        finally:
            for s in sessions:
                s.close()
    warm = 0 if args.no_warmup else 2 * int(part["ab"]["warmup"].get("rounds", 1))  # warm-up calls come first
    result = {
        "argv": sys.argv[1:] if argv is None else argv,
        "setup_s": setup_s,
        "elapsed_s": time.perf_counter() - started,
        "candidate": cand_build.describe(),
        "baseline": base_build.describe(),
        "order": args.order,
        "pair": args.shape and f"{args.shape}-shaped, random weights" or args.pair or "fixture",
        "ab": {k: part["runs"][0]["ab"].get(k) for k in ("estimate", "ci_low", "ci_high", "stop")},
        "effects": analyse(log[warm:], args.limit),
        "warmup_calls": log[:warm],
        "calls": log[warm:],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    e = result["effects"]
    print(
        f"{args.against} vs {args.candidate_from or 'editable'} ({args.order}): "
        f"A/B ratio {result['ab']['estimate']:.4f} "
        f"[{result['ab']['ci_low']:.4f}, {result['ab']['ci_high']:.4f}]; candidate/baseline per pair "
        f"{e['candidate_over_baseline']['pct']:+.2f} % {_pcts(e['candidate_over_baseline'])}; "
        f"first/second {e['first_over_second']['pct']:+.2f} % {_pcts(e['first_over_second'])}; "
        f"after other/after own {e['after_other_over_after_own_pct']}; pairs {e['pairs']}; {result['elapsed_s']:.0f} s"
    )
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
