"""The drafter's per-depth top-K (:func:`ddtree_conformance.spec.tree.per_depth_topk`) in two Triton launches,
for the tree build on a GPU (issue 29).

The spec orders a depth's candidates by float32 log-prob, descending, equal log-probs by the smaller token
id. It makes that one ``topk`` over int64 keys (the log-prob's bits mapped to an integer in the same order,
the reversed token id below them), so every key is distinct. Over 15 x 151936 candidates that costs about
250 us inside the round's graph on an H100: a radix select over 64-bit keys, a few rows wide, plus the
element-wise kernels that build the keys. Here, after the same ``log_softmax``:

* **Chunks.** Each program takes ``CHUNK`` log-probs of one depth, builds the same keys in registers and keeps
  its ``KP`` largest (``KP`` = K rounded up to a power of two) with Triton's bitonic ``topk``.
* **Merge.** One program per depth takes the chunks' survivors, keeps the ``KP`` largest, reads the token
  ids back out of the keys and gathers their log-probs.

The keys are the spec's, so the result is the spec's bit for bit (``tests/test_beam_kernel.py`` runs both
through Triton's interpreter on CPU and compares them with :func:`per_depth_topk`).
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of PyTorch; a CPU-only install has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where Triton is missing
    triton = None

__all__ = ["MAX_K", "kernel_available", "topk_in_two_launches"]

MAX_K = 128  # larger K (B > 128) keeps the spec's torch.topk: the merge would hold too many survivors
CHUNK = 4096  # log-probs per program in the first launch
WARPS = 8  # per program of either launch (the same results at 1, 4 and 8 on an H100; 8 not timed against others)


def kernel_available(device: torch.device, k: int) -> bool:
    """Whether :func:`topk_in_two_launches` serves this build: Triton present, a CUDA device, ``K <= MAX_K``."""
    return triton is not None and device.type == "cuda" and k <= MAX_K


if triton is not None:

    @triton.jit
    def _keys(lp_ptr, offs, valid, vocab, ID_BITS: tl.constexpr):
        """The spec's int64 keys of the log-probs at ``offs`` (the smallest int64 where not ``valid``)."""
        x = tl.load(lp_ptr + offs, mask=valid, other=0.0)
        x = tl.where(x == 0.0, 0.0, x)  # -0.0 as +0.0, as the spec's `+ 0.0`
        bits = x.to(tl.int32, bitcast=True).to(tl.int64)
        ordered = tl.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)  # monotone in the float value
        key = (ordered << ID_BITS) | (vocab - 1 - offs)
        return tl.where(valid, key, -9223372036854775808)

    @triton.jit
    def _chunk_tops(lp_ptr, tops_ptr, vocab, chunks, ID_BITS: tl.constexpr, CHUNK: tl.constexpr, KP: tl.constexpr):
        row, chunk = tl.program_id(0), tl.program_id(1)
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        key = _keys(lp_ptr + row * vocab, offs, offs < vocab, vocab, ID_BITS)
        tl.store(tops_ptr + (row * chunks + chunk) * KP + tl.arange(0, KP), tl.topk(key, KP))

    @triton.jit
    def _merge(
        tops_ptr, lp_ptr, out_lp_ptr, out_ids_ptr, vocab, k, survivors, ID_BITS: tl.constexpr, N: tl.constexpr,
        KP: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        offs = tl.arange(0, N)
        key = tl.load(tops_ptr + row * survivors + offs, mask=offs < survivors, other=-9223372036854775808)
        top = tl.topk(key, KP)  # descending: the spec's order
        ids = (vocab - 1) - (top & ((1 << ID_BITS) - 1))
        rank = tl.arange(0, KP)
        keep = rank < k
        value = tl.load(lp_ptr + row * vocab + ids, mask=keep, other=0.0)
        value = tl.where(value == 0.0, 0.0, value)
        tl.store(out_ids_ptr + row * k + rank, ids, mask=keep)
        tl.store(out_lp_ptr + row * k + rank, value.to(tl.float64), mask=keep)


def topk_in_two_launches(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~ddtree_conformance.spec.tree.per_depth_topk`'s ``(log_probs float64 [L, k], token_ids int64
    [L, k])``, the top-K of each depth in two launches after the spec's ``log_softmax`` (module doc)."""
    if triton is None:
        raise RuntimeError("topk_in_two_launches needs Triton")
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    depth, vocab = draft_logits.shape
    if not 1 <= k <= min(vocab, MAX_K):
        raise ValueError(f"k = {k} must be in 1..min(V, {MAX_K}) = {min(vocab, MAX_K)}")
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1).contiguous()
    id_bits = max(1, (vocab - 1).bit_length())
    kp = max(16, triton.next_power_of_2(k))
    chunk = max(kp, min(CHUNK, triton.next_power_of_2(vocab)))  # a chunk holds at least its KP survivors
    chunks = triton.cdiv(vocab, chunk)
    device = draft_logits.device
    tops = torch.empty((depth, chunks * kp), dtype=torch.long, device=device)
    _chunk_tops[(depth, chunks)](log_probs, tops, vocab, chunks, ID_BITS=id_bits, CHUNK=chunk, KP=kp, num_warps=WARPS)
    out_lp = torch.empty((depth, k), dtype=torch.float64, device=device)
    out_ids = torch.empty((depth, k), dtype=torch.long, device=device)
    survivors = chunks * kp
    n = max(kp, triton.next_power_of_2(survivors))
    _merge[(depth,)](
        tops, log_probs, out_lp, out_ids, vocab, k, survivors, ID_BITS=id_bits, N=n, KP=kp, num_warps=WARPS
    )
    return out_lp, out_ids
