#!/usr/bin/env python
"""How decisive is the throughput gate? Repeated gate verdicts on the correct engine and on slow mutants.

One process, one loaded pair, one reference engine; the mutants of
``ddtree_conformance.testing.slow_engines`` wrap its loaded models (verify +5 %, verify +10 %, tree
build +2 ms per round). Steps:

1. warm-up: one untimed plain and one DDTree call per engine;
2. baseline: the correct engine's ``bench`` with ``--baseline-repeats`` fixed repeats, turned into
   a baseline entry exactly as ``ddtree-conformance baseline`` does (band ``--band`` of the speedup,
   widened to the baseline run's own interval);
3. trials: round-robin over the engines, each trial a sequential ``bench`` against that baseline
   (stops when the interval clears the edge, or after ``--trial-budget-s`` / ``--max-repeats``:
   inconclusive), judged by ``gate``'s own speedup verdict. Expected: pass for the correct engine,
   regression (fail) for every mutant;
4. after every trial, ``OUT/trials.jsonl`` gets the trial and ``OUT/table.md`` / ``OUT/table.json``
   are rewritten, so a run cut short still leaves its table. No new trial starts once
   ``--total-budget-s`` would be exceeded.

Table per engine: share of correct verdicts (with its one-sided 95 % Clopper-Pearson lower bound),
verdict counts, CV of the per-repeat measured ratio (median over trials, and pooled), repeats and
GPU minutes (wall minutes on a one-GPU machine) per verdict, the pooled effect on the speedup, the
share of round time the mutant injected, and a resampled estimate of the share of correct verdicts
(``--simulate`` replays of the whole procedure, baseline included, drawing repeats from this run's
own samples; labelled as such: it assumes repeats are independent).

    # one H200, 8B-shaped random-weight pair (bf16) and the bundled fixture pair
    # (scripts/gpu_trials.sh holds the exact commands with their time limits)
    python scripts/gate_decisiveness.py --pair 8b --device cuda --dtype bfloat16 --prompts 1 --new-tokens 16 \
        --trials 8 --total-budget-s 300 --out $OUT/decisive-8b
    python scripts/gate_decisiveness.py --pair fixture --device cuda --dtype bfloat16 --prompts 2 --new-tokens 32 \
        --trials 8 --total-budget-s 150 --out $OUT/decisive-fixture
    # CPU smoke run (tiny random pair)
    python scripts/gate_decisiveness.py --pair tiny --device cpu --dtype float32 --trials 1 --out /tmp/decisive
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.baselines import BaselineFile, entries_from_report
from ddtree_conformance.bench import run_bench
from ddtree_conformance.gate import evaluate
from ddtree_conformance.sequential import SequentialPlan, planned_looks
from ddtree_conformance.testing.slow_engines import SlowBuild, SlowVerify, SlowVerify10, share_loaded

ENGINES = {  # name -> (class, options, expected gate status of the speedup row)
    "correct": (ReferenceEngine, {}, "pass"),
    "verify+5%": (SlowVerify, {"verify_slowdown": 0.05}, "fail"),
    "verify+10%": (SlowVerify10, {"verify_slowdown": 0.10}, "fail"),
    "build+2ms": (SlowBuild, {"build_extra_s": 0.002}, "fail"),
}
HW = "decisiveness"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", choices=["8b", "fixture", "tiny"], default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument(
        "--cuda-graphs",
        default="on",
        choices=["on", "off"],
        help="the reference engine's fast path (CUDA graphs) or its eager path",
    )
    p.add_argument("--trials", type=int, default=10, help="trials per engine")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated subset of " + ", ".join(ENGINES).replace("%", "%%"),
    )
    p.add_argument("--prompts", type=int, default=2, help="requests per repeat")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (shaped pairs)")
    p.add_argument("--new-tokens", type=int, default=16, help="max new tokens per request")
    p.add_argument("--budget", type=int, default=32, help="DDTree budget B")
    p.add_argument("--band", type=float, default=0.02, help="speedup band, fraction of the baseline speedup")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--baseline-repeats", type=int, default=10)
    p.add_argument("--min-repeats", type=int, default=3)
    p.add_argument("--max-repeats", type=int, default=40)
    p.add_argument("--growth", type=float, default=1.5, help="planned looks grow by this factor")
    p.add_argument("--trial-budget-s", type=float, default=60.0, help="time budget of one verdict")
    p.add_argument("--total-budget-s", type=float, default=480.0, help="start no trial after this much wall time")
    p.add_argument("--simulate", type=int, default=2000, help="resampled replays per engine (0: none)")
    p.add_argument(
        "--goal-budget-s",
        type=float,
        default=600.0,
        help="per-verdict budget of the goal (10 GPU-minutes); a second replay uses it",
    )
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def load_pair(args, scratch: Path):
    """(base engine with the models loaded, requests, pair description)."""
    dtype = getattr(torch, args.dtype)
    if args.pair == "fixture":
        from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
        from ddtree_conformance.prompts import load_prompts

        base = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), cuda_graphs=args.cuda_graphs)
        prompts = [p.prompt_ids for p in load_prompts("fixture")[: args.prompts]]
        return base, prompts, "fixture (bundled, trained)"
    from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

    target_dir, drafter_dir, target, drafter = build_shaped_pair(args.pair, dtype, args.device, scratch)
    base = ReferenceEngine(str(target_dir), str(drafter_dir), cuda_graphs=args.cuda_graphs)
    base.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device=args.device))
    prompts = random_prompts(args.prompts, args.prompt_len, SHAPES[args.pair]["vocab"], seed=args.seed)
    return base, prompts, f"{args.pair}-shaped Qwen3, random weights"


def machine() -> dict:
    """What tells one machine from another: host name, boot id, GPU UUID and driver."""
    out = {"hostname": platform.node()}
    try:
        out["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        out["boot_id"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = props.name
        out["gpu_uuid"] = str(getattr(props, "uuid", ""))
        out["driver"] = (
            getattr(torch.cuda, "driver_version", lambda: None)() if hasattr(torch.cuda, "driver_version") else None
        )
    return out


def lower_bound(successes: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound on a success share."""
    return 0.0 if successes == 0 else float(stats.beta.ppf(1 - confidence, successes, trials - successes + 1))


def _first_verdicts(logs: np.ndarray, edges: np.ndarray, alpha: float, min_repeats: int, growth: float) -> np.ndarray:
    """Vectorised sequential verdicts: +1 pass, -1 regression, 0 undecided, per row of ``logs``
    (log samples in order), looking at the planned looks of a plan whose repeat cap is the row length,
    each at alpha / K, exactly as the bench does (:mod:`ddtree_conformance.sequential`)."""
    sims, cap = logs.shape
    points = np.array(planned_looks(min_repeats, max(cap, min_repeats), growth))
    points = points[points <= cap]
    n = np.arange(1, cap + 1)
    mean = np.cumsum(logs, axis=1) / n
    var = (np.cumsum(logs**2, axis=1) - n * mean**2) / np.maximum(n - 1, 1)
    se = np.sqrt(np.maximum(var, 0) / n)
    q = stats.t.ppf(
        1 - alpha / len(planned_looks(min_repeats, max(cap, min_repeats), growth)) / 2, df=np.maximum(n - 1, 1)
    )
    low, high = np.exp(mean - q * se), np.exp(mean + q * se)
    decided = np.where(low >= edges[:, None], 1, np.where(high < edges[:, None], -1, 0))
    at_looks = decided[:, points - 1]
    first = np.argmax(at_looks != 0, axis=1)
    return at_looks[np.arange(sims), first]


def simulate(
    pool: list[float], correct_pool: list[float], expected: str, args, repeats_cap: int, rng: np.random.Generator
) -> float | None:
    """Share of correct verdicts over replays drawn from this run's own repeats (baseline included)."""
    if args.simulate <= 0 or len(pool) < 2 or len(correct_pool) < 2:
        return None
    base = np.log(rng.choice(correct_pool, (args.simulate, args.baseline_repeats)))
    mean, se = base.mean(axis=1), base.std(axis=1, ddof=1) / math.sqrt(args.baseline_repeats)
    estimate = np.exp(mean)
    low = np.exp(mean - stats.t.ppf(1 - args.alpha / 2, args.baseline_repeats - 1) * se)
    edges = estimate - np.maximum(estimate * args.band, estimate - low)
    found = _first_verdicts(
        np.log(rng.choice(pool, (args.simulate, repeats_cap))), edges, args.alpha, args.min_repeats, args.growth
    )
    want = {"pass": 1, "fail": -1}[expected]
    return float(np.mean(found == want))


def summarise(trials: list[dict], names: list[str], baseline: dict, args, meta: dict, final: bool) -> dict:
    rng = np.random.default_rng(args.seed)
    correct_pool = [x for t in trials if t["engine"] == "correct" for x in t["samples"]] or baseline["samples"]
    rows = []
    for name in names:
        mine = [t for t in trials if t["engine"] == name]
        if not mine:
            continue
        expected = ENGINES[name][2]
        good = sum(t["status"] == expected for t in mine)
        pool = [x for t in mine for x in t["samples"]]
        per_repeat_s = sum(t["seconds"] for t in mine) / max(1, sum(t["repeats"] for t in mine))
        cap = min(args.max_repeats, max(args.min_repeats, int(args.trial_budget_s / per_repeat_s)))
        goal_cap = min(1000, max(args.min_repeats, int(args.goal_budget_s / per_repeat_s)))
        pooled = float(np.exp(np.mean(np.log(pool))))
        cvs = [t["cv"] for t in mine if t["cv"] is not None]
        rows.append(
            {
                "engine": name,
                "expected": expected,
                "trials": len(mine),
                "correct": good,
                "share_correct": good / len(mine),
                "share_correct_lower95": lower_bound(good, len(mine)),
                "counts": {s: sum(t["status"] == s for t in mine) for s in ("pass", "fail", "inconclusive")},
                "cv_median": float(np.median(cvs)) if cvs else None,
                "cv_max": float(np.max(cvs)) if cvs else None,
                "mde_median": float(np.median([t["mde"] for t in mine if t.get("mde") is not None]))
                if any(t.get("mde") is not None for t in mine)
                else None,
                "cv_pooled": float(np.std(np.log(pool), ddof=1)) if len(pool) > 1 else None,
                "repeats_mean": float(np.mean([t["repeats"] for t in mine])),
                "repeats_max": max(t["repeats"] for t in mine),
                "gpu_min_mean": float(np.mean([t["seconds"] for t in mine])) / 60,
                "gpu_min_max": max(t["seconds"] for t in mine) / 60,
                "speedup_pooled": pooled,
                "effect_vs_baseline": pooled / baseline["value"] - 1,
                "injected_share_of_round": float(np.mean([t["injected_share"] for t in mine])),
                "simulated_share_correct": simulate(pool, correct_pool, expected, args, cap, rng) if final else None,
                "simulated_repeat_cap": cap,
                "simulated_share_correct_goal": simulate(pool, correct_pool, expected, args, goal_cap, rng)
                if final
                else None,
                "simulated_goal_repeat_cap": goal_cap,
            }
        )
    return {"meta": meta, "baseline": baseline, "rows": rows}


def write_table(summary: dict, out: Path) -> None:
    (out / "table.json").write_text(json.dumps(summary, indent=1) + "\n")
    m, b = summary["meta"], summary["baseline"]
    lines = [
        f"### Gate decisiveness: {m['pair']} ({m['dtype']}, {m['device_name']}), B={m['budget']}",
        "",
        f"- {m['prompts']} prompts x {m['new_tokens']} new tokens per repeat; band {m['band']:.1%}; alpha "
        f"{m['alpha']}; planned looks from {m['min_repeats']} repeats (growth {m.get('growth', 1.5)}), each "
        f"at alpha/K; per-verdict budget {m['trial_budget_s']:g} s / "
        f"{m['max_repeats']} repeats",
        f"- baseline: speedup {b['value']:.4f}, edge {b['edge']:.4f} (band {b['band']:.4f}), "
        f"{b['repeats']} repeats, CV {b['cv']:.4f}, clock {b['clock']}; step {b['step_ms']:.2f} ms, "
        f"round {b['round_ms']:.2f} ms, tau {b['tau']:.3f}",
        f"- setup {m['setup_s']:.0f} s, warm-up {m['warmup_s']:.0f} s, baseline {m['baseline_s']:.0f} s; "
        f"elapsed {m['elapsed_s']:.0f} s; torch {m['torch']}",
        f"- machine: {m.get('machine')}; engine settings: {m.get('engine_settings')}",
        "",
        "| engine | expected | trials | correct | share correct (95% lower) | pass/fail/inconcl. | CV speedup "
        "(median / max trial; pooled) | MDE (median) | repeats/verdict (mean, max) | GPU-min/verdict (mean, max) "
        "| effect on speedup | injected share of round | simulated share correct (this budget / goal budget) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["rows"]:
        c = r["counts"]
        sim = (
            "-"
            if r["simulated_share_correct"] is None
            else (
                f"{r['simulated_share_correct']:.3f} ({r['simulated_repeat_cap']} rep.) / "
                f"{r['simulated_share_correct_goal']:.3f} ({r['simulated_goal_repeat_cap']} rep.)"
            )
        )
        lines.append(
            f"| {r['engine']} | {r['expected']} | {r['trials']} | {r['correct']} | {r['share_correct']:.2f} "
            f"({r['share_correct_lower95']:.2f}) | {c['pass']}/{c['fail']}/{c['inconclusive']} | "
            f"{_pct(r['cv_median'])} / {_pct(r.get('cv_max'))}; {_pct(r['cv_pooled'])} | {_pct(r.get('mde_median'))} | "
            f"{r['repeats_mean']:.1f}, {r['repeats_max']} | "
            f"{r['gpu_min_mean']:.3f}, {r['gpu_min_max']:.3f} | {100 * r['effect_vs_baseline']:+.2f} % | "
            f"{100 * r['injected_share_of_round']:.2f} % | {sim} |"
        )
    lines += [
        "",
        "GPU-min/verdict: wall minutes of the sequential bench of one verdict (the GPU is held "
        "throughout). Simulated: replays of baseline + sequential verdict drawing repeats from this "
        "run's samples (independence assumed), capped at the repeats the per-verdict budget allows, "
        f"then at those {m.get('goal_budget_s', 600):g} s (the goal's budget) allow.",
    ]
    (out / "table.md").write_text("\n".join(lines) + "\n")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        print(f"error: unknown engines {unknown}; known: {list(ENGINES)}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="decisive-"))
    base, prompts, pair_text = load_pair(args, scratch)
    requests = [Request(prompt_ids=p, max_new_tokens=args.new_tokens) for p in prompts]
    label = f"ddtree-B{args.budget}"
    runs = [("ddtree", args.budget)]

    def config(mode, budget):
        return RunConfig(mode=mode, budget=budget or 1, dtype=args.dtype, device=args.device)

    base.generate(requests[:1], config("plain", None))  # loads the fixture pair; models exist before sharing
    engines = {
        n: base if n == "correct" else share_loaded(base, ENGINES[n][0], cuda_graphs=args.cuda_graphs, **ENGINES[n][1])
        for n in names
    }
    setup_s = time.perf_counter() - started
    t0 = time.perf_counter()
    for engine in {id(e): e for e in engines.values()}.values():
        engine.generate(requests[:1], config("plain", None))
        engine.generate(requests[:1], config("ddtree", args.budget))
    warmup_s = time.perf_counter() - t0

    def settings() -> dict:
        return {
            "engine": "reference",
            "pair_name": args.pair,
            "dtype": args.dtype,
            "device": args.device,
            "prompt_set": "decisiveness",
            "limit": args.prompts,
            "max_new_tokens": args.new_tokens,
        }

    t0 = time.perf_counter()
    measured = run_bench(
        engines.get("correct", base), requests, config, runs, repeats=args.baseline_repeats, warmup=False
    )
    baseline_s = time.perf_counter() - t0
    report = {"settings": settings(), "hardware_class": HW, **measured}
    entry = entries_from_report(report, hw_class=HW, speedup_band=args.band)[0]
    baselines = BaselineFile(entries=[entry])
    run = measured["runs"][1]
    baseline = {
        "value": entry.speedup.value,
        "band": entry.speedup.band,
        "edge": entry.speedup.lower,
        "repeats": measured["bench"]["repeats"],
        "cv": run["speedup"]["cv"],
        "clock": measured["bench"]["clock"],
        "samples": run["speedup"]["samples"],
        "tau": run["cost_model"]["tau"],
        "step_ms": run["cost_model"]["step_s"] * 1e3,
        "round_ms": run["cost_model"]["round_s"] * 1e3,
    }
    (args.out / "baseline.json").write_text(
        json.dumps({"entry": entry.model_dump(mode="json"), **baseline}, indent=1) + "\n"
    )
    print(
        f"baseline: speedup {baseline['value']:.4f} edge {baseline['edge']:.4f} CV {baseline['cv']} "
        f"({baseline_s:.1f} s); step {baseline['step_ms']:.2f} ms round {baseline['round_ms']:.2f} ms",
        flush=True,
    )
    settings_seen = base.generate(requests[:1], config("ddtree", args.budget))[0].engine_settings
    meta = {
        "pair": pair_text,
        "dtype": args.dtype,
        "device": args.device,
        "machine": machine(),
        "engine_settings": settings_seen,
        "device_name": torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "budget": args.budget,
        "prompts": len(requests),
        "new_tokens": args.new_tokens,
        "band": args.band,
        "alpha": args.alpha,
        "min_repeats": args.min_repeats,
        "max_repeats": args.max_repeats,
        "growth": args.growth,
        "trial_budget_s": args.trial_budget_s,
        "goal_budget_s": args.goal_budget_s,
        "setup_s": setup_s,
        "warmup_s": warmup_s,
        "baseline_s": baseline_s,
        "torch": torch.__version__,
        "argv": sys.argv[1:] if argv is None else argv,
    }
    plan = SequentialPlan(
        alpha=args.alpha,
        min_repeats=args.min_repeats,
        max_repeats=args.max_repeats,
        time_budget_s=args.trial_budget_s,
        growth=args.growth,
    )
    trials: list[dict] = []
    log = (args.out / "trials.jsonl").open("a")
    longest = 0.0
    for t in range(args.trials):
        order = names[t % len(names) :] + names[: t % len(names)]
        for name in order:
            elapsed = time.perf_counter() - started
            if elapsed + max(longest, 1.0) > args.total_budget_s:
                print(f"total budget {args.total_budget_s:g} s: no more trials (elapsed {elapsed:.0f} s)", flush=True)
                break
            engine = engines[name]
            injected = getattr(engine, "injected_s", 0.0)
            t0 = time.perf_counter()
            result = run_bench(
                engine, requests, config, runs, edges={label: entry.speedup.lower}, plan=plan, warmup=False
            )
            seconds = time.perf_counter() - t0
            longest = max(longest, seconds)
            trial_report = {"settings": settings(), "hardware_class": HW, **result}
            row = next(r for r in evaluate(trial_report, baselines, HW) if r.metric == "speedup")
            sp, cm = result["runs"][1]["speedup"], result["runs"][1]["cost_model"]
            n = sp["stop"]["repeats"]
            # T=0: every repeat makes the rounds of the first one
            round_total = cm["round_s"] * n * result["runs"][1]["rounds"] or float("nan")
            trial = {
                "engine": name,
                "trial": t,
                "status": row.status,
                "expected": ENGINES[name][2],
                "repeats": n,
                "seconds": seconds,
                "estimate": sp["estimate"],
                "ci": [sp["ci_low"], sp["ci_high"]],
                "cv": sp["cv"],
                "samples": sp["samples"],
                "ratio_samples": cm["step_over_round"]["samples"],
                "step_ms": cm["step_s"] * 1e3,
                "round_ms": cm["round_s"] * 1e3,
                "injected_share": (getattr(engine, "injected_s", 0.0) - injected) / round_total
                if math.isfinite(round_total)
                else 0.0,
                "stop": sp["stop"]["reason"],
                "message": row.message,
                "mde": (row.details or {}).get("mde"),
                "resolution": sp.get("resolution"),
            }
            trials.append(trial)
            log.write(json.dumps(trial) + "\n")
            log.flush()
            print(
                f"trial {t} {name:10} {row.status:12} {sp['estimate']:.4f} [{sp['ci_low']:.4f}, {sp['ci_high']:.4f}] "
                f"n={n} {seconds:.1f}s cv={sp['cv']} mde={trial['mde']}",
                flush=True,
            )
            meta["elapsed_s"] = time.perf_counter() - started
            write_table(summarise(trials, names, baseline, args, meta, final=False), args.out)
        else:
            continue
        break
    log.close()
    meta["elapsed_s"] = time.perf_counter() - started
    write_table(summarise(trials, names, baseline, args, meta, final=True), args.out)
    print((args.out / "table.md").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
