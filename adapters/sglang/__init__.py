"""SGLang adapter: drives SGLang's offline ``sgl.Engine`` (plain, DFLASH, and DDTree where SGLang offers it).

The engine lives in :mod:`ddtree_conformance.adapters.sglang.engine` (imports SGLang); :mod:`ddtree_conformance.adapters.sglang.names`
lists every SGLang name the adapter relies on and imports nothing, so this package imports
without SGLang.
"""
