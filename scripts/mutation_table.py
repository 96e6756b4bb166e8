"""Run the conformance plan against every mutant engine and print the mutation table.

    python scripts/mutation_table.py [--dtype bfloat16] [--device cuda] [--budgets 16,256] [--limit 8]
                                     [--only NAME ...] [--shard I/N] [--include-correct] [--json F]
                                     [--catalogue mutants|adversaries|correct|rounding|rounding-black-box]
                                     [--check SUBSTRING ...] [--run-seed N [N ...]]

Defaults: the fixture pair, budgets 16 and 256 (the budget-above-128 mutant needs the large one),
32 new tokens. Each row: mutant, the checks that failed, the first failure's message. A mutant
that no check fails is a hole in the suite, and a correct reference that fails is a false alarm;
the script exits 1 for either. ``--catalogue correct`` runs the correct engines that use the spec's
freedoms (conformance/testing/correct_engines.py) instead: every one must pass, a failure is a
false alarm. ``--catalogue rounding`` runs the correct engines that round differently
(conformance/testing/rounding_engines.py), ``rounding-black-box`` the same reporting outputs and
per-round acceptance lengths only: every one must pass in every dtype. ``--catalogue adversaries``
runs the engines built to slip past the suite (conformance/testing/adversaries.py, input_adversaries.py,
excuse_adversaries.py): like the mutants, every one must fail.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.files import atomic_write
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.adversaries import ADVERSARIES
from ddtree_conformance.testing.correct_engines import CORRECT_ENGINES
from ddtree_conformance.testing.excuse_adversaries import EXCUSE_ADVERSARIES
from ddtree_conformance.testing.input_adversaries import INPUT_ADVERSARIES
from ddtree_conformance.testing.mutants import MUTANTS
from ddtree_conformance.testing.rounding_engines import BLACK_BOXES, ROUNDING_ENGINES
from ddtree_conformance.testing.runs import plan_and_run

CATALOGUES = {
    "mutants": MUTANTS,
    "adversaries": {**ADVERSARIES, **INPUT_ADVERSARIES, **EXCUSE_ADVERSARIES},
    "correct": CORRECT_ENGINES,
    "rounding": ROUNDING_ENGINES,
    "rounding-black-box": {f"{label} (black box)": cls for label, cls in BLACK_BOXES.items()},
}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(FIXTURE_TARGET))
    parser.add_argument("--drafter", default=str(FIXTURE_DRAFTER))
    parser.add_argument("--prompts", default="fixture")
    parser.add_argument("--pair-name", default="fixture")
    parser.add_argument("--budgets", default="16,256")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--sampling-requests", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny models: 1)")
    parser.add_argument("--only", nargs="*", default=None, help="mutant names (substrings) to run")
    parser.add_argument("--shard", default=None, help="I/N: run every N-th engine starting at I (parallel runs)")
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--include-correct", action="store_true", help="also run the correct reference engine")
    parser.add_argument(
        "--catalogue",
        choices=tuple(CATALOGUES),
        default="mutants",
        help="the broken engines (each must fail) or correct ones (freedoms, other rounding; each must pass)",
    )
    parser.add_argument("--check", nargs="*", default=None, help="keep checks whose id contains one of these")
    parser.add_argument(
        "--run-seed",
        type=int,
        nargs="+",
        default=None,
        help="the run seed (held-out prompts, draws); several: each engine once per seed, in one process (the "
        "process's start-up paid once)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    settings = SuiteSettings(
        model_dir=args.model,
        drafter_dir=args.drafter,
        prompt_set=args.prompts,
        pair_name=args.pair_name,
        budgets=[int(b) for b in args.budgets.split(",")],
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        isolate=False,
        dtype=args.dtype,
        device=args.device,
        sampling_requests=args.sampling_requests,
    )
    engines = dict(CATALOGUES[args.catalogue])
    correct = set() if args.catalogue in ("mutants", "adversaries") else set(engines)
    if args.include_correct:
        engines = {"correct reference": ReferenceEngine, **engines}
    if args.only:
        engines = {k: v for k, v in engines.items() if any(o in k for o in args.only)}
        if not engines:  # a typo must not pass as a run of nothing
            names = "; ".join(CATALOGUES[args.catalogue])
            parser.error(
                f"--only {' '.join(args.only)}: no engine of --catalogue {args.catalogue} has that in "
                f"its label (labels: {names})"
            )
    if args.shard:
        index, count = (int(x) for x in args.shard.split("/"))
        engines = {k: v for i, (k, v) in enumerate(engines.items()) if i % count == index}
    seeds = args.run_seed or [settings.run_seed]
    seeded = [settings.model_copy(update={"run_seed": seed}) for seed in seeds]
    rows, holes = [], []
    for settings, (label, cls) in itertools.product(seeded, engines.items()):
        t0 = time.time()
        results = plan_and_run(settings, cls, args.check)
        failed = [r for r in results if r.status == "fail"]
        counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
        rows.append(
            {
                "engine": label,
                "dtype": args.dtype,
                "device": args.device,
                "failed": [r.check for r in failed],
                "skipped": [r.check for r in results if r.status == "skip"],  # skipped is not passed: named
                "message": failed[0].message if failed else "",
                "counts": counts,
                "run_seed": settings.run_seed,
                "seconds": round(time.time() - t0, 1),
                # what the row was measured at: scripts/rounding_table.py counts a row only at the scale
                "scale": {
                    "limit": settings.limit,
                    "max_new_tokens": settings.max_new_tokens,
                    "budgets": list(settings.budgets),
                    "checks": args.check,  # None: every check of the plan
                },
            }
        )
        must_pass = label == "correct reference" or label in correct
        if not must_pass and not failed:
            holes.append(f"{label} (seed {settings.run_seed})")
        if must_pass and failed:
            holes.append(f"{label} (seed {settings.run_seed}; fails: " + ", ".join(r.check for r in failed) + ")")
        print(
            f"| {label} | {args.dtype} | seed {settings.run_seed} | {', '.join(r.check for r in failed) or '-'} | "
            f"{(failed[0].message if failed else 'all pass')[:300]} | {counts} | {rows[-1]['seconds']} s |",
            flush=True,
        )
        if args.json:  # after every engine: a run stopped at a deadline keeps the rows it finished
            atomic_write(args.json, json.dumps(rows, indent=1) + "\n")
    if holes:
        print("NOT CAUGHT / WRONG:", ", ".join(holes))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
