"""Walking a verified tree (ddtree_conformance.spec.walk) and the request's token distribution."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ddtree_conformance.spec.commit import emit_tokens
from ddtree_conformance.spec.tree import DraftTree, build_tree
from ddtree_conformance.spec.walk import SamplingParams, choose_token, processed_probs, top2_margin, walk_tree

VOCAB = 12


@st.composite
def tree_and_target(draw, max_nodes: int = 30):
    """A random tree (distinct sibling tokens) and target logits whose argmax is forced to
    equal a child's token at a random subset of nodes (so walks go deep)."""
    n = draw(st.integers(0, max_nodes))
    parents, depths, tokens = [-1], [0], [-1]
    children: dict[int, list[int]] = {0: []}
    for node in range(1, n + 1):
        parent = draw(st.sampled_from([j for j in range(node) if len(children[j]) < VOCAB]))
        used = {tokens[c] for c in children[parent]}
        token = draw(st.sampled_from([t for t in range(VOCAB) if t not in used]))
        parents.append(parent)
        depths.append(depths[parent] + 1)
        tokens.append(token)
        children[parent].append(node)
        children[node] = []
    tree = DraftTree(
        tokens=torch.tensor(tokens),
        depths=torch.tensor(depths),
        parents=torch.tensor(parents),
        ranks=torch.tensor([-1] + [0] * n),
        scores=torch.zeros(n + 1, dtype=torch.float64),
    )
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    # integer logits: argmax ties happen, and the walk must take the lowest id
    logits = torch.randint(-3, 4, (n + 1, VOCAB), generator=gen).float()
    for node in range(n + 1):
        if children[node] and draw(st.integers(0, 3)) > 0:
            child = draw(st.sampled_from(children[node]))
            logits[node, tokens[child]] = logits[node].max() + draw(st.sampled_from([0.0, 1.0]))
    return tree, logits


def brute_force_greedy_walk(tree: DraftTree, logits: torch.Tensor):
    """Deepest node whose every edge matches the parent's argmax (lowest id on ties)."""
    rows = logits.tolist()
    argmax = [max(range(len(r)), key=lambda t, r=r: (r[t], -t)) for r in rows]
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    best: list[int] = []
    for node in range(1, len(parents)):
        path, j = [], node
        while j != 0:
            path.append(j)
            j = parents[j]
        path.reverse()
        prev, ok = 0, True
        for j in path:
            if tokens[j] != argmax[prev]:
                ok = False
                break
            prev = j
        if ok and len(path) > len(best):
            best = path
    last = best[-1] if best else 0
    return best, argmax[last], {j: argmax[j] for j in [0, *best]}


@settings(max_examples=300)
@given(case=tree_and_target())
def test_greedy_walk_is_longest_matching_path(case):
    tree, logits = case
    result = walk_tree(tree, logits)
    accepted, bonus, chosen = brute_force_greedy_walk(tree, logits)
    assert result.accepted == accepted
    assert result.bonus == bonus
    assert result.target_tokens == chosen
    last = accepted[-1] if accepted else 0
    assert bonus not in tree.children[last]


def test_greedy_walk_on_builder_tree_hand_case():
    tree = build_tree(torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0]]), 5)
    # nodes: 1=(0,), 2=(1,), 3=(0,1), 4=(2,)|(0,2)... whatever they are, force path root->(1,)->(1,1)?
    paths = {}
    for node in range(1, tree.num_nodes + 1):
        parent = tree.parents[node].item()
        paths[node] = paths.get(parent, ()) + (tree.tokens[node].item(),)
    target = torch.full((tree.num_nodes + 1, 3), -5.0)
    target[0, 0] = 1.0  # root's target token 0 -> node (0,)
    node0 = next(n for n, p in paths.items() if p == (0,))
    target[node0, 1] = 1.0  # then token 1 -> node (0, 1)
    node01 = next(n for n, p in paths.items() if p == (0, 1))
    target[node01, 2] = 1.0  # bonus 2
    result = walk_tree(tree, target)
    assert result.accepted == [node0, node01]
    assert result.bonus == 2


def test_walk_rejects_wrong_row_count():
    tree = build_tree(torch.zeros(2, 3), 4)
    with pytest.raises(ValueError):
        walk_tree(tree, torch.zeros(3, 3))


SAMPLING = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.9),
]


@settings(max_examples=150)
@given(case=tree_and_target(), params=st.sampled_from(SAMPLING), seed=st.integers(0, 10_000))
def test_sampled_walk_draws_one_sample_per_visited_node(case, params, seed):
    tree, logits = case
    # make sampling likely to follow children: sharpen the forced rows
    logits = logits * 3.0
    gen = torch.Generator().manual_seed(seed)
    result = walk_tree(tree, logits, params, gen)
    replay = torch.Generator().manual_seed(seed)
    visited = [0, *result.accepted]
    assert list(result.target_tokens) == visited
    for node in visited:
        assert choose_token(logits[node], params, replay) == result.target_tokens[node]
    assert torch.equal(gen.get_state(), replay.get_state()), "exactly one draw per visited node"
    # the path follows the sampled tokens
    for prev, node in zip(visited, visited[1:]):
        assert tree.tokens[node].item() == result.target_tokens[prev]
    assert result.bonus == result.target_tokens[visited[-1]]
    assert result.bonus not in tree.children[visited[-1]]


# ---------------------------------------------------------------------------------------------
# processed_probs / choose_token


@settings(max_examples=200)
@given(
    values=st.lists(st.floats(-8, 8, width=32), min_size=2, max_size=30),
    temperature=st.sampled_from([0.25, 0.5, 1.0, 1.7, 3.0]),
)
def test_temperature_scaling(values, temperature):
    logits = torch.tensor(values)
    probs = processed_probs(logits, SamplingParams(temperature=temperature))
    expected = torch.softmax(logits.double() / temperature, dim=-1)
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.double(), expected, atol=1e-6, rtol=1e-5)
    assert math.isclose(float(probs.sum()), 1.0, abs_tol=1e-5)


@settings(max_examples=200)
@given(
    values=st.lists(st.integers(-3, 3), min_size=2, max_size=30),
    top_k=st.integers(1, 35),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_top_k_keeps_k_with_ties_at_kth(values, top_k, temperature):
    logits = torch.tensor(values, dtype=torch.float32)
    probs = processed_probs(logits, SamplingParams(temperature=temperature, top_k=top_k))
    ordered = sorted(values, reverse=True)
    if top_k >= len(values):
        kept = set(range(len(values)))
    else:
        kth = ordered[top_k - 1]
        kept = {i for i, v in enumerate(values) if v >= kth}  # ties at the k-th value stay
        assert len(kept) >= top_k
    assert {i for i, p in enumerate(probs.tolist()) if p > 0} == kept
    sub = torch.tensor([values[i] for i in sorted(kept)], dtype=torch.float64) / temperature
    expected = torch.softmax(sub, dim=-1)
    assert torch.allclose(probs[sorted(kept)].double(), expected, atol=1e-6)


def _nucleus_size(probs: list[float], top_p: float) -> int:
    """Smallest m such that the m largest probabilities sum to >= top_p (float64)."""
    total = 0.0
    for m, p in enumerate(sorted(probs, reverse=True), start=1):
        total += p
        if total >= top_p:
            return m
    return len(probs)


@settings(max_examples=300)
@given(
    values=st.lists(st.floats(-6, 6, width=32), min_size=2, max_size=30),
    top_p=st.floats(0.01, 0.99),
    top_k=st.sampled_from([0, 3, 8]),
)
def test_top_p_nucleus_is_minimal(values, top_p, top_k):
    logits = torch.tensor(values)
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    before_p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=top_k)).double().tolist()
    cumulative = sorted(before_p, reverse=True)
    running = 0.0
    for p in cumulative:  # keep away from float32 cumsum boundary effects
        running += p
        assume(abs(running - top_p) > 1e-5)
    probs = processed_probs(logits, params)
    kept = [i for i, p in enumerate(probs.tolist()) if p > 0]
    m = _nucleus_size(before_p, top_p)
    assert len(kept) == m
    smallest_kept = min(before_p[i] for i in kept)
    assert all(before_p[i] <= smallest_kept for i in range(len(values)) if i not in kept)
    assert int(torch.argmax(logits)) in kept  # the most probable token is always kept
    expected = torch.tensor([before_p[i] for i in kept], dtype=torch.float64)
    assert torch.allclose(probs[kept].double(), expected / expected.sum(), atol=1e-6)
    assert math.isclose(float(probs.sum()), 1.0, abs_tol=1e-5)


def test_top_p_tiny_keeps_only_the_argmax():
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    probs = processed_probs(logits, SamplingParams(temperature=1.0, top_p=1e-6))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_choose_takes_lowest_id_on_ties_and_draws_nothing():
    logits = torch.tensor([1.0, 3.0, 3.0, 2.0])
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    assert choose_token(logits, SamplingParams(), gen) == 1
    assert torch.equal(gen.get_state(), state)


def test_top2_margin():
    logits = torch.tensor([[1.0, 4.0, 2.5], [0.0, 0.0, -1.0]])
    assert top2_margin(logits).tolist() == [1.5, 0.0]


# ---------------------------------------------------------------------------------------------
# emit_tokens


def _emit_reference(tokens, stops, room):
    out = []
    for t in tokens:
        if len(out) >= room:
            return out, "length"
        out.append(t)
        if t in stops:
            return out, "stop"
    return out, ("length" if len(out) == room else None)


@pytest.mark.parametrize(
    "tokens, stops, room, expected",
    [
        ([5, 6, 7], [], 10, ([5, 6, 7], None)),
        ([5, 6, 7], [6], 10, ([5, 6], "stop")),  # stop mid-path truncates right after it
        ([5, 6, 7], [7], 10, ([5, 6, 7], "stop")),  # stop as the bonus
        ([5, 6, 6, 7], [6], 10, ([5, 6], "stop")),  # first stop wins
        ([5, 6, 7], [], 2, ([5, 6], "length")),  # limit reached mid-round
        ([5, 6, 7], [], 3, ([5, 6, 7], "length")),  # limit reached exactly
        ([5, 6, 7], [7], 2, ([5, 6], "length")),  # stop beyond the limit is never emitted
        ([5, 6, 7], [6], 2, ([5, 6], "stop")),  # stop at the last allowed slot: stop wins
        ([5], [5], 1, ([5], "stop")),
        ([5, 6], [], 0, ([], "length")),
    ],
)
def test_emit_tokens_cases(tokens, stops, room, expected):
    assert emit_tokens(tokens, stops, room) == expected


@settings(max_examples=200)
@given(
    tokens=st.lists(st.integers(0, 6), min_size=1, max_size=10),
    stops=st.lists(st.integers(0, 6), max_size=2),
    room=st.integers(1, 12),
)
def test_emit_tokens_property(tokens, stops, room):
    assert emit_tokens(tokens, stops, room) == _emit_reference(tokens, set(stops), room)
