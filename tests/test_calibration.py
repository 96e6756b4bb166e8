"""NoiseModel (conformance/calibration.py): where values come from, the range checks, and the
excused-position ceiling's derivation, tested on simulated engines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ddtree_conformance.calibration import MAX_BOUND, CalibrationError, load_calibration, shift_thresholds
from ddtree_conformance.noise import ALPHA, NoiseModel
from ddtree_conformance.paths import FIXTURE_TARGET


def _pair(tmp_path, section=None, extra_file=None):
    (tmp_path / "target").mkdir()
    if section is not None:
        (tmp_path / "MANIFEST.json").write_text(json.dumps({"near_tie_calibration": section}))
    if extra_file:
        (tmp_path / "calibration.json").write_text(json.dumps(extra_file))
    return tmp_path / "target"


def _entry(shifts, drafter=0.05):
    shifts = np.asarray(shifts)
    return {
        "positions": int(shifts.size),
        "max_shift": float(shifts.max()),
        "shift_tail": [[t, int((shifts >= t).sum())] for t in shift_thresholds()],
        "drafter_max_shift": drafter,
        "drafter_rounds": 1000,
        "drafter_flips": 3,
    }


def test_float32_is_exact():
    rules = load_calibration(FIXTURE_TARGET, "float32")
    assert rules.exact and rules.bound == 0.0 and rules.ceiling([0.0, 0.1]) == (0, 0.0)


def test_values_come_from_the_manifest_only(tmp_path):
    target = _pair(tmp_path, extra_file={"bounds": {"bfloat16": 1e9}})  # the old side door
    rules = load_calibration(target, "bfloat16")
    assert rules.bound == 0.5 and "uncalibrated" in rules.source


def test_bound_is_twice_the_largest_shift_over_devices(tmp_path):
    rng = np.random.default_rng(0)
    section = {
        "measured": {
            "bfloat16@cpu": _entry(rng.exponential(0.02, 5000)),
            "bfloat16@cuda": {"positions": 100, "max_shift": 0.3},
        }
    }
    rules = load_calibration(_pair(tmp_path, section), "bfloat16")
    assert rules.bound == pytest.approx(0.6)
    assert rules.drafter_tolerance == pytest.approx(0.1)
    assert rules.positions == 5000  # the tail comes from the entry that has one


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_shift", 1e9, "max_shift = 1000000000.0 is outside 0.0..1.0"),
        ("max_shift", "big", "max_shift must be a finite number"),
        ("drafter_max_shift", 50.0, "drafter_max_shift = 50.0 is outside"),
        ("positions", 0, "positions = 0 is outside"),
    ],
)
def test_out_of_range_values_are_refused_naming_file_and_field(tmp_path, field, value, message):
    entry = _entry([0.01, 0.02])
    entry[field] = value
    target = _pair(tmp_path, {"measured": {"bfloat16@cpu": entry}})
    with pytest.raises(CalibrationError, match="MANIFEST.json: field near_tie_calibration.measured.bfloat16@cpu"):
        load_calibration(target, "bfloat16")
    with pytest.raises(CalibrationError) as exc:
        load_calibration(target, "bfloat16")
    assert message in str(exc.value)
    assert 2 * (MAX_BOUND / 2) == MAX_BOUND


def test_unreadable_manifest_names_the_file(tmp_path):
    target = _pair(tmp_path)
    (tmp_path / "MANIFEST.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(CalibrationError, match="MANIFEST.json: not a readable JSON manifest"):
        load_calibration(target, "bfloat16")


def test_calibration_for_other_weights_is_refused(tmp_path):
    target = _pair(tmp_path, {"measured": {"bfloat16@cpu": _entry([0.01, 0.02])}})
    (target / "model.safetensors").write_bytes(b"weights")
    data = json.loads((tmp_path / "MANIFEST.json").read_text())
    data["files"] = {"target/model.safetensors": {"bytes": 7, "sha256": "0" * 64}}
    (tmp_path / "MANIFEST.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="sha256 differs from the target weights"):
        load_calibration(target, "bfloat16")


def test_the_fixture_manifest_calibrates_bf16_and_fp16():
    for dtype in ("bfloat16", "float16"):
        rules = load_calibration(FIXTURE_TARGET, dtype)
        assert 0 < rules.bound <= MAX_BOUND and "MANIFEST.json" in rules.source


def _rules(shrinks) -> NoiseModel:
    """NoiseModel from signed gap shrinks (module doc, 2)."""
    shrinks = np.asarray(shrinks)
    tail = tuple((t, int((shrinks >= t).sum())) for t in shift_thresholds())
    return NoiseModel("bfloat16", float(2 * np.abs(shrinks).max()), 0.1, int(shrinks.size), tail, "test", 0.01)


def test_flip_probability_falls_with_the_gap():
    rules = _rules(np.random.default_rng(1).laplace(0.0, 0.02, 20000))
    values = [rules.flip_probability(g) for g in (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 5.0)]
    assert values[0] == 1.0 and values == sorted(values, reverse=True)
    assert values[-1] < 1e-3


def test_ceiling_holds_for_a_correct_engine_and_catches_the_runner_up_engine():
    """Simulate the model behind the ceiling: positions with fp32 gaps like a greedy run's; a correct
    engine's signed noise is a calibration-like shrink (up to twice as large), and it flips a position
    when its noise shrinks the gap past zero. The runner-up engine flips every gap within the bound."""
    rng = np.random.default_rng(2)
    rules = _rules(rng.laplace(0.0, 0.02, 20000))
    over = 0
    trials = 60
    for _ in range(trials):
        gaps = np.concatenate([rng.exponential(6.0, 3000), rng.uniform(0, 0.3, 60)])  # ~2 % near-ties
        noise = 2 * rng.laplace(0.0, 0.02, gaps.size)
        flips = int((noise > gaps).sum())
        ceiling, mu = rules.ceiling(gaps.tolist())
        assert flips <= mu * 3 + 10
        over += flips > ceiling
        runner_up = int((gaps <= rules.bound).sum())
        assert runner_up > ceiling, (runner_up, ceiling, mu)
    assert over / trials <= 5 * ALPHA + 0.01  # false alarms stay rare


def test_a_broken_calibration_is_refused_before_any_check_naming_file_and_field(random_pair, tmp_path):
    import shutil

    from ddtree_conformance.session import SuiteSession, SuiteSettings
    from ddtree_conformance.settings import SettingsError

    target, drafter = (shutil.copytree(p, tmp_path / p.name) for p in map(type(tmp_path), random_pair))
    (tmp_path / "MANIFEST.json").write_text(
        json.dumps({"near_tie_calibration": {"measured": {"bfloat16@cpu": {"positions": 10, "max_shift": 7.5}}}})
    )
    session = SuiteSession(
        SuiteSettings(model_dir=str(target), drafter_dir=str(drafter), dtype="bfloat16", isolate=False, torch_threads=1)
    )
    try:
        with pytest.raises(SettingsError, match=r"MANIFEST.json: field near_tie_calibration.measured.*max_shift"):
            session.require_support()
    finally:
        session.close()
