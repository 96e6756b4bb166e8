"""CUDA-graphs check: the same engine with CUDA graphs on and off gives the same outputs and acceptance.

Engines benchmark and ship with CUDA graphs, and test (or debug) eagerly; a graph replays the
kernels it captured on the buffers it captured, so an input written to a new tensor instead of into
the captured buffer is silently ignored. One DDTree port for vLLM had exactly that: tree position
ids never reached the graph's buffer, and its measured acceptance rose from 2.84 to 4.43 on garbage.
Eager runs cannot see such a bug; this check runs both and compares them:

* outputs: the graphs-off output is the expected one; fp32 must match exactly; bf16/fp16 both
  outputs are scored against the fp32 target (:mod:`ddtree_conformance.token_scoring`), as every
  other check does;
* acceptance: fp32 per-round acceptance lengths equal; bf16/fp16 the graphs-on run's acceptance judged
  against the fp32 reference on its own outputs, as the acceptance check judges the plan's run;
* on CUDA, the graphs-on run must report that it ran under CUDA graphs
  (``RequestResult.engine_settings["cuda_graphs"]``): a silent eager fallback compares nothing.

It runs where the engine can switch per run (``capabilities().cuda_graphs``; ``RunConfig.cuda_graphs``).
On CPU (no graphs) the reference engine's "graphs on" is its static-buffer path run eagerly, the very
code its graphs replay, so the check runs there too, on the first :data:`CPU_PROMPTS` prompts. An engine
that cannot switch is an engine gap on a CUDA run (the run is incomplete until ``--allow-skip
cuda-graphs``), and *not applicable* on a CPU run: there are no CUDA graphs there to switch.
"""

from __future__ import annotations

from dataclasses import replace

from ..metrics import mean_tau
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import window
from .acceptance_aggregates import reports_aggregates
from .acceptance_rounds import RoundsUnderTest
from .output_comparison import GreedyCase, GreedyVerdict, first_divergence, judge_greedy
from .result import CheckResult
from .run_acceptance import judge_run_acceptance

__all__ = ["CPU_PROMPTS", "check_cuda_graphs"]

CPU_PROMPTS = 8  # graph bugs show on any prompt; off CUDA both sides run at CPU speed


def check_cuda_graphs(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("cuda-graphs")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    cuda = session.settings.device.startswith("cuda")
    if not caps.cuda_graphs:
        why = "engine cannot switch CUDA graphs per run (capabilities().cuda_graphs)"
        if not cuda:
            return CheckResult.not_applicable(name, f"a {session.settings.device} run has no CUDA graphs ({why})")
        return CheckResult.skipped(name, why)
    prompts = session.prompts if cuda else session.prompts[:CPU_PROMPTS]
    requests = session.requests()[: len(prompts)]
    run = session.inputs.run(mode, budget)
    on = session.results(replace(run, cuda_graphs=True), requests)
    off = session.results(replace(run, cuda_graphs=False), requests)
    where = "" if cuda else f" (first {len(prompts)} prompts, CPU: the graph path's buffers run eagerly)"
    if cuda and not any(r.error for r in on):
        eager = [p.id for p, r in zip(prompts, on) if r.engine_settings.get("cuda_graphs") is False]
        if eager:
            why = on[0].engine_settings.get("cuda_graphs_failure") or "no reason given"
            return CheckResult.failed(
                name,
                f"asked for CUDA graphs, the engine reports it ran eagerly on {len(eager)}/"
                f"{len(prompts)} prompts (first {eager[0]}; {why}): nothing to compare",
            )
    cases = _cases(prompts, off, on, session.settings.dtype)
    verdict = judge_greedy(session, cases, what="graphs off")
    if verdict.engine_error:
        return CheckResult.failed(name, verdict.problem)
    if verdict.problem:
        return _output_failure(name, session.settings.dtype, cases, verdict, len(prompts), where)
    summary = verdict.summary + where
    per_round = caps.per_round(mode) and all(r.acceptance_lengths is not None for r in on + off)
    if session.settings.dtype == "float32" and per_round:
        return _per_round_acceptance(name, prompts, off, on, summary)
    return _acceptance_on(name, session, run, prompts, requests, on, summary)


def _cases(prompts: list, off: list, on: list, dtype: str) -> list[GreedyCase]:
    """The outputs to judge: graphs on against graphs off per prompt, and (off fp32) graphs off alone."""
    cases = []
    for prompt, a, b in zip(prompts, off, on):
        error = f"graphs off: {a.error}" if a.error else (f"graphs on: {b.error}" if b.error else None)
        cases.append(GreedyCase(prompt.id, prompt.prompt_ids, b.output_ids, a.output_ids, error=error))
        if dtype != "float32":
            cases.append(GreedyCase(f"{prompt.id} (graphs off)", prompt.prompt_ids, a.output_ids))
    return cases


def _output_failure(
    name: str, dtype: str, cases: list[GreedyCase], verdict: GreedyVerdict, prompts: int, where: str
) -> CheckResult:
    """The failure of outputs that differ with graphs on (or are wrong on both)."""
    # fp32: name the first output that differs; outputs equal on and off but wrong on both (the
    # fp32 target's argmax judged them) fail on the scoring's message below
    differing = [c for c in cases if c.expected is not None and list(c.got) != list(c.expected)]
    if dtype == "float32" and differing:
        first = differing[0]
        pos = first_divergence(first.expected, first.got)
        return CheckResult.failed(
            name,
            f"output with CUDA graphs differs from graphs off on {len(verdict.differing)}/{prompts} "
            f"prompts{where}; prompt {first.label} diverges at output token {pos} (off "
            f"{window(list(first.expected), pos)} | on {window(list(first.got), pos)}): an input the "
            "graph does not read, or a buffer it reads stale?",
            **verdict.details,
        )
    return CheckResult.failed(name, f"output with CUDA graphs: {verdict.problem}", **verdict.details)


def _per_round_acceptance(name: str, prompts: list, off: list, on: list, summary: str) -> CheckResult:
    """fp32: every prompt's per-round acceptance lengths must be equal on and off."""
    for prompt, a, b in zip(prompts, off, on):
        if a.acceptance_lengths != b.acceptance_lengths:
            first = first_divergence(a.acceptance_lengths, b.acceptance_lengths)
            return CheckResult.failed(
                name,
                f"per-round acceptance with CUDA graphs differs from graphs off on {prompt.id} at round "
                f"{first}: off {window(a.acceptance_lengths, first)} | on "
                f"{window(b.acceptance_lengths, first)}; tau {mean_tau([r.acceptance_lengths for r in on]):.3f}"
                f" vs {mean_tau([r.acceptance_lengths for r in off]):.3f} (outputs equal: the drafter's "
                "inputs under graphs?)",
            )
    return CheckResult.passed(
        name,
        f"{summary}; per-round acceptance equals graphs off (tau {mean_tau([r.acceptance_lengths for r in off]):.3f})",
    )


def _acceptance_on(
    name: str, session: SuiteSession, run: Run, prompts: list, requests: list, on: list, summary: str
) -> CheckResult:
    """bf16/fp16 (or aggregates only): the graphs-on run's acceptance judged as the acceptance check judges
    the plan's run, against the fp32 reference on its own outputs (:mod:`.run_acceptance`), not against the
    graphs-off run's: captured graphs may take other kernels, so the two round differently, their outputs
    part at near ties, and their taus are measured on different texts (a wide band; :mod:`.run_acceptance`)."""
    caps = session.capabilities
    per_round = caps.per_round(run.mode) and all(r.acceptance_lengths is not None for r in on)
    if not per_round and not reports_aggregates(on):
        return CheckResult.passed(name, f"{summary}; engine reports no acceptance to compare")
    rounds = RoundsUnderTest([p.id for p in prompts], requests, on)
    # a differing round is explained from a traced rerun only where it reproduces the graphs-on run
    verdict = judge_run_acceptance(session, name, Run(run.mode, run.budget), rounds, per_round=per_round)
    message = f"with CUDA graphs: {verdict.message}" if verdict.status != "pass" else f"{summary}; {verdict.message}"
    return verdict.model_copy(update={"message": message})
