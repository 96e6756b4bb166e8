"""The outcome of one conformance check."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["CheckResult"]


class CheckResult(BaseModel):
    """``status`` is pass, fail or skip; ``message`` names the symptom (or the skip reason)."""

    check: str
    status: Literal["pass", "fail", "skip"]
    message: str = ""
    details: dict = Field(default_factory=dict)

    @classmethod
    def passed(cls, check: str, message: str = "", **details) -> "CheckResult":
        return cls(check=check, status="pass", message=message, details=details)

    @classmethod
    def failed(cls, check: str, message: str, **details) -> "CheckResult":
        return cls(check=check, status="fail", message=message, details=details)

    @classmethod
    def skipped(cls, check: str, reason: str) -> "CheckResult":
        return cls(check=check, status="skip", message=reason)

    @property
    def ok(self) -> bool:
        return self.status != "fail"
