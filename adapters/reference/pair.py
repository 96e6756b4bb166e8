"""Loading and validating a target/drafter pair for the reference engine, and the loaded pair itself
(:class:`LoadedPair`: the models for one dtype and device, the drafter's feature hooks, the fast path's
state).

Every way a pair can be wrong gets one :class:`PairError` that names the directory and field.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..interface import EngineError
from .decoders import FastPathState
from .dflash import DFlashConfig, DFlashDrafter, load_drafter

__all__ = ["LoadedPair", "PairError", "TargetInfo", "read_target_info", "validate_pair", "load_target", "TORCH_DTYPES"]

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PairError(EngineError):
    """The model directories cannot be used; the message names the path and the field."""


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    vocab_size: int
    hidden_size: int
    num_layers: int
    max_position_embeddings: int | None
    num_attention_heads: int = 1
    num_key_value_heads: int = 1
    intermediate_size: int = 1


def read_target_info(model_dir: str | Path) -> TargetInfo:
    path = Path(model_dir)
    config_path = path / "config.json"
    if not path.is_dir():
        raise PairError(f"target model dir not found: {path}")
    if not config_path.is_file():
        raise PairError(f"target model dir {path} has no config.json")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise PairError(f"{config_path} is not valid JSON: {exc}") from None
    for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if key not in raw:
            raise PairError(f"{config_path}: field {key} is missing")
    return TargetInfo(
        path=path,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        max_position_embeddings=raw.get("max_position_embeddings"),
        num_attention_heads=int(raw.get("num_attention_heads", 1)),
        num_key_value_heads=int(raw.get("num_key_value_heads", raw.get("num_attention_heads", 1))),
        intermediate_size=int(raw.get("intermediate_size", 1)),
    )


def read_drafter_config(drafter_dir: str | Path) -> DFlashConfig:
    path = Path(drafter_dir)
    if not path.is_dir():
        raise PairError(f"drafter model dir not found: {path}")
    try:
        return DFlashConfig.from_dir(path)
    except (FileNotFoundError, ValueError, TypeError, json.JSONDecodeError) as exc:
        raise PairError(f"drafter {path}: {exc}") from None


def validate_pair(target: TargetInfo, drafter: DFlashConfig, drafter_dir: str | Path) -> None:
    """Raise :class:`PairError` if the drafter cannot draft for this target."""
    where = f"drafter {drafter_dir} vs target {target.path}"
    dq = drafter.qwen3
    if dq.hidden_size != target.hidden_size:
        raise PairError(f"{where}: hidden_size {dq.hidden_size} != target hidden_size {target.hidden_size}")
    if getattr(dq, "vocab_size", target.vocab_size) != target.vocab_size:
        raise PairError(f"{where}: vocab_size {dq.vocab_size} != target vocab_size {target.vocab_size}")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        raise PairError(
            f"{where}: dflash_config.target_layer_ids {drafter.target_layer_ids} has {bad} outside "
            f"the target's {target.num_layers} layers"
        )
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        raise PairError(
            f"{where}: dflash_config.mask_token_id {drafter.mask_token_id} is outside the vocabulary "
            f"(size {target.vocab_size})"
        )
    if drafter.block_size < 2:
        raise PairError(f"{where}: block_size {drafter.block_size} must be >= 2")


def load_target(model_dir: str | Path, dtype: torch.dtype, device: str, tensor_parallel_size: int = 1):
    """The target on ``device``; with ``tensor_parallel_size`` > 1, this rank's shard of it.

    Sharding uses transformers' own plan for the architecture and needs the process group to be
    up (see :mod:`.tensor_parallel`); transformers places the shard on this rank's device.
    """
    from transformers import AutoModelForCausalLM

    info = read_target_info(model_dir)
    if not any(Path(model_dir).glob("*.safetensors")):
        raise PairError(f"target model dir {model_dir} has no .safetensors weights")
    if tensor_parallel_size == 1:
        model = AutoModelForCausalLM.from_pretrained(
            str(info.path), dtype=dtype, attn_implementation="sdpa", use_safetensors=True
        )
        return model.to(device).eval(), info
    if importlib.util.find_spec("accelerate") is None:
        raise EngineError(
            f"reference engine: tensor_parallel_size={tensor_parallel_size} needs the 'accelerate' "
            "package (transformers loads tensor-parallel shards through it): pip install accelerate"
        )
    from transformers import DistributedConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(info.path),
        dtype=dtype,
        attn_implementation="sdpa",
        use_safetensors=True,
        distributed_config=DistributedConfig(tp_plan="auto", tp_size=tensor_parallel_size),
    )
    return model.eval(), info


def load_drafter_checked(drafter_dir: str | Path, target: TargetInfo, dtype, device) -> DFlashDrafter:
    config = read_drafter_config(drafter_dir)
    validate_pair(target, config, drafter_dir)
    try:
        return load_drafter(drafter_dir, dtype=dtype, device=device)
    except (FileNotFoundError, ValueError) as exc:
        raise PairError(str(exc)) from None


class LoadedPair:
    """Target (+ drafter) loaded for one (dtype, device), with hooks capturing drafter features."""

    def __init__(self, target, info, drafter, dtype: torch.dtype, device: str):
        self.device = torch.device(device)
        self.dtype = dtype
        self.target, self.info, self.drafter = target, info, drafter
        self._features: dict[int, torch.Tensor] = {}
        self._fast: FastPathState | None = None
        if drafter is not None:
            layers = self.target.model.layers
            for layer_id in drafter.config.target_layer_ids:
                layers[layer_id].register_forward_hook(self._capture(layer_id))

    @classmethod
    def load(
        cls, model_dir: str, drafter_dir: str | None, dtype: torch.dtype, device: str, tensor_parallel_size: int = 1
    ) -> LoadedPair:
        target, info = load_target(model_dir, dtype, device, tensor_parallel_size)
        drafter = None if drafter_dir is None else load_drafter_checked(drafter_dir, info, dtype, device)
        return cls(target, info, drafter, dtype, device)

    def _capture(self, layer_id: int):
        def hook(_module, _inputs, output):
            self._features[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None = None):
        """Target forward of one sequence; returns logits ``[T, V]`` and features ``[T, k*H]``."""
        out = self.target(
            input_ids=ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        features = None
        if self.drafter is not None:
            features = torch.cat([self._features[i][0] for i in self.drafter.config.target_layer_ids], dim=-1)
        return out.logits[0], features

    @property
    def fast_path_started(self) -> bool:
        return self._fast is not None

    def fast_path(self) -> FastPathState:
        """The fast path's graphs and static caches for this pair (made on first use)."""
        if self._fast is None:
            self._fast = FastPathState(self, capture=True)
        return self._fast

    def draft_logits(
        self,
        root: int,
        start: int,
        context: torch.Tensor,
        context_start: int,
        cache,
        block_offset: int = 0,
        rows: int | None = None,
    ) -> torch.Tensor:
        """Drafter logits ``[S-1, V]`` for the positions after ``root`` (doc §1).

        ``block_offset`` moves the block's positions against the context's (0 is right; mutants only).
        ``rows``: draft that many positions from a block cut to ``rows + 1`` tokens (default S - 1)."""
        drafter = self.drafter
        size = drafter.block_size if rows is None else rows + 1
        block = torch.full((1, size), drafter.config.mask_token_id, dtype=torch.long, device=self.device)
        block[0, 0] = root
        embeds = self.target.get_input_embeddings()(block)
        positions = torch.arange(context_start, start + size, device=self.device)
        positions[start - context_start :] += block_offset
        positions = positions.unsqueeze(0)
        hidden = drafter(embeds, context.unsqueeze(0), positions, cache)
        return self.target.get_output_embeddings()(hidden[0, 1:])
