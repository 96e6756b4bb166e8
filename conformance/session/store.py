"""The runs a session made: each (engine, run, requests) asked once, its validated results kept.

:class:`RunStore` memoises results by :class:`StoreKey` and is read through :meth:`RunStore.runs`
(the report's run metrics come from there). While :meth:`RunStore.watch` is active it notes every
run a check asked for (:class:`UsedRun`, memoised or not), so the check runner can fail a check
that consumed a failed result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..adapters.interface import Request, RequestResult
from ..run import Run
from .engines import EngineInfo

__all__ = ["StoreKey", "StoredRun", "UsedRun", "RunStore"]


@dataclass(frozen=True)
class StoreKey:
    """What makes two runs the same: the engine instance, the run and the requests."""

    engine_id: int
    run: Run
    requests: tuple[str, ...]  # each request as JSON

    @classmethod
    def of(cls, engine_id: int, run: Run, requests: list[Request]) -> StoreKey:
        return cls(engine_id, run, tuple(r.model_dump_json() for r in requests))


@dataclass(frozen=True)
class StoredRun:
    """One run the session made: who ran it, what, on which requests, and the validated results."""

    engine: EngineInfo
    engine_id: int
    run: Run
    requests: tuple[str, ...]  # as in its StoreKey
    results: list[RequestResult]
    request_list: tuple[Request, ...] = ()


@dataclass(frozen=True)
class UsedRun:
    """One run a check asked for: who ran it, which run, the (validated) results and how messages
    name each request."""

    engine: EngineInfo
    run: Run
    results: list[RequestResult]
    prompts: list[str]

    @property
    def label(self) -> str:
        return self.run.label


class RunStore:
    """Memoised, validated results of a session's runs (module doc)."""

    def __init__(self) -> None:
        self._runs: dict[StoreKey, StoredRun] = {}
        self._used: list[UsedRun] | None = None

    def get(self, key: StoreKey) -> list[RequestResult] | None:
        """The results stored under ``key``, or None when that run was not made yet."""
        stored = self._runs.get(key)
        return None if stored is None else stored.results

    def put(self, key: StoreKey, engine: EngineInfo, requests: list[Request], results: list[RequestResult]) -> None:
        self._runs[key] = StoredRun(engine, key.engine_id, key.run, key.requests, results, tuple(requests))

    def answered(self, engine_id: int, run: Run) -> list[tuple[Request, RequestResult]]:
        """Every greedy request already answered by one engine in one run, with its result, once each."""
        seen: dict[str, tuple[Request, RequestResult]] = {}
        for stored in self._runs.values():
            if stored.engine_id == engine_id and stored.run == run:
                for text, request, result in zip(stored.requests, stored.request_list, stored.results):
                    if request.temperature == 0 and result.finish_reason != "error":
                        seen.setdefault(text, (request, result))
        return list(seen.values())

    def note_use(self, engine: EngineInfo, run: Run, results: list[RequestResult], prompts: list[str]) -> None:
        if self._used is not None:
            self._used.append(UsedRun(engine, run, results, prompts))

    def runs(self) -> Iterator[StoredRun]:
        """Every run made so far, in the order it was first asked for."""
        return iter(list(self._runs.values()))

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
