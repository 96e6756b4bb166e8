"""The gate: tau/per-position/speedup verdicts against stored baselines, and the exit codes."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ddtree_conformance.baselines import (
    BaselineError,
    entries_from_report,
    load_baselines,
    merge_entries,
    write_baselines,
)
from ddtree_conformance.cli import app
from ddtree_conformance.gate import (
    EXIT_INCONCLUSIVE,
    EXIT_MISSING,
    EXIT_PASS,
    EXIT_REGRESSION,
    EXIT_SETTINGS_CHANGED,
    evaluate,
    exit_code,
    speedup_interval,
)

HW = "test-hw"


BASE_RATIOS = (0.495, 0.5, 0.505, 0.4975, 0.5025)  # step/round per repeat: speedup 2.0 at tau 4


def make_report(
    tau=4.0, ratios=BASE_RATIOS, positions=(0.9, 0.7, 0.5), sequential=False, min_repeats=3, stored_ci=None
) -> dict:
    """A bench report whose per-repeat speedups are ``tau x ratios`` (the cost model)."""
    samples = [tau * r for r in ratios]
    low, high = stored_ci or (min(samples), max(samples))
    return {
        "schema": "ddtree-conformance/run-report",
        "schema_version": 1,
        "kind": "bench",
        "created": "2026-01-01T00:00:00+00:00",
        "hardware_class": HW,
        "environment": {},
        "settings": {
            "engine": "reference",
            "pair_name": "fixture",
            "dtype": "float32",
            "device": "cpu",
            "prompt_set": "fixture",
            "limit": 2,
            "max_new_tokens": 8,
        },
        "bench": {"repeats": len(samples), "clock": "device"},
        "runs": [
            {"mode": "plain", "budget": None, "label": "plain", "tau": 1.0, "per_position": [], "histogram": {}},
            {
                "mode": "ddtree",
                "budget": 16,
                "label": "ddtree-B16",
                "tau": tau,
                "per_position": list(positions),
                "histogram": {"1": 2, "4": 5},
                "cost_model": {
                    "tau": tau,
                    "step_s": 0.010,
                    "round_s": 0.020,
                    "step_over_round": {"estimate": float(np.exp(np.mean(np.log(ratios)))), "samples": list(ratios)},
                },
                "speedup": {
                    "estimate": float(np.exp(np.mean(np.log(samples)))),
                    "median": float(np.median(samples)),
                    "ci_low": low,
                    "ci_high": high,
                    "confidence": 0.95,
                    "samples": samples,
                    "cv": 0.01,
                    "alpha": 0.05,
                    "sequential": sequential,
                    "min_repeats": min_repeats,
                    "max_repeats": 60,
                    "growth": 1.5,
                    "stop": {"decision": "fixed", "reason": f"{len(samples)} fixed repeats", "repeats": len(samples)},
                },
            },
        ],
    }


@pytest.fixture
def stored(tmp_path):
    """Baselines written from the reference report: tau 4.0 (band 5 %), speedup 2.0 (band 2 %: edge 1.96),
    step/round 0.5."""
    path = tmp_path / "baselines" / f"{HW}.json"
    write_baselines(path, merge_entries(None, entries_from_report(make_report())))
    return path


@pytest.fixture
def spread_stored(tmp_path):
    """Baselines of four runs (speedups 2.0 x 1.003, 0.997, 1.0015, 1: between-run spread 0.26 %), so the
    gate may fail a speedup beyond that spread; the value 2.0, band 2 % (edge 1.96)."""
    path = tmp_path / "spread" / f"{HW}.json"
    reports = []
    for k, scale in enumerate((1.003, 0.997, 1.0015, 1.0)):  # the last run gives the cost
        report = make_report(ratios=tuple(r * scale for r in BASE_RATIOS))
        report["created"] = f"2026-01-0{k + 1}T00:00:00+00:00"
        reports.append(entries_from_report(report))
    merged = merge_entries(None, reports[0])
    for more in reports[1:]:
        merged = merge_entries(merged, more, merge=True)
    write_baselines(path, merged)
    return path


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def gate_cli(tmp_path, report: dict, baselines):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return invoke("gate", path, "--baselines", baselines)


def statuses(rows, metric):
    return [r.status for r in rows if r.metric == metric]


def speedup_row(rows):
    return next(r for r in rows if r.metric == "speedup")


def test_baseline_entry_from_report(stored):
    entry = load_baselines(stored).entries[0]
    assert entry.speedup.value == pytest.approx(2.0, abs=1e-3)
    assert entry.speedup.lower == pytest.approx(1.96, abs=2e-3)  # 2 % band; the report's own CI is narrower
    assert entry.cost.step_over_round == pytest.approx(0.5, abs=1e-4) and entry.cost.clock == "device"


def test_ten_percent_tau_drop_fails(stored, tmp_path):
    rows = evaluate(make_report(tau=3.6), load_baselines(stored), HW)
    assert statuses(rows, "tau") == ["fail"]
    assert exit_code(rows) == EXIT_REGRESSION
    result = gate_cli(tmp_path, make_report(tau=3.6), stored.parent)
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.output and "fail" in result.output


def test_within_band_passes(stored, tmp_path):
    report = make_report(tau=3.9, ratios=(0.507, 0.51, 0.5085, 0.509, 0.5095), positions=(0.88, 0.68, 0.47))
    rows = evaluate(report, load_baselines(stored), HW)
    assert {r.status for r in rows} == {"pass"}, rows
    result = gate_cli(tmp_path, report, stored)
    assert result.exit_code == EXIT_PASS, result.output
    assert "PASS" in result.output


def test_per_position_below_floor_fails(stored):
    rows = evaluate(make_report(positions=(0.9, 0.6, 0.5)), load_baselines(stored), HW)
    assert statuses(rows, "per-position") == ["fail"]
    assert exit_code(rows) == EXIT_REGRESSION


def test_speedup_interval_straddling_the_edge_is_inconclusive(stored, tmp_path):
    report = make_report(ratios=(0.475, 0.505, 0.4875, 0.4975, 0.4825))  # interval ~[1.90, 2.02], edge 1.96
    rows = evaluate(report, load_baselines(stored), HW)
    assert statuses(rows, "speedup") == ["inconclusive"]
    assert "5 fixed repeats" in speedup_row(rows).message and "bench --baselines" in speedup_row(rows).message
    assert exit_code(rows) == EXIT_INCONCLUSIVE
    result = gate_cli(tmp_path, report, stored)
    assert result.exit_code == 3, result.output
    assert "INCONCLUSIVE" in result.output


def test_speedup_interval_entirely_below_fails(spread_stored, stored):
    rows = evaluate(make_report(ratios=(0.45, 0.4525, 0.4475, 0.45, 0.455)), load_baselines(spread_stored), HW)
    assert statuses(rows, "speedup") == ["fail"]
    # one baseline run: its between-run spread is unknown, so below the band is not a failure
    row = speedup_row(evaluate(make_report(ratios=(0.45, 0.4525, 0.4475, 0.45, 0.455)), load_baselines(stored), HW))
    assert row.status == "inconclusive"
    assert "records 1 run" in row.message and "baseline --merge" in row.message and "bench --against" in row.message


def test_the_interval_comes_from_the_samples_not_the_report(spread_stored, stored):
    """A report whose stored interval claims a pass while its samples say regression fails."""
    report = make_report(ratios=(0.45, 0.4525, 0.4475, 0.45, 0.455), stored_ci=(1.99, 2.05))
    assert statuses(evaluate(report, load_baselines(spread_stored), HW), "speedup") == ["fail"]
    single = make_report(ratios=(0.5,))
    assert statuses(evaluate(single, load_baselines(stored), HW), "speedup") == ["inconclusive"]


def test_a_sequential_run_pays_for_its_looks(stored):
    """Same samples: one look passes; a sequential run (8 planned looks for 3..60 repeats, each at
    alpha / 8) has a wider interval and does not."""
    rng = np.random.default_rng(0)
    ratios = 0.5 * np.exp(rng.normal(0, 0.006, 20))
    edge = load_baselines(stored).entries[0].speedup.lower
    low = speedup_interval(make_report(ratios=tuple(ratios))["runs"][1]["speedup"]).low
    ratios = tuple(ratios * (edge + 0.002) / low)  # one look: the interval starts just above the edge
    fixed = speedup_interval(make_report(ratios=ratios)["runs"][1]["speedup"])
    seq = speedup_interval(make_report(ratios=ratios, sequential=True)["runs"][1]["speedup"])
    assert seq.low < fixed.low and seq.level == pytest.approx(1 - 0.05 / 8)
    unplanned = make_report(ratios=ratios, sequential=True)
    for key in ("max_repeats", "growth"):
        del unplanned["runs"][1]["speedup"][key]
    # no plan recorded: read as a look at every repeat, the most conservative reading
    assert speedup_interval(unplanned["runs"][1]["speedup"]).level == pytest.approx(1 - 0.05 / 20)
    base = load_baselines(stored)
    assert statuses(evaluate(make_report(ratios=ratios), base, HW), "speedup") == ["pass"]
    assert statuses(evaluate(make_report(ratios=ratios, sequential=True), base, HW), "speedup") == ["inconclusive"]


def test_cost_model_view_separates_accepting_less_from_costing_more(spread_stored):
    base = load_baselines(spread_stored)
    less = speedup_row(evaluate(make_report(tau=3.7), base, HW))  # same cost, tau -7.5 %
    assert less.status == "fail" and less.details["accepts_less"] and not less.details["costs_more"]
    assert "accepts less: tau 3.700 vs 4.000" in less.message and "costs the same" in less.message
    dearer = speedup_row(evaluate(make_report(ratios=(0.47, 0.4725, 0.4675, 0.47, 0.4715)), base, HW))
    assert dearer.status == "fail" and dearer.details["costs_more"] and not dearer.details["accepts_less"]
    assert dearer.details["round_cost_change"] == pytest.approx(0.5 / 0.4703 - 1, rel=1e-2)
    assert "costs more: round time in plain steps +6.3 %" in dearer.message


def test_report_of_an_older_suite_uses_its_stored_interval(stored):
    report = make_report()
    sp = report["runs"][1]["speedup"]
    for key in ("samples", "estimate", "sequential", "alpha", "min_repeats", "stop"):
        sp.pop(key)
    sp.update(median=1.95, ci_low=1.6, ci_high=1.99)
    report["runs"][1].pop("cost_model")
    row = speedup_row(evaluate(report, load_baselines(stored), HW))
    assert row.status == "inconclusive" and row.measured == "1.950 [1.600, 1.990]"


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
    rows = evaluate(make_report(tau=3.0, ratios=(0.6, 0.66, 0.63, 0.65, 0.64)), load_baselines(stored), HW)
    assert statuses(rows, "speedup") == ["inconclusive"]
    assert exit_code(rows) == EXIT_REGRESSION


def test_gate_json_carries_the_cost_view(stored, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(make_report(tau=3.7)))
    result = invoke("gate", path, "--baselines", stored, "--out", tmp_path / "gate.json")
    assert result.exit_code == 1, result.output
    rows = json.loads((tmp_path / "gate.json").read_text())["rows"]
    details = next(r for r in rows if r["metric"] == "speedup")["details"]
    assert details["accepts_less"] and details["interval"]["n"] == 5


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


# -- engine settings: recorded with the baseline, a change refused ----------------------------------------
GRAPHS = {
    "cuda_graphs": True,
    "attention_backend": "sdpa",
    "overlap_scheduling": False,
    "dtype": "float32",
    "tensor_parallel_size": 1,
}


def with_settings(report: dict, settings: dict | None) -> dict:
    report = copy.deepcopy(report)
    if settings is not None:
        report["bench"]["engine_settings"] = settings
    return report


@pytest.fixture
def stored_with_settings(tmp_path):
    path = tmp_path / "baselines-settings" / f"{HW}.json"
    write_baselines(path, merge_entries(None, entries_from_report(with_settings(make_report(), GRAPHS))))
    return path


def test_the_baseline_records_the_engine_settings(stored_with_settings):
    assert load_baselines(stored_with_settings).entries[0].settings == GRAPHS


@pytest.mark.parametrize(
    "change, words",
    [
        ({"cuda_graphs": False}, "cuda_graphs False (baseline True)"),
        ({"attention_backend": "triton"}, "attention_backend 'triton' (baseline 'sdpa')"),
        ({"cuda_graphs": "mixed"}, "cuda_graphs changed within the run"),
        ({"cuda_graphs": None}, None),  # dropped below: a setting the report does not give
    ],
)
def test_gate_refuses_a_settings_change_with_exit_6(tmp_path, stored_with_settings, change, words):
    settings = {**GRAPHS, **change}
    if change == {"cuda_graphs": None}:
        del settings["cuda_graphs"]
        words = "cuda_graphs not reported (baseline True)"
    rows = evaluate(with_settings(make_report(), settings), load_baselines(stored_with_settings), HW)
    assert [r.status for r in rows] == ["refused"] and words in rows[0].message
    assert exit_code(rows) == EXIT_SETTINGS_CHANGED == 6
    # even a run that would fail on every metric is refused, not judged
    worse = with_settings(make_report(tau=2.0, ratios=(0.3, 0.31, 0.29, 0.3, 0.3)), settings)
    assert exit_code(evaluate(worse, load_baselines(stored_with_settings), HW)) == 6
    result = gate_cli(tmp_path, with_settings(make_report(), settings), stored_with_settings)
    assert result.exit_code == 6 and "REFUSED" in result.stdout


def test_same_settings_are_judged_and_an_older_baseline_is_judged_with_a_note(stored, stored_with_settings):
    same = evaluate(with_settings(make_report(), GRAPHS), load_baselines(stored_with_settings), HW)
    assert exit_code(same) == EXIT_PASS and "records no engine settings" not in speedup_row(same).message
    old = evaluate(with_settings(make_report(), {**GRAPHS, "cuda_graphs": False}), load_baselines(stored), HW)
    assert exit_code(old) == EXIT_PASS and "records no engine settings" in speedup_row(old).message


def test_the_speedup_row_reports_the_minimum_detectable_effect(stored):
    row = speedup_row(evaluate(make_report(), load_baselines(stored), HW))
    mde = row.details["mde"]
    assert 0.02 < mde < 0.2 and f"MDE {100 * mde:.1f} %" in row.message
