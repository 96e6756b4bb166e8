"""The near-tie check (bfloat16/float16): the tie test pooled over every greedy run of the plan.

Each check that scores outputs runs the tie test on its own outputs
(:class:`~ddtree_conformance.token_scoring.TieTest`): where the engine leaves the fp32 argmax and the
same-dtype reference on the same path does not, against the reverse. An engine that takes the
runner-up at near ties by rule shows it in every mode alike, so this check pools the plain run and
the main run of every speculative mode of the plan (all memoised: no engine work of its own) and
tests them together, a few times the evidence of any one check. float32 plans do not have it: there
every token must be the fp32 argmax.
"""

from __future__ import annotations

from ..noise import ALPHA
from ..run import Run
from ..session import SuiteSession
from ..token_scoring import score_run
from .result import CheckResult

__all__ = ["NEAR_TIES_ID", "check_near_ties"]

NEAR_TIES_ID = "near-ties/all-greedy-runs"


def check_near_ties(session: SuiteSession, runs: list[Run]) -> CheckResult:
    caps = session.capabilities
    offered = [run for run in runs if run.mode in caps.modes]
    items, labels = [], []
    for run in [Run("plain"), *offered]:
        results = session.run(run.mode, run.budget)
        for prompt, result in zip(session.prompts, results):
            if result.error:
                return CheckResult.failed(
                    NEAR_TIES_ID, f"engine error in the {run.label} run on {prompt.id}: {result.error.splitlines()[0]}"
                )
            items.append((f"{prompt.id} ({run.label})", prompt.prompt_ids, result.output_ids))
        labels.append(run.label)
    scored = score_run(session, items)
    ties = scored.ties
    details = {
        "runs": labels,
        "outputs": scored.outputs,
        "positions": scored.positions,
        **({"ties_vs_same_dtype_reference": ties.details()} if ties is not None else {}),
    }
    if ties is None:
        return CheckResult.skipped(
            NEAR_TIES_ID, "no same-dtype reference to compare with (float32 or a synthetic target)"
        )
    what = (
        f"{scored.outputs} outputs of {len(labels)} runs ({', '.join(labels)}), {scored.positions} positions: the "
        f"engine leaves the fp32 argmax at {ties.engine_only} where the {session.settings.dtype} reference on the "
        f"same path does not, and keeps it at {ties.reference_only} where the reference leaves it ({ties.both} "
        f"shared; McNemar exact p = {ties.p_value:.2g})"
    )
    if ties.p_value < ALPHA:
        return CheckResult.failed(
            NEAR_TIES_ID,
            f"{what} < {ALPHA:g}: it takes the runner-up at near ties more often "
            "than low-precision arithmetic explains",
            **details,
        )
    return CheckResult.passed(NEAR_TIES_ID, what, **details)
