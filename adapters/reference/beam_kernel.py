"""The device tree's beams (:mod:`.device_tree`) in one Triton launch, for the fast path on a GPU (issue 29).

:func:`.device_tree.build_tree_with_ancestors` keeps, depth by depth, the ``B`` best extensions of the
previous depth's beam. Written with tensor operations, each depth costs about ten kernels and a sort, and
inside the round's CUDA graph those small kernels, not the work, set the time. Here one program does every
depth, with the extensions of a depth (at most ``B * K <= 4096`` values) in registers:

* **The threshold.** Each extension's float64 score is mapped to an unsigned integer in the same order
  (the sign bit flipped on positives, every bit on negatives). The ``kept``-th largest key is found two bits
  at a time from the top: of the three values the next two bits can add, the largest with at least
  ``kept`` keys at or above it is kept (the three counts share one reduction, 16 bits each). That is 32
  reductions a depth, one after another, and they set the launch's time. With :data:`SPLIT_SEARCH` the search
  runs over the keys' top 32 bits first (16 reductions on 32-bit words), which places every key but those
  sharing the threshold's top half; among those, the threshold is their least key where all of them are kept
  or all are equal (exact ties: the drafter's bf16 logits give many), and only otherwise are their low 32 bits
  searched the same way. The threshold found is the same key either way.
* **The selection.** Every key above the threshold is kept, and of those equal to it the first by index,
  as many as still fit (a running count); a second running count gives each kept extension its slot, so
  the beam comes out in index order: lexicographic, as the tensor version keeps it.
* **The paths.** A kept extension copies its parent's row of beam indices and adds its own slot.

The result equals :func:`.device_tree.beams_with_tensors` bit for bit (``tests/test_beam_kernel.py``, through
Triton's interpreter on CPU; the GPU tier on CUDA).
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of PyTorch; a CPU-only install has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is missing
    triton = None

__all__ = ["MAX_EXTENSIONS", "SPLIT_SEARCH", "beam_slots_in_one_launch", "beams_in_one_launch", "kernel_available"]

MAX_EXTENSIONS = 4096  # B * K: one program keeps a depth's extensions in registers
# Whether the threshold is searched over the keys' top 32 bits first (module doc): the same beams bit for bit
# (tests/test_beam_kernel.py, through Triton's interpreter), 19 to 21 sequential reductions a depth instead of 32
# (the low halves are searched at 12 of 126 depths of bf16-rounded drafter-shaped blocks, B = 16 / 32 / 64). On
# since timed (H100 4c817fff, 2026-12-06, `python scripts/bench_tree_graph.py`): the tree with both kernels 319 /
# 367 / 567 us a build against 365 / 427 / 695 at B = 16 / 32 / 64, compiled and equal to the heap's tree
# (scripts/measurements/2026-12-06f-issue29/README.md).
SPLIT_SEARCH = True


def kernel_available(device: torch.device, budget: int, k: int) -> bool:
    """Whether :func:`beams_in_one_launch` serves this build: Triton present, a CUDA device, ``B * K`` small."""
    return triton is not None and device.type == "cuda" and budget * k <= MAX_EXTENSIONS


if triton is not None:

    @triton.jit
    def _kth_largest(key, kept, threshold, low, STEPS: tl.constexpr):
        """The ``kept``-th largest of the unsigned words ``key`` (0 where a key is not counted: no candidate
        is 0), from ``threshold``'s known bits down, ``low`` the lower of the next two, two bits a step: of the
        three values those bits can add, the largest with at least ``kept`` keys at or above it (the three
        counts share one reduction, 16 bits each: a count is at most 4096)."""
        for _ in range(STEPS):
            c1, c2 = threshold | low, threshold | (low << 1)
            c3 = c2 | low
            packed = (key >= c1).to(tl.int64) + ((key >= c2).to(tl.int64) << 16) + ((key >= c3).to(tl.int64) << 32)
            counts = tl.sum(packed, axis=0)
            threshold = tl.where(
                ((counts >> 32) & 0xFFFF) >= kept,
                c3,
                tl.where(((counts >> 16) & 0xFFFF) >= kept, c2, tl.where((counts & 0xFFFF) >= kept, c1, threshold)),
            )
            low = low >> 2
        return threshold

    @triton.jit
    def _split_threshold(key, valid, kept):
        """The ``kept``-th largest valid ``key`` (uint64), searched over the top 32 bits first (module doc)."""
        high, low_word = (key >> 32).to(tl.uint32), key.to(tl.uint32)  # a key not valid is 0: its top half too
        top = _kth_largest(high, kept, tl.zeros((), tl.uint32), tl.full((), 1, tl.uint32) << 30, 16)
        same = valid & (high == top)  # the keys whose top half is the threshold's; those above are all kept
        wanted = kept - tl.sum((valid & (high > top)).to(tl.int32), axis=0)  # 1 <= wanted <= count of same
        least = tl.min(tl.where(same, low_word, tl.full((), 0xFFFFFFFF, tl.uint32)), axis=0)
        bottom = least  # the threshold's low half where every key of the same top half is kept, or all are equal
        rest = tl.where(same, low_word, tl.zeros((), tl.uint32))
        if (tl.sum(same.to(tl.int32), axis=0) > wanted) & (tl.max(rest, axis=0) > least):
            bottom = _kth_largest(rest, wanted, tl.zeros((), tl.uint32), tl.full((), 1, tl.uint32) << 30, 16)
        return (top.to(tl.uint64) << 32) | bottom.to(tl.uint64)

    @triton.jit
    def score_keys(score, valid):
        """float64 scores as unsigned integers in the same order (the sign bit flipped on positives, every bit on
        negatives), 0 where not ``valid``."""
        bits = score.to(tl.int64, bitcast=True)
        ordered = tl.where(bits >= 0, bits ^ tl.full((), -9223372036854775808, tl.int64), ~bits)
        return tl.where(valid, ordered, 0).to(tl.uint64, bitcast=True)

    @triton.jit
    def kth_largest_key(key, valid, kept, SPLIT: tl.constexpr):
        """The ``kept``-th largest valid ``key``: searched whole, or split (module doc)."""
        if SPLIT:
            threshold = _split_threshold(key, valid, kept)
        else:
            threshold = _kth_largest(key, kept, tl.zeros((), tl.uint64), tl.full((), 1, tl.uint64) << 62, 32)
        return threshold

    @triton.jit
    def _beams(
        lp_ptr,
        scores_ptr,
        ranks_ptr,
        paths_ptr,
        DEPTH: tl.constexpr,
        K: tl.constexpr,
        B: tl.constexpr,
        BLOCK: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        offs = tl.arange(0, BLOCK)
        width = tl.minimum(B, K)
        first = offs < width
        tl.store(scores_ptr + offs, tl.load(lp_ptr + offs, mask=first, other=0.0), mask=first)
        tl.store(ranks_ptr + offs, offs.to(tl.int64), mask=first)
        tl.store(paths_ptr + offs * DEPTH, offs.to(tl.int64), mask=first)
        tl.debug_barrier()
        parent, rank = offs // K, offs % K
        for d in range(1, DEPTH):
            valid = offs < width * K
            prev = tl.load(scores_ptr + (d - 1) * B + parent, mask=valid, other=0.0)
            ext = prev + tl.load(lp_ptr + d * K + rank, mask=valid, other=0.0) + 0.0  # parent + lp, as the heap adds
            key = score_keys(ext, valid)
            kept = tl.minimum(B, width * K)
            threshold = kth_largest_key(key, valid, kept, SPLIT)
            above = valid & (key > threshold)
            tied = valid & (key == threshold)
            room = kept - tl.sum(above.to(tl.int32), axis=0)
            take = above | (tied & (tl.cumsum(tied.to(tl.int32), axis=0) <= room))
            slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(scores_ptr + d * B + slot, ext, mask=take)
            tl.store(ranks_ptr + d * B + slot, rank.to(tl.int64), mask=take)
            row = paths_ptr + (d * B + slot) * DEPTH
            parent_row = paths_ptr + ((d - 1) * B + parent) * DEPTH
            for column in range(0, d):
                tl.store(row + column, tl.load(parent_row + column, mask=take, other=0), mask=take)
            tl.store(row + d, slot.to(tl.int64), mask=take)
            tl.debug_barrier()
            width = kept


def warps(block: int) -> int:
    """The program's warps for ``block`` extensions (scripts/bench_tree_graph.py --beam-warps times others)."""
    return 8 if block > 1024 else 4


def beam_widths(depth_limit: int, k: int, budget: int) -> list[int]:
    """Each depth's beam width, known without reading the device: ``min(B, K)``, then ``min(B, width * K)``."""
    widths = [min(budget, k)]
    for _ in range(1, depth_limit):
        widths.append(min(budget, widths[-1] * k))
    return widths


def beams_in_one_launch(
    lp: torch.Tensor, budget: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """``(scores, ranks, paths)`` per depth, as :func:`.device_tree.build_tree_with_ancestors` keeps its beams:
    ``lp`` the per-depth top-K log-probs (float64 ``[L, K]``); each beam in lexicographic order, ``paths[d]``
    ``[width, L]`` the beam indices of every node's ancestors at depths 0..d (itself last), then -1."""
    scores, ranks, paths = beam_slots_in_one_launch(lp, budget)
    widths = beam_widths(*lp.shape, budget)
    return (
        [scores[d, :w] for d, w in enumerate(widths)],
        [ranks[d, :w] for d, w in enumerate(widths)],
        [paths[d, :w] for d, w in enumerate(widths)],
    )


def beam_slots_in_one_launch(lp: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`beams_in_one_launch`'s beams as the launch leaves them, every depth ``budget`` slots wide (those past
    a depth's width unwritten): scores float64 ``[L, B]``, ranks ``[L, B]``, paths ``[L, B, L]``."""
    if triton is None:
        raise RuntimeError("beams_in_one_launch needs Triton")
    depth_limit, k = lp.shape
    if budget * k > MAX_EXTENSIONS:
        raise ValueError(f"budget * K = {budget * k} is over {MAX_EXTENSIONS}: build the beams with tensors")
    lp = lp.contiguous()
    scores = torch.empty((depth_limit, budget), dtype=torch.float64, device=lp.device)
    ranks = torch.empty((depth_limit, budget), dtype=torch.long, device=lp.device)
    paths = torch.full((depth_limit, budget, depth_limit), -1, dtype=torch.long, device=lp.device)
    block = max(16, triton.next_power_of_2(budget * k))
    sizes = {"DEPTH": depth_limit, "K": k, "B": budget, "BLOCK": block}
    _beams[(1,)](lp, scores, ranks, paths, **sizes, SPLIT=SPLIT_SEARCH, num_warps=warps(block))
    return scores, ranks, paths
