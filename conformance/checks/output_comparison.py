"""Judging greedy outputs (lossless, golden, edges, context range, busy batch, tensor parallel).

Every output is scored, in every dtype, position by position against the fp32 target teacher-forced
on the output's own path (:mod:`ddtree_conformance.token_scoring`): the independent oracle, so an
engine wrong in plain and speculative decoding alike fails on any prompt set, with or without golden
records. Each output is scored once per process, however many checks read it.

float32: an output must also equal its expected output (the engine's plain output, the golden
file's, the same request run alone) token for token, and every token must be the fp32 target's
argmax on its path (within :data:`~ddtree_conformance.noise.FP32_TIE`, the fp32
arithmetic of two correct implementations).
bfloat16/float16: an output need not equal its expected output, but each token must be within the
calibrated near-tie bound of the fp32 argmax on the output's own path, and the excused positions
must stay under the ceiling. How many outputs equal their expected one is reported.

Failure messages name the first differing position and show both sides around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..token_scoring import ScoredRun, rules_for, score_run, window

__all__ = ["GreedyCase", "GreedyVerdict", "first_divergence", "mismatch", "judge_greedy"]


@dataclass
class GreedyCase:
    label: str
    prompt_ids: Sequence[int]
    got: Sequence[int]
    expected: Sequence[int] | None = None  # None: scored only (low precision), never compared
    error: str | None = None


@dataclass
class GreedyVerdict:
    problem: str | None
    summary: str
    details: dict
    differing: list[str]
    engine_error: bool = False  # the problem is a case's engine error, not its outputs


def first_divergence(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """Index of the first differing output token; a length difference counts at the shorter end."""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def mismatch(expected: Sequence[int], got: Sequence[int], what: str = "expected") -> str:
    """``at output token i: <what> ... [a] ... | got ... [b] ...`` (both sides around the difference)."""
    pos = first_divergence(expected, got)
    if pos is None:
        return "outputs are equal"
    length = "" if len(expected) == len(got) else f" (lengths {len(expected)} vs {len(got)})"
    return f"at output token {pos}: {what} {window(list(expected), pos)} | got {window(list(got), pos)}{length}"


def judge_greedy(
    session,
    cases: list[GreedyCase],
    *,
    logits_fn=None,
    rules=None,
    what: str = "expected",
    compare_low_precision: bool = False,
) -> GreedyVerdict:
    """Judge ``cases`` by the session's dtype (module doc). ``compare_low_precision`` also demands
    equality in bf16/fp16 (where low precision cannot excuse a difference)."""
    rules = rules or rules_for(session.settings)
    for case in cases:
        if case.error:
            message = f"engine error on {case.label}: {case.error.splitlines()[0][:300]}"
            return GreedyVerdict(message, "", {}, [], engine_error=True)
        if not case.got:  # max_new_tokens >= 1, and the prefill token comes before any stop
            return GreedyVerdict(f"{case.label}: empty output without an error", "", {}, [case.label])
    if not cases:
        return GreedyVerdict("no output to judge: the check compared nothing", "", {"compared": 0}, [])
    compared = [c for c in cases if c.expected is not None]
    differing = [c for c in compared if list(c.got) != list(c.expected)]
    labels = [c.label for c in differing]
    if rules.exact or compare_low_precision:
        details = {"compared": len(compared), "differing": labels}
        if differing:
            first = differing[0]
            return GreedyVerdict(
                f"{len(differing)}/{len(compared)} outputs differ; first: {first.label} diverges "
                f"{mismatch(first.expected, first.got, what)}",
                "",
                details,
                labels,
            )
    scored: ScoredRun = score_run(session, [(c.label, c.prompt_ids, c.got) for c in cases], logits_fn, rules)
    details = {"scoring": scored.details(), "compared": len(compared), "differing": labels}
    if scored.positions == 0:
        return GreedyVerdict("the engine returned no output tokens to score", "", details, [])
    problem = scored.problem()
    if rules.exact or compare_low_precision:
        if problem:
            equal = f"{len(compared)}/{len(compared)} outputs equal {what}, but " if compared else ""
            return GreedyVerdict(f"{equal}{problem}", "", details, labels)
        return GreedyVerdict(None, f"{len(compared)} match, 0 near-tie (exact); {scored.summary()}", details, [])
    equal = f"{len(compared) - len(differing)}/{len(compared)} equal {what}; " if compared else ""
    return GreedyVerdict(problem, f"{equal}{scored.summary()}", details, labels)
