"""Shared pieces of the engine tier tests (tests/test_*_tier.py), and the pytest plugin they load.

* :func:`run_checks` plans and runs checks on a session; :func:`fixture_golden` loads the golden file.
* :func:`vllm_tier_settings`: the settings every vLLM tier session on the fixture pair shares
  (tests/test_vllm_tier.py, tests/test_vllm_plugin_tier.py, scripts/vllm_context_probe.py);
  :data:`VLLM_PLUGIN_TIER_RUN_SEED` the plugin tier's fixed run seed.
* :class:`TierSummary`: the numbers a tier measured. A tier module declares one per summary file
  (``SUMMARY = TierSummary("VLLM_TIER_SUMMARY")``) and its tests fill it in; at the end of the run
  the terminal-summary hook writes every summary whose environment variable names a file, as JSON.
  Summaries that share a file are merged (``key`` nests one under that key), so no test depends on
  running last and none asserts nothing.
* :class:`SharedEngines` (fixture ``tier_engines``): suite engines shared by the sessions of a
  tier, one per (engine, pair, engine options, threads). An engine process and the models it
  loaded then serve every session that asks for the same engine: fp32 and bf16, stock and plugin
  checks. Sessions borrow them (their ``close`` leaves the engine running); the fixture closes them
  when the test run ends.

Tier modules load this plugin with ``pytest_plugins = ["ddtree_conformance.testing.tiers"]``.
Summaries are written by the process that ran the tests: run tiers without ``-n`` (xdist) to get them.
(PYTEST_DONT_REWRITE: tier modules import this module before pytest registers it as a plugin.)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest

from ddtree_conformance.adapters.interface import Capabilities, Engine, Request, RequestResult, RunConfig
from ddtree_conformance.adapters.process import IsolatedEngine
from ddtree_conformance.adapters.registry import create_engine
from ddtree_conformance.checks import plan, run_plan
from ddtree_conformance.golden_files import load_golden
from ddtree_conformance.session import SuiteSession, SuiteSettings

__all__ = [
    "run_checks",
    "fixture_golden",
    "TierSummary",
    "SharedEngines",
    "tier_engines",
    "write_summaries",
    "VLLM_TIER_ENGINE_OPTIONS",
    "VLLM_PLUGIN_TIER_RUN_SEED",
    "vllm_tier_settings",
]

#: The engine options of every vLLM tier session on the fixture pair (tests/test_vllm_tier.py and
#: tests/test_vllm_plugin_tier.py), so they share one engine process: DDTree budgets up to 128 on
#: one LLM (budget per request), and plain and speculative LLMs both kept alive.
VLLM_TIER_ENGINE_OPTIONS = {"ddtree_max_budget": 128, "live_llms": 2}
#: The plugin tier's run seed (tests/test_vllm_plugin_tier.py, scripts/vllm_context_probe.py). One fixed
#: run seed, so CI gives one verdict per commit: with a fresh seed per run, 2 of the last 3 clean-clone runs
#: passed and one drew a held-out prompt whose B=128 cut rounds read as "stops early" and a drawn T=0.12
#: whose chi-square failed (p = 5.3e-06): open findings in the notes of 2026-12-01.
VLLM_PLUGIN_TIER_RUN_SEED = 1234


def vllm_tier_settings(**fields) -> SuiteSettings:
    """Settings of a vLLM tier session: engine ``vllm`` isolated in a child process (900 s timeout), the
    fixture pair and its prompt set, fp32, 64 new tokens, one torch thread, :data:`VLLM_TIER_ENGINE_OPTIONS`;
    ``fields`` set the rest (modes, budgets, run seed, ...) or override any of these."""
    base = dict(
        engine="vllm",
        dtype="float32",
        max_new_tokens=64,
        isolate=True,
        engine_timeout_s=900.0,
        pair_name="fixture",
        prompt_set="fixture",
        torch_threads=1,
        engine_options=VLLM_TIER_ENGINE_OPTIONS,
    )
    return SuiteSettings(**{**base, **fields})


def run_checks(session: SuiteSession, only: list[str] | None, **settings) -> dict:
    """Plan (settings overridden by ``settings``) and run the checks; results by check id, and seconds."""
    checks = plan(session.settings.model_copy(update=settings), only=only)
    start = time.time()
    results = {c.id: r for c, r in zip(checks, run_plan(session, checks))}
    return {"results": results, "seconds": time.time() - start}


def fixture_golden(settings: SuiteSettings, max_new_tokens: int):
    """The golden file for ``settings`` (pair, prompt set, dtype); it must cover ``max_new_tokens``."""
    golden = load_golden(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)
    assert golden is not None and golden.max_new_tokens >= max_new_tokens, "golden file missing or too short"
    return golden


# -- summaries -------------------------------------------------------------------------------------
_SUMMARIES: list[TierSummary] = []


class TierSummary(dict):
    """A tier's measured numbers, written to the file named by ``$env`` when the run ends
    (under ``key`` when several tiers share the file)."""

    def __init__(self, env: str, key: str | None = None) -> None:
        super().__init__()
        self.env = env
        self.key = key
        _SUMMARIES.append(self)


def write_summaries(summaries: list[TierSummary] | None = None) -> list[str]:
    """Write each summary whose environment variable is set; returns the files written."""
    by_path: dict[str, dict] = {}
    for summary in _SUMMARIES if summaries is None else summaries:
        path = os.environ.get(summary.env)
        if not path or not summary:
            continue
        merged = by_path.setdefault(path, {})
        if summary.key is None:
            merged.update(summary)
        else:
            merged.setdefault(summary.key, {}).update(summary)
    for path, data in by_path.items():
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, default=str)
    return sorted(by_path)


def pytest_terminal_summary(terminalreporter) -> None:
    for path in write_summaries():
        terminalreporter.write_line(f"tier summary: {path}")


# -- engines shared by a tier's sessions -------------------------------------------------------------
class _Borrowed(Engine):
    """A session's handle on a shared engine: everything but ``close`` goes to the engine."""

    OPTIONS = None  # the shared engine checked its own options when it was built

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.model_dir, engine.drafter_dir, **engine.options)
        self.engine = engine
        self.name = engine.name

    def capabilities(self) -> Capabilities:
        return self.engine.capabilities()

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        return self.engine.generate(requests, config)

    def close(self) -> None:  # the owner (SharedEngines) closes the engine
        pass


class SharedEngines:
    """Suite engines shared by sessions: one per (engine, model, drafter, options, threads, timeout,
    isolation). ``SuiteSession(settings, engine_factory=shared.factory(settings))``."""

    def __init__(self) -> None:
        self._engines: dict[tuple, Engine] = {}

    def factory(self, settings: SuiteSettings) -> Callable[[str, str | None], Engine]:
        def make(model_dir: str, drafter_dir: str | None) -> Engine:
            key = (
                settings.engine,
                str(model_dir),
                None if drafter_dir is None else str(drafter_dir),
                json.dumps(settings.engine_options, sort_keys=True, default=str),
                settings.torch_threads,
                settings.engine_timeout_s,
                settings.isolate,
            )
            if key not in self._engines:
                self._engines[key] = self._create(settings, str(model_dir), drafter_dir)
            return _Borrowed(self._engines[key])

        return make

    @staticmethod
    def _create(settings: SuiteSettings, model_dir: str, drafter_dir: str | None) -> Engine:
        drafter = None if drafter_dir is None else str(drafter_dir)
        if settings.isolate:
            return IsolatedEngine(
                settings.engine,
                model_dir,
                drafter,
                timeout_s=settings.engine_timeout_s,
                torch_threads=settings.torch_threads,
                **settings.engine_options,
            )
        return create_engine(settings.engine, model_dir, drafter, **settings.engine_options)

    def __len__(self) -> int:
        return len(self._engines)

    def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            try:
                engine.close()
            except Exception:  # closing must never mask a test's result
                pass


@pytest.fixture(scope="session")
def tier_engines():
    """:class:`SharedEngines` for the whole test run; closed at its end."""
    shared = SharedEngines()
    yield shared
    shared.close()
