"""Deliberately broken builds of the vLLM DDTree plugin (:mod:`ddtree_vllm_plugin`).

Each subclasses the plugin's runner and breaks exactly one step. They are selected with the vLLM
engine option ``ddtree_runner_class``, e.g.::

    ddtree-conformance check --engine vllm \\
        -O ddtree_runner_class=ddtree_conformance.testing.vllm_plugin_mutants:FlatPositions

The suite must fail both (``tests/test_vllm_plugin_tier.py``). Importing this module needs vLLM.
"""

from __future__ import annotations

from ddtree_vllm_plugin.runner import DDTreeCPUModelRunner

__all__ = ["FlatPositions", "FirstRowsKV", "PLUGIN_MUTANTS", "PLUGIN_MUTANT_FAILS"]


class FlatPositions(DDTreeCPUModelRunner):
    """Bug class 1: node positions taken from the flat index (start + i), not start + depth."""

    def node_positions(self, start, tree, n):
        return [start + i for i in range(1, n + 1)]


class FirstRowsKV(DDTreeCPUModelRunner):
    """Bug class 3: KV compaction keeps the first rows after the root instead of the accepted path."""

    def compact_kv(self, moves):
        return None


PLUGIN_MUTANTS = {"flat-positions": f"{__name__}:FlatPositions", "first-rows-kv": f"{__name__}:FirstRowsKV"}

#: The checks each broken build fails (of lossless, acceptance, tree-structure), on its first prompt
#: already. Wrong KV rows leave every trace well-formed: only outputs and acceptance show them.
PLUGIN_MUTANT_FAILS = {
    "flat-positions": {"lossless", "acceptance", "tree-structure"},
    "first-rows-kv": {"lossless", "acceptance"},
}
