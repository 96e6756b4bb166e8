"""The tree from its beams in one Triton launch, for the fast path on a GPU (issue 29).

:func:`.device_tree.build_tree_with_ancestors` takes the tree as the ``B`` best nodes of every depth's beam in
the heap's pop order (score descending, ties by the nodes' pre-order position in the trie the beams form), then
numbers them and gathers their fields and ancestors. Written with tensor operations that is about fifty small
kernels and a stable sort; inside the round's graph their launches, not their work, set the time. Here one
program does it, every beam node (at most ``L * B <= 4096``) in registers:

* **Pre-order.** Each node adds one to the descendant count of each of its strict ancestors (an atomic add
  per ancestor); a node's pre-order position is then its ancestors' beam indices plus one at every depth above
  it, its own beam index, and the descendants of the nodes before it in its beam (a running sum per depth),
  as :mod:`.device_tree` counts it.
* **The B best.** The ``B``-th largest score key (the float64 score as an unsigned integer in the same order,
  as :mod:`.beam_kernel` maps it) is searched two bits at a time (over the top halves first where
  ``beam_kernel.SPLIT_SEARCH`` says so, as the beams are); every node above it is kept, and of those
  equal to it the first by pre-order position, as many as still fit (a running count over the nodes laid out
  in pre-order).
* **Pop order.** The kept nodes (at most 128) are compared pairwise: a node's number is one plus how many kept
  nodes come before it (a higher score, or the same score and an earlier pre-order position).
* **Fields.** Each kept node writes its token (the top-K id of its rank at its depth), depth, rank, score, its
  parent's number and its ancestors' numbers; the root takes row 0.

The result equals the tensor version bit for bit (``tests/test_beam_kernel.py``, through Triton's interpreter on
CPU; the GPU tier on CUDA).
"""

from __future__ import annotations

import torch

from . import beam_kernel
from .beam_kernel import beam_widths

try:  # Triton ships with CUDA builds of PyTorch; a CPU-only install has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is missing
    triton = None

__all__ = ["MAX_KEPT", "MAX_NODES", "kernel_available", "tree_in_one_launch"]

MAX_NODES = 4096  # L * B beam slots: one program keeps every beam node in registers
MAX_KEPT = 128  # the kept nodes are compared pairwise (MAX_KEPT ** 2 pairs)


def kernel_available(device: torch.device, depth_limit: int, budget: int) -> bool:
    """Whether :func:`tree_in_one_launch` serves this build: Triton present, a CUDA device, ``L * B`` and ``B``
    within one program's registers."""
    return triton is not None and device.type == "cuda" and depth_limit * budget <= MAX_NODES and budget <= MAX_KEPT


if triton is not None:
    from .beam_kernel import kth_largest_key, score_keys

    @triton.jit
    def _tree(
        scores_ptr,
        ranks_ptr,
        paths_ptr,
        ids_ptr,
        scratch_ptr,
        tokens_ptr,
        depths_ptr,
        parents_ptr,
        out_ranks_ptr,
        out_scores_ptr,
        ancestors_ptr,
        DEPTH: tl.constexpr,
        K: tl.constexpr,
        B: tl.constexpr,
        KEPT: tl.constexpr,
        BLOCK: tl.constexpr,
        DP: tl.constexpr,
        BP: tl.constexpr,
        CP: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        # scratch: descendants [DEPTH * B], before-in-beam [DEPTH * B], tied in pre-order [BLOCK], running count
        # [BLOCK], node numbers [DEPTH * B], kept keys [CP], kept pre-order [CP], kept numbers [CP] (int64 each)
        descendants_ptr = scratch_ptr
        before_ptr = descendants_ptr + DEPTH * B
        tied_ptr = before_ptr + DEPTH * B
        running_ptr = tied_ptr + BLOCK
        number_ptr = running_ptr + BLOCK
        kept_key_ptr = number_ptr + DEPTH * B
        kept_pre_ptr = kept_key_ptr + CP
        kept_number_ptr = kept_pre_ptr + CP

        offs = tl.arange(0, BLOCK)
        depth, index = offs // B, offs % B
        width = tl.zeros((BLOCK,), tl.int32) + tl.minimum(B, K)  # each slot's beam width (beam_widths)
        w = tl.minimum(B, K)
        for d in range(1, DEPTH):
            w = tl.minimum(B, w * K)
            width = tl.where(depth == d, w, width)
        valid = (depth < DEPTH) & (index < width)
        slots = offs < DEPTH * B
        tl.store(descendants_ptr + offs, tl.zeros((BLOCK,), tl.int64), mask=slots)
        tl.debug_barrier()

        # pre-order: descendants of every beam node, then before-in-beam (running sum per depth)
        row = paths_ptr + offs * DEPTH  # the node's beam indices at depths 0..depth, itself last
        for j in range(DEPTH - 1):
            ancestor = tl.load(row + j, mask=valid & (j < depth), other=0)
            tl.atomic_add(descendants_ptr + j * B + ancestor, 1, mask=valid & (j < depth))
        tl.debug_barrier()
        rows2, cols2 = tl.arange(0, DP)[:, None], tl.arange(0, BP)[None, :]
        inside = (rows2 < DEPTH) & (cols2 < B)
        counts = tl.load(descendants_ptr + rows2 * B + cols2, mask=inside, other=0)
        tl.store(before_ptr + rows2 * B + cols2, tl.cumsum(counts, axis=1) - counts, mask=inside)
        tl.debug_barrier()
        preorder = index.to(tl.int64) + tl.load(before_ptr + offs, mask=valid, other=0)
        for j in range(DEPTH - 1):
            preorder += tl.where(valid & (j < depth), tl.load(row + j, mask=valid & (j < depth), other=0) + 1, 0)

        # the KEPT best: score keys (module doc), ties by pre-order position
        score = tl.load(scores_ptr + offs, mask=valid, other=0.0) + 0.0
        key = score_keys(score, valid)
        threshold = kth_largest_key(key, valid, KEPT, SPLIT)
        above = valid & (key > threshold)
        tied = valid & (key == threshold)
        room = KEPT - tl.sum(above.to(tl.int32), axis=0)
        place = tl.where(valid, preorder, 0)
        tl.store(tied_ptr + place, tied.to(tl.int64), mask=valid)
        tl.debug_barrier()
        laid = tl.load(tied_ptr + offs, mask=offs < tl.sum(valid.to(tl.int32), axis=0), other=0)
        tl.store(running_ptr + offs, tl.cumsum(laid, axis=0))
        tl.debug_barrier()
        take = above | (tied & (tl.load(running_ptr + place, mask=valid, other=0) <= room))

        # pop order among the kept: pairwise
        slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(kept_key_ptr + slot, key.to(tl.int64, bitcast=True), mask=take)
        tl.store(kept_pre_ptr + slot, preorder, mask=take)
        tl.debug_barrier()
        mine = tl.arange(0, CP)
        here = mine < KEPT
        kept_key = tl.load(kept_key_ptr + mine, mask=here, other=0).to(tl.uint64, bitcast=True)  # unsigned again
        kept_pre = tl.load(kept_pre_ptr + mine, mask=here, other=0)
        before = here[None, :] & (
            (kept_key[None, :] > kept_key[:, None])
            | ((kept_key[None, :] == kept_key[:, None]) & (kept_pre[None, :] < kept_pre[:, None]))
        )
        tl.store(kept_number_ptr + mine, tl.sum(before.to(tl.int64), axis=1) + 1, mask=here)
        tl.debug_barrier()
        number = tl.load(kept_number_ptr + slot, mask=take, other=0)
        tl.store(number_ptr + offs, number, mask=take)
        tl.debug_barrier()

        # the fields, row `number` for a kept node, row 0 for the root
        rank = tl.load(ranks_ptr + offs, mask=take, other=0)
        tl.store(tokens_ptr + number, tl.load(ids_ptr + depth * K + rank, mask=take, other=0), mask=take)
        tl.store(depths_ptr + number, (depth + 1).to(tl.int64), mask=take)
        tl.store(out_ranks_ptr + number, rank, mask=take)
        tl.store(out_scores_ptr + number, score, mask=take)
        parent_index = tl.load(row + depth - 1, mask=take & (depth > 0), other=0)
        parent = tl.load(number_ptr + (depth - 1) * B + parent_index, mask=take & (depth > 0), other=0)
        tl.store(parents_ptr + number, parent, mask=take)
        for j in range(DEPTH):
            on = take & (j <= depth)
            ancestor = tl.load(number_ptr + j * B + tl.load(row + j, mask=on, other=0), mask=on, other=0)
            tl.store(ancestors_ptr + number * DEPTH + j, tl.where(on, ancestor, -1), mask=take)
        root = offs == 0
        tl.store(tokens_ptr + offs, tl.full((BLOCK,), -1, tl.int64), mask=root)
        tl.store(depths_ptr + offs, tl.zeros((BLOCK,), tl.int64), mask=root)
        tl.store(parents_ptr + offs, tl.full((BLOCK,), -1, tl.int64), mask=root)
        tl.store(out_ranks_ptr + offs, tl.full((BLOCK,), -1, tl.int64), mask=root)
        tl.store(out_scores_ptr + offs, tl.zeros((BLOCK,), tl.float64), mask=root)
        tl.store(ancestors_ptr + offs, tl.full((BLOCK,), -1, tl.int64), mask=offs < DEPTH)


def tree_in_one_launch(
    beam_scores: torch.Tensor, beam_ranks: torch.Tensor, paths: torch.Tensor, ids: torch.Tensor, budget: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """``((tokens, depths, parents, ranks, scores), ancestors)`` of the tree (module doc), from the beams as
    :func:`.beam_kernel.beams_in_one_launch` leaves them before slicing: ``beam_scores`` float64 ``[L, B]``,
    ``beam_ranks`` int64 ``[L, B]``, ``paths`` int64 ``[L, B, L]`` (slots past a depth's width unread), and
    ``ids`` the per-depth top-K token ids ``[L, K]``."""
    if triton is None:
        raise RuntimeError("tree_in_one_launch needs Triton")
    depth_limit, k = ids.shape
    if depth_limit * budget > MAX_NODES or budget > MAX_KEPT:
        raise ValueError(f"L * B = {depth_limit * budget} (at most {MAX_NODES}) or B = {budget} (at most {MAX_KEPT})")
    kept = min(budget, sum(beam_widths(depth_limit, k, budget)))
    device = ids.device
    block = max(16, triton.next_power_of_2(depth_limit * budget))
    cp = max(16, triton.next_power_of_2(kept))
    scratch = torch.empty(3 * depth_limit * budget + 2 * block + 3 * cp, dtype=torch.long, device=device)
    rows = kept + 1
    fields = [torch.empty(rows, dtype=torch.long, device=device) for _ in range(4)]
    scores = torch.empty(rows, dtype=torch.float64, device=device)
    ancestors = torch.empty((rows, depth_limit), dtype=torch.long, device=device)
    sizes = {"DEPTH": depth_limit, "K": k, "B": budget, "KEPT": kept, "BLOCK": block}
    pads = {"DP": max(2, triton.next_power_of_2(depth_limit)), "BP": max(2, triton.next_power_of_2(budget)), "CP": cp}
    tokens, depths, parents, ranks = fields
    _tree[(1,)](
        beam_scores, beam_ranks, paths, ids.contiguous(), scratch, tokens, depths, parents, ranks, scores, ancestors,
        **sizes, **pads, SPLIT=beam_kernel.SPLIT_SEARCH, num_warps=8 if block > 1024 else 4,
    )  # fmt: skip
    return (tokens, depths, parents, ranks, scores), ancestors
