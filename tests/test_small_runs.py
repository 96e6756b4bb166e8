"""Small runs (issue 14, item 6): one or two prompts, one or eight new tokens. Every check that
applies runs, one that needs more skips with its reason, and the correct reference never fails."""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.checks import PER_MODE_CHECKS
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.runs import plan_and_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def settings(random_pair_settings) -> SuiteSettings:
    return random_pair_settings(
        [6, 13, 20],
        seed=21,
        prefix="s",
        budgets=[16],
        branch_prompts=1,
        branch_rounds=1,
        context_tokens=96,  # context-range: the window's end only (tests/test_input_adversaries.py: every length)
    )


@pytest.mark.parametrize("limit, new_tokens", [(1, 1), (2, 8), (1, 3)])
def test_small_runs_never_fail_the_reference(settings, limit, new_tokens):
    settings = settings.model_copy(update={"limit": limit, "max_new_tokens": new_tokens})
    names = [*PER_MODE_CHECKS, "branch-vs-chain"]
    results = plan_and_run(settings, ReferenceEngine, names)
    failed = [(r.check, r.message) for r in results if r.status == "fail"]
    assert not failed, failed
    skipped = {r.check: r.message for r in results if r.status == "skip"}
    assert all(reason for reason in skipped.values())
    assert sum(r.status == "pass" for r in results) >= 10, skipped
    if new_tokens == 1:  # one token is the prefill token: no speculative round anywhere
        assert "no speculative round" in skipped["acceptance/ddtree-B16"]
        assert "stop token" in skipped["stop-token/ddtree-B16"]
