"""Finding engine adapters by name.

An engine is named in one of three ways:

* a built-in name (:data:`BUILTIN_ENGINES`): ``reference``, ``vllm``, ``sglang``;
* a name registered by an installed package under the entry-point group
  :data:`ENTRY_POINT_GROUP` (``ddtree_conformance.adapters``), value ``module:Class``;
* a ``module:Class`` string naming any importable :class:`~ddtree_conformance.adapters.interface.Engine` subclass;
  a module that is not importable otherwise is looked for in the working directory, as ``python -m``
  does (``--engine my_engine:MyEngine`` run from the folder holding ``my_engine.py``).

Built-in names win over entry points of the same name, so ``reference`` always means this
repository's reference engine. Every failure is an :class:`~ddtree_conformance.adapters.interface.EngineError` whose
message names the engine and the cause; importing an adapter whose engine is not installed gives
"engine 'vllm' is not available here: ...", never a traceback. Naming no engine that exists, or an
option the engine does not declare (:attr:`Engine.OPTIONS`), is an
:class:`~ddtree_conformance.adapters.interface.EngineUsageError` raised before anything is built:
:func:`resolve_engine` is what front ends call first.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal

from .interface import Engine, EngineError, EngineUsageError
from .options import check_known

__all__ = [
    "BUILTIN_ENGINES",
    "ENTRY_POINT_GROUP",
    "EngineEntry",
    "list_engines",
    "available_engines",
    "load_engine_class",
    "create_engine",
    "resolve_engine",
    "check_options",
    "UnknownEngine",
]

ENTRY_POINT_GROUP = "ddtree_conformance.adapters"

BUILTIN_ENGINES: dict[str, str] = {
    "reference": "ddtree_conformance.adapters.reference.engine:ReferenceEngine",
    "vllm": "ddtree_conformance.adapters.vllm.engine:VllmEngine",
    "sglang": "ddtree_conformance.adapters.sglang.engine:SglangEngine",
}


class UnknownEngine(EngineUsageError):
    """No engine of that name is known here (a usage error, unlike an engine that fails to import)."""


@dataclass(frozen=True)
class EngineEntry:
    """One known engine name and where it points."""

    name: str
    target: str
    source: Literal["built-in", "entry point"]


def _entry_point_engines() -> list[EngineEntry]:
    found = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.append(EngineEntry(name=ep.name, target=ep.value.split("[", 1)[0].strip(), source="entry point"))
    return found


def list_engines() -> list[EngineEntry]:
    """Built-in engines first, then entry-point engines whose names are not built-in."""
    entries = [EngineEntry(name, target, "built-in") for name, target in BUILTIN_ENGINES.items()]
    seen = set(BUILTIN_ENGINES)
    for entry in sorted(_entry_point_engines(), key=lambda e: e.name):
        if entry.name not in seen:
            seen.add(entry.name)
            entries.append(entry)
    return entries


def available_engines() -> dict[str, str]:
    """Every known engine name -> its ``module:Class`` target (whether or not it imports here)."""
    return {entry.name: entry.target for entry in list_engines()}


def _split_target(name: str, target: str) -> tuple[str, str]:
    module, sep, attr = target.partition(":")
    module, attr = module.strip(), attr.strip()
    if not sep or not module or not attr:
        raise UnknownEngine(f"engine {name!r}: {target!r} is not of the form 'module:Class'")
    return module, attr


def _import_from_here(module_name: str):
    """Import ``module_name``; a top-level package missing from ``sys.path`` is looked for in the working
    directory (put first, as ``python -m`` does), so ``my_engine:MyEngine`` works from its own folder."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = module_name.split(".", 1)[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        if not (os.path.isfile(os.path.join(here, f"{top}.py")) or os.path.isdir(os.path.join(here, top))):
            raise
        sys.path.insert(0, here)  # kept: an isolated engine's child starts with this sys.path
        importlib.invalidate_caches()
        return importlib.import_module(module_name)


def load_engine_class(spec: str | type[Engine]) -> type[Engine]:
    """Resolve a built-in name, an entry-point name or ``module:Class`` to an Engine subclass."""
    if isinstance(spec, type):
        name, target, obj = getattr(spec, "name", spec.__name__), f"{spec.__module__}:{spec.__qualname__}", spec
    else:
        spec = str(spec).strip()
        known = available_engines()
        if spec in known:
            name, target = spec, known[spec]
        elif ":" in spec:
            name, target = spec, spec
        else:
            raise UnknownEngine(
                f"unknown engine {spec!r}; known engines: {', '.join(sorted(known))} (or give a 'module:Class' path)"
            )
        module_name, attr = _split_target(name, target)
        try:
            module = _import_from_here(module_name)
        except ImportError as exc:
            raise EngineError(f"engine {name!r} is not available here: {exc}") from exc
        except Exception as exc:  # an adapter's dependencies can fail in any way at import time
            raise EngineError(
                f"engine {name!r} is not available here: importing {module_name} failed with "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        obj = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise UnknownEngine(f"engine {name!r}: module {module_name} has no attribute {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Engine)):
        raise UnknownEngine(
            f"engine {name!r}: {target} is not a subclass of ddtree_conformance.adapters.interface.Engine"
        )
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(obj.__abstractmethods__))
        raise UnknownEngine(f"engine {name!r}: {target} is abstract (does not implement {missing})")
    return obj


def check_options(cls: type[Engine], options: dict, name: str | None = None) -> None:
    """Refuse options ``cls`` does not declare in :attr:`Engine.OPTIONS` (an
    :class:`~ddtree_conformance.adapters.interface.UnknownOption` naming the engine and the option);
    an engine whose ``OPTIONS`` is None checks its own options when built."""
    if cls.OPTIONS is not None:
        check_known(name or getattr(cls, "name", cls.__name__), options, cls.OPTIONS)


def resolve_engine(spec: str | type[Engine], options: dict | None = None) -> type[Engine]:
    """The engine class named by ``spec``, after refusing options it does not declare: everything
    that can be said about an engine and its options without building it (no model work)."""
    cls = load_engine_class(spec)
    check_options(cls, options or {}, spec if isinstance(spec, str) else None)
    return cls


def create_engine(
    spec: str | type[Engine], model_dir: str | Path, drafter_dir: str | Path | None = None, **options
) -> Engine:
    """Load the engine class named by ``spec`` and construct it.

    Errors from the constructor (for example a :class:`~ddtree_conformance.adapters.reference.pair.PairError` for a
    drafter that does not fit the target) propagate unchanged: they already name the field.
    """
    cls = resolve_engine(spec, options)
    return cls(str(model_dir), None if drafter_dir is None else str(drafter_dir), **options)
