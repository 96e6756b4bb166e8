"""Running a plan in tests and scripts: the one helper they share instead of copies.

* :func:`plan_and_run`: plan checks for settings and run them on an engine (an engine class, or any
  ``(model_dir, drafter_dir) -> Engine`` factory; None: the settings' engine), in a session closed after;
* :func:`run_in`: the same on a session the caller holds (to read its memoised runs after);
* :func:`by_family`, :func:`by_id`: its results keyed by check family or check id;
* :func:`fixture_pair_settings`: settings for the fixture pair (the bundled target, drafter and prompt set),
  run in-process;
* :func:`random_pair_settings`: settings for the tiny random pair
  (:mod:`ddtree_conformance.testing.random_pair`) on a fresh random prompt set, run in-process
  (``tests/conftest.py`` wraps it as the ``random_pair_settings`` fixture).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from ddtree_conformance.checks import CheckResult, plan, run_plan
from ddtree_conformance.oracle import hold as hold_oracle
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import EngineFactory, SuiteSession, SuiteSettings

from .random_pair import write_random_prompts

__all__ = ["plan_and_run", "run_in", "by_family", "by_id", "fixture_pair_settings", "random_pair_settings"]


def plan_and_run(
    settings: SuiteSettings,
    engine: EngineFactory | None = None,
    names: Sequence[str] | None = None,
    *,
    exact: bool = False,
    require_support: bool = False,
) -> list[CheckResult]:
    """The results of ``plan(settings, names)`` run on ``engine`` (an engine class is a factory: it is
    called with the pair's model and drafter directories); None runs the settings' engine. ``exact``:
    ``names`` are whole check ids (``sampling/ddtree-B16/T=1`` without ``.../T=1,top_k=3``).
    ``require_support``: what both front ends do before any check: hold the oracle files, then refuse what
    the run cannot do (the noise model and prompts read, the engine started, its capabilities read)."""
    session = SuiteSession(settings, engine_factory=engine)
    try:
        if require_support:
            hold_oracle(session)
            session.require_support()
        return run_in(session, names, exact=exact)
    finally:
        session.close()


def run_in(session: SuiteSession, names: Sequence[str] | None = None, *, exact: bool = False) -> list[CheckResult]:
    """The results of ``plan(session.settings, names)`` run in ``session``, which the caller holds and
    closes: what the checks ran stays memoised there for the caller to read."""
    checks = plan(session.settings, None if names is None else list(names))
    if exact:
        checks = [c for c in checks if c.id in names]
    return run_plan(session, checks)


def by_family(results: Iterable[CheckResult]) -> dict[str, CheckResult]:
    """``{"lossless": result, ...}``: the family is a check id's first part (one run per family)."""
    return {r.check.split("/")[0]: r for r in results}


def by_id(results: Iterable[CheckResult]) -> dict[str, CheckResult]:
    return {r.check: r for r in results}


def _in_process(
    target: str | Path, drafter: str | Path, pair_name: str, prompt_set: str | Path, fields
) -> SuiteSettings:
    base = {"model_dir": str(target), "drafter_dir": str(drafter), "pair_name": pair_name, "isolate": False}
    return SuiteSettings(**{**base, "prompt_set": str(prompt_set), **fields})


def fixture_pair_settings(**fields) -> SuiteSettings:
    """Settings for the fixture pair (target, drafter, pair name "fixture" and its bundled prompt set: the
    settings' defaults, spelled out), run in-process; ``fields`` set or override any other setting."""
    return _in_process(FIXTURE_TARGET, FIXTURE_DRAFTER, "fixture", "fixture", fields)


def random_pair_settings(
    pair: tuple[str | Path, str | Path],
    prompts: str | Path,
    lengths: Sequence[int],
    *,
    seed: int,
    prefix: str,
    **fields,
) -> SuiteSettings:
    """Settings for the random pair ``(target, drafter)`` on random prompts of ``lengths`` tokens, written
    to ``prompts`` (ids ``<prefix>0``, ``<prefix>1``, ...; seeded), pair name "random", run in-process;
    ``fields`` set or override any other setting."""
    write_random_prompts(prompts, list(lengths), seed=seed, prefix=prefix)
    target, drafter = pair
    return _in_process(target, drafter, "random", prompts, fields)
