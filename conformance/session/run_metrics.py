"""The acceptance metrics of the runs a ``check`` session already made (its report's ``runs``), read
from the session's stored runs: no new engine work."""

from __future__ import annotations

from typing import Any

from ..run import Run

__all__ = ["runs_from_session"]


def runs_from_session(session) -> list[dict[str, Any]]:
    """Acceptance metrics of the speculative runs a ``check`` session already made on its default
    prompt set (no new engine work); one entry per (mode, budget), no throughput."""
    from ..bench import acceptance_summary  # it pulls numpy and scipy: kept out of the CLI's --help path

    engine = session.engines.started()
    if engine is None:
        return []
    default = tuple(r.model_dump_json() for r in session.requests())
    tp = session.settings.tensor_parallel_size
    found: dict[tuple, list] = {}
    for stored in session.runs():
        run = stored.run
        if (
            stored.engine_id == id(engine)
            and run.speculative
            and stored.requests == default
            and run.tensor_parallel_size == tp
            and (run.mode, run.budget) not in found
        ):
            found[(run.mode, run.budget)] = stored.results
    runs = []
    for (mode, budget), results in sorted(found.items(), key=lambda kv: (kv[0][0] != "dflash", kv[0][1] or 0)):
        if any(r.finish_reason == "error" for r in results):
            continue
        runs.append({"mode": mode, "budget": budget, "label": Run(mode, budget).label, **acceptance_summary(results)})
    return runs
