"""DDTree for vLLM 0.32 on CPU, as an out-of-tree plugin (``vllm.general_plugins`` entry point).

Inert unless asked for: :func:`register` only wraps two vLLM functions, and each wrapper calls
the original unchanged unless the instance's ``additional_config`` has a ``"ddtree"`` entry
(:mod:`.config` has the switch and every refusal). ``register()`` never raises: a failure to hook
is logged and leaves vLLM as it was.

Modules: :mod:`.tree` (best-first tree and walk), :mod:`.attention` (tree attention on the CPU
backend), :mod:`.runner` (the runner and drafter hooks), :mod:`.worker`, :mod:`.hooks`.
"""

from __future__ import annotations

import logging

__all__ = ["register", "ENTRY_POINT", "unavailable_reason"]

ENTRY_POINT = "ddtree_vllm_plugin:register"

_log = logging.getLogger(__name__)


def register() -> None:
    """The ``vllm.general_plugins`` entry point (may run several times, in several processes)."""
    try:
        from . import hooks

        hooks.install()
    except Exception as exc:  # never break vLLM for everyone else
        _log.warning("DDTree plugin not installed (vLLM left unchanged): %s: %s", type(exc).__name__, exc)


def unavailable_reason() -> str | None:
    """Why the plugin cannot run DDTree in this environment, or None when it can."""
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as exc:  # pragma: no cover - callers import vLLM first
        return f"vLLM does not import: {exc}"
    from .config import TESTED_VERSIONS, _version_ok

    version = getattr(vllm, "__version__", "unknown")
    if not _version_ok(version):
        return f"the DDTree plugin is tested with vLLM {', '.join(v + '.x' for v in TESTED_VERSIONS)}, not {version}"
    if not current_platform.is_cpu():
        return f"the DDTree plugin runs on vLLM's CPU platform only, not {current_platform.device_type}"
    try:
        from importlib.metadata import entry_points

        names = {e.value for e in entry_points(group="vllm.general_plugins")}
    except Exception:  # pragma: no cover
        names = set()
    if ENTRY_POINT not in names:
        return (
            f"the entry point {ENTRY_POINT} is not installed (the plugin is opt-in: pip install ./vllm-plugin "
            "from the suite's repository, distribution ddtree-vllm-plugin)"
        )
    return None
