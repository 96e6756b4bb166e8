#!/usr/bin/env python
"""A machine that slows after its baseline, replayed from H200 timings: the old gate against the new one.

Issue 29's second newly started H200 measured its baseline in the first minute and every later trial of the
same, correct build +3.3 % to +8.6 % slower in round time; the old gate failed all ten. This replays that
with no clock of this machine: :class:`~ddtree_conformance.testing.recorded_timings.RecordedTimings` gives the
per-repeat speedups recorded on newly started H200s (machine A's baseline and trials, machines B, C and D's
baselines), and ``round_scale`` lengthens every speculative round by the drift. For each trial:

* **old gate**: a baseline of one run (machine A, minute 1), the trial's interval against its edge, with no
  between-run spread (what ``gate`` did before version 2 baselines);
* **new gate**: a baseline of four runs (machines A-D, each in its first minute), whose between-run spread
  the sequential bench and the gate include; a baseline of one run never fails;
* **A/B**: the trial's build against the correct build, interleaved, so both see the same drift; tolerance 2 %.

    python scripts/drift_replay.py --out /tmp/drift
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ddtree_conformance.ab import evaluate as ab_evaluate
from ddtree_conformance.ab import measure_ab
from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.baselines import BaselineFile, entries_from_report, merge_entries
from ddtree_conformance.bench import run_bench
from ddtree_conformance.gate import evaluate, speedup_interval
from ddtree_conformance.sequential import SequentialPlan, verdict
from ddtree_conformance.testing.recorded_timings import RecordedTimings

HW = "replay-h200"
LABEL = "ddtree-B32"
DRIFTS = (0.0, 0.033, 0.045, 0.056, 0.068, 0.086)  # issue 29: +3.3 % .. +8.6 % round time after minute 1
REQUESTS = [Request(prompt_ids=[1, 2, 3], max_new_tokens=9)]


def config(mode, budget):
    return RunConfig(mode=mode, budget=budget or 1)


def engine(samples: str, round_scale: float = 1.0) -> RecordedTimings:
    return RecordedTimings("recorded", samples=samples, round_scale=round_scale)


def report(measured: dict) -> dict:
    settings = {"engine": "recorded", "pair_name": "8b-shaped", "dtype": "bfloat16", "device": "cuda"}
    return {"settings": settings, "hardware_class": HW, "created": None, **measured}


def baseline_run(samples: str, created: str) -> list:
    measured = run_bench(engine(samples), REQUESTS, config, [("ddtree", 32)], repeats=20, warmup=False)
    rep = report(measured)
    rep["created"] = created
    return entries_from_report(rep, hw_class=HW)


def trial(samples: str, scale: float, baselines: BaselineFile, plan: SequentialPlan) -> tuple[str, dict]:
    entry = baselines.entries[0]
    spread = entry.speedup.spread()
    measured = run_bench(
        engine(samples, scale),
        REQUESTS,
        config,
        [("ddtree", 32)],
        edges={LABEL: entry.speedup.lower},
        spreads={LABEL: spread} if spread else None,
        plan=plan,
        warmup=False,
    )
    rep = report(measured)
    row = next(r for r in evaluate(rep, baselines, HW) if r.metric == "speedup")
    return row.status, {"message": row.message, "measured": row.measured, "speedup": rep["runs"][1]["speedup"]}


def old_gate(samples: str, scale: float, one_run: BaselineFile, plan: SequentialPlan) -> tuple[str, str]:
    """The gate before version-2 baselines: the sequential bench and the verdict on the trial's own interval
    against the one-run baseline's edge; below it is a failure."""
    entry = one_run.entries[0]
    measured = run_bench(
        engine(samples, scale),
        REQUESTS,
        config,
        [("ddtree", 32)],
        edges={LABEL: entry.speedup.lower},
        plan=plan,
        warmup=False,
    )
    sp = measured["runs"][1]["speedup"]
    interval = speedup_interval(sp)
    found = verdict(interval, entry.speedup.lower)
    status = {"pass": "pass", "regression": "fail", None: "inconclusive"}[found]
    return status, f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}] vs {entry.speedup.lower:.4f}"


def ab(candidate: str, scale: float, plan: SequentialPlan, tolerance: float) -> tuple[str, str]:
    part = measure_ab(
        engine(candidate, scale),
        engine("baseline", scale),  # interleaved: the baseline build sees the same drift
        REQUESTS,
        {LABEL: RunConfig(mode="ddtree", budget=32)},
        tolerance=tolerance,
        plan=plan,
        warmup=False,
    )
    (row,) = ab_evaluate(part)
    return row.status, row.measured


def write_seed(path: Path) -> None:
    """The four machines' recorded baselines as one version-2 baseline file of four runs, keyed as
    ``scripts/gate_decisiveness.py`` keys its stored baseline (hardware class ``decisiveness``, engine
    ``reference``, pair ``8b``, DDTree B=32), for ``gpu_trials.sh trials-29``'s ``BASELINES``: a machine's
    own first-minute run is merged into it, so its stored-gate trials are judged against five runs."""
    import math

    import numpy as np

    from ddtree_conformance.baselines import (
        DEFAULT_SPEEDUP_BAND,
        Band,
        BaselineEntry,
        PositionBand,
        SpeedupBaseline,
        SpeedupRun,
        write_baselines,
    )
    from ddtree_conformance.sequential import ratio_interval
    from ddtree_conformance.testing.recorded_timings import SAMPLES

    measured = Path(__file__).resolve().parent / "measurements"
    runs = []
    for machine, key in zip("abcd", ("baseline", "baseline-b", "baseline-c", "baseline-d")):
        meta = json.loads((measured / f"2026-12-01-machine-{machine}/decisive-8b/table.json").read_text())["meta"]
        iv = ratio_interval(SAMPLES[key], 0.05)
        runs.append(
            SpeedupRun(
                estimate=round(iv.estimate, 6),
                ci_low=round(iv.low, 6),
                ci_high=round(iv.high, 6),
                repeats=len(SAMPLES[key]),
                log_sd=round(float(np.std(np.log(SAMPLES[key]), ddof=1)), 6),
                created=f"2026-12-01, machine {machine.upper()} (scripts/measurements/2026-12-01-machine-{machine})",
                machine={k: meta["machine"].get(k) for k in ("boot_id", "gpu", "gpu_uuid")},
            )
        )
    value = math.exp(sum(math.log(r.estimate) for r in runs) / len(runs))
    speedup = SpeedupBaseline(
        value=round(value, 4),
        band=math.ceil((value * DEFAULT_SPEEDUP_BAND + 1e-4) * 1e4) / 1e4,
        band_fraction=DEFAULT_SPEEDUP_BAND,
        runs=runs,
    )
    spread = speedup.spread()
    speedup.spread_log_sd = round(math.sqrt(spread[0] / (1 + 1 / len(runs))), 6)
    entry = BaselineEntry(
        hardware_class="decisiveness",
        engine="reference",
        pair="8b",
        mode="ddtree",
        budget=32,
        tau=Band(value=1.0, band=0.05),
        per_position=PositionBand(values=[], band=0.05),
        speedup=speedup,
        source={"what": "scripts/drift_replay.py --write-seed: the baselines of issue 22's four H200s"},
    )
    from ddtree_conformance.baselines import BaselineFile

    write_baselines(path, BaselineFile(entries=[entry]), update=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--write-seed", type=Path, default=None, help="write the four machines' runs as a baseline file")
    p.add_argument("--tolerance", type=float, default=0.02, help="A/B tolerance (edge 1 - tolerance)")
    args = p.parse_args(argv)
    if args.write_seed:
        write_seed(args.write_seed)
        print(f"wrote {args.write_seed}")
        return 0
    plan = SequentialPlan(min_repeats=3, max_repeats=60, time_budget_s=1e9)
    one = BaselineFile(entries=baseline_run("baseline", "machine-a"))
    four = merge_entries(None, one.entries)
    for m in "bcd":
        four = merge_entries(four, baseline_run(f"baseline-{m}", f"machine-{m}"), merge=True)
    rows = []
    for samples, engine_name in (("correct", "correct"), ("verify+5%", "verify +5 %")):
        for drift in DRIFTS:
            scale = 1 + drift
            old, old_measured = old_gate(samples, scale, one, plan)
            new, info = trial(samples, scale, four, plan)
            ab_status, ab_measured = ab(samples, scale, plan, args.tolerance)
            rows.append(
                {
                    "engine": engine_name,
                    "round_drift": drift,
                    "old_gate": old,
                    "old_measured": old_measured,
                    "new_gate": new,
                    "new_measured": info["measured"],
                    "new_repeats": info["speedup"]["stop"]["repeats"],
                    "new_message": info["message"],
                    "ab": ab_status,
                    "ab_measured": ab_measured,
                }
            )
    entry = four.entries[0].speedup
    head = (
        f"baseline (one run, machine A): {one.entries[0].speedup.value:.4f}, edge {one.entries[0].speedup.lower:.4f}; "
        f"baseline (four runs, machines A-D): {entry.value:.4f}, edge {entry.lower:.4f}, between-run spread "
        f"{100 * entry.spread_log_sd:.2f} %; A/B tolerance {args.tolerance:.0%}"
    )
    lines = [
        head,
        "",
        "| engine | round time drift | old gate (1 run) | new gate (4 runs, spread) | repeats | A/B vs correct build |",
        "|---|---:|---|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | +{100 * r['round_drift']:.1f} % | {r['old_gate']} {r['old_measured']} | "
            f"{r['new_gate']} {r['new_measured']} | {r['new_repeats']} | {r['ab']} {r['ab_measured']} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "drift.json").write_text(json.dumps({"head": head, "rows": rows}, indent=1) + "\n")
        (args.out / "drift.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
