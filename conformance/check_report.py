"""The check report's content, the same from the CLI (``ddtree-conformance check``) and the pytest route.

:func:`finish_check_report` turns the planned checks' results into the report's ``counts``,
``results``, ``coverage`` (:mod:`ddtree_conformance.coverage`), ``verdict`` (pass, fail or
incomplete, with one line saying why) and ``engine`` (the engine's own ``capabilities().name`` and
``version`` next to the spec it was named by). Writing and rendering it is :mod:`ddtree_conformance.report`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .checks.result import CheckResult
from .checks.runner import PlannedCheck
from .coverage import Coverage, Entry, coverage, verdict

__all__ = ["entries_of", "engine_identity", "finish_check_report", "counts_of"]


def entries_of(checks: Sequence[PlannedCheck], results: Sequence[CheckResult]) -> list[Entry]:
    """Each result with its check's family and mode (results matched to checks by id)."""
    planned = {c.id: c for c in checks}
    entries = []
    for result in results:
        check = planned.get(result.check)
        family = check.family if check else result.check.split("/", 1)[0]
        mode = check.judged_run.mode if check and check.judged_run else None
        entries.append(Entry(family, mode, result))
    return entries


def engine_identity(session) -> dict[str, str]:
    """``{"spec", "name", "version"}``: how the engine was named, and what it says it is (when it started)."""
    identity = {"spec": session.settings.engine, "name": "", "version": ""}
    if session.failure is None and session.engines.started() is not None:
        try:
            caps = session.capabilities
        except Exception:  # an engine that cannot answer: the spec is all the report can name
            return identity
        identity.update(name=caps.name, version=caps.version)
    return identity


def counts_of(results: Sequence[CheckResult]) -> dict[str, int]:
    counts = {s: sum(r.status == s and not r.details.get("not_run") for r in results) for s in ("pass", "fail", "skip")}
    counts["not_run"] = sum(bool(r.details.get("not_run")) for r in results)
    return counts


def finish_check_report(
    partial: dict[str, Any],
    entries: Sequence[Entry],
    *,
    allow_skip: Sequence[str] = (),
    runs: list | None = None,
    engine: dict | None = None,
    elapsed_s: float | None = None,
    engine_failure: tuple[str, str] | None = None,
    allow_skip_notes: Sequence[str] = (),
) -> tuple[dict[str, Any], Coverage, dict]:
    """The complete check report, its coverage and its verdict. ``engine_failure``: (message, log tail);
    ``allow_skip_notes``: the ``--allow-skip`` names this run does not plan
    (:func:`~ddtree_conformance.coverage.check_allow_skip`)."""
    results = [e.result for e in entries]
    cover = coverage(entries, allow_skip)
    found = verdict(results, cover, engine_failure[0] if engine_failure else None)
    report = dict(partial)
    report.pop("partial", None)
    report.update(
        {
            "counts": counts_of(results),
            "results": [r.model_dump() for r in results],
            "runs": runs or [],
            "coverage": {**cover.as_dict(), "allow_skip_notes": list(allow_skip_notes)},
            "verdict": found,
        }
    )
    if engine is not None:
        report["engine"] = engine
    if elapsed_s is not None:
        report["elapsed_s"] = round(elapsed_s, 2)
    if engine_failure is not None:
        report["engine_failure"] = {"message": engine_failure[0], "log_tail": engine_failure[1]}
    return report, cover, found
