"""What the reference engine reports of one round: its trace (:class:`RoundTrace`, with drafter logits
when asked) and its verified tree (:class:`VerifiedTree`, the light trace every speculative result
carries)."""

from __future__ import annotations

import torch

from ddtree_conformance.spec import SamplingParams, top2_margin

from ..interface import RoundTrace, RunConfig, VerifiedTree

__all__ = ["verified_tree", "round_trace"]


def verified_tree(tree, verify, walk, logits, params: SamplingParams) -> VerifiedTree:
    """The light trace of one round: the tree verified and the target's token at every node."""
    targets = torch.argmax(logits, dim=-1).tolist()
    if params.greedy:  # the walk's own choices at the nodes it visited (its logits may be processed)
        for node, token in walk.target_tokens.items():
            targets[node] = int(token)
    return VerifiedTree(
        tree_tokens=verify.input_ids.tolist(), parents=tree.parents.tolist(), node_target_tokens=targets
    )


def round_trace(tree, verify, walk, logits, start, root, draft_logits, config: RunConfig) -> RoundTrace:
    """The full trace of one round (``config.trace``): tree, positions, walk, margins, drafter logits."""
    path = [0, *walk.accepted]
    return RoundTrace(
        start=start,
        root_token=root,
        tree_tokens=verify.input_ids.tolist(),
        parents=tree.parents.tolist(),
        depths=tree.depths.tolist(),
        positions=verify.position_ids.tolist(),
        accepted=list(walk.accepted),
        target_tokens=[walk.target_tokens[n] for n in path],
        bonus=walk.bonus,
        top2_margins=top2_margin(logits[path]).tolist(),
        node_target_tokens=torch.argmax(logits, dim=-1).tolist(),
        draft_logits=draft_logits.float().tolist() if config.trace_draft_logits else None,
    )
