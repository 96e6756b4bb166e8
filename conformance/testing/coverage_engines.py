"""Engines that hide from the checks instead of failing them: each makes part of the plan skip.

A run where a requested mode or check family did not run because of the engine is *incomplete*
(exit status 7), never a pass, unless the caller opts out per family (``--allow-skip FAMILY``).
Each engine here made a whole run exit 0 before coverage became a verdict; ``tests/test_coverage.py``
runs each through the CLI (and the first through the pytest route) and asserts the incomplete exit
and the message. ``scripts/coverage_holes.py`` prints the table of them.

* :class:`NoDDTree`: the reference engine whose capabilities drop ``ddtree`` (run under
  ``--modes ddtree``: every check skips, "engine does not offer mode ddtree").
* :class:`PlainOnly`: capabilities offer ``plain`` alone (every speculative check skips).
* :class:`ChainNoAcceptance`: ignores the budget (every DDTree run is the DFlash chain) and reports
  no acceptance and no traces: its outputs are lossless, so only the acceptance and tree checks
  could catch it, and they skip.
* :class:`AggregateOnly`: also a chain under DDTree, reporting only per-request mean acceptance:
  below 5 prompts the acceptance check's bootstrap band cannot be formed and it skips.

They are engines like any other::

    ddtree-conformance check --engine ddtree_conformance.testing.coverage_engines:NoDDTree --modes ddtree
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Capabilities, Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine

__all__ = ["NoDDTree", "PlainOnly", "ChainNoAcceptance", "AggregateOnly", "HOLES"]


class NoDDTree(ReferenceEngine):
    """A stock engine without DDTree: plain and DFlash only."""

    name = "no-ddtree"

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"name": self.name, "modes": [m for m in caps.modes if m != "ddtree"]})


class PlainOnly(ReferenceEngine):
    """Plain decoding only: no speculative mode at all."""

    name = "plain-only"

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"name": self.name, "modes": ["plain"]})


class ChainNoAcceptance(ReferenceEngine):
    """DDTree runs as the DFlash chain whatever the budget; no acceptance lengths, rounds or traces."""

    name = "chain-no-acceptance"

    def capabilities(self) -> Capabilities:
        return (
            super()
            .capabilities()
            .model_copy(
                update={"name": self.name, "traces": False, "per_round_acceptance": False, "draft_logits": False}
            )
        )

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if config.mode == "ddtree":
            config = config.model_copy(update={"mode": "dflash"})
        results = super().generate(requests, config.model_copy(update={"trace": False, "trace_draft_logits": False}))
        return [self._strip(r) for r in results]

    @staticmethod
    def _strip(result: RequestResult) -> RequestResult:
        return result.model_copy(
            update={
                "acceptance_lengths": None,
                "rounds": None,
                "traces": None,
                "mean_acceptance": None,
                "per_position_acceptance": None,
            }
        )


class AggregateOnly(ChainNoAcceptance):
    """A chain under DDTree that reports only each request's mean acceptance (no rounds, no traces)."""

    name = "aggregate-only"

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if config.mode == "ddtree":
            config = config.model_copy(update={"mode": "dflash"})
        results = ReferenceEngine.generate(
            self, requests, config.model_copy(update={"trace": False, "trace_draft_logits": False})
        )
        out = []
        for r in results:
            tau = r.tau if config.mode != "plain" else None
            out.append(
                r.model_copy(
                    update={
                        "acceptance_lengths": None,
                        "rounds": None,
                        "traces": None,
                        "aggregate_only": tau is not None,
                        "mean_acceptance": tau,
                        "per_position_acceptance": None,
                    }
                )
            )
        return out


# name -> (engine, the CLI arguments of the hole, what the suite must say now)
HOLES: dict[str, tuple[str, list[str], str]] = {
    "capabilities drop ddtree": (f"{__name__}:NoDDTree", ["--modes", "ddtree"], "DDTree not available"),
    "plain only": (f"{__name__}:PlainOnly", [], "not available"),
    "chain, no acceptance": (f"{__name__}:ChainNoAcceptance", ["--modes", "ddtree"], "acceptance"),
    "aggregate only, 3 prompts": (f"{__name__}:AggregateOnly", ["--modes", "ddtree", "--limit", "3"], "acceptance"),
}
