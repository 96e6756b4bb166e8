"""Synthetic model pairs whose behaviour is known exactly.

A *bigram* target is a real Qwen3 checkpoint whose next-token logits depend only on the current
token: attention and MLP outputs are zeroed, so the final hidden state is the normalised token
embedding, and ``lm_head`` maps it to a fixed row of a logit table. Any engine that loads Qwen3
runs it, and the exact output distribution of plain decoding is known from the table, so the
sampling check can test against the truth rather than against another engine.

Drafters:
* ``random``: random weights, a deliberately poor drafter (sampling check);
* ``echo``: returns the normalised block embedding, so every depth drafts from the table row of
  the mask token. With a table that makes token 0 and the mask id likely, trees are full of them
  (edge check: token 0 drafted, real tokens equal to the mask id).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .drafter_config import drafter_config_dict

__all__ = ["sampling_table", "edge_table", "write_bigram_pair"]


def sampling_table(vocab: int = 12, seed: int = 7) -> torch.Tensor:
    """Logit table ``[V, V]`` with spread-out rows (top-k/top-p make a visible difference)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn((vocab, vocab), generator=g) * 1.5


def edge_table(vocab: int = 12) -> torch.Tensor:
    """Greedy cycle 3 -> 0 -> MASK -> 0 -> MASK ...; the mask token (id V-1) drafts 0 and MASK."""
    mask = vocab - 1
    table = torch.linspace(-2.0, -3.0, vocab).repeat(vocab, 1)
    for current in range(vocab):
        table[current, 0] = 4.0 if current != 0 else 1.0
        table[current, mask] = 3.0 if current != 0 else 5.0
    table[mask, 0], table[mask, mask] = 5.0, 4.0
    return table


def write_bigram_pair(
    root: str | Path, table: torch.Tensor, drafter: str = "random", seed: int = 0, block_size: int = 6
) -> tuple[Path, Path]:
    """Write ``root/target`` and ``root/drafter`` for ``table``; the mask id is ``V - 1``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ddtree_conformance.adapters.reference.dflash import DFlashConfig, DFlashDrafter, save_drafter

    root = Path(root)
    vocab = table.shape[0]
    hidden, heads, head_dim = 64, 2, 32
    if vocab > hidden:
        raise ValueError(f"bigram pair: vocab {vocab} must be <= hidden size {hidden}")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    target = Qwen3ForCausalLM(config)
    with torch.no_grad():
        embed = torch.zeros(vocab, hidden)
        embed[torch.arange(vocab), torch.arange(vocab)] = 1.0  # one-hot; RMSNorm scales to sqrt(H)
        target.model.embed_tokens.weight.copy_(embed)
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        target.model.norm.weight.fill_(1.0)
        head = torch.zeros(vocab, hidden)
        head[:, :vocab] = table.t() / math.sqrt(hidden)
        target.lm_head.weight.copy_(head)
    target.save_pretrained(root / "target", safe_serialization=True)

    draft = DFlashDrafter(
        DFlashConfig.from_dict(
            drafter_config_dict(
                vocab_size=vocab,
                hidden_size=hidden,
                num_heads=heads,
                head_dim=head_dim,
                num_layers=1,
                num_target_layers=2,
                target_layer_ids=[0],
                mask_token_id=vocab - 1,
                block_size=block_size,
                max_position_embeddings=512,
            )
        )
    )
    with torch.no_grad():
        if drafter == "echo":
            for layer in draft.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        elif drafter == "random":
            for p in draft.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.3)
        else:
            raise ValueError(f"unknown synthetic drafter {drafter!r}")
    save_drafter(draft, root / "drafter")
    (root / "PAIR.json").write_text(json.dumps({"kind": "bigram", "drafter": drafter, "table": table.tolist()}) + "\n")
    return root / "target", root / "drafter"
