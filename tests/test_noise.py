"""The noise model (conformance/noise.py): token calls, round caps, the limits a run breaks, the tau test, the tie
test."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest

from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.noise import ALPHA, FP32_TIE, LeanTest, NoiseModel, RoundLimits, TauTest, TokenCall
from ddtree_conformance.paths import FIXTURE_TARGET

BF16 = NoiseModel("bfloat16", 0.3, 0.2, 0, (), "test", 0.05, 0.02, longer_rate=0.02, shorter_rate=0.03)
EXACT = NoiseModel("float32", 0.0, 1e-3, 0, (), "exact")


@pytest.mark.parametrize(
    ("rules", "gaps", "call"),
    [
        (BF16, (0.0,), TokenCall.MATCH),
        (BF16, (0.1,), TokenCall.NEAR_TIE),
        (BF16, (0.3,), TokenCall.NEAR_TIE),
        (BF16, (0.31,), TokenCall.OUTSIDE),
        (BF16, (0.1, 0.4), TokenCall.OUTSIDE),  # a replayed node: every gap must be within the bound
        (EXACT, (FP32_TIE / 2,), TokenCall.FP32_TIE),
        (EXACT, (0.01,), TokenCall.OUTSIDE),
        (EXACT, (FP32_TIE / 2, 0.01), TokenCall.OUTSIDE),
    ],
)
def test_token_calls(rules, gaps, call):
    assert rules.token(*gaps) is call


def test_round_caps_follow_their_direction_and_grow_with_rounds():
    assert BF16.unconfirmed_round_cap(1000, longer=True) < BF16.unconfirmed_round_cap(1000, longer=False)
    assert BF16.unconfirmed_round_cap(100, True) < BF16.unconfirmed_round_cap(1000, True) < 1000 * 0.05
    assert EXACT.unconfirmed_round_cap(1000, True) <= 5 and EXACT.unconfirmed_round_cap(0, True) == 0


def test_tau_test_passes_symmetric_noise_at_its_level():
    """Rounds whose length differences are symmetric about zero (rare, of any size): the self-normalised
    sum's p-value bound exp(-t^2/2) keeps false alarms below ALPHA; 2000 runs of 400 rounds give none."""
    rng = random.Random(7)
    alarms = 0
    for _ in range(2000):
        d = [rng.choice((-1, 1)) * rng.choice((1, 1, 1, 2, 3)) if rng.random() < 0.05 else 0 for _ in range(400)]
        alarms += BF16.tau_test(d).fails
    assert alarms <= 5  # the level is 1e-3 (Bonferroni over two tests): about 2 of 2000 runs may alarm


def test_tau_test_fails_an_engine_that_claims_more_than_the_noise_gives():
    natural = [-1] * 12 + [1] * 8 + [0] * 380  # a correct bf16 engine: a few rounds each way, slightly short
    assert not BF16.tau_test(natural).fails
    inflated = [1] * 40 + [0] * 360  # 40 of 400 rounds one token longer, none shorter
    test = BF16.tau_test(inflated)
    assert test.fails and test.gained == 40 and "+40 tokens" in test.describe()
    # a model that allows a gain of 0.1 a round lets the sum pass, but 40 longer rounds and no shorter one
    # are still far above the share of longer rounds a correct engine shows
    loose = NoiseModel("bfloat16", 0.3, 0.2, 0, (), "t", gain_per_round=0.1).tau_test(inflated)
    assert loose.statistic < 0 and loose.fails
    # one-token gains in many rounds, hidden in the sum by a few long shorter rounds (an engine whose drafter
    # peeks at the target's continuation, in DFlash: 19 longer, 5 shorter at -3 and -4 on 6 prompts)
    hidden = [1] * 30 + [-4] * 6 + [0] * 300
    test = BF16.tau_test(hidden)
    assert test.statistic < 1 and test.fails and (test.longer, test.shorter) == (30, 6)


def test_tie_test_allows_the_measured_share_of_a_noisier_correct_engine():
    even = NoiseModel("bfloat16", 0.3, 0.2, 0, (), "t")
    noisy = NoiseModel("bfloat16", 0.3, 0.2, 0, (), "t", tie_share=0.88)
    assert even.tie_test(75, 23) < ALPHA  # split-K partial sums against the bf16 reference (calibration counts)
    assert noisy.tie_test(75, 23) > ALPHA
    assert noisy.tie_test(120, 2) < ALPHA  # an engine that leaves the argmax by rule still fails


def test_the_fixture_model_names_its_provenance():
    model = load_calibration(FIXTURE_TARGET, "bfloat16")
    engines = {source.split("@")[0] for source in model.calibrated_on}
    assert {"reference", "SplitKReductions", "OnlineSoftmaxAttention"} <= engines
    assert 0 < model.longer_rate < 0.05 and 0 < model.shorter_rate < 0.05 and model.tie_share > 0.5


@dataclass(frozen=True)
class _Round:
    name: str

    def describe(self) -> str:
        return self.name


@dataclass
class _Rounds:
    rounds: int = 400
    target: list = field(default_factory=list)
    drafter: list = field(default_factory=list)
    longer: list = field(default_factory=list)
    shorter: list = field(default_factory=list)


KEPT = RoundLimits(
    confirmed_cap=3,
    ceiling=2,
    expected_near_ties=0.5,
    longer_cap=4,
    shorter_cap=5,
    lean=LeanTest(10, 5, 5, 0.0, 0.6),
    tau=TauTest(400, 0, 0.0, 0.0, 0, 0, 0.5, 0.9),
)


def _n(kind: str, n: int) -> list:
    return [_Round(f"{kind} round {i}") for i in range(n)]


@pytest.mark.parametrize(
    ("rounds", "limits", "names", "first"),
    [
        (_Rounds(target=_n("target", 3)), KEPT, "3/400 rounds excused as target near-ties, above the ceiling 2", 0),
        (_Rounds(drafter=_n("drafter", 4)), KEPT, "4/400 rounds excused as drafter near-ties, above the cap 3", 0),
        (
            _Rounds(drafter=_n("drafter", 1)),
            replace(KEPT, lean=LeanTest(40, 35, 5, 4.7, 1e-5)),
            "are excused as drafter near-ties by the engine's own drafter logits, but those logits are not blind",
            0,
        ),
        (_Rounds(longer=_n("longer", 5)), KEPT, "5/400 rounds longer than the fp32 replay", 0),
        (_Rounds(shorter=_n("shorter", 6)), KEPT, "6/400 rounds shorter than the fp32 replay", 0),
        (_Rounds(), replace(KEPT, tau=TauTest(400, 40, 0.0, 6.3, 40, 0, 0.5, 1e-9)), "beyond what low-precision", None),
        # the first limit broken names the breach: target near ties come before longer rounds
        (_Rounds(target=_n("target", 3), longer=_n("longer", 9)), KEPT, "excused as target near-ties", 0),
    ],
)
def test_a_run_breaks_the_first_limit_it_exceeds(rounds, limits, names, first):
    breach = limits.breach(rounds, "tau 3.100 vs replay 3.000")
    assert breach is not None and names in breach.message
    if first is None:
        assert breach.first is None and breach.message.endswith("tau 3.100 vs replay 3.000")
    else:
        assert breach.first.describe().endswith(f"round {first}")


def test_a_run_at_every_limit_breaks_none():
    at_caps = _Rounds(target=_n("t", 2), drafter=_n("d", 3), longer=_n("l", 4), shorter=_n("s", 5))
    assert KEPT.breach(at_caps, "tau") is None
    # leaning drafter logits cost nothing while they excuse no round
    assert replace(KEPT, lean=LeanTest(40, 35, 5, 4.7, 1e-5)).breach(_Rounds(), "tau") is None


def _log_softmax_kernels(logits):
    """Correct float32 log-softmax kernels other than torch's: float64 rounded once, the vocabulary summed in
    chunks of 4096 (a blocked reduction), and summed one token after another (the worst order)."""
    import torch

    shifted = logits - logits.max(dim=-1, keepdim=True).values
    chunked = sum(torch.exp(c).sum(-1, keepdim=True) for c in shifted.split(4096, dim=-1))
    sequential = torch.exp(shifted).cumsum(-1)[:, -1:]
    return [
        torch.log_softmax(logits.double(), dim=-1).float(),
        shifted - torch.log(chunked),
        shifted - torch.log(sequential),
    ]


@pytest.mark.parametrize("vocab", [3072, 151936])
def test_the_log_prob_slack_holds_other_log_softmax_kernels(vocab):
    """Every kernel lies within the slack of torch's float32 log-softmax on the tree's candidates (the top
    B per depth), with room to spare; and the slack is far below any gap that decides a path (1e-4 nats)."""
    import torch

    from ddtree_conformance.noise import log_prob_slack

    worst = 0.0
    for seed in range(3):
        logits = torch.randn(15, vocab, generator=torch.Generator().manual_seed(seed)) * 4 + 2
        for scaled in (logits, logits.bfloat16().float()):
            reference = torch.log_softmax(scaled, dim=-1)
            top = torch.topk(reference, 64, dim=-1).indices
            slack = log_prob_slack(scaled, 64)
            assert slack < 1e-4
            for other in _log_softmax_kernels(scaled):
                worst = max(worst, float((other - reference).gather(1, top).abs().max()) / slack)
    assert 0 < worst < 0.5, worst


def test_reported_logits_cannot_widen_the_slack_past_its_ceiling():
    """An engine reporting absurd drafter logits (candidates thousands of nats down) gets the ceiling, not a
    slack that would tie prefixes a tenth of a nat apart."""
    import torch

    from ddtree_conformance.noise import LOG_PROB_SLACK_CEILING, log_prob_slack

    absurd = torch.zeros(15, 3072)
    absurd[:, 0] = 1e6  # every other token 1e6 nats below the top one
    assert log_prob_slack(absurd, 64) == LOG_PROB_SLACK_CEILING == 1e-3
    masked = torch.full((15, 3072), float("-inf"))  # a padded vocabulary: 10 tokens live, the rest masked
    masked[:, :10] = torch.randn(15, 10, generator=torch.Generator().manual_seed(0))
    assert 0 < log_prob_slack(masked, 64) < 1e-4  # the masked tokens' -inf log-probs do not count
