"""A traced round as the tree-policy diagnosis reads it (:mod:`ddtree_conformance.tree_policy`), and its
comparison with the spec's tree of the round's own drafter logits (:func:`compare_round`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ddtree_conformance.adapters.interface import RoundTrace
from ddtree_conformance.spec import DraftTree, build_chain, build_tree
from ddtree_conformance.spec.freedoms import tied

from .noise import log_prob_slack
from .policy_trees import node_paths

__all__ = ["RoundView", "TracedRound", "child_counts", "compare_round", "level_widths", "numbering", "round_views"]


@dataclass
class RoundView:
    """One traced round as the diagnosis reads it."""

    label: str  # "<prompt> round <r>"
    start: int
    tokens: list[int]  # node tokens, root first
    parents: list[int]
    depths: list[int]
    logits: torch.Tensor | None  # the engine's drafter logits [rows, V], when traced
    last: bool = False  # the request's last round (the output's end may have cut its tree)
    room: int | None = None  # nodes the context has room for in this round (None: no limit known)


def round_views(label: str, traces: Sequence[RoundTrace], max_context: int | None) -> list[RoundView]:
    """:class:`RoundView` of every trace of one request."""
    views = []
    for r, t in enumerate(traces):
        logits = None if t.draft_logits is None else torch.tensor(t.draft_logits, dtype=torch.float32)
        room = None if not max_context else max(0, max_context - t.start - 1)
        views.append(
            RoundView(
                f"{label} round {r}",
                t.start,
                list(t.tree_tokens),
                list(t.parents),
                list(t.depths),
                logits,
                last=r == len(traces) - 1,
                room=room,
            )
        )
    return views


def _tree_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    return node_paths(tree.tokens.tolist(), tree.parents.tolist())


def child_counts(parents: Sequence[int]) -> list[int]:
    counts = [0] * len(parents)
    for p in parents[1:]:
        counts[p] += 1
    return counts


def level_widths(depths: Sequence[int]) -> list[int]:
    top = max(depths) if depths else 0
    return [sum(1 for d in depths if d == level) for level in range(1, top + 1)]


def numbering(depths: Sequence[int]) -> str:
    return "breadth-first" if all(a <= b for a, b in itertools.pairwise(depths[1:])) else "in another order"


@dataclass
class TracedRound:
    view: RoundView
    nodes: int
    max_depth: int
    max_children: int
    widths: list[int]
    spec_nodes: int | None = None
    spec_max_children: int | None = None
    spec_widths: list[int] | None = None
    kind: str = "untested"  # spec | renumbered | tie | cut | subset | differs | untested
    numbering: str = ""
    # a "subset" round that is the first n nodes of the spec tree in pop order: the early-stop margins
    # m that keep exactly those (score >= lp_1 - log B - m), as [low, high); None: not such a prefix
    stop_margins: tuple[float, float] | None = None


def _score_paths(logits: torch.Tensor, paths: Sequence[tuple[int, ...]]) -> list[float]:
    lp = torch.log_softmax(logits.float(), dim=-1).double().tolist()
    out = []
    for path in paths:
        total = 0.0
        for depth, token in enumerate(path):
            total += lp[depth][token] if depth < len(lp) and 0 <= token < len(lp[depth]) else -math.inf
        out.append(total)
    return out


def compare_round(rnd: TracedRound, mode: str, budget: int, horizon: int) -> TracedRound:
    """``rnd`` classified against the spec's tree of its own drafter logits (first L rows): a new
    :class:`TracedRound` with the spec tree's sizes and the round's kind (``rnd`` itself where it holds no
    drafter logits)."""
    view = rnd.view
    if view.logits is None:
        return rnd
    logits = view.logits[:horizon]
    spec = build_chain(logits) if mode == "dflash" else build_tree(logits, budget)
    sized = dataclasses.replace(
        rnd,
        spec_nodes=spec.num_nodes,
        spec_max_children=max(child_counts(spec.parents.tolist())),
        spec_widths=level_widths(spec.depths.tolist()),
    )
    return dataclasses.replace(sized, **_classification(view, logits, spec, budget))


def _classification(view: RoundView, logits: torch.Tensor, spec: DraftTree, budget: int) -> dict:
    """How a traced round's tree stands to the spec's (``kind``, with ``numbering`` for a renumbered tree
    and ``stop_margins`` for a subset that is the spec's first nodes in pop order)."""
    spec_paths = _tree_paths(spec)
    mine = node_paths(view.tokens, view.parents)
    if mine[1:] == spec_paths[1:]:
        return {"kind": "spec"}
    if set(mine) == set(spec_paths) and len(mine) == len(spec_paths):
        return {"kind": "renumbered", "numbering": numbering(view.depths)}
    if len(mine) == len(spec_paths):  # the same size, differing only by nodes tied at the boundary
        only = sorted(set(mine) ^ set(spec_paths))
        low = int(torch.argmin(spec.scores))
        boundary, depth = float(spec.scores[low]), int(spec.depths[low])
        slack = log_prob_slack(logits, budget)  # ties up to the rounding of the log-softmax (noise model)
        if all(tied(s, boundary, len(p), depth, slack) for s, p in zip(_score_paths(logits, only), only)):
            return {"kind": "tie"}
    if set(mine) < set(spec_paths):  # a prefix-closed part of the spec's tree: cut by room, or stopped early
        exempt = view.last or (view.room is not None and view.room < budget)
        found = {"kind": "cut" if exempt else "subset"}
        kept = len(mine) - 1
        if set(mine[1:]) == set(spec_paths[1 : kept + 1]):  # the spec's first nodes in pop order
            scores = spec.scores[1:].tolist()
            best = float(torch.log_softmax(logits[0].float(), dim=-1).max()) - math.log(max(budget, 1))
            low = best - scores[kept - 1] if kept else -math.inf
            found["stop_margins"] = (low, best - scores[kept] if kept < len(scores) else math.inf)
        return found
    return {"kind": "differs"}
