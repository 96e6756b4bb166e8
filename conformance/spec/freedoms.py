"""Which verified trees the spec allows (docs/reference/freedoms.md): the spec tree up to the
freedoms an engine has, as one predicate on a traced round.

* Numbering: nodes may be laid out in any order after the root; only the tree (token paths) counts.
* Ties: equal log-probs, and prefixes of equal score, may be broken either way. "Equal" is up to the
  rounding of the float32 log-softmax the scores come from (``slack``: how far two correct kernels may
  put one log-prob apart; a prefix of depth d may score d times that away, so two prefixes of depths
  d and e tie within (d + e) slack; 0: exactly equal). A DDTree is then any prefix-closed set of B
  prefixes whose scores are the B best (the multiset of :func:`~.tree.build_tree`'s float64 scores, up
  to ties; every token within its depth's top K up to ties); a chain takes, at each depth, a token of
  the highest log-prob.
* The output's end: a node of depth >= ``room`` (the tokens the output can still take) can never be
  emitted, so it may be left out, down to a root-only round when one token is left. The drafter's
  block may also be cut to ``room`` positions (z-lab's ``dflash_generate``); the tree is then the
  spec tree of those positions' logits. Or the tree may be capped at the depth the output can still
  emit (``room - 1``, or ``room``) with its budget spent on the nodes it can emit: the B most probable
  prefixes no deeper than that (the spec tree of the first positions' logits).
* The context's end: an engine whose KV cache holds one slot per verified node, flat, may verify
  only as many nodes as fit, ``context_room = max_context - 2 - start`` (the root and the bonus need
  a slot each): the first ``context_room`` nodes of the spec tree in its order (the spec tree of
  that budget), none when no slot is left (a round without a tree).

Anything else is a different tree. :func:`may_hold` asks the same of one path: whether some tree the
spec allows (ties broken either way) holds it, or lacks it. This module imports only torch and the spec.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .tree import build_tree

__all__ = ["kept_depth", "least_budget", "may_hold", "tied", "tree_problem"]


def kept_depth(depth_limit: int, room: int | None) -> int:
    """Depths a round must keep: nodes deeper than ``room - 1`` can never be emitted."""
    return depth_limit if room is None else max(0, min(depth_limit, room - 1))


def least_budget(budget: int, context_room: int | None) -> int:
    """The fewest nodes a round may verify where the context's KV slots run out (``budget`` elsewhere)."""
    return budget if context_room is None else max(0, min(budget, context_room))


def _paths(tokens: Sequence[int], parents: Sequence[int], depths: Sequence[int]) -> list[tuple[int, ...]] | str:
    """Each node's token path from the root (root: ``()``), or why the arrays are not a tree rooted at 0."""
    n = len(tokens)
    paths: list[tuple[int, ...] | None] = [()] + [None] * (n - 1)
    for start in range(1, n):
        chain, node = [], start
        while paths[node] is None:
            parent = parents[node]
            if not 0 <= parent < n or parent == node or len(chain) > n:
                return f"node {node} has parent {parent}: not a tree rooted at node 0"
            chain.append(node)
            node = parent
        for node in reversed(chain):
            paths[node] = paths[parents[node]] + (int(tokens[node]),)
            if depths[node] != len(paths[node]):
                return f"node {node} has depth {depths[node]}, but {len(paths[node])} edges from the root"
    if len(set(paths)) != n:
        return "two nodes have the same token path (siblings with the same token)"
    return paths  # type: ignore[return-value]


def tied(a: float, b: float, depth_a: int, depth_b: int, slack: float) -> bool:
    """Whether two prefix scores are equal up to the rounding of their log-probs (module doc)."""
    return abs(a - b) <= (depth_a + depth_b) * slack


def _same_scores(mine: list[tuple[float, int]], spec: list[tuple[float, int]], slack: float) -> bool:
    """Whether two lists of (score, depth) are the same multiset of scores up to ties, paired in order."""
    if len(mine) != len(spec):
        return False
    return all(tied(a, b, da, db, slack) for (a, da), (b, db) in zip(sorted(mine, reverse=True), spec))


def _chain_problem(paths, log_probs: torch.Tensor, need: int, slack: float = 0.0) -> str | None:
    best = log_probs.max(dim=-1).values
    deepest = max((len(p) for p in paths), default=0)
    if len(paths) - 1 != deepest:
        return f"a DFlash round verifies a chain: {len(paths) - 1} nodes over {deepest} depths"
    path = max(paths, key=len)
    for depth, token in enumerate(path):
        if float(best[depth]) - float(log_probs[depth, token]) > 2 * slack:
            return (
                f"chain node at depth {depth + 1} drafts token {token}, not a most probable token of that "
                f"position ({float(log_probs[depth, token]):.4g} < {float(best[depth]):.4g})"
            )
    if deepest < need:
        return f"chain of {deepest} drafts, fewer than the {need} this round must verify"
    return None


def _score(log_probs: list[list[float]], path: tuple[int, ...]) -> float:
    score = 0.0
    for depth, token in enumerate(path):  # float64, in depth order: the builder's sums
        score += log_probs[depth][token]
    return score


def tree_problem(
    tokens: Sequence[int],
    parents: Sequence[int],
    depths: Sequence[int],
    draft_logits: torch.Tensor,
    mode: str,
    budget: int,
    *,
    depth_limit: int | None = None,
    room: int | None = None,
    context_room: int | None = None,
    slack: float = 0.0,
) -> str | None:
    """Why a traced tree (node 0 the root, any numbering) is not one the spec allows for ``draft_logits``
    ``[rows, V]`` (the engine's own drafter logits), else None (module doc).

    ``depth_limit``: the drafter's L (None: ``rows``); ``room``: tokens the output could still take
    when the round began; ``context_room``: ``max_context - 2 - start`` (None: no context limit);
    ``slack``: how far one log-prob may round (module doc; 0: ties are exactly equal scores)."""
    rows = int(draft_logits.shape[0])
    depth_limit = depth_limit or rows
    if rows > depth_limit:
        return f"the drafter's logits cover {rows} positions where its block gives L = {depth_limit}"
    if rows < depth_limit and (room is None or rows < min(depth_limit, room)):
        return (
            f"the drafter's logits cover {rows} positions of its {depth_limit}: a block is cut only to the room "
            f"the output has left ({'unknown' if room is None else room} tokens)"
        )
    paths = _paths(tokens, parents, depths)
    if isinstance(paths, str):
        return paths
    if any(len(p) > rows for p in paths):
        return f"a node is deeper than the {rows} drafted positions"
    keep = kept_depth(rows, room)
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1).double()
    if mode == "dflash":
        return _chain_problem(paths, log_probs, min(keep, least_budget(rows, context_room)), slack)
    nodes = paths[1:]
    if len(nodes) > budget:
        return f"{len(nodes)} nodes, more than the budget {budget}"
    k = min(budget, log_probs.shape[1])
    kth = torch.topk(log_probs, k, dim=-1).values[:, -1].tolist()
    lp = log_probs.tolist()
    for path in nodes:
        if lp[len(path) - 1][path[-1]] < kth[len(path) - 1] - 2 * slack:
            return f"node {list(path)} drafts a token outside its depth's top {k}"
    spec = build_tree(draft_logits, budget)
    spec_scores = spec.scores[1:].tolist()  # non-increasing: pop order
    spec_depths = spec.depths[1:].tolist()
    spec_paths = _paths(spec.tokens.tolist(), spec.parents.tolist(), spec.depths.tolist())[1:]
    scores = [_score(lp, p) for p in nodes]
    mine = [(s, len(p)) for s, p in zip(scores, nodes)]
    if _emittable_depth_tree(draft_logits, budget, nodes, mine, rows, room, slack):
        return None
    if keep >= rows and least_budget(budget, context_room) >= budget:  # nothing may be left out
        if not _same_scores(mine, list(zip(spec_scores, spec_depths)), slack):
            return (
                f"the tree's {len(nodes)} nodes are not the {len(spec_scores)} most probable prefixes (the spec "
                f"tree's scores; first tokens {[p[-1] for p in nodes[:6]]} vs {[p[-1] for p in spec_paths[:6]]})"
            )
        return None
    return _cut_round_problem(nodes, mine, spec, least_budget(budget, context_room), keep, room, slack)


def _cut_round_problem(nodes, mine, spec, least: int, keep: int, room: int | None, slack: float) -> str | None:
    """A round the output's or the context's end may cut: the engine's nodes (``mine``: their scores and
    depths) must all lie in some spec tree of a budget it may use (at least ``least``), and hold every node
    of that tree the output could still emit (depth <= ``keep``; nodes tied at the edge either way)."""
    spec_scores, spec_depths = spec.scores[1:].tolist(), spec.depths[1:].tolist()
    spec_paths = _paths(spec.tokens.tolist(), spec.parents.tolist(), spec.depths.tolist())[1:]
    lowest, lowest_depth = min(mine, default=(float("inf"), 0))
    above = sum(s > lowest and not tied(s, lowest, d, lowest_depth, slack) for s, d in zip(spec_scores, spec_depths))
    used = max(least, len(nodes), above + 1 if nodes else 0)
    if used > len(spec_scores):
        return f"the tree holds a prefix outside the {len(spec_scores)} most probable (the spec tree's)"
    edge, edge_depth = (spec_scores[used - 1], spec_depths[used - 1]) if used else (float("inf"), 0)
    have = set(nodes)
    needed = [(p, s) for p, s in zip(spec_paths[:used], spec_scores[:used]) if len(p) <= keep]
    for path, score in needed:
        if score > edge and not tied(score, edge, len(path), edge_depth, slack) and path not in have:
            return (
                f"the tree lacks the prefix {list(path)} of the spec tree of {used} nodes, which the output "
                f"could still emit (room {room})"
            )
    if sum(len(p) <= keep for p in nodes) < len(needed):  # nodes at the edge score may be swapped, not dropped
        return (
            f"the tree holds {sum(len(p) <= keep for p in nodes)} nodes of depth <= {keep}, the spec tree of "
            f"{used} nodes {len(needed)}"
        )
    return None


def _emittable_depth_tree(draft_logits, budget: int, nodes, mine, rows: int, room: int | None, slack: float) -> bool:
    """Whether the nodes (``mine``: their scores and depths) are the ``budget`` most probable prefixes no
    deeper than the output can still emit (``room - 1``, or ``room`` whose drafts are emitted without the
    bonus): the budget spent on nodes the output can emit (module doc)."""
    if room is None or room - 1 >= rows:
        return False
    for cap in sorted({max(room - 1, 0), min(room, rows)}):
        if cap <= 0 or any(len(p) > cap for p in nodes):
            continue
        capped = build_tree(draft_logits[:cap], budget)
        if _same_scores(mine, list(zip(capped.scores[1:].tolist(), capped.depths[1:].tolist())), slack):
            return True
    return False


def _held_prefix(tree, path: Sequence[int]) -> list[int]:
    """The nodes of ``tree`` along the longest prefix of ``path`` it holds (root excluded)."""
    children, node, nodes = tree.children, 0, []
    for token in path:
        node = children[node].get(int(token))
        if node is None:
            break
        nodes.append(node)
    return nodes


def _chain_may_hold(log_probs: torch.Tensor, path: Sequence[int], holds: bool, slack: float) -> bool:
    best = log_probs.max(dim=-1).values
    tops = [float(best[d]) - float(log_probs[d, t]) <= 2 * slack for d, t in enumerate(path)]
    if holds:  # every drafted token a most probable one of its position (up to ties)
        return all(tops)
    # lacks: at some depth the path's token is not the one most probable token (lower, or tied)
    return any(not top or int((log_probs[d] >= best[d] - 2 * slack).sum()) > 1 for d, top in enumerate(tops))


def _tree_may_hold(
    draft_logits: torch.Tensor, log_probs: torch.Tensor, budget: int, path, holds: bool, slack: float
) -> bool:
    spec = build_tree(draft_logits, budget)
    inside = _held_prefix(spec, path)
    if (len(inside) == len(path)) == holds:
        return True  # the spec tree itself
    tree_scores, parents, tree_depths = spec.scores.tolist(), spec.parents.tolist(), spec.depths.tolist()
    if len(tree_scores) == 1:
        return not holds
    # The lowest node score: every node tied with it may give its place to another prefix tied with it,
    # with its descendants (they score alike: a certain token adds 0); no other node may.
    low = min(range(1, len(tree_scores)), key=lambda n: (tree_scores[n], -tree_depths[n]))
    edge, edge_depth, lp, tokens = tree_scores[low], tree_depths[low], log_probs.tolist(), spec.tokens.tolist()

    def at_edge(score: float, depth: int) -> bool:
        return tied(score, edge, depth, edge_depth, slack)

    scores, total = [], 0.0
    for depth, token in enumerate(path):  # float64, in depth order: the builder's sums
        total += lp[depth][token]
        scores.append(total)
    if holds:  # the missing prefixes (each tied with the edge) take the places of edge nodes off the path
        missing = range(len(inside), len(path))
        on_path = set(inside)
        free = sum(at_edge(tree_scores[n], tree_depths[n]) for n in range(1, len(tree_scores)) if n not in on_path)
        return all(at_edge(scores[i], i + 1) for i in missing) and len(missing) <= free
    # lacks, where the spec tree holds the path: its last node and that node's subtree leave, if that many
    # prefixes tied with the edge outside the tree can take their places
    last = inside[-1]
    if not at_edge(tree_scores[last], tree_depths[last]):
        return False
    node_paths: list[tuple[int, ...]] = [()]
    for node in range(1, len(tokens)):
        node_paths.append(node_paths[parents[node]] + (tokens[node],))
    gone = {n for n in range(1, len(tokens)) if node_paths[n][: len(path)] == tuple(path)}
    present = set(node_paths)
    queue = [(node_paths[n], tree_scores[n]) for n in range(len(tokens)) if n not in gone]
    found = 0
    while queue and found < len(gone):
        prefix, score = queue.pop()
        depth = len(prefix) + 1
        if depth > log_probs.shape[0]:
            continue
        at_the_edge = (log_probs[depth - 1] + score - edge).abs() <= (
            depth + edge_depth
        ) * slack  # tied(), a row at once
        for token in torch.nonzero(at_the_edge).flatten().tolist():
            child = prefix + (token,)
            if child not in present:
                present.add(child)
                queue.append((child, score + lp[depth - 1][token]))
                found += 1
    return found >= len(gone)


def may_hold(
    draft_logits: torch.Tensor, mode: str, budget: int, path: Sequence[int], holds: bool, slack: float = 0.0
) -> bool:
    """Whether some tree the spec allows for ``draft_logits`` ``[rows, V]`` (module doc: equal log-probs and
    equal prefix scores, up to ``slack``, broken either way) holds the token ``path`` from the root
    (``holds``), or lacks it (``not holds``). A chain holds a path of most probable tokens; a DDTree holds
    a path whose prefixes all score at least its lowest node's score (those tied with it fitting its nodes
    tied with it), and may lack one where a path node tied with that score can give its place to another
    prefix tied with it."""
    path = [int(t) for t in path]
    if not path:
        return holds  # the root is always verified
    if len(path) > draft_logits.shape[0]:
        return not holds
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1).double()
    if mode == "dflash":
        return _chain_may_hold(log_probs, path, holds, slack)
    return _tree_may_hold(draft_logits, log_probs, budget, path, holds, slack)
