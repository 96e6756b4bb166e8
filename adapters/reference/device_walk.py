"""The spec's greedy walk with tensor operations only, for the fast path (issue 29, item 4).

:func:`ddtree_conformance.spec.walk_tree` follows the target's argmax down the tree in Python, one
``torch.argmax`` read back per node: on a GPU each is a synchronisation between the verify graph and
the next round. :func:`greedy_walk_on_device` gives the same walk (the accepted nodes in order and the
bonus token) in a handful of kernels over the whole tree, with no value read back until the caller reads
the result:

* the target's token at every node: ``argmax`` of its row (the lowest id on ties, as the spec's);
* a node matches when its token is the target's token at its parent; a node is on the walk when it and
  every ancestor match (read from the tree's ancestor table, :func:`.device_tree.ancestor_table`, which
  the tensor build gives for free). Siblings carry distinct tokens, so those nodes form one path from the
  root: the walk, whose last node is the deepest of them;
* the accepted nodes are that node's ancestors in order (its row of the table), the bonus the target's
  token there.

``tests/test_device_tree.py`` holds it equal to the spec's walk on drawn trees and tied logits.
"""

from __future__ import annotations

import torch

from ddtree_conformance.spec.tree import DraftTree

from .device_tree import ancestor_table

__all__ = ["greedy_walk_on_device"]


def greedy_walk_on_device(
    tree: DraftTree,
    target_logits: torch.Tensor,
    max_depth: int | None = None,
    ancestors: torch.Tensor | None = None,
    chosen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(path, accepted, bonus)``: ``path`` the accepted node indices in order, padded with -1 to
    ``max_depth``; ``accepted`` how many there are; ``bonus`` the target's token after the last (module
    doc). ``target_logits``: ``[N+1, V]``, row i the target's next-token logits at node i. ``max_depth``:
    at least the tree's depth (the drafter's block: no read of the tree); None: the tree's depth, read.
    ``ancestors``: the tree's :func:`~.device_tree.ancestor_table` with ``max_depth`` columns, where the
    caller has it (the build gives it); None: computed here. ``chosen``: ``argmax`` of every row of
    ``target_logits`` where the caller has it (one pass over the logits fewer); None: taken here."""
    nodes = tree.num_nodes + 1
    if target_logits.shape[0] != nodes:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, tree has {nodes} nodes")
    device = target_logits.device
    depth = max_depth if max_depth is not None else (int(tree.depths.max()) if nodes > 1 else 0)
    if ancestors is None:
        ancestors = ancestor_table(tree, depth)
    if chosen is None:
        chosen = torch.argmax(target_logits, dim=-1)  # [N+1]
    tokens, parents, depths = (t.to(device) for t in (tree.tokens, tree.parents, tree.depths))
    # a node matches when its token is the target's token at its parent; it is on the walk when it and
    # every ancestor match (siblings carry distinct tokens, so these nodes form one path from the root)
    matches = torch.cat([torch.ones(1, dtype=torch.bool, device=device), tokens[1:] == chosen[parents[1:]]])
    on_walk = torch.where(ancestors >= 0, matches[ancestors.clamp(min=0)], True).all(dim=1)
    last = torch.argmax(torch.where(on_walk, depths, -1)).view(1)  # the walk's last node (the root: none)
    path = ancestors.index_select(0, last).view(-1)
    accepted = depths.index_select(0, last)[0]
    return path, accepted, chosen.index_select(0, last)[0]
