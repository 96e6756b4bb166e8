"""Running planned checks: one :class:`PlannedCheck` per check id, :func:`run_plan` for a list."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..session import SuiteSession
from .result import CheckResult

__all__ = ["PlannedCheck", "run_plan"]


@dataclass(frozen=True)
class PlannedCheck:
    id: str
    function: Callable[..., CheckResult]
    params: dict = field(default_factory=dict)

    def run(self, session: SuiteSession) -> CheckResult:
        try:
            return self.function(session, **self.params)
        except Exception as exc:  # an engine or check crash is a failed check, not a dead run
            return CheckResult.failed(self.id, f"check crashed: {type(exc).__name__}: {exc}")


def run_plan(session: SuiteSession, checks: list[PlannedCheck], on_result=None) -> list[CheckResult]:
    results = []
    for check in checks:
        result = check.run(session)
        result = result.model_copy(update={"check": check.id})
        results.append(result)
        if on_result:
            on_result(result)
    return results
