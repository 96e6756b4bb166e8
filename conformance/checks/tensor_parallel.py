"""Tensor-parallel check: the same engine at TP=1 and TP=N gives the same outputs and acceptance.

Sharding the target over N GPUs changes reduction order, and integrations have sharded the
drafter's hidden-state feedback or the tree mask wrongly only under TP. So, for each speculative
run, the check runs the prompt set at ``tensor_parallel_size=1`` and at ``N`` and compares:

* outputs: the TP=1 output is the expected one; fp32 must match exactly, bf16/fp16 may differ only
  after a near-tie first divergence (the lossless check's rule, :func:`compare_outputs`);
* acceptance: fp32 per-round acceptance lengths equal (engines with aggregates only: mean tau
  within :data:`TAU_REL_TOL`); bf16/fp16 pooled tau within :data:`TAU_REL_TOL`.

N is the settings' ``tensor_parallel_size`` when above 1 (the pair's or ``--tensor-parallel-size``),
else as many devices as are visible, capped by the engine's ``capabilities().max_tensor_parallel``.
It skips, with the reason, where the engine does not shard (``max_tensor_parallel`` 1) or fewer
than two devices are visible.
"""

from __future__ import annotations

from ..metrics import mean_tau
from ..session import SuiteSession
from .acceptance import TAU_REL_TOL
from .output_comparison import compare_outputs
from .lossless import summarise_verdicts
from .result import CheckResult

__all__ = ["check_tensor_parallel", "visible_devices", "tp_size"]


def visible_devices(device: str) -> int:
    """Devices of ``device``'s kind this process can use (CUDA: after CUDA_VISIBLE_DEVICES)."""
    if device.split(":", 1)[0] == "cuda":
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1


def tp_size(session: SuiteSession) -> tuple[int, str]:
    """The TP size to compare with TP=1, and where it came from (or 1 and the reason to skip)."""
    caps, asked = session.capabilities, session.settings.tensor_parallel_size
    if caps.max_tensor_parallel <= 1:
        return 1, (f"engine reports max_tensor_parallel={caps.max_tensor_parallel} here, so there is no TP>1 run "
                   "to compare")
    if asked > 1:
        if asked > caps.max_tensor_parallel:
            return 1, (f"tensor_parallel_size {asked} asked, but the engine reports max_tensor_parallel="
                       f"{caps.max_tensor_parallel} here")
        return asked, f"tensor_parallel_size {asked} (settings)"
    devices = visible_devices(session.settings.device)
    if devices < 2:
        kind = session.settings.device.split(":", 1)[0]
        hint = ("on CPU it runs when asked: --tensor-parallel-size N" if kind == "cpu" else
                "with pytest-xdist, give each worker several GPUs: --gpus-per-worker N")
        return 1, f"{devices} {kind} device(s) visible; the TP check needs 2 or more ({hint})"
    n = min(devices, caps.max_tensor_parallel)
    return n, f"{devices} devices visible, engine max_tensor_parallel={caps.max_tensor_parallel}"


def check_tensor_parallel(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = f"tensor-parallel[{mode}{'' if budget is None else f',B={budget}'}]"
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    n, why = tp_size(session)
    if n <= 1:
        return CheckResult.skipped(name, why)
    one = session.run(mode, budget, tensor_parallel_size=1)
    many = session.run(mode, budget, tensor_parallel_size=n)
    verdicts = []
    for prompt, a, b in zip(session.prompts, one, many):
        if a.error:
            verdicts.append(compare_outputs(prompt.id, prompt.prompt_ids, [], [], exact=True,
                                            got_error="TP=1: " + a.error))
            continue
        verdicts.append(compare_outputs(
            prompt.id, prompt.prompt_ids, a.output_ids, b.output_ids, exact=session.exact,
            near_tie_bound=session.near_tie_bound, scorer=None if session.exact else session.scorer,
            got_error=None if not b.error else f"TP={n}: {b.error}",
        ))
    outputs = summarise_verdicts(name, verdicts, session)
    bad = [v for v in verdicts if v.kind in ("divergence", "error")]
    if bad:
        first = bad[0]
        if first.kind == "error":
            return CheckResult.failed(name, f"engine error on {first.prompt}: {first.note}", tp=n, **outputs.details)
        gap = "" if first.gap is None else f", target top-2 gap {first.gap:.4f} > bound {session.near_tie_bound:.3g}"
        return CheckResult.failed(
            name,
            f"TP={n} output differs from TP=1 on {len(bad)}/{len(verdicts)} prompts; prompt {first.prompt} diverges "
            f"at output token {first.position} (TP=1 {first.expected}, TP={n} {first.got}{gap})",
            tp=n, **outputs.details,
        )

    tau_one = mean_tau([r.acceptance_lengths or [] for r in one]) if caps.per_round_acceptance else None
    tau_many = mean_tau([r.acceptance_lengths or [] for r in many]) if caps.per_round_acceptance else None
    if session.exact and caps.per_round_acceptance and all(r.acceptance_lengths is not None for r in one + many):
        for prompt, a, b in zip(session.prompts, one, many):
            if a.acceptance_lengths != b.acceptance_lengths:
                want, have = a.acceptance_lengths, b.acceptance_lengths
                first = next((i for i, (x, y) in enumerate(zip(want, have)) if x != y), min(len(want), len(have)))
                return CheckResult.failed(
                    name,
                    f"TP={n} per-round acceptance differs from TP=1 on {prompt.id} at round {first}: "
                    f"{have[first:first + 4]} vs {want[first:first + 4]}; tau {tau_many:.3f} vs {tau_one:.3f} "
                    "(outputs equal: drafter feedback or tree under sharding?)",
                    tp=n, tau=tau_many, tau_tp1=tau_one,
                )
        return CheckResult.passed(name, f"TP={n} ({why}): {outputs.message}; per-round acceptance equals TP=1 "
                                        f"(tau {tau_one:.3f})", tp=n, tau=tau_one)
    if tau_one is None or not any(r.acceptance_lengths for r in one):
        taus = [[r.mean_acceptance for r in rs if r.mean_acceptance is not None] for rs in (one, many)]
        if not taus[0] or not taus[1]:
            return CheckResult.passed(name, f"TP={n} ({why}): {outputs.message}; engine reports no acceptance",
                                      tp=n)
        tau_one, tau_many = (sum(t) / len(t) for t in taus)
    if abs(tau_many - tau_one) > TAU_REL_TOL * tau_one:
        return CheckResult.failed(name, f"TP={n} mean tau {tau_many:.3f} vs TP=1 {tau_one:.3f}: outside "
                                        f"{TAU_REL_TOL:.0%}", tp=n, tau=tau_many, tau_tp1=tau_one)
    return CheckResult.passed(name, f"TP={n} ({why}): {outputs.message}; tau {tau_many:.3f} vs TP=1 "
                                    f"{tau_one:.3f} (within {TAU_REL_TOL:.0%})", tp=n, tau=tau_many)
