"""Correct engines that round differently from the reference: other kernels, other GEMM shapes, other
orders of the same arithmetic. Each is faithful to DDTree (the reference's loop, the spec's tree, walk
and commit) and differs only in *how* the target and the drafter compute, the way an engine written
elsewhere does. In float32 each equals the reference up to float rounding; in bfloat16 and float16
each moves some near ties of the target and the drafter to the other side, in both directions.

They are what the noise model (:mod:`ddtree_conformance.noise`) is calibrated on beside the reference,
and what it is held to: every one must pass every check in every dtype, on CPU and CUDA, traced and as
a black box (:func:`black_box`: outputs and per-round acceptance lengths only, as vLLM and SGLang
report).

Each engine patches the loaded modules of its pair (target: transformers' Qwen3 modules; drafter: the
reference's DFlash modules) and always runs them eagerly: the reference's fused fast path computes its
own way, so these engines declare no CUDA-graph switch (``capabilities().cuda_graphs`` False).

The numerics, one per engine:

* :class:`MatmulSoftmaxAttention`: attention as two matmuls and a float32 softmax (transformers'
  eager attention) where the reference calls ``scaled_dot_product_attention``;
* :class:`OnlineSoftmaxAttention`: attention over key blocks of 32 with a running max and sum in
  float32 (the FlashAttention order), rounding the output once;
* :class:`Float32KvCache`: keys and values normalised, rotated, cached and attended in float32 under
  low-precision weights;
* :class:`FusedProjections`: one GEMM for q/k/v (the drafter: k/v) and one for gate/up;
* :class:`SplitKReductions`: every linear layer's reduction split into chunks of 64 inputs, each
  partial product rounded to the run's dtype and summed in it (a split-K GEMM without a float32
  workspace);
* :class:`FusedRmsNorm`: RMSNorm with the weight applied in float32 and one rounding at the end (a
  fused kernel) where transformers rounds before the weight;
* :class:`PaddedGemmRows`: every linear layer's rows padded to a multiple of 64, as when a request's
  tokens share a GEMM with other requests' (other shapes, other kernel choices);
* :class:`BatchVariantAttention`: SDPA alone, FlashAttention's order in an engine call holding two
  requests or more (batch-variant kernels: a request rounds one way alone, another in company);
* :class:`Float64LogProbs`: the drafter's log-probabilities by another log-softmax kernel (float64, then
  rounded to float32) before the spec's heap: tree scores a bit or two away from the spec's float32
  kernel, so prefixes of nearly equal score may come out of the heap in the other order.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_conformance.adapters.interface import Capabilities, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.spec import build_tree

__all__ = ["AGGREGATE_BOXES", "BLACK_BOXES", "ROUNDING_ENGINES", "RoundsDifferently", "aggregate_box", "black_box"]

_CHUNK = 64  # split-K chunk (inputs per partial product) and the row padding of PaddedGemmRows
_KEY_BLOCK = 32  # keys per block of the online softmax


class RoundsDifferently(ReferenceEngine):
    """The reference's loop on modules patched by :meth:`numerics` (once per loaded pair), always eager."""

    name = "rounds-differently"

    def numerics(self, target: nn.Module, drafter: nn.Module | None) -> None:
        """Patch the loaded ``target`` (transformers' Qwen3) and ``drafter`` (DFlash) in place."""
        raise NotImplementedError

    def _pair(self, config: RunConfig):
        key = (config.dtype, config.device, config.tensor_parallel_size)
        fresh = key not in self._loaded
        pair = super()._pair(config)
        if fresh:
            with torch.no_grad():
                self.numerics(pair.target, pair.drafter)
        return pair

    def fast_path_on(self, config: RunConfig) -> bool:
        return False  # the patched modules, never the reference's fused fast path

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"cuda_graphs": False})


# ------------------------------------------------------------------------------------------ helpers
def _modules(root: nn.Module | None, kind: type | str) -> list[nn.Module]:
    if root is None:
        return []
    return [m for m in root.modules() if (type(m).__name__ == kind if isinstance(kind, str) else isinstance(m, kind))]


def _rebind(module: nn.Module, forward: Callable) -> None:
    module.forward = types.MethodType(forward, module)


def _attention_modules(target, drafter) -> list[nn.Module]:
    return _modules(target, "Qwen3Attention") + _modules(drafter, "DFlashAttention")


def _set_attention(target, drafter, attend: Callable) -> None:
    """Every attention of both models through ``attend(q, k, v, mask, scale) -> out`` (``[b, h, T, d]``
    inputs, keys and values already repeated to the query heads; ``mask`` additive or None)."""
    from transformers import AttentionInterface
    from transformers.models.qwen3.modeling_qwen3 import repeat_kv

    name = f"ddtree-{attend.__name__}"

    def interface(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        rows, columns = query.shape[-2], key.shape[-2]
        if attention_mask is None and rows > 1 and getattr(module, "is_causal", True):  # as SDPA's is_causal
            ones = torch.ones(rows, columns, dtype=torch.bool, device=query.device)
            attention_mask = torch.tril(ones, diagonal=columns - rows)
        out = attend(query, repeat_kv(key, groups), repeat_kv(value, groups), attention_mask, scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(name, interface)
    if target is not None:
        target.set_attn_implementation(name)
    for module in _modules(drafter, "DFlashAttention"):
        module.attend = lambda q, k, v, attn_mask=None, scale=None, **_: attend(q, k, v, attn_mask, scale)


def _mask_bias(mask: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask[..., : scores.shape[-1]].to(scores.dtype)


# ------------------------------------------------------------------------------------------ engines
def matmul_softmax(q, k, v, mask, scale):
    scores = _mask_bias(mask, torch.matmul(q, k.transpose(-1, -2)) * scale)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def online_softmax(q, k, v, mask, scale):
    """FlashAttention's order: key blocks in turn, running max ``m``, sum ``l`` and output in float32.

    Per block ``s`` of scores: ``m' = max(m, max s)``, ``p = exp(s - m')``, ``c = exp(m - m')``,
    ``l' = l c + sum p``, ``out' = out c + p v`` (``m'`` read as 0 where still ``-inf``: a row masked so far).
    The first block starts the running values (``m = max s``, ``l = sum p``, ``out = p v + 0``): the same
    bits as a start from ``m = -inf, l = 0, out = 0``, and the casts and the mask's negation happen once:
    16 launches for 30 at one block, 15 for 23 for each block after (a CUDA cell of this tiny pair is bound
    by the host's launches)."""
    qf = q.float() * scale
    kf, vf = k.float(), v.float()
    hidden = bias = None
    if mask is not None:
        if mask.dtype == torch.bool:
            hidden = ~mask
        else:
            bias = mask.float()
    m = l_sum = acc = None
    for start in range(0, k.shape[-2], _KEY_BLOCK):
        stop = min(start + _KEY_BLOCK, k.shape[-2])
        s = torch.matmul(qf, kf[..., start:stop, :].transpose(-1, -2))
        if hidden is not None:
            s = s.masked_fill(hidden[..., start:stop], float("-inf"))
        elif bias is not None:
            s = s + bias[..., start:stop]
        block_max = s.amax(dim=-1, keepdim=True)
        m_new = block_max if m is None else torch.maximum(m, block_max)
        safe = m_new.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)  # -inf (and +inf) as 0, NaN kept
        p = torch.exp(s - safe)
        pv = torch.matmul(p, vf[..., start:stop, :])
        if m is None:
            l_sum, acc = p.sum(dim=-1, keepdim=True), pv + 0.0  # + 0.0: a -0.0 becomes +0.0, as 0 * c + pv does
        else:
            # m = -inf (a row masked so far) gives exp(-inf) = 0 as written; m = +inf makes the row NaN either way
            correction = torch.exp(m - safe)
            l_sum = l_sum * correction + p.sum(dim=-1, keepdim=True)
            acc = acc * correction + pv
        m = m_new
    return (acc / l_sum).to(q.dtype)


def float32_attention(q, k, v, mask, scale):
    out = F.scaled_dot_product_attention(
        q.float(),
        k.float(),
        v.float(),
        attn_mask=mask if mask is None or mask.dtype == torch.bool else mask.float(),
        scale=scale,
    )
    return out.to(q.dtype)


class MatmulSoftmaxAttention(RoundsDifferently):
    """Attention as ``softmax(q k^T * scale + mask) v`` with a float32 softmax, two plain matmuls."""

    name = "rounding-matmul-softmax-attention"

    def numerics(self, target, drafter):
        _set_attention(target, drafter, matmul_softmax)


class OnlineSoftmaxAttention(RoundsDifferently):
    """Attention in FlashAttention's order: key blocks of 32, running max and sum in float32."""

    name = "rounding-online-softmax-attention"

    def numerics(self, target, drafter):
        _set_attention(target, drafter, online_softmax)


class Float32KvCache(RoundsDifferently):
    """Keys and values leave their projections in float32: normalised, rotated, cached and attended
    in float32 under low-precision weights; the attention output is rounded back once."""

    name = "rounding-float32-kv-cache"

    def numerics(self, target, drafter):
        def upcast(module, x):
            return F.linear(x, module.weight, module.bias).float()

        for attention in _attention_modules(target, drafter):
            _rebind(attention.k_proj, upcast)
            _rebind(attention.v_proj, upcast)
            for norm in (attention.k_norm,):
                _rebind(norm, _norm_keeping(torch.float32))
        _set_attention(target, drafter, float32_attention)


def _norm_keeping(dtype: torch.dtype):
    def forward(module, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
        return module.weight.to(dtype) * xf.to(dtype)

    return forward


class FusedProjections(RoundsDifferently):
    """One GEMM for q/k/v (the drafter's k/v, whose input differs from q's) and one for gate/up."""

    name = "rounding-fused-projections"

    def numerics(self, target, drafter):
        for attention in _attention_modules(target, drafter):
            group = (
                [attention.q_proj, attention.k_proj, attention.v_proj]
                if type(attention).__name__ == "Qwen3Attention"
                else [attention.k_proj, attention.v_proj]
            )
            _fuse(group)
        for mlp in _modules(target, "Qwen3MLP") + _modules(drafter, "Qwen3MLP"):
            _fuse([mlp.gate_proj, mlp.up_proj])


def _fuse(linears: list[nn.Linear]) -> None:
    """``linears`` called on one input tensor compute one GEMM: the first call computes every output and
    the others take theirs from it (keyed on the input tensor itself)."""
    weight = torch.cat([m.weight for m in linears])
    bias = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
    sizes = [m.weight.shape[0] for m in linears]
    shared: dict = {"input": None, "outputs": None}

    def make(index):
        def forward(module, x):
            if shared["input"] is not x:
                shared["input"], shared["outputs"] = x, F.linear(x, weight, bias).split(sizes, dim=-1)
            return shared["outputs"][index]

        return forward

    for index, module in enumerate(linears):
        _rebind(module, make(index))


class SplitKReductions(RoundsDifferently):
    """Every linear layer: the reduction over inputs in chunks of 64, each partial product rounded to
    the run's dtype and the partials summed in it."""

    name = "rounding-split-k"

    def numerics(self, target, drafter):
        def split_k(module, x):
            w, k = module.weight, module.weight.shape[1]
            out = None
            for start in range(0, k, _CHUNK):
                part = F.linear(x[..., start : start + _CHUNK], w[:, start : start + _CHUNK])
                out = part if out is None else out + part
            return out if module.bias is None else out + module.bias

        for module in _modules(target, nn.Linear) + _modules(drafter, nn.Linear):
            _rebind(module, split_k)


class FusedRmsNorm(RoundsDifferently):
    """RMSNorm as one fused kernel: the weight applied in float32, one rounding at the end."""

    name = "rounding-fused-rmsnorm"

    def numerics(self, target, drafter):
        def fused(module, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
            return (module.weight.float() * xf).to(x.dtype)

        for module in _modules(target, "Qwen3RMSNorm") + _modules(drafter, "Qwen3RMSNorm"):
            _rebind(module, fused)


class PaddedGemmRows(RoundsDifferently):
    """Every linear layer's rows padded to a multiple of 64 (the GEMM shape of a batch shared with other
    requests); the padding rows are zero and dropped."""

    name = "rounding-padded-gemm-rows"

    def numerics(self, target, drafter):
        def padded(module, x):
            rows = x.reshape(-1, x.shape[-1])
            pad = (-rows.shape[0]) % _CHUNK
            out = F.linear(F.pad(rows, (0, 0, 0, pad)), module.weight, module.bias)
            return out[: rows.shape[0]].reshape(*x.shape[:-1], -1)

        for module in _modules(target, nn.Linear) + _modules(drafter, nn.Linear):
            _rebind(module, padded)


class BatchVariantAttention(RoundsDifferently):
    """A lone request's attention as SDPA with an explicit mask; in an engine call holding two requests
    or more, FlashAttention's order (:func:`online_softmax`), as a server picks another attention kernel
    for a batch: the same request rounds one way alone and another in company."""

    name = "rounding-batch-variant-attention"

    def __init__(self, model_dir, drafter_dir=None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self._company = False

    def numerics(self, target, drafter):
        def batch_variant(q, k, v, mask, scale):
            if self._company:
                return online_softmax(q, k, v, mask, scale)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

        _set_attention(target, drafter, batch_variant)

    def generate_local(self, requests, config):
        self._company = len(requests) > 1
        try:
            return super().generate_local(requests, config)
        finally:
            self._company = False


def _float64_log_probs_tree(draft_logits: torch.Tensor, budget: int):
    """The spec's heap over log-probabilities computed in float64 and rounded to float32 (another kernel
    than the spec's float32 log-softmax; the heap's own log-softmax of log-probabilities moves them by at
    most a bit more)."""
    return build_tree(torch.log_softmax(draft_logits.double(), dim=-1).float(), budget)


class Float64LogProbs(RoundsDifferently):
    """The drafter's log-probabilities by another kernel (float64, rounded to float32), then the spec's
    best-first heap: the tree an engine builds with its own log-softmax (a sampler's, a fused kernel's)."""

    name = "rounding-float64-log-probs"

    def __init__(self, model_dir, drafter_dir=None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self._build = _float64_log_probs_tree

    def numerics(self, target, drafter):
        pass  # the models compute as the reference's; only the tree's scores round otherwise


# ------------------------------------------------------------------------------------------ black box
def black_box(engine_class: type[ReferenceEngine]) -> type[ReferenceEngine]:
    """``engine_class`` as vLLM and SGLang report: outputs, finish reasons and per-round acceptance
    lengths; no traces, no drafter logits, no verified trees, no timings."""

    class BlackBox(engine_class):
        name = f"{engine_class.name}-black-box"

        def capabilities(self) -> Capabilities:
            return (
                super()
                .capabilities()
                .model_copy(
                    update={
                        "traces": False,
                        "draft_logits": False,
                        "stage_timings": False,
                        "verified_tree_modes": [],
                        "traced_modes": None,
                    }
                )
            )

        def generate(self, requests, config):
            results = super().generate(requests, config.model_copy(update={"trace": False, "timing": False}))
            return [
                r
                if r.error
                else RequestResult(
                    output_ids=r.output_ids, finish_reason=r.finish_reason, acceptance_lengths=r.acceptance_lengths
                )
                for r in results
            ]

    BlackBox.__name__ = BlackBox.__qualname__ = f"{engine_class.__name__}BlackBox"
    BlackBox.__module__ = __name__
    return BlackBox


def aggregate_box(engine_class: type[ReferenceEngine], rounds: bool = False) -> type[ReferenceEngine]:
    """``engine_class`` reporting, per request, its outputs and acceptance aggregates only: the mean
    acceptance length and the acceptance rate at each depth, no per-round lengths, no traces (an engine
    that exposes only counters per request). The acceptance check judges it on its aggregates. It is the
    black box (:func:`black_box`) with its per-round lengths folded into those aggregates. ``rounds``: it
    reports its number of rounds too (SGLang's per-request verify count)."""
    from ddtree_conformance.metrics import per_position_acceptance

    class AggregateBox(black_box(engine_class)):
        name = f"{engine_class.name}-aggregates"

        def capabilities(self) -> Capabilities:
            return super().capabilities().model_copy(update={"per_round_acceptance": False})

        def generate(self, requests, config):
            return [r if r.error else self._aggregates(r, config.mode) for r in super().generate(requests, config)]

        @staticmethod
        def _aggregates(result: RequestResult, mode: str) -> RequestResult:
            lengths = result.acceptance_lengths
            if mode == "plain" or not lengths:  # no speculative rounds: nothing to aggregate
                return result.model_copy(update={"acceptance_lengths": None})
            return result.model_copy(
                update={
                    "acceptance_lengths": None,
                    "aggregate_only": True,
                    "mean_acceptance": sum(lengths) / len(lengths),
                    "per_position_acceptance": per_position_acceptance([lengths], 7),
                    "rounds": len(lengths) if rounds else None,
                }
            )

    AggregateBox.__name__ = AggregateBox.__qualname__ = f"{engine_class.__name__}Aggregates{'Rounds' if rounds else ''}"
    AggregateBox.__module__ = __name__
    return AggregateBox


ROUNDING_ENGINES: dict[str, type[RoundsDifferently]] = {
    "attention by matmul and a float32 softmax": MatmulSoftmaxAttention,
    "attention in FlashAttention's order": OnlineSoftmaxAttention,
    "KV cache in float32": Float32KvCache,
    "fused q/k/v and gate/up projections": FusedProjections,
    "split-K reductions in the run's dtype": SplitKReductions,
    "fused RMSNorm (one rounding)": FusedRmsNorm,
    "GEMM rows padded as in a shared batch": PaddedGemmRows,
    "another attention kernel in a batch than alone": BatchVariantAttention,
    "drafter log-probs by another kernel (float64)": Float64LogProbs,
}

# each engine as a black box, under a module-level name (``--engine module:Class`` finds it)
BLACK_BOXES: dict[str, type[ReferenceEngine]] = {}
AGGREGATE_BOXES: dict[str, type[ReferenceEngine]] = {}
for _label, _engine in ROUNDING_ENGINES.items():
    BLACK_BOXES[_label] = globals()[f"{_engine.__name__}BlackBox"] = black_box(_engine)
    AGGREGATE_BOXES[_label] = globals()[f"{_engine.__name__}Aggregates"] = aggregate_box(_engine)
