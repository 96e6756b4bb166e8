"""The drafter's forward in fewer kernels (adapters/reference/lean.py, LeanDFlash) equals the DFlash
module's on the same static cache in float32: over a first draft with a long context and a later one
with a short context and earlier rows already cached."""

from __future__ import annotations

import copy

import pytest
import torch

from ddtree_conformance.adapters.reference.graphs import StaticDraftCache
from ddtree_conformance.adapters.reference.lean import LeanDFlash, lean_drafter_problem
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    _, _, _, drafter = build_shaped_pair("tiny", torch.float32, "cpu", tmp_path_factory.mktemp("tiny"))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # norm weights away from one, each its own, so a weight applied to the wrong heads shows
        for layer in drafter.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm, layer.input_layernorm):
                norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=g))
    return drafter


def _cache(drafter, capacity: int, dtype=torch.float32) -> StaticDraftCache:
    attention = drafter.layers[0].self_attn
    return StaticDraftCache(
        len(drafter.layers), attention.num_kv_heads, attention.head_dim, capacity, dtype, "cpu", tail=drafter.block_size
    )


def _draft(drafter, lean: LeanDFlash | None, cache, features, start: int, valid: int, dtype=torch.float32):
    """One draft: context rows at ``start..``, the block after ``valid`` committed rows."""
    size, capacity = drafter.block_size, cache.capacity
    g = torch.Generator().manual_seed(start)
    block = torch.randn(size, SHAPES["tiny"]["hidden"], generator=g).to(dtype)
    rows = features.shape[0]
    positions = torch.cat([torch.arange(start, start + rows), torch.arange(valid, valid + size)])
    cache.slots = torch.arange(start, start + rows)
    columns = torch.arange(capacity + size)
    visible = (columns < valid) | (columns >= capacity)
    mask = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype).view(1, 1, 1, -1)
    with torch.no_grad():
        if lean is not None:
            return lean.forward(block, features, positions, cache, mask)
        return drafter(block.unsqueeze(0), features.unsqueeze(0), positions.unsqueeze(0), cache, attention_mask=mask)[0]


def test_the_lean_drafter_equals_the_module_on_a_static_cache(drafter):
    assert lean_drafter_problem(drafter) is None
    lean = LeanDFlash(drafter)
    width = len(drafter.config.target_layer_ids) * SHAPES["tiny"]["hidden"]
    g = torch.Generator().manual_seed(0)
    first, later = torch.randn(20, width, generator=g), torch.randn(5, width, generator=g)
    caches = {"module": _cache(drafter, 64), "lean": _cache(drafter, 64)}
    for name, use in (("module", None), ("lean", lean)):
        out_first = _draft(drafter, use, caches[name], first, 0, 20)
        out_later = _draft(drafter, use, caches[name], later, 20, 23)  # two of the five rows past the valid ones
        caches[name] = (out_first, out_later, caches[name])
    (m1, m2, mc), (l1, l2, lc) = caches["module"], caches["lean"]
    torch.testing.assert_close(l1, m1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(l2, m2, rtol=1e-5, atol=1e-5)
    for a, b in zip(lc.keys, mc.keys):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(m1, m2, atol=1e-3)  # the two drafts differ: the comparison has something to see


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_q_and_k_normed_and_rotated_together_equal_each_on_its_own_bit_for_bit(dtype):
    """LeanDFlash norms and rotates every row's q and k heads in one go, where the block's q and the
    context's and block's k were done apart: each head's vector is normed and rotated on its own, so the
    extra q rows change nothing, in every dtype the fast path runs (here on CPU)."""
    from ddtree_conformance.adapters.reference.lean import RowCopies, _rms, rotary

    g = torch.Generator().manual_seed(3)
    context, block, heads, kv_heads, d = 16, 16, 8, 2, 32
    rows = context + block
    qk = (torch.randn(rows, heads + kv_heads, d, generator=g) * 3).to(dtype)
    q_norm, k_norm = (
        (1 + 0.2 * torch.randn(d, generator=g)).to(dtype),
        (1 + 0.2 * torch.randn(d, generator=g)).to(dtype),
    )
    angles = torch.arange(rows).float()[:, None] * torch.rand(d // 2, generator=g)[None, :]
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype).unsqueeze(1) for f in (torch.cos, torch.sin))
    copies, eps = RowCopies(), 1e-6

    q_cos, q_sin = copies.rotary(cos[context:], sin[context:], heads)
    k_cos, k_sin = copies.rotary(cos, sin, kv_heads)
    q_apart, k_apart = qk[context:, :heads], qk[:, heads:]
    q_apart = rotary(_rms(q_apart, copies.weight(q_norm, q_apart), eps), q_cos, q_sin)
    k_apart = rotary(_rms(k_apart, copies.weight(k_norm, k_apart), eps), k_cos, k_sin)

    both_cos, both_sin = copies.rotary(cos, sin, heads + kv_heads)
    weight = torch.cat([q_norm.expand(heads, -1), k_norm.expand(kv_heads, -1)]).contiguous()
    together = rotary(_rms(qk, copies.weight(weight, qk), eps), both_cos, both_sin)

    def bits(t):
        return t.contiguous().view(torch.int32 if dtype == torch.float32 else torch.int16)

    assert torch.equal(bits(together[context:, :heads]), bits(q_apart))
    assert torch.equal(bits(together[:, heads:]), bits(k_apart))
    assert not torch.equal(
        bits(together[:, :heads]),
        bits(rotary(_rms(qk[:, :heads], k_norm, eps), both_cos[:, :heads], both_sin[:, :heads])),
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_drafter_forward_is_the_same_with_q_and_k_together_or_apart(drafter, dtype, monkeypatch):
    """The whole lean draft (outputs and the K/V it caches), q and k normed and rotated together or apart
    (``lean.JOINT_DRAFTER_QK``), in low precision: the same bits."""
    from ddtree_conformance.adapters.reference import lean

    low = copy.deepcopy(drafter).to(dtype)
    width = len(drafter.config.target_layer_ids) * SHAPES["tiny"]["hidden"]
    features = torch.randn(12, width, generator=torch.Generator().manual_seed(5)).to(dtype)
    runs = {}
    for joint in (True, False):
        monkeypatch.setattr(lean, "JOINT_DRAFTER_QK", joint)
        cache = _cache(low, 64, dtype)
        out = _draft(low, LeanDFlash(low), cache, features, 0, 12, dtype)
        runs[joint] = (out, [k.clone() for k in cache.keys])
    assert torch.equal(runs[True][0].view(torch.int16), runs[False][0].view(torch.int16))
    for a, b in zip(runs[True][1], runs[False][1]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
