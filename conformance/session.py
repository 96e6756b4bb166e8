"""A conformance session: the engine under test, its settings, prompts and memoised runs.

Checks ask the session for runs (``session.run("ddtree", 32, trace=True)``); the session asks
the engine once per distinct configuration and keeps the results. The engine runs in its own
process unless ``isolate`` is off (mutant self-tests inject in-process engines).

Nothing the engine returns is trusted: every batch passes :func:`ddtree_conformance.integrity.validate_results`
before a check sees it, so a broken result reaches checks as an error result naming the request
and the field. ``capabilities()`` is asked once; its answer or its failure is kept. An engine that
cannot start or dies (:class:`~ddtree_conformance.adapters.interface.EngineDied`) is recorded in
:attr:`SuiteSession.failure` and every later engine call raises at once: the run stops there.
While :meth:`SuiteSession.watch` is active, the session notes which runs a check used
(:class:`UsedRun`), so the check runner can tell a check that consumed failed results.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .adapters.interface import (Capabilities, Engine, EngineDied, EngineUsageError, Mode, Request, RequestResult,
                                 RunConfig)
from .integrity import PairLimits, error_result, validate_results
from .progress import Heartbeat, Printer
from .settings import SuiteSettings

__all__ = ["SuiteSettings", "SuiteSession", "EngineFactory", "UsedRun"]

EngineFactory = Callable[[str, "str | None"], Engine]


@dataclass(frozen=True)
class UsedRun:
    """One run a check asked for: who ran it, what, and the (validated) results."""

    engine: str
    label: str
    results: list[RequestResult]
    prompts: list[str]


class SuiteSession:
    """Runs and caches everything checks need. Close it when done."""

    def __init__(self, settings: SuiteSettings, engine_factory: EngineFactory | None = None, *,
                 progress: Printer | None = None, heartbeat_s: float | None = None, flag_prefix: str = "--") -> None:
        self.settings = settings
        self.flag_prefix = flag_prefix  # how messages spell options: "--budgets" (CLI), "--ddtree-budgets" (pytest)
        self._factory = engine_factory or self._default_factory
        self._engines: dict[tuple, Engine] = {}
        self._engine_info: dict[int, tuple[str, PairLimits]] = {}  # id(engine) -> (name, pair limits)
        self._runs: dict[tuple, list[RequestResult]] = {}
        self._scratch = tempfile.TemporaryDirectory(prefix="ddtree-suite-")
        self.progress, self.heartbeat_s = progress, heartbeat_s
        self.failure: EngineDied | None = None  # the engine could not start or died: nothing more runs
        self._caps: Capabilities | None = None
        self._caps_error: Exception | None = None
        self._support_error: Exception | None = None
        self._support_checked = False
        self._used: list[UsedRun] | None = None
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)

    # -- engines ---------------------------------------------------------------------------
    def _default_factory(self, model_dir: str, drafter_dir: str | None) -> Engine:
        s = self.settings
        from ddtree_conformance.adapters.registry import create_engine, resolve_engine

        resolve_engine(s.engine, s.engine_options)  # unknown engine or option: a usage error, nothing started
        if s.isolate:
            from ddtree_conformance.adapters.process import IsolatedEngine

            return IsolatedEngine(s.engine, model_dir, drafter_dir, timeout_s=s.engine_timeout_s,
                                  start_timeout_s=s.engine_timeout_s, torch_threads=s.torch_threads,
                                  **s.engine_options)
        return create_engine(s.engine, model_dir, drafter_dir, **s.engine_options)

    def _fail(self, exc: EngineDied) -> EngineDied:
        if self.failure is None:
            self.failure = exc
        return exc

    def dead_again(self) -> EngineDied:
        """What every call after the engine's failure raises: one line naming the first cause."""
        first = str(self.failure).split("\n", 1)[0]
        return EngineDied(f"not run: engine {self.settings.engine!r} failed earlier and is not restarted: {first}")

    def _heartbeat(self, name: str, what: str) -> Heartbeat:
        return Heartbeat(self.progress, name, what, self.heartbeat_s)

    def engine_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        key = (str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if key not in self._engines:
            if self.failure is not None:
                raise self.dead_again()
            name = self.settings.engine
            try:
                with self._heartbeat(name, "start"):
                    engine = self._factory(*key)
            except (EngineUsageError, EngineDied) as exc:
                if isinstance(exc, EngineDied):
                    self._fail(exc)
                raise
            except Exception as exc:  # an in-process engine that cannot be built: it cannot start
                raise self._fail(EngineDied(f"engine {name!r} failed to start: {type(exc).__name__}: {exc}")) from exc
            self._engines[key] = engine
            self._engine_info[id(engine)] = (name, PairLimits.read(*key))
        return self._engines[key]

    def reference_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        """The in-process reference engine on a pair: the oracle for acceptance comparisons."""
        from ddtree_conformance.adapters.reference.engine import ReferenceEngine

        key = ("oracle", str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if key not in self._engines:
            self._engines[key] = ReferenceEngine(*key[1:])
            self._engine_info[id(self._engines[key])] = ("reference (oracle)", PairLimits.read(*key[1:]))
        return self._engines[key]

    @property
    def engine(self) -> Engine:
        return self.engine_for(self.settings.model_dir, self.settings.drafter_dir)

    @property
    def capabilities(self) -> Capabilities:
        """The engine's capabilities, asked once; a failure (a hang, an error) is kept and re-raised."""
        if self._caps is None and self._caps_error is None:
            if self.failure is not None:
                raise self.dead_again()
            engine, name = self.engine, self.settings.engine
            try:
                with self._heartbeat(name, "start and capabilities()"):
                    caps = engine.capabilities()
                if not isinstance(caps, Capabilities):
                    raise TypeError(f"returned {type(caps).__name__}, not Capabilities")
                self._caps = caps
            except EngineDied as exc:
                self._caps_error = self._fail(exc)
            except EngineUsageError as exc:
                self._caps_error = exc
            except Exception as exc:
                self._caps_error = self._fail(EngineDied(f"engine {name!r}: capabilities() failed: "
                                                         f"{type(exc).__name__}: {exc}"))
        if self._caps_error is not None:
            raise self._caps_error
        return self._caps

    def require_support(self) -> None:
        """Refuse, before any check runs, settings the engine says it cannot run here: one
        :class:`~ddtree_conformance.settings.SettingsError` naming the option and the engine's limit.
        The outcome is kept: a second call raises the same error at once."""
        if not self._support_checked:
            try:
                self._require_support()
            except Exception as exc:
                self._support_error = exc
            self._support_checked = True
        if self._support_error is not None:
            raise self._support_error

    def _require_support(self) -> None:
        from .calibration import CalibrationError
        from .settings import SettingsError
        from .token_scoring import rules_for

        if self.settings.dtype != "float32":  # a broken calibration is bad input: refuse it up front, named
            try:
                rules_for(self)
            except CalibrationError as exc:
                raise SettingsError(str(exc)) from None
        s, caps = self.settings, self.capabilities
        who = f"engine {caps.name!r}"
        p = self.flag_prefix
        if s.dtype not in caps.dtypes:
            raise SettingsError(f"{p}dtype {s.dtype}: {who} supports {', '.join(caps.dtypes)} here")
        kind = s.device.split(":", 1)[0]
        if s.device not in caps.devices and kind not in caps.devices:
            raise SettingsError(f"{p}device {s.device}: {who} can use {', '.join(caps.devices) or 'no device'} here")
        if s.tensor_parallel_size > caps.max_tensor_parallel:
            raise SettingsError(f"{p}tensor-parallel-size {s.tensor_parallel_size}: {who} accepts at most "
                                f"{caps.max_tensor_parallel} here (capabilities().max_tensor_parallel)")
        if "ddtree" in s.modes and "ddtree" in caps.modes and caps.max_budget is not None:
            too_big = [b for b in s.budgets if b > caps.max_budget]
            if too_big:
                raise SettingsError(f"{p}budgets {','.join(map(str, too_big))}: {who} accepts budgets up to "
                                    f"{caps.max_budget} (capabilities().max_budget)")

    # -- inputs ----------------------------------------------------------------------------
    @cached_property
    def prompts(self):
        from .prompts import load_prompts

        from .prompts import format_prompts

        prompts = load_prompts(self.settings.prompt_set, tokenizer_dir=self.settings.model_dir)
        prompts = format_prompts(prompts, self.settings.model_dir, self.settings.prompt_format)
        return prompts[: self.settings.limit] if self.settings.limit else prompts

    def requests(self, **overrides) -> list[Request]:
        base = {"max_new_tokens": self.settings.max_new_tokens}
        base.update(overrides)
        return [Request(prompt_ids=p.prompt_ids, **base) for p in self.prompts]

    def config(self, mode: Mode, budget: int | None = None, **flags) -> RunConfig:
        flags.setdefault("tensor_parallel_size", self.settings.tensor_parallel_size)
        return RunConfig(
            mode=mode,
            budget=budget or 1,
            dtype=self.settings.dtype,
            device=self.settings.device,
            **flags,
        )

    # -- runs ------------------------------------------------------------------------------
    def run(
        self,
        mode: Mode,
        budget: int | None = None,
        *,
        trace: bool = False,
        requests: list[Request] | None = None,
        engine: Engine | None = None,
        trace_draft_logits: bool = False,
        tensor_parallel_size: int | None = None,
    ) -> list[RequestResult]:
        """Results for ``requests`` (default: the prompt set) under one configuration, memoised.

        ``tensor_parallel_size`` defaults to the settings' (the TP check asks for 1 and N).
        """
        requests = requests if requests is not None else self.requests()
        engine = engine or self.engine
        trace_draft_logits = trace_draft_logits and trace
        tp = tensor_parallel_size or self.settings.tensor_parallel_size
        key = (
            id(engine),
            mode,
            budget if mode == "ddtree" else None,
            trace,
            trace_draft_logits,
            tp,
            tuple(r.model_dump_json() for r in requests),
        )
        if key not in self._runs:
            if self.failure is not None:
                raise self.dead_again()
            config = self.config(mode, budget, trace=trace, trace_draft_logits=trace_draft_logits,
                                 tensor_parallel_size=tp)
            self._runs[key] = self._generate(engine, requests, config)
        if self._used is not None:
            name = self._engine_info.get(id(engine), (self.settings.engine, None))[0]
            label = mode if mode != "ddtree" else f"ddtree-B{budget}"
            self._used.append(UsedRun(name, label, self._runs[key], self.labels(requests)))
        return self._runs[key]

    def _generate(self, engine: Engine, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """One engine call, validated (module doc). An exception the engine raises (it keeps running)
        becomes one error result per request; :class:`EngineDied` stops the session."""
        name, limits = self._engine_info.get(id(engine), (getattr(engine, "name", "engine"), PairLimits()))
        oracle = name.endswith("(oracle)")
        try:
            with self._heartbeat(name, f"generate {len(requests)} request{'' if len(requests) == 1 else 's'} "
                                       f"({config.mode}{f', B={config.budget}' if config.mode == 'ddtree' else ''})"):
                results = engine.generate(requests, config)
        except EngineDied as exc:
            raise self._fail(exc)
        except Exception as exc:
            message = f"engine {name!r} raised {type(exc).__name__}: {exc}"
            return [error_result(message) for _ in requests]
        caps = engine.capabilities() if oracle else self.capabilities
        return validate_results(requests, results, config, limits, caps, self.labels(requests), name)

    def labels(self, requests: list[Request]) -> list[str]:
        """How messages name each request: its prompt id when it is a prompt of the set."""
        try:
            ids = {tuple(p.prompt_ids): p.id for p in self.prompts}
        except Exception:  # the prompt set cannot be read: name requests by their ids
            ids = {}
        out = []
        for r in requests:
            pid = ids.get(tuple(r.prompt_ids))
            if pid is not None:
                out.append(f"prompt {pid}")
            else:
                shown = ", ".join(map(str, r.prompt_ids[:6])) + (", ..." if len(r.prompt_ids) > 6 else "")
                out.append(f"prompt ids [{shown}]")
        return out

    @contextlib.contextmanager
    def watch(self) -> Iterator[list[UsedRun]]:
        """Note every run asked for inside the block (memoised or not) in the yielded list."""
        previous, self._used = self._used, []
        try:
            yield self._used
        finally:
            used, self._used = self._used, previous
            if previous is not None:
                previous.extend(used)

    def plain(self) -> list[RequestResult]:
        return self.run("plain")

    @cached_property
    def scorer(self):
        """fp32 re-scorer of the target, on the session's device."""
        from .scorer import TargetScorer

        return TargetScorer(self.settings.model_dir, "float32", self.settings.device)

    @property
    def exact(self) -> bool:
        """fp32 comparisons are exact; bf16/fp16 use the near-tie rule."""
        return self.settings.dtype == "float32"

    @cached_property
    def near_tie_bound(self) -> float:
        from .calibration import near_tie_bound

        if self.settings.near_tie_bound is not None:
            return self.settings.near_tie_bound
        return near_tie_bound(self.settings.model_dir, self.settings.dtype)

    @property
    def scratch(self) -> Path:
        return Path(self._scratch.name)

    def close(self) -> None:
        for engine in self._engines.values():
            try:
                engine.close()
            except Exception:  # closing must never mask a check's result
                pass
        self._engines.clear()
        self._scratch.cleanup()
