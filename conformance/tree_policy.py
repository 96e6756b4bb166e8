"""Tree policies: how an engine's draft trees differ from the spec's, named so that the engine team
knows what to change.

The spec's tree is the set of the B most probable prefixes of the drafter's L = block_size - 1
marginals (:mod:`ddtree_conformance.spec.tree`). Integrations have shipped other policies:

* vLLM PR #42910 ties the draft depth to the budget (``num_speculative_tokens`` is both), so it
  drafts B positions past the root where the drafter's block gives L;
* SGLang PR #29907 verifies a chain of B nodes when B <= L; above L it caps the children per node
  at ``min(max(B // L + 1, 2), 6)``, adds 0.2 per level to the scores of deeper nodes, skips branch
  candidates scoring below ``best - log B - 1`` (trees of fewer than B nodes) and numbers the nodes
  breadth-first.

Such an engine can be lossless and still not DDTree: it accepts what its own tree holds. The
findings here name each policy (:data:`FINDINGS`). Two kinds of evidence:

* traces (:func:`diagnose_traces`): node count, depth, children per node and numbering per round;
  where the trace carries the round's drafter logits, the engine's tree is compared with the spec's
  tree of those logits as a *set of prefixes*, and the policy that explains the difference is found
  by rebuilding the spec's heap with the measured width cap, a depth bonus and an early stop;
* acceptance only (:func:`acceptance_depth_findings`, :func:`replay_known_policies`): acceptance
  lengths beyond L + 1, or per-depth acceptance reported at more than L depths, show the depth; the
  other policies are named by running the reference engine under each known policy
  (:data:`KNOWN_POLICIES`) and finding the one whose acceptance the engine's equals.

Two freedoms are never findings: the same tree numbered in another order (a note in the table), and
a tree cut because the context (or, in the last round, the output) has no room for more (a note).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .policy_rounds import RoundView, TracedRound, child_counts, compare_round, level_widths, numbering, round_views
from .policy_trees import PolicyFit, fit_policy, node_paths

__all__ = [
    "FINDINGS",
    "PolicyDiagnosis",
    "PolicyFinding",
    "RoundView",
    "diagnose_traces",
    "policy_table",
    "round_views",
]

#: Finding kinds, in the order messages list them.
STRUCTURE_SHARE = 0.9  # differing rounds whose spec tree is wider than the engine's widest node, to name a width cap
FINDINGS = ("depth-beyond-block", "chain", "width-cap", "depth-bonus", "early-stop", "unexplained")
EXPLAINED_SHARE = 0.9  # a fitted policy must reproduce this share of the differing rounds


# ---------------------------------------------------------------------------------------------- diagnosis


@dataclass
class PolicyFinding:
    kind: str  # one of FINDINGS
    message: str


@dataclass
class PolicyDiagnosis:
    """How one run's trees differ from the spec's (no findings: they do not, or nothing shows it)."""

    run: str
    source: str  # what the evidence was
    findings: list[PolicyFinding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    row: dict = field(default_factory=dict)
    first: str | None = None  # the first differing round, described
    on_equal_prompts: bool = False  # a known policy matched on equal per-prompt acceptance (not a close tau)

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def message(self) -> str:
        return "; ".join(f.message for f in self.findings if f.message)


def _range(values: Sequence[int]) -> str:
    if not values:
        return "-"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi} (median {mid:g})"


def _level_widths(rows: Sequence[Sequence[int]], levels: int = 6) -> str:
    if not rows:
        return "-"
    depth = min(levels, max(len(w) for w in rows))
    med = [statistics.median([w[d] if d < len(w) else 0 for w in rows]) for d in range(depth)]
    more = " ..." if max(len(w) for w in rows) > levels else ""
    return "/".join(f"{m:g}" for m in med) + more


class _PolicyOutcome(NamedTuple):
    """What :func:`_policy_findings` names: findings, and notes on freedoms and the rebuild."""

    findings: list[PolicyFinding]
    notes: list[str]


def _policy_findings(
    rounds: list[TracedRound],
    differing: list[TracedRound],
    free: list[TracedRound],
    budget: int,
    horizon: int,
    has_logits: bool,
) -> _PolicyOutcome:
    """Chain, width cap, depth bonus and early stop (module doc)."""
    chain = _chain_finding(rounds, budget, horizon, has_logits)
    if chain is not None:
        return _PolicyOutcome([chain], [])
    notes: list[str] = []
    short = [r for r in free if r.nodes < min(budget, r.spec_nodes or budget)]
    if _cut_not_stopped(short):  # first nodes of the spec tree, but no one score threshold keeps them: cut
        notes.append(
            f"{len(short)}/{len(free)} rounds with room for B = {budget} verified the spec tree's first nodes "
            f"({_range([r.nodes for r in short])}), at cut points no single early-stop margin explains: a cut "
            "tree (a token budget shared by the batch?), not a policy; the acceptance check names such rounds"
        )
        short = []
    cap = max(r.max_children for r in rounds)
    wider = [r for r in rounds if (r.spec_max_children or 0) > cap]
    fit = PolicyFit()
    if differing and has_logits:
        rounds_in = [(r.view.logits[:horizon], set(node_paths(r.view.tokens, r.view.parents))) for r in differing]
        fit = fit_policy(rounds_in, budget, cap if wider else None)
    explained = fit.sample and fit.hits >= EXPLAINED_SHARE * fit.sample
    named = fit.hits >= 0.5 * fit.sample if fit.sample else False
    # the structure alone: never more than `cap` children where most differing rounds' spec trees need more
    # (a width cap whose candidates are scored another way than any rebuild here reproduces)
    narrower = bool(differing) and sum(r in wider for r in differing) >= STRUCTURE_SHARE * len(differing)
    structural = narrower and not (fit.cap and named and explained)
    found = [
        _width_cap_finding(rounds, wider, cap, fit, named, structural),
        _depth_bonus_finding(fit, named),
        _early_stop_finding(short, free, budget, fit, named),
    ]
    findings = [finding for finding in found if finding is not None]
    if fit.sample:
        notes.append(f"rebuilt with {fit.describe()}: {fit.hits}/{fit.sample} differing rounds reproduced")
    if differing and has_logits and not (explained or structural):
        findings.append(
            PolicyFinding(
                "unexplained",
                f"trees differ from the spec's in {len(differing)}/{len(rounds)} rounds "
                f"in a way no known policy explains ({fit.hits}/{fit.sample} "
                f"reproduced; first: {differing[0].view.label})",
            )
        )
    return _PolicyOutcome(findings, notes)


def _chain_finding(rounds: list[TracedRound], budget: int, horizon: int, has_logits: bool) -> PolicyFinding | None:
    """A chain verified where the spec's tree branches (SGLang's spine mode), or None."""
    chains = all(r.max_children <= 1 for r in rounds)
    spec_branches = [r for r in rounds if (r.spec_max_children or 0) > 1]
    if not (chains and (spec_branches or (budget > horizon and not has_logits))):
        return None
    shown = (
        f"in {len(spec_branches)}/{len(rounds)} rounds the spec's tree of the same drafter logits branches"
        if spec_branches
        else f"a B = {budget} tree cannot be a chain within L = {horizon}"
    )
    return PolicyFinding(
        "chain",
        f"verifies a chain where the spec branches ({shown}; a chain of min(B, L) "
        "nodes is SGLang PR #29907's spine mode)",
    )


def _width_cap_finding(
    rounds: list[TracedRound], wider: list[TracedRound], cap: int, fit: PolicyFit, named: bool, structural: bool
) -> PolicyFinding | None:
    """A cap on the children per node, fitted or read from the trees' structure alone, or None."""
    if not ((fit.cap and named) or structural):
        return None
    top = max(r.spec_max_children or 0 for r in rounds)
    how = "; named from the trees' structure, their exact trees not reproduced" if structural else ""
    return PolicyFinding(
        "width-cap",
        f"caps the children per node at {cap} (the spec's trees have up to {top}; "
        f"{len(wider)}/{len(rounds)} rounds need more than {cap}{how})",
    )


def _depth_bonus_finding(fit: PolicyFit, named: bool) -> PolicyFinding | None:
    """A fitted depth bonus, or None."""
    if not (fit.bonus and named):
        return None
    return PolicyFinding(
        "depth-bonus",
        f"raises deeper nodes' scores (a depth bonus of about {fit.bonus:g} per level reproduces the trees)",
    )


def _early_stop_finding(
    short: list[TracedRound], free: list[TracedRound], budget: int, fit: PolicyFit, named: bool
) -> PolicyFinding | None:
    """Trees stopped short of the budget with room for it (and a fitted stop margin), or None."""
    stops = fit.stop is not None and named
    if not (short or stops):
        return None
    shown = []
    if stops:
        shown.append(
            f"skips candidates scoring below best - log B - {fit.stop[0]:g}"
            + (", keeping the rank-0 chain" if fit.stop[1] else "")
        )
    shown.append(
        f"{len(short)}/{len(free)} rounds with room for B = {budget} verified fewer nodes"
        + (f" ({_range([r.nodes for r in short])})" if short else "")
    )
    return PolicyFinding("early-stop", f"stops early: {'; '.join(shown)}")


def _cut_not_stopped(short: list[TracedRound]) -> bool:
    """Whether the short rounds are cut trees rather than an early stop: every one is the spec tree's
    first nodes in pop order, and no margin ``m >= 0`` lies in every round's interval (an early stop
    keeps the nodes scoring at least ``lp_1 - log B - m``, one ``m`` for every round)."""
    if not short or any(r.stop_margins is None for r in short):
        return False
    low = max(max(r.stop_margins[0] for r in short), 0.0)
    high = min(r.stop_margins[1] for r in short)
    return low >= high


def diagnose_traces(
    run: str, views: Sequence[RoundView], mode: str, budget: int | None, block: int | None
) -> PolicyDiagnosis:
    """Findings for one (mode, budget) run's traced rounds (module doc)."""
    horizon = (block - 1) if block else None
    budget = budget or (horizon or 1)
    rounds = [
        TracedRound(
            v, len(v.tokens) - 1, max(v.depths) if v.depths else 0, max(child_counts(v.parents)), level_widths(v.depths)
        )
        for v in views
        if len(v.tokens) >= 1
    ]
    has_logits = bool(rounds) and all(r.view.logits is not None for r in rounds)
    source = "traces with drafter logits" if has_logits else "traces (no drafter logits)"
    if not rounds:
        return PolicyDiagnosis(run, source)
    if horizon is None:
        horizon = max(r.max_depth for r in rounds)
    rounds = [compare_round(r, mode, budget, horizon) for r in rounds]
    differing = [r for r in rounds if r.kind == "differs"]
    off_spec = [r for r in rounds if r.kind in ("differs", "subset")]
    free = [r for r in rounds if not r.view.last and (r.view.room is None or r.view.room >= budget)]
    # 1. depth beyond the drafter's block
    deep = _depth_finding(rounds, horizon, budget)
    if deep is not None:  # a deeper tree over other logits: its widths say nothing against the spec's; only its size
        short = [r for r in free if r.nodes < budget]
        outcome = _PolicyOutcome([deep, *([_short_finding(short, free, budget)] if short else [])], [])
    elif mode == "ddtree":
        outcome = _policy_findings(rounds, differing, free, budget, horizon, has_logits)
    elif off_spec:
        message = (
            f"chains differ from the spec's in {len(off_spec)}/{len(rounds)} rounds (first: {off_spec[0].view.label})"
        )
        outcome = _PolicyOutcome([PolicyFinding("unexplained", message)], [])
    else:
        outcome = _PolicyOutcome([], [])
    first = None
    if off_spec:
        r = off_spec[0]
        first = f"{r.view.label}: {r.nodes} nodes vs spec {r.spec_nodes}; first tokens {r.view.tokens[1:7]}"
    diag = PolicyDiagnosis(run, source, outcome.findings, [*outcome.notes, *_freedom_notes(rounds)], first=first)
    return dataclasses.replace(diag, row=_policy_row(diag, rounds, budget, horizon, has_logits, off_spec))


def _depth_finding(rounds: list[TracedRound], horizon: int, budget: int) -> PolicyFinding | None:
    """Trees (or drafter logits) deeper than the drafter's block gives, or None."""
    deepest = max(r.max_depth for r in rounds)
    rows_drafted = max((r.view.logits.shape[0] for r in rounds if r.view.logits is not None), default=horizon)
    if not (deepest > horizon or rows_drafted > horizon):
        return None
    drafted = max(deepest, rows_drafted)
    return PolicyFinding(
        "depth-beyond-block",
        f"drafts to depth {drafted} where the drafter's block "
        f"({horizon + 1}) gives L = {horizon} (draft depth tied to the "
        f"budget B = {budget}?)",
    )


def _short_finding(short: list[TracedRound], free: list[TracedRound], budget: int) -> PolicyFinding:
    """An early stop read from the trees' sizes alone (rounds with room for B verified fewer nodes)."""
    return PolicyFinding(
        "early-stop",
        f"stops early: {len(short)}/{len(free)} rounds with room for B = "
        f"{budget} verified fewer nodes ({_range([r.nodes for r in short])})",
    )


def _freedom_notes(rounds: list[TracedRound]) -> list[str]:
    """Notes on the freedoms the rounds took: another node order, ties broken otherwise, trees cut to the room."""
    notes = []
    renumbered = [r for r in rounds if r.kind == "renumbered"]
    if renumbered:
        kinds = sorted({r.numbering for r in renumbered})
        notes.append(
            f"node order: {len(renumbered)}/{len(rounds)} rounds hold the spec's tree numbered "
            f"{' or '.join(kinds)} (a freedom, not a finding)"
        )
    ties = sum(r.kind == "tie" for r in rounds)
    if ties:
        notes.append(f"{ties} rounds broke exact score ties otherwise (a freedom)")
    cut = [r for r in rounds if r.kind == "cut"]
    if cut:
        notes.append(f"{len(cut)} rounds cut to the room left (context limit or the output's end; a freedom)")
    return notes


def _policy_row(
    diag: PolicyDiagnosis,
    rounds: list[TracedRound],
    budget: int,
    horizon: int,
    has_logits: bool,
    off_spec: list[TracedRound],
) -> dict:
    """The run's row of the tree-policy table (:func:`policy_table`)."""
    order = (
        "the spec's (pop order)"
        if all(r.kind in ("spec", "tie", "cut") for r in rounds if r.kind != "untested") and has_logits
        else _numbering_summary(rounds, has_logits)
    )
    spec_children = [r.spec_max_children for r in rounds if r.spec_max_children is not None]
    return {
        "run": diag.run,
        "evidence": diag.source,
        "rounds": len(rounds),
        "nodes per round": f"{_range([r.nodes for r in rounds])} of B={budget}",
        "depth": f"{max(r.max_depth for r in rounds)} (L = {horizon})",
        "children per node": f"{max(r.max_children for r in rounds)}"
        + (f" (spec {max(spec_children)})" if spec_children else ""),
        "width per level": _level_widths([r.widths for r in rounds])
        + (f" (spec {_level_widths([r.spec_widths for r in rounds if r.spec_widths])})" if spec_children else ""),
        "node order": order,
        "rounds differing": f"{len(off_spec)}/{len(rounds)}" if has_logits else "-",
        "verdict": ", ".join(diag.kinds) or "the spec's trees",
    }


def _numbering_summary(rounds: Sequence[TracedRound], has_logits: bool) -> str:
    kinds = {r.numbering or numbering(r.view.depths) for r in rounds if r.kind not in ("spec", "tie")}
    if not has_logits:
        return "breadth-first" if kinds == {"breadth-first"} else "not compared (no drafter logits)"
    return " / ".join(sorted(kinds)) if kinds else "the spec's (pop order)"


# ---------------------------------------------------------------------------------------------- table


def policy_table(diagnoses: Sequence[PolicyDiagnosis]) -> dict:
    """The report's tree-policy table (``details["tables"]`` entry) for ``diagnoses``."""
    rows = [d.row for d in diagnoses if d.row]
    columns = list(rows[0]) if rows else []
    notes = [f"{d.run}: {n}" for d in diagnoses for n in d.notes]
    return {
        "title": "Tree policy",
        "columns": columns,
        "rows": [[str(r.get(c, "")) for c in columns] for r in rows],
        "notes": notes,
    }
