"""Lossless reference engines whose draft trees follow another policy than the spec's: one per policy
read in the DDTree integrations (vLLM PR #42910 at 0aa15d61, SGLang PR #29907 at 93e9850e /
6c52d319). Each one must pass every lossless check and fail DDTree conformance with a message naming
its policy (tests/test_tree_policies.py).

* :class:`DepthTiedToBudget` (vLLM PR): the drafter runs a block of B + 1 tokens, so the tree may
  reach depth B where the drafter's block gives L = block_size - 1;
* :class:`ChainAtOrBelowBlock` (SGLang PR, "spine mode"): at B <= L a chain of the first B argmax
  tokens;
* :class:`WidthCapped`, :class:`DepthBonus`, :class:`EarlyStop` (SGLang PR, full-tree mode): at
  most ``min(max(B // L + 1, 2), 6)`` children per node; 0.2 added per level to the heap keys of
  deeper candidates; branch candidates below ``best - log B - 1`` skipped;
* :class:`SglangPr29907Trees`: all of SGLang's at once, numbered breadth-first.

Their heap is written here, from the PRs' described behaviour, apart from the suite's own
(:mod:`ddtree_conformance.policy_trees`), so that a test of the diagnosis is not the suite agreeing
with itself. :class:`BreadthFirstNumbering` is a *correct* engine: the spec's tree, numbered
breadth-first (a freedom; it must pass, with a note in the tree-policy table).
"""

from __future__ import annotations

import copy
import functools
import heapq
import math

import torch

from ddtree_conformance.adapters.reference.dflash import DFlashConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.metrics import mean_tau, per_position_acceptance
from ddtree_conformance.spec import DraftTree, build_tree

__all__ = [
    "TREE_POLICY_ENGINES",
    "BreadthFirstNumbering",
    "ChainAtOrBelowBlock",
    "DepthBonus",
    "DepthTiedToBudget",
    "EarlyStop",
    "SglangPr29907Trees",
    "WidthCapped",
]


def _tree(tokens, depths, parents, ranks, scores, device) -> DraftTree:
    def column(values, first, dtype):
        return torch.tensor([first, *values], dtype=dtype, device=device)

    return DraftTree(
        column(tokens, -1, torch.long),
        column(depths, 0, torch.long),
        column(parents, -1, torch.long),
        column(ranks, -1, torch.long),
        column(scores, 0.0, torch.float64),
    )


def _breadth_first(tree: DraftTree) -> DraftTree:
    """Renumber level by level, each level grouped by the parent's new number."""
    depths, parents = tree.depths.tolist(), tree.parents.tolist()
    position = {0: 0}
    order = [0]
    for level in range(1, max(depths) + 1 if len(depths) > 1 else 1):
        nodes = sorted(
            (i for i in range(1, len(depths)) if depths[i] == level), key=lambda i: (position[parents[i]], i)
        )
        for i in nodes:
            position[i] = len(order)
            order.append(i)
    pick = torch.tensor(order, dtype=torch.long, device=tree.tokens.device)
    new_parents = torch.tensor(
        [-1] + [position[parents[i]] for i in order[1:]], dtype=torch.long, device=tree.tokens.device
    )
    return DraftTree(tree.tokens[pick], tree.depths[pick], new_parents, tree.ranks[pick], tree.scores[pick])


def pr_heap_tree(
    logits: torch.Tensor, budget: int, *, width: int | None = None, bonus: float = 0.0, margin: float | None = None
) -> DraftTree:
    """A best-first heap as SGLang PR #29907 builds it above L: ``width`` candidate ranks per depth,
    ``bonus`` added to each child's key, branch candidates below ``best - log B - margin`` skipped
    (the rank-0 chain never)."""
    depth_limit, vocab = logits.shape
    k = min(budget, vocab, width or budget)
    values, ids = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
    lp, tok = values.double().tolist(), ids.tolist()
    stop = -math.inf if margin is None else lp[0][0] - math.log(max(budget, 1)) - margin
    heap = [(-lp[0][0], (0,), 0, 1, 0, lp[0][0], lp[0][0])]  # (-key, ranks, parent, depth, rank, key, score)
    tokens, depths, parents, ranks, scores = [], [], [], [], []
    while heap and len(tokens) < budget:
        _, path, parent, depth, rank, key, score = heapq.heappop(heap)
        if any(path) and key < stop:
            continue
        node = len(tokens) + 1
        tokens.append(tok[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        ranks.append(rank)
        scores.append(score)
        if rank + 1 < k:
            step = lp[depth - 1][rank + 1] - lp[depth - 1][rank]
            heapq.heappush(
                heap, (-(key + step), path[:-1] + (rank + 1,), parent, depth, rank + 1, key + step, score + step)
            )
        if depth < depth_limit:
            child, child_score = key + lp[depth][0] + bonus, score + lp[depth][0]
            heapq.heappush(heap, (-child, path + (0,), node, depth + 1, 0, child, child_score))
    return _tree(tokens, depths, parents, ranks, scores, logits.device)


def spine(logits: torch.Tensor, budget: int) -> DraftTree:
    """The first ``budget`` argmax tokens as a chain (SGLang PR #29907 at B <= L)."""
    n = min(budget, logits.shape[0])
    values, ids = torch.log_softmax(logits[:n].float(), dim=-1).max(dim=-1)
    scores = torch.cumsum(values.double(), 0).tolist()
    return _tree(ids.tolist(), list(range(1, n + 1)), list(range(n)), [0] * n, scores, logits.device)


class _PolicyEngine(ReferenceEngine):
    """The reference engine with its tree builder replaced (mode ddtree only)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._build = self.policy_tree

    def policy_tree(self, logits: torch.Tensor, budget: int) -> DraftTree:
        raise NotImplementedError


def _deep_draft_logits(
    pair, size: int, root: int, start: int, context: torch.Tensor, context_start: int, cache, block_offset: int = 0
) -> torch.Tensor:
    """The drafter's logits for a block of ``size`` tokens (the root and ``size - 1`` mask tokens)."""
    drafter = pair.drafter
    block = torch.full((1, size), drafter.config.mask_token_id, dtype=torch.long, device=pair.device)
    block[0, 0] = root
    embeds = pair.target.get_input_embeddings()(block)
    positions = torch.arange(context_start, start + size, device=pair.device)
    positions[start - context_start :] += block_offset
    hidden = drafter(embeds, context.unsqueeze(0), positions.unsqueeze(0), cache)
    return pair.target.get_output_embeddings()(hidden[0, 1:])


class DepthTiedToBudget(ReferenceEngine):
    """vLLM PR #42910: ``num_speculative_tokens`` is both the budget and the DFlash depth, so the
    drafter runs a block of B + 1 and the tree (the spec's heap over those B positions) may reach depth B."""

    name = "policy-depth-tied-to-budget"

    def _speculative(self, pair, request, config):
        if config.mode != "ddtree":
            return super()._speculative(pair, request, config)
        deep = copy.copy(pair)  # shares the models and the captured features; only draft_logits differs
        deep.draft_logits = functools.partial(_deep_draft_logits, pair, config.budget + 1)
        return super()._speculative(deep, request, config)


class ChainAtOrBelowBlock(_PolicyEngine):
    """SGLang PR #29907 at B <= L: a chain of the first B argmax tokens (the spec's tree above L)."""

    name = "policy-chain-at-or-below-block"

    def policy_tree(self, logits, budget):
        return spine(logits, budget) if budget <= logits.shape[0] else build_tree(logits, budget)


class WidthCapped(_PolicyEngine):
    """SGLang PR #29907: at most ``min(max(B // L + 1, 2), 6)`` children per node."""

    name = "policy-width-capped"

    def policy_tree(self, logits, budget):
        return pr_heap_tree(logits, budget, width=min(max(budget // logits.shape[0] + 1, 2), 6))


class DepthBonus(_PolicyEngine):
    """SGLang PR #29907: 0.2 added to the heap key per level below depth 1."""

    name = "policy-depth-bonus"

    def policy_tree(self, logits, budget):
        return pr_heap_tree(logits, budget, bonus=0.2)


class EarlyStop(_PolicyEngine):
    """SGLang PR #29907: branch candidates below ``best - log B - 1`` are skipped (trees of fewer than B nodes)."""

    name = "policy-early-stop"

    def policy_tree(self, logits, budget):
        return pr_heap_tree(logits, budget, margin=1.0)


class SglangPr29907Trees(_PolicyEngine):
    """SGLang PR #29907's trees: a chain at B <= L; above L its width cap, depth bonus and early stop,
    numbered breadth-first."""

    name = "policy-sglang-pr-29907"

    def policy_tree(self, logits, budget):
        depth = logits.shape[0]
        if budget <= depth:
            return spine(logits, budget)
        width = min(max(budget // depth + 1, 2), 6)
        return _breadth_first(pr_heap_tree(logits, budget, width=width, bonus=0.2, margin=1.0))


class BreadthFirstNumbering(_PolicyEngine):
    """Correct: the spec's tree, numbered breadth-first (the verify batch's order is free)."""

    name = "freedom-breadth-first-numbering"

    def policy_tree(self, logits, budget):
        return _breadth_first(build_tree(logits, budget))


#: label -> (engine, the finding kinds its DDTree verdict must name)
TREE_POLICY_ENGINES = {
    "depth tied to the budget (vLLM PR #42910)": (DepthTiedToBudget, ("depth-beyond-block",)),
    "chain at B <= L (SGLang PR #29907)": (ChainAtOrBelowBlock, ("chain",)),
    "width cap (SGLang PR #29907)": (WidthCapped, ("width-cap",)),
    "depth bonus 0.2 (SGLang PR #29907)": (DepthBonus, ("depth-bonus",)),
    "early stop (SGLang PR #29907)": (EarlyStop, ("early-stop",)),
    "all of SGLang PR #29907": (SglangPr29907Trees, ("width-cap", "depth-bonus", "early-stop")),
}


def counters_only(engine_class: type[ReferenceEngine], *, pooled: bool = False) -> type[ReferenceEngine]:
    """``engine_class`` reporting what the PRs' engines report: no traces, no per-round lengths; per
    request (SGLang's ``meta_info``) or pooled over each batch (vLLM's counters, ``pooled``) the mean
    acceptance and acceptance per drafted position, as many positions as the engine drafts, and that
    depth in ``engine_settings`` (as the suite's vLLM adapter reports it)."""

    class CountersOnly(engine_class):
        name = f"{engine_class.name}-counters{'-pooled' if pooled else ''}"

        def capabilities(self):
            return (
                super()
                .capabilities()
                .model_copy(
                    update={"traces": False, "per_round_acceptance": False, "draft_logits": False, "traced_modes": None}
                )
            )

        def generate(self, requests, config):
            results = super().generate(requests, config.model_copy(update={"trace": False}))
            if config.mode == "plain":
                return results
            deep = isinstance(self, DepthTiedToBudget) and config.mode == "ddtree"
            horizon = config.budget if deep else DFlashConfig.from_dir(self.drafter_dir).block_size - 1
            lengths = [r.acceptance_lengths or [] for r in results]
            out = []
            for r, own in zip(results, lengths):
                mine = lengths if pooled else [own]
                out.append(
                    r.model_copy(
                        update={
                            "acceptance_lengths": None,
                            "aggregate_only": True,
                            "traces": None,
                            "engine_settings": {"draft_depth": horizon},
                            "rounds": None if pooled else len(own),
                            "mean_acceptance": mean_tau(mine),
                            "per_position_acceptance": per_position_acceptance(mine, horizon),
                        }
                    )
                )
            return out

    return CountersOnly


def per_round_only(engine_class: type[ReferenceEngine]) -> type[ReferenceEngine]:
    """``engine_class`` with per-round acceptance lengths but no traces."""

    class PerRoundOnly(engine_class):
        name = f"{engine_class.name}-per-round"

        def capabilities(self):
            return (
                super().capabilities().model_copy(update={"traces": False, "draft_logits": False, "traced_modes": None})
            )

        def generate(self, requests, config):
            results = super().generate(requests, config.model_copy(update={"trace": False}))
            return [r.model_copy(update={"traces": None}) for r in results]

    return PerRoundOnly
