"""Engines that try to earn the noise model's excuses (conformance/testing/excuse_adversaries.py)."""

from __future__ import annotations

import pytest

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


# 21 s of a CI worker: nightly (thorough); the bfloat16 adversary above and the lean's count below stay in CI
@pytest.mark.thorough
def test_drafter_logits_that_lean_toward_the_continuation_earn_no_excuse_in_float16():
    """In float16 its confirmed rounds stay under the cap and its tau gain under the tau test (the hole at
    20 prompts x 64 tokens: 7-11 excused rounds against caps of 18-26, tau +0.3 %). What gives it away is
    that its logits know the target: on the rounds that need no excuse they favour the token the target
    emits next over the token of the nearest logit in nearly every row, where rounding does half the time."""
    lossless, acceptance = _acceptance("float16", 8)
    assert lossless.status == "pass", lossless.message
    assert acceptance.status == "fail", acceptance.message
    assert "those logits are not blind to the target" in acceptance.message, acceptance.message
    lean = acceptance.details["drafter_lean"]
    assert lean["toward"] > 0.9 * (lean["toward"] + lean["away"]) and lean["p_value"] < 1e-3


def test_the_lean_of_drafter_logits_counts_rows_against_the_nearest_logit():
    import torch

    from ddtree_conformance.drafter_excuse import continuation_lean

    torch.manual_seed(0)
    reference = torch.randn(12, 500) * 3
    top = torch.topk(reference, 64, dim=-1)
    continuation = [int(top.indices[row, row % 5]) for row in range(12)]  # among the top, not always first
    noise = torch.randn(12, 500) * 0.01
    toward, away = continuation_lean(reference + noise, (top.indices, top.values), continuation)
    assert toward + away == 12 and 2 <= toward <= 10  # rounding: either way
    sharper = reference * 1.01  # a shift that grows with the logit moves the control alike: still either way
    toward, away = continuation_lean(sharper + noise, (top.indices, top.values), continuation)
    assert 2 <= toward <= 10, (toward, away)
    nudged = reference + noise
    nudged[torch.arange(12), torch.tensor(continuation)] += 0.05
    assert continuation_lean(nudged, (top.indices, top.values), continuation) == (12, 0)
    outside = [int(torch.argmin(reference[row])) for row in range(12)]  # never among the top: not counted
    assert continuation_lean(nudged, (top.indices, top.values), outside) == (0, 0)
    assert continuation_lean(reference, (top.indices, top.values), continuation) == (0, 0)  # equal: neither


def test_the_lean_test_takes_the_round_as_its_unit():
    """Rows of one round share its context and rounding: a run of rounds whose rows all lean one way or all
    the other, at random, is rounding (a test over rows would call 10 rows a round independent and fail it);
    rounds that lean toward the continuation more often than not, by a little each, are not."""
    import random

    from ddtree_conformance.calibration import load_calibration
    from ddtree_conformance.testing.runs import FIXTURE_TARGET

    rules = load_calibration(FIXTURE_TARGET, "bfloat16")
    from scipy.stats import binomtest

    rng = random.Random(16)  # a draw whose rows come out 1610 of 3000 toward
    clustered = [(10, 0) if rng.random() < 0.5 else (0, 10) for _ in range(300)]
    result = rules.lean_test(clustered)
    assert binomtest(result.toward, 3000, 0.5, alternative="greater").pvalue < 1e-3  # rows as units: a false alarm
    assert not result.fails, result.describe()
    leaning = [(6, 4)] * 60 + [(4, 6)] * 20  # 60 of 80 rounds lean toward by 2 rows
    result = rules.lean_test(leaning)
    assert result.fails and (result.toward, result.away, result.rounds) == (440, 360, 80), result.describe()
    assert not rules.lean_test([]).fails and not rules.lean_test([(0, 3)] * 50).fails
    # the exact sign-flip p-value against enumerating every sign pattern (zeros and negatives included)
    import itertools

    from ddtree_conformance.noise import _sign_flip_p as sign_flip_p

    for draw in range(60):
        scores = [random.Random(draw * 31 + i).randint(-5, 6) for i in range(1 + draw % 9)]
        sizes, observed = [abs(x) for x in scores], sum(scores)
        every = list(itertools.product((1, -1), repeat=len(sizes)))
        exact = sum(sum(e * a for e, a in zip(signs, sizes, strict=True)) >= observed for signs in every) / len(every)
        assert abs(sign_flip_p(scores) - (exact if observed > 0 else 1.0)) < 1e-12, scores
