#!/usr/bin/env python
"""Issue 30 item 8, "the walk stays short", measured: run the acceptance check on the tiny random pair and
follow it from ``check_acceptance`` to its return, as a reader following the code would.

Every function of the package met for the first time (each function once, in the order it is first
entered) is a step in its module; consecutive steps in one module are one *stay*. The script prints the
stays, the modules visited, and the *returns* (stays in a module the walk had already left). Calls into
the engine (``adapters/``) and third-party code are not steps: the walk is the suite's own code.

    python scripts/walk_count.py [--list]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.checks import acceptance
from ddtree_conformance.testing.random_pair import write_random_pair
from ddtree_conformance.testing.runs import plan_and_run, random_pair_settings

PACKAGE = Path(acceptance.__file__).resolve().parents[1]  # conformance/


def walk(settings) -> list[str]:
    """The modules (paths under conformance/) of the first entry of each function, from the acceptance
    check's entry to its return."""
    seen: set = set()
    steps: list[str] = []
    inside = [False]
    entry = acceptance.check_acceptance.__code__

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code is entry:
            inside[0] = True
        if event == "return" and code is entry:
            inside[0] = False
        if event != "call" or not inside[0] or code in seen:
            return
        path = Path(code.co_filename).resolve()
        if PACKAGE in path.parents and "testing" not in path.parts:
            seen.add(code)
            steps.append(str(path.relative_to(PACKAGE.parent)))

    sys.setprofile(profile)
    try:
        plan_and_run(settings, ReferenceEngine, ["acceptance/ddtree"])
    finally:
        sys.setprofile(None)
    return steps


def stays(steps: list[str]) -> list[str]:
    return [m for i, m in enumerate(steps) if i == 0 or steps[i - 1] != m]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every stay")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pair = write_random_pair(Path(tmp) / "pair")
        settings = random_pair_settings(
            pair, Path(tmp) / "p.jsonl", [3, 9, 17, 30], seed=5, prefix="w", budgets=[16], max_new_tokens=24
        )
        steps = walk(settings)
    path = stays(steps)
    returns = sum(m in path[:i] for i, m in enumerate(path))
    if args.list:
        for m in path:
            print(f"  {m}")
    print(f"{len(path)} stays in {len(set(path))} modules, {returns} of them returns to a module already left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
