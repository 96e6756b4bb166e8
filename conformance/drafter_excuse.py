"""The drafter side's excuse for a replayed round: whether low-precision drafter logits explain a
round whose tokens agree with the fp32 replay's but whose length differs (module doc of
:mod:`ddtree_conformance.replay`). The replay's fp32 drafter logits, moved by at most the noise model's
drafter tolerance, must flip the deciding path into or out of the spec tree; the engine's own drafter
logits, where it reports them, must lie within the tolerance and build a tree the spec allows that
holds (or lacks) the path as its round did: then the round is *excused* (confirmed); without them it
is *unconfirmed*, and counts against the noise model's caps.

Reported drafter logits are evidence only while they are blind to the target. :func:`continuation_lean`
asks whether they lean toward the tokens the target goes on to emit, on the rounds that need no excuse:
rounding has no way to know which token comes next, so its shifts favour the next token as often as a
token of about the same logit; logits moved toward the target's continuation to earn excuses favour it
nearly always (:meth:`~ddtree_conformance.noise.NoiseModel.lean_test`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from .noise import DRAFTER_TOP, NoiseModel, log_prob_slack
from .spec import build_chain, build_tree
from .spec.freedoms import may_hold

__all__ = [
    "DrafterExcuse",
    "build_spec_tree",
    "continuation_lean",
    "drafter_excuse",
    "drafter_flips_within",
    "holds_path",
]


def build_spec_tree(draft_logits: torch.Tensor, mode: str, budget: int):
    return build_chain(draft_logits) if mode == "dflash" else build_tree(draft_logits, budget)


def holds_path(tree, tokens: Sequence[int]) -> bool:
    children, node = tree.children, 0
    for token in tokens:
        node = children[node].get(int(token))
        if node is None:
            return False
    return True


def drafter_flips_within(
    draft_logits: torch.Tensor, mode: str, budget: int, path: Sequence[int], tolerance: float
) -> bool:
    """Whether moving every drafter logit by at most ``tolerance`` flips ``path``'s membership of the
    spec tree (``path``'s tokens up and the rest down at its depths, or the reverse)."""
    present = holds_path(build_spec_tree(draft_logits, mode, budget), path)
    depth = len(path)
    if depth == 0 or depth > draft_logits.shape[0] or tolerance <= 0:
        return False
    sign = -1.0 if present else 1.0
    moved = draft_logits.clone().float()
    rows = torch.arange(depth)
    shift = torch.full_like(moved[:depth], -sign * tolerance)
    shift[rows, torch.tensor([int(t) for t in path])] = sign * tolerance
    moved[:depth] += shift
    return holds_path(build_spec_tree(moved, mode, budget), path) != present


def _logit_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over the tokens that can enter a tree: the top DRAFTER_TOP per depth of either."""
    k = min(DRAFTER_TOP, a.shape[-1])
    top = torch.cat([torch.topk(a, k, dim=-1).indices, torch.topk(b, k, dim=-1).indices], dim=-1)
    return float((a.gather(1, top) - b.gather(1, top)).abs().max())


def continuation_lean(engine_logits, reference_top, continuation: Sequence[int]) -> tuple[int, int]:
    """(toward, away): over the drafter rows of one round (row k drafts the round's k-th token, which the
    target then chose: ``continuation[k]``; the caller passes the round's own tokens, the fp32 target's),
    how often the engine's logits moved the continuation's token up against a control token, and how
    often down. ``reference_top``: the fp32 reference's top tokens per row and their logits (the replay's
    ``draft_top``). The control is the token whose reference logit lies closest to the continuation's
    among them (so a shift that grows or shrinks with the logit itself moves both alike); a row whose
    continuation is not among them, or whose two shifts are equal, counts neither way."""
    mine = torch.as_tensor(engine_logits, dtype=torch.float32)
    indices, values = reference_top
    if mine.ndim != 2 or mine.shape[0] != indices.shape[0] or (indices.numel() and mine.shape[1] <= int(indices.max())):
        return 0, 0  # not the replay's rows or vocabulary: nothing to compare (its excuses already need them)
    toward = away = 0
    for row, token in enumerate(continuation[: indices.shape[0]]):
        where = (indices[row] == int(token)).nonzero()
        if not len(where) or indices.shape[1] < 2:
            continue
        at = int(where[0])
        distance = (values[row] - values[row, at]).abs()
        distance[at] = float("inf")
        other = int(torch.argmin(distance))
        shift = mine[row, indices[row]] - values[row].float()
        lean = float(shift[at] - shift[other])
        toward, away = toward + (lean > 0), away + (lean < 0)
    return toward, away


@dataclass(frozen=True)
class DrafterExcuse:
    """What the drafter side says of a round whose tokens agree but whose length differs."""

    kind: Literal["excused", "unconfirmed", "differs"]  # confirmed near-tie | unconfirmed | a failure
    note: str


def drafter_excuse(
    rnd, path: list[int], engine_holds: bool, rules: NoiseModel, mode: str, budget: int, engine_logits
) -> DrafterExcuse:
    side = "held" if engine_holds else "lacked"
    if rnd.draft_logits is None:
        return DrafterExcuse("differs", "replay kept no drafter logits for this round")
    if not drafter_flips_within(rnd.draft_logits, mode, budget, path, rules.drafter_tolerance):
        return DrafterExcuse(
            "differs",
            f"the engine's tree {side} the path {path}, but no drafter logits within the "
            f"tolerance {rules.drafter_tolerance:.3g} of the reference's flip it (drafter positions, "
            "feedback rows or RoPE?)",
        )
    if engine_logits is not None:
        mine = torch.as_tensor(engine_logits, dtype=torch.float32)
        if mine.shape != rnd.draft_logits.shape:
            return DrafterExcuse(
                "differs",
                f"the engine's drafter logits have shape {tuple(mine.shape)}, the "
                f"reference's {tuple(rnd.draft_logits.shape)}",
            )
        distance = _logit_distance(mine, rnd.draft_logits)
        if distance > rules.drafter_tolerance:
            return DrafterExcuse(
                "differs",
                f"the engine's drafter logits are {distance:.3g} from the reference's on "
                f"the same context, more than the tolerance {rules.drafter_tolerance:.3g} (drafter "
                "positions, feedback rows or RoPE?)",
            )
        if not may_hold(mine, mode, budget, path, engine_holds, slack=log_prob_slack(mine, budget)):
            return DrafterExcuse(
                "differs",
                f"no tree the spec allows for the engine's own drafter logits (equal scores, up to the rounding of "
                f"their log-softmax, broken either way) "
                f"{side} the path {path}, as the engine's round did",
            )
        if distance == 0.0:  # the reference's own logits: only equal log-probs broken the other way differ
            return DrafterExcuse(
                "excused",
                f"the engine's drafter logits equal the reference's, and its tree {side} the path {path} by "
                "breaking equal scores the other way",
            )
        return DrafterExcuse(
            "excused", f"drafter logits {distance:.2g} apart flip the path {path} (engine's tree {side} it)"
        )
    return DrafterExcuse(
        "unconfirmed",
        f"drafter logits within {rules.drafter_tolerance:.3g} could flip the path {path} "
        f"{'into' if engine_holds else 'out of'} the tree, but the engine gives no drafter logits to confirm it",
    )
