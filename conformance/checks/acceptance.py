"""Check 3: acceptance against the fp32 reference, round by round (doc §4 metrics).

Engines with per-round acceptance lengths (which the integrity rules have already held to the
output, :mod:`ddtree_conformance.integrity`): every round is replayed with the fp32
reference on the engine's own context and compared (:mod:`ddtree_conformance.replay`); a round may
differ only by a reproducible near-tie, and drafter near-tie rounds are capped. Where the engine's
output and lengths equal the float32 golden file's, the golden acceptance *is* that replay, so no
reference runs (:mod:`.acceptance_rounds`). This catches lossless-but-slow bugs (wrong drafter
positions, wrong feedback rows, RoPE mismatch, capped budgets) in every dtype.

Engines that report only aggregates: per-prompt mean tau (and acceptance at depths 1-4) is compared
with the fp32 reference's on the engine's own outputs (the reference paces the rounds itself along
them), by equivalence over the prompts; batch-pooled aggregates within a fixed tolerance
(:mod:`.acceptance_aggregates`).

A failing ddtree verdict is then named with the tree policy that explains it, where one does.
"""

from __future__ import annotations

from functools import partial

from ddtree_conformance.adapters.interface import RequestResult

from ..acceptance_policy import acceptance_depth_findings, diagnose_acceptance
from ..policy_matching import PolicyReference, match_on_rounds, replay_known_policies
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import rules_for
from ..tree_policy import policy_table
from .acceptance_aggregates import NO_ACCEPTANCE, reports_aggregates
from .acceptance_rounds import RoundsUnderTest
from .result import CheckResult
from .run_acceptance import judge_run_acceptance
from .spec_rounds import SortedRounds, diagnose_sorted, sort_rounds
from .traced_runs import traced_run as shared_traced_run

__all__ = ["check_acceptance"]

POLICY_PROMPTS = 10  # prompts an untraced run is compared on under the known tree policies


def check_acceptance(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("acceptance")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    requests = session.requests()
    labels = [p.id for p in session.prompts]
    results = session.run(mode, budget)
    unusable = _unusable(session, mode, labels, results)
    if unusable:  # nothing to diagnose a tree policy from
        return CheckResult.failed(name, unusable)
    if not caps.per_round(mode) and not reports_aggregates(results):
        return CheckResult.skipped(name, NO_ACCEPTANCE)
    verdict = _judge(session, name, Run(mode, budget), RoundsUnderTest(labels, requests, results))
    return _named_policy(session, mode, budget, results, verdict)


def _unusable(session: SuiteSession, mode: str, labels: list[str], results: list[RequestResult]) -> str | None:
    """Why the engine's results (of the prompts ``labels`` name) cannot be judged at all: an error, or
    per-round acceptance promised and missing; None when they can."""
    for label, result in zip(labels, results):
        if result.error:
            return f"engine error on {label}: {result.error.splitlines()[0]}"
    if session.capabilities.per_round(mode):
        missing = [label for label, r in zip(labels, results) if r.acceptance_lengths is None]
        if missing:
            return (
                f"engine promises per-round acceptance in mode {mode} but returned none "
                f"for {missing[0]} ({len(missing)}/{len(labels)} prompts)"
            )
    return None


def _judge(session: SuiteSession, name: str, run: Run, rounds: RoundsUnderTest) -> CheckResult:
    """Round by round where the engine reports per-round lengths, else on its aggregates."""
    caps = session.capabilities
    per_round = caps.per_round(run.mode)  # every result holds its lengths (_unusable)
    traced_run = partial(_traced_prompt, session, run) if per_round and caps.traced(run.mode) else None
    return judge_run_acceptance(session, name, run, rounds, per_round=per_round, traced_run=traced_run)


def _traced_prompt(session: SuiteSession, run: Run, index: int) -> RequestResult:
    """Prompt ``index`` from the tree checks' traced run (memoised) when it holds it, else that prompt
    rerun alone with traces."""
    indices, traced = shared_traced_run(session, run.mode, run.budget)
    if index in indices:
        return traced[indices.index(index)]
    return session.run(
        run.mode,
        run.budget,
        trace=True,
        trace_draft_logits=session.capabilities.draft_logits,
        requests=[session.requests()[index]],
    )[0]


def _named_policy(
    session: SuiteSession, mode: str, budget: int | None, results: list[RequestResult], verdict: CheckResult
) -> CheckResult:
    """A failing ddtree verdict with the tree policy that explains it, where one does
    (:mod:`ddtree_conformance.tree_policy`): from the tree checks' traced run where the engine traces,
    else from its acceptance (:mod:`ddtree_conformance.acceptance_policy`)."""
    caps = session.capabilities
    block = session.engines.info(session.engines.engine).limits.block_size  # the pair's, as integrity reads it
    deeper = [] if caps.traced(mode) else acceptance_depth_findings(results, block, budget)
    # aggregates that cannot vouch either way: a known policy that the engine's per-prompt acceptance
    # equals (not one merely close in tau) decides it, as a failure naming the policy
    undecided = verdict.status == "skip" and verdict.details.get("equivalence") == "undecided"
    if not (deeper or (mode == "ddtree" and (verdict.status == "fail" or undecided))):
        stated = {r.engine_settings.get("draft_depth") for r in results} - {None}
        if verdict.status == "pass" and len(stated) == 1:  # the depth the engine says it drafts, within the block
            return verdict.model_copy(
                update={
                    "message": f"{verdict.message}; the engine drafts {stated.pop()} "
                    f"positions past the root (L = {(block or 1) - 1})"
                }
            )
        return verdict  # a skip stays one, unless acceptance shows the depth (which needs no band)
    label = Run(mode, budget).label
    if caps.traced(mode):  # the rounds the spec's freedoms do not explain, as the tree-structure check reads them
        indices, traced = shared_traced_run(session, mode, budget)
        found = sum(
            (
                sort_rounds(session, mode, budget, block, session.prompts[i], r)
                for i, r in zip(indices, traced)
                if not r.error
            ),
            SortedRounds(),
        )
        _, diagnosis = diagnose_sorted(label, found, mode, budget, block)
    else:
        diagnosis = diagnose_acceptance(
            label,
            results,
            budget or 1,
            block,
            _policy_matcher(session, budget, results, block) if mode == "ddtree" else None,
        )
    details = dict(
        verdict.details, tables=[policy_table([diagnosis])], tree_policy=diagnosis.kinds, notes=diagnosis.notes
    )
    if not diagnosis.findings or (undecided and not deeper and not diagnosis.on_equal_prompts):
        return verdict.model_copy(update={"details": details})
    return CheckResult.failed(
        verdict.check,
        f"the engine's trees are not the spec's ({diagnosis.source}): {diagnosis.message()}; {verdict.message}",
        **details,
    )


def _policy_matcher(session: SuiteSession, budget: int, results: list[RequestResult], block: int | None):
    """How an untraced run is compared with the reference under the known tree policies: on its own
    rounds where it reports per-round lengths (one replay, :data:`POLICY_PROMPTS` prompts), else by
    running the reference under each policy (per-request aggregates on :data:`POLICY_PROMPTS` prompts;
    batch-pooled ones need the whole batch)."""
    s = session.settings
    requests = session.requests()
    # the oracle's replays run on one rank, whatever TP size the engine under test ran at
    config = session.config("ddtree", budget).model_copy(update={"tensor_parallel_size": 1})
    per_request = all(r.rounds is not None for r in results)
    count = min(len(requests), POLICY_PROMPTS) if per_request else len(requests)

    def match():
        if all(r.acceptance_lengths is not None for r in results):
            reference = session.engines.reference_for(s.model_dir, s.drafter_dir)
            rules = rules_for(session.settings)
            return match_on_rounds(reference, requests[:count], results[:count], config, block, rules=rules)
        engine = PolicyReference(str(s.model_dir), str(s.drafter_dir))
        try:
            return replay_known_policies(engine, requests[:count], config, results[:count], block)
        finally:
            engine.close()

    return match
