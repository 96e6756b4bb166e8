"""Aggregate acceptance (the acceptance check's path for engines that report only aggregates):
per-prompt mean tau (and acceptance at depths 1-4) against the reference's at the same dtype and
device, within a paired bootstrap band over the prompts
(:func:`~ddtree_conformance.metrics.paired_band`). Aggregates pooled over a whole batch (one value for
every request, no per-request rounds) have no per-prompt spread: their pooled tau is held to 2 % of
the reference's pooled tau, acceptance at depths 1-4 to 2 points.
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import RequestResult

from ..metrics import mean_tau, paired_band, per_position_acceptance
from ..noise import ALPHA
from ..option_names import option
from .result import CheckResult

__all__ = ["MIN_BAND_PROMPTS", "POOLED_POSITION_ABS_TOL", "POOLED_TAU_REL_TOL", "judge_aggregates"]

MIN_BAND_PROMPTS = 5  # a bootstrap band over fewer prompts says nothing
POOLED_TAU_REL_TOL = 0.02  # batch-pooled aggregates: tau within 2 % of the reference's pooled tau
POOLED_POSITION_ABS_TOL = 0.02  # ... and acceptance at depths 1-4 within 2 points


NO_ACCEPTANCE = "engine reports neither per-round nor aggregate acceptance"


def reports_aggregates(results: list[RequestResult]) -> bool:
    """Whether any result carries an aggregate acceptance (its mean acceptance or tau)."""
    return any(r.mean_acceptance is not None or r.tau is not None for r in results)


def judge_aggregates(name: str, results: list[RequestResult], reference: list[RequestResult], what: str) -> CheckResult:
    """Per-prompt mean tau (and acceptance at depths 1-4) within a paired bootstrap band of ``reference``."""
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
    low, high = paired_band(mine, theirs, ALPHA / 5)
    if not low <= 0.0 <= high:
        return CheckResult.failed(
            name,
            f"mean tau {tau:.3f} vs {what} {ref_tau:.3f}: the per-prompt difference's "
            f"{1 - ALPHA / 5:.4%} bootstrap band [{low:.3f}, {high:.3f}] over {len(pairs)} "
            f"prompts excludes 0",
            tau=tau,
            reference_tau=ref_tau,
        )
    got_pos = [r.per_position_acceptance for r in results]
    if all(got_pos):
        depth = min(4, min(len(p) for p in got_pos))
        ref_pos = [per_position_acceptance([r.acceptance_lengths or []], depth) for r in reference]
        for d in range(depth):
            a = [p[d] for p in got_pos]
            b = [p[d] if d < len(p) else 0.0 for p in ref_pos]
            low_d, high_d = paired_band(a, b, ALPHA / 5)
            if not low_d <= 0.0 <= high_d:
                return CheckResult.failed(
                    name,
                    f"acceptance at depth {d + 1}: {sum(a) / len(a):.3f} vs {what} "
                    f"{sum(b) / len(b):.3f}, band [{low_d:.3f}, {high_d:.3f}] excludes 0",
                )
    return CheckResult.passed(
        name,
        f"aggregate tau {tau:.3f} vs {what} {ref_tau:.3f}: difference band "
        f"[{low:.3f}, {high:.3f}] over {len(pairs)} prompts holds 0",
        tau=tau,
        reference_tau=ref_tau,
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
