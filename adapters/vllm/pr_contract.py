"""The configs the vLLM adapter generates, checked against the recorded interfaces: DDTree PR #42910
(:data:`.upstream_api.PR_DDTREE`, not installable here) and the released vLLM's names.

Each function returns the problems it finds (empty: the config holds to the record). The default
test tier runs them on every config :class:`.llm_config.LlmSetup` generates, and shows each one
failing when a recorded name changes (``tests/test_upstream_prs.py``). Nothing here imports vLLM.
"""

from __future__ import annotations

from . import upstream_api as api
from .upstream_api import DdtreePullRequest

__all__ = ["check_ddtree_pr_config", "check_release_config"]


def check_release_config(kwargs: dict) -> list[str]:
    """A plain or DFlash ``LLM`` config against the released vLLM's recorded names."""
    problems = [
        f"vllm.LLM has no keyword argument {k!r} (upstream_api.LLM_KWARGS)" for k in kwargs if k not in api.LLM_KWARGS
    ]
    spec = kwargs.get("speculative_config")
    if spec is not None:
        problems += [
            f"SpeculativeConfig has no field {k!r} (upstream_api.SPEC_FIELDS)" for k in spec if k not in api.SPEC_FIELDS
        ]
        if spec.get("method") != api.DFLASH_METHOD:
            problems.append(
                f"speculative_config.method {spec.get('method')!r} is not the released DFlash method "
                f"{api.DFLASH_METHOD!r}"
            )
    return problems


def check_ddtree_pr_config(
    kwargs: dict, budget: int, draft_depth: int | None, pr: DdtreePullRequest = api.PR_DDTREE
) -> list[str]:
    """A native-DDTree ``LLM`` config (and the draft depth the adapter reports for it) against ``pr``."""
    where = f"vLLM PR #{pr.number} at {pr.commit[:8]}"
    problems = [f"{where}: vllm.LLM has no keyword argument {k!r}" for k in kwargs if k not in pr.llm_kwargs]
    spec = kwargs.get("speculative_config") or {}
    if spec.get("method") != pr.method:
        problems.append(
            f"{where}: speculative_config.method is {spec.get('method')!r}; the PR selects DDTree with {pr.method!r}"
        )
    problems += [
        f"{where}: speculative_config has {k!r}, which the PR does not read" for k in spec if k not in pr.spec_fields
    ]
    if spec.get(pr.budget_key) != budget:
        problems.append(
            f"{where}: the budget B = {budget} must be speculative_config.{pr.budget_key} (got "
            f"{spec.get(pr.budget_key)!r})"
        )
    backend = kwargs.get(pr.attention_backend_kwarg)
    if backend != pr.attention_backend:
        problems.append(
            f"{where}: {pr.attention_backend_kwarg} is {backend!r}; the PR asserts the "
            f"{pr.attention_backend} backend at the first draft step"
        )
    if "ddtree" in (kwargs.get("additional_config") or {}):
        problems.append(f"{where}: additional_config['ddtree'] is the suite's plugin's switch, not the PR's")
    expected = spec.get(pr.budget_key) if pr.draft_depth_is_budget else None
    if expected is not None and draft_depth != expected:
        problems.append(
            f"{where}: the adapter reports a draft depth of {draft_depth}; the PR drafts "
            f"{pr.budget_key} = {expected} positions"
        )
    return problems
