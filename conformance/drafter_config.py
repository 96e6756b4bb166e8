"""The drafter's config.json in z-lab's DFlash format, as written for the pairs this suite builds.

The synthetic pairs (:mod:`ddtree_conformance.synthetic`), the test pairs
(:mod:`ddtree_conformance.testing.random_pair`, :mod:`ddtree_conformance.testing.shaped_pair`) and the
trained fixture (``scripts/build_fixture.py``) all write their drafter's config from this one function,
which :class:`~ddtree_conformance.adapters.reference.dflash.DFlashConfig` reads back.
"""

from __future__ import annotations

__all__ = ["drafter_config_dict"]


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
