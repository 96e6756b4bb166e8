"""Engines for testing the tensor-parallel check on one CPU: a correct "sharded" engine and two mutants.

:class:`ShardedReference` is the reference engine that accepts ``tensor_parallel_size`` up to 2 and
reports ``max_tensor_parallel=2``; it runs every TP size unsharded, so TP=2 equals TP=1 exactly,
as a correct TP engine does in fp32. The mutants break exactly one thing at TP>1:

* :class:`TpOutputDrift`: every other request's output changes mid-sequence (an all-reduce that
  loses a shard's partial sum once);
* :class:`TpAcceptanceDrift`: the drafter is fed the first |acc| hidden-state rows instead of the
  accepted nodes' rows (each rank feeding its own rows): outputs stay lossless, acceptance drops.

The reference engine also shards for real (:mod:`ddtree_conformance.adapters.reference.tensor_parallel`; gloo
processes on CPU). Two mutants break that path the way integrations have:

* :class:`DriverOnlyKvMove`: only rank 0 moves the accepted path's KV into place; the other ranks
  crop their caches to the committed length, keeping the first rows. Chains are unaffected (their
  accepted rows are the first rows); tree outputs change.
* :class:`RankLocalResult`: rank 1 reports a different output than rank 0 (a rank-local
  decision); the engine's rank-agreement guard refuses the run.

:class:`RankFailsToStart` and :class:`RankDiesInRun` are not mutants: their other ranks raise while
starting, or exit in the middle of a run, to show that the engine reports that instead of waiting.

They are engines like any other: ``--engine ddtree_conformance.testing.tp_engines:TpOutputDrift``.
"""

from __future__ import annotations

import multiprocessing
import os

from ddtree_conformance.adapters.interface import Capabilities, EngineError, Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.tensor_parallel import rank
from ddtree_conformance.spec import compact_dynamic_cache, select_feedback_rows

__all__ = [
    "ShardedReference",
    "ShardedRoundsDifferently",
    "TpOutputDrift",
    "TpAcceptanceDrift",
    "DriverOnlyKvMove",
    "RankLocalResult",
    "RankFailsToStart",
    "RankDiesInRun",
    "TP_MUTANTS",
]


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


class ShardedRoundsDifferently(ShardedReference):
    """Correct: at TP>1 the engine rounds differently from TP=1, as a sharded engine whose all-reduce sums in
    another order does (here: the TP>1 run is :class:`~ddtree_conformance.testing.rounding_engines.Float32KvCache`'s,
    keys and values held in float32). In fp32 it equals TP=1; in bf16 its outputs part from TP=1's at near
    ties, and its per-prompt tau with them, while it stays DDTree to the fp32 reference's eye."""

    name = "sharded-rounds-differently"

    def sharded(self, results, requests, config):
        from .rounding_engines import Float32KvCache

        if getattr(self, "_other", None) is None:
            self._other = Float32KvCache(self.model_dir, self.drafter_dir)
        return self._other.generate(requests, config.model_copy(update={"tensor_parallel_size": 1}))

    def close(self) -> None:
        if getattr(self, "_other", None) is not None:
            self._other.close()
        super().close()


class TpOutputDrift(ShardedReference):
    """Mutant: at TP>1, every other request's output token in the middle is off by one."""

    name = "mutant-tp-output-drift"

    def capabilities(self):  # no verified trees: they would give the post-hoc drift away before the TP check
        return super().capabilities().model_copy(update={"verified_tree_modes": []})

    def sharded(self, results, requests, config):
        out = []
        for index, result in enumerate(results):
            ids = list(result.output_ids)
            if index % 2 == 0 and len(ids) >= 2:
                middle = len(ids) // 2
                ids[middle] = (ids[middle] + 1) % self.info.vocab_size
                result = result.model_copy(update={"output_ids": ids})
            out.append(result.model_copy(update={"verified_trees": None}))
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


def _driver_only_compaction(cache, start: int, accepted: list[int]) -> None:
    if rank() == 0:
        compact_dynamic_cache(cache, start, accepted)
    else:  # BUG: the KV move happened on the driver only; this rank just drops the rows past the path
        length = start + 1 + len(accepted)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


class DriverOnlyKvMove(ReferenceEngine):
    """Mutant (real TP): ranks other than 0 keep the first rows instead of the accepted path's KV."""

    name = "mutant-tp-driver-only-kv-move"
    compact_step = staticmethod(_driver_only_compaction)


class RankLocalResult(ReferenceEngine):
    """Mutant (real TP): rank 1's results differ from rank 0's (a decision taken per rank)."""

    name = "mutant-tp-rank-local-result"

    def generate_local(self, requests, config):
        results = super().generate_local(requests, config)
        if rank() == 1 and results and results[0].output_ids:
            ids = list(results[0].output_ids)
            ids[-1] = (ids[-1] + 1) % self.info.vocab_size
            results[0] = results[0].model_copy(update={"output_ids": ids})
        return results


class RankFailsToStart(ReferenceEngine):
    """Ranks 1..N-1 raise in their constructor (rank 0, in the suite's process, does not)."""

    name = "tp-rank-fails-to-start"

    def __init__(self, model_dir, drafter_dir=None, **options):
        if multiprocessing.current_process().name.startswith("reference-tp-rank"):
            raise RuntimeError("this rank cannot start (deliberately)")
        super().__init__(model_dir, drafter_dir, **options)


class RankDiesInRun(ReferenceEngine):
    """Rank 1 exits (code 3) on a request whose prompt starts with :attr:`FATAL_TOKEN`."""

    name = "tp-rank-dies-in-run"
    FATAL_TOKEN = 99

    def generate_local(self, requests, config):
        if rank() == 1 and any(r.prompt_ids[0] == self.FATAL_TOKEN for r in requests):
            os._exit(3)
        return super().generate_local(requests, config)


TP_MUTANTS = {
    "tp-output-drift": TpOutputDrift,
    "tp-acceptance-drift": TpAcceptanceDrift,
    "tp-driver-only-kv-move": DriverOnlyKvMove,
    "tp-rank-local-result": RankLocalResult,
}
