"""`--limit` and `--max-new-tokens` bound the sampling checks too (issue 31): a quick look is quick, a run
too small for a sampling verdict says so ("insufficient evidence", with the number needed) instead of
passing, a broken sampler still fails in it, and the default run's sampling evidence is what it was.

Before: the sampling checks ignored both options (290 s of a 348 s `check --limit 2` run: 200 requests of 24
tokens per variant whatever the run), and a sample too small for a test passed on whatever it held.
"""

from __future__ import annotations

import pytest

from ddtree_conformance.checks.sampling import MIN_TRANSITIONS, NEW_TOKENS, VARIANTS
from ddtree_conformance.evidence import chi2_detectable_w
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.settings import SAMPLING_FULL_AT_PROMPTS, build_settings
from ddtree_conformance.testing import mutants
from ddtree_conformance.testing.mutants import ReferenceEngine
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run


def test_limit_scales_the_sampled_requests_and_the_default_run_keeps_its_evidence():
    default, _ = build_settings({})
    assert default.sampling_requests == 200 and default.max_new_tokens >= NEW_TOKENS  # 200 x 24 per variant
    assert 200 * NEW_TOKENS >= MIN_TRANSITIONS and 200 // 5 * NEW_TOKENS >= MIN_TRANSITIONS  # a verdict, as before
    assert build_settings({"limit": SAMPLING_FULL_AT_PROMPTS})[0].sampling_requests == 200  # the named pairs' 20
    assert build_settings({"limit": 2})[0].sampling_requests == 20
    assert build_settings({"limit": 1})[0].sampling_requests == 10
    assert build_settings({"limit": 2, "profile": "thorough"})[0].sampling_requests == 100
    assert build_settings({"limit": 2, "sampling_requests": 40})[0].sampling_requests == 40  # given: as given
    assert SuiteSettings(limit=2).sampling_requests == 200  # the settings model itself: as given (tests, scripts)


def test_the_evidence_a_verdict_needs_is_a_large_effect_at_95_percent_power():
    assert chi2_detectable_w(MIN_TRANSITIONS, 1, 1e-3) <= 0.5 < chi2_detectable_w(MIN_TRANSITIONS - 10, 1, 1e-3)


def _one_variant(engine_class, variant: str, **small):
    settings = fixture_pair_settings(
        modes=["ddtree"], budgets=[16], limit=1, torch_threads=1, held_out_prompts=0, run_seed=3, **small
    )
    (result,) = plan_and_run(settings, engine_class, [f"sampling/ddtree-B16/{variant}"], exact=True)
    return result


def test_a_run_too_small_for_a_verdict_says_so_and_names_the_number_needed():
    result = _one_variant(ReferenceEngine, "T=1", sampling_requests=10, max_new_tokens=8)
    assert result.status == "skip" and result.cause == "input", result.message
    assert result.message.startswith("insufficient evidence: 80 sampled transitions"), result.message
    assert " per setting (10 requests of 8 tokens)" in result.message, result.message
    assert f"needs at least {MIN_TRANSITIONS} per setting" in result.message and "--limit" in result.message
    drawn = _one_variant(ReferenceEngine, "drawn", sampling_requests=10, max_new_tokens=8)
    assert drawn.status == "skip" and drawn.cause == "input" and "insufficient evidence" in drawn.message


def test_a_broken_sampler_still_fails_a_run_too_small_for_a_verdict():
    """The support test needs no size: a token the request's top-k forbids fails at once."""
    result = _one_variant(mutants.TopKTopPIgnored, "T=1,top_k=3", sampling_requests=10, max_new_tokens=8)
    assert result.status == "fail" and "probability 0" in result.message, result.message


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_enough_evidence_is_a_verdict(variant):
    result = _one_variant(ReferenceEngine, variant, sampling_requests=12, max_new_tokens=10)  # 120 transitions
    assert result.status == "pass", result.message
    assert "12 requests, 120 tokens" in result.message
