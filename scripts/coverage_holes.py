#!/usr/bin/env python3
"""The coverage holes of issue 20 ("everything skipped is a pass"), run as an engine team would.

Each engine of :mod:`ddtree_conformance.testing.coverage_engines` through ``ddtree-conformance
check`` (and the first through the pytest route) on the bundled fixture pair, two prompts (three for
the aggregate-only engine), 16 new tokens, budget 16. Prints one Markdown row per hole: the route,
the engine, the exit status and the run's last line (the verdict, or the reason it is incomplete).

    python scripts/coverage_holes.py            # all holes (about 2 minutes on 2 cores)
    python scripts/coverage_holes.py --only "plain only"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ddtree_conformance.testing.coverage_engines import HOLES

SMALL = ["--limit", "2", "--max-new-tokens", "16", "--budgets", "16"]


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run(cmd: list[str], cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("error:", "incomplete:"))]
    return proc.returncode, errors[-1] if errors else last_line(proc.stdout)


def with_small(args: list[str]) -> list[str]:
    """SMALL, with the hole's own values winning (``--limit 3`` for the aggregate-only engine)."""
    out, given = list(args), {a for a in args if a.startswith("--")}
    for flag, value in zip(SMALL[::2], SMALL[1::2]):
        if flag not in given:
            out += [flag, value]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", help="run only these holes (repeatable)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddtree-holes-") as tmp:
        work = Path(tmp)
        for hole, (engine, extra, _) in HOLES.items():
            if args.only and hole not in args.only:
                continue
            cmd = [
                sys.executable,
                "-m",
                "ddtree_conformance",
                "check",
                "--engine",
                engine,
                *with_small(extra),
                "--out",
                str(work / f"{len(rows)}.json"),
            ]
            code, line = run(cmd, work)
            rows.append(("check", hole, code, line))
            print(f"| check | {hole} | {code} | {line} |", flush=True)
        if not args.only or "pytest: capabilities drop ddtree" in args.only:
            engine, extra, _ = HOLES["capabilities drop ddtree"]
            flags = ["--ddtree-" + a[2:] if a.startswith("--") else a for a in with_small(extra)]
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--ddtree-engine", engine, *flags]
            code, line = run(cmd, work)
            print(f"| pytest | capabilities drop ddtree | {code} | {line} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
