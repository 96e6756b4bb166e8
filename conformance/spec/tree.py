"""Draft-tree construction (algorithm doc §3, "Construction").

A DDTree is the set of the B most probable prefixes under the drafter's factorised distribution
``Q(y) = prod_i q_i(y_i)``. :func:`build_tree` follows the paper's best-first heap, one pop per
node.

Conventions (they make the tree a pure function of the logits):

* log-probabilities are the exact ``log_softmax`` over the full vocabulary, in float32;
* per depth, tokens are ranked by log-prob, ties broken by the smaller token id (stable sort);
  only the top ``K = min(B, V)`` ranks per depth are considered;
* a prefix's score is the float64 sum ``((lp_1 + lp_2) + lp_3) ...`` taken in depth order;
* prefixes are ordered by score (descending), ties broken by the lexicographic order of their
  rank tuples, a prefix before its extensions;
* node ``i`` (1-based) is the i-th prefix in that order, i.e. the heap's pop order, so parents
  always precede children. Node 0 is the root (the last verified token), which the builder does
  not know: its token is ``-1`` until :func:`ddtree_conformance.spec.verify.compile_tree` fills it in.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property

import torch

__all__ = ["DraftTree", "per_depth_topk", "build_tree", "build_chain"]


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft tree with the root at index 0 and nodes 1..N in pop order.

    All tensors have length N+1 and live on the device of the draft logits.
    ``tokens[0] == -1`` (root token unknown to the builder), ``depths[0] == 0``,
    ``parents[0] == -1``, ``ranks[0] == -1``, ``scores[0] == 0``.
    """

    tokens: torch.Tensor  # int64 [N+1] drafted token of each node
    depths: torch.Tensor  # int64 [N+1] 1-based depth (root 0)
    parents: torch.Tensor  # int64 [N+1] parent node index (root -1)
    ranks: torch.Tensor  # int64 [N+1] rank of the token within its depth's top-K
    scores: torch.Tensor  # float64 [N+1] cumulative log-prob of the prefix

    @property
    def num_nodes(self) -> int:
        """Number of non-root nodes N (at most the budget)."""
        return int(self.tokens.shape[0]) - 1

    @cached_property
    def children(self) -> tuple[dict[int, int], ...]:
        """Per-node ``{token: child index}`` maps (siblings have distinct tokens)."""
        maps: list[dict[int, int]] = [{} for _ in range(self.num_nodes + 1)]
        for node, (parent, token) in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            if node == 0:
                continue
            if token in maps[parent]:
                raise ValueError(f"node {node}: sibling token {token} repeated under parent {parent}")
            maps[parent][token] = node
        return tuple(maps)

    def same_as(self, other: DraftTree) -> bool:
        """True when both trees have identical structure, tokens, ranks and scores."""
        return all(
            torch.equal(getattr(self, name).cpu(), getattr(other, name).cpu())
            for name in ("tokens", "depths", "parents", "ranks", "scores")
        )

    def to(self, device: torch.device | str) -> DraftTree:
        return DraftTree(*(getattr(self, n).to(device) for n in ("tokens", "depths", "parents", "ranks", "scores")))


def per_depth_topk(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs and token ids per depth (doc §3 step 1).

    Exact float32 log-softmax over the whole vocabulary; ranks ordered by log-prob descending,
    equal log-probs by smaller token id first, so the result is deterministic on every device.
    Returns ``(log_probs float64 [L, k], token_ids int64 [L, k])``.

    The tie-break is made exact without a full-vocabulary sort: each log-prob's float32 bits are
    mapped to an order-preserving integer and packed with the reversed token id into one int64, so
    every key is distinct and ``topk`` over the keys has a single correct answer.
    """
    if draft_logits.dim() != 2:
        raise ValueError(f"draft_logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    vocab = draft_logits.shape[1]
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1) + 0.0  # + 0.0 turns -0.0 into +0.0
    bits = log_probs.view(torch.int32).long()
    ordered = torch.where(bits >= 0, bits, -(bits & 0x7FFFFFFF) - 1)  # monotone in the float value
    id_bits = max(1, (vocab - 1).bit_length())
    ids = torch.arange(vocab, device=draft_logits.device)
    keys = (ordered << id_bits) | (vocab - 1 - ids)
    top_keys = torch.topk(keys, k, dim=-1, sorted=True).values
    token_ids = (vocab - 1) - (top_keys & ((1 << id_bits) - 1))
    return torch.gather(log_probs, 1, token_ids).double(), token_ids


def _check_inputs(draft_logits: torch.Tensor, budget: int) -> tuple[int, int, int]:
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if draft_logits.dim() != 2 or draft_logits.shape[0] < 1 or draft_logits.shape[1] < 1:
        raise ValueError(f"draft_logits must be a non-empty [L, V] tensor, got {tuple(draft_logits.shape)}")
    depth, vocab = draft_logits.shape
    return depth, vocab, min(budget, vocab)


def _tree_from_lists(tokens, depths, parents, ranks, scores, device) -> DraftTree:
    return DraftTree(
        tokens=torch.tensor([-1] + tokens, dtype=torch.long, device=device),
        depths=torch.tensor([0] + depths, dtype=torch.long, device=device),
        parents=torch.tensor([-1] + parents, dtype=torch.long, device=device),
        ranks=torch.tensor([-1] + ranks, dtype=torch.long, device=device),
        scores=torch.tensor([0.0] + scores, dtype=torch.float64, device=device),
    )


def build_tree(draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """Best-first DDTree construction with a max-heap (doc §3 steps 1-4, paper Alg. 1).

    ``draft_logits``: ``[L, V]`` per-position drafter logits for the L positions after the root.
    ``budget``: B, the maximum number of non-root nodes. Returns at most B nodes (fewer only when
    fewer than B prefixes exist).
    """
    depth_limit, _, k = _check_inputs(draft_logits, budget)
    top_lp, top_ids = per_depth_topk(draft_logits, k)
    lp, ids = top_lp.tolist(), top_ids.tolist()

    # Heap entry: (-score, rank tuple, parent index, depth, rank, parent score).
    heap = [(-lp[0][0], (0,), 0, 1, 0, 0.0)]
    tokens, depths, parents, ranks, scores = [], [], [], [], []
    while heap and len(tokens) < budget:
        neg_score, rank_path, parent, depth, rank, parent_score = heapq.heappop(heap)
        node = len(tokens) + 1
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        ranks.append(rank)
        scores.append(-neg_score)
        if rank + 1 < k:  # next sibling: same parent, next rank
            s = parent_score + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-s, rank_path[:-1] + (rank + 1,), parent, depth, rank + 1, parent_score))
        if depth < depth_limit:  # first child: one level deeper, rank 0
            s = -neg_score + lp[depth][0]
            heapq.heappush(heap, (-s, rank_path + (0,), node, depth + 1, 0, -neg_score))
    return _tree_from_lists(tokens, depths, parents, ranks, scores, draft_logits.device)


def build_chain(draft_logits: torch.Tensor) -> DraftTree:
    """Linear DFlash as a tree (doc §2): one node per depth, the argmax of each marginal.

    The chain is the path of rank-0 tokens; its nodes are 1..L, each the child of the previous.
    """
    depth_limit, _, _ = _check_inputs(draft_logits, 1)
    top_lp, top_ids = per_depth_topk(draft_logits, 1)
    scores, total = [], 0.0
    for value in top_lp[:, 0].tolist():  # left-to-right float64 sum, as in the heap
        total += value
        scores.append(total)
    return _tree_from_lists(
        top_ids[:, 0].tolist(),
        list(range(1, depth_limit + 1)),
        list(range(0, depth_limit)),
        [0] * depth_limit,
        scores,
        draft_logits.device,
    )
