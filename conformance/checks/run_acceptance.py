"""A run's acceptance judged against the fp32 reference, whatever the engine reports: round by round where
it reports per-round lengths (:mod:`.acceptance_rounds`), else on its aggregates (:mod:`.acceptance_aggregates`),
in float32 against the pair's golden file first where it holds every prompt of the set (:func:`golden_results`:
the reference's recorded rounds, read instead of rerunning the reference).

The acceptance check judges the plan's run with it. The checks that run the engine under another setting
(CUDA graphs on, another tensor-parallel size) judge that run the same way in low precision, instead of
holding its tau to the other run's: the two runs round differently and their outputs part at near ties, so
their taus are measured on different texts, and the band of their per-prompt difference is wide (on the
fixture pair in bf16, 20 prompts, B = 16, eight correct rounding engines against the reference's own run:
half-widths 0.1-0.45 at tau 4.1, never excluding 0, nor at 60 prompts), wide enough
to hide a deficit that the replay sees round by round. So one noise model and one set of margins decide
every acceptance verdict.
"""

from __future__ import annotations

from collections.abc import Callable

from ddtree_conformance.adapters.interface import RequestResult

from ..golden_files import golden_lengths, golden_path
from ..oracle import oracle_for
from ..run import Run
from ..session import SuiteSession
from .acceptance_aggregates import (
    NO_ACCEPTANCE,
    ReferenceAcceptance,
    judge_aggregates,
    paced_references,
    reports_aggregates,
)
from .acceptance_rounds import RoundsUnderTest, judge_per_round
from .result import CheckResult

__all__ = ["golden_results", "judge_run_acceptance"]


def judge_run_acceptance(
    session: SuiteSession,
    name: str,
    run: Run,
    rounds: RoundsUnderTest,
    *,
    per_round: bool,
    traced_run: Callable[[int], RequestResult] | None = None,
    engine=None,
) -> CheckResult:
    """``rounds`` judged round by round (``per_round``: every result holds its lengths) against the fp32
    replay on the engine's own contexts, else on their aggregates against the fp32 reference paced on the
    engine's outputs (the golden file's rounds first, in float32, where the requests are the plan's).
    ``traced_run`` and ``engine``: how a differing round is explained (:func:`.judge_per_round`)."""
    if per_round:
        return judge_per_round(session, name, run, rounds, traced_run=traced_run, engine=engine)
    results = rounds.results
    if not reports_aggregates(results):
        return CheckResult.skipped(name, NO_ACCEPTANCE)
    exact = session.settings.dtype == "float32"
    golden = golden_results(session, run) if list(rounds.requests) == session.requests() else None
    if golden is None:
        return judge_aggregates(name, results, paced_references(session, run, results, rounds.requests), exact=exact)
    recorded = ReferenceAcceptance(*golden)
    verdict = judge_aggregates(name, results, [recorded], exact=exact)
    if verdict.status == "pass" or _outputs_differ(results, recorded):
        return verdict  # outputs other than the golden file's in float32: lossy, the golden rounds are the yardstick
    # the other ways a correct engine may count its rounds near the output's end, paced by the live
    # reference, but only where that reference is the golden file's: a drafter that is not the pair's
    # would pace its own rounds and pass
    spec, *freedoms = paced_references(session, run, results, rounds.requests)
    disagree = _disagreeing(spec, recorded)
    if disagree:
        return verdict.model_copy(
            update={
                "message": f"{verdict.message} (the live reference's rounds differ from the golden file's on "
                f"{disagree} prompts, so the freedoms near the output's end are not weighed)"
            }
        )
    return judge_aggregates(name, results, [recorded, *freedoms], exact=exact)


def golden_results(session: SuiteSession, run: Run) -> tuple[list[RequestResult], str] | None:
    """float32 runs of a pair with a golden file holding every prompt of the set: the golden acceptance,
    as results (the held-out prompts of the run, which no golden file holds, from the live reference).
    It is the reference run on the pair's own files, so a drafter that is not the pair's (wrong layer
    ids in its config, other weights) shows against it, where a live reference would share the fault."""
    s = session.settings
    golden = oracle_for(session).float32_golden(s.max_new_tokens) if s.dtype == "float32" else None
    if golden is None:
        return None
    key = run.golden_key
    out = []
    for prompt in session.inputs.bundled:
        record = golden.records.get(prompt.id)
        if record is None or record.prompt_ids != prompt.prompt_ids or key not in record.acceptance:
            return None
        out.append(
            RequestResult(
                output_ids=record.output_ids[: s.max_new_tokens],
                finish_reason="length",
                acceptance_lengths=golden_lengths(record.acceptance[key], s.max_new_tokens),
            )
        )
    if session.inputs.held_out:
        reference = session.engines.reference_for(s.model_dir, s.drafter_dir)
        out += session.run(run.mode, run.budget, engine=reference, requests=session.requests()[len(out) :])
    path = golden_path(s.golden_dir, s.pair_name, s.prompt_set, "float32")
    held_out = f" and the live reference on {len(session.inputs.held_out)} held-out" if session.inputs.held_out else ""
    return out, f"golden ({path.name}{held_out})"


def _outputs_differ(results: list[RequestResult], recorded: ReferenceAcceptance) -> bool:
    """Whether any output is not the golden file's (the freedoms near the output's end keep every output)."""
    return any(list(r.output_ids) != list(g.output_ids) for r, g in zip(results, recorded.results))


def _disagreeing(paced: ReferenceAcceptance, recorded: ReferenceAcceptance) -> int:
    """Prompts whose output equals the golden file's and whose paced rounds do not."""
    return sum(
        1
        for p, g in zip(paced.results, recorded.results)
        if list(p.output_ids) == list(g.output_ids) and p.acceptance_lengths != g.acceptance_lengths
    )
