"""scripts/rounding_table.py: the issue-28 catalogue table from mutation_table.py's JSON rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rounding_table.py"
spec = importlib.util.spec_from_file_location("rounding_table", SCRIPT)
rounding_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rounding_table)


def _row(engine: str, seed: int, failed=(), dtype="bfloat16") -> dict:
    return {
        "engine": engine,
        "dtype": dtype,
        "device": "cpu",
        "failed": list(failed),
        "counts": {"pass": 18 - len(failed), "fail": len(failed), "skip": 0},
        "run_seed": seed,
    }


def test_a_failed_correct_engine_fails_the_table_and_is_named(tmp_path, capsys):
    engine = "KV cache in float32"
    rows = [_row(engine, s) for s in (1, 2, 3, 4, 5)] + [_row(f"{engine} (black box)", 1)]
    rows += [_row("first-rows-kv (bug 3)", 1, failed=["lossless/ddtree-B16"])]  # a mutant: not this catalogue
    good = tmp_path / "good.json"
    good.write_text(json.dumps(rows))
    assert rounding_table.main([str(good)]) == 0
    out = capsys.readouterr().out
    cell = next(c for c in rounding_table.table(rows) if c["kind"] == "traced")
    assert (cell["engine"], cell["seeds"], cell["pass"], cell["fail"]) == (engine, [1, 2, 3, 4, 5], 90, 0)
    assert "| 1,2,3,4,5 | 90 / 0 / 0 | all pass |" in out
    assert "| black box | 1 (of 5) |" in out and "first-rows-kv" not in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([_row(engine, 2, failed=["acceptance/ddtree-B16"])]))
    assert rounding_table.main([str(good), str(bad)]) == 1  # seed 2 measured again: the later row wins
    assert "FAILED: acceptance/ddtree-B16" in capsys.readouterr().out


def test_files_that_hold_no_rows_are_named_not_a_traceback(tmp_path, capsys):
    broken = tmp_path / "manifest.json"
    broken.write_text('{"not": "rows"}')
    assert rounding_table.main([str(broken)]) == 2
    assert f"{broken}: not a list of engine rows" in capsys.readouterr().err


def test_an_only_that_matches_no_engine_is_refused_not_run_as_nothing(capsys):
    """A run with ``--only matmul-softmax`` (a class's name, not its label) once ran no engine and exited 0 on
    the GPU: the table then had no row for it, and nothing said why."""
    path = SCRIPT.with_name("mutation_table.py")
    spec_ = importlib.util.spec_from_file_location("mutation_table", path)
    mutation_table = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mutation_table)
    import pytest

    with pytest.raises(SystemExit) as stop:
        mutation_table.main(["--catalogue", "rounding", "--only", "matmul-softmax", "--limit", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--only matmul-softmax" in err and "attention by matmul and a float32 softmax" in err


def test_rows_rebuilt_from_printed_output_are_named_in_the_table(tmp_path, capsys):
    """A row whose file did not come back and was rebuilt from the job's printed rows counts, and says so."""
    rows = [_row("KV cache in float32", 1), {**_row("KV cache in float32", 3), "rebuilt_from": "printed-rows.txt"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    assert rounding_table.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 1,3 (of 5); 3 from printed rows |" in out
    assert "1 cell-runs rebuilt from the rows their job printed" in out


def test_the_table_covers_the_whole_grid_and_names_what_is_left(tmp_path, capsys):
    """Cells never run are rows too ("not run"), counted; the cell-runs left are counted per device; and
    ``--left`` prints, per device and dtypes, the ``ROUND_GROUPS`` that would run them (one group per engine and
    lacking seed). A table that lists only what ran once read "100 cells ... 0 failed" with 8 cells never run."""
    engines = list(rounding_table.ROUNDING_ENGINES)
    rows = [_row(engines[0], s) for s in (1, 2, 4)]  # cpu, bf16, traced: seeds 3 and 5 lacking
    rows += [_row(engines[0] + suffix, s, dtype="float32") for s in range(1, 6) for suffix in ("", " (black box)")]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    assert rounding_table.main([str(path), "--left"]) == 0
    out = capsys.readouterr().out
    grid = len(engines) * 3 * 2 * 2
    assert f"{grid} cells ({len(engines)} engines x 3 dtypes x 2 devices x 2 reports), 2 with 5 seeds or more, " in out
    assert f"{grid - 3} not run; 0 failed" in out
    assert f"{(grid - 3) * 5 + 2} cell-runs left (cpu {(grid // 2 - 3) * 5 + 2}, cuda {grid // 2 * 5})" in out
    assert f"| {engines[1]} | float16 | cuda | black box | - (of 5) | - | not run |" in out
    assert "| 1,2,4 (of 5) |" in out
    todo = rounding_table.left(rounding_table.table(rows), 5)
    mine = [c for c in todo if c["engine"] == engines[0] and c["device"] == "cpu"]
    assert next(c for c in mine if (c["dtype"], c["kind"]) == ("bfloat16", "traced"))["seeds"] == [3, 5]
    assert not [c for c in mine if c["dtype"] == "float32"]  # five seeds each: nothing left
    assert rounding_table.round_groups(mine, "cpu", ("float32",)) == ""
    assert rounding_table.round_groups(mine, "cpu", ("bfloat16", "float16")) == ";".join(
        f"{engines[0]}|{s}"
        for s in (1, 2, 3, 4, 5)  # fp16 and the black box still lack every seed
    )
    assert rounding_table.round_groups(mine, "cuda", ("bfloat16", "float16")) == ""
    line = next(line for line in out.splitlines() if line.startswith('cpu: ROUND_DEVICE=cpu ROUND_DTYPES="float32"'))
    assert line.count("|") == (len(engines) - 1) * 5 and f"{engines[0]}|" not in line
    # ROUND_CELLS: exactly the cell-runs left, each once; the bf16 traced cell runs seeds 3 and 5 only
    cells = rounding_table.round_cells(mine, "cpu").split(";")
    assert len(cells) == sum(len(c["seeds"]) for c in mine) == 2 + 5 + 5 + 5
    assert f"{engines[0]}|rounding|bfloat16|3" in cells and f"{engines[0]}|rounding|bfloat16|1" not in cells
    assert f"{engines[0]}|rounding-black-box|float16|1" in cells and len(set(cells)) == len(cells)
    assert rounding_table.round_cells(mine, "cuda") == ""
