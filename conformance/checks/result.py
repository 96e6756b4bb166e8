"""The outcome of one conformance check."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["CheckResult", "SkipCause"]

#: Why a check skipped. ``engine``: the engine does not offer what the check needs (a mode, acceptance
#: data, traces, enough prompts for an aggregate band): the run is incomplete unless the caller opts
#: out (``--allow-skip``). ``environment``: this machine cannot run it (one device for tensor
#: parallelism). ``input``: the run's own options leave nothing to check (no golden file for these
#: prompts, one-token outputs).
SkipCause = Literal["engine", "environment", "input"]


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

    @property
    def ok(self) -> bool:
        return self.status != "fail"
