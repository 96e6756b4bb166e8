"""A tiny random-weight Qwen3 target + DFlash drafter in z-lab format, for tests.

Random weights make greedy output repetitive, so this pair is for structural tests (losslessness,
branch-vs-chain, compaction), never for acceptance numbers: the trained fixture under ``golden/``
is for those.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ddtree_conformance.drafter_config import drafter_config_dict

__all__ = ["write_random_pair", "write_random_prompts"]


def write_random_pair(
    root: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 97,
    hidden_size: int = 64,
    num_heads: int = 2,
    head_dim: int = 32,
    target_layers: int = 3,
    block_size: int = 8,
    max_position_embeddings: int = 256,
    weight_scale: float = 1.0,
) -> tuple[Path, Path]:
    """Write ``root/target`` and ``root/drafter``; returns both paths."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from ddtree_conformance.adapters.reference.dflash import DFlashConfig, DFlashDrafter, save_drafter

    root = Path(root)
    torch.manual_seed(seed)
    target_config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=target_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    target = Qwen3ForCausalLM(target_config)
    with torch.no_grad():  # larger logits give varied, non-degenerate greedy output
        target.lm_head.weight.mul_(weight_scale * 8.0)
    target.save_pretrained(root / "target", safe_serialization=True)

    config = DFlashConfig.from_dict(
        drafter_config_dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            num_heads=num_heads,
            head_dim=head_dim,
            num_layers=1,
            num_target_layers=target_layers,
            target_layer_ids=[0, target_layers - 2] if target_layers > 2 else [0],
            mask_token_id=vocab_size - 1,
            block_size=block_size,
            max_position_embeddings=max_position_embeddings,
        )
    )
    drafter = DFlashDrafter(config)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    save_drafter(drafter, root / "drafter")
    (root / "PAIR.json").write_text(json.dumps({"kind": "random", "seed": seed}) + "\n")
    return root / "target", root / "drafter"


def write_random_prompts(
    path: str | Path, lengths: list[int], *, seed: int, prefix: str = "p", vocab: int = 96
) -> list[list[int]]:
    """A prompt set (JSON lines ``{"id": "<prefix><i>", "category": "random", "prompt_ids": ...}``) of
    random token ids below ``vocab``, one prompt per length, seeded; returns the prompts' ids."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
    with Path(path).open("w") as handle:
        for i, ids in enumerate(prompts):
            handle.write(json.dumps({"id": f"{prefix}{i}", "category": "random", "prompt_ids": ids}) + "\n")
    return prompts
