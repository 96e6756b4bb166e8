"""Every check result states the smallest systematic effect its evidence could detect (issue 20, item 9)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import chi2, ncx2

from ddtree_conformance.evidence import POWER, Evidence, chi2_detectable_w, detectable, smallest_rate


def test_the_smallest_rate_is_caught_with_the_stated_power():
    for n in (10, 320, 5120):
        f = smallest_rate(n)
        assert 1 - (1 - f) ** n == pytest.approx(POWER)
        assert f == pytest.approx(3 / n, rel=0.1 if n > 100 else 0.5)  # about 3/N
    assert smallest_rate(0) == 1.0


def test_the_chi_square_effect_size_has_the_stated_power():
    w = chi2_detectable_w(1000, 30, 1e-3)
    assert ncx2.sf(chi2.isf(1e-3, 30), 30, 1000 * w * w) == pytest.approx(POWER, abs=1e-6)
    assert chi2_detectable_w(4000, 30, 1e-3) == pytest.approx(w / 2, rel=0.05)  # four times the data: half the w
    assert chi2_detectable_w(0, 30, 1e-3) == math.inf


def test_each_family_reads_its_own_evidence():
    scored = {"scoring": {"positions": 5120, "ceiling": 12, "expected_excused": 4.2}, "compared": 80}
    assert detectable(Evidence.OUTPUTS, scored).startswith("5120 output positions: a fault in 1 of 1,710")
    assert "adds about 8 excused positions (ceiling 12)" in detectable(Evidence.OUTPUTS, scored)
    assert detectable(Evidence.OUTPUTS, {"compared": 80}).startswith("80 compared outputs")
    assert detectable(Evidence.REPLAYED_ROUNDS, {"rounds": 1000}).startswith("1000 replayed rounds")
    assert "Cohen's w" in detectable(Evidence.TRANSITIONS, {"transitions": 4800, "dof": 40, "alpha": 1e-3})
    assert detectable(Evidence.NODES, {"nodes": 300}).startswith("300 tree nodes")
    assert detectable(Evidence.TRACED_ROUNDS, {"rounds": 250}).startswith("250 traced rounds")
    assert detectable(Evidence.OUTPUTS, {}) is None


def test_a_check_run_carries_its_detectable_effect(tmp_path):
    from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run

    settings = fixture_pair_settings(
        limit=2, max_new_tokens=8, modes=["ddtree"], budgets=[16], torch_threads=1, sampling_requests=40
    )
    results = plan_and_run(settings, None, ["lossless", "acceptance", "sampling/ddtree-B16/T=1"])
    lines = {r.check: r.details.get("detectable") for r in results}
    assert any(unit in lines["lossless/ddtree-B16"] for unit in ("output positions", "compared outputs"))
    assert "replayed rounds" in lines["acceptance/ddtree-B16"]
    assert "sampled transitions" in lines["sampling/ddtree-B16/T=1"]
