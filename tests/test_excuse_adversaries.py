"""Engines that try to earn the noise model's excuses (conformance/testing/excuse_adversaries.py)."""

from __future__ import annotations

from ddtree_conformance.testing.excuse_adversaries import PeekingDrafter
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run


def _acceptance(dtype: str, limit: int):
    settings = fixture_pair_settings(
        limit=limit, max_new_tokens=64, budgets=[16], dtype=dtype, held_out_prompts=0, torch_threads=1, run_seed=1
    )
    return plan_and_run(settings, PeekingDrafter, ["acceptance/ddtree", "lossless/ddtree"])


def test_drafter_logits_moved_toward_the_targets_continuation_fail_in_bfloat16():
    """Lossless, its logits within the tolerance of the fp32 drafter's, its trees the spec trees of the
    logits it reports: every longer round is a confirmed drafter near tie, and together they are more
    than a correct engine's drafter flips (4 prompts x 64 tokens: 15 of 60 rounds against a cap of 12)."""
    lossless, acceptance = _acceptance("bfloat16", 4)
    assert lossless.status == "pass", lossless.message
    assert acceptance.status == "fail" and "excused as drafter near-ties, above the cap" in acceptance.message
    assert acceptance.details["tau"] > acceptance.details["reference_tau"]
