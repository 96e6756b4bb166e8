"""The fast path's tensor-only tree build equals the spec's heap (adapters/reference/device_tree.py):
every field of every node, on drawn logits with many exact ties (logits from a handful of values, so
log-probs, prefix scores and float64 sums tie), on CPU here and on CUDA in the GPU tier."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_conformance.adapters.reference.device_tree import (
    ancestor_table,
    build_tree_on_device,
    build_tree_with_ancestors,
)
from ddtree_conformance.spec import build_tree


def _assert_same(logits: torch.Tensor, budget: int) -> None:
    want, got = build_tree(logits, budget), build_tree_on_device(logits, budget)
    for name in ("tokens", "depths", "parents", "ranks", "scores"):
        a, b = getattr(want, name).cpu(), getattr(got, name).cpu()
        assert torch.equal(a, b), (
            f"{name} at B={budget}, logits {logits.tolist()}:\nheap   {a.tolist()}\ndevice {b.tolist()}"
        )


@settings(max_examples=300, deadline=None)
@given(
    depth=st.integers(1, 6),
    vocab=st.integers(1, 9),
    budget=st.integers(1, 70),
    values=st.lists(st.sampled_from([0.0, -1.0, 1.0, 0.5, 2.0, -3.0]), min_size=54, max_size=54),
)
def test_equal_to_the_heap_on_tied_logits(depth, vocab, budget, values):
    logits = torch.tensor(values[: depth * vocab] or [0.0], dtype=torch.float32)
    if logits.numel() < depth * vocab:
        logits = logits.repeat(depth * vocab)[: depth * vocab]
    _assert_same(logits.view(depth, vocab), budget)


@pytest.mark.parametrize("budget", [1, 16, 64, 256])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equal_to_the_heap_on_a_drafters_shape(budget, seed):
    """A block of 15 positions over a 1000-token vocabulary, logits rounded to bf16 (ties within a depth)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(15, 1000, generator=g) * 3).to(torch.bfloat16).float()
    _assert_same(logits, budget)


def _ancestors_by_hand(tree, columns: int) -> list[list[int]]:
    parents, rows = tree.parents.tolist(), []
    for node in range(len(parents)):
        chain = []
        while node > 0:
            chain.append(node)
            node = parents[node]
        rows.append(chain[::-1] + [-1] * (columns - len(chain)))
    return rows


@settings(max_examples=150, deadline=None)
@given(
    depth=st.integers(1, 6),
    vocab=st.integers(1, 9),
    budget=st.integers(1, 70),
    seed=st.integers(0, 10_000),
    extra=st.integers(0, 3),
)
def test_the_ancestor_tables_list_each_nodes_path(depth, vocab, budget, seed, extra):
    """The build's table and the one from parent pointers both hold, per node, its path from depth 1."""
    logits = torch.randint(-2, 3, (depth, vocab), generator=torch.Generator().manual_seed(seed)).float()
    tree, table = build_tree_with_ancestors(logits, budget)
    assert table.tolist() == _ancestors_by_hand(tree, depth)
    assert ancestor_table(tree, depth + extra).tolist() == _ancestors_by_hand(tree, depth + extra)


def test_refuses_what_the_heap_refuses():
    with pytest.raises(ValueError, match="budget must be >= 1"):
        build_tree_on_device(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="non-empty"):
        build_tree_on_device(torch.zeros(3), 4)


# ---------------------------------------------------------------------------- the greedy walk
from ddtree_conformance.adapters.reference.device_walk import greedy_walk_on_device  # noqa: E402
from ddtree_conformance.spec import walk_tree  # noqa: E402


def _assert_same_walk(tree, target_logits, max_depth=None) -> None:
    want = walk_tree(tree, target_logits)
    path, accepted, bonus = greedy_walk_on_device(tree, target_logits, max_depth)
    got = [int(i) for i in path.tolist()[: int(accepted)]]
    assert got == want.accepted and int(bonus) == want.bonus, (got, int(bonus), want.accepted, want.bonus)
    assert all(i == -1 for i in path.tolist()[int(accepted) :])


@settings(max_examples=300, deadline=None)
@given(
    depth=st.integers(1, 5),
    vocab=st.integers(1, 6),
    budget=st.integers(1, 40),
    seed=st.integers(0, 10_000),
    pad=st.integers(0, 3),
)
def test_the_walk_equals_the_spec_walk(depth, vocab, budget, seed, pad):
    """Trees of the spec's builder, target logits from a handful of values (ties: the lowest id wins on
    both sides), and a max_depth at or above the tree's."""
    g = torch.Generator().manual_seed(seed)
    draft = torch.randint(-2, 3, (depth, vocab), generator=g).float()
    tree = build_tree(draft, budget)
    target = torch.randint(-1, 2, (tree.num_nodes + 1, vocab), generator=g).float()
    # make the target follow the tree often: each node's row favours one of its children's tokens
    for node, parent in enumerate(tree.parents.tolist()):
        if parent >= 0 and torch.rand((), generator=g) < 0.7:
            target[parent, int(tree.tokens[node])] = 5.0
    _assert_same_walk(tree, target)
    _assert_same_walk(tree, target, max_depth=depth + pad)
    # with the table the tensor build gives (the fast path's way)
    built, table = build_tree_with_ancestors(draft, budget)
    path, accepted, bonus = greedy_walk_on_device(built, target, depth, ancestors=table)
    want = walk_tree(tree, target)
    assert (path.tolist()[: int(accepted)], int(bonus)) == (want.accepted, want.bonus)
    # with the target's argmax given, as the round as one graph gives it
    path, accepted, bonus = greedy_walk_on_device(built, target, depth, table, torch.argmax(target, dim=-1))
    assert (path.tolist()[: int(accepted)], int(bonus)) == (want.accepted, want.bonus)


# ---------------------------------------------------------------------------- the verify inputs
from ddtree_conformance.adapters.reference.device_verify import verify_inputs_on_device  # noqa: E402
from ddtree_conformance.spec import compile_tree  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(
    depth=st.integers(1, 6),
    vocab=st.integers(1, 7),
    budget=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    start=st.integers(0, 40),
    extra=st.integers(0, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_the_verify_inputs_equal_the_spec_compile(depth, vocab, budget, seed, start, extra, dtype):
    g = torch.Generator().manual_seed(seed)
    tree = build_tree(torch.randint(-2, 3, (depth, vocab), generator=g).float(), budget)
    root = int(torch.randint(0, vocab, (), generator=g))
    want = compile_tree(tree, root, start, start + extra, dtype)
    for given_depth in (None, depth, depth + extra):
        got = verify_inputs_on_device(tree, torch.tensor(root), start, start + extra, dtype, given_depth)
        for name in ("input_ids", "position_ids", "visibility", "attention_mask"):
            assert torch.equal(getattr(want, name), getattr(got, name)), (name, given_depth)
    table = ancestor_table(tree, depth + extra)
    got = verify_inputs_on_device(tree, torch.tensor(root), start, start + extra, dtype, depth + extra, table)
    assert torch.equal(want.attention_mask, got.attention_mask)
    # without the mask (the round as one graph builds its own over the cache): the rest unchanged
    bare = verify_inputs_on_device(tree, torch.tensor(root), start, start + extra, dtype, depth + extra, table, False)
    for name in ("input_ids", "position_ids", "visibility"):
        assert torch.equal(getattr(want, name), getattr(bare, name)), name
    assert bare.attention_mask.numel() == 0
