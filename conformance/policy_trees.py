"""Draft trees under the policies integrations have shipped instead of the spec's, and the reference
engine run under one of them (what an engine that gives no traces is compared with).

:func:`build_policy_tree` is the spec's best-first heap (:func:`~ddtree_conformance.spec.build_tree`)
with the known deviations as switches; all off, it is the spec's tree. :data:`KNOWN_POLICIES` holds
the ones read in vLLM PR #42910 and SGLang PR #29907 (:mod:`ddtree_conformance.tree_policy` names
them); :mod:`ddtree_conformance.policy_matching` says which one an engine's acceptance equals. The vLLM
PR's depth (B positions drafted) needs no replay: acceptance shows it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ddtree_conformance.spec import DraftTree, build_chain, per_depth_topk

__all__ = [
    "KNOWN_POLICIES",
    "KNOWN_POLICY_KINDS",
    "KNOWN_POLICY_TEXT",
    "MAX_FIT_ROUNDS",
    "PolicyFit",
    "build_policy_tree",
    "distinct_policies",
    "fit_policy",
    "node_paths",
    "policy_heap",
    "renumber_breadth_first",
    "sglang_width",
]

BONUS_GRID = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
MARGIN_GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
MAX_FIT_ROUNDS = 64  # differing rounds a rebuild fit looks at (they agree on a policy within a few)


def sglang_width(budget: int, depth: int) -> int:
    """SGLang PR #29907's children per node above L: ``min(max(B // L + 1, 2), 6)`` (6 is the default of
    its ``SGLANG_DDTREE_MAX_TOPK``)."""
    return min(max(budget // max(depth, 1) + 1, 2), 6)


def node_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Every node's token path from the root (the root's is ``()``); nodes may be numbered in any order
    (a parent after its child included: a freedom), the arrays already checked to form a tree."""
    paths: list[tuple[int, ...] | None] = [()] + [None] * (len(tokens) - 1)

    def path(i: int) -> tuple[int, ...]:
        chain = []
        while paths[i] is None:
            chain.append(i)
            i = parents[i]
        for node in reversed(chain):
            paths[node] = paths[parents[node]] + (int(tokens[node]),)
        return paths[i] if not chain else paths[chain[0]]

    return [path(i) for i in range(len(tokens))]


def build_policy_tree(
    draft_logits: torch.Tensor,
    budget: int,
    *,
    max_children: int | None = None,
    depth_bonus: float = 0.0,
    early_stop_margin: float | None = None,
    keep_spine: bool = False,
    chain: bool = False,
    order: str = "pop",
) -> DraftTree:
    """The spec's best-first heap with one or more of the known deviations switched on.

    ``max_children``: only the top ``k`` tokens per depth are candidates (at most ``k`` children per
    node); ``depth_bonus``: added to a candidate's heap key per level below depth 1;
    ``early_stop_margin``: candidates whose key is below ``lp_1 - log B - margin`` (``lp_1`` the best
    depth-1 log-prob) are skipped, except the rank-0 chain when ``keep_spine``; ``chain``: the first
    ``min(B, L)`` argmax tokens as a chain; ``order``: "pop" (the spec's numbering) or
    "breadth-first". All off: exactly :func:`~ddtree_conformance.spec.build_tree`. Scores in the
    returned tree are the plain cumulative log-probs (no bonus)."""
    if chain:
        return build_chain(draft_logits[: min(budget, draft_logits.shape[0])])
    vocab = draft_logits.shape[1]
    top_lp, top_ids = per_depth_topk(draft_logits, min(budget, vocab, max_children or budget))
    tokens, depths, parents, ranks, scores = policy_heap(
        top_lp.tolist(),
        top_ids.tolist(),
        budget,
        max_children=max_children,
        depth_bonus=depth_bonus,
        early_stop_margin=early_stop_margin,
        keep_spine=keep_spine,
    )
    tree = DraftTree(
        tokens=torch.tensor([-1] + tokens, dtype=torch.long),
        depths=torch.tensor([0] + depths, dtype=torch.long),
        parents=torch.tensor([-1] + parents, dtype=torch.long),
        ranks=torch.tensor([-1] + ranks, dtype=torch.long),
        scores=torch.tensor([0.0] + scores, dtype=torch.float64),
    ).to(draft_logits.device)
    return renumber_breadth_first(tree) if order == "breadth-first" else tree


def policy_heap(
    lp: list[list[float]],
    ids: list[list[int]],
    budget: int,
    *,
    max_children: int | None = None,
    depth_bonus: float = 0.0,
    early_stop_margin: float | None = None,
    keep_spine: bool = False,
) -> tuple[list, list, list, list, list]:
    """:func:`build_policy_tree`'s heap on per-depth top-k log-probs and ids (rank order, as
    :func:`~ddtree_conformance.spec.per_depth_topk` gives them; only the first ``max_children``
    ranks are used): ``(tokens, depths, parents, ranks, scores)`` of the nodes in pop order."""
    depth_limit = len(lp)
    k = min(budget, len(lp[0]), max_children or budget)
    threshold = -math.inf if early_stop_margin is None else lp[0][0] - math.log(max(budget, 1)) - early_stop_margin
    # Heap entry: (-key, rank tuple, parent index, depth, rank, parent score, parent key)
    heap = [(-lp[0][0], (0,), 0, 1, 0, 0.0, 0.0)]
    tokens, depths, parents, ranks, scores = [], [], [], [], []
    while heap and len(tokens) < budget:
        neg_key, rank_path, parent, depth, rank, parent_score, parent_key = heapq.heappop(heap)
        key, score = -neg_key, parent_score + lp[depth - 1][rank]
        if key < threshold and not (keep_spine and not any(rank_path)):
            continue
        node = len(tokens) + 1
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        ranks.append(rank)
        scores.append(score)
        if rank + 1 < k:
            sibling = parent_key + lp[depth - 1][rank + 1] + (depth_bonus if depth > 1 else 0.0)
            heapq.heappush(
                heap, (-sibling, rank_path[:-1] + (rank + 1,), parent, depth, rank + 1, parent_score, parent_key)
            )
        if depth < depth_limit:
            child = key + lp[depth][0] + depth_bonus
            heapq.heappush(heap, (-child, rank_path + (0,), node, depth + 1, 0, score, key))
    return tokens, depths, parents, ranks, scores


def renumber_breadth_first(tree: DraftTree) -> DraftTree:
    """The same tree numbered level by level, each level's nodes grouped by their parent's new index
    (in the old order within a group): the order SGLang PR #29907 gives its verify batch."""
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    new = {0: 0}
    order = [0]
    for depth in range(1, max(depths) + 1 if len(depths) > 1 else 1):
        level = [i for i in range(1, len(depths)) if depths[i] == depth]
        level.sort(key=lambda i: (new[parents[i]], i))
        for i in level:
            new[i] = len(order)
            order.append(i)
    index = torch.tensor(order, dtype=torch.long, device=tree.tokens.device)
    remapped = torch.tensor([-1] + [new[parents[i]] for i in order[1:]], dtype=torch.long, device=index.device)
    return DraftTree(
        tokens=tree.tokens[index],
        depths=tree.depths[index],
        parents=remapped,
        ranks=tree.ranks[index],
        scores=tree.scores[index],
    )


def _sglang_policy(budget: int, depth: int) -> dict:
    if budget <= depth:
        return {"chain": True}
    return {
        "max_children": sglang_width(budget, depth),
        "depth_bonus": 0.2,
        "early_stop_margin": 1.0,
        "keep_spine": True,
        "order": "breadth-first",
    }


#: Policies integrations have shipped, as :func:`build_policy_tree` arguments for (B, L): what an
#: engine that gives no traces is compared with (:func:`replay_known_policies`).
KNOWN_POLICIES: dict[str, Callable[[int, int], dict]] = {
    "chain": lambda budget, depth: {"chain": True},
    "width-cap": lambda budget, depth: {"max_children": sglang_width(budget, depth)},
    "depth-bonus": lambda budget, depth: {"depth_bonus": 0.2},
    "early-stop": lambda budget, depth: {"early_stop_margin": 1.0, "keep_spine": True},
    "sglang-pr-29907": _sglang_policy,
}


def distinct_policies(budget: int, depth: int) -> list[str]:
    """The known policies that differ at (B, L): at B <= L SGLang PR #29907's is the chain."""
    return [n for n in KNOWN_POLICIES if not (n == "sglang-pr-29907" and budget <= depth)]


#: The finding kinds (:data:`ddtree_conformance.tree_policy.FINDINGS`) each known policy stands for, for (B, L).
KNOWN_POLICY_KINDS: dict[str, Callable[[int, int], tuple[str, ...]]] = {
    "chain": lambda budget, depth: ("chain",),
    "width-cap": lambda budget, depth: ("width-cap",),
    "depth-bonus": lambda budget, depth: ("depth-bonus",),
    "early-stop": lambda budget, depth: ("early-stop",),
    "sglang-pr-29907": lambda budget, depth: (
        ("chain",) if budget <= depth else ("width-cap", "depth-bonus", "early-stop")
    ),
}
KNOWN_POLICY_TEXT = {
    "chain": "a chain of the first min(B, L) argmax tokens (SGLang PR #29907 at B <= L)",
    "width-cap": "children per node capped at min(max(B // L + 1, 2), 6) (SGLang PR #29907)",
    "depth-bonus": "scores raised by 0.2 per level (SGLang PR #29907)",
    "early-stop": "branch candidates below best - log B - 1 skipped (SGLang PR #29907)",
    "sglang-pr-29907": "SGLang PR #29907's trees (chain at B <= L; above L width cap, depth bonus 0.2, early stop)",
}


@dataclass
class PolicyFit:
    """The rebuild policy that reproduces the most differing rounds' node sets."""

    cap: int | None = None
    bonus: float = 0.0
    stop: tuple[float, bool] | None = None  # (margin, rank-0 chain kept)
    hits: int = 0
    sample: int = 0

    def describe(self) -> str:
        parts = [f"width cap {self.cap}"] if self.cap else []
        parts += [f"depth bonus {self.bonus:g}"] if self.bonus else []
        if self.stop is not None:
            parts.append(
                f"early stop at best - log B - {self.stop[0]:g}" + (" (rank-0 chain kept)" if self.stop[1] else "")
            )
        return ", ".join(parts) or "the spec's heap"

    def kwargs(self) -> dict:
        out = {"max_children": self.cap, "depth_bonus": self.bonus}
        if self.stop is not None:
            out.update(early_stop_margin=self.stop[0], keep_spine=self.stop[1])
        return out


def fit_policy(rounds: Sequence[tuple[torch.Tensor, set]], budget: int, cap: int | None) -> PolicyFit:
    """The rebuild policy reproducing the most of ``rounds`` (drafter logits [L, V] and the engine's
    node set as token paths): coordinate descent over (width cap, depth bonus, early stop) from the
    best of a few seeds (the spec's heap, and the known policies' settings). Each step keeps the value
    that reproduces more rounds exactly or, as many, misses fewer nodes; at the end every component
    the rounds do not need is switched off again."""
    sample = rounds[:MAX_FIT_ROUNDS]
    prepared = []
    for logits, paths in sample:
        lp, ids = per_depth_topk(logits, min(budget, logits.shape[1]))
        prepared.append((lp.tolist(), ids.tolist(), paths))

    def measure(fit: PolicyFit) -> tuple[int, int]:
        hits = missed = 0
        for lp, ids, target in prepared:
            tokens, _, parents, _, _ = policy_heap(lp, ids, budget, **fit.kwargs())
            got = set(node_paths([-1, *tokens], [-1, *parents]))
            hits += got == target
            missed += len(got ^ target)
        return hits, -missed

    dims = {
        "cap": [None, cap] if cap else [None],
        "bonus": [0.0, *BONUS_GRID],
        "stop": [None, *((m, s) for m in MARGIN_GRID for s in (False, True))],
    }
    # start from the best of the known policies' settings (one component, or SGLang PR #29907's three):
    # from the spec's heap alone, a descent can stop where no single component helps yet
    seeds = [
        PolicyFit(),
        PolicyFit(cap=cap),
        PolicyFit(bonus=0.2),
        PolicyFit(stop=(1.0, True)),
        PolicyFit(cap=cap, bonus=0.2, stop=(1.0, True)),
    ]
    best, value = max(((s, measure(s)) for s in seeds), key=lambda sv: sv[1])
    for _ in range(4):
        improved = False
        for dim, values in dims.items():
            for v in values:
                trial = PolicyFit(**{**best.__dict__, dim: v})
                got = measure(trial)
                if got > value:
                    best, value, improved = trial, got, True
        if not improved or value[0] == len(sample):
            break
    for dim, off in (("cap", None), ("bonus", 0.0), ("stop", None)):  # drop what the rounds do not need
        trial = PolicyFit(**{**best.__dict__, dim: off})
        got = measure(trial)
        if got[0] >= value[0]:
            best, value = trial, got
    best.hits, best.sample = value[0], len(sample)
    return best
