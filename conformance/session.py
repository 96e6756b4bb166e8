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

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adapters.interface import Capabilities, DType, Engine, Mode, Request, RequestResult, RunConfig

from .paths import FIXTURE_DRAFTER, FIXTURE_TARGET, GOLDEN_DIR

__all__ = ["SuiteSettings", "SuiteSession", "EngineFactory"]

EngineFactory = Callable[[str, "str | None"], Engine]


class SuiteSettings(BaseModel):
    """Everything a conformance run is parameterised by (CLI options and pytest options)."""

    model_config = ConfigDict(extra="forbid")

    engine: str = "reference"
    model_dir: str = str(FIXTURE_TARGET)
    drafter_dir: str | None = str(FIXTURE_DRAFTER)
    pair_name: str = "fixture"
    modes: list[Mode] = Field(default_factory=lambda: ["dflash", "ddtree"])
    budgets: list[int] = Field(default_factory=lambda: [16, 64])
    dtype: DType = "float32"
    device: str = "cpu"
    prompt_set: str = "fixture"
    prompt_format: Literal["ids", "text", "chat"] = Field(
        default="ids", description="how prompts become token ids (conformance.pairs.format_prompts)"
    )
    limit: int | None = Field(default=None, description="use only the first N prompts")
    max_new_tokens: int = Field(default=64, ge=1)
    isolate: bool = True
    timeout_s: float = 900.0
    near_tie_bound: float | None = Field(default=None, description="nats; None: the pair's calibration, else 0.5")
    golden_dir: str = str(GOLDEN_DIR / "records")
    sampling_requests: int = Field(default=200, description="seeded requests per sampling variant")
    branch_rounds: int = Field(default=3, description="rounds per prompt checked branch-vs-chain")
    branch_prompts: int = Field(default=4)
    engine_options: dict = Field(default_factory=dict)
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs the engine shards the target over")
    torch_threads: int | None = Field(
        default=None, description="torch CPU threads in the suite and engine processes (None: torch's default)"
    )


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
            from adapters.process import IsolatedEngine

            return IsolatedEngine(s.engine, model_dir, drafter_dir, timeout_s=s.timeout_s,
                                  torch_threads=s.torch_threads, **s.engine_options)
        from adapters.registry import create_engine

        return create_engine(s.engine, model_dir, drafter_dir, **s.engine_options)

    def engine_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        key = (str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if key not in self._engines:
            self._engines[key] = self._factory(*key)
        return self._engines[key]

    def reference_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        """The in-process reference engine on a pair: the oracle for acceptance comparisons."""
        from adapters.reference.engine import ReferenceEngine

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

    # -- inputs ----------------------------------------------------------------------------
    @cached_property
    def prompts(self):
        from .prompts import load_prompts

        from .pairs import format_prompts

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
