"""Verify-batch compilation (ddtree_conformance.spec.verify): positions, visibility, additive mask."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_conformance.spec.tree import DraftTree, build_tree
from ddtree_conformance.spec.verify import ancestor_visibility, compile_tree

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@st.composite
def random_trees(draw, max_nodes: int = 40, vocab: int = 50):
    """Any parent-before-child tree with distinct sibling tokens (not only builder output)."""
    n = draw(st.integers(0, max_nodes))
    parents, depths, tokens = [-1], [0], [-1]
    used: dict[int, set[int]] = {0: set()}
    for node in range(1, n + 1):
        parent = draw(st.integers(0, node - 1))
        free = [t for t in range(vocab) if t not in used[parent]]
        token = draw(st.sampled_from(free))
        used[parent].add(token)
        used[node] = set()
        parents.append(parent)
        depths.append(depths[parent] + 1)
        tokens.append(token)
    return DraftTree(
        tokens=torch.tensor(tokens),
        depths=torch.tensor(depths),
        parents=torch.tensor(parents),
        ranks=torch.tensor([-1] + [0] * n),
        scores=torch.zeros(n + 1, dtype=torch.float64),
    )


def brute_force_visibility(parents: list[int]) -> list[list[bool]]:
    n = len(parents)
    vis = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j != -1:
            vis[i][j] = True
            j = parents[j]
    return vis


@settings(max_examples=150)
@given(
    tree=random_trees(),
    root=st.integers(0, 10_000),
    start=st.integers(0, 300),
    extra_prefix=st.one_of(st.none(), st.integers(0, 20)),
    dtype=st.sampled_from(DTYPES),
)
def test_compile_tree(tree, root, start, extra_prefix, dtype):
    prefix_len = None if extra_prefix is None else min(start, extra_prefix)  # a cache may hold fewer rows
    out = compile_tree(tree, root, start, prefix_len=prefix_len, dtype=dtype)
    p = start if prefix_len is None else prefix_len
    n = tree.num_nodes + 1
    parents = tree.parents.tolist()
    assert out.input_ids.tolist() == [root] + tree.tokens[1:].tolist()
    assert tree.tokens[0].item() == -1  # the tree itself is not modified
    assert out.position_ids.tolist() == [start + d for d in tree.depths.tolist()]
    assert out.visibility.dtype == torch.bool
    assert out.visibility.tolist() == brute_force_visibility(parents)
    mask = out.attention_mask
    assert mask.shape == (1, 1, n, p + n) and mask.dtype == dtype
    hidden = torch.finfo(dtype).min
    assert bool((mask[0, 0, :, :p] == 0).all()), "every committed prefix column is visible"
    expected = torch.where(out.visibility, torch.tensor(0.0, dtype=dtype), torch.tensor(hidden, dtype=dtype))
    assert torch.equal(mask[0, 0, :, p:], expected)
    assert set(torch.unique(mask).tolist()) <= {0.0, hidden}


@settings(max_examples=100)
@given(tree=random_trees(max_nodes=60))
def test_ancestor_visibility_matches_brute_force(tree):
    vis = ancestor_visibility(tree.parents)
    assert vis.tolist() == brute_force_visibility(tree.parents.tolist())
    # siblings and cousins never see each other; root is seen by all; diagonal always set
    assert bool(vis[:, 0].all()) and bool(vis.diagonal().all())


def test_positions_are_depths_not_flat_index():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    tree = build_tree(logits, 6)
    out = compile_tree(tree, root_token=5, start=10)
    assert out.position_ids.tolist() == [10 + d for d in tree.depths.tolist()]
    assert out.position_ids.tolist() != list(range(10, 10 + tree.num_nodes + 1))  # has siblings


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("prefix_len", [0, 1, 7])
def test_mask_prefix_columns_and_dtype_min(dtype, prefix_len):
    # root -> a, root -> b, a -> c: b must not see a or c; c sees root, a, itself
    tree = DraftTree(
        tokens=torch.tensor([-1, 4, 9, 2]),
        depths=torch.tensor([0, 1, 1, 2]),
        parents=torch.tensor([-1, 0, 0, 1]),
        ranks=torch.tensor([-1, 0, 1, 0]),
        scores=torch.zeros(4, dtype=torch.float64),
    )
    out = compile_tree(tree, root_token=1, start=7, prefix_len=prefix_len, dtype=dtype)
    m = out.attention_mask[0, 0]
    hidden = torch.finfo(dtype).min
    assert m.shape == (4, prefix_len + 4)
    assert bool((m[:, :prefix_len] == 0).all())
    tree_block = m[:, prefix_len:]
    visible = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    for i in range(4):
        for j in range(4):
            assert tree_block[i, j].item() == (0.0 if visible[i][j] else hidden)
    assert out.position_ids.tolist() == [7, 8, 8, 9]


def test_compile_tree_rejects_bad_arguments():
    tree = build_tree(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError):
        compile_tree(tree, 0, start=-1)
    with pytest.raises(ValueError):
        compile_tree(tree, 0, start=3, prefix_len=-1)
