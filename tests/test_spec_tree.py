"""Tree construction (ddtree_conformance.spec.tree): the heap builder is optimal, monotone and well formed."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ddtree_conformance.spec.tree import DraftTree, build_chain, build_tree, per_depth_topk

NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------
# Strategies


_ELEMENTS = {
    # heavy ties: a handful of small integers
    "small_int": st.integers(-2, 2).map(float),
    # ties plus -inf entries (masked tokens)
    "int_or_neg_inf": st.one_of(st.integers(-2, 2).map(float), st.just(NEG_INF)),
    # a few repeated values
    "pool": st.sampled_from([0.0, 0.5, 1.0, 3.0]),
    # generic floats (float32-representable)
    "float": st.floats(-12.0, 12.0, width=32, allow_nan=False),
    "float_or_neg_inf": st.one_of(st.floats(-12.0, 12.0, width=32), st.just(NEG_INF)),
}


@st.composite
def draft_logits(draw, max_depth: int = 6, max_vocab: int = 8, max_prefixes: int | None = None):
    """``[L, V]`` float32 logits with ties, repeated rows and -inf entries (never an all -inf row)."""
    depth = draw(st.integers(1, max_depth))
    vocab = draw(st.integers(1, max_vocab))
    if max_prefixes is not None:
        assume(sum(vocab**d for d in range(1, depth + 1)) <= max_prefixes)
    element = _ELEMENTS[draw(st.sampled_from(sorted(_ELEMENTS)))]
    if draw(st.booleans()) and depth > 1:  # the same marginal at every depth
        row = draw(st.lists(element, min_size=vocab, max_size=vocab))
        values = row * depth
    else:
        values = draw(st.lists(element, min_size=depth * vocab, max_size=depth * vocab))
    logits = torch.tensor(values, dtype=torch.float32).view(depth, vocab)
    for d in range(depth):
        if bool(torch.isinf(logits[d]).all()):
            logits[d, draw(st.integers(0, vocab - 1))] = 0.0
    return logits


def num_prefixes(depth: int, vocab: int) -> int:
    return sum(vocab**d for d in range(1, depth + 1))


# ---------------------------------------------------------------------------------------------
# Independent helpers


def token_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Token tuple of every non-root node, in node order (root excluded)."""
    paths: list[tuple[int, ...]] = [()]
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    for node in range(1, len(tokens)):
        paths.append(paths[parents[node]] + (tokens[node],))
    return paths[1:]


def brute_force_best(logits: torch.Tensor, budget: int) -> list[tuple[tuple[int, ...], tuple[int, ...], float]]:
    """The ``budget`` best prefixes by enumeration: ``(token tuple, rank tuple, score)``.

    Ranks: log-prob descending, smaller token id first. Order: float64 left-to-right score
    descending, then rank tuples lexicographically (Python tuple order puts a prefix first).
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1).tolist()  # exact float32 values
    depth, vocab = len(log_probs), len(log_probs[0])
    ranked = [sorted(range(vocab), key=lambda t, row=row: (-row[t], t)) for row in log_probs]
    candidates = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(vocab), repeat=d):
            score = 0.0
            for i, r in enumerate(ranks):
                score += log_probs[i][ranked[i][r]]
            tokens = tuple(ranked[i][r] for i, r in enumerate(ranks))
            candidates.append((-score, ranks, tokens))
    candidates.sort(key=lambda c: (c[0], c[1]))
    return [(tokens, ranks, -neg) for neg, ranks, tokens in candidates[:budget]]


def rank_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = [()]
    parents, ranks = tree.parents.tolist(), tree.ranks.tolist()
    for node in range(1, len(ranks)):
        paths.append(paths[parents[node]] + (ranks[node],))
    return paths[1:]


def check_structure(tree: DraftTree, logits: torch.Tensor, budget: int) -> None:
    depth, vocab = logits.shape
    n = tree.num_nodes
    assert n == min(budget, num_prefixes(depth, vocab))
    tokens, depths, parents = tree.tokens.tolist(), tree.depths.tolist(), tree.parents.tolist()
    scores = tree.scores.tolist()
    assert tokens[0] == -1 and depths[0] == 0 and parents[0] == -1 and tree.ranks[0] == -1 and scores[0] == 0.0
    assert tree.tokens.dtype == torch.long and tree.scores.dtype == torch.float64
    for node in range(1, n + 1):
        assert 0 <= parents[node] < node, "parent must precede child"
        assert depths[node] == depths[parents[node]] + 1
        assert 1 <= depths[node] <= depth
        assert 0 <= tokens[node] < vocab
    for parent in range(n + 1):
        sibling_tokens = [tokens[c] for c in range(1, n + 1) if parents[c] == parent]
        assert len(sibling_tokens) == len(set(sibling_tokens)), "sibling tokens must be distinct"
    for a, b in zip(scores[1:], scores[2:]):
        assert a >= b or (math.isinf(a) and math.isinf(b)), "scores must not increase in node order"
    tree.children  # raises on repeated sibling tokens


# ---------------------------------------------------------------------------------------------
# Tests


@settings(max_examples=500)
@given(logits=draft_logits(), budget=st.integers(1, 80))
def test_heap_tree_is_well_formed(logits, budget):
    check_structure(build_tree(logits, budget), logits, budget)


def _assert_best_prefixes(tree: DraftTree, logits: torch.Tensor, budget: int) -> None:
    expected = brute_force_best(logits, budget)
    assert token_paths(tree) == [e[0] for e in expected]
    assert rank_paths(tree) == [e[1] for e in expected]
    assert tree.scores[1:].tolist() == [e[2] for e in expected]


@settings(max_examples=300)
@given(logits=draft_logits(max_depth=4, max_vocab=6, max_prefixes=400), budget=st.integers(1, 450))
def test_heap_tree_is_the_best_prefixes_by_brute_force(logits, budget):
    _assert_best_prefixes(build_tree(logits, budget), logits, budget)


# Score ties that defeat beam pruning (found against the removed vectorized builder): a candidate
# (beam slot j', rank r') with j' <= j and r' <= r need not beat (j, r) when the two float64 sums are
# *equal* (both -inf, or a huge |log-prob| absorbing the parents' difference): the tie goes to the
# smaller rank path, which can be (j, r). The heap builder (and the brute force) keep (j, r).
TIE_CASES = [
    pytest.param(
        [
            [0.0, 0.0, 0.0, NEG_INF, NEG_INF],
            [0.0, NEG_INF, 0.0, NEG_INF, NEG_INF],
            [NEG_INF, NEG_INF, NEG_INF, 0.0, NEG_INF],
        ],
        29,
        id="neg-inf-ties",
    ),
    pytest.param(
        [[0.0, -1e-6] + [-1e20] * 10, [0.0, -1e-3] + [-1e20] * 10, [0.0] + [-1e20] * 11],
        35,
        id="finite-absorption-ties",
    ),
]


@pytest.mark.parametrize("rows, budget", TIE_CASES)
def test_heap_builder_on_tied_scores(rows, budget):
    logits = torch.tensor(rows, dtype=torch.float32)
    _assert_best_prefixes(build_tree(logits, budget), logits, budget)


@settings(max_examples=200)
@given(logits=draft_logits(), budget=st.integers(1, 79))
def test_monotone_in_budget(logits, budget):
    small, large = build_tree(logits, budget), build_tree(logits, budget + 1)
    small_paths, large_paths = token_paths(small), token_paths(large)
    assert set(small_paths) <= set(large_paths)
    assert large_paths[: len(small_paths)] == small_paths
    n = small.num_nodes + 1
    for name in ("tokens", "depths", "parents", "ranks", "scores"):
        assert torch.equal(getattr(small, name), getattr(large, name)[:n])


@settings(max_examples=200)
@given(logits=draft_logits())
def test_chain_is_the_argmax_path(logits):
    chain = build_chain(logits)
    depth, vocab = logits.shape
    rows = torch.log_softmax(logits.float(), dim=-1).tolist()
    argmax = [max(range(vocab), key=lambda t, row=row: (row[t], -t)) for row in rows]
    assert chain.num_nodes == depth
    assert chain.tokens[1:].tolist() == argmax
    assert chain.parents.tolist() == [-1, *range(depth)]
    assert chain.depths.tolist() == list(range(depth + 1))
    assert chain.ranks[1:].tolist() == [0] * depth
    total, expected_scores = 0.0, []
    for d, t in enumerate(argmax):
        total += rows[d][t]
        expected_scores.append(total)
    assert chain.scores[1:].tolist() == expected_scores
    # The B=1 tree is the chain cut at depth 1.
    single = build_tree(logits, 1)
    assert single.tokens.tolist() == chain.tokens[:2].tolist()
    assert single.scores.tolist() == chain.scores[:2].tolist()
    # The chain is the rank-0 path of the tree holding every prefix (when that tree is small).
    if num_prefixes(depth, vocab) <= 300:
        full = build_tree(logits, num_prefixes(depth, vocab))
        paths = token_paths(full)
        for d in range(1, depth + 1):
            node = paths.index(tuple(argmax[:d])) + 1
            assert full.scores[node].item() == chain.scores[d].item()
            assert full.ranks[node].item() == 0


@settings(max_examples=100)
@given(logits=draft_logits(max_vocab=6), margin=st.sampled_from([1e3, 1e4]))
def test_depth_limited_tree_is_the_chain_when_argmax_dominates(logits, margin):
    """With one overwhelming token per depth, the B=L tree is exactly build_chain."""
    depth, vocab = logits.shape
    peaked = torch.where(torch.isinf(logits), logits, torch.zeros_like(logits))
    winners = torch.argmax(torch.log_softmax(logits, -1), dim=-1)
    peaked[torch.arange(depth), winners] = margin
    assert build_tree(peaked, depth).same_as(build_chain(peaked))


def _expected_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Full stable sort of the float32 log-probs: descending, smaller id first on ties."""
    lp = torch.log_softmax(logits.float(), dim=-1) + 0.0
    order = torch.sort(-lp, dim=-1, stable=True).indices[:, :k]
    return torch.gather(lp, 1, order).double(), order


def test_per_depth_topk_ties_on_full_qwen_vocabulary():
    vocab = 151_936
    gen = torch.Generator().manual_seed(1234)
    logits = torch.zeros(2, vocab)
    # depth 1: four equal maxima far apart, two runners-up, then a sea of exact ties far below
    logits[0] = -20.0
    logits[0, [151_935, 100_000, 7, 3]] = 5.0
    logits[0, [151_934, 11]] = 4.0
    logits[0, 50_000:50_010] = float("-inf")
    # depth 2: three-valued logits, massive ties everywhere
    logits[1] = torch.randint(0, 3, (vocab,), generator=gen).float()
    for k in (1, 4, 16, 1024):
        lp, ids = per_depth_topk(logits, k)
        exp_lp, exp_ids = _expected_topk(logits, k)
        assert torch.equal(ids, exp_ids), k
        assert torch.equal(lp, exp_lp), k
    _, ids = per_depth_topk(logits, 8)
    assert ids[0].tolist() == [3, 7, 100_000, 151_935, 11, 151_934, 0, 1]
    budget = 256
    heap = build_tree(logits, budget)
    assert heap.num_nodes == budget
    paths = token_paths(heap)
    # by hand: the four tied depth-1 maxima (smaller id first), the two logit-4 tokens, then
    # only depth-2 extensions of node 1: (3, t) for the tied depth-2 maxima t (ids with
    # logit 2, smallest first), since every other depth-1 token sits 25 nats lower
    depth2_best = torch.nonzero(logits[1] == 2.0).flatten().tolist()
    assert paths[:6] == [(3,), (7,), (100_000,), (151_935,), (11,), (151_934,)]
    assert paths[6:] == [(3, t) for t in depth2_best[: budget - 6]]
    # and the same answer from a brute force over the (verified) per-depth top-K lists
    lp, ids = _expected_topk(logits, budget)
    cands = [(-lp[0, r].item(), (r,), (ids[0, r].item(),)) for r in range(budget)]
    cands += [
        (-(lp[0, a].item() + lp[1, b].item()), (a, b), (ids[0, a].item(), ids[1, b].item()))
        for a in range(budget)
        for b in range(budget)
    ]
    cands.sort(key=lambda c: (c[0], c[1]))
    assert paths == [c[2] for c in cands[:budget]]


def test_budget_larger_than_prefixes_and_errors():
    logits = torch.tensor([[0.0, 0.0, NEG_INF], [1.0, 1.0, 1.0]])
    tree = build_tree(logits, 1000)
    assert tree.num_nodes == num_prefixes(2, 3)
    assert token_paths(tree)[:2] == [(0,), (1,)]
    with pytest.raises(ValueError):
        build_tree(logits, 0)
    with pytest.raises(ValueError):
        build_tree(torch.zeros(0, 4), 4)
