"""The DFlash block-diffusion drafter in plain PyTorch (algorithm doc §1).

Loads z-lab checkpoints unchanged: ``config.json`` (Qwen3 fields plus ``block_size``,
``num_target_layers`` and ``dflash_config``) and ``model.safetensors``. Safetensors only; no
pickle, no remote code.

Architecture, as the doc states it:

* no embedding and no LM head: the block ``[b, MASK, ...]`` is embedded with the target's
  ``embed_tokens`` and draft hidden states become logits through the target's ``lm_head``;
* context ("KV injection"): the selected target layers' hidden states are concatenated, passed
  through ``fc`` and ``hidden_norm``; every draft layer projects them with its own k/v projections
  (then ``k_norm`` and RoPE at their true positions) and prepends them as extra keys/values; they
  never enter the residual stream;
* one non-causal pass over the block; the drafter's cache keeps context K/V only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, apply_rotary_pos_emb

__all__ = ["DFlashConfig", "DFlashDrafter", "DraftCache", "default_target_layer_ids", "load_drafter", "save_drafter"]


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Layer selection when a checkpoint gives none (doc §1)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    """The drafter's config.json, split into its Qwen3 part and its DFlash part."""

    qwen3: Qwen3Config
    block_size: int
    num_target_layers: int
    mask_token_id: int
    target_layer_ids: list[int]
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def from_dir(cls, path: str | Path) -> DFlashConfig:
        config_path = Path(path) / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"drafter config not found: {config_path}")
        return cls.from_dict(json.loads(config_path.read_text()), source=str(config_path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "drafter config") -> DFlashConfig:
        missing = [k for k in ("block_size", "num_target_layers", "dflash_config") if k not in raw]
        if missing:
            raise ValueError(f"{source}: not a DFlash drafter config, missing {', '.join(missing)}")
        dflash = raw["dflash_config"]
        if "mask_token_id" not in dflash:
            raise ValueError(f"{source}: dflash_config.mask_token_id is missing")
        qwen_fields = {k: v for k, v in raw.items() if k not in ("architectures", "auto_map", "dflash_config")}
        qwen3 = Qwen3Config(**qwen_fields)
        layer_ids = dflash.get("target_layer_ids") or default_target_layer_ids(
            raw["num_target_layers"], qwen3.num_hidden_layers
        )
        return cls(
            qwen3=qwen3,
            block_size=int(raw["block_size"]),
            num_target_layers=int(raw["num_target_layers"]),
            mask_token_id=int(dflash["mask_token_id"]),
            target_layer_ids=[int(i) for i in layer_ids],
            raw=raw,
        )


class DraftCache:
    """Per-layer K/V of the committed context only (the noise block is never stored)."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class DFlashAttention(nn.Module):
    # ``attend(q, k, v, attn_mask=, scale=)``: non-causal attention over the block's keys (an engine
    # computing it another way replaces it; ddtree_conformance.testing.rounding_engines)
    attend = staticmethod(F.scaled_dot_product_attention)

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], n, self.head_dim)

    # mutates: cache (the caller's draft cache takes the new context's keys and values, as a transformers
    # cache does in a forward: the caller owns it and keeps it from one round to the next)
    def forward(self, block, context, cos, sin, cache: DraftCache | None, layer: int, attention_mask=None):
        """``block [b, S, H]`` attends to cached context, new ``context [b, C, H]`` and itself.

        ``attention_mask``: additive ``[b, 1, S, cached + C + S]`` mask, for caches whose buffers are
        longer than the context they hold (the CUDA-graph path); None: every key is attended."""
        n_new = context.shape[1]
        q = self.q_norm(self._heads(self.q_proj(block), self.num_heads)).transpose(1, 2)
        kv_in = torch.cat([context, block], dim=1)
        k = self.k_norm(self._heads(self.k_proj(kv_in), self.num_kv_heads)).transpose(1, 2)
        v = self._heads(self.v_proj(kv_in), self.num_kv_heads).transpose(1, 2)
        # cos/sin cover [new context, block]; queries take the block part.
        q, _ = apply_rotary_pos_emb(q, q, cos[:, n_new:], sin[:, n_new:])
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        k_ctx, k_blk = k[:, :, :n_new], k[:, :, n_new:]
        v_ctx, v_blk = v[:, :, :n_new], v[:, :, n_new:]
        if cache is not None:
            k_ctx, v_ctx = cache.extend(layer, k_ctx, v_ctx)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = self.attend(q, k, v, attn_mask=attention_mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(block.shape[0], block.shape[1], -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, context, cos, sin, cache, layer, attention_mask=None):
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), context, cos, sin, cache, layer, attention_mask)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDrafter(nn.Module):
    """DFlash drafter; parameter names match z-lab's safetensors exactly."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        qc = config.qwen3
        self.layers = nn.ModuleList([DFlashLayer(qc) for _ in range(qc.num_hidden_layers)])
        self.fc = nn.Linear(len(config.target_layer_ids) * qc.hidden_size, qc.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(qc.hidden_size, eps=qc.rms_norm_eps)
        self.norm = Qwen3RMSNorm(qc.hidden_size, eps=qc.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(qc)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def new_cache(self) -> DraftCache:
        return DraftCache(len(self.layers))

    def forward(
        self,
        block_embeds: torch.Tensor,
        target_features: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DraftCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One non-causal drafting pass.

        ``block_embeds [b, S, H]``: target embeddings of ``[b, MASK, ...]``.
        ``target_features [b, C, len(ids)*H]``: concatenated selected-layer hidden states of the C
        committed tokens not yet in ``cache`` (C may be 0).
        ``position_ids [b, C+S]``: positions of those C tokens, then of the block.
        ``attention_mask``: see :meth:`DFlashAttention.forward` (None: attend to every cached key).
        Returns the block's final hidden states ``[b, S, H]`` (apply the target's lm_head).
        """
        context = self.hidden_norm(self.fc(target_features))
        cos, sin = self.rotary_emb(block_embeds, position_ids)
        hidden = block_embeds
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, context, cos, sin, cache, index, attention_mask)
        return self.norm(hidden)


def load_drafter(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> DFlashDrafter:
    """Load a z-lab-format drafter directory (config.json + *.safetensors)."""
    path = Path(path)
    config = DFlashConfig.from_dir(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in drafter dir {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    model = DFlashDrafter(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(
            f"drafter weights in {path} do not match the DFlash layout: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    inv_freq = model.rotary_emb.inv_freq.clone()
    model = model.to(device=device, dtype=dtype).eval()
    model.rotary_emb.inv_freq = inv_freq.to(device)  # RoPE frequencies stay float32
    return model


def save_drafter(model: DFlashDrafter, path: str | Path) -> None:
    """Write ``model`` in z-lab format: its config.json and one model.safetensors (no prefix)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(model.config.raw, indent=2, sort_keys=True) + "\n")
