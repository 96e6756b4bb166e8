"""What the vLLM adapter reads from the installed vLLM: accepted speculative methods and metrics.

``SpeculativeConfig`` forbids unknown methods and keys, so reading its fields and its ``method``
Literal tells exactly whether this vLLM offers a method (:func:`probe_method`). The metric helpers
take vLLM's cumulative speculative-decoding counters and their per-run deltas. :func:`plugin_choice`
says whether the DDTree plugin (``ddtree_vllm_plugin``) serves the ``ddtree`` mode.
"""

from __future__ import annotations

import typing

from ..interface import EngineError
from . import upstream_api as api
from .upstream_api import TESTED_VERSIONS

__all__ = [
    "version_tested",
    "spec_config_fields",
    "method_names",
    "probe_method",
    "plugin_choice",
    "metric_snapshot",
    "metric_delta",
]


def version_tested(version: str) -> bool:
    return any(version == v or version.startswith(v + ".") for v in TESTED_VERSIONS)


def _literal_values(annotation) -> set[str]:
    """All string values of a (nested) Literal / Optional / Union annotation."""
    found: set[str] = set()
    if typing.get_origin(annotation) is typing.Literal:
        for arg in typing.get_args(annotation):
            found |= _literal_values(arg) if not isinstance(arg, str) else {arg}
    else:
        for arg in typing.get_args(annotation):
            found |= _literal_values(arg)
    return found


def spec_config_fields() -> set[str]:
    """Field names of the installed ``vllm.config.SpeculativeConfig``."""
    from vllm.config import SpeculativeConfig

    fields = getattr(SpeculativeConfig, "__dataclass_fields__", None) or getattr(SpeculativeConfig, "model_fields", {})
    return set(fields)


def method_names() -> set[str]:
    """Speculative method names the installed ``SpeculativeConfig.method`` accepts."""
    from vllm.config import SpeculativeConfig

    hints = typing.get_type_hints(SpeculativeConfig, include_extras=False)
    return _literal_values(hints["method"])


def probe_method(method: str, budget_key: str = "num_speculative_tokens") -> tuple[bool, str]:
    """Whether the installed vLLM accepts ``method`` with its budget under ``budget_key``, and why not.

    ``SpeculativeConfig`` is a pydantic dataclass with ``extra="forbid"`` and a Literal ``method``:
    a name outside the Literal or an unknown key is rejected, so reading both is exact.
    """
    fields = spec_config_fields()
    if budget_key not in fields:
        return False, f"SpeculativeConfig has no field {budget_key!r}"
    methods = method_names()
    if method not in methods:
        return False, f"SpeculativeConfig.method does not accept {method!r} (accepted: {', '.join(sorted(methods))})"
    return True, ""


def metric_snapshot(llm) -> dict[str, object]:
    """The speculative-decoding counters of ``llm`` now: name -> int, or list[int] for vectors."""
    out: dict[str, object] = {}
    for metric in llm.get_metrics():
        if metric.name not in api.SPEC_METRICS:
            continue
        if hasattr(metric, "values"):
            values = [int(v) for v in metric.values]
            prev = out.get(metric.name)
            out[metric.name] = values if prev is None else [a + b for a, b in zip(prev, values)]
        else:
            out[metric.name] = int(out.get(metric.name, 0)) + int(metric.value)
    return out


def metric_delta(before: dict, after: dict) -> dict[str, object]:
    delta: dict[str, object] = {}
    for key, now in after.items():
        was = before.get(key)
        if isinstance(now, list):
            was = list(was or [])
            was += [0] * (len(now) - len(was))
            delta[key] = [a - b for a, b in zip(now, was)]
        else:
            delta[key] = now - (was or 0)
    return delta


def plugin_choice(plugin: str, ddtree_ok: bool, ddtree_why: str) -> tuple[bool, bool, str]:
    """``(plugin, ddtree_ok, ddtree_why)`` under the ``ddtree_plugin`` option (auto: the plugin where vLLM
    has no native DDTree); ``ddtree_plugin=on`` without a usable plugin is an error."""
    if not (plugin == "on" or (plugin == "auto" and not ddtree_ok)):
        return False, ddtree_ok, ddtree_why
    try:
        from ddtree_vllm_plugin import unavailable_reason
    except ImportError:
        why = (
            "the DDTree plugin for vLLM is not installed; it is opt-in: pip install ./vllm-plugin from "
            "the suite's repository (distribution ddtree-vllm-plugin)"
        )
    else:
        why = unavailable_reason()
    if why is None:
        return True, True, ""
    if plugin == "on":
        raise EngineError(f"engine 'vllm': ddtree_plugin=on but {why}")
    return False, ddtree_ok, ddtree_why + f"; and {why}"
