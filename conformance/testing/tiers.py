"""Shared pieces of the engine tier tests (tests/test_*_tier.py): run checks, load the golden file."""

from __future__ import annotations

import time

from ddtree_conformance.checks import plan, run_plan
from ddtree_conformance.golden_files import load_golden
from ddtree_conformance.session import SuiteSession, SuiteSettings

__all__ = ["run_checks", "fixture_golden"]


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
