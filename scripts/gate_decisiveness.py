#!/usr/bin/env python
"""How decisive is the throughput gate, and is it ever wrong? Repeated verdicts, one row per trial.

One process, one loaded pair; the engines share its loaded models (``share_loaded``): the correct engine
(the reference) and performance mutants of ``ddtree_conformance.testing.slow_engines`` (verify +5 %,
verify +10 %, tree build +2 ms per round). Two gates (``--gates``):

* ``ab``: the default gate in CI. The trial's engine against the correct engine, interleaved in every
  repeat (``measure_ab``: each pair back to back, order balanced), judged against ``1 - --band``. The
  correct engine under A/B is the **A/A** run;
* ``stored``: a sequential bench against a stored baseline. The baseline is measured once per machine (in
  its first call, after the warm-up: "minute 1") and kept in ``--state``; with ``--baselines FILE`` (runs of
  other machines, carried between machines) this machine's run is merged into it, and the trials are judged
  against all runs so far, their between-run spread included (a baseline of one run never fails).

Steps of one call (at most ``--total-budget-s`` of trials, so one device call stays under 10 minutes):

1. load the pair, warm up until steady (``WarmupRule``: rounds until the last three agree within 3 % and the
   GPU's SM clock and temperature are steady, at most ``--warmup-s``);
2. the stored baseline (first call on this machine only): ``--baseline-repeats`` fixed repeats;
3. trials, round-robin over (engine, gate); with ``--stress N`` a CPU-heavy job (N busy Python processes)
   runs beside every ``--stress-every``-th trial, started ``--stress-settle-s`` (5) seconds before it, so
   that the trial meets a load already running, as on a busy CI runner (trials before 2026-12-04d started
   it 0.5 s before: their first repeat carried the load's onset and was the smallest in 11 of 12
   stressed rows);
4. every trial appends one row to ``STATE/trials.jsonl`` (kept across calls on one machine) and to
   ``OUT/trials.jsonl``: the machine (boot id, host, GPU UUID), wall time and minutes since the machine's
   first call, the load beside it (stress processes, host CPU busy, load average), engine, gate, verdict,
   interval, repeats, GPU-seconds, and the machine's state (SM and memory clocks, power, temperature,
   throttle reasons) during the trial and the baseline's; ``OUT/table.md`` / ``table.json`` summarise every
   row of the state per (engine, gate) and per machine, rewritten after every trial.

    # one H200 (scripts/gpu_trials.sh trials-29 holds the exact command); repeat the call on the same warm
    # machine to spread its trials over 20 minutes or more
    python scripts/gate_decisiveness.py --pair 8b --device cuda --dtype bfloat16 --prompts 1 --new-tokens 64 \\
        --gates ab,stored --engines correct,verify+5% --stress 16 --total-budget-s 420 --state /tmp/trials \\
        --out $OUT/trials
    # CPU smoke run (tiny random pair)
    python scripts/gate_decisiveness.py --pair tiny --device cpu --dtype float32 --trials 1 --out /tmp/decisive
    # one table from the rows of several machines
    python scripts/gate_decisiveness.py --summarise machine-*/trials.jsonl --out /tmp/all
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

ENGINES = {  # name -> (class name in slow_engines or None for the reference, options, expected verdict)
    "correct": (None, {}, "pass"),
    "verify+5%": ("SlowVerify", {"verify_slowdown": 0.05}, "fail"),
    "verify+10%": ("SlowVerify10", {"verify_slowdown": 0.10}, "fail"),
    "build+2ms": ("SlowBuild", {"build_extra_s": 0.002}, "fail"),
}
GATES = ("ab", "stored")
HW = "decisiveness"
# Every engine of a trial runs the same fast path: the round on the host (device_tree=off). The mutants slow a
# host stage (the verify's forward, the tree build), which the round as one graph (the reference's default at
# B <= 64 on a GPU, device_tree=auto) does not have; a correct engine on that path against a mutant on the host
# path would compare two paths, not a 5 % slower verify (at B = 32 the host round was 9 % longer on an H200,
# 8-12 % on an H100).
SAME_PATH = {"device_tree": "off"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", choices=["8b", "fixture", "tiny"], default="8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--cuda-graphs", default="on", choices=["on", "off"], help="the reference engine's fast path")
    p.add_argument("--trials", type=int, default=100, help="rounds of trials (each: every engine under every gate)")
    p.add_argument(
        "--engines",
        default="correct,verify+5%",
        help="comma-separated subset of " + ", ".join(ENGINES).replace("%", "%%"),
    )
    p.add_argument("--gates", default="ab,stored", help="comma-separated: ab (A/B against the correct engine), stored")
    p.add_argument("--prompts", type=int, default=1, help="requests per repeat")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens (shaped pairs)")
    p.add_argument("--new-tokens", type=int, default=64, help="max new tokens per request")
    p.add_argument("--budget", type=int, default=32, help="DDTree budget B")
    p.add_argument("--band", type=float, default=0.02, help="stored: speedup band; A/B: tolerance (edge 1 - band)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--baseline-repeats", type=int, default=20)
    p.add_argument("--min-repeats", type=int, default=3)
    p.add_argument("--max-repeats", type=int, default=60)
    p.add_argument("--growth", type=float, default=1.5, help="planned looks grow by this factor")
    p.add_argument("--trial-budget-s", type=float, default=60.0, help="time budget of one verdict")
    p.add_argument("--total-budget-s", type=float, default=420.0, help="start no trial after this much wall time")
    p.add_argument("--warmup-s", type=float, default=60.0, help="warm-up cap (the rule may stop it earlier)")
    p.add_argument("--stress", type=int, default=0, help="busy Python processes beside the stressed trials (0: none)")
    p.add_argument("--stress-every", type=int, default=2, help="stress beside every k-th trial (2: half of them)")
    p.add_argument(
        "--stress-settle-s", type=float, default=5.0, help="seconds the stress runs before a stressed trial starts"
    )
    p.add_argument("--baselines", type=Path, default=None, help="a baseline file of other machines' runs to merge into")
    p.add_argument("--state", type=Path, default=None, help="kept across calls on one machine (default: --out)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cuda-wait",
        default="auto",
        choices=["auto", "spin", "yield", "blocking"],
        help="how the process waits for the GPU (ddtree_conformance.cuda_wait; auto: CUDA's choice, a spin here)",
    )
    p.add_argument("--summarise", type=Path, nargs="*", default=None, help="only summarise these trials.jsonl files")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def load_pair(args, scratch: Path):
    """(base engine with the models loaded, prompts, pair description)."""
    import torch

    from ddtree_conformance.adapters.interface import RunConfig
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    if args.pair == "fixture":
        from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
        from ddtree_conformance.prompts import load_prompts

        base = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), cuda_graphs=args.cuda_graphs, **SAME_PATH)
        return base, [p.prompt_ids for p in load_prompts("fixture")[: args.prompts]], "fixture (bundled, trained)"
    from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair, random_prompts

    dtype = getattr(torch, args.dtype)
    target_dir, drafter_dir, target, drafter = build_shaped_pair(args.pair, dtype, args.device, scratch)
    base = ReferenceEngine(str(target_dir), str(drafter_dir), cuda_graphs=args.cuda_graphs, **SAME_PATH)
    base.use_models(target, drafter, RunConfig(mode="ddtree", dtype=args.dtype, device=args.device))
    prompts = random_prompts(args.prompts, args.prompt_len, SHAPES[args.pair]["vocab"], seed=args.seed)
    return base, prompts, f"{args.pair}-shaped Qwen3, random weights"


def lower_bound(successes: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound on a success share."""
    return 0.0 if successes == 0 else float(stats.beta.ppf(1 - confidence, successes, trials - successes + 1))


def gpu_line(machine: dict | None) -> dict:
    """The few numbers of a machine summary a trials row keeps."""
    gpu = (machine or {}).get("gpu")
    host = (machine or {}).get("host") or {}
    out = {
        "cpu_percent": (host.get("cpu_percent") or {}).get("median"),
        "others_cpu_percent": (host.get("others_cpu_percent") or {}).get("median"),
        "load1": (host.get("load1") or {}).get("median"),
    }
    if isinstance(gpu, dict):
        for field in ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c"):
            out[field] = (gpu.get(field) or {}).get("median")
        out["throttle"] = gpu.get("throttle_reasons")
    else:
        out["gpu"] = gpu
    return out


class Stress:
    """N busy Python processes (each spins one core) while the context is open, started detached (their
    parent shell exits at once), so the machine's sampler counts them as other processes, not as the
    process tree under test; ended by their pids."""

    def __init__(self, n: int, settle_s: float = 5.0) -> None:
        self.n, self.settle_s, self.pids = n, settle_s, []

    def __enter__(self):
        if self.n:
            spin = f"{shlex.quote(sys.executable)} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
            started = subprocess.run(["sh", "-c", "; ".join([spin] * self.n)], capture_output=True, text=True)
            self.pids = [int(pid) for pid in started.stdout.split()]
            time.sleep(self.settle_s)  # a load already running when the trial starts, not its onset
        return self

    def __exit__(self, *exc):
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def summarise(rows: list[dict]) -> dict:
    """Per (engine, gate), and per (machine, engine, gate): counts, the share of right verdicts with its 95 %
    lower bound, repeats and GPU-seconds per verdict, minutes spanned, the stressed trials' verdicts."""

    def block(mine: list[dict]) -> dict:
        expected = mine[0]["expected"]
        good = sum(r["verdict"] == expected for r in mine)
        counts = {v: sum(r["verdict"] == v for r in mine) for v in ("pass", "fail", "inconclusive")}
        stressed = [r for r in mine if r["stress"]]
        return {
            "expected": expected,
            "trials": len(mine),
            "counts": counts,
            "right": good,
            "right_lower95": lower_bound(good, len(mine)),
            "wrong": sum(r["verdict"] not in (expected, "inconclusive") for r in mine),
            "stressed": len(stressed),
            "stressed_counts": {v: sum(r["verdict"] == v for r in stressed) for v in ("pass", "fail", "inconclusive")},
            "repeats_median": float(np.median([r["repeats"] for r in mine])),
            "gpu_s_mean": float(np.mean([r["gpu_s"] for r in mine])),
            "gpu_s_max": float(max(r["gpu_s"] for r in mine)),
            "minutes": [round(min(r["minute"] for r in mine), 1), round(max(r["minute"] for r in mine), 1)],
            "machines": len({r["machine"]["boot_id"] for r in mine}),
        }

    by_engine, by_machine = defaultdict(list), defaultdict(list)
    for r in rows:
        by_engine[(r["engine"], r["gate"])].append(r)
        by_machine[(r["machine"]["boot_id"], r["engine"], r["gate"])].append(r)
    return {
        "engines": [{"engine": e, "gate": g, **block(m)} for (e, g), m in sorted(by_engine.items())],
        "machines": [{"boot_id": b, "engine": e, "gate": g, **block(m)} for (b, e, g), m in sorted(by_machine.items())],
    }


def write_table(rows: list[dict], out: Path, meta: dict | None = None) -> None:
    summary = summarise(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"meta": meta, **summary}, indent=1) + "\n")
    lines = []
    if meta:
        lines += [
            f"### Gate trials: {meta.get('pair')} ({meta.get('dtype')}, {meta.get('device_name')}), "
            f"B={meta.get('budget')}",
            "",
        ]
        lines += [
            f"- {k}: {v}" for k, v in meta.items() if k in ("band", "alpha", "baseline", "warmup", "machine", "argv")
        ]
        lines.append("")

    def table(title: str, blocks: list[dict], first: str | None) -> None:
        lines.extend([f"**{title}**", ""])
        head = ([first] if first else []) + [
            "engine",
            "gate",
            "expected",
            "trials",
            "pass / fail / inconcl.",
            "wrong",
            "right (95 % lower)",
            "stressed: p/f/i",
            "repeats (median)",
            "GPU-s per verdict (mean, max)",
            "minutes spanned",
            "machines",
        ]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for b in blocks:
            c, s = b["counts"], b["stressed_counts"]
            cells = ([b[first][:8]] if first else []) + [
                b["engine"] if b["gate"] == "stored" or b["engine"] != "correct" else "correct (A/A)",
                b["gate"],
                b["expected"],
                str(b["trials"]),
                f"{c['pass']} / {c['fail']} / {c['inconclusive']}",
                str(b["wrong"]),
                f"{b['right']} ({b['right_lower95']:.2f})",
                f"{s['pass']}/{s['fail']}/{s['inconclusive']} of {b['stressed']}",
                f"{b['repeats_median']:g}",
                f"{b['gpu_s_mean']:.1f}, {b['gpu_s_max']:.1f}",
                f"{b['minutes'][0]:g}-{b['minutes'][1]:g}",
                str(b["machines"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    table("Per engine and gate (all machines)", summary["engines"], None)
    table("Per machine (boot id)", summary["machines"], "boot_id")
    lines += [
        "**Trials**",
        "",
        "| boot id | UTC | minute | stress | host CPU % | engine | gate | verdict | interval | repeats | GPU-s "
        "| SM MHz | mem MHz | W | C | throttle |",
        "|" + "---|" * 16,
    ]
    for r in rows:
        g = r["state"]
        lines.append(
            f"| {(r['machine'].get('boot_id') or '-')[:8]} | {r['utc'][11:19]} | {r['minute']:.1f} | {r['stress']} | "
            f"{_num(g.get('cpu_percent'))} | "
            f"{r['label']} | {r['gate']} | {r['verdict']} | {r['interval']} | {r['repeats']} | {r['gpu_s']:.1f} | "
            f"{_num(g.get('sm_clock_mhz'))} | {_num(g.get('mem_clock_mhz'))} | {_num(g.get('power_w'))} | "
            f"{_num(g.get('temperature_c'))} | {','.join(g.get('throttle') or []) or g.get('gpu', '-')} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")


def _num(x) -> str:
    return "-" if x is None else f"{x:.0f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarise is not None:
        rows = [json.loads(line) for path in args.summarise for line in path.read_text().splitlines() if line.strip()]
        write_table(rows, args.out)
        print((args.out / "table.md").read_text(), flush=True)
        return 0
    import torch

    from ddtree_conformance.ab import evaluate as ab_evaluate
    from ddtree_conformance.ab import measure_ab
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.baselines import (
        BaselineFile,
        entries_from_report,
        load_baselines,
        merge_entries,
        write_baselines,
    )
    from ddtree_conformance.bench import WarmupRule, run_bench
    from ddtree_conformance.gate import evaluate
    from ddtree_conformance.machine_state import Sampler, describe
    from ddtree_conformance.paired import Arm, measure
    from ddtree_conformance.sequential import SequentialPlan
    from ddtree_conformance.testing import slow_engines

    started = time.perf_counter()
    wait = "-"
    if args.device.startswith("cuda"):
        from ddtree_conformance.cuda_wait import wait_for_gpu

        wait = wait_for_gpu(args.cuda_wait, args.device)  # before the pair loads: the whole run waits this way
        print(f"CUDA wait mode: {wait}", flush=True)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    gates = [g.strip() for g in args.gates.split(",") if g.strip()]
    if set(names) - set(ENGINES) or set(gates) - set(GATES):
        print(f"error: engines {names} / gates {gates}: known {list(ENGINES)} / {list(GATES)}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    state_dir = args.state or args.out
    for folder in (args.out, state_dir):
        folder.mkdir(parents=True, exist_ok=True)
    base, prompts, pair_text = load_pair(args, Path(tempfile.mkdtemp(prefix="decisive-")))
    requests = [Request(prompt_ids=p, max_new_tokens=args.new_tokens) for p in prompts]
    label, runs = f"ddtree-B{args.budget}", [("ddtree", args.budget)]

    def config(mode, budget):
        return RunConfig(mode=mode, budget=budget or 1, dtype=args.dtype, device=args.device)

    base.generate(requests[:1], config("plain", None))  # loads the pair; models exist before sharing
    engines = {}
    for n in names:
        cls, options, _ = ENGINES[n]
        engines[n] = (
            base
            if cls is None
            else slow_engines.share_loaded(
                base, getattr(slow_engines, cls), cuda_graphs=args.cuda_graphs, **SAME_PATH, **options
            )
        )
    correct = engines.get("correct") or base
    twin = slow_engines.share_loaded(base, type(base), cuda_graphs=args.cuda_graphs, **SAME_PATH)  # A/A candidate
    sampler = Sampler(args.device)
    setup_s = time.perf_counter() - started

    # 1. warm-up until steady: every engine's plain and DDTree calls, as one measurement's arms
    t0 = time.perf_counter()
    arms = [
        Arm(f"{n}|{m}", e, config(m, args.budget))
        for n, e in {**engines, "twin": twin}.items()
        for m in ("plain", "ddtree")
    ]
    rule = WarmupRule(max_seconds=args.warmup_s, max_rounds=12)
    warm = _warm_up(arms, requests, rule, sampler, measure)
    warmup_s = time.perf_counter() - t0
    print(f"warm-up: {warm['reason']} ({warmup_s:.0f} s)", flush=True)

    # 2. the stored baseline: once per machine (the first call), kept in the state folder
    settings = {"engine": "reference", "pair_name": args.pair, "dtype": args.dtype, "device": args.device}
    own = state_dir / "baseline-run.json"
    baseline_s = 0.0
    if "stored" in gates:
        if own.exists():
            mine = list(load_baselines(own).entries)
        else:
            t0 = time.perf_counter()
            measured = run_bench(
                correct, requests, config, runs, repeats=args.baseline_repeats, warmup=False, sampler=sampler
            )
            baseline_s = time.perf_counter() - t0
            report = {
                "settings": settings,
                "hardware_class": HW,
                "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                **measured,
            }
            mine = entries_from_report(report, hw_class=HW, speedup_band=args.band)
            write_baselines(own, BaselineFile(entries=mine))
        carried = load_baselines(args.baselines) if args.baselines and args.baselines.exists() else None
        baselines = merge_entries(carried, mine, merge=carried is not None)
        write_baselines(args.out / "baselines.json", baselines, update=True)  # carry it to the next machine
        entry = baselines.find(HW, "reference", args.pair, "ddtree", args.budget)
        spread = entry.speedup.spread()
        base_state = (entry.speedup.runs[-1].state if entry.speedup.runs else None) or {}
        print(
            f"stored baseline: {entry.speedup.value:.4f}, edge {entry.speedup.lower:.4f}, "
            f"{len(entry.speedup.runs)} runs, "
            f"spread {entry.speedup.spread_log_sd}; machine then: {describe(base_state)}",
            flush=True,
        )
    meta = {
        "pair": pair_text,
        "dtype": args.dtype,
        "device_name": torch.cuda.get_device_name(0)
        if args.device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "budget": args.budget,
        "band": args.band,
        "alpha": args.alpha,
        "machine": sampler.identity,
        "warmup": warm["reason"],
        "baseline": None
        if "stored" not in gates
        else {
            "value": entry.speedup.value,
            "edge": entry.speedup.lower,
            "runs": len(entry.speedup.runs),
            "spread_log_sd": entry.speedup.spread_log_sd,
        },
        "argv": sys.argv[1:] if argv is None else argv,
        "setup_s": round(setup_s, 1),
        "warmup_s": round(warmup_s, 1),
        "baseline_s": round(baseline_s, 1),
        "torch": torch.__version__,
        "cuda_wait": wait,
    }
    first_call = state_dir / "first-call.json"
    if not first_call.exists():
        first_call.write_text(json.dumps({"utc": dt.datetime.now(dt.UTC).isoformat(), "epoch": time.time()}) + "\n")
    epoch0 = json.loads(first_call.read_text())["epoch"]

    # 3. trials
    plan = SequentialPlan(
        alpha=args.alpha,
        min_repeats=args.min_repeats,
        max_repeats=args.max_repeats,
        time_budget_s=args.trial_budget_s,
        growth=args.growth,
    )
    rows = (
        [json.loads(line) for line in (state_dir / "trials.jsonl").read_text().splitlines()]
        if (state_dir / "trials.jsonl").exists()
        else []
    )
    longest, count = 0.0, len(rows)
    pairs = [(n, g) for g in gates for n in names]
    for t in range(args.trials):
        done = False
        for name, gate in pairs[t % len(pairs) :] + pairs[: t % len(pairs)]:
            elapsed = time.perf_counter() - started
            if elapsed + max(longest, 1.0) > args.total_budget_s:
                print(f"total budget {args.total_budget_s:g} s: no more trials (elapsed {elapsed:.0f} s)", flush=True)
                done = True
                break
            stressed = bool(args.stress) and count % max(1, args.stress_every) == args.stress_every - 1
            engine = engines[name]
            with Stress(args.stress if stressed else 0, args.stress_settle_s):
                t0 = time.perf_counter()  # the verdict's GPU time: the settling load's seconds are not its
                if gate == "ab":
                    candidate = twin if name == "correct" else engine
                    part = measure_ab(
                        candidate,
                        correct,
                        requests,
                        {label: config("ddtree", args.budget)},
                        tolerance=args.band,
                        plan=plan,
                        warmup=False,
                        sampler=sampler,
                    )
                    (row,) = ab_evaluate(part)
                    machine, samples = part["ab"]["machine"], part["runs"][0]["ab"]["samples"]
                    repeats = len(samples)
                else:
                    result = run_bench(
                        engine,
                        requests,
                        config,
                        runs,
                        edges={label: entry.speedup.lower},
                        spreads={label: spread} if spread else None,
                        plan=plan,
                        warmup=False,
                        sampler=sampler,
                        probe_busy=False,
                    )
                    row = next(
                        r
                        for r in evaluate({"settings": settings, "hardware_class": HW, **result}, baselines, HW)
                        if r.metric == "speedup"
                    )
                    machine, repeats = result["bench"]["machine"], result["runs"][1]["speedup"]["stop"]["repeats"]
                    samples = result["runs"][1]["speedup"].get("samples")
            seconds = time.perf_counter() - t0
            longest = max(longest, seconds)
            trial = {
                "machine": sampler.identity,
                "utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "minute": round((time.time() - epoch0) / 60, 2),
                "stress": args.stress if stressed else 0,
                "stress_settle_s": args.stress_settle_s if stressed else 0,
                "cuda_wait": wait,
                "engine": name,
                "gate": gate,
                "label": "A/A" if (gate == "ab" and name == "correct") else name,
                "expected": ENGINES[name][2],
                "verdict": row.status,
                "interval": row.measured,
                "edge": row.band,
                "repeats": repeats,
                "gpu_s": round(seconds, 2),
                "state": gpu_line(machine),
                "baseline_state": None if gate == "ab" else gpu_line(base_state),
                "message": row.message,
                "samples": samples,  # per-repeat ratios (A/B: candidate / baseline throughput), for other estimators
            }
            rows.append(trial)
            count += 1
            for folder in {state_dir, args.out}:
                with (folder / "trials.jsonl").open("a") as fh:
                    fh.write(json.dumps(trial) + "\n")
            print(
                f"trial {count} {trial['label']:10} {gate:6} {row.status:12} {row.measured} n={repeats} {seconds:.1f}s "
                f"stress={trial['stress']} {describe(machine)}",
                flush=True,
            )
            meta["elapsed_s"] = round(time.perf_counter() - started, 1)
            write_table(rows, args.out, meta)
        if done:
            break
    write_table(rows, args.out, meta)
    print((args.out / "table.md").read_text(), flush=True)
    return 0


def _warm_up(arms, requests, rule, sampler, measure) -> dict:
    """The warm-up rule over every engine's plain and DDTree calls: ``measure`` with no stream warms up and
    stops (one repeat, no samples kept)."""
    from ddtree_conformance.paired import Stream

    stream = Stream("warm", (arms[0].label,), lambda rep: 1.0)
    measured = measure(
        arms, requests[:1], [stream], repeats=2, warmup=rule, sampler=sampler, order=lambda running, r, i: running
    )
    return measured.warmup


if __name__ == "__main__":
    sys.exit(main())
