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

__all__ = ["register", "ENTRY_POINT"]

ENTRY_POINT = "adapters.vllm_ddtree:register"

_log = logging.getLogger(__name__)


def register() -> None:
    """The ``vllm.general_plugins`` entry point (may run several times, in several processes)."""
    try:
        from . import hooks

        hooks.install()
    except Exception as exc:  # never break vLLM for everyone else
        _log.warning("DDTree plugin not installed (vLLM left unchanged): %s: %s", type(exc).__name__, exc)
