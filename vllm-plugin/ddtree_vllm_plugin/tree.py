"""The plugin's own DDTree tree: best-first construction and the walk.

Written independently of ``ddtree_conformance.spec`` (the suite's oracle) from the conventions in the
algorithm document (§3), so that the suite compares two implementations, not one with itself:

* per depth, tokens are ranked by float32 ``log_softmax``, ties broken by the smaller token id;
* a prefix scores the float64 sum of its log-probs in depth order;
* prefixes are taken best first, ties broken by the lexicographic order of their rank tuples,
  a prefix before its extensions; node ``i`` is the i-th prefix taken, so parents precede
  children and any prefix of the node order is itself a valid tree (the scheduler may truncate).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

__all__ = ["Tree", "best_first_tree", "ranked_tokens", "walk", "NodeSampler", "visibility"]


@dataclass
class Tree:
    """Node 0 is the root (the last committed token, unknown here); nodes 1..N in build order."""

    tokens: list[int]  # drafted token per node, root -1
    parents: list[int]  # root -1
    depths: list[int]  # root 0
    children: list[dict[int, int]] = field(default_factory=list)  # node -> {token: child node}

    def __post_init__(self) -> None:
        if not self.children:
            self.children = [{} for _ in self.tokens]
            for node in range(1, len(self.tokens)):
                self.children[self.parents[node]][self.tokens[node]] = node

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def truncated(self, n: int) -> Tree:
        """The first ``n`` nodes (what the scheduler actually scheduled)."""
        if n >= self.size:
            return self
        return Tree(self.tokens[: n + 1], self.parents[: n + 1], self.depths[: n + 1])


def ranked_tokens(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per depth, the ``k`` best tokens and their log-probs: log-prob descending, smaller id first."""
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    k = min(k, logp.shape[-1])
    # Candidates: everything at least as good as the k-th value, in id order; a stable sort by
    # log-prob, descending, keeps equal values in that order: smaller id first.
    kth = torch.topk(logp, k, dim=-1).values[:, -1:]
    tokens, values = [], []
    for row, bound in zip(logp, kth):
        ids = torch.nonzero(row >= bound, as_tuple=True)[0]
        vals = row[ids]
        order = torch.sort(vals, descending=True, stable=True).indices[:k]
        tokens.append(ids[order])
        values.append(vals[order])
    return torch.stack(tokens), torch.stack(values)


def best_first_tree(draft_logits: torch.Tensor, budget: int) -> Tree:
    """The ``budget`` most probable prefixes of the drafter's factorised distribution.

    ``draft_logits``: [L, V], row d-1 is the drafter's distribution at depth d.
    """
    depth_count = int(draft_logits.shape[0])
    tokens_by_depth, logp_by_depth = ranked_tokens(draft_logits, budget)
    toks = tokens_by_depth.tolist()
    lps = logp_by_depth.double().tolist()
    width = len(toks[0])
    tree_tokens, parents, depths = [-1], [-1], [0]
    # heap entry: (-score, rank tuple, parent node, depth, rank, parent score)
    heap = [(-lps[0][0], (0,), 0, 1, 0, 0.0)]
    while heap and len(tree_tokens) <= budget:
        neg, path, parent, depth, rank, parent_score = heapq.heappop(heap)
        node = len(tree_tokens)
        tree_tokens.append(toks[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        if rank + 1 < width:  # next sibling: same parent, next rank
            heapq.heappush(
                heap,
                (
                    -(parent_score + lps[depth - 1][rank + 1]),
                    path[:-1] + (rank + 1,),
                    parent,
                    depth,
                    rank + 1,
                    parent_score,
                ),
            )
        if depth < depth_count:  # first child
            heapq.heappush(heap, (neg - lps[depth][0], path + (0,), node, depth + 1, 0, -neg))
    return Tree(tree_tokens, parents, depths)


class NodeSampler:
    """Chooses the target's token at a tree node: argmax when greedy, else one sample from the
    distribution after temperature, then top-k, then top-p (the request's own parameters)."""

    def __init__(self, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None) -> None:
        self.greedy = temperature < 1e-5
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.generator = generator

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() / self.temperature
        vocab = scaled.shape[-1]
        if 0 < self.top_k < vocab:
            kth = torch.topk(scaled, self.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            drop = before >= self.top_p  # keep the smallest head whose mass reaches top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            probs = probs / probs.sum()
        return probs

    def __call__(self, logits: torch.Tensor) -> int:
        if self.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(self.probabilities(logits), 1, generator=self.generator))


def walk(tree: Tree, node_logits: torch.Tensor, choose) -> tuple[list[int], list[int], int]:
    """Follow the target from the root while its token is a child; ``node_logits[i]`` is the
    target's output at node ``i``. Returns (accepted nodes, target token per path node, bonus)."""
    node, accepted, targets = 0, [], []
    while True:
        token = choose(node_logits[node])
        targets.append(token)
        child = tree.children[node].get(token)
        if child is None:
            return accepted, targets, token
        accepted.append(child)
        node = child


def visibility(start: int, parents: list[int]) -> torch.Tensor:
    """Node ``i`` (1..n) sees the context ``[0, start]`` (root included) and its ancestors and itself."""
    n = len(parents) - 1
    seen = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    seen[0, 0] = True
    for node in range(1, n + 1):
        seen[node] = seen[parents[node]]
        seen[node, node] = True
    mask = torch.zeros(n, start + 1 + n, dtype=torch.bool)
    mask[:, : start + 1] = True
    mask[:, start + 1 :] = seen[1:, 1:]
    return mask
