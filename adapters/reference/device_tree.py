"""The spec's DDTree built with tensor operations only, for the fast path (issue 29, item 4).

:func:`ddtree_conformance.spec.build_tree` pops a heap in Python, one node at a time: on a GPU that
means copying the drafter's top-k to the host every round and building the tree there, between the
drafter's graph and the verify graph. :func:`build_tree_on_device` returns the same tree (every
field equal, ties included) from sorts and gathers on the logits' device, with no value read back:

* The B most probable prefixes form a prefix-closed set (a child's score ``parent + lp`` is never
  above its parent's, and on a tie the parent comes first), and a prefix of depth d among them has
  fewer than B prefixes of depth d before it. So, depth by depth, the B best prefixes of depth d
  among the extensions of the B best of depth d - 1 (a beam of width B) hold every node of the tree
  at that depth: by induction from depth 1.
* Within a depth the order is the spec's: score descending (the same float64 sums, parent score plus
  the token's log-prob), ties by the rank tuple, compared through each beam's lexicographic rank
  (parent's lexicographic rank times K plus the token's rank: no tuple is materialised to compare).
* The tree is the B best of the union of the beams, in the spec's pop order: score descending, ties
  by the rank tuple, a prefix before its extensions (rank tuples padded with -1, sorted by stable
  passes from the last depth to the first, then a stable sort by score).

``tests/test_device_tree.py`` holds it equal to the heap on drawn logits (many exact ties) on CPU; the
fast path uses it where the logits are on a GPU.
"""

from __future__ import annotations

import torch

from ddtree_conformance.spec.tree import DraftTree, per_depth_topk

__all__ = ["build_tree_on_device"]


def _order(scores: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Indices sorting by score descending, equal scores by ``keys`` ascending (keys distinct)."""
    by_key = torch.argsort(keys, stable=True)
    by_score = torch.argsort(scores[by_key], descending=True, stable=True)
    return by_key[by_score]


def build_tree_on_device(draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """:func:`~ddtree_conformance.spec.build_tree`'s tree (module doc), built on ``draft_logits``' device."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if draft_logits.dim() != 2 or draft_logits.shape[0] < 1 or draft_logits.shape[1] < 1:
        raise ValueError(f"draft_logits must be a non-empty [L, V] tensor, got {tuple(draft_logits.shape)}")
    depth_limit, vocab = draft_logits.shape
    k = min(budget, vocab)
    lp, ids = per_depth_topk(draft_logits, k)  # float64 [L, k], int64 [L, k]
    device = draft_logits.device
    ranks_k = torch.arange(k, device=device)

    # beam of depth 1: the k tokens, already in order
    width = min(budget, k)
    scores, ranks = lp[0, :width], ranks_k[:width]
    tuples = ranks.unsqueeze(1)  # [n, d]: each prefix's rank tuple
    lex = ranks.clone()  # each prefix's lexicographic rank within its beam
    beams = [(scores, tuples)]
    for d in range(1, depth_limit):
        n = scores.shape[0]
        child_scores = (scores.unsqueeze(1) + lp[d].unsqueeze(0)).reshape(-1)  # parent + lp, as the heap adds
        child_keys = (lex.unsqueeze(1) * k + ranks_k.unsqueeze(0)).reshape(-1)
        keep = _order(child_scores, child_keys)[: min(budget, n * k)]
        parents, child_ranks = keep // k, keep % k
        scores = child_scores[keep]
        tuples = torch.cat([tuples[parents], child_ranks.unsqueeze(1)], dim=1)
        lex = torch.empty_like(keep)
        lex[torch.argsort(child_keys[keep])] = torch.arange(keep.shape[0], device=device)
        beams.append((scores, tuples))

    # the union of the beams in pop order: rank tuples padded with -1 sort a prefix before its extensions
    all_scores = torch.cat([s for s, _ in beams])
    padded = torch.cat([torch.nn.functional.pad(t, (0, depth_limit - t.shape[1]), value=-1) for _, t in beams])
    order = torch.arange(all_scores.shape[0], device=device)
    for column in range(depth_limit - 1, -1, -1):  # least significant first: stable passes
        order = order[torch.argsort(padded[order, column], stable=True)]
    order = order[torch.argsort(all_scores[order], descending=True, stable=True)][:budget]

    chosen = padded[order]  # [N, L]
    depths = (chosen >= 0).sum(dim=1)
    last = chosen.gather(1, (depths - 1).unsqueeze(1)).squeeze(1)
    tokens = ids[depths - 1, last]
    # a node's parent: the chosen prefix whose padded tuple is this one's with its last rank cut
    # (a scatter of a scalar: an indexed assignment of -1 would copy a host tensor, refused in a graph capture)
    parent_tuples = chosen.scatter(1, (depths - 1).unsqueeze(1), -1)
    same = (parent_tuples.unsqueeze(1) == chosen.unsqueeze(0)).all(dim=2)  # [N, N]: row's parent is column
    parents = torch.where(depths > 1, same.int().argmax(dim=1) + 1, torch.zeros_like(depths))
    long = torch.long
    return DraftTree(
        tokens=torch.cat([torch.full((1,), -1, dtype=long, device=device), tokens]),
        depths=torch.cat([torch.zeros(1, dtype=long, device=device), depths]),
        parents=torch.cat([torch.full((1,), -1, dtype=long, device=device), parents]),
        ranks=torch.cat([torch.full((1,), -1, dtype=long, device=device), last]),
        scores=torch.cat([torch.zeros(1, dtype=torch.float64, device=device), all_scores[order]]),
    )
