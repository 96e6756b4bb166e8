"""Check 1: greedy lossless.

Every token of the speculative output, and of the plain output, is scored against the fp32 target
teacher-forced on its own path (:mod:`ddtree_conformance.token_scoring`), in every dtype: an engine
wrong in plain and speculative decoding alike fails here on any prompt set.
float32: the speculative output also equals the same engine's plain output token for token, and
every token is the fp32 target's argmax.
bfloat16/float16: the speculative output need not equal the plain one, but no token may fall
outside the near-tie bound and the excused positions stay under the ceiling.
"""

from __future__ import annotations

from ..session import SuiteSession
from .output_comparison import GreedyCase, judge_greedy
from ..run import Run
from .result import CheckResult

__all__ = ["check_lossless", "speculative_cases"]


def speculative_cases(session: SuiteSession, spec, plain, labels=None, prompts=None) -> list[GreedyCase]:
    """One case per prompt (speculative output vs plain), and the plain outputs scored on their own."""
    labels = labels or [p.id for p in session.prompts]
    prompts = prompts or [p.prompt_ids for p in session.prompts]
    cases = []
    for label, prompt_ids, p, s in zip(labels, prompts, plain, spec):
        if p.error:
            cases.append(GreedyCase(label, prompt_ids, [], error="plain: " + p.error))
            continue
        cases.append(GreedyCase(label, prompt_ids, s.output_ids, p.output_ids, error=s.error))
    cases += [GreedyCase(f"{label} (plain)", prompt_ids, p.output_ids)
              for label, prompt_ids, p in zip(labels, prompts, plain) if not p.error]
    return cases


def check_lossless(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("lossless")
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    plain, spec = session.plain(), session.run(mode, budget)
    verdict = judge_greedy(session, speculative_cases(session, spec, plain), what="plain")
    if verdict.problem:
        return CheckResult.failed(name, f"not lossless: {verdict.problem}", **verdict.details)
    return CheckResult.passed(name, verdict.summary, **verdict.details)
