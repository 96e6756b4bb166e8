"""How a session makes the engine under test from its settings, when no factory is given."""

from __future__ import annotations

from ..adapters.interface import Engine
from ..adapters.process import IsolatedEngine
from ..adapters.registry import create_engine, resolve_engine
from ..option_names import option
from ..settings import SuiteSettings

__all__ = ["engine_from_settings"]


def engine_from_settings(settings: SuiteSettings, model_dir: str, drafter_dir: str | None) -> Engine:
    """The engine ``settings.engine`` on a pair: in its own process unless ``isolate`` is off."""
    s = settings
    resolve_engine(s.engine, s.engine_options)  # unknown engine or option: a usage error, nothing started
    if s.isolate:
        return IsolatedEngine(
            s.engine,
            model_dir,
            drafter_dir,
            timeout_s=s.engine_timeout_s,
            start_timeout_s=s.engine_timeout_s,
            timeout_option=option("engine_timeout_s"),
            torch_threads=s.torch_threads,
            **s.engine_options,
        )
    return create_engine(s.engine, model_dir, drafter_dir, **s.engine_options)
