"""bench: interleaved repeats against plain, bootstrap CI, and the run report it writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ddtree_conformance.bench import bootstrap_median_ci
from ddtree_conformance.cli import app
from ddtree_conformance.testing.random_pair import write_random_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_random_pair(tmp_path_factory.mktemp("bench-pair"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-prompts") / "p.jsonl"
    path.write_text('{"id": "a", "category": "math", "prompt_ids": [1, 2, 3, 4]}\n'
                    '{"id": "b", "category": "code", "prompt_ids": [5, 6, 7]}\n')
    return path


def test_bootstrap_is_seeded_and_brackets_the_median():
    samples = [1.9, 2.0, 2.1, 2.05, 1.95]
    first = bootstrap_median_ci(samples, seed=3)
    assert first == bootstrap_median_ci(samples, seed=3)
    median, low, high = first
    assert median == pytest.approx(2.0) and low <= median <= high
    assert min(samples) <= low and high <= max(samples)


def test_bench_writes_report_with_schema_and_three_files(pair, prompts, tmp_path):
    target, drafter = pair
    out = tmp_path / "reports" / "bench.json"
    result = CliRunner().invoke(app, [str(a) for a in (
        "bench", "--model", target, "--drafter", drafter, "--prompts", prompts, "--pair-name", "random",
        "--max-new-tokens", "6", "--budgets", "4", "--repeats", "5", "--no-isolate", "--out", out,
        "--hardware-class", "test-cpu")])
    assert result.exit_code == 0, result.output
    assert out.is_file() and out.with_suffix(".md").is_file() and out.with_suffix(".html").is_file()
    report = json.loads(out.read_text())
    assert report["schema"] == "ddtree-conformance/run-report" and report["schema_version"] == 1
    assert report["kind"] == "bench" and report["hardware_class"] == "test-cpu"
    assert report["bench"]["repeats"] == 5 and report["bench"]["timing_basis"] == "prefill+decode"
    assert [r["label"] for r in report["runs"]] == ["plain", "dflash", "ddtree-B4"]
    for run in report["runs"]:
        assert len(run["tokens_per_s"]) == 5 and run["tau"] >= 1.0
        assert {"per_position", "histogram", "tau_per_response_mean", "rounds"} <= set(run)
    for run in report["runs"][1:]:
        sp = run["speedup"]
        assert len(sp["samples"]) == 5 and sp["ci_low"] <= sp["median"] <= sp["ci_high"]
        assert sp["confidence"] == 0.95 and sp["resamples"] == 2000 and sp["cv"] is not None
        assert sum(run["histogram"].values()) == run["rounds"]
        # speedup per round is the method's tokens/s over the same round's plain tokens/s
        plain = np.array(report["runs"][0]["tokens_per_s"])
        assert sp["median"] == pytest.approx(float(np.median(np.array(run["tokens_per_s"]) / plain)), rel=1e-2)
    # the report is accepted by baseline + gate: its own baseline passes tau, per-position and speedup
    bl = tmp_path / "bl"
    assert CliRunner().invoke(app, ["baseline", str(out), "--baselines", str(bl)]).exit_code == 0
    gated = CliRunner().invoke(app, ["gate", str(out), "--baselines", str(bl)])
    assert gated.exit_code == 0, gated.output


def test_bench_rejects_bad_repeats(pair, prompts):
    target, drafter = pair
    result = CliRunner().invoke(app, ["bench", "--model", str(target), "--drafter", str(drafter),
                                      "--prompts", str(prompts), "--repeats", "0"])
    assert result.exit_code == 2 and "--repeats" in result.stderr
