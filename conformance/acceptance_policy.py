"""The tree policy behind acceptance that differs from the spec's, for engines that give no traces
(vLLM PR #42910 and SGLang PR #29907 report acceptance counters only).

Acceptance alone shows the draft depth: a round longer than L + 1, or per-depth acceptance reported
at more than L depths (vLLM counts acceptance per drafted position, ``num_speculative_tokens`` of
them), means the engine drafts past the drafter's block. The other policies leave no such mark, so
the engine's acceptance is compared with the reference's under each known policy
(:data:`~ddtree_conformance.policy_trees.KNOWN_POLICIES`), and the policy it equals is named:
per round on the engine's own contexts where it reports per-round lengths, else by running the
reference under each policy on the same prompts (per request, or the pooled tau within 2 %).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ddtree_conformance.adapters.interface import RequestResult

from .policy_matching import PolicyMatch
from .policy_trees import KNOWN_POLICY_KINDS
from .tree_policy import PolicyDiagnosis, PolicyFinding

__all__ = ["acceptance_depth_findings", "diagnose_acceptance"]


def acceptance_depth_findings(
    results: Sequence[RequestResult], block: int | None, budget: int | None
) -> list[PolicyFinding]:
    """What acceptance alone shows of the draft depth (module doc), and what the engine states of it
    (``engine_settings["draft_depth"]``). Per-depth acceptance is read only
    where a result has no per-round lengths; it has one entry per depth the engine drafts
    (:class:`~ddtree_conformance.adapters.interface.RequestResult`)."""
    if not block:
        return []
    horizon = block - 1
    longest = max((n for r in results for n in (r.acceptance_lengths or [])), default=0)
    vectors = [r.per_position_acceptance or [] for r in results if r.acceptance_lengths is None]
    depths = max((len(v) for v in vectors), default=0)
    reached = max((d + 1 for v in vectors for d, x in enumerate(v) if x > 0), default=0)
    stated = max((int(r.engine_settings.get("draft_depth") or 0) for r in results), default=0)
    if longest <= horizon + 1 and depths <= horizon and stated <= horizon:
        return []
    shown = [f"the engine reports a draft depth of {stated}"] if stated > horizon else []
    if longest > horizon + 1:
        shown.append(f"a round accepted {longest - 1} drafted tokens")
    if depths > horizon:
        shown.append(
            f"per-depth acceptance is reported at {depths} depths"
            + (f", reaching depth {reached}" if reached > horizon else "")
        )
    return [
        PolicyFinding(
            "depth-beyond-block",
            f"drafts beyond the drafter's block ({'; '.join(shown)}; L = "
            f"{horizon}): draft depth tied to the budget B = {budget}?",
        )
    ]


def diagnose_acceptance(
    run: str,
    results: Sequence[RequestResult],
    budget: int,
    block: int | None,
    match_policies: Callable[[], PolicyMatch] | None,
) -> PolicyDiagnosis:
    """Findings for one untraced run whose acceptance differs from the spec's (module doc).
    ``match_policies()`` compares the run with the reference under the known policies
    (:func:`~ddtree_conformance.policy_matching.match_on_rounds` or
    :func:`~ddtree_conformance.policy_matching.replay_known_policies`); it is called only when acceptance
    shows no depth finding (None: not at all)."""
    per_round = all(r.acceptance_lengths is not None for r in results)
    diag = PolicyDiagnosis(run, "per-round acceptance lengths" if per_round else "aggregate acceptance")
    diag.findings = acceptance_depth_findings(results, block, budget)
    rounds = sum(len(r.acceptance_lengths or []) if per_round else (r.rounds or 0) for r in results)
    depths = max((len(r.per_position_acceptance or []) for r in results), default=0)
    longest = max((n for r in results for n in (r.acceptance_lengths or [])), default=0)
    diag.row = {
        "run": run,
        "evidence": diag.source,
        "rounds": rounds or "-",
        "depths reported": (f"{depths}" if depths else "-")
        + (f", longest round {longest}" if longest else "")
        + (f" (L = {block - 1})" if block else ""),
        "known policy matched": "-",
        "tau under each known policy": "-",
        "verdict": "",
    }
    if match_policies is not None and not diag.findings and block:
        match = match_policies()
        diag.row["tau under each known policy"] = ", ".join(f"{n} {t:.3f}" for n, t in match.taus.items())
        if match.matches:
            diag.on_equal_prompts = match.on_equal_prompts
            diag.row["known policy matched"] = ", ".join(match.matches)
            kinds: list[str] = []
            for name in match.matches:
                kinds += [k for k in KNOWN_POLICY_KINDS[name](budget, block - 1) if k not in kinds]
            diag.findings = [PolicyFinding(kinds[0], match.describe())]
            diag.findings += [PolicyFinding(k, "") for k in kinds[1:]]
        else:
            diag.notes.append(match.describe())
    diag.row["verdict"] = ", ".join(diag.kinds) or "no known policy"
    return diag
