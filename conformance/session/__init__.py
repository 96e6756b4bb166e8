"""A conformance session: the engine under test, the inputs, and the runs checks ask for.

Checks ask the session for runs (``session.run("ddtree", 32, trace=True)``); the session asks the engine
once per distinct (engine, run, requests) and keeps the validated results. Three parts do the work:

* :class:`~.inputs.SuiteInputs`: settings, prompts, requests and runs;
* :class:`~.engines.EngineLifecycle`: starting the engines (in their own process unless ``isolate``
  is off), capabilities, the engine's failure state, and every validated ``generate`` call; checks
  ask it for the reference engine (``session.engines.reference_for``);
* :class:`~.store.RunStore`: memoised results, read through :meth:`~.store.RunStore.runs`, and the
  runs a check used (:meth:`SuiteSession.watch`).

Nothing the engine returns is trusted: every batch passes
:func:`ddtree_conformance.integrity.validate_results` before a check sees it. An engine that cannot
start or dies is recorded in :attr:`SuiteSession.failure`; every later engine call raises at once.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from ..adapters.interface import Capabilities, Engine, EngineDied, Mode, Request, RequestResult, RunConfig
from ..calibration import CalibrationError
from ..integrity import error_result
from ..progress import Printer
from ..run import Run
from ..settings import SettingsError, SuiteSettings
from ..token_scoring import rules_for
from .engines import EngineFactory, EngineInfo, EngineLifecycle, EngineRole
from .inputs import SuiteInputs
from .mixing import RequestMixer, changed_companions
from .store import RunStore, StoredRun, StoreKey, UsedRun

__all__ = ["SuiteSettings", "SuiteSession", "EngineFactory", "EngineRole", "EngineInfo", "UsedRun", "StoredRun"]


class SuiteSession:
    """Runs and caches everything checks need. Close it when done."""

    def __init__(
        self,
        settings: SuiteSettings,
        engine_factory: EngineFactory | None = None,
        *,
        progress: Printer | None = None,
        heartbeat_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.inputs = SuiteInputs(settings)
        self.engines = EngineLifecycle(settings, engine_factory, progress=progress, heartbeat_s=heartbeat_s)
        self.store = RunStore()
        self.mixer = RequestMixer(settings.run_seed or 0)
        self._scratch = tempfile.TemporaryDirectory(prefix="ddtree-suite-")
        if settings.torch_threads:
            import torch

            torch.set_num_threads(settings.torch_threads)

    # -- the engine under test (EngineLifecycle) ------------------------------------------------
    @property
    def failure(self) -> EngineDied | None:
        return self.engines.failure

    def dead_again(self) -> EngineDied:
        return self.engines.dead_again()

    @property
    def engine(self) -> Engine:
        return self.engines.engine

    def engine_for(self, model_dir: str, drafter_dir: str | None) -> Engine:
        return self.engines.engine_for(model_dir, drafter_dir)

    @property
    def capabilities(self) -> Capabilities:
        return self.engines.capabilities

    def require_support(self) -> None:
        """Refuse, before any check runs, what this run cannot do: a broken calibration of the run's dtype
        (bad input, named) and settings beyond the engine's capabilities (one ``SettingsError``). The noise
        model is read before the engine starts; the prompt set is read, and the held-out prompts drawn,
        once the engine is known to support the run (:meth:`.inputs.SuiteInputs.prepare`)."""

        def check_inputs() -> None:
            try:
                rules_for(self.settings)
            except CalibrationError as exc:
                raise SettingsError(str(exc)) from None

        self.engines.require_support(check_inputs)
        self.inputs.prepare()  # the prompts every check runs on, read and drawn once before the first

    # -- inputs (SuiteInputs) --------------------------------------------------------------------
    @property
    def prompts(self):
        return self.inputs.prompts

    def requests(self, **overrides) -> list[Request]:
        return self.inputs.requests(**overrides)

    def labels(self, requests: list[Request]) -> list[str]:
        return self.inputs.labels(requests)

    def config(self, mode: Mode, budget: int | None = None) -> RunConfig:
        return self.run_config(self.inputs.run(mode, budget))

    def run_config(self, run: Run) -> RunConfig:
        """What the engine is told of ``run``: the run itself, in this session's dtype and on its device."""
        return RunConfig(
            mode=run.mode,
            budget=run.budget or 1,
            dtype=self.settings.dtype,
            device=self.settings.device,
            trace=run.trace,
            trace_draft_logits=run.draft_logits,
            tensor_parallel_size=run.tensor_parallel_size,
            cuda_graphs=run.cuda_graphs,
        )

    @property
    def scorer(self):
        return self.inputs.scorer

    # -- runs (RunStore) -------------------------------------------------------------------------
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
        together: bool = False,
    ) -> list[RequestResult]:
        """Results for ``requests`` (default: the prompt set) under one configuration, memoised
        (:meth:`results`). ``tensor_parallel_size`` defaults to the settings' (the TP check asks for 1 and N)."""
        tp = tensor_parallel_size or self.settings.tensor_parallel_size
        run = Run(mode, budget, trace=trace, draft_logits=trace_draft_logits, tensor_parallel_size=tp)
        return self.results(run, requests, engine, together=together)

    def results(
        self, run: Run, requests: list[Request] | None = None, engine: Engine | None = None, *, together: bool = False
    ) -> list[RequestResult]:
        """Results of ``run`` for ``requests`` (default: the prompt set) on ``engine`` (default: the
        engine under test), memoised; validated by the integrity rules. The engine gets them shuffled
        and mixed with other checks' requests (:mod:`.mixing`), unless ``together``: then it gets
        exactly this batch, in this order (checks about batching). In float32 a companion whose greedy
        output changed with its company fails the check that saw it: it is noted as a used run holding
        one error result."""
        config = self.run_config(run)
        requests = requests if requests is not None else self.inputs.requests()
        labels = self.inputs.labels(requests)
        engine = engine or self.engines.engine
        key = StoreKey.of(id(engine), run, requests)
        results = self.store.get(key)
        if results is None:
            if self.failure is not None:
                raise self.dead_again()
            arrangement, companion_labels = None, []
            if not together and requests:
                pool = [pair for pair in self.store.answered(id(engine), run) if pair[0] not in requests]
                arrangement = self.mixer.arrange(requests, pool)
                companion_labels = self.inputs.labels([request for request, _ in arrangement.companions])
            results, again = self.engines.generate(engine, requests, config, labels, arrangement, companion_labels)
            info = self.engines.info(engine)
            if arrangement is not None and self.settings.dtype == "float32":
                for label, message in changed_companions(arrangement, again, companion_labels, run.label):
                    self.store.note_use(info, run, [error_result(message)], [label])
            self.store.put(key, info, requests, results)
        self.store.note_use(self.engines.info(engine), run, results, labels)
        return results

    def plain(self) -> list[RequestResult]:
        return self.run("plain")

    def runs(self) -> Iterator[StoredRun]:
        """Every run the session made (the store's public read API)."""
        return self.store.runs()

    def watch(self) -> AbstractContextManager[list[UsedRun]]:
        """Note every run asked for inside the block (memoised or not) in the yielded list."""
        return self.store.watch()

    @property
    def scratch(self) -> Path:
        return Path(self._scratch.name)

    def close(self) -> None:
        self.engines.close()
        self._scratch.cleanup()
