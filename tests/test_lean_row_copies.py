"""The lean forwards' layouts for PyTorch's element-wise kernels (adapters/reference/lean.py). The per-row copies
(RowCopies) change no number: they exist to keep the CUDA kernels off their strided path, so the same products
must come out bit for bit, in every dtype, with the copies and with every product broadcasting as before. The
SwiGLU halves (SWIGLU_HALVES) take another GEMM, so they are held to float32 closeness."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import rotate_half

from ddtree_conformance.adapters.reference import lean
from ddtree_conformance.adapters.reference.graphs import StaticDraftCache, StaticTargetCache
from ddtree_conformance.adapters.reference.lean import LeanDFlash, LeanQwen3, RowCopies, rotary
from ddtree_conformance.testing.shaped_pair import build_shaped_pair

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so -0.0 and +0.0 differ, as they would in the next product)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 7, 130])  # 130: past the limit, where cos/sin broadcast as before
def test_the_rotary_equals_transformers_bit_for_bit(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 6, 16, generator=g) * 3).to(dtype)
    x[0, 0, :4] = torch.tensor([0.0, -0.0, 1e-3, -1e-3])  # signed zeros and tiny products
    angles = torch.rand(rows, 1, 8, generator=g) * 50
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    want = x * cos + rotate_half(x) * sin  # transformers' apply_rotary_pos_emb, per tensor
    got = rotary(x, *RowCopies().rotary(cos, sin, 6))
    assert torch.equal(_bits(got), _bits(want))


def _perturbed(model, seed: int):
    """Norm weights drawn away from 1 and differing per layer (a weight of 1 would hide a wrong copy)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float16], ids=str)
def tiny(request, tmp_path_factory):
    _, _, target, drafter = build_shaped_pair("tiny", request.param, "cpu", tmp_path_factory.mktemp("tiny"))
    return request.param, _perturbed(target, 1), _perturbed(drafter, 2)


def _target_forward(target, dtype, copies: RowCopies, rows: int = 9):
    lean = LeanQwen3(target, [1, 2])
    lean.copies = copies
    config = target.config
    cache = StaticTargetCache(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, 32, dtype, "cpu")
    g = torch.Generator().manual_seed(rows)
    ids, positions = torch.randint(0, config.vocab_size - 2, (rows,), generator=g), torch.arange(rows)
    cache.slots = positions
    visible = torch.arange(32)[None, :] <= positions[:, None]
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype).view(1, 1, rows, 32)
    with torch.no_grad():
        return lean.forward(ids, positions, cache, mask)


def test_the_target_forward_is_the_same_with_and_without_row_copies(tiny):
    dtype, target, _ = tiny
    (logits, features), (plain_logits, plain_features) = (
        _target_forward(target, dtype, copies) for copies in (RowCopies(), RowCopies(limit=0))
    )
    assert torch.equal(_bits(logits), _bits(plain_logits))
    assert torch.equal(_bits(features), _bits(plain_features))


def test_the_drafter_forward_is_the_same_with_and_without_row_copies(tiny):
    dtype, _, drafter = tiny
    attention, size = drafter.layers[0].self_attn, drafter.block_size
    g = torch.Generator().manual_seed(3)
    hidden = drafter.config.qwen3.hidden_size
    block = torch.randn(size, hidden, generator=g).to(dtype)
    features = torch.randn(5, len(drafter.config.target_layer_ids) * hidden, generator=g).to(dtype)
    positions = torch.cat([torch.arange(5), torch.arange(5, 5 + size)])
    visible = torch.arange(32 + size) >= 0
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype).view(1, 1, 1, -1)
    outs = []
    for copies in (RowCopies(), RowCopies(limit=0)):
        lean = LeanDFlash(drafter)
        lean.copies = copies
        cache = StaticDraftCache(
            len(drafter.layers), attention.num_kv_heads, attention.head_dim, 32, dtype, "cpu", tail=size
        )
        cache.slots = torch.arange(5)
        with torch.no_grad():
            outs.append(lean.forward(block, features, positions, cache, mask))
    assert torch.equal(_bits(outs[0]), _bits(outs[1]))


def test_row_copies_are_made_once_and_only_up_to_the_limit():
    copies = RowCopies(limit=4)
    weight = torch.randn(3)
    first = copies.weight(weight, torch.empty(2, 5, 3))
    assert first.shape == (2, 5, 3) and first.is_contiguous() and torch.equal(first, weight.expand(2, 5, 3))
    again = copies.weight(weight, torch.empty(4, 5, 3))
    assert again.data_ptr() == first.data_ptr()  # one copy, sliced: a captured graph's address stays valid
    assert copies.weight(weight, torch.empty(5, 5, 3)) is weight  # past the limit: broadcast
    other = torch.randn(3)
    assert torch.equal(copies.weight(other, torch.empty(2, 5, 3)), other.expand(2, 5, 3))


def test_gate_and_up_from_the_weights_halves_are_the_linears_halves(monkeypatch):
    """``lean.SWIGLU_HALVES`` (off until measured on a GPU): gate and up from one batched product against the
    fused weight's halves equal ``F.linear``'s halves in float32, and come out contiguous."""
    g = torch.Generator().manual_seed(5)
    x, weight = torch.randn(9, 16, generator=g), torch.randn(2 * 24, 16, generator=g)
    want = lean.gate_and_up(x, weight)
    monkeypatch.setattr(lean, "SWIGLU_HALVES", True)
    got = lean.gate_and_up(x, weight)
    for a, b in zip(got, want):
        assert a.is_contiguous() and torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[0], x @ weight[:24].T)  # gate's rows come first


def test_the_target_forward_is_the_same_with_swiglu_halves_in_float32(tmp_path, monkeypatch):
    _, _, target, _ = build_shaped_pair("tiny", torch.float32, "cpu", tmp_path)
    target = _perturbed(target, 4)
    want = _target_forward(target, torch.float32, RowCopies())
    monkeypatch.setattr(lean, "SWIGLU_HALVES", True)
    got = _target_forward(target, torch.float32, RowCopies())
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
