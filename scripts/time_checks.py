"""Seconds per planned check of one conformance run (where the main job's time goes).

    python scripts/time_checks.py [--dtype bfloat16] [--limit N] [--budgets 16,64,256] [--no-isolate] [--json F]

Runs the default plan like ``ddtree-conformance check`` (engine in its own process unless
``--no-isolate``) and prints one line per check: seconds, status, message. Runs are memoised per
session, so a check's seconds include only the engine work it is the first to ask for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ddtree_conformance.checks import plan
from ddtree_conformance.session import SuiteSession
from ddtree_conformance.settings import build_settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="reference")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--budgets", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--check", action="append", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-isolate", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    settings, _ = build_settings(
        dict(
            engine=args.engine,
            dtype=args.dtype,
            device=args.device,
            limit=args.limit,
            budgets=args.budgets,
            max_new_tokens=args.max_new_tokens,
            checks=args.check,
            isolate=not args.no_isolate,
            torch_threads=args.threads,
        )
    )
    session = SuiteSession(settings)
    rows, total = [], time.perf_counter()
    try:
        for check in plan(settings):
            t0 = time.perf_counter()
            result = check.run(session)
            seconds = time.perf_counter() - t0
            rows.append(
                {"check": check.id, "seconds": round(seconds, 2), "status": result.status, "message": result.message}
            )
            print(f"{seconds:7.1f} s  {result.status:4}  {check.id}: {result.message[:160]}", flush=True)
    finally:
        session.close()
    print(f"total {time.perf_counter() - total:.1f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
