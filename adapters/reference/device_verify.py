"""The spec's verify inputs with tensor operations only, for the fast path (issue 29, item 4).

:func:`ddtree_conformance.spec.compile_tree` takes the root token as a Python int and follows parent
pointers until every row is done, asking the device each level whether one is left: reads that stop a
GPU round between the tree build and the verify graph. :func:`verify_inputs_on_device` builds the same
inputs (ids, positions ``start + depth``, the ancestor-or-self visibility and the additive mask) from a
root token that may live on the device and the tree's ancestor table (:func:`.device_tree.ancestor_table`:
one scatter of each row's ancestors, the root's column always), with no value read back.
``tests/test_device_tree.py`` holds them equal to the spec's.
"""

from __future__ import annotations

import torch

from ddtree_conformance.spec.tree import DraftTree
from ddtree_conformance.spec.verify import VerifyInputs, checked_prefix_len

from .device_tree import ancestor_table

__all__ = ["verify_inputs_on_device"]


def verify_inputs_on_device(
    tree: DraftTree,
    root_token: torch.Tensor | int,
    start: int,
    prefix_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    max_depth: int | None = None,
    ancestors: torch.Tensor | None = None,
    with_mask: bool = True,
) -> VerifyInputs:
    """:func:`~ddtree_conformance.spec.compile_tree`'s inputs (module doc); ``max_depth`` at least the
    tree's depth (default: the number of nodes, which always is); ``ancestors`` the tree's ancestor table
    where the caller has it (the build gives it), else computed here with ``max_depth`` columns.
    ``with_mask=False``: no additive mask (an empty ``attention_mask``), for a caller that builds its own
    from ``visibility`` (the round as one graph: its mask spans the cache)."""
    prefix_len = checked_prefix_len(start, prefix_len)
    device = tree.tokens.device
    n = tree.tokens.shape[0]
    root = torch.as_tensor(root_token, dtype=torch.long, device=device).reshape(1)
    input_ids = torch.cat([root, tree.tokens[1:]])
    position_ids = start + tree.depths
    if ancestors is None:
        ancestors = ancestor_table(tree, max_depth if max_depth is not None else n - 1)
    # each row sees the root, its ancestors and itself: one scatter (padding -1 lands on the root's column)
    seen = torch.cat([torch.zeros((n, 1), dtype=torch.long, device=device), ancestors.clamp(min=0)], dim=1)
    visibility = torch.zeros((n, n), dtype=torch.bool, device=device).scatter_(1, seen, True)
    if not with_mask:
        empty = torch.empty(0, dtype=dtype, device=device)
        return VerifyInputs(input_ids=input_ids, position_ids=position_ids, visibility=visibility, attention_mask=empty)
    allowed = torch.cat([torch.ones((n, prefix_len), dtype=torch.bool, device=device), visibility], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return VerifyInputs(
        input_ids=input_ids,
        position_ids=position_ids,
        visibility=visibility,
        attention_mask=mask.view(1, 1, n, prefix_len + n),
    )
