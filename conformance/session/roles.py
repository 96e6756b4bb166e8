"""Who an engine is to the session: the engine under test or the reference engine (the oracle), with
its name and its model pair's limits (what the integrity rules hold its results to)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..integrity import PairLimits

__all__ = ["EngineInfo", "EngineRole"]


class EngineRole(enum.Enum):
    UNDER_TEST = "engine"
    ORACLE = "the reference engine (oracle)"


@dataclass(frozen=True)
class EngineInfo:
    """Who an engine is to the session: its name, its role and its model pair's limits."""

    name: str
    role: EngineRole
    limits: PairLimits

    @property
    def oracle(self) -> bool:
        return self.role is EngineRole.ORACLE
