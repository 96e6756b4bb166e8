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
twice). Exits 1 when any row failed a check (a correct engine must pass everywhere, a row left out below too),
or when a seed skipped more checks than the rows of its kind (traced or black box) skip at the fewest: skipped is
not passed, and the verdict column says how many checks each run skipped. 0 otherwise.

A row counts only at the issue's scale: at least ``--min-prompts`` (20) prompts and ``--min-new-tokens`` (64)
new tokens, budgets 16 and 64, and every check the noise model governs (``GOVERNED``). Its scale is the one
``mutation_table.py`` recorded in it (``scale``), else the ``scale.json`` of its folder or the nearest folder
above (``limit``, ``max_new_tokens``, ``budgets``, ``checks``, and ``source``: where those figures are
written down), for rows measured before rows recorded it. A row below that scale, or of no known scale, is
left out and named with its reason: a 6-prompt run once stood in the table as a seed of a 20-prompt cell.
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddtree_conformance.testing.rounding_engines import ROUNDING_ENGINES

BLACK_BOX = " (black box)"
#: the checks the noise model governs: a row counts when it ran every one (``--check`` substrings, or all)
GOVERNED = ("lossless", "acceptance", "context-range", "near-ties", "golden", "tree-structure", "branch-vs-chain")
RENAMED = {"long-context": "context-range"}  # the check's name before issue 32 (rows of 2026-12-02)
BUDGETS = (16, 64)
SCALE_FILE = "scale.json"
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
KINDS = ("traced", "black box")


class InputError(ValueError):
    """A row or a ``scale.json`` the table cannot read: one message naming the file (and the row) and the field."""


def folder_scale(path: Path, cache: dict[Path, dict | None]) -> dict | None:
    """The ``scale.json`` of ``path``'s folder or the nearest folder above it, checked; None where there is none."""
    for folder in path.resolve().parents:
        if folder not in cache:
            file = folder / SCALE_FILE
            cache[folder] = _read_scale(file) if file.is_file() else None
        if cache[folder] is not None:
            return cache[folder]
    return None


class Scale(BaseModel):
    """What a row was measured at, as ``mutation_table.py`` writes it into the row (``scale``)."""

    model_config = ConfigDict(strict=True)

    limit: int = Field(gt=0)
    max_new_tokens: int = Field(gt=0)
    budgets: list[int] = Field(min_length=1)
    checks: list[str] | None  # None: every check of the plan


class ScaleFile(Scale):
    """A folder's ``scale.json``, for rows measured before rows recorded their scale: also where it is written."""

    source: str = Field(pattern=r"\S")


def _read_scale(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"{file}: not readable as JSON ({exc})") from None
    return _checked(data, str(file), ScaleFile)


class Row(BaseModel):
    """One engine row of ``mutation_table.py --json``, as far as the table reads it (other fields pass through).
    Its annotations are evaluated as written (no postponed annotations in this script), so that the model is
    complete when the script is loaded from its path, as the tests load it."""

    model_config = ConfigDict(extra="allow")

    engine: str
    dtype: Literal[DTYPES]
    device: Literal[DEVICES]
    counts: dict[Literal["pass", "fail", "skip"], int]
    failed: list[str] = []
    skipped: list[str] = []  # recorded from 2026-12-07 on
    run_seed: int | None = None


def _checked(data: object, where: str, model: type[BaseModel] = Scale) -> dict:
    """``data`` checked as ``model``; a :class:`InputError` naming ``where`` and the first bad field."""
    if not isinstance(data, dict):
        fields = ", ".join(model.model_fields)
        raise InputError(f"{where}: must be an object with {fields}")
    try:
        return model.model_validate(data).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"]))
        raise InputError(f"{where}: field {field!r}: {first['msg']} (got {first.get('input')!r})") from None


def below_scale(scale: dict | None, min_prompts: int, min_new_tokens: int) -> str | None:
    """Why a row of ``scale`` does not count (None: it does)."""
    if scale is None:
        return f"no scale recorded (neither in the row nor in a {SCALE_FILE} above it)"
    if scale["limit"] < min_prompts:
        return f"{scale['limit']} prompts, under {min_prompts}"
    if scale["max_new_tokens"] < min_new_tokens:
        return f"{scale['max_new_tokens']} new tokens, under {min_new_tokens}"
    missing = [b for b in BUDGETS if b not in scale["budgets"]]
    if missing:
        return f"budgets {scale['budgets']}, without {missing}"
    if scale["checks"] is not None:
        ran = [RENAMED.get(c, c) for c in scale["checks"]]
        skipped = [g for g in GOVERNED if not any(c in g for c in ran)]
        if skipped:
            return "checks " + " ".join(scale["checks"]) + ", without " + ", ".join(skipped)
    return None


def at_scale(rows: list[dict], min_prompts: int = 20, min_new_tokens: int = 64) -> tuple[list[dict], list[dict]]:
    """``rows`` split into those at the issue's scale and those left out, each of the latter with its ``reason``.
    A counted row that ran a governed check under its earlier name says so (``earlier_checks``): the table names
    those seeds, as it names rows rebuilt from printed output."""
    counted, left_out, cache = [], [], {}
    for row in rows:
        scale = row.get("scale")
        if scale is not None:
            scale = _checked(scale, f"{row.get('_file', 'a row')}: {row['engine']}, seed {row.get('run_seed')}: scale")
        elif row.get("_file"):
            scale = folder_scale(Path(row["_file"]), cache)
        reason = below_scale(scale, min_prompts, min_new_tokens)
        if reason is None:
            earlier = sorted({c for c in scale["checks"] or () if c in RENAMED})
            counted.append({**row, "earlier_checks": earlier} if earlier else row)
        else:
            left_out.append({**row, "reason": reason})
    return counted, left_out


def load_rows(paths: list[Path]) -> list[dict]:
    """The engine rows of ``mutation_table.py --json`` files, each with its file (``_file``); a file that is not
    such a list is named and skipped. A file given twice (``*.json`` and a recursive ``**/*.json``, as zsh or
    bash's globstar expand it) is read once."""
    rows = []
    for path in _once(paths):
        if path.name == SCALE_FILE:
            continue  # a folder's scale (folder_scale), not rows: a glob over the folders takes it in
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"{path}: not readable as JSON ({exc}); skipped", file=sys.stderr)
            continue
        if not isinstance(data, list) or not all(isinstance(r, dict) and "engine" in r for r in data):
            print(f"{path}: not a list of engine rows; skipped", file=sys.stderr)
            continue
        rows += [{**r, "_file": str(path)} for r in data]
    return rows


def _once(paths: list[Path]) -> list[Path]:
    """``paths`` in order, each file once (by its resolved path)."""
    seen: set[Path] = set()
    once = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            once.append(path)
    return once


def catalogue_rows(rows: list[dict]) -> list[dict]:
    """The rows of the rounding catalogue (traced or black box), each checked (:class:`Row`: a dtype or device
    the grid does not have, or counts that are not numbers, is one error naming the file, the engine and the
    field); other catalogues' rows in the same folders go."""
    ours = [r for r in rows if r["engine"].removesuffix(BLACK_BOX) in ROUNDING_ENGINES]
    for r in ours:
        _checked(r, f"{r.get('_file', 'a row')}: {r['engine']}, seed {r.get('run_seed')}", Row)
    return ours


def table(rows: list[dict]) -> list[dict]:
    """The rounding catalogue's rows grouped per (engine, dtype, device, kind), counts summed over seeds (a
    seed measured twice counts once: the later row wins, and a failed row it replaces is named in
    ``superseded``); rows of other catalogues are left out."""
    cells: dict[tuple, dict[int, dict]] = defaultdict(dict)
    superseded: dict[tuple, list[dict]] = defaultdict(list)  # failed rows a later row of their seed replaced
    for r in rows:
        if r["engine"].removesuffix(BLACK_BOX) not in ROUNDING_ENGINES:
            continue  # another catalogue's row (mutants, adversaries) in the same folder
        kind = "black box" if r["engine"].endswith(BLACK_BOX) else "traced"
        key = (r["engine"].removesuffix(BLACK_BOX), r["dtype"], r["device"], kind)
        seed = int(r.get("run_seed") or 0)
        earlier = cells[key].get(seed)
        if earlier is not None and (earlier["counts"].get("fail") or earlier.get("failed")):
            superseded[key].append(earlier)
        cells[key][seed] = r
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
                # seeds run with a governed check under its earlier name (long-context): named
                "earlier": sorted(seed for seed, r in by_seed.items() if r.get("earlier_checks")),
                **counts,
                "failed": failed,
                # checks skipped, per seed: skipped is not passed, so every seed of a kind must skip as few as
                # the rest (:func:`extra_skips`); names where the row recorded them (rows from 2026-12-07 on)
                "skips": {seed: r["counts"].get("skip", 0) for seed, r in sorted(by_seed.items())},
                "skipped": sorted({c for r in by_seed.values() for c in r.get("skipped") or []}),
                # failed rows of these seeds that a later row replaced: named, never silently dropped
                "superseded": [
                    f"seed {r.get('run_seed')}: {', '.join(r.get('failed') or [])} ({r.get('_file', '?')})"
                    for r in superseded[(engine, dtype, device, kind)]
                ],
            }
        )
    order = {d: i for i, d in enumerate(DTYPES)}
    return sorted(out, key=lambda r: (r["device"], order.get(r["dtype"], 9), r["kind"], r["engine"]))


def extra_skips(cells: list[dict]) -> list[str]:
    """Seeds that skipped more checks than the fewest any counted row of their kind skipped (traced rows skip
    none; black boxes skip the trace-only families, the same number at every seed): such a seed did not run a
    check the others ran, so its "pass" is not one. Each named with its cell and both counts."""
    fewest: dict[str, int] = {}
    for c in cells:
        for n in c["skips"].values():
            fewest[c["kind"]] = min(n, fewest.get(c["kind"], n))
    return [
        f"{c['engine']} {c['dtype']} {c['device']} {c['kind']} seed {seed}: {n} checks skipped, where rows of its "
        f"kind skip as few as {fewest[c['kind']]}"
        for c in cells
        for seed, n in c["skips"].items()
        if n > fewest[c["kind"]]
    ]


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
        if c.get("earlier"):
            short += f"; {','.join(map(str, c['earlier']))} with long-context (context-range's predecessor)"
        verdict = "all pass" if not c["failed"] and c["fail"] == 0 else "FAILED: " + ", ".join(c["failed"])
        if c["skip"]:  # skipped is not passed: said beside the verdict, with the names where rows recorded them
            per_run = sorted(set(c["skips"].values()))
            verdict += f"; {'-'.join(map(str, per_run))} skipped a run" + (
                f" ({', '.join(c['skipped'])})" if c["skipped"] else ""
            )
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
    parser.add_argument("--min-prompts", type=int, default=20, help="a row counts from this many prompts")
    parser.add_argument("--min-new-tokens", type=int, default=64, help="a row counts from this many new tokens")
    args = parser.parse_args(argv)
    try:
        rows, left_out = at_scale(catalogue_rows(load_rows(args.files)), args.min_prompts, args.min_new_tokens)
    except InputError as exc:
        print(exc, file=sys.stderr)
        return 2
    for reason, files in _by_reason(left_out).items():
        print(f"left out, {reason}: {len(files)} rows ({', '.join(sorted(set(files)))})", file=sys.stderr)
    cells = table(rows)
    if not cells:
        print("no engine rows of the rounding catalogue at the issue's scale in the files given", file=sys.stderr)
        return 2
    todo = left(cells, args.seeds)
    empty = {"seeds": [], "rebuilt": [], "earlier": [], "pass": 0, "fail": 0, "skip": 0, "failed": [], "skips": {}}
    unrun = [{**c, **empty} for c in todo]
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
    for c in cells:
        for row in c["superseded"]:
            print(
                f"failed, then measured again (the later row counts): {c['engine']} {c['dtype']} {c['device']} "
                f"{c['kind']} {row}"
            )
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
    if left_out:
        print(f"{len(left_out)} rows left out: under the issue's scale or of no known scale (stderr names them)")
    # a row left out of the table still fails it: a correct engine must pass at any scale
    failed_out = [r for r in left_out if r["counts"].get("fail") or r.get("failed")]
    for r in failed_out:
        print(
            f"FAILED, though left out ({r['reason']}): {r['engine']} {r['dtype']} {r['device']} seed "
            f"{r.get('run_seed')}: {', '.join(r.get('failed') or [])} ({r.get('_file')})"
        )
    skipped_more = extra_skips(cells)
    for line in skipped_more:
        print(f"SKIPPED MORE: {line}")
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1) + "\n")
    return 1 if failed_out or skipped_more or any(c["fail"] or c["failed"] for c in cells) else 0


def _by_reason(left_out: list[dict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for row in left_out:
        out[row["reason"]].append(row.get("_file", "?"))
    return out


def _key(cell: dict) -> tuple:
    return cell["engine"], cell["dtype"], cell["device"], cell["kind"]


if __name__ == "__main__":
    sys.exit(main())
