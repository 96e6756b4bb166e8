"""The GPU trial scripts run end to end on CPU with a tiny shape, so their first GPU run is not their first run.

Only structure is checked (files written, one row per engine and budget): their numbers are for the
GPU, where the lead runs them (docs/reference/bench-and-gates.md gives the commands).
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def script(name: str):
    return runpy.run_path(str(SCRIPTS / name), run_name="script_under_test")["main"]


@pytest.mark.slow
def test_gate_decisiveness_writes_its_table(tmp_path):
    main = script("gate_decisiveness.py")
    out = tmp_path / "decisive"
    assert (
        main(
            [
                "--pair",
                "tiny",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--trials",
                "1",
                "--engines",
                "correct,build+2ms",
                "--prompts",
                "1",
                "--prompt-len",
                "8",
                "--new-tokens",
                "6",
                "--budget",
                "4",
                "--baseline-repeats",
                "3",
                "--max-repeats",
                "4",
                "--simulate",
                "50",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = json.loads((out / "table.json").read_text())
    assert [r["engine"] for r in table["rows"]] == ["correct", "build+2ms"]
    assert all(r["trials"] == 1 and r["simulated_share_correct"] is not None for r in table["rows"])
    assert len((out / "trials.jsonl").read_text().splitlines()) == 2
    assert "| build+2ms | fail | 1 |" in (out / "table.md").read_text()


@pytest.mark.slow
def test_round_time_table_writes_its_rows(tmp_path):
    main = script("bench_reference_stages.py")
    out = tmp_path / "rounds"
    assert (
        main(
            [
                "--shape",
                "tiny",
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--budgets",
                "4",
                "16",
                "--prompt-len",
                "8",
                "--new-tokens",
                "5",
                "--repeats",
                "1",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads((out / "rounds.json").read_text())["rows"]
    assert [(r["budget"], r["path"]) for r in rows] == [(4, "eager"), (4, "fast"), (16, "eager"), (16, "fast")]
    assert all(r["plain_step_ms"] > 0 and r["round_ms"] > 0 and "verify" in r["stages_ms"] for r in rows)
    assert "| 16 | fast |" in (out / "rounds.md").read_text()


@pytest.mark.slow
def test_fast_path_equality_writes_its_table(tmp_path):
    main = script("fast_path_equality.py")
    out = tmp_path / "equality"
    assert (
        main(["--device", "cpu", "--runs", "tiny:float32", "--budgets", "4", "--new-tokens", "5", "--out", str(out)])
        == 0
    )
    rows = json.loads((out / "equality.json").read_text())["rows"]
    assert [r["mode"] for r in rows] == ["plain", "dflash", "ddtree"]
    assert all(r["outputs_equal"] == r["requests"] == r["acceptance_equal"] for r in rows)
