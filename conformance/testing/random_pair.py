"""A tiny random-weight Qwen3 target + DFlash drafter in z-lab format, for tests.

Random weights make greedy output repetitive, so this pair is for structural tests (losslessness,
branch-vs-chain, compaction), never for acceptance numbers: the trained fixture under ``golden/``
is for those.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["drafter_config_dict", "write_random_pair", "write_random_prompts"]


def drafter_config_dict(
    *,
    vocab_size: int,
    hidden_size: int,
    num_heads: int,
    head_dim: int,
    num_layers: int,
    num_target_layers: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    block_size: int = 16,
    intermediate_size: int | None = None,
    rope_theta: float = 10000.0,
    max_position_embeddings: int = 2048,
) -> dict:
    """A z-lab-style drafter config.json as a dict."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size or 3 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "attention_bias": False,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_layers,
        "block_size": block_size,
        "num_target_layers": num_target_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": target_layer_ids},
        "torch_dtype": "float32",
    }


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
