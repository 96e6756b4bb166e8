"""Broken builds of the reference engine's CUDA-graph path (the ``cuda-graphs`` check must fail them).

* :class:`StalePositionsUnderGraphs`: the fast path writes every new input into its static buffer
  except the position ids, which keep the values of the first call of each shape. Under a captured
  graph that is what happens when positions go to a new tensor instead of into the buffer the
  graph reads (one DDTree port for vLLM did this; its acceptance rose from 2.84 to 4.43 on garbage).
  The eager path is untouched, so graphs off is right and graphs on is not; on CPU the same static
  buffers run without capture and break the same way. The round on the device
  (:meth:`~ddtree_conformance.adapters.reference.decoders.StaticDecoder.tree_round`) derives its
  positions from the root's (``start``) inside the graph: that input stays stale too.
"""

from __future__ import annotations

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.graphs import fill_in_place

__all__ = ["GRAPH_MUTANTS", "StalePositionsUnderGraphs"]


def _all_but_positions(static, name, value) -> None:
    if name not in ("positions", "start"):
        fill_in_place(static, name, value)


class StalePositionsUnderGraphs(ReferenceEngine):
    """Position ids never reach the graph's static buffer after the first call of a shape."""

    name = "mutant-stale-positions-under-graphs"
    fill_static = staticmethod(_all_but_positions)


GRAPH_MUTANTS = {"stale-positions-under-graphs": StalePositionsUnderGraphs}
