"""Compare a run report with the stored baselines of its hardware class.

One row per (run, metric). Verdicts:

* ``pass``: inside or above the band;
* ``fail``: a regression: tau below ``baseline - band``; any per-position rate below its floor;
  speedup whose *entire* confidence interval lies below ``baseline - band``;
* ``inconclusive``: the speedup interval straddles the lower band edge; neither pass nor fail;
* ``missing``: no baseline for this (hardware class, engine, pair, mode, budget), or the report
  lacks the measurement. Never a silent pass.

Exit codes (:func:`exit_code`): 0 all pass; 1 any fail; 3 any inconclusive (and no fail);
4 any missing (and no fail or inconclusive); 2 is the CLI's usage error (unreadable files).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .baselines import BaselineFile

__all__ = ["EXIT_PASS", "EXIT_REGRESSION", "EXIT_INCONCLUSIVE", "EXIT_MISSING", "GateRow", "evaluate", "exit_code"]

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3
EXIT_MISSING = 4


@dataclass
class GateRow:
    run: str
    metric: str
    status: str  # pass | fail | inconclusive | missing
    measured: str
    band: str
    margin: float | None  # measured (or CI low for speedup) minus the lower band edge
    message: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _speedup_row(label: str, run: dict, base) -> GateRow:
    sp = run.get("speedup")
    if base is None:
        return GateRow(label, "speedup", "missing", "-", "-", None, "baseline has no speedup for this run")
    band = f">= {base.lower:.3f} ({base.value:.3f} - {base.band:.3f})"
    if not sp:
        return GateRow(label, "speedup", "missing", "-", band, None,
                       "report has no throughput measurement (run `bench`)")
    lo, hi, med = sp["ci_low"], sp["ci_high"], sp["median"]
    measured = f"{med:.3f} [{lo:.3f}, {hi:.3f}]"
    if lo >= base.lower:
        return GateRow(label, "speedup", "pass", measured, band, lo - base.lower, "whole CI at or above the band")
    if hi < base.lower:
        return GateRow(label, "speedup", "fail", measured, band, hi - base.lower, "whole CI below the band")
    return GateRow(label, "speedup", "inconclusive", measured, band, lo - base.lower,
                   "CI straddles the lower band edge; rerun with more repeats")


def evaluate(report: dict, baselines: BaselineFile | None, hw_class: str) -> list[GateRow]:
    """Gate rows for every speculative run in ``report``."""
    settings = report.get("settings", {})
    engine, pair = settings.get("engine", "?"), settings.get("pair_name", "?")
    rows: list[GateRow] = []
    runs = [r for r in report.get("runs", []) if r.get("mode") != "plain"]
    if not runs:
        return [GateRow("-", "runs", "missing", "-", "-", None, "report holds no speculative runs")]
    for run in runs:
        label = run.get("label") or (run["mode"] if run.get("budget") is None else f"{run['mode']}-B{run['budget']}")
        base = baselines.find(hw_class, engine, pair, run["mode"], run.get("budget")) if baselines else None
        if base is None:
            rows.append(GateRow(label, "all", "missing", "-", "-", None,
                                f"no baseline for ({hw_class}, {engine}, {pair}, {run['mode']}, {run.get('budget')})"))
            continue
        tau = run.get("tau")
        band = f">= {base.tau.lower:.3f} ({base.tau.value:.3f} - {base.tau.band:.3f})"
        if tau is None:
            rows.append(GateRow(label, "tau", "missing", "-", band, None, "report has no tau"))
        else:
            margin = tau - base.tau.lower
            rows.append(GateRow(label, "tau", "pass" if margin >= 0 else "fail", f"{tau:.3f}", band, margin,
                                f"{100 * (tau / base.tau.value - 1):+.1f} % vs baseline"))
        floors = base.per_position.floors
        pos = run.get("per_position") or []
        if floors and not pos:
            rows.append(GateRow(label, "per-position", "missing", "-", f"floors d=1..{len(floors)}", None,
                                "report has no per-position acceptance"))
        elif floors:
            margins = [(pos[d] if d < len(pos) else 0.0) - f for d, f in enumerate(floors)]
            # judge the worst depth among those with a non-zero floor (deep depths floor at 0)
            candidates = [d for d, f in enumerate(floors) if f > 0] or list(range(len(floors)))
            worst = min(candidates, key=margins.__getitem__)
            got = pos[worst] if worst < len(pos) else 0.0
            status = "pass" if margins[worst] >= 0 else "fail"
            below = sum(m < 0 for m in margins)
            rows.append(GateRow(label, "per-position", status, f"d={worst + 1}: {got:.3f}",
                                f"d={worst + 1}: >= {floors[worst]:.3f} (band {base.per_position.band:.3f})",
                                margins[worst],
                                f"worst depth of {len(floors)}" + (f"; {below} below floor" if below else "")))
        rows.append(_speedup_row(label, run, base.speedup))
    return rows


def exit_code(rows: list[GateRow]) -> int:
    statuses = {r.status for r in rows}
    if "fail" in statuses:
        return EXIT_REGRESSION
    if "inconclusive" in statuses:
        return EXIT_INCONCLUSIVE
    if "missing" in statuses:
        return EXIT_MISSING
    return EXIT_PASS
