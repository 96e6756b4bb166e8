"""The drafter's forward in fewer kernels (adapters/reference/lean.py, LeanDFlash) equals the DFlash
module's on the same static cache in float32: over a first draft with a long context and a later one
with a short context and earlier rows already cached."""

from __future__ import annotations

import pytest
import torch

from ddtree_conformance.adapters.reference.graphs import StaticDraftCache
from ddtree_conformance.adapters.reference.lean import LeanDFlash, lean_drafter_problem
from ddtree_conformance.testing.shaped_pair import SHAPES, build_shaped_pair


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    _, _, _, drafter = build_shaped_pair("tiny", torch.float32, "cpu", tmp_path_factory.mktemp("tiny"))
    return drafter


def _cache(drafter, capacity: int) -> StaticDraftCache:
    attention = drafter.layers[0].self_attn
    return StaticDraftCache(
        len(drafter.layers),
        attention.num_kv_heads,
        attention.head_dim,
        capacity,
        torch.float32,
        "cpu",
        tail=drafter.block_size,
    )


def _draft(drafter, lean: LeanDFlash | None, cache, features, start: int, valid: int):
    """One draft: context rows at ``start..``, the block after ``valid`` committed rows."""
    size, capacity = drafter.block_size, cache.capacity
    g = torch.Generator().manual_seed(start)
    block = torch.randn(size, SHAPES["tiny"]["hidden"], generator=g)
    rows = features.shape[0]
    positions = torch.cat([torch.arange(start, start + rows), torch.arange(valid, valid + size)])
    cache.slots = torch.arange(start, start + rows)
    columns = torch.arange(capacity + size)
    visible = (columns < valid) | (columns >= capacity)
    mask = torch.where(visible, 0.0, torch.finfo(torch.float32).min).view(1, 1, 1, -1)
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
