"""Per-round acceptance (the acceptance check's path for engines with per-round lengths): every
round of greedy results judged against the fp32 reference on the engine's own context.

One direction: :func:`gather_rounds` gathers each prompt's evidence (the float32 golden file's
rounds, :func:`golden_rounds`, where they equal the engine's, else a live replay) with the fp32 scores
of its output; :func:`judge_prompts` judges the token after the prefill and every round
(:mod:`ddtree_conformance.replay`, reading the engine's own traces only for a round that differs);
:func:`summarise_rounds` gives the verdict, the excused rounds held to the noise model's limits.
Prompts stream through one at a time, so a replay's drafter logits are held for one prompt only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ddtree_conformance.adapters.interface import Request, RequestResult
from ddtree_conformance.adapters.reference.replay import replay_result

from ..golden_files import golden_lengths
from ..noise import DRAFTER_TOP, NoiseModel
from ..oracle import oracle_for
from ..replay import ReplayRun, judge_rounds, prefill_verdict
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import PositionScores, rules_for, score_output, target_logits
from .result import CheckResult

__all__ = [
    "JudgedRounds",
    "ReplayAgainst",
    "RoundsUnderTest",
    "golden_rounds",
    "judge_per_round",
    "replay_per_round",
    "summarise_rounds",
]


@dataclass(frozen=True)
class RoundsUnderTest:
    """Greedy results whose rounds are judged, with their requests and the labels naming them in messages.
    Their acceptance lengths passed the integrity rules (every ``session.run`` validates)."""

    labels: list[str]
    requests: list[Request]
    results: list[RequestResult]


@dataclass(frozen=True)
class ReplayAgainst:
    """What the rounds are judged against: by default the pair's fp32 reference and its float32 golden
    file; else another target and drafter (``model_dir``, ``drafter_dir``) with their target logits."""

    model_dir: str | None = None
    drafter_dir: str | None = None
    logits_fn: Callable | None = None
    use_golden: bool = True


@dataclass(frozen=True)
class PromptRounds:
    """One prompt's evidence: golden rounds equal to the engine's (``replayed`` None), or a live replay
    with the fp32 scores of its output. ``top2``: the output's fp32 top-2 gaps (none where no scores were
    computed: golden rounds in float32, where the noise model does not read them)."""

    index: int
    label: str
    result: RequestResult
    lengths: list[int]
    top2: list[float]
    max_new_tokens: int | None = None
    replayed: list | None = None  # ReplayRound list
    scores: PositionScores | None = None


@dataclass
class JudgedRounds:
    """Every prompt's rounds judged: the round verdicts, and what the ceilings and the message need."""

    run: ReplayRun = field(default_factory=ReplayRun)
    from_golden: int = 0
    top2: list[float] = field(default_factory=list)


class EngineTraces:
    """The engine's per-round traces of a prompt, from a traced rerun (``traced_run(index)``) that
    reproduces the run's output and lengths; None where none does (its trees and logits would describe
    another run) or the run already fails (another rerun would change no verdict)."""

    def __init__(self, traced_run: Callable[[int], RequestResult] | None, results: list[RequestResult]) -> None:
        self.traced_run, self.results, self.traced = traced_run, results, {}

    def of(self, index: int, run: ReplayRun):
        if self.traced_run is None:
            return None
        if index not in self.traced:
            if run.differs or run.cut:
                return None
            self.traced[index] = self.traced_run(index)
        mine, base = self.traced[index], self.results[index]
        if mine.error or (mine.output_ids, mine.acceptance_lengths) != (base.output_ids, base.acceptance_lengths):
            return None
        return mine.traces


def replay_per_round(
    session: SuiteSession,
    run: Run,
    rounds: RoundsUnderTest,
    against: ReplayAgainst = ReplayAgainst(),
    *,
    traced_run=None,
    engine=None,
) -> JudgedRounds:
    """Replay every round of ``rounds`` with the fp32 reference and classify them (module doc); the
    verdict is :func:`summarise_rounds`'s.

    A round that differs is explained with the engine's own traces (its tree, its drafter logits)
    from a traced rerun that reproduces the prompt's output and lengths: ``traced_run(index)`` gives
    the traced result of ``rounds.requests[index]``; by default, where the engine can trace in the
    run's mode, that request is rerun alone with traces on ``engine`` (the one that produced the
    results; default: the session's). Only prompts with a round to explain are rerun."""
    rules = rules_for(session.settings)
    caps = session.capabilities
    if traced_run is None and caps.traced(run.mode):

        def traced_run(index: int) -> RequestResult:
            return session.run(
                run.mode,
                run.budget,
                trace=True,
                trace_draft_logits=caps.draft_logits,
                requests=[rounds.requests[index]],
                engine=engine,
            )[0]

    evidence = gather_rounds(session, run, rounds, against, rules)
    return judge_prompts(evidence, rules, run, EngineTraces(traced_run, rounds.results), caps.max_context)


def judge_per_round(
    session: SuiteSession,
    name: str,
    run: Run,
    rounds: RoundsUnderTest,
    against: ReplayAgainst = ReplayAgainst(),
    *,
    traced_run=None,
    engine=None,
) -> CheckResult:
    """:func:`replay_per_round`, then the verdict on its rounds (:func:`summarise_rounds`)."""
    judged = replay_per_round(session, run, rounds, against, traced_run=traced_run, engine=engine)
    return summarise_rounds(name, run, judged, rules_for(session.settings), rounds.results)


def gather_rounds(
    session: SuiteSession, run: Run, rounds: RoundsUnderTest, against: ReplayAgainst, rules: NoiseModel
) -> Iterator[PromptRounds]:
    """Each prompt's evidence in turn: the golden rounds where they equal the engine's, else a replay."""
    s = session.settings
    model_dir, drafter_dir = against.model_dir or s.model_dir, against.drafter_dir or s.drafter_dir
    golden = golden_rounds(session, run) if against.use_golden else None
    fn = against.logits_fn or target_logits(model_dir, s.device)
    reference = None
    for index, (label, request, result) in enumerate(zip(rounds.labels, rounds.requests, rounds.results)):
        lengths = result.acceptance_lengths or []
        key = (tuple(request.prompt_ids), tuple(result.output_ids))
        from_golden = golden is not None and golden.get(key) == lengths and not request.stop_token_ids
        # the output's fp32 scores: a replayed prompt's rounds are judged with them; in low precision the target
        # near-tie rounds count against the excused-position ceiling at their top-2 gaps (golden prompts too)
        scores = None if from_golden and rules.exact else score_output(fn, request.prompt_ids, result.output_ids)
        top2 = [] if scores is None else list(scores.top2)  # the noise model weighs them in low precision only
        if from_golden:
            yield PromptRounds(index, label, result, lengths, top2, request.max_new_tokens)
            continue
        reference = reference or session.engines.reference_for(model_dir, drafter_dir)
        replayed = replay_result(
            reference, request, result.output_ids, lengths, run.mode, run.budget or 1, s.device, keep_top=DRAFTER_TOP
        )
        yield PromptRounds(index, label, result, lengths, top2, request.max_new_tokens, replayed, scores)


def golden_rounds(session: SuiteSession, run: Run) -> dict[tuple, list[int]] | None:
    """(prompt ids, output) -> the reference's float32 lengths for this run as the pair's float32 golden file
    recorded them (the copy held before the engine started), when it holds outputs as long as this run's."""
    s = session.settings
    golden = oracle_for(session).float32_golden(s.max_new_tokens)
    if golden is None:
        return None
    key = run.golden_key
    runs = {}
    for record in golden.records.values():
        if key in record.acceptance:
            lengths = golden_lengths(record.acceptance[key], s.max_new_tokens)
            runs[(tuple(record.prompt_ids), tuple(record.output_ids[: s.max_new_tokens]))] = lengths
    return runs


def judge_prompts(
    prompts: Iterable[PromptRounds], rules: NoiseModel, run: Run, traces: EngineTraces, context_limit: int | None
) -> JudgedRounds:
    """Every prompt's rounds judged (:func:`~ddtree_conformance.replay.judge_rounds`); golden rounds
    equal the engine's by construction."""
    judged = JudgedRounds()
    for prompt in prompts:
        judged.top2 += prompt.top2
        if prompt.replayed is None:
            judged.run.rounds += len(prompt.lengths)
            judged.run.drafter_side += [0] * len(prompt.lengths)
            judged.run.engine_lengths.append(prompt.lengths)
            judged.run.reference_lengths.append(prompt.lengths)
            judged.from_golden += 1
            continue
        output = prompt.result.output_ids
        prefill = prefill_verdict(prompt.label, output, prompt.scores, rules)
        if prefill is not None:
            judged.run.verdicts.append(prefill)
        # the traces are asked for with the run of the prompts before (and this one's prefill token): a
        # round of this prompt fails only after asking for them, so they are then known either way
        judged.run = judge_rounds(
            judged.run,
            prompt.label,
            prompt.lengths,
            output,
            prompt.replayed,
            rules,
            run.mode,
            run.budget or 1,
            prompt.scores.gaps,
            lambda index=prompt.index: traces.of(index, judged.run),
            context_limit=context_limit,
            max_new_tokens=prompt.max_new_tokens,
        )
    return judged


def _details(judged: JudgedRounds, results: list[RequestResult]) -> dict:
    run = judged.run
    source = (
        f"{judged.from_golden} prompts from the float32 golden file, {len(results) - judged.from_golden} replayed live"
    )
    return {
        "tau": run.tau,
        "reference_tau": run.reference_tau,
        "rounds": run.rounds,
        "source": source,
        "target_near_tie_rounds": [v.describe() for v in run.target[:50]],
        "drafter_near_tie_rounds": [v.describe() for v in run.drafter[:50]],
        "longer_unconfirmed_rounds": [v.describe() for v in run.longer[:50]],
        "shorter_unconfirmed_rounds": [v.describe() for v in run.shorter[:50]],
        "fp32_tie_rounds": [v.describe() for v in run.fp32_ties[:50]],
        "cut_tree_rounds": [v.describe() for v in run.cut[:50]],
        "freedom_rounds": [v.describe() for v in run.freedom[:50]],
        "differing_rounds": [v.describe() for v in run.differs[:50]],
    }


def summarise_rounds(
    name: str, run: Run, judged: JudgedRounds, rules: NoiseModel, results: list[RequestResult]
) -> CheckResult:
    """The verdict on the judged rounds: no differing or cut round, and the excused ones within their caps."""
    rounds, details = judged.run, _details(judged, results)
    if rounds.rounds == 0:
        if all(len(r.output_ids) <= 1 for r in results):
            return CheckResult.skipped(
                name,
                "every output is the prefill token alone (max_new_tokens or a stop "
                "token): no speculative round to compare",
                cause="input",
            )
        return CheckResult.failed(name, "the engine reports per-round acceptance but no rounds", **details)
    if rounds.differs:
        return _rounds_failed(
            name,
            rounds,
            rounds.differs,
            details,
            "per-round acceptance differs from the fp32 reference replayed on the engine's context",
            "lossless but slower: drafter positions, feedback rows, RoPE or budget?",
        )
    if rounds.cut:
        return _rounds_failed(
            name,
            rounds,
            rounds.cut,
            details,
            f"the engine verified smaller trees than B={run.budget} and accepted less",
            "its traces hold fewer nodes; the spec tree of that size accepts exactly the engine's "
            "length: a scheduler or cap that cuts trees, not a wrong tree",
        )
    return _excused_within_caps(name, judged, rules, details)


def _rounds_failed(name: str, run: ReplayRun, verdicts: list, details: dict, what: str, why: str) -> CheckResult:
    """``what`` in N/M rounds (and the token after the prefill of K prompts, which no round verifies), the
    first named with both sides' lengths around it, then ``why``."""
    first = verdicts[0]
    rounds = sum(v.round >= 0 for v in verdicts)
    prefill = len(verdicts) - rounds
    where = f"{rounds}/{run.rounds} rounds" + (
        f" and the token after the prefill of {prefill} prompts" if prefill else ""
    )
    return CheckResult.failed(
        name,
        f"{what} in {where}; first: {first.describe()}; {run.lengths_around(first)}; "
        f"tau {details['tau']:.3f} vs replay {details['reference_tau']:.3f} ({why})",
        first_round=first.__dict__,
        **details,
    )


def _excused_within_caps(name: str, judged: JudgedRounds, rules: NoiseModel, details: dict) -> CheckResult:
    """The rounds within every limit of the noise model (:meth:`~ddtree_conformance.noise.RoundLimits.breach`):
    target near-tie rounds within the ceiling, drafter ones within the cap, unconfirmed ones within theirs, the
    tau test passed. The limits and the tests join the verdict's details (a new dict, not the caller's)."""
    run = judged.run
    limits = rules.round_limits(run.rounds, judged.top2, run.lean, run.drafter_side)
    details = {
        **details,
        "drafter_lean": limits.lean.as_details(),
        "unconfirmed_caps": {"longer": limits.longer_cap, "shorter": limits.shorter_cap},
        "tau_test": limits.tau.as_details(),
    }
    tau, ref_tau = details["tau"], details["reference_tau"]
    breach = limits.breach(run, f"tau {tau:.3f} vs replay {ref_tau:.3f}")
    if breach is not None:
        first = {} if breach.first is None else {"first_round": breach.first.__dict__}
        return CheckResult.failed(name, breach.message, **first, **details)
    return CheckResult.passed(
        name,
        f"per-round acceptance equals the reference{limits.excused(run)} over {run.rounds} rounds "
        f"({details['source']}); tau {tau:.3f} vs {ref_tau:.3f}; tau test p <= {limits.tau.p_value:.2g}",
        **details,
    )
