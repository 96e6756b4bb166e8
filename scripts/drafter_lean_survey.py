"""Issue 32, item 3: the drafter-lean test (``NoiseModel.lean_test``) on engines that report drafter logits.

For each engine and dtype, the acceptance and context-range checks at every budget on the fixture pair;
prints, per check, how many drafter rows on the rounds that agree with the replay favour the target's
continuation (toward) and how many disfavour it (away), the share, the p-value and the verdict. Correct
engines that round differently (``testing/rounding_engines.py``, traced: they report drafter logits) and
the reference must sit near half and pass; the excuse adversary must fail.

    python scripts/drafter_lean_survey.py --dtypes float16 bfloat16 --limit 20 --json OUT.json [--shard I/N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.excuse_adversaries import PeekingDrafter
from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run

ENGINES = {"reference": (ReferenceEngine, "pass"), **{k: (v, "pass") for k, v in ROUNDING_ENGINES.items()}}
ENGINES["adversary: drafter logits moved toward the continuation"] = (PeekingDrafter, "fail")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--budgets", default="16,64")
    p.add_argument("--run-seed", type=int, default=1)
    p.add_argument("--shard", default="0/1")
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    i, n = (int(x) for x in args.shard.split("/"))
    jobs = [(name, dtype) for name in ENGINES for dtype in args.dtypes][i::n]
    rows, wrong = [], 0
    print("| engine | dtype | check | status | toward | away | share | p | excused drafter rounds | s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for name, dtype in jobs:
        engine, expected = ENGINES[name]
        settings = fixture_pair_settings(
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            budgets=[int(b) for b in args.budgets.split(",")],
            dtype=dtype,
            torch_threads=1,
            run_seed=args.run_seed,
        )
        t0 = time.perf_counter()
        results = plan_and_run(settings, engine, ["acceptance", "context-range"])
        seconds = time.perf_counter() - t0
        statuses = [r.status for r in results]
        wrong += (expected == "pass" and any(s == "fail" for s in statuses)) or (
            expected == "fail" and "fail" not in statuses
        )
        for r in results:
            lean = (r.details or {}).get("drafter_lean") or {}
            toward, away = lean.get("toward", 0), lean.get("away", 0)
            excused = len((r.details or {}).get("drafter_near_tie_rounds") or [])
            row = {
                "engine": name,
                "dtype": dtype,
                "check": r.check,
                "status": r.status,
                "toward": toward,
                "away": away,
                "p_value": lean.get("p_value"),
                "excused_drafter": excused,
                "expected": expected,
                "message": r.message,
            }
            rows.append(row)
            share = f"{toward / (toward + away):.3f}" if toward + away else "-"
            pv = lean.get("p_value")
            print(
                f"| {name} | {dtype} | {row['check']} | {r.status} | {toward} | {away} | {share} | "
                f"{'-' if pv is None else f'{pv:.2g}'} | {excused} | {seconds:.0f} |",
                flush=True,
            )
    with open(args.json, "w") as fh:
        json.dump({"argv": sys.argv[1:] if argv is None else argv, "rows": rows, "wrong": wrong}, fh, indent=1)
    print(f"wrong verdicts: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
