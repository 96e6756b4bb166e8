"""scripts/ab_bias.py --pool: A/A runs pooled into a between-process spread, and each run judged as the A/B
gate would judge it without a spread, with the CPU's, and with the spread of the *other* runs (left out in
turn). The runs here are made up with a known per-process offset; the measured ones are under
scripts/measurements/ (2026-12-09-issue29-aa-procs)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ab_bias.py"
spec = importlib.util.spec_from_file_location("ab_bias", SCRIPT)
ab_bias = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab_bias)


def _run(path: Path, offset: float, rng: np.random.Generator, repeats: int = 40, noise: float = 0.01) -> Path:
    """One A/A run as ab_bias.py writes it: 2 prompts, each repeat's four calls in pairs, the candidate
    process slower by ``offset`` for the whole run, ``noise`` per call."""
    calls = []
    for r in range(repeats):
        for prompt in range(2):
            first = "candidate" if (r + prompt) % 2 == 0 else "baseline"
            for side in (first, "baseline" if first == "candidate" else "candidate"):
                s = 0.1 * (1 + offset if side == "candidate" else 1.0) * math.exp(rng.normal(0, noise))
                calls.append({"side": side, "prompt": [prompt], "s": s, "wall": s})
    path.write_text(json.dumps({"argv": ["--limit", "2"], "ab": {"stop": {"repeats": repeats}}, "calls": calls}))
    return path


def test_pool_finds_the_process_offset_and_the_left_out_spread_keeps_an_outlier_from_failing(tmp_path):
    rng = np.random.default_rng(7)
    offsets = [-0.03, 0.0, 0.02, -0.01, 0.03, -0.02, 0.01, 0.0, -0.025, 0.015, 0.005, -0.005]
    paths = [_run(tmp_path / f"run-{k}.json", o, rng) for k, o in enumerate(offsets)]
    paths.append(_run(tmp_path / "slow.json", 0.08, rng))  # one process 8 % slow, as one H100 run measured
    pooled = ab_bias.pool(paths)
    assert pooled["runs"] == 13
    sd = pooled["between_run_sd_pct"]
    assert 1.5 < sd < 4.0, pooled  # the offsets' sd is 3 %, within-run noise adds little (80 pairs a run)
    assert pooled["q_p"] < 1e-6  # the runs differ more than their own intervals allow
    spread_sd, df = pooled["ab_spread"].split(":")  # as bench --ab-spread takes it: sd and its degrees of freedom
    assert abs(float(spread_sd) - sd / 100) < 1e-4 and df == "12", pooled["ab_spread"]
    # bias: the offsets average +0.5 %; the runs' own noise would call that certain (fixed-effect se under 0.1 %),
    # but with a 3 % offset per process the honest interval is wide and holds 0
    low, high = pooled["bias_ci_pct"]
    assert pooled["pooled_se_pct"] < 0.1 and low < 0 < high and high - low > 2, pooled
    verdicts = pooled["verdicts_at_last_look"]
    assert all(sum(v.values()) == 13 for v in verdicts.values())
    # without a spread the slow process fails a correct build at 2 %; with the others' spread nothing fails
    assert verdicts["tolerance 2%"]["fail"] >= 1, verdicts
    assert verdicts["tolerance 2%, spread of the other runs"]["fail"] == 0, verdicts
    assert verdicts["tolerance 5%, spread of the other runs"]["fail"] == 0, verdicts
    # the price of the spread: how much slower a build must be to read FAIL (the runs' ratios made slower)
    caught = pooled["fails_from_slowdown_with_this_spread"]
    assert 5 < caught["tolerance 2%"]["median_pct"] < caught["tolerance 5%"]["median_pct"] < 20, caught
    quiet = json.loads(paths[1].read_text())
    narrow, wide = (ab_bias.failing_slowdown(quiet, 0.05, (sd, 10)) for sd in (0.001, 0.03))
    assert 0.05 < narrow < 0.08 and wide > narrow + 0.04, (narrow, wide)  # a wider spread costs power


def test_a_bias_every_process_shares_is_found(tmp_path):
    """Every candidate process 1 % slow and no offset between processes: the bias interval excludes 0 and holds 1 %."""
    rng = np.random.default_rng(3)
    pooled = ab_bias.pool([_run(tmp_path / f"b{k}.json", 0.01, rng) for k in range(6)])
    low, high = pooled["bias_ci_pct"]
    assert pooled["between_run_sd_pct"] < 0.2 and 0 < low < 1 < high < 2, pooled


def test_pool_of_two_runs_has_no_left_out_spread(tmp_path):
    """Leaving one of two runs out leaves one run: no spread to estimate (it needs two)."""
    rng = np.random.default_rng(1)
    pooled = ab_bias.pool([_run(tmp_path / f"r{k}.json", 0.0, rng) for k in range(2)])
    keys = set(pooled["verdicts_at_last_look"])
    assert "tolerance 2%, spread 1.9%" in keys and not any("other runs" in k for k in keys), keys
    assert pooled["ab_spread"].endswith(":1")


def test_a_shaped_pair_is_written_once_then_reused_and_another_is_refused(tmp_path):
    """``--shape-dir``: the pair is built and written (marker last), reused as it is, and a folder holding
    another shape or dtype is refused with one line naming it."""
    import pytest

    first = ab_bias.write_shaped_pair("tiny", None, "cpu", tmp_path)
    assert (tmp_path / "written.json").is_file() and list((tmp_path / "target").glob("*.safetensors"))
    assert (tmp_path / "drafter" / "model.safetensors").is_file()
    stamp = (tmp_path / "drafter" / "model.safetensors").stat().st_mtime_ns
    assert ab_bias.write_shaped_pair("tiny", None, "cpu", tmp_path) == first  # reused, not rebuilt
    assert (tmp_path / "drafter" / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit, match="holds another pair"):
        ab_bias.write_shaped_pair("tiny", "bfloat16", "cpu", tmp_path)
    with pytest.raises(SystemExit, match="is not one of"):
        ab_bias.write_shaped_pair("70b", None, "cpu", tmp_path / "other")


def test_pool_writes_out_and_names_a_file_that_is_not_a_run(tmp_path, capsys):
    """``--pool ... --out FILE`` writes the pool it prints; a file that is not an A/A run is one error naming it
    (exit 2), never a traceback."""
    import pytest

    rng = np.random.default_rng(2)
    runs = [str(_run(tmp_path / f"r{k}.json", 0.0, rng)) for k in range(3)]
    assert ab_bias.main(["--pool", *runs, "--out", str(tmp_path / "pooled.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "pooled.json").read_text()) == printed and printed["runs"] == 3
    (tmp_path / "report.json").write_text(json.dumps({"verdict": "PASS"}))
    (tmp_path / "cut.json").write_text(json.dumps({"ab": {}, "calls": [{"side": "candidate"}]}))
    for bad in ("report.json", "missing.json", "cut.json"):
        with pytest.raises(SystemExit) as stop:
            ab_bias.main(["--pool", runs[0], str(tmp_path / bad)])
        assert stop.value.code == 2 and bad in capsys.readouterr().err
