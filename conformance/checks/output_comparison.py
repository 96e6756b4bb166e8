"""Comparing two greedy output sequences (used by the lossless, golden and tensor-parallel checks).

fp32: the outputs must be equal token for token.
bf16/fp16: the outputs may differ only after a first divergence that is a near-tie: the shared
prefix is re-scored with the target (:class:`ddtree_conformance.scorer.TargetScorer`, fp32) and the
top-1/top-2 logit gap at the divergence must be at most a calibrated bound
(:mod:`ddtree_conformance.calibration` says how the bound is derived).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

__all__ = ["Verdict", "compare_outputs", "first_divergence"]


class Verdict(BaseModel):
    """Per-prompt comparison result."""

    prompt: str
    kind: Literal["match", "near-tie", "divergence", "error"]
    position: int | None = None  # index in the output of the first differing token
    gap: float | None = None  # target top-1/top-2 gap there (re-scored)
    expected: int | None = None
    got: int | None = None
    note: str = ""


def first_divergence(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first differing output token; a length difference counts at the shorter end."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def compare_outputs(
    prompt_id: str,
    prompt_ids: Sequence[int],
    expected: Sequence[int],
    got: Sequence[int],
    *,
    exact: bool,
    near_tie_bound: float = 0.0,
    scorer=None,
    got_error: str | None = None,
) -> Verdict:
    """Classify ``got`` against ``expected`` (both greedy outputs for the same prompt)."""
    if got_error:
        return Verdict(prompt=prompt_id, kind="error", note=got_error.splitlines()[0][:300])
    pos = first_divergence(expected, got)
    if pos is None:
        return Verdict(prompt=prompt_id, kind="match")
    exp_tok = expected[pos] if pos < len(expected) else None
    got_tok = got[pos] if pos < len(got) else None
    if exp_tok is None or got_tok is None:
        note = f"output lengths differ ({len(expected)} expected, {len(got)} got) with equal prefixes"
        return Verdict(prompt=prompt_id, kind="divergence", position=pos, expected=exp_tok, got=got_tok, note=note)
    if exact or scorer is None:
        return Verdict(prompt=prompt_id, kind="divergence", position=pos, expected=exp_tok, got=got_tok)
    gap = scorer.gaps(list(prompt_ids), list(expected[: pos + 1]))[pos]
    kind = "near-tie" if gap <= near_tie_bound else "divergence"
    return Verdict(prompt=prompt_id, kind=kind, position=pos, gap=gap, expected=exp_tok, got=got_tok)
