"""Tensor-parallel check: the same engine at TP=1 and TP=N gives the same outputs and acceptance.

Sharding the target over N GPUs changes reduction order, and integrations have sharded the
drafter's hidden-state feedback or the tree mask wrongly only under TP. So, for each speculative
run, the check runs the prompt set at ``tensor_parallel_size=1`` and at ``N`` and compares:

* outputs: the TP=1 output is the expected one; fp32 must match exactly;
* acceptance: fp32 per-round acceptance lengths equal (engines with aggregates only: mean tau
  within a paired bootstrap band over the prompts); bf16/fp16 both outputs scored against the fp32
  target (:mod:`ddtree_conformance.token_scoring`) and per-prompt tau within that band.

N is the settings' ``tensor_parallel_size`` when above 1 (the pair's or ``--tensor-parallel-size``),
else as many devices as are visible, capped by the engine's ``capabilities().max_tensor_parallel``.
With fewer than two devices visible and no TP size asked, it is *not applicable* (nothing to shard
over on this run, whatever the engine); where two or more are visible but the engine does not shard
(``max_tensor_parallel`` 1), it skips as the engine's gap (the run is incomplete until ``--allow-skip
tensor-parallel``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ddtree_conformance.adapters.interface import RequestResult

from ..metrics import mean_tau
from ..option_names import option
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import window
from .acceptance_aggregates import reports_aggregates
from .acceptance_rounds import RoundsUnderTest
from .output_comparison import GreedyCase, GreedyVerdict, first_divergence, judge_greedy
from .result import CheckResult
from .run_acceptance import judge_run_acceptance

__all__ = ["check_tensor_parallel", "tp_size", "visible_devices"]


def visible_devices(device: str) -> int:
    """Devices of ``device``'s kind this process can use (CUDA: after CUDA_VISIBLE_DEVICES)."""
    if device.split(":", 1)[0] == "cuda":
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1


def tp_size(session: SuiteSession) -> tuple[int, str]:
    """The TP size to compare with TP=1, and where it came from (or 1 and the reason to skip)."""
    caps, asked = session.capabilities, session.settings.tensor_parallel_size
    if asked <= 1 and visible_devices(session.settings.device) < 2:
        return 1, _one_device(session)
    if caps.max_tensor_parallel <= 1:
        return 1, (
            f"engine reports max_tensor_parallel={caps.max_tensor_parallel} here, so there is no TP>1 run to compare"
        )
    if asked > 1:
        if asked > caps.max_tensor_parallel:
            return 1, (
                f"tensor_parallel_size {asked} asked, but the engine reports max_tensor_parallel="
                f"{caps.max_tensor_parallel} here"
            )
        return asked, f"tensor_parallel_size {asked} (settings)"
    devices = visible_devices(session.settings.device)
    n = min(devices, caps.max_tensor_parallel)
    return n, f"{devices} devices visible, engine max_tensor_parallel={caps.max_tensor_parallel}"


def _one_device(session: SuiteSession) -> str:
    devices = visible_devices(session.settings.device)
    kind = session.settings.device.split(":", 1)[0]
    hint = (
        f"on CPU it runs when asked: {option('tensor_parallel_size')} N"
        if kind == "cpu"
        else f"with pytest-xdist, give each worker several GPUs: {option('gpus_per_worker')} N"
    )
    return f"{devices} {kind} device(s) visible; the TP check needs 2 or more ({hint})"


def _vocab_size(model_dir) -> int | None:
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _tree_difference(session: SuiteSession, mode: str, budget: int | None, index: int, n: int) -> str:
    """Where prompt ``index``'s traced trees at TP=N first differ from TP=1's (engines that trace),
    naming shard-local token ids when every TP=N tree token lies in the first 1/N of the vocabulary."""
    if not session.capabilities.traced(mode):
        return ""
    request = [session.requests()[index]]
    one, many = (session.run(mode, budget, trace=True, requests=request, tensor_parallel_size=tp)[0] for tp in (1, n))
    for r, (a, b) in enumerate(zip(one.traces or [], many.traces or [])):
        if (a.tree_tokens, a.parents) == (b.tree_tokens, b.parents):
            continue
        shard, hint = None, ""
        vocab = _vocab_size(session.settings.model_dir)
        if vocab:
            shard = -(-vocab // n)
            if all(t < shard for t in b.tree_tokens[1:]) and any(t >= shard for t in a.tree_tokens[1:]):
                hint = (
                    f" (every TP={n} tree token is below {shard} = vocab / {n}: token ids local to a vocabulary shard?)"
                )
        return (
            f"; the trees differ from round {r}: TP=1 tokens {a.tree_tokens[1:7]} | TP={n} {b.tree_tokens[1:7]}{hint}"
        )
    return "; the traced trees are equal (feedback or walk under sharding?)"


def check_tensor_parallel(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("tensor-parallel")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    n, why = tp_size(session)
    if n <= 1:
        if session.settings.tensor_parallel_size <= 1 and visible_devices(session.settings.device) < 2:
            return CheckResult.not_applicable(name, why)  # nothing to shard over on this run
        return CheckResult.skipped(name, why)  # devices to shard over, an engine that does not
    one = session.run(mode, budget, tensor_parallel_size=1)
    many = session.run(mode, budget, tensor_parallel_size=n)
    cases = _cases(session.prompts, one, many, n)
    verdict = judge_greedy(session, cases, what="TP=1")
    if verdict.engine_error:
        return CheckResult.failed(name, verdict.problem, tp=n)
    if verdict.problem:
        return _output_failure(name, session, cases, verdict, n)
    per_round = caps.per_round(mode) and all(r.acceptance_lengths is not None for r in one + many)
    if session.settings.dtype == "float32" and per_round:
        return _per_round_acceptance(name, session, mode, budget, one, many, n, f"TP={n} ({why}): {verdict.summary}")
    return _acceptance_at(name, session, mode, budget, many, n, f"TP={n} ({why}): {verdict.summary}")


def _cases(prompts: list, one: list[RequestResult], many: list[RequestResult], n: int) -> list[GreedyCase]:
    """The outputs to judge: TP=N against TP=1 per prompt, and TP=1 alone where it ran."""
    cases = []
    for prompt, a, b in zip(prompts, one, many):
        error = f"TP=1: {a.error}" if a.error else (f"TP={n}: {b.error}" if b.error else None)
        cases.append(GreedyCase(prompt.id, prompt.prompt_ids, b.output_ids, a.output_ids, error=error))
        if not a.error:
            cases.append(GreedyCase(f"{prompt.id} (TP=1)", prompt.prompt_ids, a.output_ids))
    return cases


def _output_failure(
    name: str, session: SuiteSession, cases: list[GreedyCase], verdict: GreedyVerdict, n: int
) -> CheckResult:
    """The failure of outputs that differ at TP=N (or are wrong on both)."""
    first = next((c for c in cases if c.expected is not None and list(c.got) != list(c.expected)), None)
    if session.settings.dtype == "float32" and verdict.differing and first is not None:
        pos = first_divergence(first.expected, first.got)
        return CheckResult.failed(
            name,
            f"TP={n} output differs from TP=1 on {len(verdict.differing)}/{len(session.prompts)} prompts; "
            f"prompt {first.label} diverges at output token {pos} (TP=1 {window(list(first.expected), pos)} | "
            f"TP={n} {window(list(first.got), pos)})",
            tp=n,
            **verdict.details,
        )
    return CheckResult.failed(name, f"TP={n} output: {verdict.problem}", tp=n, **verdict.details)


def _per_round_acceptance(
    name: str,
    session: SuiteSession,
    mode: str,
    budget: int | None,
    one: list[RequestResult],
    many: list[RequestResult],
    n: int,
    head: str,
) -> CheckResult:
    """fp32: every prompt's per-round acceptance lengths must be equal at TP=1 and TP=N."""
    tau_one = mean_tau([r.acceptance_lengths for r in one])
    tau_many = mean_tau([r.acceptance_lengths for r in many])
    for prompt, a, b in zip(session.prompts, one, many):
        if a.acceptance_lengths != b.acceptance_lengths:
            want, have = a.acceptance_lengths, b.acceptance_lengths
            first = first_divergence(want, have)
            trees = _tree_difference(session, mode, budget, session.prompts.index(prompt), n)
            return CheckResult.failed(
                name,
                f"TP={n} per-round acceptance differs from TP=1 on {prompt.id} at round {first}: "
                f"TP=1 {window(want, first)} | TP={n} {window(have, first)}; tau {tau_many:.3f} vs {tau_one:.3f} "
                f"(outputs equal: drafter feedback or tree under sharding?){trees}",
                tp=n,
                tau=tau_many,
                tau_tp1=tau_one,
            )
    return CheckResult.passed(name, f"{head}; per-round acceptance equals TP=1 (tau {tau_one:.3f})", tp=n, tau=tau_one)


def _acceptance_at(
    name: str, session: SuiteSession, mode: str, budget: int | None, many: list[RequestResult], n: int, head: str
) -> CheckResult:
    """bf16/fp16 (or aggregates only): the TP=N run's acceptance judged as the acceptance check judges the
    plan's run, against the fp32 reference on its own outputs (:mod:`.run_acceptance`), not against TP=1's:
    the two round differently (a sharded all-reduce sums in another order), so their outputs part at near
    ties and their taus are measured on different texts (a wide band; :mod:`.run_acceptance`)."""
    caps = session.capabilities
    per_round = caps.per_round(mode) and all(r.acceptance_lengths is not None for r in many)
    if not per_round and not reports_aggregates(many):
        return CheckResult.passed(name, f"{head}; engine reports no acceptance to compare", tp=n)

    def traced_at_n(index: int) -> RequestResult:
        request = session.requests()[index]
        draft_logits = caps.draft_logits
        return session.run(
            mode, budget, trace=True, trace_draft_logits=draft_logits, requests=[request], tensor_parallel_size=n
        )[0]

    rounds = RoundsUnderTest([p.id for p in session.prompts], session.requests(), many)
    traced = traced_at_n if per_round and caps.traced(mode) else None
    verdict = judge_run_acceptance(session, name, Run(mode, budget), rounds, per_round=per_round, traced_run=traced)
    message = f"TP={n}: {verdict.message}" if verdict.status != "pass" else f"{head}; TP={n} {verdict.message}"
    return verdict.model_copy(update={"message": message, "details": {**verdict.details, "tp": n}})
