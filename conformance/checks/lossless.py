"""Check 1: greedy lossless against the same engine's plain decoding."""

from __future__ import annotations

from collections import Counter

from ..session import SuiteSession
from .output_comparison import compare_outputs
from .result import CheckResult

__all__ = ["check_lossless", "summarise_verdicts"]


def summarise_verdicts(name: str, verdicts, session: SuiteSession) -> CheckResult:
    counts = Counter(v.kind for v in verdicts)
    bad = [v for v in verdicts if v.kind in ("divergence", "error")]
    details = {"counts": dict(counts), "verdicts": [v.model_dump() for v in verdicts]}
    if not bad:
        rule = "exact" if session.exact else f"near-tie bound {session.near_tie_bound:.3g}"
        return CheckResult.passed(name, f"{counts['match']} match, {counts['near-tie']} near-tie ({rule})", **details)
    first = bad[0]
    if first.kind == "error":
        return CheckResult.failed(name, f"engine error on {first.prompt}: {first.note}", **details)
    where = f"prompt {first.prompt} diverges at output token {first.position}"
    what = f"expected {first.expected}, got {first.got}"
    gap = "" if first.gap is None else f", target top-2 gap {first.gap:.4f} > bound {session.near_tie_bound:.3g}"
    return CheckResult.failed(
        name, f"not lossless: {len(bad)}/{len(verdicts)} prompts differ from plain; {where} ({what}{gap})", **details
    )


def check_lossless(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = f"lossless[{mode}{'' if budget is None else f',B={budget}'}]"
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    plain, spec = session.plain(), session.run(mode, budget)
    verdicts = []
    for prompt, p, s in zip(session.prompts, plain, spec):
        if p.error:
            verdicts.append(compare_outputs(prompt.id, prompt.prompt_ids, [], [], exact=True, got_error="plain: " + p.error))
            continue
        verdicts.append(
            compare_outputs(
                prompt.id,
                prompt.prompt_ids,
                p.output_ids,
                s.output_ids,
                exact=session.exact,
                near_tie_bound=session.near_tie_bound,
                scorer=None if session.exact else session.scorer,
                got_error=s.error,
            )
        )
    return summarise_verdicts(name, verdicts, session)
