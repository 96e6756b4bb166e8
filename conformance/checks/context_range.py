"""Check: context-range, every context length of the target's window decoded, plain and speculative.

Kernels switch code paths with the context length (split-KV and paged attention at powers of two and
page multiples, cache blocks, RoPE), so a fault can show in one band of lengths only. This check
decodes across the whole window (``capabilities().max_context``, held to the target's
``max_position_embeddings``) in every run: :func:`ddtree_conformance.context_lengths.context_plan`
draws, from the run seed, requests whose prompt and output lengths tile every context length from 1
to the window's last (on the fixture pair's 1024-token window: 1023 lengths in 13-23 requests), each
kernel-switching point crossed inside one request. The prompts are fresh text of the prompt set's
kind (:meth:`ddtree_conformance.held_out.PromptSource.long_ids`), never the bundled prompts.

Plain decoding and DFlash decode every request. The DDTree budgets of the plan share them
(:func:`share`): request ``k`` goes to budget ``(k + r) mod n`` of the plan's ``n`` budgets, ``r``
drawn from the run seed, so together they decode every length, each a third of them in the default
plan's three budgets, interleaved across the window (a verify kernel at large budgets is the dearest
decoding on CPU; a band wider than ``n`` requests reaches every budget).

Plain decoding runs each request alone (one request per engine call, memoised across the session's
modes). The check's mode decodes this share's requests together in one engine call and nothing else
(a batch of long contexts, as a busy server holds; the busy-batch check's batch holds short ones), so a
kernel path a batch takes at long contexts is decoded as well as a lone request's. Its outputs are
judged like the lossless check's (equal to plain in float32, every token scored against the fp32
target on its own path in every dtype, so a fault shared by plain and speculative decoding fails too),
each failure naming the request and its company. For engines with per-round acceptance every round of
the call is replayed with the fp32 reference like the acceptance check's. Where those rounds part from
the replay beyond the noise on shorter rounds only (set those aside and the rest passes), each request
runs again alone and the alone rounds are judged instead: a scheduler may drop a request's drafts when
its step's token budget runs out beside long prefills (vLLM does: the step verifies the root alone, a
round of length 1), which says nothing about the context length and leaves the output unchanged. It
never makes a round longer: a call whose rounds are longer than the replay's (or commit other tokens)
fails as it is, so an engine cannot flip a near tie in company and claim longer rounds after it. The
report then counts the call's rounds against the alone ones (``details["company_rounds"]``: per round
that starts at the same output offset in both runs, before the token where a request's two outputs
part). The result
says which context lengths were decoded (``details["context_lengths"]``: ranges, histogram, switching
points crossed; the report shows them), and a failure names the request's context range.

A ``max_context`` above the target's window fails; one below it runs at the claim and names the
untested positions (:mod:`ddtree_conformance.model_limits`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ddtree_conformance.adapters.interface import Request

from ..context_lengths import ContextPlan, context_plan, coverage, describe
from ..model_limits import context_claim
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import rules_for
from .acceptance_rounds import JudgedRounds, ReplayAgainst, RoundsUnderTest, replay_per_round, summarise_rounds
from .output_comparison import GreedyCase, first_divergence, judge_greedy
from .result import CheckResult

__all__ = [
    "CONTEXT_KEY",
    "COMPANY_KEY",
    "CompanyRounds",
    "context_requests",
    "share",
    "aligned_differences",
    "coverage_table",
    "check_context_range",
]

CONTEXT_KEY = "context_lengths"  # check details: what the run decoded (context_lengths.coverage)
COMPANY_KEY = "company_rounds"  # check details: CompanyRounds.details() (engines with per-round acceptance)


def context_requests(session: SuiteSession, limit: int) -> tuple[ContextPlan, list[Request], list[str]]:
    """The plan for a window of ``limit`` tokens drawn from the run seed, its requests (fresh prompts of
    the plan's lengths) and the labels naming them; the same for every mode of a session, so plain
    decoding runs them once."""
    plan = context_plan(limit, session.settings.run_seed or 0, budget=session.settings.context_tokens)
    prompts = session.inputs.fresh_ids(tuple(g.prompt_length for g in plan.segments))
    requests = [Request(prompt_ids=ids, max_new_tokens=g.new_tokens) for ids, g in zip(prompts, plan.segments)]
    labels = [f"contexts {g.first}..{g.last} (prompt of {g.prompt_length} tokens)" for g in plan.segments]
    return plan, requests, labels


def share(session: SuiteSession, mode: str, budget: int | None, count: int) -> list[int]:
    """Which of the ``count`` requests the run of ``mode`` at ``budget`` decodes (module doc)."""
    budgets = sorted(set(session.settings.budgets)) if mode == "ddtree" else []
    if budget not in budgets or len(budgets) == 1:
        return list(range(count))
    n = len(budgets)
    rotation = random.Random(f"context-share:{session.settings.run_seed or 0}").randrange(n)
    mine = budgets.index(budget)
    return [k for k in range(count) if (k + rotation) % n == mine]


def _alone(session: SuiteSession, mode: str, budget: int | None, request: Request):
    """``request``'s result in ``mode`` at ``budget``, from an engine call holding it alone (module doc)."""
    return session.run(mode, budget, requests=[request], together=True)[0]


def _in_company(session: SuiteSession, mode: str, budget: int | None, requests: list[Request]):
    """The results of ``requests`` from one engine call holding all of them (module doc)."""
    return session.run(mode, budget, requests=requests, together=True)


def aligned_differences(alone: list[int], company: list[int], upto: int | None = None) -> list[int]:
    """Per round that starts at the same output offset in both runs of one request, before output token
    ``upto`` (where the two outputs part; None: they are equal), the company run's length minus the
    alone run's."""
    starts, offset = {}, 0
    for length in alone:
        starts[offset] = length
        offset += length
    out, offset = [], 0
    for length in company:
        if offset in starts and (upto is None or offset < upto):
            out.append(length - starts[offset])
        offset += length
    return out


@dataclass(frozen=True)
class CompanyRounds:
    """The company run's rounds against the alone run's (module doc), for the report: rounds aligned by
    output offset, how many were longer and shorter in company, and their net tokens. No verdict: the
    company rounds passed against the fp32 replay with their shorter rounds set aside."""

    aligned: int
    longer: int
    shorter: int
    tokens: int

    def summary(self) -> str:
        return (
            f"in one call, {self.aligned} rounds aligned with the alone run's: {self.longer} longer, "
            f"{self.shorter} shorter ({self.tokens:+d} tokens)"
        )

    def details(self) -> dict:
        return {"aligned": self.aligned, "longer": self.longer, "shorter": self.shorter, "tokens": self.tokens}


def _company_rounds(alone, company) -> CompanyRounds:
    """The company run's rounds against the alone run's, where the outputs part (near ties of a batch's
    rounding) the rounds before it."""
    differences = [
        d
        for a, c in zip(alone, company)
        if a.acceptance_lengths and c.acceptance_lengths
        for d in aligned_differences(
            a.acceptance_lengths, c.acceptance_lengths, first_divergence(a.output_ids, c.output_ids)
        )
    ]
    return CompanyRounds(
        len(differences), sum(d > 0 for d in differences), sum(d < 0 for d in differences), sum(differences)
    )


def coverage_table(cover: dict, mode: str) -> dict:
    """The report's table (a ``details["tables"]`` entry): context lengths decoded per histogram bin,
    and the switching points crossed there."""
    rows = []
    for lo, hi, count in cover["histogram"]:
        crossed = [s for s in cover["crossed"] if lo <= s < hi]
        missed = [s for s in cover["missed"] if lo <= s < hi]
        shown = ", ".join(map(str, crossed[:10])) + (", ..." if len(crossed) > 10 else "")
        rows.append(
            [
                f"{max(lo, 1)}..{hi - 1}",
                f"{count} of {hi - max(lo, 1)}",
                f"{len(crossed)} ({shown})" if crossed else "0",
                ", ".join(map(str, missed[:10])) or "-",
            ]
        )
    return {
        "title": f"Context lengths decoded ({mode})",
        "columns": ["context lengths", "decoded", "switching points crossed", "missed"],
        "rows": rows,
        "notes": [
            f"prompt lengths: {', '.join(map(str, cover['prompt_lengths']))}",
            "a switching point s (a power of two or a multiple of 16, 32, 64, 128 or 256 tokens) is crossed "
            "when one request decodes at s - 1, s and s + 1",
        ],
    }


def _cases(labels, requests, plain, spec) -> list[GreedyCase]:
    """What the outputs are judged on: each request of the one call against plain, and plain itself
    (scored against the fp32 target, so a fault plain shares fails too)."""
    others = f" (in one call with the other {len(requests) - 1})" if len(requests) > 1 else ""
    return [
        *(
            GreedyCase(label + others, r.prompt_ids, s.output_ids, p.output_ids, error=s.error or p.error)
            for label, r, p, s in zip(labels, requests, plain, spec)
        ),
        *(
            GreedyCase(f"{label} (plain)", r.prompt_ids, p.output_ids)
            for label, r, p in zip(labels, requests, plain)
            if not p.error
        ),
    ]


def _judge_rounds(session, name, run: Run, labels, requests, results) -> tuple[CheckResult, JudgedRounds]:
    """``results``' rounds replayed with the fp32 reference (never the golden file: fresh prompts), and the verdict."""
    judged = replay_per_round(session, run, RoundsUnderTest(labels, requests, results), ReplayAgainst(use_golden=False))
    return summarise_rounds(name, run, judged, rules_for(session.settings), results), judged


def _acceptance(session, name, run: Run, labels, requests, company) -> tuple[CheckResult, CompanyRounds | None]:
    """Per-round acceptance across the window (module doc): the company run's rounds against the fp32
    replay; where they part beyond the noise on shorter rounds only, each request alone, and the company
    rounds against those. Rounds longer than the replay (or other tokens) in company are never excused
    by running alone: the outputs of the two runs may part at a near tie, and the company rounds after
    it would be held against nothing."""
    first, judged = _judge_rounds(session, name, run, labels, requests, company)
    if first.status != "fail" or len(requests) == 1:
        return first, None
    longer = JudgedRounds(judged.run.longer_side(), judged.from_golden, judged.top2)
    unexcused = summarise_rounds(name, run, longer, rules_for(session.settings), company)
    if unexcused.status == "fail":
        why = "with its shorter rounds set aside (a scheduler that drops drafts makes rounds shorter, never longer)"
        return CheckResult.failed(name, f"in one call, {why}: {unexcused.message}", **unexcused.details), None
    alone = [_alone(session, run.mode, run.budget, r) for r in requests]
    if any(r.error or r.acceptance_lengths is None for r in alone):
        return first, None
    replay, _ = _judge_rounds(session, name, run, labels, requests, alone)
    return replay, _company_rounds(alone, company)


def check_context_range(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("context-range")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    claim = context_claim(session)
    if claim.problem:
        return CheckResult.failed(name, claim.problem, **claim.details())
    limit = claim.limit
    untested = f"; {claim.note()}" if claim.untested else ""
    if not limit:
        return CheckResult(
            check=name,
            status="skip",
            details=claim.details(),
            message="engine states no context limit (capabilities().max_context)" + untested,
        )
    plan, every, every_label = context_requests(session, limit)
    if not every:
        return CheckResult(
            check=name,
            status="skip",
            details=claim.details(),
            message=f"context limit {limit} leaves no room to decode" + untested,
        )
    mine = share(session, mode, budget, len(every))
    requests, labels = [every[k] for k in mine], [every_label[k] for k in mine]
    plain = [_alone(session, "plain", None, r) for r in requests]  # memoised: once per session and request
    spec = _in_company(session, mode, budget, requests)
    decoded = [(len(r.prompt_ids), len(s.output_ids)) for r, s in zip(requests, spec) if not s.error]
    cover = coverage(limit, decoded, plan.points)
    details = {CONTEXT_KEY: cover, "tables": [coverage_table(cover, Run(mode, budget).label)], **claim.details()}
    verdict = judge_greedy(session, _cases(labels, requests, plain, spec), what="plain")
    if verdict.problem:
        return CheckResult.failed(
            name, f"not lossless across the context window: {verdict.problem}", **verdict.details, **details
        )
    shared = "" if len(mine) == len(every) else f" (this budget's share of {len(every)})"
    summary = f"{len(requests)} requests{shared} in one call, window {limit}: {describe(cover)}: {verdict.summary}"
    if not caps.per_round(mode):
        return CheckResult.passed(
            name, summary + f"; engine reports no per-round acceptance{untested}", **verdict.details, **details
        )
    if any(r.acceptance_lengths is None for r in spec):
        return CheckResult.failed(
            name, f"engine promises per-round acceptance in mode {mode} but returned none", **details
        )
    replay, rounds = _acceptance(session, name, Run(mode, budget), labels, requests, spec)
    if replay.status == "fail":
        return CheckResult.failed(name, f"across the context window: {replay.message}", **replay.details, **details)
    # the noise model's tests on the rounds (tau, drafter lean) travel with a pass, as the acceptance check's do
    details = {**details, **{k: replay.details[k] for k in ("tau_test", "drafter_lean") if k in replay.details}}
    if rounds is None:
        return CheckResult.passed(name, f"{summary}; {replay.message}{untested}", **verdict.details, **details)
    details = {**details, COMPANY_KEY: rounds.details()}
    message = f"{summary}; in one call the rounds part from the replay, alone {replay.message}; {rounds.summary()}"
    return CheckResult.passed(name, message + untested, **verdict.details, **details)
