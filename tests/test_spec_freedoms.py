"""The trees the spec allows (conformance/spec/freedoms.py): the spec tree up to node numbering, ties,
and nodes the output's or the context's end leaves out; and nothing else."""

from __future__ import annotations

import itertools

import torch

from ddtree_conformance.noise import log_prob_slack
from ddtree_conformance.policy_trees import node_paths
from ddtree_conformance.spec import build_chain, build_tree, may_hold, tree_problem
from ddtree_conformance.testing.correct_engines import reversed_ties_tree
from ddtree_conformance.testing.stepped import first_nodes, renumbered, shallower


def _logits(seed: int = 0, depth: int = 6, vocab: int = 40) -> torch.Tensor:
    return torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _problem(tree, logits, mode="ddtree", budget=16, **kw):
    tokens = [9] + tree.tokens[1:].tolist()  # the root's token is the engine's, any value
    return tree_problem(tokens, tree.parents.tolist(), tree.depths.tolist(), logits, mode, budget, **kw)


def test_the_spec_tree_and_any_numbering_of_it_pass():
    logits = _logits()
    tree = build_tree(logits, 16)
    assert _problem(tree, logits) is None
    order = [0] + sorted(range(1, 17), key=lambda i: (-int(tree.depths[i]), i))  # children before parents
    assert _problem(renumbered(tree, order), logits) is None
    assert _problem(build_chain(logits), logits, mode="dflash") is None


def test_another_tree_fails():
    logits = _logits()
    wrong = build_tree(logits, 15)  # one node short of B=16
    assert "not the 16 most probable" in _problem(wrong, logits)
    other = build_tree(_logits(seed=1), 16)  # a tree of other logits
    assert _problem(other, logits) is not None
    chain = build_chain(logits)
    swapped = chain.tokens.clone()
    swapped[3] = int(torch.topk(logits[2], 2).indices[1])  # a runner-up at depth 3
    assert "not a most probable token" in tree_problem(
        [9] + swapped[1:].tolist(), chain.parents.tolist(), chain.depths.tolist(), logits, "dflash", 1
    )


def test_a_cycle_or_a_repeated_sibling_is_not_a_tree():
    logits = _logits()
    assert "not a tree" in tree_problem([9, 1, 2], [-1, 2, 1], [0, 1, 1], logits, "ddtree", 2)
    top = int(torch.argmax(logits[0]))
    assert "same token path" in tree_problem([9, top, top], [-1, 0, 0], [0, 1, 1], logits, "ddtree", 2)


def test_ties_broken_either_way_pass():
    logits = torch.full((3, 20), -5.0)
    logits[:, 4] = logits[:, 7] = logits[:, 11] = 2.0  # three equal tokens at every depth
    spec, other = build_tree(logits, 5), reversed_ties_tree(logits, 5)
    assert spec.tokens.tolist() != other.tokens.tolist()
    assert _problem(other, logits, budget=5) is None
    chain = build_chain(logits)
    chain_other = chain.tokens.clone()
    chain_other[1:] = 11  # also a most probable token at every depth
    assert (
        tree_problem([9] + chain_other[1:].tolist(), chain.parents.tolist(), chain.depths.tolist(), logits, "dflash", 1)
        is None
    )


def test_unemittable_nodes_may_be_left_out_only_near_the_output_end():
    logits = _logits(depth=8)
    tree = build_tree(logits, 32)
    cut = shallower(tree, 2)  # keeps depths 1-2: right when 3 tokens are left (depth 3 is never emitted)
    assert cut.num_nodes < tree.num_nodes
    assert _problem(cut, logits, budget=32, room=3) is None
    assert "lacks the prefix" in _problem(cut, logits, budget=32, room=4)  # depth 3 could still be emitted
    assert _problem(cut, logits, budget=32) is not None  # mid-output: the whole tree
    root_only = first_nodes(tree, 0)
    assert _problem(root_only, logits, budget=32, room=1) is None  # the last token: a round without a tree
    assert _problem(root_only, logits, budget=32, room=2) is not None


def test_a_context_cut_keeps_the_spec_tree_of_the_slots_left():
    logits = _logits(depth=8)
    tree = build_tree(logits, 32)
    assert _problem(first_nodes(tree, 10), logits, budget=32, context_room=10) is None
    assert _problem(first_nodes(tree, 9), logits, budget=32, context_room=10) is not None  # cut more than needed
    assert _problem(first_nodes(tree, 0), logits, budget=32, context_room=0) is None  # no slot: no tree
    assert _problem(first_nodes(tree, 10), logits, budget=32) is not None  # no context limit: the whole tree
    chain = build_chain(logits)
    assert _problem(first_nodes(chain, 3), logits, mode="dflash", budget=1, context_room=3) is None
    assert _problem(first_nodes(chain, 3), logits, mode="dflash", budget=1, context_room=4) is not None


def test_a_cut_drafter_block_only_near_the_output_end():
    logits = _logits(depth=5)  # the engine drafted 5 positions of a block of L = 8
    tree = build_tree(logits, 16)
    assert _problem(tree, logits, depth_limit=8, room=5) is None
    assert "cut only to the room" in _problem(tree, logits, depth_limit=8, room=9)
    assert "cut only to the room" in _problem(tree, logits, depth_limit=8)


def _node_paths(tree) -> list[tuple[int, ...]]:
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    paths = [()]
    for node in range(1, len(tokens)):
        paths.append(paths[parents[node]] + (tokens[node],))
    return paths


def _candidate_paths(trees, vocab: int, depth: int) -> set[tuple[int, ...]]:
    """Every node path of ``trees``, and each extended by one token (held or not)."""
    nodes = {p for tree in trees for p in _node_paths(tree)}
    return nodes | {p + (t,) for p in nodes if len(p) < depth for t in range(vocab)}


def _reversed_ties_chain(logits: torch.Tensor) -> list[int]:
    lp = torch.log_softmax(logits.float(), dim=-1)
    return [int(torch.nonzero(row == row.max()).max()) for row in lp]


def test_may_hold_agrees_with_both_tie_breaks_and_nothing_else():
    """Quantised logits (ties at every depth, as in bf16): every path that the spec tree or the tree with
    ties broken the other way holds may be held, and every path one of them lacks may be lacked. Continuous
    logits (no ties): the spec tree is the only tree, so each path may only be what it is there."""
    for seed in range(12):
        raw = _logits(seed, depth=4, vocab=10)
        for logits, tied in ((torch.round(raw), True), (raw, False)):
            for budget in (4, 9):
                trees = [build_tree(logits, budget), reversed_ties_tree(logits, budget)]
                held = [set(_node_paths(t)) for t in trees]
                for path in _candidate_paths(trees, 10, 4):
                    for tree_paths in held:
                        assert may_hold(logits, "ddtree", budget, path, path in tree_paths), (seed, budget, path)
                    if not tied:
                        assert not may_hold(logits, "ddtree", budget, path, path not in held[0]), (seed, path)
            chains = [tuple(build_chain(logits).tokens[1:].tolist()), tuple(_reversed_ties_chain(logits))]
            for chain in chains:
                for depth in range(1, 5):
                    assert may_hold(logits, "dflash", 1, chain[:depth], True)
            if chains[0] != chains[1]:
                assert may_hold(logits, "dflash", 1, chains[0], False)
            elif not tied:
                assert not may_hold(logits, "dflash", 1, chains[0], False)


def _allowed_trees(logits: torch.Tensor, budget: int) -> list[set[tuple[int, ...]]]:
    """Every tree tree_problem allows (no cut), by brute force over prefixes scoring at least the spec
    tree's lowest score (only those can be in one)."""
    lp = torch.log_softmax(logits.float(), dim=-1).double().tolist()
    edge = min(build_tree(logits, budget).scores[1:].tolist())
    candidates, frontier = [], [((), 0.0)]
    while frontier:
        path, score = frontier.pop()
        for token in range(logits.shape[1]) if len(path) < logits.shape[0] else []:
            child = (path + (token,), score + lp[len(path)][token])
            if child[1] >= edge:
                candidates.append(child[0])
                frontier.append(child)
    trees = []
    for nodes in itertools.combinations(candidates, budget):
        chosen = set(nodes)
        if any(p[:-1] and p[:-1] not in chosen for p in chosen):
            continue
        order = sorted(chosen, key=len)
        index = {p: i + 1 for i, p in enumerate(order)}
        parents = [-1] + [index.get(p[:-1], 0) for p in order]
        problem = tree_problem(
            [9] + [p[-1] for p in order], parents, [0] + [len(p) for p in order], logits, "ddtree", budget
        )
        if problem is None:
            trees.append(chosen | {()})
    return trees


def test_may_hold_equals_a_brute_force_over_every_allowed_tree():
    """Small quantised pairs (many equal scores): a path may be held (lacked) exactly when some tree the
    spec allows holds (lacks) it; never more, never less."""
    compared = 0
    for seed in range(40):
        logits = torch.round(torch.randn(3, 4, generator=torch.Generator().manual_seed(seed)) * 2)
        if seed >= 25:  # a certain token at one depth (log-prob exactly 0): a prefix and its child score alike
            logits[seed % 3] = torch.tensor([0.0, -200.0, -200.0, -200.0]).roll(seed % 4)
        for budget in (2, 3, 5):
            trees = _allowed_trees(logits, budget)
            assert trees, (seed, budget)
            paths = {p + (t,) for tree in trees for p in tree if len(p) < 3 for t in range(4)}
            for path in paths:
                for holds in (True, False):
                    truth = any((path in tree) == holds for tree in trees)
                    assert may_hold(logits, "ddtree", budget, path, holds) == truth, (seed, budget, path, holds)
                    compared += 1
        chains = [c for c in itertools.product(range(4), repeat=3) if _chain_allowed(logits, c)]
        for path in {c[:depth] for depth in range(1, 4) for c in itertools.product(range(4), repeat=3)}:
            for holds in (True, False):
                truth = any((c[: len(path)] == path) == holds for c in chains)
                assert may_hold(logits, "dflash", 1, path, holds) == truth, (seed, "dflash", path, holds)
                compared += 1
    assert compared > 1000


def _chain_allowed(logits: torch.Tensor, chain: tuple[int, ...]) -> bool:
    return tree_problem([9, *chain], [-1, 0, 1, 2], [0, 1, 2, 3], logits, "dflash", 1) is None


KERNEL_BUDGET = 64


def _quantised(seed: int) -> torch.Tensor:
    """bf16-valued drafter logits: equal sums of logits across prefixes of one depth are frequent, and their
    float32 log-probs part those ties by a rounding, which another log-softmax kernel rounds otherwise."""
    return _logits(seed, depth=8, vocab=64).bfloat16().float()


def _kernel_ties():
    """(logits, the spec tree, the tree of float64 log-probs) for every seed of 1000 where the two hold
    different prefixes at B = 64: the spec's heap over another log-softmax kernel's scores (on this CPU,
    about 1 seed in 40; the test needs 3, so that another CPU's kernel still finds some)."""
    found = []
    for seed in range(1000):
        logits = _quantised(seed)
        spec = build_tree(logits, KERNEL_BUDGET)
        other = build_tree(torch.log_softmax(logits.double(), dim=-1).float(), KERNEL_BUDGET)
        paths = [node_paths(t.tokens.tolist(), t.parents.tolist()) for t in (spec, other)]
        if set(paths[0]) != set(paths[1]):
            found.append((logits, spec, other))
    assert len(found) >= 3, f"{len(found)} seeds of 1000 where another log-softmax kernel changes the tree"
    return found


def test_ties_up_to_the_rounding_of_the_log_softmax_pass():
    """A tree from another log-softmax kernel's scores (float64, rounded) is the spec's up to ties within
    the noise model's slack; with exact ties only (slack 0) it is a different tree."""
    b, refused_trees, refused_paths = KERNEL_BUDGET, 0, 0
    for logits, _, other in _kernel_ties():
        slack = log_prob_slack(logits, b)
        exact = _problem(other, logits, budget=b)  # None where the kernels only broke an exact tie otherwise
        refused_trees += exact is not None and f"not the {b} most probable" in exact
        assert _problem(other, logits, budget=b, slack=slack) is None
        paths = node_paths(other.tokens.tolist(), other.parents.tolist())
        only = [p for p in paths[1:] if not may_hold(logits, "ddtree", b, p, True)]
        assert all(may_hold(logits, "ddtree", b, p, True, slack=slack) for p in only)
        refused_paths += len(only)
    assert refused_trees >= 3, f"{refused_trees} trees that exact ties alone refuse: the slack is barely tested"
    assert refused_paths, "no path of these trees that exact ties alone refuse: may_hold's slack is untested"


def test_the_slack_excuses_no_prefix_clearly_below_the_edge():
    """The spec tree with its lowest leaf swapped for the best prefix outside it, where the two scores part
    by more than the slack: still a different tree, and the swapped-in path is one no allowed tree holds."""
    checked = 0
    for seed in range(40):
        logits = _logits(seed)
        slack = log_prob_slack(logits, 16)
        wider = build_tree(logits, 17)  # node 17: the best prefix outside the B = 16 tree
        parents, scores, depths = wider.parents.tolist(), wider.scores.tolist(), wider.depths.tolist()
        if 16 in parents or parents[17] == 16 or scores[16] - scores[17] <= (depths[16] + depths[17]) * slack:
            continue
        keep = [n for n in range(18) if n != 16]
        tokens = [9] + [int(wider.tokens[n]) for n in keep[1:]]
        remap = {n: i for i, n in enumerate(keep)}
        swapped_parents = [-1] + [remap[parents[n]] for n in keep[1:]]
        problem = tree_problem(tokens, swapped_parents, [depths[n] for n in keep], logits, "ddtree", 16, slack=slack)
        assert problem is not None and "not the 16 most probable" in problem
        path = node_paths(wider.tokens.tolist(), parents)[17]
        assert not may_hold(logits, "ddtree", 16, path, True, slack=slack)
        checked += 1
    assert checked >= 10
