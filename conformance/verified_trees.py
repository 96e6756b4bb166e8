"""Verified trees (light traces): the rules one round's tree must keep, as pure functions.

A :class:`~ddtree_conformance.adapters.interface.VerifiedTree` is a tree rooted at node 0 (parent -1;
the other nodes in any order) with one target token per node. Two functions say how a result's
trees break the rules (:func:`shape_problem`, :func:`round_problem`; the integrity rules,
:mod:`ddtree_conformance.integrity`, turn each into an error naming the field); :func:`walk` and
:func:`depths` are shared with node scoring (:mod:`ddtree_conformance.node_scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["tree_problem", "depths", "walk", "shape_problem", "round_problem"]


def _depths(parents: Sequence[int]) -> list[int] | str:
    """Depth of every node, or why ``parents`` is not a tree rooted at node 0."""
    if not parents or parents[0] != -1:
        return "the root (node 0) must have parent -1"
    depth: list[int | None] = [0] + [None] * (len(parents) - 1)
    for i in range(1, len(parents)):
        chain, node = [], i
        while depth[node] is None:
            parent = parents[node]
            if node in chain or not 0 <= parent < len(parents) or parent == node:
                return f"node {i} does not lead to the root (parent {parent!r} at node {node})"
            chain.append(node)
            node = parent
        for step, member in enumerate(reversed(chain), start=1):
            depth[member] = depth[node] + step
    return depth


def tree_problem(parents: Sequence[int]) -> str | None:
    """Why ``parents`` is not a tree rooted at node 0 (any numbering of the other nodes), or None."""
    found = _depths(parents)
    return found if isinstance(found, str) else None


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node of a tree (checked by :func:`tree_problem`)."""
    found = _depths(parents)
    if isinstance(found, str):
        raise ValueError(found)
    return found


def walk(tokens: Sequence[int], parents: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Greedy walk by the target's tokens from the root: the accepted nodes' tokens, then the bonus."""
    children: dict[tuple[int, int], int] = {}
    for i in range(1, len(tokens)):
        children.setdefault((parents[i], tokens[i]), i)
    node, committed = 0, []
    while (node, targets[node]) in children:
        node = children[(node, targets[node])]
        committed.append(tokens[node])
    return committed + [targets[node]]


def _ids(values, vocab: int | None) -> bool:
    return isinstance(values, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v and (vocab is None or v < vocab) for v in values
    )


def shape_problem(trees, vocab: int | None) -> tuple[str, str] | None:
    """``(field, problem)`` for the first tree that is not a tree of token ids in the vocabulary rooted
    at node 0 with one target token per node, or None."""
    for k, tree in enumerate(trees):
        field = f"verified_trees[{k}]"
        n = len(tree.tree_tokens)
        for name in ("tree_tokens", "node_target_tokens"):
            values = getattr(tree, name)
            if not _ids(values, vocab) or len(values) != n or n < 1:
                return f"{field}.{name}", f"expected {n} (>= 1) token ids in the vocabulary, got {values!r:.80}"
        if len(tree.parents) != n or tree_problem(tree.parents):
            return f"{field}.parents", tree_problem(tree.parents) or f"{len(tree.parents)} entries for {n} nodes"
    return None


def round_problem(trees, output: Sequence[int], lengths: Sequence[int], greedy: bool) -> tuple[str, str] | None:
    """``(field, problem)`` for the first round whose tree (well-formed: :func:`shape_problem`) breaks
    the rules against ``output`` and the round ``lengths``, or None: one tree per round, rooted at the
    round's root; for a greedy request the walk by its own targets commits exactly the round's tokens
    (as far as the output shows them; in the last round the walk may run past the output's end, whose
    length an engine may report as emitted)."""
    if len(trees) != len(lengths):
        return "verified_trees", f"{len(trees)} trees for {len(lengths)} rounds (one per round)"
    committed = 0
    for k, (tree, length) in enumerate(zip(trees, lengths)):
        field = f"verified_trees[{k}]"
        if tree.tree_tokens[0] != output[committed]:
            return (
                f"{field}.tree_tokens",
                f"root {tree.tree_tokens[0]}, but the round's root (output index {committed}) is {output[committed]}",
            )
        if greedy:
            tokens = walk(tree.tree_tokens, tree.parents, tree.node_target_tokens)
            shown = list(output[committed + 1 : committed + 1 + length])
            last = k == len(lengths) - 1  # the output's end (stop token, max_new_tokens) may cut the last walk
            if (len(tokens) < length if last else len(tokens) != length) or tokens[: len(shown)] != shown:
                return (
                    f"{field}.node_target_tokens",
                    f"walking the tree by its target tokens commits {tokens} "
                    f"({len(tokens)} tokens), but round {k} commits {shown} "
                    f"(length {length})",
                )
        committed += length
    return None
