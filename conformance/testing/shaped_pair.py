"""Random-weight target/drafter pairs of a real model's shape, built directly on the device.

For timing work, not acceptance: random weights accept almost nothing, but a round costs what it
costs on the real shape. ``8b`` is Qwen3-8B (hidden 4096, 36 layers, 32 query / 8 KV heads of
128, intermediate 12288, vocabulary 151,936) with a drafter of the z-lab Qwen3-8B-DFlash-b16 shape
(5 layers of the target's width, block 16, features from target layers 1, 9, 17, 25, 33).
``tiny`` is the same structure small enough for a CPU test. Weights are created in place by the
modules' own initialisers under ``torch.device(device)`` and the requested default dtype: nothing
is downloaded, nothing is written but the two ``config.json`` files.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ddtree_conformance.adapters.reference.dflash import DFlashConfig, DFlashDrafter, default_target_layer_ids
from ddtree_conformance.drafter_config import drafter_config_dict

__all__ = ["SHAPES", "build_shaped_pair", "random_prompts"]

SHAPES = {
    "8b": dict(
        hidden=4096, inter=12288, layers=36, heads=32, kv=8, head_dim=128, vocab=151936, draft_layers=5, block=16
    ),
    "tiny": dict(hidden=64, inter=128, layers=4, heads=4, kv=2, head_dim=16, vocab=512, draft_layers=1, block=8),
}


def build_shaped_pair(shape: str | dict, dtype: torch.dtype, device: str, root: str | Path):
    """``(target_dir, drafter_dir, target, drafter)``: configs under ``root``, models on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    s = SHAPES[shape] if isinstance(shape, str) else shape
    root = Path(root)
    cfg = Qwen3Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        head_dim=s["head_dim"],
        max_position_embeddings=40960,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )
    cfg.save_pretrained(root / "target")
    ids = default_target_layer_ids(s["layers"], s["draft_layers"])
    raw = drafter_config_dict(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        num_heads=s["heads"],
        head_dim=s["head_dim"],
        num_layers=s["draft_layers"],
        num_target_layers=s["layers"],
        target_layer_ids=ids,
        mask_token_id=s["vocab"] - 2,
        intermediate_size=s["inter"],
        block_size=s["block"],
        max_position_embeddings=40960,
    )
    raw["num_key_value_heads"] = s["kv"]
    (root / "drafter").mkdir(parents=True, exist_ok=True)
    (root / "drafter" / "config.json").write_text(json.dumps(raw))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = Qwen3ForCausalLM(cfg).eval()
            drafter = DFlashDrafter(DFlashConfig.from_dict(raw)).eval()
    finally:
        torch.set_default_dtype(previous)
    return root / "target", root / "drafter", target, drafter


def random_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids below ``vocab - 2`` (the mask token is vocab - 2)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab - 2, (length,), generator=g).tolist() for _ in range(count)]
