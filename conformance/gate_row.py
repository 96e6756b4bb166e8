"""One row of the gate's verdicts: a (run, metric) pair, its status and what it measured
(:mod:`ddtree_conformance.gate`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["GateRow"]


@dataclass
class GateRow:
    run: str
    metric: str
    status: str  # pass | fail | inconclusive | missing | refused | not gated
    measured: str
    band: str
    margin: float | None  # measured (or CI low for speedup) minus the lower band edge
    message: str = ""
    details: dict | None = None  # speedup rows: the cost-model view

    def as_dict(self) -> dict:
        return asdict(self)
