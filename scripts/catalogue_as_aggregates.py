#!/usr/bin/env python
"""A catalogue's engines as aggregate-only engines: the acceptance check's aggregate path on each of them.

    python scripts/catalogue_as_aggregates.py --catalogue correct|mutants|adversaries|rounding \\
        --dtype float32 [--limit 20] [--max-new-tokens 64] [--budgets 16] [--run-seed 1] --json OUT.json

Every engine runs wrapped in ``testing.rounding_engines.aggregate_box`` (per request its mean acceptance
length and acceptance per depth; no rounds, no traces), on the fixture pair, and only ``acceptance/ddtree``
runs. One line per engine and budget: verdict and message. The correct ones must pass; a mutant or
adversary that passes here slips past the aggregate path (many of them are lossy, and the lossless check
fails them; this check only has to fail the ones whose outputs are the reference's).
"""

from __future__ import annotations

import argparse
import json

import torch

from ddtree_conformance.files import atomic_write
from ddtree_conformance.testing.adversaries import ADVERSARIES
from ddtree_conformance.testing.correct_engines import CORRECT_ENGINES
from ddtree_conformance.testing.excuse_adversaries import EXCUSE_ADVERSARIES
from ddtree_conformance.testing.input_adversaries import INPUT_ADVERSARIES
from ddtree_conformance.testing.mutants import MUTANTS
from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES, aggregate_box
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run

CATALOGUES = {
    "correct": CORRECT_ENGINES,
    "rounding": ROUNDING_ENGINES,
    "mutants": MUTANTS,
    "adversaries": {**ADVERSARIES, **INPUT_ADVERSARIES, **EXCUSE_ADVERSARIES},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--catalogue", choices=tuple(CATALOGUES), default="correct")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", default="16")
    parser.add_argument("--run-seed", type=int, default=1)
    parser.add_argument("--only", help="engines whose label holds this text")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = fixture_pair_settings(
        budgets=[int(b) for b in args.budgets.split(",")],
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        device="cpu",
        run_seed=args.run_seed,
    )
    engines = {label: e for label, e in CATALOGUES[args.catalogue].items() if not args.only or args.only in label}
    if not engines:
        parser.error(f"--only {args.only!r} matches no engine of --catalogue {args.catalogue}")
    rows = []
    for label, engine in engines.items():
        try:
            results = [
                (r.check, r.status, r.message)
                for r in plan_and_run(settings, aggregate_box(engine), ["acceptance/ddtree"])
            ]
        except Exception as exc:  # noqa: BLE001 - a sweep records the error and goes on
            results = [("acceptance/ddtree", "error", f"{type(exc).__name__}: {exc}")]
        for check, status, message in results:
            rows.append({"engine": label, "check": check, "status": status, "dtype": args.dtype, "message": message})
            print(f"{label} | {check} | {status} | {message[:260]}", flush=True)
    if args.json:
        atomic_write(args.json, json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
