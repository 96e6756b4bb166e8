"""Engines for testing the tensor-parallel check on one CPU: a correct "sharded" engine and two mutants.

:class:`ShardedReference` is the reference engine that accepts ``tensor_parallel_size`` up to 2 and
reports ``max_tensor_parallel=2``; it runs every TP size unsharded, so TP=2 equals TP=1 exactly,
as a correct TP engine does in fp32. The mutants break exactly one thing at TP>1:

* :class:`TpOutputDrift`: every other request's output changes mid-sequence (an all-reduce that
  loses a shard's partial sum once);
* :class:`TpAcceptanceDrift`: the drafter is fed the first |acc| hidden-state rows instead of the
  accepted nodes' rows (each rank feeding its own rows): outputs stay lossless, acceptance drops.

They are engines like any other: ``--engine conformance.testing.tp_engines:TpOutputDrift``.
"""

from __future__ import annotations

from adapters.interface import Capabilities, EngineError, Request, RequestResult, RunConfig
from adapters.reference.engine import ReferenceEngine
from conformance.spec import select_feedback_rows

__all__ = ["ShardedReference", "TpOutputDrift", "TpAcceptanceDrift", "TP_MUTANTS"]


class ShardedReference(ReferenceEngine):
    """Reference engine claiming TP up to 2; every TP size runs unsharded (identical results)."""

    name = "sharded-reference"
    max_tp = 2

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"max_tensor_parallel": self.max_tp})

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        tp = config.tensor_parallel_size
        if tp > self.max_tp:
            raise EngineError(f"{self.name}: tensor_parallel_size={tp} > max_tensor_parallel={self.max_tp}")
        results = super().generate(requests, config.model_copy(update={"tensor_parallel_size": 1}))
        return self.sharded(results, requests, config) if tp > 1 else results

    def sharded(self, results: list[RequestResult], requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """What TP>1 changes; nothing here."""
        return results


class TpOutputDrift(ShardedReference):
    """Mutant: at TP>1, every other request's output token in the middle is off by one."""

    name = "mutant-tp-output-drift"

    def sharded(self, results, requests, config):
        out = []
        for index, result in enumerate(results):
            ids = list(result.output_ids)
            if index % 2 == 0 and len(ids) >= 2:
                middle = len(ids) // 2
                ids[middle] = (ids[middle] + 1) % self.info.vocab_size
                result = result.model_copy(update={"output_ids": ids})
            out.append(result)
        return out


class TpAcceptanceDrift(ShardedReference):
    """Mutant: at TP>1 the drafter gets the first |acc| feature rows (lossless, lower acceptance)."""

    name = "mutant-tp-acceptance-drift"

    def generate(self, requests, config):
        if config.tensor_parallel_size <= 1:
            return super().generate(requests, config)
        self.feedback_step = lambda hidden, accepted: select_feedback_rows(hidden, list(range(1, len(accepted) + 1)))
        try:
            return super().generate(requests, config)
        finally:
            del self.feedback_step


TP_MUTANTS = {
    "tp-output-drift": TpOutputDrift,
    "tp-acceptance-drift": TpAcceptanceDrift,
}
