"""The noise model: what low-precision arithmetic lets a *correct* engine do differently from the fp32
reference, and nothing more. Every verdict that allows a difference asks this module; nothing else
holds a tolerance rule.

A correct engine written elsewhere has its own kernels, GEMM shapes, reduction orders and batching.
In bfloat16 and float16 that moves some near ties of the target and of the drafter to the other side,
in both directions. The model says, from measurements of the reference *and* of correct engines that
round differently (:mod:`ddtree_conformance.testing.rounding_engines`), kept with their provenance in
the pair's manifest (:mod:`ddtree_conformance.calibration` derives the numbers):

* **tokens and tree nodes** (:meth:`NoiseModel.token`): a token that is not the fp32 argmax is a
  match, an fp32 tie (float32: within :data:`FP32_TIE` nats), a low-precision near tie (within the
  near-tie bound of the fp32 top-1), or outside: a wrong token. The same call serves output
  positions, verified tree nodes, the chain cross-check and replayed rounds.
* **how many near ties** (:meth:`NoiseModel.ceiling`): a correct engine flips a position of fp32
  top-2 gap ``g`` with probability at most ``p(g)`` (the measured tail of gap shrinks); summed over a
  run's positions, the Poisson ``1 - ALPHA`` quantile is the most a correct engine reaches.
* **same-dtype tie test** (:meth:`NoiseModel.tie_test`): among positions where exactly one of the
  engine and the same-dtype reference leaves the fp32 argmax, the engine's share may not be
  significantly above the largest share a correct engine shows (``tie_share``, measured: an engine
  noisier than the reference leaves more often, honestly).
* **drafter flips** (``drafter_tolerance``): drafter logits within the tolerance of the fp32
  reference's may put a path in or out of the tree; confirmed rounds (the engine's own logits show
  it) are capped by :meth:`NoiseModel.confirmed_round_cap`.
* **unconfirmed rounds, both directions** (:meth:`NoiseModel.unconfirmed_round_cap`): an engine that
  reports no drafter logits cannot show which of its rounds a drafter flip explains; a round longer
  than the fp32 replay, and one shorter, each count against the binomial quantile of the largest rate
  of such rounds any measured correct engine shows (Clopper-Pearson upper limit).
* **blind drafter logits** (:meth:`NoiseModel.lean_test`): reported drafter logits earn confirmed
  excuses only while rounding, not knowledge of the target, moved them: over the rounds that agree,
  they may not favour the token the target emits next over the token of the nearest logit
  significantly more often than they disfavour it (rounds as units).
* **tree scores** (:func:`log_prob_slack`): the spec's tree scores are float32 log-softmax values, and
  two correct log-softmax kernels (CPU and CUDA, a sampler's, a fused one) part in their last bits. In
  every dtype, float32 included, prefixes whose scores lie within the summed slack of their depths are
  ties, broken either way (:mod:`ddtree_conformance.spec.freedoms`).
* **tau** (:meth:`NoiseModel.tau_test`): over all rounds, the engine's emitted length minus the
  replay's, ``d_i``, may not be significantly above the measured per-round gain of correct engines
  (self-normalised sum; module doc of docs/reference/low-precision.md).

Float32 is exact: bound 0, ceiling 0, only fp32 ties and exact drafter ties (tolerance
:data:`FP32_DRAFTER_TOLERANCE`) may part two correct engines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

__all__ = [
    "ALPHA",
    "Breach",
    "DRAFTER_TOP",
    "FP32_DRAFTER_FLIP_RATE",
    "FP32_DRAFTER_TOLERANCE",
    "FP32_TIE",
    "LOG_PROB_SLACK_CEILING",
    "NoiseModel",
    "LeanTest",
    "TauTest",
    "TokenCall",
    "log_prob_slack",
    "upper_limit",
]

ALPHA = 1e-3  # false-alarm level of every noise-model test
FP32_DRAFTER_TOLERANCE = 1e-3  # fp32 drafter logits of two correct implementations (measured 7.6e-6 apart)
# nats: in float32 a token this close to the top-1 is a tie two correct implementations may break either way
# (a cached tree verify and the scorer's forward parted at a 1e-6 gap on the fixture; logits agree to ~1e-5)
FP32_TIE = 1e-3
FP32_DRAFTER_FLIP_RATE = 1e-3  # float32: trees flip only at exact drafter ties (1e-6 apart) across devices
DRAFTER_TOP = 64  # tokens per depth that can enter a tree, for drafter logit distances
FLOAT32_EPS = 2.0**-23  # float32's unit roundoff x 2 (torch.finfo(torch.float32).eps)
# nats per position: the most log_prob_slack allows, whatever logits an engine reports (a vocabulary of 1M
# tokens with candidates down to -1000 nats needs 7.2e-4): reported logits cannot widen the ties at will
LOG_PROB_SLACK_CEILING = 1e-3


def log_prob_slack(draft_logits, k: int) -> float:
    """How far apart two correct float32 log-softmax kernels may put one drafter log-probability of a
    tree candidate (the top ``k`` per row of ``draft_logits`` ``[L, V]``); a prefix of depth ``d`` may then
    score ``d`` times this away from the spec builder's sum.

    A kernel computes ``lp = (x - m) - log S`` with ``S = sum(exp(x - m))`` over the V tokens. ``log S``
    and the two subtractions round once each, relative to ``log S <= log V``, ``|x - m| <= |lp|`` and
    ``|lp|``. The sum's relative error grows with how it is reduced: about ``log2 V`` roundings for a
    pairwise (GPU block) reduction, about ``sqrt V`` for lanes each summing a share of the vocabulary in
    turn, which torch's float32 CPU kernel does (at V = 151936 it is 1.7e-5 from float64; the term
    below allows 4.6e-5). One kernel is then within ``eps * (2 |lp| + log V + sqrt V)`` of the exact
    value; two kernels twice that. tests/test_noise.py holds it to torch's kernel, float64 rounded once,
    a chunked and a sequential sum."""
    import torch

    logits = draft_logits.float()
    vocab = int(logits.shape[-1])
    if logits.numel() == 0:
        return 0.0
    log_probs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(log_probs, min(max(k, 1), vocab), dim=-1).values
    finite = top[torch.isfinite(top)]  # -inf: tokens a padded vocabulary masks, never in a tree
    largest = float(finite.abs().max()) if finite.numel() else 0.0
    return min(LOG_PROB_SLACK_CEILING, 2 * FLOAT32_EPS * (2 * largest + math.log(vocab) + math.sqrt(vocab)))


class TokenCall(StrEnum):
    """What the noise model says of a token against the fp32 target."""

    MATCH = "match"  # the fp32 argmax (or an exact tie with it)
    FP32_TIE = "fp32-tie"  # float32: within FP32_TIE of the top-1
    NEAR_TIE = "near-tie"  # low precision: within the near-tie bound of the top-1
    OUTSIDE = "outside"  # a wrong token


@dataclass(frozen=True)
class TauTest:
    """One-sided test that the engine's per-round acceptance is not above the replay's by more than
    the noise allows: ``d_i`` = engine length - replay length per round (:meth:`NoiseModel.tau_test`)."""

    rounds: int
    gained: int  # sum of d_i (tokens)
    allowed_per_round: float  # the measured gain per round of correct engines
    statistic: float  # the self-normalised sum
    longer: int  # rounds with d_i > 0
    shorter: int  # rounds with d_i < 0
    allowed_share: float  # the largest share of longer among differing rounds a correct engine shows
    p_value: float  # the smaller of the two tests' p-values, doubled (Bonferroni)

    @property
    def fails(self) -> bool:
        return self.p_value < ALPHA

    def as_details(self) -> dict:
        """The test as a verdict's details show it."""
        return {
            "gained": self.gained,
            "allowed_per_round": self.allowed_per_round,
            "statistic": round(self.statistic, 4),
            "longer": self.longer,
            "shorter": self.shorter,
            "allowed_share": round(self.allowed_share, 4),
            "p_value": self.p_value,
        }

    def describe(self) -> str:
        return (
            f"the engine's rounds hold {self.gained:+d} tokens against the fp32 replay over {self.rounds} rounds "
            f"(allowed {self.allowed_per_round:+.4f} a round; self-normalised sum {self.statistic:.2f}); "
            f"{self.longer} longer and {self.shorter} shorter (a correct engine's longer share is at most "
            f"{self.allowed_share:.2f}); p = {self.p_value:.2g}"
        )


@dataclass(frozen=True)
class LeanTest:
    """Whether reported drafter logits favour the token the target emits next (:meth:`NoiseModel.lean_test`)."""

    rounds: int  # rounds with a counted row
    toward: int  # rows favouring the continuation's token over the control
    away: int  # rows disfavouring it
    statistic: float  # self-normalised sum of the rounds' (toward - away), for the report
    p_value: float  # the exact sign-flip test over rounds

    @property
    def fails(self) -> bool:
        return self.p_value < ALPHA

    def as_details(self) -> dict:
        """The test as a verdict's details show it."""
        return {
            "rounds": self.rounds,
            "toward": self.toward,
            "away": self.away,
            "statistic": round(self.statistic, 4),
            "p_value": self.p_value,
        }

    def describe(self) -> str:
        return (
            f"they favour the token the target emits next over the token of the nearest logit in {self.toward} of "
            f"{self.toward + self.away} rows over {self.rounds} rounds (rounding, blind to the continuation, does "
            f"so as often as not: sign-flip test over rounds, p = {self.p_value:.2g})"
        )


class Described(Protocol):
    """A round verdict as the limits read it: one line naming the round and both sides' lengths."""

    def describe(self) -> str: ...


class ExcusedRounds(Protocol):
    """One run's replayed rounds as the limits read them: how many, and the excused ones of each kind
    (first first; :class:`ddtree_conformance.replay.ReplayRun`)."""

    rounds: int
    target: Sequence[Described]  # excused as target near ties
    drafter: Sequence[Described]  # excused as drafter near ties, confirmed by the engine's logits
    longer: Sequence[Described]  # longer than the replay, unconfirmed
    shorter: Sequence[Described]  # shorter than the replay, unconfirmed


@dataclass(frozen=True)
class Breach:
    """The first limit a run's rounds break: what and by how much (``message``), and the first round
    behind it (None for the tau test, which no single round breaks)."""

    message: str
    first: Described | None = None


@dataclass(frozen=True)
class RoundLimits:
    """Everything the noise model allows one run's replayed rounds (:meth:`NoiseModel.round_limits`), and
    the judgement of a run against it (:meth:`breach`; a passing run's excused rounds: :meth:`excused`): a
    new limit is a field, its value in :meth:`NoiseModel.round_limits` and its line in :meth:`breach`, all
    here."""

    confirmed_cap: int  # most rounds excused as drafter near ties on the engine's own logits
    ceiling: int  # most rounds excused as target near ties at the output's top-2 gaps
    expected_near_ties: float  # the expected count behind the ceiling
    longer_cap: int  # most unconfirmed rounds longer than the replay
    shorter_cap: int  # ... and shorter
    lean: LeanTest  # whether reported drafter logits lean toward the target's continuation
    tau: TauTest  # whether the engine accepts more than the replay beyond the noise

    def breach(self, run: ExcusedRounds, tau: str) -> Breach | None:
        """The first limit ``run`` breaks, in this order: more rounds excused as target near ties than the
        ceiling a correct engine reaches at the output's top-2 gaps; more excused as (confirmed) drafter near
        ties than the cap; drafter logits that earn those excuses while leaning toward the target; more
        unconfirmed rounds of one direction (longer, then shorter) than their cap; the tau test. None when
        ``run`` keeps every limit. ``tau`` ("tau X vs replay Y") ends the messages that quote it."""
        n = run.rounds
        if len(run.target) > self.ceiling:
            return Breach(
                f"{len(run.target)}/{n} rounds excused as target near-ties, above the ceiling {self.ceiling} "
                f"a correct engine reaches at these gaps (expected <= {self.expected_near_ties:.1f}); first: "
                f"{run.target[0].describe()}",
                run.target[0],
            )
        if len(run.drafter) > self.confirmed_cap:
            return Breach(
                f"{len(run.drafter)}/{n} rounds excused as drafter near-ties, above the cap "
                f"{self.confirmed_cap} a correct engine reaches ({run.drafter[0].describe()}); {tau}",
                run.drafter[0],
            )
        if run.drafter and self.lean.fails:
            return Breach(
                f"{len(run.drafter)}/{n} rounds are excused as drafter near-ties by the engine's own drafter "
                f"logits, but those logits are not blind to the target: on the rounds that agree with the replay "
                f"{self.lean.describe()}; drafter logits moved toward the target's continuation earn no excuse; "
                f"{tau}",
                run.drafter[0],
            )
        for side, rounds, cap in (("longer", run.longer, self.longer_cap), ("shorter", run.shorter, self.shorter_cap)):
            if len(rounds) > cap:
                return Breach(
                    f"{len(rounds)}/{n} rounds {side} than the fp32 replay where only a drafter near tie "
                    f"could explain it and the engine gives no drafter logits to confirm one, above the cap "
                    f"{cap} a correct engine reaches ({rounds[0].describe()}); {tau} "
                    "(report drafter logits in traces to have drafter near ties confirmed)",
                    rounds[0],
                )
        if self.tau.fails:
            return Breach(
                f"the engine accepts more than the fp32 reference on its own contexts beyond what low-precision "
                f"noise allows: {self.tau.describe()}; {tau}"
            )
        return None

    def excused(self, run: ExcusedRounds) -> str:
        """A passing message's account of ``run``'s excused rounds with their caps ("": none excused)."""
        if not (run.target or run.drafter or run.longer or run.shorter):
            return ""
        unconfirmed = (
            f" and {len(run.longer)} longer (cap {self.longer_cap}) and {len(run.shorter)} shorter (cap "
            f"{self.shorter_cap}) unconfirmed rounds"
            if run.longer or run.shorter
            else ""
        )
        return (
            f" except {len(run.target)} target near-tie and {len(run.drafter)} drafter near-tie rounds "
            f"(cap {self.confirmed_cap})" + unconfirmed
        )


@dataclass(frozen=True)
class NoiseModel:
    """The derived values for one dtype (module doc; :mod:`ddtree_conformance.calibration` builds it)."""

    dtype: str
    bound: float  # near-tie bound, nats
    drafter_tolerance: float  # logits
    positions: int  # calibration positions behind the tail counts (0: uncalibrated)
    tail: tuple[tuple[float, int], ...]  # (threshold, count of shrinks >= threshold), ascending thresholds
    source: str
    drafter_flip_rate: float = 0.0  # upper limit of the share of rounds a correct engine's tree flips (confirmed)
    drafter_flip_measured: float = 0.0  # the measured share itself
    longer_rate: float = 0.0  # upper limit: share of rounds longer than the fp32 replay, drafter side only
    shorter_rate: float = 0.0  # upper limit: share of rounds shorter than the fp32 replay, drafter side only
    gain_per_round: float = 0.0  # upper limit of a correct engine's mean (engine - replay) length per round
    tie_share: float = 0.5  # upper limit of a correct engine's engine-only share in the same-dtype tie test
    longer_share: float = 0.5  # upper limit of the share of longer rounds among a correct engine's flips
    calibrated_on: tuple[str, ...] = ()  # provenance: engines and devices measured

    @property
    def exact(self) -> bool:
        return self.dtype == "float32"

    # -- tokens and nodes ----------------------------------------------------------------------------
    def fp32_tie(self, gap: float) -> bool:
        """float32 only: a token within :data:`FP32_TIE` of the top-1 (a tie, not a wrong token)."""
        return self.exact and gap <= FP32_TIE

    def token(self, gap: float, *gaps: float) -> TokenCall:
        """The call on a token ``gap`` nats below the fp32 top-1 (0: the argmax). Further ``gaps`` are
        the same token's gaps on other fp32 evidence (a replayed tree node): every one must agree."""
        every = (gap, *gaps)
        if all(g == 0.0 for g in every):
            return TokenCall.MATCH
        if all(self.fp32_tie(g) for g in every):
            return TokenCall.FP32_TIE
        if not self.exact and all(g <= self.bound for g in every):
            return TokenCall.NEAR_TIE
        return TokenCall.OUTSIDE

    def flip_probability(self, gap: float) -> float:
        """``p_hi(g)``: upper limit of the chance that a correct engine flips a position of fp32 top-2 gap ``g``."""
        return float(self.flip_probabilities([gap])[0])

    def flip_probabilities(self, gaps):
        """:meth:`flip_probability` of many gaps at once (numpy array)."""
        import numpy as np

        gaps = np.asarray(gaps, dtype=float)
        if self.exact:
            return np.zeros_like(gaps)
        if not self.positions:  # uncalibrated: shifts uniform on [0, bound / 2]
            return np.clip(1.0 - gaps / self.bound, 0.0, 1.0) if self.bound > 0 else np.zeros_like(gaps)
        # Past the last grid threshold the last count holds (the grid ends above any admissible shift).
        thresholds = np.array([t for t, _ in self.tail])
        limits = np.array([1.0] + [upper_limit(k, self.positions) for _, k in self.tail])
        index = np.searchsorted(thresholds, gaps / 2, side="right")  # entries with threshold <= g / 2
        return limits[index]

    def ceiling(self, gaps: Sequence[float]) -> tuple[int, float]:
        """Most near-tie positions a correct engine shows over positions with fp32 top-2 ``gaps``,
        and the expected count ``mu`` behind it."""
        if self.exact or len(gaps) == 0:
            return 0, 0.0
        from scipy.stats import poisson

        mu = float(self.flip_probabilities(gaps).sum())
        return (int(poisson.ppf(1 - ALPHA, mu)) if mu > 0 else 0), mu

    def tie_test(self, engine_only: int, reference_only: int) -> float:
        """p-value that the engine leaves the fp32 argmax where the same-dtype reference keeps it more
        often than a correct engine does (exact binomial, one-sided, at ``tie_share``)."""
        from scipy.stats import binomtest

        discordant = engine_only + reference_only
        if not discordant:
            return 1.0
        share = min(max(self.tie_share, 0.5), 1.0 - 1e-9)
        return float(binomtest(engine_only, discordant, share, alternative="greater").pvalue)

    # -- rounds --------------------------------------------------------------------------------------
    def confirmed_round_cap(self, rounds: int) -> int:
        """Most rounds a correct engine's own drafter logits show flipped in ``rounds`` rounds."""
        return _quantile(rounds, FP32_DRAFTER_FLIP_RATE if self.exact else self.drafter_flip_rate)

    def unconfirmed_round_cap(self, rounds: int, longer: bool) -> int:
        """Most rounds longer (``longer``) or shorter than the fp32 replay on the drafter side that a
        correct engine without drafter logits shows in ``rounds`` rounds."""
        rate = FP32_DRAFTER_FLIP_RATE if self.exact else (self.longer_rate if longer else self.shorter_rate)
        return _quantile(rounds, rate)

    def lean_test(self, rounds: Sequence[tuple[int, int]]) -> LeanTest:
        """One-sided test that reported drafter logits favour the target's continuation: per round, the
        rows that favour it minus the rows that disfavour it (``rounds``: (toward, away) per round,
        :func:`~ddtree_conformance.drafter_excuse.continuation_lean`). Rounding is blind to the
        continuation, so each round's score is symmetric about 0; the rows of one round share its context
        and its rounding, so the round is the unit: the exact sign-flip test, the share of the 2^n ways to
        give the n rounds' scores their signs whose sum reaches the observed one, whatever the rows'
        dependence within a round (:func:`_sign_flip_p`)."""
        scores = [toward - away for toward, away in rounds]
        squares = sum(x * x for x in scores)
        statistic = sum(scores) / math.sqrt(squares) if squares else 0.0
        toward, away = sum(r[0] for r in rounds), sum(r[1] for r in rounds)
        return LeanTest(len(rounds), toward, away, statistic, _sign_flip_p(scores))

    def tau_test(self, differences: Sequence[int]) -> TauTest:
        """One-sided test on ``d_i`` (engine - replay emitted length, every round whose tokens agree):
        does the engine accept more than the replay beyond the noise? Two tests, each one-sided, the
        smaller p-value doubled:

        * magnitude: the self-normalised sum ``t = sum(x) / sqrt(sum(x^2))`` of ``x_i = d_i - gain``
          (``gain``: the largest measured mean gain a round of a correct engine); for independent rounds
          symmetric about the allowed gain ``P(t >= z) <= exp(-z^2 / 2)`` (Efron 1969), whatever the
          distribution of ``d``;
        * direction: among the rounds that differ, the share of longer ones above ``longer_share``
          (exact binomial), the largest share correct engines show. It keeps its power where a few long
          shorter rounds would drown a run of one-token gains in the sum."""
        from scipy.stats import binomtest

        gain = 0.0 if self.exact else max(self.gain_per_round, 0.0)
        centred = [d - gain for d in differences]
        total, squares = sum(centred), sum(x * x for x in centred)
        statistic = total / math.sqrt(squares) if squares > 0 else 0.0
        p_sum = math.exp(-(statistic**2) / 2) if statistic > 0 else 1.0
        longer, shorter = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
        share = min(max(self.longer_share, 0.5), 1.0 - 1e-9)
        p_sign = binomtest(longer, longer + shorter, share, alternative="greater").pvalue if longer else 1.0
        p = min(1.0, 2 * min(p_sum, float(p_sign)))
        return TauTest(len(differences), int(sum(differences)), gain, statistic, longer, shorter, share, p)

    def round_limits(
        self, rounds: int, top2: Sequence[float], lean: Sequence[tuple[int, int]], differences: Sequence[int]
    ) -> RoundLimits:
        """Every limit on one run's ``rounds`` at once: the caps on excused rounds, the target near-tie ceiling
        at the output's ``top2`` gaps, the drafter-lean test on ``lean`` and the tau test on ``differences``
        (each method's doc says how)."""
        ceiling, mu = self.ceiling(top2)
        return RoundLimits(
            confirmed_cap=self.confirmed_round_cap(rounds),
            ceiling=ceiling,
            expected_near_ties=mu,
            longer_cap=self.unconfirmed_round_cap(rounds, True),
            shorter_cap=self.unconfirmed_round_cap(rounds, False),
            lean=self.lean_test(lean),
            tau=self.tau_test(differences),
        )

    def describe(self) -> str:
        if self.exact:
            return "float32: exact"
        return (
            f"{self.dtype} bound {self.bound:.3g} nats, drafter tolerance {self.drafter_tolerance:.3g} ({self.source})"
        )


def _sign_flip_p(scores: Sequence[int]) -> float:
    """``P(sum(e_i |x_i|) >= sum(x_i))`` over independent fair signs ``e_i``: the exact one-sided
    randomisation p-value of integer scores symmetric about 0 under the null. The sum with signs is
    ``2 T - A`` for ``T`` the sum of the scores given a plus sign and ``A`` of all their sizes, so the
    distribution of ``T`` (a subset sum, built one score at a time) gives it exactly."""
    import numpy as np

    sizes = [abs(int(x)) for x in scores if x]
    observed = sum(int(x) for x in scores)
    if observed <= 0:
        return 1.0
    total = sum(sizes)
    dist = np.zeros(total + 1)
    dist[0] = 1.0
    reach = 0
    for size in sizes:
        reach += size
        dist[size : reach + 1] = 0.5 * dist[size : reach + 1] + 0.5 * dist[: reach + 1 - size]
        dist[:size] *= 0.5
    least = math.ceil((observed + total) / 2)  # T with 2 T - A >= observed
    return float(min(1.0, dist[least:].sum()))


def _quantile(rounds: int, rate: float) -> int:
    from scipy.stats import binom

    return int(binom.ppf(1 - ALPHA, rounds, min(1.0, max(rate, 0.0)))) if rounds else 0


@lru_cache(maxsize=4096)
def upper_limit(count: int, total: int) -> float:
    """One-sided Clopper-Pearson upper limit (confidence 1 - ALPHA) of ``count / total``."""
    from scipy.stats import beta

    return 1.0 if count >= total else float(beta.ppf(1 - ALPHA, count + 1, total - count))
