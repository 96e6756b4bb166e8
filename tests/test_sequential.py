"""The sequential interval of the throughput gate, on synthetic samples with known truth.

The true speedup is set; per-repeat samples are drawn around it; the sequential procedure runs as
the bench runs it (looks at the planned geometric points only, each at alpha / K).
Checked: each wrong verdict at the band's edge has probability <= alpha/2 (up to Monte-Carlo
error), also with heavy-tailed noise; clear cases are decided within the repeat cap; a fixed run's
interval covers at its nominal level.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ddtree_conformance.sequential import SequentialPlan, cv, look_alpha, planned_looks, ratio_interval, verdict

ALPHA = 0.05
PLAN = SequentialPlan(alpha=ALPHA, min_repeats=3, max_repeats=30)
EDGE = 1.0


def sequential_verdict(draw, plan: SequentialPlan = PLAN, edge: float = EDGE) -> tuple[str | None, int]:
    samples: list[float] = []
    for n in range(1, plan.max_repeats + 1):
        samples.append(draw())
        if plan.is_look(n):
            found = verdict(ratio_interval(samples, plan.look_alpha), edge)
            if found:
                return found, n
    return None, plan.max_repeats


def rates(truth: float, noise, sims: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    found = [sequential_verdict(lambda: truth * math.exp(noise(rng)))[0] for _ in range(sims)]
    return {k: sum(f == k for f in found) / sims for k in ("pass", "regression", None)}


def bound(p: float, sims: int) -> float:
    """p plus three Monte-Carlo standard errors."""
    return p + 3 * math.sqrt(p * (1 - p) / sims)


def normal(sd):
    return lambda rng: rng.normal(0.0, sd)


def heavy(sd):
    """Student-t (3 df) noise scaled to standard deviation ``sd``: occasional large outliers."""
    return lambda rng: sd * rng.standard_t(3) / math.sqrt(3.0)


def test_planned_looks_spend_exactly_alpha():
    assert PLAN.looks() == (3, 5, 8, 12, 18, 27, 30)
    assert planned_looks(3, 60, 1.5) == (3, 5, 8, 12, 18, 27, 41, 60)
    assert planned_looks(3, 3, 1.5) == (3,) and planned_looks(2, 4, 2.0) == (2, 4)
    assert PLAN.look_alpha * len(PLAN.looks()) == pytest.approx(ALPHA)
    assert look_alpha(ALPHA, 7) == pytest.approx(ALPHA / 7) and look_alpha(ALPHA, 7, sequential=False) == ALPHA
    assert PLAN.is_look(12) and not PLAN.is_look(13)
    with pytest.raises(ValueError, match="growth"):
        SequentialPlan(growth=1.0)


def test_a_plan_within_its_budget_drops_only_the_looks_the_budget_cannot_reach():
    plan = SequentialPlan(alpha=ALPHA, min_repeats=3, max_repeats=60, time_budget_s=54.0)
    paced = plan.within_budget(3, 9.6)  # 3.2 s a repeat, as on the H200 trials: 16 repeats fit in 54 s
    assert paced.max_repeats == 16 and paced.budget_cap and paced.looks() == (3, 5, 8, 12, 16)
    assert paced.look_alpha == pytest.approx(ALPHA / 5) and plan.look_alpha == pytest.approx(ALPHA / 8)
    assert paced.as_report()["max_repeats_from_budget"] is True
    assert plan.within_budget(3, 0.3) is plan  # a fast run: the budget holds more than the cap, nothing changes
    assert plan.within_budget(3, 600.0).max_repeats == 3  # never below the repeats already done
    assert plan.within_budget(0, 1.0) is plan and plan.within_budget(3, 0.0) is plan


def test_interval_is_the_t_interval_of_the_logs():
    samples = [1.52, 1.49, 1.55, 1.50, 1.47, 1.53]
    iv = ratio_interval(samples, 0.05)
    logs = np.log(samples)
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert iv.estimate == pytest.approx(math.exp(logs.mean()))
    assert (iv.low, iv.high) == pytest.approx((math.exp(low), math.exp(high)))
    assert iv.level == 0.95 and iv.n == 6
    assert ratio_interval(samples, 0.001).low < iv.low  # a later look is wider
    assert cv([2.0, 2.0]) == 0.0 and cv([1.0]) is None


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="at least 2"):
        ratio_interval([1.0], 0.05)
    with pytest.raises(ValueError, match="finite and > 0"):
        ratio_interval([1.0, -1.0], 0.05)
    with pytest.raises(ValueError, match="min_repeats"):
        SequentialPlan(min_repeats=1)


def test_verdict_against_the_edge():
    assert verdict(ratio_interval([1.10, 1.11, 1.09], 0.05), 1.0) == "pass"
    assert verdict(ratio_interval([0.90, 0.91, 0.89], 0.05), 1.0) == "regression"
    assert verdict(ratio_interval([0.95, 1.05, 1.00], 0.05), 1.0) is None


@pytest.mark.parametrize("noise", [normal(0.02), heavy(0.02)], ids=["normal", "heavy-tailed"])
def test_wrong_verdicts_at_the_edge_are_rare(noise):
    sims = 500
    at_edge = rates(EDGE, noise, sims, seed=1)  # truth exactly at the edge: "regression" is wrong
    assert at_edge["regression"] <= bound(ALPHA / 2, sims), at_edge
    below = rates(EDGE * 0.999, noise, sims, seed=2)  # truth just below: "pass" is wrong
    assert below["pass"] <= bound(ALPHA / 2, sims), below


@pytest.mark.parametrize("truth, expected", [(1.04, "pass"), (0.96, "regression")])
def test_clear_cases_are_decided(truth, expected):
    sims = 300
    got = rates(truth, normal(0.01), sims, seed=3)  # 4 % from the edge, 1 % noise per repeat
    assert got[expected] >= 0.95, got
    assert got["pass" if expected == "regression" else "regression"] == 0


def test_a_fixed_run_covers_at_its_level():
    rng = np.random.default_rng(4)
    sims, truth = 2000, 1.7
    hits = 0
    for _ in range(sims):
        iv = ratio_interval(list(truth * np.exp(rng.normal(0, 0.05, 5))), ALPHA)
        hits += iv.low <= truth <= iv.high
    assert abs(hits / sims - (1 - ALPHA)) <= 3 * math.sqrt(ALPHA * (1 - ALPHA) / sims)
