"""The target's and the drafter's forwards in fewer kernels, for the fast path: same weights, same
operations, fused where the arithmetic allows (:class:`LeanQwen3`, :class:`LeanDFlash`).

Under a CUDA graph a decode step costs its kernels plus a gap of a microsecond or two between
each. transformers' Qwen3 layer launches about 55 kernels for one token (an RMSNorm alone is eight
element-wise kernels, and there are four per layer); measured on an H200, the gaps left the GPU idle
a third of an 8B plain step. :class:`LeanQwen3` runs the same layer in about 30:

* q, k and v come from one matrix product (the three weights concatenated), gate and up from one;
* every RMSNorm is one fused ``rms_norm`` in float32 followed by the weight in the model's dtype,
  as transformers computes it; q_norm and k_norm run together over the q and k heads;
* RoPE runs once over the q and k heads together (the same element-wise arithmetic);
* no element-wise product broadcasts an operand over the rows (:class:`RowCopies`): a verify's rows take
  the norm weights from copies kept over 128 rows (about 120 MB for an 8B-shaped target), and cos/sin
  widened once per forward. A
  broadcast operand sends PyTorch's CUDA kernel down its strided path, about twice as slow a launch at 33
  rows as the same-shape product; the copies give the same numbers bit for bit;
* attention reads the grouped K/V heads directly: the queries of each KV head are stacked, so no
  repeated K/V is written.

Reductions may round differently from transformers' kernels (another matrix shape, another norm
kernel), so in bf16 a near tie can flip; in fp32 the outputs equal the eager path's (the tests show
it). Models it does not know (:func:`lean_problem` says why) keep transformers' layers on the fast
path.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

__all__ = [
    "LeanDFlash",
    "LeanQwen3",
    "RowCopies",
    "blas_library",
    "gate_and_up",
    "lean_drafter_problem",
    "lean_problem",
    "rotary",
]

# Whether gate and up come from one batched product against the fused weight's two halves, each half of the
# output contiguous ([2, T, I]), rather than from one F.linear whose output's halves are strided views (past one
# row, SwiGLU's silu and product then take PyTorch's strided path). Off until measured on a GPU
# (scripts/bench_elementwise.py, scripts/measurements/2026-12-06c-issue29/README.md, "Next"); the batched
# product need not round as F.linear does, so it changes the fast path's low-precision numerics, not its fp32 ones.
SWIGLU_HALVES = False
# The most rows a product gets per-row copies of its broadcast operand for (:class:`RowCopies`); 0: none. On a
# newly started H100 the copies took 0.22-0.32 ms off the 8B-shaped round at B = 16 / 32 / 64 (1.40-1.41 /
# 1.46-1.47 / 1.54-1.55 plain steps against 1.42 / 1.48-1.49 / 1.56-1.57 without;
# scripts/measurements/2026-12-06c-issue29/).
ROW_COPIES_UP_TO = 128
# Whether the drafter norms and rotates every row's q and k heads in one go (one RMSNorm and one RoPE a layer, as
# the target's forward does), rather than the block's q and the rows' k apart (two of each). The same numbers bit
# for bit (tests/test_lean_drafter.py); 40 fewer kernels a draft for the 8B-shaped drafter. On: the round faster or
# level in six alternating pairs on an H100 (scripts/measurements/2026-12-06f-issue29/README.md).
JOINT_DRAFTER_QK = True
# The fewest verify rows (tree nodes + root) at which the device round's target forward takes cuBLASLt's kernels
# rather than cuBLAS's, in bf16 and fp16 (fp32 keeps cuBLAS); 0: never. The preferred BLAS library
# (torch.backends.cuda.preferred_blas_library) is set while the round's graph is captured and restored after; the
# plain step and the draft keep cuBLAS. On an H100, for the 8B shape in bf16, cuBLASLt picks the same kernels as
# cuBLAS at 1 and 17 rows and a faster one for the MLP's down product at 33 to 96 rows (one forward's products 5.32
# against 5.43 ms at 33 rows, 5.41 against 5.56 at 65); the round faster in 7 of 7 alternating pairs at B = 32 and
# 64 (0.11-0.87 ms), and in 1 of 5 at B = 16, where nothing changes
# (scripts/measurements/2026-12-06g-issue29/README.md); on a second H100, 6 of 6 at B = 32 and 64
# (scripts/measurements/2026-12-06h-issue29/README.md). Another library rounds the down product otherwise: the
# fast path's low-precision numerics, never the oracle's (which runs eagerly). Padding the verify rows to a multiple
# of 16 or 32 instead was slower at B = 16 and 32 and level at 64 (same README), and is gone.
VERIFY_CUBLASLT_FROM_ROWS = 33


@contextlib.contextmanager
def blas_library(name: str | None, device: torch.device):
    """PyTorch's preferred BLAS library set to ``name`` inside, on a CUDA ``device``, and restored after, an error
    included; nothing changes where ``name`` is None or the device is not CUDA."""
    if name is None or device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def lean_problem(model) -> str | None:
    """Why ``model`` cannot run as :class:`LeanQwen3` (None: it can)."""
    config = model.config
    if getattr(config, "model_type", None) != "qwen3":
        return f"model type {getattr(config, 'model_type', None)!r} (only qwen3)"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    layer = model.model.layers[0]
    if not all(hasattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")):
        return "attention without q/k/v/o projections and q/k norms"
    if any(getattr(layer.mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        return "MLP with biases"
    return None


def gate_and_up(x: torch.Tensor, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU's gate and up projections of ``x`` ``[T, H]`` from the fused weight ``[2I, H]`` (gate's rows
    first), as :data:`SWIGLU_HALVES` says: two ``[T, I]`` views of one ``[T, 2I]`` product, or the two
    contiguous halves of a batched ``[2, T, I]`` one (the weight is viewed, not copied)."""
    if SWIGLU_HALVES:
        halves = gate_up.view(2, gate_up.shape[0] // 2, gate_up.shape[1]).transpose(1, 2)  # [2, H, I]
        out = torch.matmul(x, halves)
        return out[0], out[1]
    return F.linear(x, gate_up).chunk(2, dim=-1)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalise in float32, back to the input dtype, then times the weight."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin``, with ``rotate_half(x) * sin`` taken as the halves
    swapped times ``signed_sin`` (sin with its first half negated; :meth:`RowCopies.rotary`). The same
    numbers bit for bit: ``(-a) * b`` and ``a * (-b)`` round alike, and no strided negation is launched."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin


class RowCopies:
    """Operands of the forward's element-wise products at the full shape of the rows they multiply, so no
    product broadcasts (module doc). ``limit``: the most rows given copies; past it, the product broadcasts
    (its cost is then the rows', not the launch's, and copies of every norm weight would cost memory);
    default :data:`ROW_COPIES_UP_TO`.

    Each norm weight is copied once, over ``limit`` rows, and kept; a product of T rows reads the first T
    rows of it (contiguous, so no copy per row count). A captured graph's warm-up run makes the copies, so
    the graph only reads them, and they live as long as the forward: a graph may hold their addresses.
    cos/sin change with the positions, so :meth:`rotary` widens them in each forward, once for every layer."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = ROW_COPIES_UP_TO if limit is None else limit
        self._kept: dict[tuple[int, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}

    def weight(self, weight: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``weight`` (broadcastable to ``like``'s trailing dimensions) repeated over ``like``'s rows."""
        rows, trailing = like.shape[0], tuple(like.shape[1:])
        if rows > self.limit:
            return weight
        key = (id(weight), trailing)
        if key not in self._kept:  # the weight is kept beside its copy, so its id is never reused
            self._kept[key] = (weight, weight.expand(self.limit, *trailing).contiguous())
        return self._kept[key][1][:rows]

    def rotary(self, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, signed_sin)`` for :func:`rotary` over ``heads`` heads, from transformers' ``[T, 1, d]``."""
        half = sin.shape[-1] // 2
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        if cos.shape[0] > self.limit:
            return cos, signed_sin
        return cos.expand(-1, heads, -1).contiguous(), signed_sin.expand(-1, heads, -1).contiguous()


class LeanQwen3:
    """A Qwen3 target's forward on a static cache (see :mod:`.graphs`), returning ``(logits [T, V],
    features [T, k*H] | None)`` like the reference pair's forward; ``feature_layers`` are the layers
    whose outputs the drafter reads."""

    def __init__(self, model, feature_layers: list[int] | None) -> None:
        config = model.config
        self.model = model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        attention = model.model.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.scale = attention.scaling
        self.eps = config.rms_norm_eps
        self.feature_layers = list(feature_layers or [])
        self.copies = RowCopies()
        q_rows, kv_rows = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.split = (q_rows, kv_rows, kv_rows)
        self.layers = []
        with torch.no_grad():
            for layer in model.model.layers:
                a, m = layer.self_attn, layer.mlp
                biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                qk_norm = torch.cat([a.q_norm.weight.expand(self.heads, -1), a.k_norm.weight.expand(self.kv_heads, -1)])
                self.layers.append(
                    {
                        "input_norm": layer.input_layernorm.weight,
                        "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        "qkv_bias": None if biases[0] is None else torch.cat(biases),
                        "qk_norm": qk_norm.contiguous(),
                        "o": a.o_proj.weight,
                        "o_bias": a.o_proj.bias,
                        "post_norm": layer.post_attention_layernorm.weight,
                        "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        "down": m.down_proj.weight,
                    }
                )

    # mutates: cache (the caller's static cache takes the new rows' keys and values at its slots, as a
    # transformers cache does in a forward: the caller owns it and keeps it from one step to the next)
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor):
        """``ids``/``positions`` ``[T]``; ``cache`` a static cache whose ``slots`` say where the new rows go;
        ``mask`` additive ``[1, 1, T, capacity]``."""
        model, eps, d, copies = self.model.model, self.eps, self.head_dim, self.copies
        groups = self.heads // self.kv_heads
        rows = ids.shape[0]
        h = model.embed_tokens(ids)  # [T, H]
        cos, sin = model.rotary_emb(h, positions.unsqueeze(0))
        qk_heads = self.heads + self.kv_heads
        cos, signed_sin = copies.rotary(cos[0].unsqueeze(1), sin[0].unsqueeze(1), qk_heads)  # [T, heads, d]
        # the queries of one KV head are stacked (group-major), so the mask repeats once per group
        grouped_mask = mask.repeat(1, 1, groups, 1)
        features = {}
        for index, w in enumerate(self.layers):
            x = _rms(h, copies.weight(w["input_norm"], h), eps)
            qkv = F.linear(x, w["qkv"], w["qkv_bias"])
            qk = qkv[:, : self.split[0] + self.split[1]].view(rows, qk_heads, d)
            v = qkv[:, self.split[0] + self.split[1] :].view(rows, self.kv_heads, d)
            qk = rotary(_rms(qk, copies.weight(w["qk_norm"], qk), eps), cos, signed_sin)
            q, k = qk[:, : self.heads], qk[:, self.heads :]
            keys, values = cache.update(k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), index)
            # [T, heads, d] -> [1, kv_heads, groups * T, d]: head h = g * groups + r sits at row r * T + t
            q = q.view(rows, self.kv_heads, groups, d).permute(1, 2, 0, 3).reshape(1, self.kv_heads, groups * rows, d)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=grouped_mask, scale=self.scale)
            out = out.view(self.kv_heads, groups, rows, d).permute(2, 0, 1, 3).reshape(rows, self.heads * d)
            h = h + F.linear(out, w["o"], w["o_bias"])
            x = _rms(h, copies.weight(w["post_norm"], h), eps)
            gate, up = gate_and_up(x, w["gate_up"])
            h = h + F.linear(F.silu(gate) * up, w["down"])
            if index in self.feature_layers:
                features[index] = h
        h = _rms(h, copies.weight(model.norm.weight, h), model.norm.variance_epsilon)
        logits = self.model.lm_head(h)
        wanted = [features[i] for i in self.feature_layers]
        return logits, (torch.cat(wanted, dim=-1) if wanted else None)


def lean_drafter_problem(drafter) -> str | None:
    """Why ``drafter`` cannot run as :class:`LeanDFlash` (None: it can)."""
    config = drafter.config.qwen3
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    mlp = drafter.layers[0].mlp
    if any(getattr(mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        return "MLP with biases"
    return None


class LeanDFlash:
    """The DFlash drafter's forward (:class:`~.dflash.DFlashDrafter`) on a static draft cache in fewer
    kernels, as :class:`LeanQwen3` does for the target: q, k and v from one matrix product over the context
    rows and the block together (the context rows' q is not used), q_norm, k_norm and RoPE over every row's
    q and k heads at once (:data:`JOINT_DRAFTER_QK`), gate and up from one, every RMSNorm one
    fused ``rms_norm`` in float32, the block's own K/V written into the cache's tail rows (no copy of the
    cache per layer) and the queries of each KV head stacked (no repeated K/V). Same weights, same
    operations; reductions may round differently, as :class:`LeanQwen3`'s do."""

    def __init__(self, drafter) -> None:
        config = drafter.config.qwen3
        self.drafter = drafter
        attention = drafter.layers[0].self_attn
        self.heads, self.kv_heads, self.head_dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
        self.eps = config.rms_norm_eps
        self.copies = RowCopies()
        q_rows, kv_rows = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.split = (q_rows, kv_rows, kv_rows)
        self.layers = []
        with torch.no_grad():
            for layer in drafter.layers:
                a, m = layer.self_attn, layer.mlp
                biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                self.layers.append(
                    {
                        "input_norm": layer.input_layernorm.weight,
                        "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                        "qkv_bias": None if biases[0] is None else torch.cat(biases),
                        "q_norm": a.q_norm.weight,
                        "k_norm": a.k_norm.weight,
                        "qk_norm": torch.cat(
                            [a.q_norm.weight.expand(self.heads, -1), a.k_norm.weight.expand(self.kv_heads, -1)]
                        ).contiguous(),
                        "o": a.o_proj.weight,
                        "o_bias": a.o_proj.bias,
                        "post_norm": layer.post_attention_layernorm.weight,
                        "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                        "down": m.down_proj.weight,
                    }
                )

    # mutates: cache (the context rows' K/V go to its slots and the block's to its tail, as the drafter's
    # forward extends its cache: the caller owns the cache and keeps it from one draft to the next)
    def forward(self, block: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor):
        """``block`` the block's embeddings ``[S, H]``; ``features`` the new context rows' target features
        ``[C, k*H]``; ``positions`` ``[C + S]``; ``cache`` a :class:`~.graphs.StaticDraftCache` whose
        ``slots`` say where the context rows go; ``mask`` additive ``[1, 1, 1, capacity + S]``. Returns the
        block's final hidden states ``[S, H]``."""
        drafter, eps, d, copies = self.drafter, self.eps, self.head_dim, self.copies
        groups = self.heads // self.kv_heads
        n_new, size = features.shape[0], block.shape[0]
        context = F.linear(features, drafter.fc.weight)
        context = _rms(context, copies.weight(drafter.hidden_norm.weight, context), eps)
        cos, sin = drafter.rotary_emb(block.unsqueeze(0), positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [C + S, 1, d]
        qk_heads = self.heads + self.kv_heads
        joint = JOINT_DRAFTER_QK
        if joint:
            cos, signed_sin = copies.rotary(cos, sin, qk_heads)  # [C + S, heads + kv_heads, d]
        else:
            q_cos, q_sin = copies.rotary(cos[n_new:], sin[n_new:], self.heads)
            k_cos, k_sin = copies.rotary(cos, sin, self.kv_heads)
        h = block
        for index, w in enumerate(self.layers):
            x = _rms(h, copies.weight(w["input_norm"], h), eps)
            qkv = F.linear(torch.cat([context, x]), w["qkv"], w["qkv_bias"])  # [C + S, q + k + v]
            if joint:
                # q_norm and k_norm, then RoPE, over every row's q and k heads together, as LeanQwen3 does:
                # each head's vector is normed and rotated on its own, so the context rows' q (not used)
                # changes nothing, and two norms and two rotaries become one of each
                qk = qkv[:, : self.split[0] + self.split[1]].view(n_new + size, qk_heads, d)
                qk = rotary(_rms(qk, copies.weight(w["qk_norm"], qk), eps), cos, signed_sin)
                q, k = qk[n_new:, : self.heads], qk[:, self.heads :]
            else:
                q = qkv[n_new:, : self.split[0]].view(size, self.heads, d)
                k = qkv[:, self.split[0] : self.split[0] + self.split[1]].view(n_new + size, self.kv_heads, d)
                q = rotary(_rms(q, copies.weight(w["q_norm"], q), eps), q_cos, q_sin)
                k = rotary(_rms(k, copies.weight(w["k_norm"], k), eps), k_cos, k_sin)
            v = qkv[:, self.split[0] + self.split[1] :].view(n_new + size, self.kv_heads, d)
            keys, values = cache.extend_with_block(
                index, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), n_new
            )
            # [S, heads, d] -> [1, kv_heads, groups * S, d]: head h = g * groups + r sits at row r * S + t
            q = q.view(size, self.kv_heads, groups, d).permute(1, 2, 0, 3).reshape(1, self.kv_heads, groups * size, d)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=d**-0.5)
            out = out.view(self.kv_heads, groups, size, d).permute(2, 0, 1, 3).reshape(size, self.heads * d)
            h = h + F.linear(out, w["o"], w["o_bias"])
            x = _rms(h, copies.weight(w["post_norm"], h), eps)
            gate, up = gate_and_up(x, w["gate_up"])
            h = h + F.linear(F.silu(gate) * up, w["down"])
        return _rms(h, copies.weight(drafter.norm.weight, h), eps)
