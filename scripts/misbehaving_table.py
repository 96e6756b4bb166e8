"""Run ``ddtree-conformance check`` against every misbehaving engine and print the fault table.

    python scripts/misbehaving_table.py [--json rows.json]

Each engine of :data:`ddtree_conformance.testing.misbehaving.CATALOGUE` runs as a user would run
it (a ``ddtree-conformance`` process) on a tiny random pair, two prompts, 8 new tokens, DDTree at
B=4, its check families; then a few usage faults (unknown engine, budgets, device). Each row:
fault, verdict (status of each check), exit status, the message, and the command that produced
it. A fault that exits 0 is a hole in the suite; the script exits 1 then. (The honest engine that
reports no acceptance data exits 7, incomplete, since coverage became a verdict.)
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from ddtree_conformance.testing.misbehaving import CATALOGUE, catalogue_check_command
from ddtree_conformance.testing.random_pair import write_random_pair

PROMPTS = [{"id": "a", "prompt_ids": [1, 2, 3, 4]}, {"id": "b", "prompt_ids": [9, 8, 7, 6, 5, 4, 3]}]


def run(command: list[str], report: Path) -> dict:
    done = subprocess.run(command, capture_output=True, text=True)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    verdict = "-"
    if report.is_file():
        results = json.loads(report.read_text())["results"]
        verdict = ", ".join(
            f"{r['check']}: {'not run' if r['details'].get('not_run') else r['status']}" for r in results
        )
        failed = [r["message"] for r in results if r["status"] == "fail"]
        message = failed[0] if failed else (results[0]["message"] if results else "")
        report.unlink()
    else:
        message = errors[0].removeprefix("error: ") if errors else done.stderr.strip()[-300:]
    return {
        "exit": done.returncode,
        "verdict": verdict,
        "message": message,
        "stderr": errors[:1],
        "command": shlex.join(command),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddtree-misbehaving-"))
    target, drafter = write_random_pair(root / "pair")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    report = root / "report.json"
    base = catalogue_check_command(target, drafter, prompts, root / "golden", report)
    rows = []
    for name, fault in CATALOGUE.items():
        command = [*base, *fault.check_args()]
        rows.append({"fault": name, **run(command, report)})
    usage = {
        "unknown engine": ["--engine", "nosuch", "--check", "lossless"],
        "budget above any engine's": ["--budgets", "100000000", "--check", "lossless"],
        "budget above the engine's max_budget": ["--budgets", "5000", "--check", "lossless", "--no-isolate"],
        "device not on this machine": ["--device", "cuda", "--check", "lossless", "--no-isolate"],
    }
    for name, extra in usage.items():
        rows.append({"fault": name, **run([*base, *extra], report)})
    print("| fault | verdict | exit | message |")
    print("|---|---|---:|---|")
    for row in rows:
        message = " ".join(row["message"].split()).replace("|", "/")
        print(f"| {row['fault']} | {row['verdict']} | {row['exit']} | {message} |")
    print()
    for row in rows:
        print(f"- {row['fault']}: `{row['command']}`")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    holes = [r["fault"] for r in rows if r["exit"] == 0]
    if holes:
        print(f"passed (exit 0): {', '.join(holes)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
