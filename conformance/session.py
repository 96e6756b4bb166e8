"""A conformance session: the engine under test, its settings, prompts and memoised runs.

Checks ask the session for runs (``session.run("ddtree", 32, trace=True)``); the session asks
the engine once per distinct configuration and keeps the results. The engine runs in its own
process unless ``isolate`` is off (mutant self-tests inject in-process engines).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from .adapters.interface import Capabilities, Engine, Mode, Request, RequestResult, RunConfig
from .settings import SuiteSettings

__all__ = ["SuiteSettings", "SuiteSession", "EngineFactory"]

EngineFactory = Callable[[str, "str | None"], Engine]


class SuiteSession:
    """Runs and caches everything checks need. Close it when done."""

    def __init__(self, settings: SuiteSettings, engine_factory: EngineFactory | None = None) -> None:
        self.settings = settings
        self._factory = engine_factory or self._default_factory
        self._engines: dict[tuple, Engine] = {}
        self._runs: dict[tuple, list[RequestResult]] = {}
        self._scratch = tempfile.TemporaryDirectory(prefix="ddtree-suite-")
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)

    # -- engines ---------------------------------------------------------------------------
    def _default_factory(self, model_dir: str, drafter_dir: str | None) -> Engine:
        s = self.settings
        if s.isolate:
            from ddtree_conformance.adapters.process import IsolatedEngine

            return IsolatedEngine(s.engine, model_dir, drafter_dir, timeout_s=s.engine_timeout_s,
                                  torch_threads=s.torch_threads, **s.engine_options)
        from ddtree_conformance.adapters.registry import create_engine

        return create_engine(s.engine, model_dir, drafter_dir, **s.engine_options)

    def engine_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        key = (str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if key not in self._engines:
            self._engines[key] = self._factory(*key)
        return self._engines[key]

    def reference_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        """The in-process reference engine on a pair: the oracle for acceptance comparisons."""
        from ddtree_conformance.adapters.reference.engine import ReferenceEngine

        key = ("oracle", str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if key not in self._engines:
            self._engines[key] = ReferenceEngine(*key[1:])
        return self._engines[key]

    @property
    def engine(self) -> Engine:
        return self.engine_for(self.settings.model_dir, self.settings.drafter_dir)

    @cached_property
    def capabilities(self) -> Capabilities:
        return self.engine.capabilities()

    def require_support(self) -> None:
        """Refuse, before any check runs, settings the engine says it cannot run here: one
        :class:`~ddtree_conformance.settings.SettingsError` naming the option and the engine's limit."""
        from .settings import SettingsError

        s, caps = self.settings, self.capabilities
        who = f"engine {caps.name!r}"
        if s.dtype not in caps.dtypes:
            raise SettingsError(f"--dtype {s.dtype}: {who} supports {', '.join(caps.dtypes)} here")
        kind = s.device.split(":", 1)[0]
        if s.device not in caps.devices and kind not in caps.devices:
            raise SettingsError(f"--device {s.device}: {who} can use {', '.join(caps.devices) or 'no device'} here")
        if s.tensor_parallel_size > caps.max_tensor_parallel:
            raise SettingsError(f"--tensor-parallel-size {s.tensor_parallel_size}: {who} accepts at most "
                                f"{caps.max_tensor_parallel} here (capabilities().max_tensor_parallel)")
        if "ddtree" in s.modes and "ddtree" in caps.modes and caps.max_budget is not None:
            too_big = [b for b in s.budgets if b > caps.max_budget]
            if too_big:
                raise SettingsError(f"--budgets {','.join(map(str, too_big))}: {who} accepts budgets up to "
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
            config = self.config(mode, budget, trace=trace, trace_draft_logits=trace_draft_logits,
                                 tensor_parallel_size=tp)
            self._runs[key] = engine.generate(requests, config)
        return self._runs[key]

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
