"""Tree attention on vLLM's CPU backend: the ancestor-only mask for tree-verification rows.

vLLM 0.32's CPU kernel (``ops.cpu_attention_with_kv_cache``) takes no mask and returns no LSE, and
its paged KV layout is private (K transposed per block for ``vec``, VNNI-packed for ``amx``). So
the target's attention layers get :class:`TreeAttentionImpl`, a subclass of the stock impl that

* mirrors every K/V row it writes into a plain ``[slots, 2, kv_heads, head_dim]`` shadow of the
  paged cache (same slot numbers), through the stock ``do_kv_cache_update``;
* runs the stock kernel for the whole batch, then, for each request verifying a tree, recomputes
  the rows of its tree nodes in float32 with the ancestor-or-self mask over the request's
  context gathered from the shadow, and overwrites them.

Only target layers are switched (``impl.__class__``); the drafter's layers and every other vLLM
instance keep the stock impl. The tree rows of a batch arrive on the attention metadata object as
``ddtree_batch`` (set by the runner after vLLM builds the metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

from .tree import visibility  # noqa: F401  (re-exported: the mask this impl applies)

__all__ = ["TreeRows", "TreeAttentionImpl", "visibility", "UNSUPPORTED_LAYER_FEATURES"]


@dataclass
class TreeRows:
    """One request's tree in the flat verify batch."""

    req_index: int  # row of the request in the block table
    root_row: int  # batch row of the root; nodes 1..n follow it
    start: int  # sequence index (and position) of the root
    parents: list[int]  # per node, root -1
    visible: torch.Tensor  # bool [n, start + 1 + n]: what node rows 1..n may attend to
    block_row: torch.Tensor | None = None  # the request's block-table row, as the kernel reads it


# Impl attributes that change attention in ways the torch recompute does not model.
UNSUPPORTED_LAYER_FEATURES = {
    "sliding_window": lambda impl: impl.sliding_window not in (-1, None),
    "attention sinks": lambda impl: impl.sinks is not None,
    "logits soft-capping": lambda impl: bool(impl.logits_soft_cap),
    "ALiBi": lambda impl: impl.alibi_slopes is not None,
    "fp8 KV cache": lambda impl: bool(impl.is_fp8_kv_cache),
}


class TreeAttentionImpl(CPUAttentionBackendImpl):
    """The stock CPU impl plus the shadow KV and the tree-row recompute (see module doc)."""

    _shadow: torch.Tensor | None = None

    def shadow(self, kv_cache: torch.Tensor) -> torch.Tensor:
        num_blocks, kv_heads, block_size, twice_dim = kv_cache.shape
        slots = num_blocks * block_size
        if self._shadow is None or self._shadow.shape[0] != slots:
            self._shadow = torch.zeros(slots, 2, kv_heads, twice_dim // 2, dtype=kv_cache.dtype)
        return self._shadow

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        n = min(int(slot_mapping.shape[0]), int(key.shape[0]))
        slots = slot_mapping[:n].long()
        keep = slots >= 0
        shadow = self.shadow(kv_cache)
        shadow[slots[keep], 0] = key[:n][keep].to(shadow.dtype)
        shadow[slots[keep], 1] = value[:n][keep].to(shadow.dtype)

    def forward(
        self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None, output_block_scale=None
    ):
        out = super().forward(
            layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
        trees = getattr(attn_metadata, "ddtree_batch", None) if attn_metadata is not None else None
        if not trees:
            return out
        shadow = self.shadow(kv_cache)
        block_size = kv_cache.shape[2]
        heads, dim = self.num_heads, self.head_size
        rows_out = output.view(output.shape[0], heads, dim)
        for tree in trees:
            n = len(tree.parents) - 1
            if n == 0:
                continue
            length = tree.start + 1 + n
            seq = torch.arange(length)
            blocks = attn_metadata.block_table[tree.req_index, seq // block_size].long()
            kv = shadow[blocks * block_size + seq % block_size].float()  # [T, 2, kv_heads, dim]
            keys = kv[:, 0].repeat_interleave(self.num_queries_per_kv, dim=1).transpose(0, 1)  # [H, T, D]
            values = kv[:, 1].repeat_interleave(self.num_queries_per_kv, dim=1).transpose(0, 1)
            rows = slice(tree.root_row + 1, tree.root_row + 1 + n)
            q = query[rows].view(n, heads, dim).float().transpose(0, 1)  # [H, n, D]
            scores = torch.matmul(q, keys.transpose(1, 2)) * self.scale
            scores = scores.masked_fill(~tree.visible.unsqueeze(0), float("-inf"))
            attended = torch.matmul(torch.softmax(scores, dim=-1), values)  # [H, n, D]
            rows_out[rows] = attended.transpose(0, 1).to(rows_out.dtype)
        return out
