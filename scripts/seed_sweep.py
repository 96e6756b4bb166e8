"""Run a few checks on one catalogue engine under many run seeds, and print every seed that does not
pass: a verdict that depends on the draw (held-out prompts, request order, drawn sampling settings)
shows up here, where one run of the catalogue would show it only by luck.

    python scripts/seed_sweep.py --engine "ties broken the other way" --dtype bfloat16 --seeds 1-79 --checks acceptance/

``--engine`` names an engine of the correct catalogue (conformance/testing/correct_engines.py), of the
mutants, or ``reference``; the settings are the catalogue table's (fixture pair, 4 prompts, 24 new
tokens, B=16, 60 sampling requests). Exit status 1 when any seed did not pass.
"""

from __future__ import annotations

import argparse
import sys

import torch

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.correct_engines import CORRECT_ENGINES
from ddtree_conformance.testing.mutants import MUTANTS
from ddtree_conformance.testing.runs import plan_and_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, help="a catalogue label, or 'reference'")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seeds", default="1-20", help="FIRST-LAST, inclusive")
    parser.add_argument("--checks", nargs="*", default=None, help="check-id substrings (default: the whole plan)")
    args = parser.parse_args(argv)
    engines = {"reference": ReferenceEngine, **CORRECT_ENGINES, **MUTANTS}
    if args.engine not in engines:
        parser.error(f"--engine {args.engine!r}: not one of {', '.join(sorted(engines))}")
    cls = engines[args.engine]
    first, last = (int(x) for x in args.seeds.split("-"))
    torch.set_num_threads(1)
    bad = 0
    for seed in range(first, last + 1):
        settings = SuiteSettings(
            budgets=[16],
            limit=4,
            max_new_tokens=24,
            isolate=False,
            dtype=args.dtype,
            sampling_requests=60,
            run_seed=seed,
        )
        results = plan_and_run(settings, cls, args.checks)
        failed = [r for r in results if r.status not in ("pass", "skip")]
        bad += bool(failed)
        for r in failed:
            print(f"seed {seed}: {r.check} {r.status}: {r.message[:400]}", flush=True)
    print(f"{args.engine}, {args.dtype}: {bad} of {last - first + 1} run seeds did not pass")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
