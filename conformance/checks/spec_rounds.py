"""Traced rounds sorted by whether the spec allows their trees, and the tree policy that explains the
rest: what the tree-structure check judges and the acceptance check names a failure by (a judge below
the families, so that both read one rule).

A round's tree is allowed when it is the spec's tree for the round's own drafter logits up to the
freedoms of :mod:`ddtree_conformance.spec.freedoms` (numbering, ties up to the rounding of the float32
log-softmax, the output's and the context's end). The rounds no freedom explains go to the tree-policy
diagnosis (:mod:`ddtree_conformance.tree_policy`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ddtree_conformance.adapters.interface import RoundTrace
from ddtree_conformance.spec import tree_problem

from ..noise import log_prob_slack
from ..session import SuiteSession
from ..tree_policy import PolicyDiagnosis, RoundView, diagnose_traces, round_views

__all__ = ["SortedRounds", "diagnose_sorted", "off_path_rounds", "sort_rounds", "spec_tree_problem"]


def off_path_rounds(traces) -> int:
    """Rounds, other than a request's last, whose accepted path is not the verify batch's first rows: the
    runs that continue after a branch other than the first one (KV, feedback and state must follow it)."""
    return sum(1 for t in traces[:-1] if t.accepted != list(range(1, len(t.accepted) + 1)))


def spec_tree_problem(
    trace: RoundTrace,
    mode: str,
    budget: int | None,
    *,
    depth_limit: int | None = None,
    room: int | None = None,
    context_room: int | None = None,
) -> str | None:
    """Whether the traced tree is one the spec allows for the round's own drafter logits: the spec tree
    up to node numbering, ties (within :func:`~ddtree_conformance.noise.log_prob_slack`: another
    log-softmax kernel, another device), and nodes the output's or the context's end leaves out."""
    logits = torch.tensor(trace.draft_logits, dtype=torch.float32)
    problem = tree_problem(
        trace.tree_tokens,
        trace.parents,
        trace.depths,
        logits,
        mode,
        budget or 1,
        depth_limit=depth_limit,
        room=room,
        context_room=context_room,
        slack=log_prob_slack(logits, budget or 1),
    )
    return None if problem is None else f"tree differs from the spec's tree for its own drafter logits: {problem}"


def _context_room(max_context: int | None, prompt, result, trace: RoundTrace) -> int | None:
    """Nodes the context still had room for in this round, where the engine's output fits its own stated
    context (an engine cannot excuse cut trees by understating ``max_context``)."""
    fits = max_context and len(prompt.prompt_ids) + len(result.output_ids) <= max_context
    return max_context - 2 - trace.start if fits else None


@dataclass(frozen=True)
class SortedRounds:
    """Traced rounds sorted by whether the spec's freedoms explain their trees, with the counts."""

    views: tuple[RoundView, ...] = ()  # rounds the freedoms do not explain
    allowed: tuple[RoundView, ...] = ()  # the spec's tree, up to its freedoms (spec.freedoms)
    off_path: int = 0
    rounds: int = 0
    spec_rounds: int = 0  # rounds that carry drafter logits

    def __add__(self, other: SortedRounds) -> SortedRounds:
        return SortedRounds(
            self.views + other.views,
            self.allowed + other.allowed,
            self.off_path + other.off_path,
            self.rounds + other.rounds,
            self.spec_rounds + other.spec_rounds,
        )


def sort_rounds(
    session: SuiteSession, mode: str, budget: int | None, block: int | None, prompt, result
) -> SortedRounds:
    """One prompt's traced rounds, each compared with the spec's tree for its own drafter logits."""
    caps = session.capabilities
    traces = result.traces or []
    views, allowed, spec_rounds = [], [], 0
    for trace, view in zip(traces, round_views(prompt.id, traces, caps.max_context)):
        if trace.draft_logits is None:
            views.append(view)
            continue
        spec_rounds += 1
        emitted = trace.start - len(prompt.prompt_ids) + 1  # output tokens before this round
        problem = spec_tree_problem(
            trace,
            mode,
            budget,
            depth_limit=block - 1 if block else None,
            room=session.settings.max_new_tokens - emitted,
            context_room=_context_room(caps.max_context, prompt, result, trace),
        )
        (allowed if problem is None else views).append(view)
    return SortedRounds(tuple(views), tuple(allowed), off_path_rounds(traces), len(views) + len(allowed), spec_rounds)


def diagnose_sorted(
    label: str, found: SortedRounds, mode: str, budget: int | None, block: int | None
) -> tuple[PolicyDiagnosis, PolicyDiagnosis]:
    """``(whole, diagnosis)``: every round's diagnosis, for the table and its notes (node order, ties,
    cuts), and the findings' diagnosis, only from the rounds the spec's freedoms do not explain (with no
    findings: the whole, its verdict the spec's trees)."""
    allowed, views = list(found.allowed), list(found.views)
    whole = diagnose_traces(label, allowed + views, mode, budget, block)
    diagnosis = whole if not allowed else diagnose_traces(label, views, mode, budget, block) if views else None
    if diagnosis is not None and diagnosis.findings:
        return whole, diagnosis
    row = {**whole.row, "verdict": "the spec's trees (up to its freedoms)"} if whole.row else whole.row
    whole = dataclasses.replace(whole, findings=[], first=None, row=row)
    return whole, whole
