"""Every check's verdict and message, on the reference, the mutant catalogue and the misbehaving
catalogue: a snapshot to diff before and after a change that must not change behaviour.

    python scripts/verdict_snapshot.py snapshot OUT.json [--limit 4] [--max-new-tokens 16] [--budgets 16,256]
    python scripts/verdict_snapshot.py compare BEFORE.json AFTER.json

``snapshot`` runs the whole plan in process (fixture pair, float32, CPU) on the correct reference
engine and on every engine of :data:`ddtree_conformance.testing.mutants.MUTANTS`, then every
fault of :data:`ddtree_conformance.testing.misbehaving.CATALOGUE` as a ``ddtree-conformance check``
process on a tiny random pair (as ``scripts/misbehaving_table.py`` does). It keeps, per engine,
each check's status and message (temporary paths replaced by ``<tmp>``), and the exit status of
the CLI runs. ``compare`` prints every difference and exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TMP = re.compile(r"/tmp/[A-Za-z0-9_.-]+")
# Held-out prompts, request order and batching follow the run seed: fixed, so two snapshots compare.
RUN_SEED = 1234


def _clean(text: str, root: str | None = None) -> str:
    if root:
        text = text.replace(root, "<root>")
    return TMP.sub("<tmp>", text)


def _in_process(args) -> dict[str, dict]:
    import torch

    from ddtree_conformance.adapters.reference.engine import ReferenceEngine
    from ddtree_conformance.session import SuiteSettings
    from ddtree_conformance.testing.mutants import MUTANTS
    from ddtree_conformance.testing.runs import plan_and_run

    torch.set_num_threads(1)
    settings = SuiteSettings(
        budgets=[int(b) for b in args.budgets.split(",")],
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        isolate=False,
        sampling_requests=60,
        run_seed=RUN_SEED,
    )
    out = {}
    for label, cls in {"correct reference": ReferenceEngine, **MUTANTS}.items():
        results = plan_and_run(settings, cls)
        out[label] = {r.check: [r.status, _clean(r.message)] for r in results}
        print(f"{label}: {sum(r.status == 'fail' for r in results)} fail", flush=True)
    return out


def _misbehaving() -> dict[str, dict]:
    from ddtree_conformance.testing.misbehaving import CATALOGUE, catalogue_check_command
    from ddtree_conformance.testing.random_pair import write_random_pair

    root = Path(tempfile.mkdtemp(prefix="ddtree-snapshot-"))
    target, drafter = write_random_pair(root / "pair")
    prompts = root / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 2, 3, 4]}\n{"id": "b", "prompt_ids": [9, 8, 7, 6, 5, 4, 3]}\n')
    report = root / "report.json"
    base = catalogue_check_command(target, drafter, prompts, root / "golden", report, run_seed=RUN_SEED)
    out = {}
    for name, fault in CATALOGUE.items():
        command = [*base, *fault.check_args()]
        done = subprocess.run(command, capture_output=True, text=True)
        row: dict = {"exit": [str(done.returncode), ""]}
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        if errors:
            row["error"] = ["", _clean(errors[0], str(root))]
        if report.is_file():
            for r in json.loads(report.read_text())["results"]:
                status = "not run" if r["details"].get("not_run") else r["status"]
                row[r["check"]] = [status, _clean(r["message"], str(root))]
            report.unlink()
        out["misbehaving: " + name] = row
        print(f"{name}: exit {done.returncode}", flush=True)
    return out


def snapshot(args) -> int:
    in_process = _in_process(args)
    partial = Path(args.out + ".partial")  # the slow part kept, should the catalogue's processes fail
    partial.write_text(json.dumps(in_process, indent=1, sort_keys=True) + "\n")
    data = {**in_process, **_misbehaving()}
    partial.unlink()
    Path(args.out).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(data)} engines, {sum(len(v) for v in data.values())} verdicts")
    return 0


def compare(args) -> int:
    before, after = (json.loads(Path(p).read_text()) for p in (args.before, args.after))
    differences = 0
    for engine in sorted(set(before) | set(after)):
        b, a = before.get(engine, {}), after.get(engine, {})
        for check in sorted(set(b) | set(a)):
            if b.get(check) != a.get(check):
                differences += 1
                print(f"{engine} | {check}\n  before: {b.get(check)}\n  after:  {a.get(check)}")
    total = sum(len(v) for v in after.values())
    print(f"{differences} differences in {total} verdicts of {len(after)} engines")
    return 1 if differences else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("out")
    snap.add_argument("--limit", type=int, default=4)
    snap.add_argument("--max-new-tokens", type=int, default=16)
    snap.add_argument("--budgets", default="16,256")
    comp = sub.add_parser("compare")
    comp.add_argument("before")
    comp.add_argument("after")
    args = parser.parse_args(argv)
    return snapshot(args) if args.command == "snapshot" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
