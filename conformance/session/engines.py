"""The engines of a session: started once per model pair, asked for capabilities once, and stopped.

:class:`EngineLifecycle` builds the engine under test (in its own process unless ``isolate`` is
off) and, for acceptance comparisons, the in-process reference engine (:attr:`EngineRole.ORACLE`); each
engine's :class:`EngineInfo` says who it is to the session (the run store records it with every run).
An engine that cannot start or dies (:class:`~ddtree_conformance.adapters.interface.EngineDied`)
is kept in :attr:`EngineLifecycle.failure`, and every later call raises at once: the run stops
there. :meth:`EngineLifecycle.generate` is the one place an engine is asked to generate; what it
returns passes the integrity rules (:func:`~ddtree_conformance.integrity.validate_results`) first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from ..adapters.interface import Capabilities, Engine, EngineDied, EngineUsageError, Request, RequestResult, RunConfig
from ..adapters.reference.engine import ReferenceEngine
from ..integrity import PairLimits, error_result, validate_results
from ..progress import Heartbeat, Printer
from ..settings import SettingsError, SuiteSettings
from ..support import unsupported_settings
from .factory import engine_from_settings
from .mixing import Arrangement, placed_back

__all__ = ["EngineFactory", "EngineInfo", "EngineLifecycle", "EngineRole"]

EngineFactory = Callable[[str, "str | None"], Engine]


class EngineRole(enum.Enum):
    UNDER_TEST = "engine"
    ORACLE = "the reference engine (oracle)"


@dataclass(frozen=True)
class EngineInfo:
    """Who an engine is to the session: its name, its role and its model pair's limits (what the
    integrity rules hold its results to)."""

    name: str
    role: EngineRole
    limits: PairLimits

    @property
    def oracle(self) -> bool:
        return self.role is EngineRole.ORACLE


class EngineLifecycle:
    """Starts, asks and stops the session's engines (module doc)."""

    def __init__(
        self,
        settings: SuiteSettings,
        factory: EngineFactory | None = None,
        *,
        progress: Printer | None = None,
        heartbeat_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.progress, self.heartbeat_s = progress, heartbeat_s
        self._factory = factory or partial(engine_from_settings, settings)
        self._engines: dict[tuple, Engine] = {}
        self._info: dict[int, EngineInfo] = {}  # id(engine) -> info
        self._limits: dict[tuple, PairLimits] = {}  # pair key -> its limits, read once (limits_of)
        self.failure: EngineDied | None = None  # the engine could not start or died: nothing more runs
        self.failure_reported = False  # the pytest route shows the engine's log tail once
        self._caps: Capabilities | None = None
        self._caps_error: Exception | None = None
        self._support_error: Exception | None = None
        self._support_checked = False

    def _fail(self, exc: EngineDied) -> EngineDied:
        if self.failure is None:
            self.failure = exc
        return exc

    def dead_again(self) -> EngineDied:
        """What every call after the engine's failure raises: one line naming the first cause."""
        first = str(self.failure).split("\n", 1)[0]
        return EngineDied(f"not run: engine {self.settings.engine!r} failed earlier and is not restarted: {first}")

    def heartbeat(self, name: str, what: str) -> Heartbeat:
        return Heartbeat(self.progress, name, what, self.heartbeat_s)

    def engine_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        """The engine under test on a pair, started on first use."""
        key = _pair_key(model_dir, drafter_dir)
        if key not in self._engines:
            if self.failure is not None:
                raise self.dead_again()
            name = self.settings.engine
            limits = self.limits_of(*key)  # read before the engine exists: it cannot forge them
            try:
                with self.heartbeat(name, "start"):
                    engine = self._factory(*key)
            except (EngineUsageError, EngineDied) as exc:
                if isinstance(exc, EngineDied):
                    self._fail(exc)
                raise
            except Exception as exc:  # an in-process engine that cannot be built: it cannot start
                raise self._fail(EngineDied(f"engine {name!r} failed to start: {type(exc).__name__}: {exc}")) from exc
            self._engines[key] = engine
            self._info[id(engine)] = EngineInfo(name, EngineRole.UNDER_TEST, limits)
        return self._engines[key]

    def limits_of(self, model_dir: str, drafter_dir: str | None) -> PairLimits:
        """A pair's limits (vocabulary, block size), read from its config files once, the first time the
        pair is named: for the settings' pair, before the engine under test starts, so that an engine which
        rewrites a config and restores it before a check ends (the watched files' hashes then match)
        still meets the pair's own limits."""
        key = _pair_key(model_dir, drafter_dir)
        if key not in self._limits:
            self._limits[key] = PairLimits.read(*key)
        return self._limits[key]

    def reference_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        """The in-process reference engine on a pair: the oracle for acceptance comparisons."""
        key = ("oracle", *_pair_key(model_dir, drafter_dir))
        if key not in self._engines:
            engine = ReferenceEngine(*key[1:])
            self._engines[key] = engine
            self._info[id(engine)] = EngineInfo("reference (oracle)", EngineRole.ORACLE, self.limits_of(*key[1:]))
        return self._engines[key]

    @property
    def engine(self) -> Engine:
        return self.engine_for(self.settings.model_dir, self.settings.drafter_dir)

    def started(self) -> Engine | None:
        """The engine under test on the settings' pair when it has started, else None (nothing starts)."""
        return self._engines.get(_pair_key(self.settings.model_dir, self.settings.drafter_dir))

    def info(self, engine: Engine) -> EngineInfo:
        return self._info.get(id(engine)) or EngineInfo(
            getattr(engine, "name", "engine"), EngineRole.UNDER_TEST, PairLimits()
        )

    @property
    def capabilities(self) -> Capabilities:
        """The engine's capabilities, asked once; a failure (a hang, an error) is kept and re-raised."""
        if self._caps is None and self._caps_error is None:
            if self.failure is not None:
                raise self.dead_again()
            engine, name = self.engine, self.settings.engine
            try:
                with self.heartbeat(name, "start and capabilities()"):
                    caps = engine.capabilities()
                if not isinstance(caps, Capabilities):
                    raise TypeError(f"returned {type(caps).__name__}, not Capabilities")
                self._caps = caps
            except EngineDied as exc:
                self._caps_error = self._fail(exc)
            except EngineUsageError as exc:
                self._caps_error = exc
            except Exception as exc:
                self._caps_error = self._fail(
                    EngineDied(f"engine {name!r}: capabilities() failed: {type(exc).__name__}: {exc}")
                )
        if self._caps_error is not None:
            raise self._caps_error
        return self._caps

    def require_support(self, check_inputs: Callable[[], None] = lambda: None) -> None:
        """Refuse, before any check runs, settings the engine says it cannot run here (and whatever
        ``check_inputs`` refuses): one :class:`~ddtree_conformance.settings.SettingsError`. The outcome
        is kept: a second call raises the same error at once."""
        if not self._support_checked:
            try:
                check_inputs()
                problem = unsupported_settings(self.capabilities, self.settings)
                if problem:
                    raise SettingsError(problem)
            except Exception as exc:
                self._support_error = exc
            self._support_checked = True
        if self._support_error is not None:
            raise self._support_error

    def generate(
        self,
        engine: Engine,
        requests: list[Request],
        config: RunConfig,
        labels: Sequence[str],
        arrangement: Arrangement | None = None,
        companion_labels: Sequence[str] = (),
    ) -> tuple[list[RequestResult], list[RequestResult]]:
        """One engine call, validated: ``(results, companion results)``, each in the caller's order (an
        ``arrangement``'s order is undone before validation: :func:`.mixing.placed_back`). An exception the
        engine raises becomes one error result per request; :class:`EngineDied` stops the session."""
        if self.failure is not None:
            raise self.dead_again()
        info = self.info(engine)
        sent = arrangement.sent if arrangement else list(requests)
        count = f"{len(sent)} request{'' if len(sent) == 1 else 's'}"
        what = f"({config.mode}{f', B={config.budget}' if config.mode == 'ddtree' else ''})"
        try:
            with self.heartbeat(info.name, f"generate {count} {what}"):
                results = engine.generate(sent, config)
        except EngineDied as exc:
            raise self._fail(exc)
        except Exception as exc:
            message = f"engine {info.name!r} raised {type(exc).__name__}: {exc}"
            errors = [error_result(message) for _ in sent]
            return errors[: len(requests)], errors[len(requests) :]
        caps = engine.capabilities() if info.oracle else self.capabilities
        validate = partial(validate_results, config=config, limits=info.limits, caps=caps, engine=info.name)
        return placed_back(arrangement, requests, results, validate, labels, companion_labels)

    def close(self) -> None:
        for engine in self._engines.values():
            try:
                engine.close()
            except Exception:  # closing must never mask a check's result
                pass
        self._engines.clear()


def _pair_key(model_dir, drafter_dir) -> tuple[str, str | None]:
    return str(model_dir), None if drafter_dir is None else str(drafter_dir)
