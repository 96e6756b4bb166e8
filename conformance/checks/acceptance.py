"""Check 3: acceptance against the fp32 reference, round by round (doc §4 metrics).

Engines with per-round acceptance lengths (which the integrity rules have already held to the
output, :mod:`ddtree_conformance.integrity`): every round is replayed with the fp32
reference on the engine's own context and compared (:mod:`ddtree_conformance.replay`); a round may
differ only by a reproducible near-tie, and drafter near-tie rounds are capped. Where the engine's
output and lengths equal the float32 golden file's, the golden acceptance *is* that replay, so no
reference runs. This catches lossless-but-slow bugs (wrong drafter positions, wrong feedback rows,
RoPE mismatch, capped budgets) in every dtype.

Engines that report only aggregates: per-prompt mean tau (and acceptance at depths 1-4) is compared
with the reference engine's at the same dtype and device, within a paired bootstrap band over the
prompts (:func:`~ddtree_conformance.metrics.paired_band`). Aggregates pooled over a whole batch (one
value for every request, no per-request rounds) have no per-prompt spread: their pooled tau is held
to 2 % of the reference's pooled tau, acceptance at depths 1-4 to 2 points.
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Request, RequestResult

from ..acceptance_policy import acceptance_depth_findings, diagnose_acceptance
from ..calibration import ALPHA
from ..metrics import mean_tau, paired_band, per_position_acceptance
from ..policy_trees import PolicyReference, match_on_rounds, replay_known_policies

from ..run import Run
from ..oracle import oracle_for
from ..replay import ReplayRun, RoundVerdict, drafter_round_cap, golden_lengths, judge_rounds, unconfirmed_round_cap
from ..session import SuiteSession
from ..token_scoring import rules_for, score_output, target_logits
from ..tree_policy import block_size, diagnose_traces, policy_table, round_views
from .result import CheckResult

__all__ = ["MIN_BAND_PROMPTS", "block_size", "check_acceptance", "judge_aggregates", "judge_per_round"]

MIN_BAND_PROMPTS = 5  # a bootstrap band over fewer prompts says nothing
POLICY_PROMPTS = 10  # prompts an untraced run is compared on under the known tree policies
POOLED_TAU_REL_TOL = 0.02  # batch-pooled aggregates: tau within 2 % of the reference's pooled tau
POOLED_POSITION_ABS_TOL = 0.02  # ... and acceptance at depths 1-4 within 2 points


def _float32_golden(session: SuiteSession):
    """The pair's float32 golden file (the copy held before the engine started) when it holds outputs
    at least as long as this run's, else None."""
    from ..golden_files import GoldenError

    s = session.settings
    try:
        golden = oracle_for(session).golden("float32")
    except GoldenError:
        return None
    return None if golden is None or golden.max_new_tokens < s.max_new_tokens else golden


def _golden_runs(session: SuiteSession, mode: str, budget: int | None) -> dict[tuple, list[int]] | None:
    """(prompt ids, output) -> golden float32 lengths of the reference for this run, when recorded."""
    s = session.settings
    golden = _float32_golden(session)
    if golden is None:
        return None
    key = Run(mode, budget).golden_key
    runs = {}
    for record in golden.records.values():
        if key in record.acceptance:
            lengths = golden_lengths(record.acceptance[key], s.max_new_tokens)
            runs[(tuple(record.prompt_ids), tuple(record.output_ids[: s.max_new_tokens]))] = lengths
    return runs


def judge_per_round(session: SuiteSession, name: str, mode: str, budget: int | None, labels: list[str],
                    requests: list[Request], results: list[RequestResult], *, model_dir: str | None = None,
                    drafter_dir: str | None = None, use_golden: bool = True, logits_fn=None,
                    traced_run=None, engine=None) -> CheckResult:
    """Replay every round of greedy ``results`` with the fp32 reference and judge them (module doc).

    A round that differs is explained with the engine's own traces (its tree, its drafter logits)
    from a traced rerun that reproduces the prompt's output and lengths: ``traced_run(index)`` gives
    the traced result of ``requests[index]``; by default, where the engine can trace in ``mode``,
    that request is rerun alone with traces on ``engine`` (the one that produced ``results``; default:
    the session's). Only prompts with a round to explain are rerun.

    ``results`` passed the integrity rules (every ``session.run`` validates): their acceptance lengths
    describe their outputs."""
    from ddtree_conformance.adapters.reference.replay import replay_result

    s = session.settings
    model_dir, drafter_dir = model_dir or s.model_dir, drafter_dir or s.drafter_dir
    rules = rules_for(session.settings)
    golden = _golden_runs(session, mode, budget) if use_golden else None
    fn = logits_fn or target_logits(model_dir, s.device)
    caps = session.capabilities
    if traced_run is None and caps.traced(mode):
        def traced_run(index: int) -> RequestResult:
            return session.run(mode, budget, trace=True, trace_draft_logits=caps.draft_logits,
                               requests=[requests[index]], engine=engine)[0]
    traced: dict[int, RequestResult] = {}

    def engine_traces(index: int):
        """The engine's per-round traces of prompt ``index``, from a traced rerun that reproduces the
        run (else None: its trees and logits would describe another run)."""
        if traced_run is None:
            return None
        if index not in traced:
            if run.differs or run.cut:  # already failing: another traced rerun would change no verdict
                return None
            traced[index] = traced_run(index)
        mine, base = traced[index], results[index]
        if mine.error or (mine.output_ids, mine.acceptance_lengths) != (base.output_ids, base.acceptance_lengths):
            return None
        return mine.traces

    run, from_golden, reference, top2 = ReplayRun(), 0, None, []
    for index, (label, request, result) in enumerate(zip(labels, requests, results)):
        lengths = result.acceptance_lengths or []
        if not rules.exact:  # the target near-tie rounds count against the excused-position ceiling
            top2 += score_output(fn, request.prompt_ids, result.output_ids).top2
        key = (tuple(request.prompt_ids), tuple(result.output_ids))
        if golden is not None and golden.get(key) == lengths and not request.stop_token_ids:
            run.rounds += len(lengths)
            run.engine_lengths.append(lengths)
            run.reference_lengths.append(lengths)
            from_golden += 1
            continue
        reference = reference or session.reference_for(model_dir, drafter_dir)
        replayed = replay_result(reference, request, result.output_ids, lengths, mode, budget or 1, s.device)
        scores = score_output(fn, request.prompt_ids, result.output_ids)
        _judge_prefill_token(run, label, result.output_ids, scores, rules)
        judge_rounds(run, label, lengths, result.output_ids, replayed, rules, mode, budget or 1, scores.gaps,
                     lambda index=index: engine_traces(index), context_limit=caps.max_context)
    source = f"{from_golden} prompts from the float32 golden file, {len(results) - from_golden} replayed live"
    tau, ref_tau = mean_tau(run.engine_lengths), mean_tau(run.reference_lengths)
    details = {"tau": tau, "reference_tau": ref_tau, "rounds": run.rounds, "source": source,
               "target_near_tie_rounds": [v.describe() for v in run.target[:50]],
               "drafter_near_tie_rounds": [v.describe() for v in run.drafter[:50]],
               "unconfirmed_drafter_rounds": [v.describe() for v in run.unconfirmed[:50]],
               "fp32_tie_rounds": [v.describe() for v in run.fp32_ties[:50]],
               "cut_tree_rounds": [v.describe() for v in run.cut[:50]],
               "freedom_rounds": [v.describe() for v in run.freedom[:50]],
               "differing_rounds": [v.describe() for v in run.differs[:50]]}
    if run.rounds == 0:
        if all(len(r.output_ids) <= 1 for r in results):
            return CheckResult.skipped(name, "every output is the prefill token alone (max_new_tokens or a stop "
                                             "token): no speculative round to compare",
                                       cause="input")
        return CheckResult.failed(name, "the engine reports per-round acceptance but no rounds", **details)
    if run.differs:
        return _rounds_failed(name, run, run.differs, tau, ref_tau, details,
                              "per-round acceptance differs from the fp32 reference replayed on the engine's context",
                              "lossless but slower: drafter positions, feedback rows, RoPE or budget?")
    if run.cut:
        return _rounds_failed(name, run, run.cut, tau, ref_tau, details,
                              f"the engine verified smaller trees than B={budget} and accepted less",
                              "its traces hold fewer nodes; the spec tree of that size accepts exactly the engine's "
                              "length: a scheduler or cap that cuts trees, not a wrong tree")
    ceiling, mu = rules.ceiling(top2)
    if len(run.target) > ceiling:
        return CheckResult.failed(
            name, f"{len(run.target)}/{run.rounds} rounds excused as target near-ties, above the ceiling {ceiling} a "
                  f"correct engine reaches at these gaps (expected <= {mu:.1f}); first: {run.target[0].describe()}",
            first_round=run.target[0].__dict__, **details)
    cap = drafter_round_cap(rules, run.rounds)
    if len(run.drafter) > cap:
        return CheckResult.failed(
            name, f"{len(run.drafter)}/{run.rounds} rounds excused as drafter near-ties, above the cap {cap} a "
                  f"correct engine reaches ({run.drafter[0].describe()}); tau {tau:.3f} vs replay {ref_tau:.3f}",
            first_round=run.drafter[0].__dict__, **details)
    small = unconfirmed_round_cap(rules, run.rounds)
    if len(run.unconfirmed) > small:
        return CheckResult.failed(
            name, f"{len(run.unconfirmed)}/{run.rounds} rounds shorter than the reference's where only a drafter near "
                  f"tie could explain it and the engine gives no drafter logits to confirm one, above the cap {small} "
                  f"for unconfirmed rounds ({run.unconfirmed[0].describe()}); tau {tau:.3f} vs replay {ref_tau:.3f} "
                  "(report drafter logits in traces to have drafter near ties confirmed)",
            first_round=run.unconfirmed[0].__dict__, **details)
    excused = ""
    if run.target or run.drafter or run.unconfirmed:
        excused = (f" except {len(run.target)} target near-tie and {len(run.drafter)} drafter near-tie rounds (cap "
                   f"{cap})" + (f" and {len(run.unconfirmed)} unconfirmed shorter rounds (cap {small})"
                                if run.unconfirmed else ""))
    return CheckResult.passed(name, f"per-round acceptance equals the reference{excused} over {run.rounds} rounds "
                                    f"({source}); tau {tau:.3f} vs {ref_tau:.3f}", **details)


def _judge_prefill_token(run: ReplayRun, label: str, output: list[int], scores, rules) -> None:
    """The token chosen after the prefill (no round verifies it): the fp32 argmax, or in low precision a
    target near tie (counted with the target near-tie rounds)."""
    if not output or output[0] == scores.argmax[0] or scores.gaps[0] == 0.0 or rules.fp32_tie(scores.gaps[0]):
        return
    gap = scores.gaps[0]
    verdict = RoundVerdict(label, -1, "differs", 1, 1, [output[0]], [scores.argmax[0]])
    if not rules.exact and gap <= rules.bound:
        verdict.kind = "target-near-tie"
        verdict.note = (f"fp32 target near-tie: the engine's token {output[0]} is {gap:.3g} below the top-1 "
                        f"{scores.argmax[0]}, within the bound {rules.bound:.3g}")
        run.target.append(verdict)
    else:
        verdict.note = (f"the engine's token {output[0]} after the prefill is not the fp32 target's {scores.argmax[0]} "
                        f"({gap:.3g} below the top-1, bound {rules.bound:.3g})")
        run.differs.append(verdict)


def _rounds_failed(name: str, run: ReplayRun, verdicts: list, tau: float, ref_tau: float, details: dict,
                   what: str, why: str) -> CheckResult:
    """``what`` in N/M rounds, the first named with both sides' lengths around it, then ``why``."""
    first = verdicts[0]
    return CheckResult.failed(
        name, f"{what} in {len(verdicts)}/{run.rounds} rounds; first: {first.describe()}; {run.lengths_around(first)}; "
              f"tau {tau:.3f} vs replay {ref_tau:.3f} ({why})", first_round=first.__dict__, **details)


def judge_aggregates(name: str, results: list[RequestResult], reference: list[RequestResult],
                     what: str) -> CheckResult:
    """Per-prompt mean tau (and acceptance at depths 1-4) within a paired bootstrap band of ``reference``."""
    pairs = [(r.mean_acceptance if r.mean_acceptance is not None else r.tau, ref)
             for r, ref in zip(results, reference)]
    pairs = [(a, ref) for a, ref in pairs if a is not None]
    if not pairs:
        return CheckResult.skipped(name, "engine reports neither per-round nor aggregate acceptance")
    mine = [a for a, _ in pairs]
    if len(pairs) > 1 and len(set(mine)) == 1 and all(r.rounds is None for r in results):
        return _judge_pooled(name, results, [ref for _, ref in pairs], mine[0], what)
    theirs = [ref.tau or 0.0 for _, ref in pairs]
    tau, ref_tau = sum(mine) / len(mine), sum(theirs) / len(theirs)
    if len(pairs) < MIN_BAND_PROMPTS and mine != theirs:
        return CheckResult.skipped(name, f"aggregate tau {tau:.3f} vs {what} {ref_tau:.3f} on {len(pairs)} prompts: "
                                         f"the bootstrap band needs at least {MIN_BAND_PROMPTS} (raise --limit)")
    low, high = paired_band(mine, theirs, ALPHA / 5)
    if not low <= 0.0 <= high:
        return CheckResult.failed(name, f"mean tau {tau:.3f} vs {what} {ref_tau:.3f}: the per-prompt difference's "
                                        f"{1 - ALPHA / 5:.4%} bootstrap band [{low:.3f}, {high:.3f}] over {len(pairs)} "
                                        f"prompts excludes 0", tau=tau, reference_tau=ref_tau)
    got_pos = [r.per_position_acceptance for r in results]
    if all(got_pos):
        depth = min(4, min(len(p) for p in got_pos))
        ref_pos = [per_position_acceptance([r.acceptance_lengths or []], depth) for r in reference]
        for d in range(depth):
            a = [p[d] for p in got_pos]
            b = [p[d] if d < len(p) else 0.0 for p in ref_pos]
            low_d, high_d = paired_band(a, b, ALPHA / 5)
            if not low_d <= 0.0 <= high_d:
                return CheckResult.failed(name, f"acceptance at depth {d + 1}: {sum(a) / len(a):.3f} vs {what} "
                                                f"{sum(b) / len(b):.3f}, band [{low_d:.3f}, {high_d:.3f}] excludes 0")
    return CheckResult.passed(name, f"aggregate tau {tau:.3f} vs {what} {ref_tau:.3f}: difference band "
                                    f"[{low:.3f}, {high:.3f}] over {len(pairs)} prompts holds 0", tau=tau,
                              reference_tau=ref_tau)


def _judge_pooled(name: str, results: list[RequestResult], reference: list[RequestResult], tau: float,
                  what: str) -> CheckResult:
    """Batch-pooled aggregates (one value for the whole batch, no per-request rounds, as vLLM's
    speculative-decoding counters give): no per-prompt difference exists to bootstrap, so the pooled
    tau (all committed tokens over all rounds) is compared with the reference's pooled tau within
    :data:`POOLED_TAU_REL_TOL`, and acceptance at depths 1-4 within :data:`POOLED_POSITION_ABS_TOL`."""
    ref_lengths = [ref.acceptance_lengths or [] for ref in reference]
    ref_tau = mean_tau(ref_lengths)
    rel = abs(tau - ref_tau) / ref_tau if ref_tau else float("inf")
    if rel > POOLED_TAU_REL_TOL:
        return CheckResult.failed(name, f"batch-pooled tau {tau:.3f} vs {what} {ref_tau:.3f}: {rel:.1%} apart, more than "
                                        f"{POOLED_TAU_REL_TOL:.0%} (lossless but slower: drafter positions, feedback "
                                        "rows, RoPE or budget?)", tau=tau, reference_tau=ref_tau)
    got = results[0].per_position_acceptance
    if got:
        depth = min(4, len(got))
        expected = per_position_acceptance(ref_lengths, depth)
        for d in range(depth):
            want = expected[d] if d < len(expected) else 0.0
            if abs(got[d] - want) > POOLED_POSITION_ABS_TOL:
                return CheckResult.failed(name, f"batch-pooled acceptance at depth {d + 1}: {got[d]:.3f} vs {what} "
                                                f"{want:.3f}, more than {POOLED_POSITION_ABS_TOL} apart")
    return CheckResult.passed(name, f"batch-pooled tau {tau:.3f} vs {what} {ref_tau:.3f} ({rel:.1%} apart, within "
                                    f"{POOLED_TAU_REL_TOL:.0%}; pooled aggregates give no per-prompt band)",
                              tau=tau, reference_tau=ref_tau)


def check_acceptance(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("acceptance")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    results = session.run(mode, budget)
    for prompt, result in zip(session.prompts, results):
        if result.error:
            return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
    return _named_policy(session, mode, budget, results, _judge(session, name, mode, budget, results))


def _judge(session: SuiteSession, name: str, mode: str, budget: int | None,
           results: list[RequestResult]) -> CheckResult:
    caps = session.capabilities
    labels = [p.id for p in session.prompts]
    if caps.per_round(mode):
        missing = [label for label, r in zip(labels, results) if r.acceptance_lengths is None]
        if missing:
            return CheckResult.failed(name, f"engine promises per-round acceptance in mode {mode} but returned none "
                                            f"for {missing[0]} ({len(missing)}/{len(labels)} prompts)")
        traced_run = None
        if caps.traced(mode):
            def traced_run(index: int) -> RequestResult:
                """Prompt ``index`` from the tree checks' traced run (memoised) when it holds it, else
                that prompt rerun alone with traces."""
                from .trees import traced_run as shared

                indices, traced = shared(session, mode, budget)
                if index in indices:
                    return traced[indices.index(index)]
                return session.run(mode, budget, trace=True, trace_draft_logits=caps.draft_logits,
                                   requests=[session.requests()[index]])[0]
        return judge_per_round(session, name, mode, budget, labels, session.requests(), results,
                               traced_run=traced_run)
    golden = _golden_reference(session, mode, budget)
    if golden is not None:
        return judge_aggregates(name, results, *golden)
    reference = session.reference_for(session.settings.model_dir, session.settings.drafter_dir)
    expected = session.run(mode, budget, engine=reference)
    s = session.settings
    return judge_aggregates(name, results, expected, f"reference ({s.dtype}, {s.device})")


def _named_policy(session: SuiteSession, mode: str, budget: int | None, results: list[RequestResult],
                  verdict: CheckResult) -> CheckResult:
    """A failing ddtree verdict with the tree policy that explains it, where one does
    (:mod:`ddtree_conformance.tree_policy`): from the tree checks' traced run where the engine traces,
    else from its acceptance (:mod:`ddtree_conformance.acceptance_policy`)."""
    s, caps = session.settings, session.capabilities
    block = block_size(s.drafter_dir)
    deeper = [] if caps.traced(mode) else acceptance_depth_findings(results, block, budget)
    if verdict.message.startswith("engine ") or not (deeper or (verdict.status == "fail" and mode == "ddtree")):
        stated = {r.engine_settings.get("draft_depth") for r in results} - {None}
        if verdict.status == "pass" and len(stated) == 1:  # the depth the engine says it drafts, within the block
            return verdict.model_copy(update={"message": f"{verdict.message}; the engine drafts {stated.pop()} "
                                                         f"positions past the root (L = {(block or 1) - 1})"})
        return verdict  # a skip stays one, unless acceptance shows the depth (which needs no band)
    label = Run(mode, budget).label
    if caps.traced(mode):
        from .trees import traced_run

        indices, traced = traced_run(session, mode, budget)
        views = [v for i, r in zip(indices, traced) if not r.error
                 for v in round_views(session.prompts[i].id, r.traces or [], caps.max_context)]
        diagnosis = diagnose_traces(label, views, mode, budget, block)
    else:
        diagnosis = diagnose_acceptance(label, results, budget or 1, block,
                                        _policy_matcher(session, budget, results, block) if mode == "ddtree" else None)
    details = dict(verdict.details, tables=[policy_table([diagnosis])], tree_policy=diagnosis.kinds,
                   notes=diagnosis.notes)
    if not diagnosis.findings:
        return verdict.model_copy(update={"details": details})
    return CheckResult.failed(verdict.check, f"the engine's trees are not the spec's ({diagnosis.source}): "
                                             f"{diagnosis.message()}; {verdict.message}", **details)


def _policy_matcher(session: SuiteSession, budget: int, results: list[RequestResult], block: int | None):
    """How an untraced run is compared with the reference under the known tree policies: on its own
    rounds where it reports per-round lengths (one replay, :data:`POLICY_PROMPTS` prompts), else by
    running the reference under each policy (per-request aggregates on :data:`POLICY_PROMPTS` prompts;
    batch-pooled ones need the whole batch)."""
    s = session.settings
    requests, config = session.requests(), session.config("ddtree", budget)
    per_request = all(r.rounds is not None for r in results)
    count = min(len(requests), POLICY_PROMPTS) if per_request else len(requests)

    def match():
        if all(r.acceptance_lengths is not None for r in results):
            reference = session.reference_for(s.model_dir, s.drafter_dir)
            return match_on_rounds(reference, requests[:count], results[:count], config, block)
        engine = PolicyReference(str(s.model_dir), str(s.drafter_dir))
        try:
            return replay_known_policies(engine, requests[:count], config, results[:count], block)
        finally:
            engine.close()

    return match


def _golden_reference(session: SuiteSession, mode: str, budget: int | None) -> tuple[list[RequestResult], str] | None:
    """float32 runs of a pair with a golden file holding every prompt of the set: the golden acceptance,
    as results (the held-out prompts of the run, which no golden file holds, from the live reference).
    It is the reference run on the pair's own files, so a drafter that is not the pair's (wrong layer
    ids in its config, other weights) shows against it, where a live reference would share the fault."""
    from ..golden_files import golden_path

    s = session.settings
    golden = _float32_golden(session) if s.dtype == "float32" else None
    if golden is None:
        return None
    key = Run(mode, budget).golden_key
    out = []
    for prompt in session.inputs.bundled:
        record = golden.records.get(prompt.id)
        if record is None or record.prompt_ids != prompt.prompt_ids or key not in record.acceptance:
            return None
        out.append(RequestResult(output_ids=record.output_ids[: s.max_new_tokens], finish_reason="length",
                                 acceptance_lengths=golden_lengths(record.acceptance[key], s.max_new_tokens)))
    if session.inputs.held_out:
        reference = session.reference_for(s.model_dir, s.drafter_dir)
        out += session.run(mode, budget, engine=reference, requests=session.requests()[len(out):])
    path = golden_path(s.golden_dir, s.pair_name, s.prompt_set, "float32")
    held_out = f" and the live reference on {len(session.inputs.held_out)} held-out" if session.inputs.held_out else ""
    return out, f"golden ({path.name}{held_out})"
