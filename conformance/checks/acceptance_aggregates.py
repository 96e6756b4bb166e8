"""Aggregate acceptance (the acceptance check's path for engines that report only aggregates).

Per-prompt mean tau and acceptance at depths 1-4 against the fp32 reference's on the engine's own outputs
(:func:`paced_replays`: the reference paces the rounds along them), or the golden file's, each as the
paired bootstrap band of the per-prompt difference (:func:`~ddtree_conformance.metrics.paired_band`,
Bonferroni over the comparisons at the noise model's ``ALPHA``), judged by **equivalence**:

* a correct engine that rounds differently does not share the reference's aggregates in bf16 or fp16: its
  rounding moves some rounds' lengths both ways, and not always evenly (against the bf16 reference's own
  runs, split-K reductions accepted 0.80 at depth 2 where the reference accepted 0.75 on 20 prompts, a band
  clear of 0). So no difference is not the test; a margin is: :data:`TAU_MARGIN` of the reference's tau,
  :data:`DEPTH_MARGIN` on each depth's rate, which every correct engine of ``testing/rounding_engines.py``
  keeps (``scripts/aggregate_bands.py``);
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
from dataclasses import dataclass

from ddtree_conformance.adapters.interface import RequestResult

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


def paced_replays(session, run, results: list[RequestResult]) -> tuple[list[RequestResult], str]:
    """The fp32 reference's rounds on each engine output, paced by the reference itself (an engine that
    reports aggregates gives no round boundaries): each round as long as the reference's tree holds the
    output's next tokens (:func:`~ddtree_conformance.adapters.reference.replay.replay_result` without
    lengths). The comparison stays paired on the engine's own context however far its output parts from
    the reference's own run, which in bf16 it does at the first flipped near tie; in fp32 a correct
    engine's aggregates equal these exactly. Returns the results to compare with and their name."""
    from ddtree_conformance.adapters.reference.replay import paced_lengths, replay_result

    s = session.settings
    reference = session.reference_for(s.model_dir, s.drafter_dir)
    replayed = []
    for request, result in zip(session.requests(), results):
        output = list(result.output_ids)
        rounds = replay_result(reference, request, output, None, run.mode, run.budget or 1, s.device) if output else []
        lengths = paced_lengths(rounds, output)
        replayed.append(
            RequestResult(output_ids=output, finish_reason=result.finish_reason, acceptance_lengths=lengths or None)
        )
    return replayed, "the fp32 reference paced on the engine's outputs"


def judge_aggregates(
    name: str, results: list[RequestResult], reference: list[RequestResult], what: str, exact: bool = False
) -> CheckResult:
    """Per-prompt mean tau (and acceptance at depths 1-4) against ``reference`` by equivalence (module doc):
    fail when a band lies wholly beyond its margin, pass when every band lies within it, else the
    aggregates cannot vouch at this many prompts (a skip: the run is incomplete). ``exact`` (a float32
    run): a band wholly off 0 fails, whatever the margin; every correct engine's band is [0, 0] there."""
    pairs = [(r.mean_acceptance if r.mean_acceptance is not None else r.tau, ref) for r, ref in zip(results, reference)]
    pairs = [(a, ref) for a, ref in pairs if a is not None]
    if not pairs:
        return CheckResult.skipped(name, NO_ACCEPTANCE)
    mine = [a for a, _ in pairs]
    if len(pairs) > 1 and len(set(mine)) == 1 and all(r.rounds is None for r in results):
        return _judge_pooled(name, results, [ref for _, ref in pairs], mine[0], what)
    theirs = [ref.tau or 0.0 for _, ref in pairs]
    tau, ref_tau = sum(mine) / len(mine), sum(theirs) / len(theirs)
    if len(pairs) < MIN_BAND_PROMPTS and mine != theirs:
        return CheckResult.skipped(
            name,
            f"aggregate tau {tau:.3f} vs {what} {ref_tau:.3f} on {len(pairs)} prompts: "
            f"the bootstrap band needs at least {MIN_BAND_PROMPTS} (raise {option('limit')})",
        )
    comparisons = [_Comparison("mean tau", mine, theirs, TAU_MARGIN * ref_tau, f"{TAU_MARGIN:.0%} of its tau")]
    got_pos = [r.per_position_acceptance for r in results]
    if all(got_pos):
        depth = min(4, min(len(p) for p in got_pos))
        ref_pos = [per_position_acceptance([r.acceptance_lengths or []], depth) for r in reference]
        for d in range(depth):
            a = [p[d] for p in got_pos]
            b = [p[d] if d < len(p) else 0.0 for p in ref_pos]
            comparisons.append(
                _Comparison(f"acceptance at depth {d + 1}", a, b, DEPTH_MARGIN, f"{DEPTH_MARGIN} absolute")
            )
    level = 1 - ALPHA / len(comparisons)
    bands = [c.band(ALPHA / len(comparisons)) for c in comparisons]  # to fail: the noise model's level
    vouch = [c.band(VOUCH_ALPHA / len(comparisons)) for c in comparisons]  # to pass: the user's
    details = {
        "tau": tau,
        "reference_tau": ref_tau,
        "prompts": len(pairs),
        "band": list(vouch[0]),
        "margins": [c.margin for c in comparisons],
        "bands": {c.what: list(b) for c, b in zip(comparisons, vouch)},
        "fail_bands": {c.what: list(b) for c, b in zip(comparisons, bands)},
        "confidence": 1 - VOUCH_ALPHA / len(comparisons),
        "fail_confidence": level,
    }
    limit = [0.0 if exact else c.margin for c in comparisons]  # how far a band must clear 0 to fail
    beyond = any(high < -m or low > m for m, (low, high) in zip(limit, bands))
    within = all(-c.margin <= low and high <= c.margin for c, (low, high) in zip(comparisons, vouch))
    details["equivalence"] = "beyond" if beyond else "within" if within else "undecided"
    for c, m, (low, high) in zip(comparisons, limit, bands):
        if high < -m or low > m:
            side = "short of" if high < 0 else "above"
            beyond_what = (
                "in float32, where every correct engine's aggregates equal the reference's"
                if exact
                else f"by more than the margin {c.margin:.3f} ({c.margin_words}), which correct engines that round "
                "differently stay within"
            )
            return CheckResult.failed(
                name,
                f"{c.what} {c.mean(c.values):.3f} vs {what} {c.mean(c.reference):.3f}: the per-prompt difference's "
                f"{level:.4%} bootstrap band [{low:.3f}, {high:.3f}] over {len(pairs)} prompts lies wholly "
                f"{side} the reference's {beyond_what}",
                **details,
            )
    wide = [(c, band) for c, band in zip(comparisons, vouch) if band[0] < -c.margin or band[1] > c.margin]
    if wide:
        c, (low, high) = wide[0]
        return CheckResult(
            check=name,
            status="skip",
            cause="engine",
            message=f"{c.what} {c.mean(c.values):.3f} vs {what} {c.mean(c.reference):.3f}: the per-prompt "
            f"difference's {1 - VOUCH_ALPHA / len(comparisons):.2%} band [{low:.3f}, {high:.3f}] over {len(pairs)} "
            f"prompts reaches past the margin +/-{c.margin:.3f} ({c.margin_words}): aggregates over so few "
            f"prompts cannot vouch for this engine's acceptance{_prompts_needed(len(pairs), low, high, c.margin)}",
            details=details,
        )
    return CheckResult.passed(
        name,
        f"aggregate tau {tau:.3f} vs {what} {ref_tau:.3f}: difference band [{vouch[0][0]:.3f}, {vouch[0][1]:.3f}] "
        f"over {len(pairs)} prompts within the margin +/-{comparisons[0].margin:.3f} ({TAU_MARGIN:.0%}), "
        f"acceptance at depths 1-{len(comparisons) - 1} within +/-{DEPTH_MARGIN}",
        **details,
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
