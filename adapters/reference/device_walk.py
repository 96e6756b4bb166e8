"""The spec's greedy walk with tensor operations only, for the fast path (issue 29, item 4).

:func:`ddtree_conformance.spec.walk_tree` follows the target's argmax down the tree in Python, one
``torch.argmax`` read back per node: on a GPU each is a synchronisation between the verify graph and
the next round. :func:`greedy_walk_on_device` gives the same walk (the accepted nodes in order and the
bonus token) from one argmax over every row and a fixed number of gathers (the tree's depth), with no
value read back until the caller reads the result:

* the target's token at every node: ``argmax`` of its row (the lowest id on ties, as the spec's);
* each node's next node: the child whose token is the target's token there (siblings have distinct
  tokens, so at most one), else none;
* from the root, ``depth`` steps along those links; the walk stops at the first node without one, and
  the bonus is the target's token there.

``tests/test_device_tree.py`` holds it equal to the spec's walk on drawn trees and tied logits.
"""

from __future__ import annotations

import torch

from ddtree_conformance.spec.tree import DraftTree

__all__ = ["greedy_walk_on_device"]


def greedy_walk_on_device(
    tree: DraftTree, target_logits: torch.Tensor, max_depth: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(path, accepted, bonus)``: ``path`` the accepted node indices in order, padded with -1 to
    ``max_depth``; ``accepted`` how many there are; ``bonus`` the target's token after the last (module
    doc). ``target_logits``: ``[N+1, V]``, row i the target's next-token logits at node i. ``max_depth``:
    at least the tree's depth (the drafter's block: no read of the tree); None: the tree's depth, read."""
    nodes = tree.num_nodes + 1
    if target_logits.shape[0] != nodes:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, tree has {nodes} nodes")
    device = target_logits.device
    chosen = torch.argmax(target_logits, dim=-1)  # [N+1]
    tokens, parents = tree.tokens.to(device), tree.parents.to(device)
    # link[i, j]: node j is a child of i carrying the target's token at i
    link = (parents.unsqueeze(0) == torch.arange(nodes, device=device).unsqueeze(1)) & (
        tokens.unsqueeze(0) == chosen.unsqueeze(1)
    )
    has_next = link.any(dim=1)
    next_node = torch.where(has_next, link.int().argmax(dim=1), torch.full_like(has_next, -1, dtype=torch.long))
    depth = max_depth if max_depth is not None else (int(tree.depths.max()) if nodes > 1 else 0)
    path = torch.full((max(depth, 1),), -1, dtype=torch.long, device=device)
    # one-element tensors, never 0-d ones: indexing with a 0-d tensor reads it back (refused in a graph capture)
    current = torch.zeros(1, dtype=torch.long, device=device)
    alive = torch.ones(1, dtype=torch.bool, device=device)
    for step in range(depth):
        step_next = next_node.index_select(0, current)
        alive = alive & (step_next >= 0)
        current = torch.where(alive, step_next, current)
        path[step : step + 1] = torch.where(alive, current, path[step : step + 1])
    accepted = (path >= 0).sum()
    return path[:depth] if depth else path[:0], accepted, chosen.index_select(0, current)[0]
