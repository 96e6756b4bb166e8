"""The configs the SGLang adapter generates, checked against the recorded interfaces: DDTree PR #29907
(:data:`.upstream_api.PR_DDTREE`, not installable here) and the released SGLang's field names.

Each function returns the problems it finds (empty: the configs hold to the record). The default
test tier runs them on every config :class:`.server_config.ServerSetup` generates, and shows each
one failing when a recorded name changes (``tests/test_upstream_prs.py``). Nothing here imports SGLang.
"""

from __future__ import annotations

from . import upstream_api as api
from .upstream_api import DdtreePullRequest

__all__ = ["check_ddtree_pr_server_args", "check_like_with_like", "check_release_server_args"]


def check_release_server_args(kwargs: dict) -> list[str]:
    """A plain or DFLASH run's arguments against the released SGLang's recorded ServerArgs fields."""
    problems = [
        f"ServerArgs has no field {k!r} (upstream_api.SERVER_ARGS_FIELDS)"
        for k in kwargs
        if k not in api.SERVER_ARGS_FIELDS
    ]
    algorithm = kwargs.get("speculative_algorithm")
    if algorithm not in (None, api.DFLASH_ALGORITHM):
        problems.append(f"speculative_algorithm {algorithm!r} is not the released {api.DFLASH_ALGORITHM!r}")
    return problems


def check_ddtree_pr_server_args(
    kwargs: dict, budget: int, block_size: int, pr: DdtreePullRequest = api.PR_DDTREE
) -> list[str]:
    """A DDTree run's arguments against ``pr`` (what ``_handle_ddtree`` accepts and how it reads them)."""
    where = f"SGLang PR #{pr.number} at {pr.files[0][1][:8]}"
    fields = set(api.SERVER_ARGS_FIELDS) | set(pr.added_fields)
    problems = [f"{where}: ServerArgs has no field {k!r}" for k in kwargs if k not in fields]
    if kwargs.get("speculative_algorithm") != pr.algorithm:
        problems.append(
            f"{where}: speculative_algorithm is {kwargs.get('speculative_algorithm')!r}; the PR names "
            f"DDTree {pr.algorithm!r}"
        )
    if kwargs.get(pr.budget_field) != budget:
        problems.append(
            f"{where}: the budget B = {budget} must be {pr.budget_field} (got {kwargs.get(pr.budget_field)!r})"
        )
    if kwargs.get(pr.draft_tokens_field) != block_size:
        problems.append(
            f"{where}: {pr.draft_tokens_field} must be the drafter's block size {block_size} (got "
            f"{kwargs.get(pr.draft_tokens_field)!r})"
        )
    backend = kwargs.get("attention_backend")
    if budget > block_size - 1 and backend != pr.full_tree_attention_backend:
        problems.append(
            f"{where}: B = {budget} > L = {block_size - 1} is full-tree mode, which refuses attention "
            f"backend {backend!r} (it needs {pr.full_tree_attention_backend!r})"
        )
    if kwargs.get("page_size", pr.page_size) != pr.page_size:
        problems.append(f"{where}: page_size must be {pr.page_size}")
    problems += [f"{where}: {k} is refused by the PR" for k in pr.refused_fields if kwargs.get(k)]
    return problems


def check_like_with_like(by_mode: dict[str, dict]) -> list[str]:
    """Every mode of one run uses the same attention backend (losslessness compares like with like)."""
    backends = {mode: kwargs.get("attention_backend") for mode, kwargs in by_mode.items()}
    if len(set(backends.values())) > 1:
        return [f"attention backends differ between modes: {backends}"]
    return []
