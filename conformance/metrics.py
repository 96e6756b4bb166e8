"""Acceptance metrics, defined once (algorithm doc §4)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["emitted_lengths", "mean_tau", "per_position_acceptance", "acceptance_histogram", "paired_band"]


def emitted_lengths(lengths: Sequence[int], output_len: int) -> list[int]:
    """``lengths`` with the last round cut to the tokens the output holds after the earlier rounds."""
    lengths = list(lengths)
    if lengths:
        left = output_len - 1 - sum(lengths[:-1])
        if 1 <= left < lengths[-1]:
            lengths[-1] = left
    return lengths


def mean_tau(per_prompt_lengths: Sequence[Sequence[int]]) -> float:
    """Pooled tau: all accepted-plus-bonus lengths over all rounds (not a mean of per-prompt means)."""
    rounds = [n for lengths in per_prompt_lengths for n in lengths]
    return sum(rounds) / len(rounds) if rounds else 0.0


def per_position_acceptance(per_prompt_lengths: Sequence[Sequence[int]], depth: int | None = None) -> list[float]:
    """Fraction of rounds whose accepted depth (length - 1) reaches d, for d = 1..depth."""
    rounds = [n - 1 for lengths in per_prompt_lengths for n in lengths]
    if not rounds:
        return []
    depth = depth or max(rounds)
    return [sum(1 for a in rounds if a >= d) / len(rounds) for d in range(1, depth + 1)]


def acceptance_histogram(per_prompt_lengths: Sequence[Sequence[int]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for lengths in per_prompt_lengths:
        for n in lengths:
            counts[n] = counts.get(n, 0) + 1
    return dict(sorted(counts.items()))


def paired_band(values: Sequence[float], reference: Sequence[float], alpha: float) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` bootstrap band (percentile, 9999 resamples, fixed seed) of the mean
    per-prompt difference ``values - reference``. All differences equal: the band is that value."""
    import numpy as np
    from scipy.stats import bootstrap

    diffs = np.asarray(values, dtype=float) - np.asarray(reference, dtype=float)
    if diffs.size == 0:
        return 0.0, 0.0
    if np.all(diffs == diffs[0]):
        return float(diffs[0]), float(diffs[0])
    result = bootstrap(
        (diffs,),
        np.mean,
        confidence_level=1 - alpha,
        method="percentile",
        n_resamples=9999,
        random_state=np.random.default_rng(0),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
