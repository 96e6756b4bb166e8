"""vLLM adapter: drives vLLM's offline ``LLM`` (plain, DFlash, and DDTree where vLLM offers it or the
opt-in ``ddtree-vllm-plugin`` adds it).

The engine lives in :mod:`ddtree_conformance.adapters.vllm.engine` (imports vLLM);
:mod:`ddtree_conformance.adapters.vllm.upstream_api` lists every vLLM name the adapter relies on
and imports nothing (the contract tests check those names against the installed vLLM), so this
package imports without vLLM.
"""
