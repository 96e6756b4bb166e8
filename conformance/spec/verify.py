"""Compiling a draft tree into one target forward (algorithm doc §3, "Verification").

The verify batch is ``[root, node_1, ..., node_N]``. Node positions are ``start + depth``
(never the flattened index: bug class 1). A tree token sees the whole committed prefix, its
ancestors and itself, never a sibling or cousin (bug class 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree

__all__ = ["VerifyInputs", "ancestor_visibility", "checked_prefix_len", "compile_tree"]


@dataclass(frozen=True)
class VerifyInputs:
    """Everything a target forward over a tree needs (batch dimension 1 added by the caller)."""

    input_ids: torch.Tensor  # int64 [N+1]: root token, then node tokens
    position_ids: torch.Tensor  # int64 [N+1]: start + depth
    visibility: torch.Tensor  # bool [N+1, N+1]: visibility[i, j] = j is i or an ancestor of i
    attention_mask: torch.Tensor  # float [1, 1, N+1, prefix_len + N+1]: 0 visible, dtype-min hidden


def ancestor_visibility(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix from a parent array (root's parent is -1).

    ``visibility[i, j]`` is True iff ``j == i`` or ``j`` is an ancestor of ``i``. Computed by
    following parent pointers, one gather per tree level, on the host: each level asks whether any
    pointer is still alive, which on an accelerator would be a read back per level. The matrix is
    returned on the parents' device (one copy).
    """
    device = parents.device
    parents = parents.cpu()
    n = parents.shape[0]
    rows = torch.arange(n)
    visibility = torch.zeros((n, n), dtype=torch.bool)
    current = rows.clone()
    for _ in range(n):
        alive = current >= 0
        if not bool(alive.any()):
            break
        visibility[rows[alive], current[alive]] = True
        current = torch.where(alive, parents[current.clamp(min=0)], current)
    return visibility.to(device)


def checked_prefix_len(start: int, prefix_len: int | None) -> int:
    """The cached prefix a tree attends to (default ``start``, the root's position), both checked >= 0."""
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    prefix_len = start if prefix_len is None else prefix_len
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    return prefix_len


def compile_tree(
    tree: DraftTree, root_token: int, start: int, prefix_len: int | None = None, dtype: torch.dtype = torch.float32
) -> VerifyInputs:
    """Build verify inputs for ``tree`` rooted at ``root_token`` (doc §3, "Verification").

    ``start``: position of the root (the number of committed tokens before it).
    ``prefix_len``: number of cached committed tokens the tree attends to (default ``start``);
    all of them are visible to every tree token.
    ``dtype``: dtype of the additive mask (the target's compute dtype).
    """
    prefix_len = checked_prefix_len(start, prefix_len)
    device = tree.tokens.device
    input_ids = tree.tokens.clone()
    input_ids[0] = int(root_token)
    position_ids = start + tree.depths
    visibility = ancestor_visibility(tree.parents)
    n = visibility.shape[0]
    allowed = torch.cat([torch.ones((n, prefix_len), dtype=torch.bool, device=device), visibility], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return VerifyInputs(
        input_ids=input_ids,
        position_ids=position_ids,
        visibility=visibility,
        attention_mask=mask.view(1, 1, n, prefix_len + n),
    )
