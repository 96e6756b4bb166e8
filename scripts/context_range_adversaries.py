#!/usr/bin/env python3
"""Issue 32: the context-range check on the README's quick plan against the engines that aim at its
alone reruns, one line each and a JSON file of the verdicts.

    python scripts/context_range_adversaries.py OUT.json [--dtype bfloat16]

Engines: ``LongerRoundsAfterAFlipInCompany`` and ``LongerRoundsInCompany`` (must fail), and the correct
``DraftsDroppedInCompany`` as a black box (must pass). Fixture pair, CPU, run seed 1, ``--limit 3
--budgets 16 --max-new-tokens 16`` (the check decodes every context length whatever the limit).
``scripts/measurements/issue-32-flip-adversary-runs.json`` holds its output before and after the change
that let only shorter rounds send a call to the alone reruns.
"""

from __future__ import annotations

import argparse
import json

from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.correct_engines import DraftsDroppedInCompany
from ddtree_conformance.testing.input_adversaries import LongerRoundsAfterAFlipInCompany, LongerRoundsInCompany
from ddtree_conformance.testing.rounding_engines import black_box
from ddtree_conformance.testing.runs import plan_and_run

ENGINES = {
    "flip": LongerRoundsAfterAFlipInCompany,
    "longer": LongerRoundsInCompany,
    "dropped-bb": black_box(DraftsDroppedInCompany),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    quick = SuiteSettings(run_seed=1, isolate=False, torch_threads=1, limit=3, budgets=[16], max_new_tokens=16)
    out = {}
    for name, engine in ENGINES.items():
        (r,) = plan_and_run(quick.model_copy(update={"dtype": args.dtype}), engine, ["context-range/ddtree"])
        company = r.details.get("company_rounds")
        out[f"{name}-{args.dtype}"] = {"status": r.status, "message": r.message[:600], "company_rounds": company}
        print(name, args.dtype, r.status, r.message[:400], company, flush=True)
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
