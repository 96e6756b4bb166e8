"""Every check family, declared once: its name, its check, where the plan runs it, whether it reads
the pair's golden file, what evidence it counts, and its row in ``docs/reference/checks.md``.

:func:`ddtree_conformance.checks.plan` plans from these declarations, coverage and ``--allow-skip``
know the families from them, every result's ``details["detectable"]`` is computed from the declared
evidence (:func:`ddtree_conformance.evidence.detectable`), and the docs test holds each row to the
reference. Adding a family: its module, one declaration here, its test, its row in the docs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from ..evidence import Evidence
from .acceptance import check_acceptance
from .context_range import check_context_range
from .cuda_graphs import check_cuda_graphs
from .edges import check_lengths, check_prompt_shapes, check_special_tokens, check_stops
from .envelope import check_busy_batch
from .golden_outputs import check_golden
from .lossless import check_lossless
from .near_ties import check_near_ties
from .result import CheckResult
from .sampling import check_sampling
from .tensor_parallel import check_tensor_parallel
from .trees import check_branch_vs_chain, check_tree_structure

__all__ = ["Family", "Scope", "DECLARED", "family"]


class Scope(StrEnum):
    """Where a plan runs a family's check."""

    PER_RUN = "per run"  # every run of the plan (plain excluded): check(mode, budget)
    PER_BUDGET = "per DDTree budget"  # every DDTree run: check(budget)
    POOLED_LOW_PRECISION = "once, over every greedy run, in bfloat16/float16"  # check(runs)
    SAMPLED = "the first DDTree budget and DFlash, per sampling variant"  # check(mode, budget, variant)


@dataclass(frozen=True)
class Family:
    name: str
    check: Callable[..., CheckResult]
    scope: Scope = Scope.PER_RUN
    reads_golden: bool = False
    evidence: Evidence = Evidence.OUTPUTS
    doc_row: str = ""  # the first cell of its row in docs/reference/checks.md (default `name/<mode>`)

    @property
    def doc_id(self) -> str:
        return self.doc_row or f"{self.name}/<mode>"


DECLARED: tuple[Family, ...] = (
    Family("lossless", check_lossless),
    Family("golden", check_golden, reads_golden=True),
    Family("acceptance", check_acceptance, reads_golden=True, evidence=Evidence.REPLAYED_ROUNDS),
    Family("tree-structure", check_tree_structure, evidence=Evidence.TRACED_ROUNDS),
    Family("stop-token", check_stops),
    Family("max-new-tokens", check_lengths),
    Family("prompt-shapes", check_prompt_shapes),
    Family("token-0-and-mask-id", check_special_tokens),
    Family("context-range", check_context_range),
    Family("busy-batch", check_busy_batch),
    Family("tensor-parallel", check_tensor_parallel),
    Family("cuda-graphs", check_cuda_graphs),
    Family(
        "branch-vs-chain",
        check_branch_vs_chain,
        Scope.PER_BUDGET,
        evidence=Evidence.NODES,
        doc_row="branch-vs-chain/ddtree-B<B>",
    ),
    Family("near-ties", check_near_ties, Scope.POOLED_LOW_PRECISION, doc_row="near-ties/all-greedy-runs"),
    Family(
        "sampling", check_sampling, Scope.SAMPLED, evidence=Evidence.TRANSITIONS, doc_row="sampling/<mode>/<variant>"
    ),
)

_BY_NAME = {f.name: f for f in DECLARED}


def family(name: str) -> Family:
    """The declaration of family ``name``."""
    return _BY_NAME[name]
