#!/usr/bin/env python
"""The catalogue table of issue 28: every correct engine that rounds differently, per dtype, device and
report kind (traced, or a black box reporting outputs and acceptance lengths only), over the run seeds
measured, from the JSON rows ``scripts/mutation_table.py --json`` writes (the ``rounding`` and
``rounding-black-box`` catalogues; ``scripts/gpu_trials.sh rounding`` on the lent GPU).

    python scripts/rounding_table.py scripts/measurements/2026-12-0*-rounding*/**/*.json [--seeds 5] [--json F]

One row per (engine, dtype, device, kind) of the whole grid (every engine of the catalogue, float32 /
bfloat16 / float16, CPU and CUDA, traced and black box): the seeds run, the checks passed / failed / skipped
summed over them, and the failed check ids. A cell with fewer than ``--seeds`` seeds is marked as such, a cell
never run reads "not run", and the count of cell-runs still to run closes the table. ``--left`` also prints,
per device, the ``ROUND_GROUPS`` of ``scripts/gpu_trials.sh rounding-groups`` that would run them (one group per
engine and seed), and the ``ROUND_CELLS`` of ``rounding-cells`` (one process per cell-run left, nothing run
twice). Exits 1 when any row failed a check (a correct engine must pass everywhere), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES

BLACK_BOX = " (black box)"
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
KINDS = ("traced", "black box")


def load_rows(paths: list[Path]) -> list[dict]:
    """The engine rows of ``mutation_table.py --json`` files; a file that is not such a list is named and skipped."""
    rows = []
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"{path}: not readable as JSON ({exc}); skipped", file=sys.stderr)
            continue
        if not isinstance(data, list) or not all(isinstance(r, dict) and "engine" in r for r in data):
            print(f"{path}: not a list of engine rows; skipped", file=sys.stderr)
            continue
        rows += data
    return rows


def table(rows: list[dict]) -> list[dict]:
    """The rounding catalogue's rows grouped per (engine, dtype, device, kind), counts summed over seeds (a
    seed measured twice counts once: the later row wins); rows of other catalogues are left out."""
    cells: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        if r["engine"].removesuffix(BLACK_BOX) not in ROUNDING_ENGINES:
            continue  # another catalogue's row (mutants, adversaries) in the same folder
        kind = "black box" if r["engine"].endswith(BLACK_BOX) else "traced"
        key = (r["engine"].removesuffix(BLACK_BOX), r["dtype"], r["device"], kind)
        cells[key][int(r.get("run_seed") or 0)] = r
    out = []
    for (engine, dtype, device, kind), by_seed in cells.items():
        counts = {k: sum(r["counts"].get(k, 0) for r in by_seed.values()) for k in ("pass", "fail", "skip")}
        failed = sorted({c for r in by_seed.values() for c in r.get("failed") or []})
        out.append(
            {
                "engine": engine,
                "dtype": dtype,
                "device": device,
                "kind": kind,
                "seeds": sorted(by_seed),
                # seeds whose row was rebuilt from a job's printed rows (the file itself not fetched): named
                "rebuilt": sorted(seed for seed, r in by_seed.items() if r.get("rebuilt_from")),
                **counts,
                "failed": failed,
            }
        )
    order = {d: i for i, d in enumerate(DTYPES)}
    return sorted(out, key=lambda r: (r["device"], order.get(r["dtype"], 9), r["kind"], r["engine"]))


def left(cells: list[dict], seeds: int) -> list[dict]:
    """Every cell of the grid (the catalogue's engines x DTYPES x DEVICES x KINDS) with fewer than ``seeds`` seeds,
    with the seeds still to run: the lowest not run yet, as many as it lacks (none run: 1..seeds)."""
    have = {(c["engine"], c["dtype"], c["device"], c["kind"]): set(c["seeds"]) for c in cells}
    out = []
    for engine in ROUNDING_ENGINES:
        for device in DEVICES:
            for dtype in DTYPES:
                for kind in KINDS:
                    done = have.get((engine, dtype, device, kind), set())
                    todo = [s for s in range(1, seeds + len(done) + 1) if s not in done][: max(0, seeds - len(done))]
                    if todo:
                        out.append({"engine": engine, "dtype": dtype, "device": device, "kind": kind, "seeds": todo})
    return out


def round_groups(todo: list[dict], device: str, dtypes: tuple[str, ...]) -> str:
    """``ROUND_GROUPS`` for the cells ``todo`` leaves on ``device`` in ``dtypes``: ``label|seed`` for every engine
    and seed that any of them lacks (a group runs both kinds in every dtype of ``ROUND_DTYPES``), ``;``-joined."""
    wanted: dict[str, set[int]] = defaultdict(set)
    for c in todo:
        if c["device"] == device and c["dtype"] in dtypes:
            wanted[c["engine"]].update(c["seeds"])
    return ";".join(f"{engine}|{seed}" for engine, seeds in wanted.items() for seed in sorted(seeds))


def round_cells(todo: list[dict], device: str) -> str:
    """``ROUND_CELLS`` for the cell-runs ``todo`` leaves on ``device``: ``label|catalogue|dtype|seed`` for each one
    (catalogue ``rounding`` for a traced cell, ``rounding-black-box`` for a black box), ``;``-joined. Unlike
    ``round_groups``, a cell already run at a seed is not run again for its siblings' sake."""
    catalogue = {"traced": "rounding", "black box": "rounding-black-box"}
    return ";".join(
        f"{c['engine']}|{catalogue[c['kind']]}|{c['dtype']}|{seed}"
        for c in todo
        if c["device"] == device
        for seed in c["seeds"]
    )


def markdown(cells: list[dict], seeds: int) -> str:
    lines = [
        "| engine | dtype | device | reports | seeds | checks pass / fail / skip | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        if not c["seeds"]:
            lines.append(
                f"| {c['engine']} | {c['dtype']} | {c['device']} | {c['kind']} | - (of {seeds}) | - | not run |"
            )
            continue
        short = "" if len(c["seeds"]) >= seeds else f" (of {seeds})"
        if c["rebuilt"]:
            short += f"; {','.join(map(str, c['rebuilt']))} from printed rows"
        verdict = "all pass" if not c["failed"] and c["fail"] == 0 else "FAILED: " + ", ".join(c["failed"])
        lines.append(
            f"| {c['engine']} | {c['dtype']} | {c['device']} | {c['kind']} | "
            f"{','.join(map(str, c['seeds']))}{short} | {c['pass']} / {c['fail']} / {c['skip']} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="mutation_table.py --json files")
    parser.add_argument("--seeds", type=int, default=5, help="seeds each cell should have")
    parser.add_argument("--json", type=Path, default=None, help="also write the cells here")
    parser.add_argument("--left", action="store_true", help="print the ROUND_GROUPS and ROUND_CELLS for what is left")
    args = parser.parse_args(argv)
    cells = table(load_rows(args.files))
    if not cells:
        print("no engine rows in the files given", file=sys.stderr)
        return 2
    todo = left(cells, args.seeds)
    unrun = [{**c, "seeds": [], "rebuilt": [], "pass": 0, "fail": 0, "skip": 0, "failed": []} for c in todo]
    unrun = [c for c in unrun if (c["engine"], c["dtype"], c["device"], c["kind"]) not in {_key(x) for x in cells}]
    print(markdown(cells + unrun, args.seeds))
    full = sum(len(c["seeds"]) >= args.seeds for c in cells)
    grid = f"{len(ROUNDING_ENGINES)} engines x {len(DTYPES)} dtypes x {len(DEVICES)} devices x {len(KINDS)} reports"
    print(
        f"\n{len(cells) + len(unrun)} cells ({grid}), {full} with {args.seeds} seeds or more, {len(unrun)} not run; "
        f"{sum(c['fail'] > 0 for c in cells)} failed"
    )
    runs_left = {d: sum(len(c["seeds"]) for c in todo if c["device"] == d) for d in DEVICES}
    print(f"{sum(runs_left.values())} cell-runs left ({', '.join(f'{d} {n}' for d, n in runs_left.items())})")
    rebuilt = sum(len(c["rebuilt"]) for c in cells)
    if rebuilt:
        print(f"{rebuilt} cell-runs rebuilt from the rows their job printed (files marked rebuilt_from)")
    if args.left:
        for device in DEVICES:
            for dtypes in (("bfloat16", "float16"), ("float32",)):
                groups = round_groups(todo, device, dtypes)
                if groups:
                    print(f'{device}: ROUND_DEVICE={device} ROUND_DTYPES="{" ".join(dtypes)}" ROUND_GROUPS="{groups}"')
            cells_left = round_cells(todo, device)
            if cells_left:
                print(f'{device}: ROUND_DEVICE={device} ROUND_CELLS="{cells_left}"')
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1) + "\n")
    return 1 if any(c["fail"] or c["failed"] for c in cells) else 0


def _key(cell: dict) -> tuple:
    return cell["engine"], cell["dtype"], cell["device"], cell["kind"]


if __name__ == "__main__":
    sys.exit(main())
