"""The outcome of one conformance check."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["CheckResult", "SkipCause", "NOT_APPLICABLE"]

#: Why a check skipped. ``engine``: the engine does not offer what the check needs (a mode, acceptance
#: data, traces, enough prompts for an aggregate band, CUDA graphs on a CUDA run): the run is incomplete
#: unless the caller opts out (``--allow-skip``). ``not-applicable``: the family cannot apply on this
#: run's device or settings, whatever the engine (CUDA graphs on a CPU run the engine has no graph path
#: for; tensor parallelism with one device and no ``--tensor-parallel-size``): shown and counted apart,
#: never incomplete. ``environment``: this machine cannot run it (a pair whose models are not here).
#: ``input``: the run's own options leave nothing to check, or too little for a verdict (no golden file
#: for these prompts, one-token outputs, too few sampled transitions).
SkipCause = Literal["engine", "not-applicable", "environment", "input"]
NOT_APPLICABLE: SkipCause = "not-applicable"


class CheckResult(BaseModel):
    """``status`` is pass, fail or skip; ``message`` names the symptom (or the skip reason); a skip
    carries its ``cause``."""

    check: str
    status: Literal["pass", "fail", "skip"]
    message: str = ""
    details: dict = Field(default_factory=dict)
    cause: SkipCause | None = None

    @classmethod
    def passed(cls, check: str, message: str = "", **details) -> CheckResult:
        return cls(check=check, status="pass", message=message, details=details)

    @classmethod
    def failed(cls, check: str, message: str, **details) -> CheckResult:
        return cls(check=check, status="fail", message=message, details=details)

    @classmethod
    def skipped(cls, check: str, reason: str, cause: SkipCause = "engine") -> CheckResult:
        return cls(check=check, status="skip", message=reason, cause=cause)

    @classmethod
    def not_applicable(cls, check: str, reason: str) -> CheckResult:
        """A skip because the check cannot apply on this run's device or settings (never incomplete)."""
        return cls(check=check, status="skip", message=f"not applicable: {reason}", cause=NOT_APPLICABLE)

    @property
    def applicable(self) -> bool:
        return self.cause != NOT_APPLICABLE

    @property
    def ok(self) -> bool:
        return self.status != "fail"
