"""The gate: tau/per-position/speedup verdicts against stored baselines, and the exit codes."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from ddtree_conformance.baselines import (BaselineError, entries_from_report, load_baselines, merge_entries,
                                   write_baselines)
from ddtree_conformance.cli import app
from ddtree_conformance.gate import EXIT_INCONCLUSIVE, EXIT_MISSING, EXIT_PASS, EXIT_REGRESSION, evaluate, exit_code

HW = "test-hw"


def make_report(tau=4.0, speedup=(2.0, 1.9, 2.1), positions=(0.9, 0.7, 0.5)) -> dict:
    median, low, high = speedup
    return {
        "schema": "ddtree-conformance/run-report", "schema_version": 1, "kind": "bench",
        "created": "2026-01-01T00:00:00+00:00", "hardware_class": HW, "environment": {},
        "settings": {"engine": "reference", "pair_name": "fixture", "dtype": "float32", "device": "cpu",
                     "prompt_set": "fixture", "limit": 2, "max_new_tokens": 8},
        "bench": {"repeats": 5},
        "runs": [
            {"mode": "plain", "budget": None, "label": "plain", "tau": 1.0, "per_position": [], "histogram": {}},
            {"mode": "ddtree", "budget": 16, "label": "ddtree-B16", "tau": tau, "per_position": list(positions),
             "histogram": {"1": 2, "4": 5},
             "speedup": {"median": median, "ci_low": low, "ci_high": high, "confidence": 0.95, "resamples": 2000,
                         "samples": [median] * 5, "cv": 0.02}},
        ],
    }


@pytest.fixture
def stored(tmp_path):
    """Baselines written from the reference report: tau 4.0 (band 5 %), speedup 2.0 (band 0.2)."""
    path = tmp_path / "baselines" / f"{HW}.json"
    write_baselines(path, merge_entries(None, entries_from_report(make_report())))
    return path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def gate_cli(tmp_path, report: dict, baselines):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return invoke("gate", path, "--baselines", baselines)


def statuses(rows, metric):
    return [r.status for r in rows if r.metric == metric]


def test_ten_percent_tau_drop_fails(stored, tmp_path):
    rows = evaluate(make_report(tau=3.6), load_baselines(stored), HW)
    assert statuses(rows, "tau") == ["fail"]
    assert exit_code(rows) == EXIT_REGRESSION
    result = gate_cli(tmp_path, make_report(tau=3.6), stored.parent)
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.output and "fail" in result.output


def test_within_band_passes(stored, tmp_path):
    report = make_report(tau=3.9, speedup=(1.95, 1.85, 2.05), positions=(0.88, 0.68, 0.47))
    rows = evaluate(report, load_baselines(stored), HW)
    assert {r.status for r in rows} == {"pass"}, rows
    result = gate_cli(tmp_path, report, stored)
    assert result.exit_code == EXIT_PASS, result.output
    assert "PASS" in result.output


def test_per_position_below_floor_fails(stored):
    rows = evaluate(make_report(positions=(0.9, 0.6, 0.5)), load_baselines(stored), HW)
    assert statuses(rows, "per-position") == ["fail"]
    assert exit_code(rows) == EXIT_REGRESSION


def test_speedup_ci_straddling_band_is_inconclusive(stored, tmp_path):
    # band lower edge 1.8: the CI [1.6, 1.95] straddles it; the median alone would pass
    report = make_report(speedup=(1.85, 1.6, 1.95))
    rows = evaluate(report, load_baselines(stored), HW)
    assert statuses(rows, "speedup") == ["inconclusive"]
    assert exit_code(rows) == EXIT_INCONCLUSIVE
    result = gate_cli(tmp_path, report, stored)
    assert result.exit_code == 3, result.output
    assert "INCONCLUSIVE" in result.output


def test_speedup_ci_entirely_below_fails(stored):
    rows = evaluate(make_report(speedup=(1.5, 1.4, 1.7)), load_baselines(stored), HW)
    assert statuses(rows, "speedup") == ["fail"]


def test_missing_baseline_is_its_own_status(stored, tmp_path):
    other = make_report()
    other["runs"][1]["budget"] = 64
    rows = evaluate(other, load_baselines(stored), HW)
    assert [r.status for r in rows] == ["missing"]
    assert exit_code(rows) == EXIT_MISSING
    assert gate_cli(tmp_path, other, stored).exit_code == 4
    # no baseline file at all for this hardware class: missing, never a pass
    result = invoke("gate", tmp_path / "report.json", "--baselines", tmp_path / "nowhere", "--hardware-class", "x")
    assert result.exit_code == 4, result.output


def test_fail_outranks_inconclusive(stored):
    rows = evaluate(make_report(tau=3.0, speedup=(1.85, 1.6, 1.95)), load_baselines(stored), HW)
    assert exit_code(rows) == EXIT_REGRESSION


def test_baseline_refuses_without_update_and_shows_diff(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(make_report()))
    first = invoke("baseline", report, "--baselines", tmp_path / "bl")
    assert first.exit_code == 0, first.output
    written = tmp_path / "bl" / f"{HW}.json"
    assert written.stat().st_mode & 0o777 == 0o644
    assert invoke("baseline", report, "--baselines", tmp_path / "bl").exit_code == 0  # unchanged: fine
    changed = copy.deepcopy(make_report(tau=4.4))
    report.write_text(json.dumps(changed))
    before = written.read_text()
    refused = invoke("baseline", report, "--baselines", tmp_path / "bl")
    assert refused.exit_code == 2
    assert "--update" in refused.stderr and '+        "value": 4.4' in refused.stdout
    assert written.read_text() == before
    updated = invoke("baseline", report, "--baselines", tmp_path / "bl", "--update")
    assert updated.exit_code == 0 and '-        "value": 4.0' in updated.stdout
    assert load_baselines(written).entries[0].tau.value == 4.4


def test_bad_baseline_file_names_file_and_field(tmp_path, stored):
    data = json.loads(stored.read_text())
    data["entries"][0]["tau"]["band"] = "wide"
    stored.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=r"test-hw\.json: field 'entries\.0\.tau\.band'"):
        load_baselines(stored)
    result = gate_cli(tmp_path, make_report(), stored)
    assert result.exit_code == 2 and "entries.0.tau.band" in result.stderr
