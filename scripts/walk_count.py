#!/usr/bin/env python
"""Issue 30 item 8, "the walk stays short", measured: run the acceptance check on the tiny random pair and
follow it from ``check_acceptance`` to its return, as a reader following the code would.

Every function of the package met for the first time (each function once, in the order it is first
entered) is a step in its module; consecutive steps in one module are one *stay*. The script prints the
stays, the modules visited, and the *returns* (stays in a module the walk had already left). Calls into
the engine (``adapters/``) and third-party code are not steps, nor is anything they call in turn (the
reference engine runs the spec's functions: that is the engine working, not the suite's walk); nor are
comprehensions and lambdas, which are read with the function that holds them.

Two walks: *cold*, the acceptance check as the run's only check, where it starts the engine and loads the
prompts itself; and *after the front ends' setup*: both front ends (``ddtree-conformance check`` and the
pytest route) hold the oracle files (``oracle.hold``) and call ``session.require_support()`` before any
check, which reads the noise model, starts the engine and reads its capabilities, so a function met there is
not met again inside the check. ``--list`` and ``--functions``
show the second.

    python scripts/walk_count.py [--list] [--functions]
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
ADAPTERS = PACKAGE.parent / "adapters"
WALKED: list[str] = []  # module:function of each step, for --functions
# comprehensions and lambdas are read as part of the function that holds them (Python 3.12 inlines list,
# dict and set comprehensions: PEP 709), so entering one is not a step
INLINE = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>"}


def _in_engine(frame) -> bool:
    """Whether ``frame`` runs inside an engine or the reference's own code (adapters/): what they call,
    the spec's functions included, is the engine's working, not the suite's walk."""
    while frame is not None:
        if ADAPTERS in Path(frame.f_code.co_filename).resolve().parents:
            return True
        frame = frame.f_back
    return False


def walk(settings, warm: bool = False) -> list[str]:
    """The modules (paths under conformance/) of the first entry of each function, from the acceptance
    check's entry to its return."""
    seen: set = set()
    steps: list[str] = []
    inside = [False]
    names = WALKED
    entry = acceptance.check_acceptance.__code__

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code is entry:
            inside[0] = True
        if event == "return" and code is entry:
            inside[0] = False
        if event != "call" or code in seen or code.co_name in INLINE:
            return
        if not inside[0]:
            if warm:
                seen.add(code)  # read already, in the run's setup
            return
        if _in_engine(frame.f_back):
            return
        path = Path(code.co_filename).resolve()
        if PACKAGE in path.parents and "testing" not in path.parts:
            seen.add(code)
            steps.append(str(path.relative_to(PACKAGE.parent)))
            names.append(f"{steps[-1]}:{code.co_name}")

    sys.setprofile(profile)
    try:
        plan_and_run(settings, ReferenceEngine, ["acceptance/ddtree"], require_support=warm)
    finally:
        sys.setprofile(None)
    return steps


def stays(steps: list[str]) -> list[str]:
    return [m for i, m in enumerate(steps) if i == 0 or steps[i - 1] != m]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every stay")
    parser.add_argument("--functions", action="store_true", help="print every step (module:function)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pair = write_random_pair(Path(tmp) / "pair")
        settings = random_pair_settings(
            pair, Path(tmp) / "p.jsonl", [3, 9, 17, 30], seed=5, prefix="w", budgets=[16], max_new_tokens=24
        )
        cold = walk(settings)
        WALKED.clear()
        warm = walk(settings, warm=True)
    for label, steps in (("the run's first check, cold", cold), ("after the front ends' setup", warm)):
        path = stays(steps)
        returns = sum(m in path[:i] for i, m in enumerate(path))
        print(
            f"{label}: {len(path)} stays in {len(set(path))} modules, {returns} of them returns to a module left before"
        )
    if args.list:
        for m in stays(warm):
            print(f"  {m}")
    if args.functions:
        for name in WALKED:
            print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
