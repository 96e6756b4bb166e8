"""The trees the spec allows (conformance/spec/freedoms.py): the spec tree up to node numbering, ties,
and nodes the output's or the context's end leaves out; and nothing else."""

from __future__ import annotations

import torch

from ddtree_conformance.spec import build_chain, build_tree, tree_problem
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
