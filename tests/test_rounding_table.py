"""scripts/rounding_table.py: the issue-28 catalogue table from mutation_table.py's JSON rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rounding_table.py"
spec = importlib.util.spec_from_file_location("rounding_table", SCRIPT)
rounding_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rounding_table)


AT_SCALE = {"limit": 20, "max_new_tokens": 64, "budgets": [16, 64], "checks": list(rounding_table.GOVERNED)}


def _row(engine: str, seed: int, failed=(), dtype="bfloat16", scale=AT_SCALE) -> dict:
    row = {
        "engine": engine,
        "dtype": dtype,
        "device": "cpu",
        "failed": list(failed),
        "counts": {"pass": 18 - len(failed), "fail": len(failed), "skip": 0},
        "run_seed": seed,
    }
    return {**row, "scale": scale} if scale is not None else row


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
    # the other way round the later, passing row counts, and the failure it replaced is named, not dropped
    assert rounding_table.main([str(bad), str(good)]) == 0
    out = capsys.readouterr().out
    assert "| 1,2,3,4,5 | 90 / 0 / 0 | all pass |" in out
    assert f"failed, then measured again (the later row counts): {engine} bfloat16 cpu traced seed 2: " in out
    assert f"acceptance/ddtree-B16 ({bad})" in out
    # a file named twice (`*.json` and a recursive `**/*.json` under zsh or globstar) is read once
    assert rounding_table.main([str(bad), str(tmp_path / "." / "bad.json"), str(good), str(good)]) == 0
    assert capsys.readouterr().out.count("failed, then measured again") == 1


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


def test_rows_under_the_issues_scale_or_of_no_known_scale_are_left_out_and_named(tmp_path, capsys):
    """A 6-prompt run once stood in the table as seed 1 of a 20-prompt cell (the later row won), and nothing in
    the rows could tell: now a row counts only at 20 prompts, 64 new tokens, budgets 16 and 64 and every governed
    check, from its own ``scale`` or its folder's ``scale.json``; the rest are named with their reason."""
    engine = "KV cache in float32"
    full = tmp_path / "full.json"
    full.write_text(json.dumps([_row(engine, 1)]))
    small = tmp_path / "small"
    small.mkdir()
    (small / "rows.json").write_text(json.dumps([{**_row(engine, 1, failed=["acceptance/ddtree-B16"], scale=None)}]))
    (small / "scale.json").write_text(
        json.dumps({"limit": 6, "max_new_tokens": 48, "budgets": [16], "checks": ["lossless"], "source": "a note"})
    )
    bare = tmp_path / "bare" / "deeper"
    bare.mkdir(parents=True)
    (bare / "rows.json").write_text(json.dumps([_row(engine, 2, scale=None)]))
    few_checks = tmp_path / "few.json"
    few_checks.write_text(json.dumps([_row(engine, 3, scale={**AT_SCALE, "checks": ["lossless", "acceptance"]})]))
    short = tmp_path / "short.json"
    short.write_text(json.dumps([_row(engine, 4, scale={**AT_SCALE, "max_new_tokens": 32})]))
    one_budget = tmp_path / "one-budget.json"
    one_budget.write_text(json.dumps([_row(engine, 5, scale={**AT_SCALE, "budgets": [16]})]))
    files = [full, small / "rows.json", bare / "rows.json", few_checks, short, one_budget]
    assert rounding_table.main([str(f) for f in files]) == 1  # the 6-prompt row does not count, but it failed
    captured = capsys.readouterr()
    failed = "FAILED, though left out (6 prompts, under 20): KV cache in float32 bfloat16 cpu seed 1: acceptance/"
    assert failed in captured.out
    passing = [f for f in files if f != small / "rows.json"]  # rows left out that passed fail nothing
    assert rounding_table.main([str(f) for f in passing]) == 0 and "FAILED" not in capsys.readouterr().out
    assert "| KV cache in float32 | bfloat16 | cpu | traced | 1 (of 5) | 18 / 0 / 0 | all pass |" in captured.out
    assert "5 rows left out" in captured.out
    err = captured.err
    assert f"left out, 6 prompts, under 20: 1 rows ({small / 'rows.json'})" in err
    assert "left out, no scale recorded (neither in the row nor in a scale.json above it): 1 rows" in err
    skipped = "context-range, near-ties, golden, tree-structure, branch-vs-chain"
    assert f"checks lossless acceptance, without {skipped}" in err
    assert "left out, 32 new tokens, under 64" in err and "without [64]" in err
    # the folder above gives the scale: the bare rows count once it says 20 prompts
    (tmp_path / "bare" / "scale.json").write_text(json.dumps({**AT_SCALE, "source": "README.md here"}))
    globbed = [tmp_path / "bare" / "scale.json", small / "scale.json"]  # a glob over the folders takes them in
    assert rounding_table.main([str(f) for f in files + globbed]) == 1
    captured = capsys.readouterr()
    assert "| 1,2 (of 5) | 36 / 0 / 0 |" in captured.out and "not a list of engine rows" not in captured.err
    # lower bars are the caller's to set, and say so in what counts
    assert rounding_table.main([str(f) for f in files] + ["--min-prompts", "6", "--min-new-tokens", "32"]) == 1
    assert "| 1,2,4 (of 5) |" in capsys.readouterr().out  # the 6-prompt row still lacks checks and budget 64


def test_a_governed_check_under_its_earlier_name_counts_and_is_named(tmp_path, capsys):
    """Rows of 2026-12-02 ran long-context, which issue 32 replaced with context-range: they count, marked."""
    engine = "KV cache in float32"
    earlier = [c if c != "context-range" else "long-context" for c in rounding_table.GOVERNED]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([_row(engine, 1), _row(engine, 2, scale={**AT_SCALE, "checks": earlier})]))
    assert rounding_table.main([str(path)]) == 0
    assert "| 1,2 (of 5); 2 with long-context (context-range's predecessor) |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, field",
    [
        ("[1, 2]", "must be an object"),
        ('{"limit": 20}', "field 'max_new_tokens'"),
        ('{"limit": "20", "max_new_tokens": 64, "budgets": [16, 64], "checks": null, "source": "x"}', "field 'limit'"),
        ('{"limit": 20, "max_new_tokens": 64, "budgets": [16, 64], "checks": null, "source": " "}', "field 'source'"),
        ("{not json", "not readable as JSON"),
    ],
)
def test_a_malformed_scale_file_is_one_error_naming_it(tmp_path, capsys, content, field):
    (tmp_path / "scale.json").write_text(content)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([_row("KV cache in float32", 1, scale=None)]))
    assert rounding_table.main([str(rows), str(tmp_path / "scale.json")]) == 2  # a glob takes the scale file in too
    err = capsys.readouterr().err
    assert f"{tmp_path / 'scale.json'}: " in err and field in err and "Traceback" not in err


def test_a_malformed_scale_in_a_row_is_one_error_naming_the_file_and_the_engine(tmp_path, capsys):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([_row("KV cache in float32", 3, scale={**AT_SCALE, "limit": "20"})]))
    assert rounding_table.main([str(rows)]) == 2
    err = capsys.readouterr().err
    assert f"{rows}: KV cache in float32, seed 3: scale: field 'limit'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, field",
    [
        ({"dtype": "bf16"}, "field 'dtype'"),  # a dtype the grid lacks would open a cell of its own, unseen
        ({"device": "gpu"}, "field 'device'"),
        ({"counts": {"pass": "many", "fail": 0, "skip": 0}}, "field 'counts.pass'"),
        ({"counts": {"passed": 18}}, "field 'counts.passed"),
        ({"skipped": "tree-structure/ddtree-B16"}, "field 'skipped'"),
    ],
)
def test_a_malformed_row_is_one_error_naming_the_file_the_engine_and_the_field(tmp_path, capsys, change, field):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([_row("KV cache in float32", 2), {**_row("KV cache in float32", 3), **change}]))
    assert rounding_table.main([str(rows)]) == 2
    err = capsys.readouterr().err
    assert f"{rows}: KV cache in float32, seed 3: {field}" in err and "Traceback" not in err


def test_mutation_table_rows_record_their_scale(tmp_path):
    """What makes a row countable: the run's prompts, new tokens, budgets and checks, written into the row."""
    path = SCRIPT.with_name("mutation_table.py")
    spec_ = importlib.util.spec_from_file_location("mutation_table", path)
    mutation_table = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mutation_table)
    out = tmp_path / "rows.json"
    args = ["--catalogue", "rounding-black-box", "--only", "KV cache in float32", "--limit", "1"]
    args += ["--max-new-tokens", "4", "--budgets", "16", "--check", "lossless", "tree-structure"]
    assert mutation_table.main([*args, "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    checks = ["lossless", "tree-structure"]
    assert row["scale"] == {"limit": 1, "max_new_tokens": 4, "budgets": [16], "checks": checks}
    assert rounding_table.below_scale(row["scale"], 20, 64) == "1 prompts, under 20"
    # a black box gives no trees: the tree checks it skipped are named in the row, not only counted
    assert row["skipped"] == ["tree-structure/dflash", "tree-structure/ddtree-B16"]
    assert row["counts"]["skip"] == 2 and row["counts"]["pass"] >= 2


def test_a_seed_that_skipped_more_checks_than_its_kind_fails_the_table(tmp_path, capsys):
    """Skipped is not passed: a traced seed that skipped a check the other traced rows ran is named and fails the
    table; black boxes, which all skip the same trace families, pass with the skips said in the verdict."""
    engine = "KV cache in float32"
    trace_only = ["tree-structure/ddtree-B16", "tree-structure/ddtree-B64"]

    def skipping(label: str, seed: int, names: list[str]) -> dict:
        row = _row(label, seed)
        return {**row, "counts": {**row["counts"], "skip": len(names)}, "skipped": names}

    traced = [skipping(engine, seed, []) for seed in (1, 2)]
    black_box = [skipping(engine + " (black box)", seed, trace_only) for seed in (1, 2)]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(traced + black_box))
    assert rounding_table.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert f"| {engine} | bfloat16 | cpu | traced | 1,2 (of 5) | 36 / 0 / 0 | all pass |" in out
    assert "| all pass; 2 skipped a run (tree-structure/ddtree-B16, tree-structure/ddtree-B64) |" in out
    assert "SKIPPED MORE" not in out
    path.write_text(json.dumps(traced + black_box + [skipping(engine, 3, ["near-ties/all-greedy-runs"])]))
    assert rounding_table.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert (
        f"SKIPPED MORE: {engine} bfloat16 cpu traced seed 3: 1 checks skipped, where rows of its kind skip as "
        "few as 0" in out
    )
    assert "| all pass; 0-1 skipped a run (near-ties/all-greedy-runs) |" in out
