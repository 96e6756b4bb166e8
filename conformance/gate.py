"""Compare a run report with the stored baselines of its hardware class.

One row per (run, metric). Verdicts:

* ``pass``: inside or above the band;
* ``fail``: a regression: tau below ``baseline - band``; any per-position rate below its floor;
  speedup whose *entire* confidence interval lies below ``baseline - band``;
* ``inconclusive``: the speedup interval still straddles the lower band edge (the bench's time
  budget or repeat cap ran out first, or it ran a fixed number of repeats); or it lies below the band
  while the machine was slower than in every baseline run for a cause outside the build (other
  processes busier, GPU clocks lower, a new throttle reason: :func:`~.machine_state.outside_causes`), which
  only an A/B run on one machine can tell from a slower build; neither pass nor fail;
* ``missing``: no baseline for this (hardware class, engine, pair, mode, budget), or the report
  lacks the measurement. Never a silent pass;
* ``not gated``: with ``only_baselined`` (``gate --only-baselined``, which ``ci --gate auto`` passes),
  a run or metric that has no stored baseline: shown with the reason, and no part of the exit status.
  A report that lacks a measurement stays ``missing``;
* ``refused``: the run's engine settings that change speed (CUDA graphs, attention backend, overlap
  scheduling, dtype, ...; ``bench.engine_settings``) differ from the ones the baseline recorded, or
  changed within the run. Nothing else is judged for that run: a faster or slower number measured
  under other settings says nothing about the engine.

The speedup interval is recomputed here from the report's per-repeat samples with
:mod:`ddtree_conformance.sequential` (the look count follows from the repeats of a sequential run),
never taken on trust from the report. Every speedup row also carries the cost-model view
(``details``): speedup = tau x (plain step time / round time), each factor against the baseline's,
so a shortfall reads as "accepts less" (tau), "costs more" (round time in plain steps), or both.

Exit codes (:func:`exit_code`): 6 any refused (settings changed); else 1 any fail; 3 any inconclusive
(and no fail); 4 any missing (and no fail or inconclusive); 0 all pass (rows not gated aside); 2 is the
CLI's usage error (unreadable files).
"""

from __future__ import annotations

from .baselines import BaselineEntry, BaselineFile
from .gate_row import GateRow
from .gate_speedup import cost_view, speedup_interval, speedup_row
from .option_names import command

__all__ = [
    "EXIT_PASS",
    "EXIT_REGRESSION",
    "EXIT_INCONCLUSIVE",
    "EXIT_MISSING",
    "EXIT_SETTINGS_CHANGED",
    "GateRow",
    "NOT_GATED",
    "evaluate",
    "exit_code",
    "cost_view",
    "settings_conflict",
    "speedup_interval",
]

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INCONCLUSIVE = 3
EXIT_MISSING = 4
EXIT_SETTINGS_CHANGED = 6

# reasons, not settings: never compared
NOT_COMPARED = frozenset({"cuda_graphs_failure"})
NOT_GATED = "not gated"  # the status of a row without a baseline under ``only_baselined``


def settings_conflict(recorded: dict | None, measured: dict | None) -> str | None:
    """Why a run measured under ``measured`` settings cannot be judged against a baseline recorded under
    ``recorded`` (None: it can). Every setting the baseline recorded must be reported, equal, and not
    changed within the run; a baseline that recorded none (an older suite) is compared as before."""
    if not recorded:
        return None
    measured = measured or {}
    problems = []
    for key in sorted(set(recorded) - NOT_COMPARED):
        if key not in measured:
            problems.append(f"{key} not reported (baseline {recorded[key]!r})")
        elif measured[key] == "mixed":
            problems.append(f"{key} changed within the run")
        elif measured[key] != recorded[key]:
            problems.append(f"{key} {measured[key]!r} (baseline {recorded[key]!r})")
    if not problems:
        return None
    return (
        "engine settings differ from the baseline's: "
        + "; ".join(problems)
        + ". Not compared: re-run with the baseline's settings, or record a new baseline "
        f"({command('baseline', 'update')}) if the change is meant"
    )


def evaluate(
    report: dict, baselines: BaselineFile | None, hw_class: str, *, only_baselined: bool = False
) -> list[GateRow]:
    """Gate rows for every speculative run in ``report``. ``only_baselined``: a run or metric with no
    stored baseline is ``not gated`` (said, never part of the exit status) rather than ``missing``."""
    no_baseline = NOT_GATED if only_baselined else "missing"
    measured_settings = (report.get("bench") or {}).get("engine_settings")
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
            rows.append(
                GateRow(
                    label,
                    "all",
                    no_baseline,
                    "-",
                    "-",
                    None,
                    f"no baseline for ({hw_class}, {engine}, {pair}, {run['mode']}, {run.get('budget')})",
                )
            )
            continue
        conflict = settings_conflict(base.settings, measured_settings)
        if conflict:
            rows.append(_refused_row(label, base, measured_settings, conflict))
            continue
        rows.append(_tau_row(label, run, base))
        per_position = _per_position_row(label, run, base)
        if per_position is not None:
            rows.append(per_position)
        rows.append(speedup_row(label, run, base, (report.get("bench") or {}).get("machine"), no_baseline))
    return rows


def _refused_row(label: str, base: BaselineEntry, measured_settings: dict | None, conflict: str) -> GateRow:
    """The one row of a run whose engine settings differ from the baseline's."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted((measured_settings or {}).items()))
    return GateRow(
        label,
        "settings",
        "refused",
        shown or "-",
        ", ".join(f"{k}={v}" for k, v in sorted(base.settings.items())),
        None,
        conflict,
    )


def _tau_row(label: str, run: dict, base: BaselineEntry) -> GateRow:
    """The tau verdict: pass at or above the band's lower edge."""
    tau = run.get("tau")
    band = f">= {base.tau.lower:.3f} ({base.tau.value:.3f} - {base.tau.band:.3f})"
    if tau is None:
        return GateRow(label, "tau", "missing", "-", band, None, "report has no tau")
    margin = tau - base.tau.lower
    return GateRow(
        label,
        "tau",
        "pass" if margin >= 0 else "fail",
        f"{tau:.3f}",
        band,
        margin,
        f"{100 * (tau / base.tau.value - 1):+.1f} % vs baseline",
    )


def _per_position_row(label: str, run: dict, base: BaselineEntry) -> GateRow | None:
    """The per-position verdict at the worst depth (None: the baseline has no floors)."""
    floors = base.per_position.floors
    pos = run.get("per_position") or []
    if not floors:
        return None
    if not pos:
        return GateRow(
            label,
            "per-position",
            "missing",
            "-",
            f"floors d=1..{len(floors)}",
            None,
            "report has no per-position acceptance",
        )
    margins = [(pos[d] if d < len(pos) else 0.0) - f for d, f in enumerate(floors)]
    # judge the worst depth among those with a non-zero floor (deep depths floor at 0)
    candidates = [d for d, f in enumerate(floors) if f > 0] or list(range(len(floors)))
    worst = min(candidates, key=margins.__getitem__)
    got = pos[worst] if worst < len(pos) else 0.0
    status = "pass" if margins[worst] >= 0 else "fail"
    below = sum(m < 0 for m in margins)
    return GateRow(
        label,
        "per-position",
        status,
        f"d={worst + 1}: {got:.3f}",
        f"d={worst + 1}: >= {floors[worst]:.3f} (band {base.per_position.band:.3f})",
        margins[worst],
        f"worst depth of {len(floors)}" + (f"; {below} below floor" if below else ""),
    )


def exit_code(rows: list[GateRow]) -> int:
    statuses = {r.status for r in rows} - {NOT_GATED}
    if "refused" in statuses:
        return EXIT_SETTINGS_CHANGED
    if "fail" in statuses:
        return EXIT_REGRESSION
    if "inconclusive" in statuses:
        return EXIT_INCONCLUSIVE
    if "missing" in statuses:
        return EXIT_MISSING
    return EXIT_PASS
