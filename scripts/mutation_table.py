"""Run the conformance plan against every mutant engine and print the mutation table.

    python scripts/mutation_table.py --model DIR --drafter DIR --prompts SET [--budget 16]

Each row: mutant, the checks that failed, the first failure's message. A mutant that no check
fails is a hole in the suite; the script exits 1 then.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.checks import plan, run_plan
from ddtree_conformance.session import SuiteSession, SuiteSettings
from ddtree_conformance.testing.mutants import MUTANTS


def main() -> int:
    import torch

    torch.set_num_threads(1)  # tiny models: threads only contend on small CPUs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--pair-name", default="fixture")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sampling-requests", type=int, default=150)
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--include-correct", action="store_true", help="also run the correct reference engine")
    args = parser.parse_args()

    settings = SuiteSettings(model_dir=args.model, drafter_dir=args.drafter, prompt_set=args.prompts,
                             pair_name=args.pair_name, budgets=[args.budget], limit=args.limit,
                             max_new_tokens=args.max_new_tokens, isolate=False,
                             sampling_requests=args.sampling_requests)
    engines = dict(MUTANTS)
    if args.include_correct:
        engines = {"correct reference": ReferenceEngine, **engines}
    rows, holes = [], []
    for label, cls in engines.items():
        t0 = time.time()
        session = SuiteSession(settings, engine_factory=lambda m, d, cls=cls: cls(m, d))
        try:
            results = run_plan(session, plan(settings))
        finally:
            session.close()
        failed = [r for r in results if r.status == "fail"]
        counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
        rows.append({"engine": label, "failed": [r.check for r in failed],
                     "message": failed[0].message if failed else "", "counts": counts,
                     "seconds": round(time.time() - t0, 1)})
        if label != "correct reference" and not failed:
            holes.append(label)
        if label == "correct reference" and failed:
            holes.append(label + " (fails: " + ", ".join(r.check for r in failed) + ")")
        print(f"| {label} | {', '.join(r.check for r in failed) or '-'} | "
              f"{(failed[0].message if failed else 'all pass')[:220]} | {counts} | {rows[-1]['seconds']} s |",
              flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    if holes:
        print("NOT CAUGHT / WRONG:", ", ".join(holes))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
