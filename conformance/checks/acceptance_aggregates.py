"""Aggregate acceptance (the acceptance check's path for engines that report only aggregates).

Per-prompt mean tau and acceptance at depths 1-4 against the fp32 reference's on the engine's own outputs
(:func:`paced_references`: the reference paces the rounds along them), or the golden file's, each as the
paired bootstrap band of the per-prompt difference (:func:`~ddtree_conformance.metrics.paired_band`,
Bonferroni over the comparisons at the noise model's ``ALPHA``), judged by **equivalence**:

* a correct engine that rounds differently does not share the reference's aggregates in bf16 or fp16: its
  rounding moves some rounds' lengths both ways, and not always evenly (against the bf16 reference's own
  runs, split-K reductions accepted 0.80 at depth 2 where the reference accepted 0.75 on 20 prompts, a band
  clear of 0). So no difference is not the test; a margin is: :data:`TAU_MARGIN` of the reference's tau,
  :data:`DEPTH_MARGIN` on each depth's rate, which every correct engine of ``testing/rounding_engines.py``
  keeps (``scripts/aggregate_bands.py``);
* near the output's end a correct engine may cut its drafter's block, cap its tree at the depth the output
  can still emit, and count its last round as walked or as emitted (docs/reference/freedoms.md); aggregates
  do not say which, so the reference is paced each way (:func:`paced_references`) and the engine is held
  to every one: it passes against the one it is within, and fails only beyond them all (one way for all
  its prompts, so a deficit cannot hide at a different end on different prompts);
* **fail** when a band lies wholly beyond its margin (the engine accepts less, or reports more, than any
  correct one); in float32 when it lies wholly off 0, as every correct engine's band is [0, 0] there (the
  eight rounding engines at 20 prompts, B = 16 and 64);
* **pass** when every band at :data:`VOUCH_ALPHA` lies within its margin (an engine whose true difference
  lies beyond the margin passes at most that often; a failure needs the noise model's far stricter level);
* otherwise the aggregates **cannot vouch** (a skip, cause ``engine``: the run is incomplete): the band
  holds a deficit as large as the margin, as a band over a few prompts does. The message says about how
  many prompts would decide it. Before the margin, a band that held 0 passed however wide it was: over 7
  prompts a feedback bug at tau 2.924 against 3.926 passed with the band [-1.912, 0.035].

Aggregates pooled over a whole batch (one value for every request, no per-request rounds) have no
per-prompt spread: their pooled tau is held to 2 % of the reference's pooled tau, acceptance at depths 1-4
to 2 points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ddtree_conformance.adapters.interface import RequestResult
from ddtree_conformance.adapters.reference.replay import EndFreedoms, paced_lengths, replay_result

from ..metrics import mean_tau, paired_band, per_position_acceptance
from ..noise import ALPHA
from ..option_names import option
from .result import CheckResult

__all__ = [
    "DEPTH_MARGIN",
    "MIN_BAND_PROMPTS",
    "POOLED_POSITION_ABS_TOL",
    "POOLED_TAU_REL_TOL",
    "TAU_MARGIN",
    "VOUCH_ALPHA",
    "judge_aggregates",
]

MIN_BAND_PROMPTS = 5  # a bootstrap band over fewer prompts says nothing
# The equivalence margins: how far a correct engine that rounds differently may sit from the fp32 reference
# paced on its outputs (scripts/aggregate_bands.py, docs/reference/low-precision.md)
# (on the fixture pair, the eight engines x bf16, fp16 x 3 run seeds x B = 16, 64, 95 % bands: at 20 prompts
# the widest reached 2.2 % of tau and 0.035 on a depth's rate, at 40 prompts 2.0 % and 0.026;
# scripts/measurements/2026-12-04e-aggregate-bands)
TAU_MARGIN = 0.03  # mean tau: 3 % of the reference's
DEPTH_MARGIN = 0.05  # acceptance rate at depths 1-4: 0.05 absolute
# To fail, a band at the noise model's ALPHA must clear the margin (a correct engine is failed at most that
# often); to pass, the band at VOUCH_ALPHA must lie within it (an engine whose true difference lies beyond
# the margin passes at most that often): the two risks of an equivalence test, each at its own level.
VOUCH_ALPHA = 0.05
POOLED_TAU_REL_TOL = 0.02  # batch-pooled aggregates: tau within 2 % of the reference's pooled tau
POOLED_POSITION_ABS_TOL = 0.02  # ... and acceptance at depths 1-4 within 2 points


NO_ACCEPTANCE = "engine reports neither per-round nor aggregate acceptance"


def reports_aggregates(results: list[RequestResult]) -> bool:
    """Whether any result carries an aggregate acceptance (its mean acceptance or tau)."""
    return any(r.mean_acceptance is not None or r.tau is not None for r in results)


@dataclass(frozen=True)
class ReferenceAcceptance:
    """The reference's per-prompt rounds that a correct engine's aggregates may equal, and their name."""

    results: list[RequestResult]
    what: str
    last_round: str = "walked"  # how its last rounds are counted: "walked" (past the output's end) or "emitted"


# How a correct engine may draft, build and count its rounds near the output's end (docs/reference/freedoms.md);
# an engine that reports aggregates does not say which it does, so the reference is paced each way
END_FREEDOMS = (
    EndFreedoms(),
    EndFreedoms(short_block=True),
    EndFreedoms(depth_below_room=1),
    EndFreedoms(depth_below_room=0),
    EndFreedoms(short_block=True, depth_below_room=1),
)


def paced_references(session, run, results: list[RequestResult], requests=None) -> list[ReferenceAcceptance]:
    """The fp32 reference's rounds on each engine output, paced by the reference itself (an engine that
    reports aggregates gives no round boundaries): each round as long as the reference's tree holds the
    output's next tokens (:func:`~ddtree_conformance.adapters.reference.replay.replay_result` without
    lengths). The comparison stays paired on the engine's own context however far its output parts from
    the reference's own run, which in bf16 it does at the first flipped near tie.

    Near the output's end the spec leaves an engine free to cut its drafter's block to the room left, to cap
    its tree at the depth the output can still emit, and to count the last round as walked or as emitted
    (docs/reference/freedoms.md). Aggregates do not say which, so the reference is paced under each of
    :data:`END_FREEDOMS`, each counted both ways: in fp32 a correct engine's aggregates equal one of these
    exactly, on every prompt. Identical ones are given once; the spec's, walked, comes first. ``requests``:
    those of ``results`` (default: the plan's)."""
    s = session.settings
    reference = session.engines.reference_for(s.model_dir, s.drafter_dir)
    requests = session.requests() if requests is None else requests
    found: dict[tuple, ReferenceAcceptance] = {}
    for end in END_FREEDOMS:
        replays = []
        for request, result in zip(requests, results):
            output = list(result.output_ids)
            rounds = replay_result(reference, request, output, None, run.mode, run.budget or 1, s.device, end=end)
            replays.append((result, output, rounds))
        for walked in (True, False):
            paced = [
                RequestResult(
                    output_ids=output,
                    finish_reason=result.finish_reason,
                    acceptance_lengths=paced_lengths(rounds, output, walked) or None,
                )
                for result, output, rounds in replays
            ]
            key = tuple(tuple(r.acceptance_lengths or ()) for r in paced)
            counted = "walked" if walked else "emitted"
            found.setdefault(
                key,
                ReferenceAcceptance(
                    paced,
                    "the fp32 reference paced on the engine's outputs"
                    + ("" if end == EndFreedoms() and walked else f" ({end.describe()}; the last round {counted})"),
                    counted,
                ),
            )
    return list(found.values())


def judge_aggregates(
    name: str, results: list[RequestResult], references: Sequence[ReferenceAcceptance], exact: bool = False
) -> CheckResult:
    """Per-prompt mean tau (and acceptance at depths 1-4) against each of ``references`` (the ways a correct
    engine may count its rounds) by equivalence (module doc): fail when against every one a band lies wholly
    beyond its margin, pass when against one every band lies within it, else the aggregates cannot vouch
    at this many prompts (a skip: the run is incomplete). ``exact`` (a float32 run): a band wholly off 0
    fails, whatever the margin; every correct engine's band is [0, 0] there against one of them."""
    index = [i for i, r in enumerate(results) if _aggregate(r) is not None]
    if not index:
        return CheckResult.skipped(name, NO_ACCEPTANCE)
    mine = [_aggregate(results[i]) for i in index]
    if len(index) > 1 and len(set(mine)) == 1 and all(r.rounds is None for r in results):
        return _judge_pooled_any(name, results, references, mine[0])
    references = _as_counted(results, references)
    judged = [_Judged.of(results, index, ref, len(references), exact) for ref in references]
    if len(index) < MIN_BAND_PROMPTS and not any(j.equal for j in judged):
        j = judged[0]
        return CheckResult.skipped(
            name,
            f"aggregate tau {j.tau:.3f} vs {j.what} {j.ref_tau:.3f} on {len(index)} prompts: "
            f"the bootstrap band needs at least {MIN_BAND_PROMPTS} (raise {option('limit')})",
        )
    if exact and len(index) >= MIN_BAND_PROMPTS:
        # float32: a correct engine's aggregates equal its way of counting prompt by prompt (every correct engine
        # of both catalogues does, on every prompt); a way it equals on fewer than half its prompts is not its way
        theirs = [j for j in judged if 2 * j.equal_prompts >= j.prompts]
        if not theirs and any(j.equivalence != "beyond" for j in judged):
            return max(judged, key=lambda j: j.equal_prompts).equals_none(name)
        judged = theirs or judged
    by_call = {call: [j for j in judged if j.equivalence == call] for call in ("within", "undecided", "beyond")}
    # against the way of counting the engine's aggregates sit nearest among those that decide the verdict
    if by_call["within"]:
        return min(by_call["within"], key=_Judged.distance).passed(name)
    if by_call["undecided"]:
        return min(by_call["undecided"], key=_Judged.distance).cannot_vouch(name)
    return min(judged, key=_Judged.distance).failed(name)


def _as_counted(results: list[RequestResult], references: Sequence[ReferenceAcceptance]) -> list[ReferenceAcceptance]:
    """The references that count the last round as the engine does, where its own numbers say so: an engine
    that reports its rounds with its mean acceptance gives the tokens it counted, and more than its output
    holds (past the prefill token) means it counts its last rounds as walked, past the output's end; the
    ways that count them as emitted then go. Otherwise every way stays."""
    counted = [
        (_aggregate(r) or 0.0) * r.rounds - (len(r.output_ids) - 1)
        for r in results
        if r.rounds and _aggregate(r) is not None and r.output_ids
    ]
    walked = [ref for ref in references if ref.last_round == "walked"]
    if walked and any(extra > 0.5 for extra in counted):
        return walked
    return list(references)


def _aggregate(result: RequestResult) -> float | None:
    return result.mean_acceptance if result.mean_acceptance is not None else result.tau


@dataclass(frozen=True)
class _Judged:
    """The engine's aggregates against one reference: the comparisons, their bands at the level that fails
    (the noise model's ``ALPHA``) and at the level that vouches (``VOUCH_ALPHA``, Bonferroni over the
    references too: the engine passes against any one of them), and what they decide."""

    what: str
    comparisons: list[_Comparison]
    bands: list[tuple[float, float]]
    vouch: list[tuple[float, float]]
    limit: list[float]  # how far a band must clear 0 to fail
    exact: bool
    references: int

    @classmethod
    def of(cls, results, index, reference: ReferenceAcceptance, references: int, exact: bool) -> _Judged:
        ref = [reference.results[i] for i in index]
        mine = [_aggregate(results[i]) for i in index]
        theirs = [r.tau or 0.0 for r in ref]
        ref_tau = sum(theirs) / len(theirs)
        comparisons = [_Comparison("mean tau", mine, theirs, TAU_MARGIN * ref_tau, f"{TAU_MARGIN:.0%} of its tau")]
        got_pos = [results[i].per_position_acceptance for i in index]
        if all(got_pos):
            depth = min(4, min(len(p) for p in got_pos))
            ref_pos = [per_position_acceptance([r.acceptance_lengths or []], depth) for r in ref]
            for d in range(depth):
                a = [p[d] for p in got_pos]
                b = [p[d] if d < len(p) else 0.0 for p in ref_pos]
                comparisons.append(
                    _Comparison(f"acceptance at depth {d + 1}", a, b, DEPTH_MARGIN, f"{DEPTH_MARGIN} absolute")
                )
        k = len(comparisons)
        return cls(
            what=reference.what,
            comparisons=comparisons,
            bands=[c.band(ALPHA / k) for c in comparisons],
            vouch=[c.band(VOUCH_ALPHA / (k * references)) for c in comparisons],
            limit=[0.0 if exact else c.margin for c in comparisons],
            exact=exact,
            references=references,
        )

    @property
    def tau(self) -> float:
        return _Comparison.mean(self.comparisons[0].values)

    @property
    def ref_tau(self) -> float:
        return _Comparison.mean(self.comparisons[0].reference)

    def distance(self) -> float:
        """How far the bands reach from 0, in margins (0: the aggregates equal this reference's)."""
        return sum(max(abs(low), abs(high)) / c.margin for c, (low, high) in zip(self.comparisons, self.vouch))

    @property
    def equal(self) -> bool:
        return all(c.values == c.reference for c in self.comparisons)

    @property
    def equal_prompts(self) -> int:
        """Prompts whose every aggregate equals this reference's."""
        rows = zip(*[zip(c.values, c.reference) for c in self.comparisons])
        return sum(all(a == b for a, b in row) for row in rows)

    def equals_none(self, name: str) -> CheckResult:
        """float32: the failure of aggregates that equal no way of counting on even half the prompts."""
        return CheckResult.failed(
            name,
            f"mean tau {self.tau:.3f} vs {self.what} {self.ref_tau:.3f}: in float32 a correct engine's aggregates "
            f"equal one way of counting the rounds on every prompt; the nearest, this one, is equalled on "
            f"{self.equal_prompts} of {self.prompts} prompts"
            + ("" if self.references == 1 else f" (and each of the other {self.references - 1} on fewer than half)"),
            **{**self.details(), "equivalence": "beyond", "equal_prompts": self.equal_prompts},
        )

    @property
    def prompts(self) -> int:
        return len(self.comparisons[0].values)

    @property
    def beyond(self) -> list[int]:
        return [i for i, (m, (low, high)) in enumerate(zip(self.limit, self.bands)) if high < -m or low > m]

    @property
    def wide(self) -> list[int]:
        return [
            i
            for i, (c, (low, high)) in enumerate(zip(self.comparisons, self.vouch))
            if low < -c.margin or high > c.margin
        ]

    @property
    def equivalence(self) -> str:
        return "beyond" if self.beyond else "within" if not self.wide else "undecided"

    def details(self) -> dict:
        k = len(self.comparisons)
        return {
            "tau": self.tau,
            "reference_tau": self.ref_tau,
            "reference": self.what,
            "references": self.references,
            "prompts": self.prompts,
            "band": list(self.vouch[0]),
            "margins": [c.margin for c in self.comparisons],
            "bands": {c.what: list(b) for c, b in zip(self.comparisons, self.vouch)},
            "fail_bands": {c.what: list(b) for c, b in zip(self.comparisons, self.bands)},
            "confidence": 1 - VOUCH_ALPHA / (k * self.references),
            "fail_confidence": 1 - ALPHA / k,
            "equivalence": self.equivalence,
        }

    def _every(self) -> str:
        if self.references == 1:
            return ""
        others = self.references - 1
        return (
            f", and so against every other way ({others}) a correct engine may count its rounds near the output's end"
        )

    def failed(self, name: str) -> CheckResult:
        i = self.beyond[0]
        c, (low, high) = self.comparisons[i], self.bands[i]
        side = "short of" if high < 0 else "above"
        beyond_what = (
            "in float32, where every correct engine's aggregates equal the reference's"
            if self.exact
            else f"by more than the margin {c.margin:.3f} ({c.margin_words}), which correct engines that round "
            "differently stay within"
        )
        return CheckResult.failed(
            name,
            f"{c.what} {c.mean(c.values):.3f} vs {self.what} {c.mean(c.reference):.3f}: the per-prompt difference's "
            f"{1 - ALPHA / len(self.comparisons):.4%} bootstrap band [{low:.3f}, {high:.3f}] over {self.prompts} "
            f"prompts lies wholly {side} the reference's {beyond_what}{self._every()}",
            **self.details(),
        )

    def cannot_vouch(self, name: str) -> CheckResult:
        i = self.wide[0]
        c, (low, high) = self.comparisons[i], self.vouch[i]
        confidence = 1 - VOUCH_ALPHA / (len(self.comparisons) * self.references)
        return CheckResult(
            check=name,
            status="skip",
            cause="engine",
            message=f"{c.what} {c.mean(c.values):.3f} vs {self.what} {c.mean(c.reference):.3f}: the per-prompt "
            f"difference's {confidence:.2%} band [{low:.3f}, {high:.3f}] over {self.prompts} prompts reaches past "
            f"the margin +/-{c.margin:.3f} ({c.margin_words}): aggregates over so few prompts cannot vouch for "
            f"this engine's acceptance{_prompts_needed(self.prompts, low, high, c.margin)}",
            details=self.details(),
        )

    def passed(self, name: str) -> CheckResult:
        (low, high), margin = self.vouch[0], self.comparisons[0].margin
        return CheckResult.passed(
            name,
            f"aggregate tau {self.tau:.3f} vs {self.what} {self.ref_tau:.3f}: difference band [{low:.3f}, "
            f"{high:.3f}] over {self.prompts} prompts within the margin +/-{margin:.3f} ({TAU_MARGIN:.0%}), "
            f"acceptance at depths 1-{len(self.comparisons) - 1} within +/-{DEPTH_MARGIN}",
            **self.details(),
        )


@dataclass(frozen=True)
class _Comparison:
    """One aggregate against the reference's, prompt by prompt, and the margin a correct engine keeps."""

    what: str
    values: list[float]
    reference: list[float]
    margin: float
    margin_words: str

    @staticmethod
    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    def band(self, alpha: float) -> tuple[float, float]:
        return paired_band(self.values, self.reference, alpha)


def _prompts_needed(prompts: int, low: float, high: float, margin: float) -> str:
    """About how many prompts would bring a band of this centre and spread wholly within the margin or wholly
    beyond it (the band's half-width shrinks as one over the square root of the prompts)."""
    centre, half = (low + high) / 2, (high - low) / 2
    room = abs(margin - abs(centre))
    if room < 1e-9:
        return "; its centre sits on the margin, so more prompts would not decide it: per-round acceptance would"
    needed = math.ceil(prompts * (half / room) ** 2)
    if needed > 20 * prompts:
        return (
            f"; its centre sits near the margin, so only many more prompts (about {needed}, now {prompts}) would "
            "decide it: report per-round acceptance"
        )
    return (
        f"; about {needed} prompts would decide it (now {prompts}: raise {option('limit')}), "
        "or report per-round acceptance"
    )


def _judge_pooled_any(
    name: str, results: list[RequestResult], references: Sequence[ReferenceAcceptance], tau: float
) -> CheckResult:
    """Batch-pooled aggregates against each way a correct engine may count its rounds: a pass against any
    one of them, else the first one's failure."""
    index = [i for i, r in enumerate(results) if _aggregate(r) is not None]
    verdicts = [_judge_pooled(name, results, [ref.results[i] for i in index], tau, ref.what) for ref in references]
    return next((v for v in verdicts if v.status == "pass"), verdicts[0])


def _judge_pooled(
    name: str, results: list[RequestResult], reference: list[RequestResult], tau: float, what: str
) -> CheckResult:
    """Batch-pooled aggregates (one value for the whole batch, no per-request rounds, as vLLM's
    speculative-decoding counters give): no per-prompt difference exists to bootstrap, so the pooled
    tau (all committed tokens over all rounds) is compared with the reference's pooled tau within
    :data:`POOLED_TAU_REL_TOL`, and acceptance at depths 1-4 within :data:`POOLED_POSITION_ABS_TOL`."""
    ref_lengths = [ref.acceptance_lengths or [] for ref in reference]
    ref_tau = mean_tau(ref_lengths)
    rel = abs(tau - ref_tau) / ref_tau if ref_tau else float("inf")
    if rel > POOLED_TAU_REL_TOL:
        return CheckResult.failed(
            name,
            f"batch-pooled tau {tau:.3f} vs {what} {ref_tau:.3f}: {rel:.1%} apart, more "
            f"than {POOLED_TAU_REL_TOL:.0%} (lossless but slower: drafter positions, "
            "feedback rows, RoPE or budget?)",
            tau=tau,
            reference_tau=ref_tau,
        )
    got = results[0].per_position_acceptance
    if got:
        depth = min(4, len(got))
        expected = per_position_acceptance(ref_lengths, depth)
        for d in range(depth):
            want = expected[d] if d < len(expected) else 0.0
            if abs(got[d] - want) > POOLED_POSITION_ABS_TOL:
                return CheckResult.failed(
                    name,
                    f"batch-pooled acceptance at depth {d + 1}: {got[d]:.3f} vs {what} "
                    f"{want:.3f}, more than {POOLED_POSITION_ABS_TOL} apart",
                )
    return CheckResult.passed(
        name,
        f"batch-pooled tau {tau:.3f} vs {what} {ref_tau:.3f} ({rel:.1%} apart, within "
        f"{POOLED_TAU_REL_TOL:.0%}; pooled aggregates give no per-prompt band)",
        tau=tau,
        reference_tau=ref_tau,
    )
