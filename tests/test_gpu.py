"""GPU tier (``pytest -m gpu``): the conformance suite on CUDA, on the chosen model pair.

The pair is ``--ddtree-pair NAME`` or ``$DDTREE_PAIR`` (default ``fixture``; registry in
:mod:`ddtree_conformance.pairs`, more pairs from ``--ddtree-pairs-file`` / ``$DDTREE_PAIRS_FILE``). A pair whose
models are not on this machine (a hub pair without its cache and without network) skips every
pair-dependent test with one reason.

* every registered engine (reference, vllm, sglang, entry points; ``--gpu-engines`` narrows it):
  the conformance plan on CUDA in float32 and bfloat16, one item per planned check, on the first
  ``--gpu-limit`` prompts (default 20; 0: every prompt of the pair). For the reference engine that
  is fp32 greedy output equal to plain exactly and bf16 equal up to a near-tie first divergence
  (doc §7), golden files, acceptance, trees, edges, branch-vs-chain. Sampling (the chi-square
  transition test) runs once per engine, in float32, with ``--gpu-sampling-requests`` seeded
  requests per variant (default 40; the CPU tier uses 200). An engine that does not import here,
  or whose ``capabilities()`` lack CUDA or the dtype, is skipped with that reason. The plan
  includes the tensor-parallel check (TP=1 vs TP=N, N from ``--tensor-parallel-size``, the pair,
  or the GPUs visible to this worker); it skips for engines with ``max_tensor_parallel`` 1. The
  reference engine shards over the visible GPUs (NCCL ranks), so with two or more GPUs per worker
  its TP check runs;
* with pytest-xdist (``-n auto``: one worker per GPU), each worker sees only its own GPUs.
"""

from __future__ import annotations

import os

import pytest
import torch

from ddtree_conformance.adapters.interface import EngineDied, EngineError
from ddtree_conformance.adapters.registry import list_engines, load_engine_class
from ddtree_conformance.checks import plan
from ddtree_conformance.checks.runner import one_line
from ddtree_conformance.checks.sampling import check_sampling
from ddtree_conformance.pairs import DEFAULT_PAIR, PairUnavailable, get_pair, resolve_pair
from ddtree_conformance.pytest_plugin import raw_options
from ddtree_conformance.session import SuiteSession
from ddtree_conformance.settings import SettingsError, SuiteSettings, build_settings
from ddtree_conformance.xdist_gpus import parse_visible_devices

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")]

GPU_DTYPES = ("float32", "bfloat16")
DEFAULT_GPU_LIMIT = 20
DEFAULT_GPU_SAMPLING_REQUESTS = 40
GPU_BUDGETS = "16,64,256,1024"  # the paper's range reaches 1024; the CPU tier stops at 256
ENGINES_ENV = "DDTREE_GPU_ENGINES"


# -- the pair ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def gpu_pair(pytestconfig):
    """The chosen pair (``--ddtree-pair`` / ``$DDTREE_PAIR``, default fixture), resolved to local
    directories (or every test using it skips, with the reason)."""
    raw = raw_options(pytestconfig)
    try:
        resolved = resolve_pair(get_pair(raw["pair"] or DEFAULT_PAIR, raw["pairs_file"]))
    except PairUnavailable as exc:
        pytest.skip(str(exc))
    return resolved


# -- every registered engine: the conformance plan on CUDA -------------------------------------
def _engines(config: pytest.Config) -> list[str]:
    chosen = config.getoption("--gpu-engines") or os.environ.get(ENGINES_ENV)
    if chosen:
        return [name.strip() for name in chosen.split(",") if name.strip()]
    return [entry.name for entry in list_engines()]


def _plan_settings(config: pytest.Config) -> SuiteSettings:
    """Only modes and budgets shape the plan (``--ddtree-modes``, ``--ddtree-budgets``; GPU tier default
    budgets 16,64,256,1024); no model is touched at collection."""
    raw = raw_options(config)
    try:
        settings, _ = build_settings({"modes": raw["modes"], "budgets": raw["budgets"] or GPU_BUDGETS})
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None
    return settings


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpu_check" not in metafunc.fixturenames:
        return
    checks = plan(_plan_settings(metafunc.config))
    params = []
    for engine in _engines(metafunc.config):
        for dtype in GPU_DTYPES:
            params += [
                pytest.param(engine, dtype, check, id=f"{engine}-{dtype}|{check.id}")
                for check in checks
                if check.function is not check_sampling or dtype == "float32"  # sampling once per engine, in fp32
            ]
    metafunc.parametrize("engine_name,dtype,gpu_check", params)


class EngineSessions:
    """The suite session of one (engine, dtype) at a time: an engine holds GPU memory until closed."""

    def __init__(self, config: pytest.Config, resolved) -> None:
        self.config, self.resolved = config, resolved
        self.key: tuple[str, str] | None = None
        self.session: SuiteSession | None = None
        self.skip: str | None = None
        self.error: str | None = None

    def _limit(self) -> int | None:
        asked = self.config.getoption("--gpu-limit")
        asked = DEFAULT_GPU_LIMIT if asked is None else asked
        pair_limit = self.resolved.pair.limit
        if asked == 0:
            return pair_limit
        return asked if pair_limit is None else min(asked, pair_limit)

    def get(self, engine: str, dtype: str) -> SuiteSession:
        if (engine, dtype) != self.key:
            self.close()
            self.key = (engine, dtype)
            self._open(engine, dtype)
        if self.skip:
            pytest.skip(self.skip)
        if self.error:
            pytest.fail(self.error, pytrace=False)
        return self.session

    def _open(self, engine: str, dtype: str) -> None:
        try:
            load_engine_class(engine)
        except EngineError as exc:
            self.skip = str(exc).splitlines()[0]
            return
        raw = raw_options(self.config)
        planned = _plan_settings(self.config)
        settings = SuiteSettings(
            **self.resolved.suite_settings(
                engine=engine,
                dtype=dtype,
                device="cuda",
                limit=self._limit(),
                modes=planned.modes,
                budgets=planned.budgets,
                tensor_parallel_size=raw["tensor_parallel_size"],
                engine_timeout_s=raw["engine_timeout_s"],
                torch_threads=raw["torch_threads"] or None,
                engine_options=raw["engine_options"],
                sampling_requests=self.config.getoption("--gpu-sampling-requests") or DEFAULT_GPU_SAMPLING_REQUESTS,
            )
        )
        session = SuiteSession(settings)
        try:
            caps = session.capabilities
        except Exception as exc:  # installed, but it cannot start here: every check of it fails
            session.close()
            self.error = f"engine {engine!r} did not start on CUDA: {type(exc).__name__}: {exc}"
            return
        if not any(device.split(":", 1)[0] == "cuda" for device in caps.devices):
            self.skip = f"engine {engine!r}: capabilities().devices is {caps.devices}, no cuda here"
        elif dtype not in caps.dtypes:
            self.skip = f"engine {engine!r}: capabilities().dtypes {caps.dtypes} lack {dtype}"
        if self.skip:
            session.close()
            return
        self.session = session

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.key, self.session, self.skip, self.error = None, None, None, None


@pytest.fixture(scope="session")
def engine_sessions(pytestconfig, gpu_pair):
    sessions = EngineSessions(pytestconfig, gpu_pair)
    yield sessions
    sessions.close()


def test_conformance_on_cuda(engine_sessions, engine_name, dtype, gpu_check):
    session = engine_sessions.get(engine_name, dtype)
    try:
        result = gpu_check.run(session)
    except EngineDied as exc:  # as the suite does: the cause in one line, the engine's log tail, no traceback
        tail = f"\n{exc.log_tail}" if getattr(exc, "log_tail", "") else ""
        pytest.fail(f"engine {engine_name} ({dtype}) stopped: {one_line(exc)}{tail}", pytrace=False)
    print(f"{engine_name} {dtype} {gpu_check.id}: {result.status}: {result.message}")
    if result.status == "skip":
        pytest.skip(result.message)
    if result.status == "fail":
        pytest.fail(result.message, pytrace=False)


# -- this worker's GPUs ------------------------------------------------------------------------
def test_worker_sees_only_its_gpus():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    count = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    print(f"{worker}: CUDA_VISIBLE_DEVICES={visible} -> {count} device(s) {names}")
    listed = parse_visible_devices(visible)
    if listed is not None:
        assert count == len(listed), f"{worker}: CUDA_VISIBLE_DEVICES={visible} but CUDA sees {count} devices"
    if worker != "main" and count:
        assert visible is not None, f"{worker}: xdist worker on a GPU machine without CUDA_VISIBLE_DEVICES set"


# -- the reference engine's fast path ----------------------------------------------------------
@pytest.mark.parametrize("device_tree", ["off", "on", "auto"])
@pytest.mark.parametrize("mode, budget", [("plain", 1), ("dflash", 1), ("ddtree", 16), ("ddtree", 256)])
def test_reference_fast_path_equals_eager_in_fp32(mode, budget, device_tree):
    """CUDA graphs on (static caches, one graph per shape) give the eager path's outputs and per-round
    acceptance exactly in float32, and the graphs really replay (no capture failed); with ``device_tree``
    on, a DDTree round after its draft is one graph (tree, verify inputs, verify, walk); with ``auto`` (the
    default) too at B = 16, where the beams take one launch, and on the host at B = 256."""
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine
    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
    from ddtree_conformance.prompts import load_prompts

    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree=device_tree)
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=48) for p in load_prompts("fixture")[:6]]
    eager, fast = (
        engine.generate(requests, RunConfig(mode=mode, budget=budget, device="cuda", cuda_graphs=graphs))
        for graphs in (False, True)
    )
    assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
    assert [r.acceptance_lengths for r in fast] == [r.acceptance_lengths for r in eager]
    stats = engine.fast_path_stats()
    assert stats["failure"] is None and stats["captures"] > 0 and stats["replays"] > stats["captures"]
    assert fast[0].engine_settings["cuda_graphs"] and not eager[0].engine_settings["cuda_graphs"]
    if mode == "ddtree":
        timed = engine.generate(requests[:1], RunConfig(mode=mode, budget=budget, device="cuda", timing=True))
        as_one_graph = device_tree == "on" or (device_tree == "auto" and budget <= 64)
        assert ("tree_round" in timed[0].timings.stages) is as_one_graph, timed[0].timings.stages
