"""Where run options meet an engine's capabilities: :func:`unsupported`, the one place that says why an
engine cannot run a dtype, device, tensor-parallel size, budget or mode here (used by the session,
``generate`` and ``bench``)."""

from __future__ import annotations

from .adapters.interface import Capabilities
from .option_names import option

__all__ = ["unsupported", "unsupported_settings"]


def unsupported(
    caps: Capabilities,
    *,
    dtype: str,
    device: str,
    budgets: list[int] = (),
    modes: list[str] = (),
    tensor_parallel_size: int = 1,
    budget_option: str = "budgets",
    no_drafter: bool = False,
) -> str | None:
    """Why the engine cannot run these options here (one line naming the option as the front end spells
    it, and the engine's limit), else None: the one place options meet capabilities.

    ``modes`` are checked only where the caller needs every one of them (``generate``, ``bench``); a
    conformance run skips the checks of a mode the engine lacks instead."""
    who = f"engine {caps.name!r}"
    for mode in modes:
        if mode not in caps.modes:
            hint = " (no drafter given?)" if mode != "plain" and no_drafter else ""
            return f"{who} cannot run mode {mode} here{hint}; it supports: {', '.join(caps.modes)}"
    if dtype not in caps.dtypes:
        return f"{option('dtype')} {dtype}: {who} supports {', '.join(caps.dtypes)} here"
    if device not in caps.devices and device.split(":", 1)[0] not in caps.devices:
        return f"{option('device')} {device}: {who} can use {', '.join(caps.devices) or 'no device'} here"
    if tensor_parallel_size > caps.max_tensor_parallel:
        return (
            f"{option('tensor_parallel_size')} {tensor_parallel_size}: {who} accepts at most "
            f"{caps.max_tensor_parallel} here (capabilities().max_tensor_parallel)"
        )
    if "ddtree" in caps.modes and caps.max_budget is not None:
        too_big = [b for b in budgets if b > caps.max_budget]
        if too_big:
            return (
                f"{option(budget_option)} {','.join(map(str, too_big))}: {who} accepts budgets up to "
                f"{caps.max_budget} (capabilities().max_budget)"
            )
    return None


def unsupported_settings(caps: Capabilities, settings) -> str | None:
    """:func:`unsupported` for a conformance run's settings (modes the engine lacks are skipped, not refused)."""
    return unsupported(
        caps,
        dtype=settings.dtype,
        device=settings.device,
        budgets=settings.budgets if "ddtree" in settings.modes else [],
        tensor_parallel_size=settings.tensor_parallel_size,
    )
