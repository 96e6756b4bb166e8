"""vLLM adapter: drives vLLM's offline ``LLM`` (plain, DFlash, and DDTree where vLLM offers it).

The engine lives in :mod:`ddtree_conformance.adapters.vllm.engine` (imports vLLM); :mod:`ddtree_conformance.adapters.vllm.names` lists
every vLLM name the adapter relies on and imports nothing, so this package imports without vLLM.
"""
