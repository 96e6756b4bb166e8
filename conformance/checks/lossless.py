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

from ..run import Run
from ..session import SuiteSession
from .output_comparison import GreedyCase, judge_greedy
from .result import CheckResult

__all__ = ["check_lossless", "settings_note", "speculative_cases"]


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
    cases += [
        GreedyCase(f"{label} (plain)", prompt_ids, p.output_ids)
        for label, prompt_ids, p in zip(labels, prompts, plain)
        if not p.error
    ]
    return cases


def settings_note(plain, spec, label: str) -> str:
    """What the engine says its plain and speculative runs ran under (``engine_settings``): the
    attention backend both share, or every setting they do not (then the comparison is not like with
    like). Empty when the engine says nothing."""

    def first(results) -> dict:
        return next((r.engine_settings for r in results if r.engine_settings), {})

    mine, base = first(spec), first(plain)
    shared = sorted(set(mine) & set(base) - {"draft_depth"})
    differ = [k for k in shared if mine[k] != base[k]]
    if differ:
        return "; engine settings differ from plain: " + ", ".join(
            f"{k} {base[k]} (plain) vs {mine[k]} ({label})" for k in differ
        )
    if "attention_backend" in shared:
        return f"; plain and {label} both ran with attention backend {mine['attention_backend']}"
    return ""


def check_lossless(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    run = Run(mode, budget)
    name = run.check_id("lossless")
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    plain, spec = session.plain(), session.run(mode, budget)
    verdict = judge_greedy(session, speculative_cases(session, spec, plain), what="plain")
    note = settings_note(plain, spec, run.label)
    if verdict.problem:
        return CheckResult.failed(name, f"not lossless: {verdict.problem}{note}", **verdict.details)
    return CheckResult.passed(name, verdict.summary + note, **verdict.details)
