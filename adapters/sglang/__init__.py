"""SGLang adapter: drives SGLang's offline ``sgl.Engine`` (plain, DFLASH, and DDTree where SGLang offers it).

The engine lives in :mod:`ddtree_conformance.adapters.sglang.engine` (imports SGLang);
:mod:`ddtree_conformance.adapters.sglang.upstream_api` lists every SGLang name the adapter relies
on and imports nothing, and :mod:`ddtree_conformance.adapters.sglang.contract` checks those names
against the installed SGLang; so this package imports without SGLang.
"""
