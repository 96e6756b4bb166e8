#!/usr/bin/env python3
"""The README's figures, from runs of the commands they describe.

README.md marks each figure it quotes: ``<!-- figure:NAME -->TEXT<!-- /figure -->``. This script runs
the commands, writes what they printed to ``scripts/measurements/readme-figures.json`` (the value, the command, the
date)
and puts each value between its markers, so no figure in the README is typed by hand:

* ``tier``: the default CPU tier, ``python -m pytest -q -n 2`` (its counts and pytest's own time);
* ``check``: ``ddtree-conformance check`` on the fixture pair (its counts, wall time and each run's tau);
  its report is the example in ``docs/examples/check-reference.*``.

    python scripts/readme_figures.py               # run both (about 10 minutes on 2 cores), update both files
    python scripts/readme_figures.py --only check  # one group
    python scripts/readme_figures.py --verify      # no runs: exit 1 when README.md differs from
    scripts/measurements/readme-figures.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIGURES = ROOT / "scripts" / "measurements" / "readme-figures.json"
MARKER = re.compile(r"<!-- figure:(?P<name>[\w-]+) -->(?P<text>.*?)<!-- /figure -->", flags=re.S)
TIER = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--durations=25"]
CHECK = [sys.executable, "-m", "ddtree_conformance", "check"]


def pytest_counts(output: str) -> tuple[str, str]:
    """("580 passed, 4 skipped", "231 s") from pytest's last line."""
    line = [ln for ln in output.splitlines() if re.search(r"\d+ passed", ln)][-1]
    counts = ", ".join(re.findall(r"\d+ (?:passed|failed|skipped|errors?)", line))
    seconds = re.search(r"in ([\d.]+)s", line)
    return counts, f"{float(seconds.group(1)):.0f} s" if seconds else "?"


def check_figures(report: dict, wall_s: float) -> dict[str, str]:
    counts = report["counts"]
    runs = {r["label"]: r["tau"] for r in report.get("runs", []) if r.get("tau") is not None}
    ddtree = sorted((label for label in runs if label.startswith("ddtree-B")), key=lambda x: int(x.split("B")[1]))
    tau = (
        (f"tau {runs['dflash']:.2f} (DFlash), " if "dflash" in runs else "tau ")
        + " / ".join(f"{runs[label]:.2f}" for label in ddtree)
        + f" (B={'/'.join(label.split('B')[1] for label in ddtree)})"
    )
    skipped = f", {counts['skip']} skip" if counts.get("skip") else ""
    return {
        "check-counts": f"{counts['pass']} checks pass{skipped}",
        "check-seconds": f"{report.get('elapsed_s', wall_s):.0f} s",
        "check-tau": tau,
    }


def run_tier() -> dict[str, dict]:
    proc = subprocess.run(TIER, cwd=ROOT, capture_output=True, text=True)
    (ROOT / "reports").mkdir(exist_ok=True)
    (ROOT / "reports" / "default-tier.log").write_text(proc.stdout + proc.stderr)  # the durations, the failures
    counts, seconds = pytest_counts(proc.stdout)
    command = " ".join(["python", *TIER[1:]])
    return {
        "tier-counts": {"value": counts, "command": command},
        "tier-seconds": {"value": seconds, "command": command},
    }


def run_check() -> dict[str, dict]:
    out = ROOT / "docs" / "examples" / "check-reference.json"
    with tempfile.TemporaryDirectory(prefix="ddtree-figures-") as tmp:
        started = time.perf_counter()
        subprocess.run([*CHECK, "--out", str(out)], cwd=tmp, capture_output=True, text=True)
        report = json.loads(out.read_text())
        figures = check_figures(report, time.perf_counter() - started)
    command = "ddtree-conformance check"
    return {name: {"value": value, "command": command} for name, value in figures.items()}


GROUPS = {"tier": run_tier, "check": run_check}


def apply(readme: str, figures: dict[str, dict]) -> str:
    def replace(match: re.Match) -> str:
        found = figures.get(match["name"])
        text = found["value"] if found else match["text"]
        return f"<!-- figure:{match['name']} -->{text}<!-- /figure -->"

    return MARKER.sub(replace, readme)


def differences(readme: str, figures: dict[str, dict]) -> list[str]:
    out = []
    for match in MARKER.finditer(readme):
        found = figures.get(match["name"])
        if found is None:
            out.append(f"README figure {match['name']!r} is in no run of scripts/measurements/readme-figures.json")
        elif found["value"] != match["text"]:
            out.append(f"README figure {match['name']!r} reads {match['text']!r}; the run gave {found['value']!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(GROUPS))
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args(argv)
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    if args.verify:
        problems = differences(README.read_text(), figures)
        print("\n".join(problems) or "README.md's figures are scripts/measurements/readme-figures.json's")
        return 1 if problems else 0
    today = dt.date.today().isoformat()
    for group in args.only or sorted(GROUPS):
        for name, entry in GROUPS[group]().items():
            figures[name] = {**entry, "date": today}
            print(f"{name}: {entry['value']}  ({entry['command']})", flush=True)
    FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    README.write_text(apply(README.read_text(), figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
