"""The gate's speedup row (:mod:`ddtree_conformance.gate`): the interval recomputed from the report's
per-repeat samples (:mod:`ddtree_conformance.sequential`), widened by the baseline's between-run spread;
pass, fail or inconclusive against the band's lower edge, with the cost-model view (accepts less or costs
more), the minimum detectable drop, and the machine's state: what moved since the baseline, and whether
a cause outside the build (:func:`~ddtree_conformance.machine_state.outside_causes`) makes a slower run
inconclusive rather than failed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .baselines import BaselineEntry, SpeedupBaseline
from .gate_row import GateRow
from .machine_state import describe, drift, outside_causes
from .option_names import command, option
from .sequential import (
    DEFAULT_ALPHA,
    Interval,
    combined_interval,
    detectable_drop,
    look_alpha,
    planned_looks,
    ratio_interval,
    repeats_to_decide,
    verdict,
)

__all__ = ["cost_view", "speedup_interval", "speedup_row"]


def _alpha(sp: dict) -> float:
    alpha = sp.get("alpha", DEFAULT_ALPHA)
    return alpha if isinstance(alpha, (int, float)) and 0 < alpha < 0.5 else DEFAULT_ALPHA


def _level(sp: dict, n: int) -> float:
    """The level of each look of the report's run: alpha / K over the K planned looks of a sequential
    run (:mod:`ddtree_conformance.sequential`), recomputed from its plan; alpha for a fixed-size run."""
    sequential = bool(sp.get("sequential"))
    if not sequential:
        return _alpha(sp)
    ints = {k: sp.get(k) for k in ("min_repeats", "max_repeats")}
    growth = sp.get("growth")
    if all(isinstance(v, int) and v >= 2 for v in ints.values()) and isinstance(growth, (int, float)) and growth > 1:
        planned = len(planned_looks(ints["min_repeats"], max(ints["max_repeats"], ints["min_repeats"]), float(growth)))
    else:  # no plan recorded: as many looks as repeats, the most conservative reading
        planned = max(1, n)
    return look_alpha(_alpha(sp), planned, True)


def _positive_samples(values) -> list[float] | None:
    if not isinstance(values, list) or len(values) < 2:
        return None
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values):
        return None
    return [float(v) for v in values]


def speedup_interval(sp: dict, spread: tuple[float, int] | None = None) -> Interval | None:
    """The speedup interval from the report's per-repeat samples, or None when there are fewer than
    two usable samples (reports of older suites fall back to their stored interval). ``spread``: the
    baseline's between-run variance of the log speedup and its df, added to the interval's
    (:func:`~ddtree_conformance.sequential.combined_interval`)."""
    if "samples" in sp:
        samples = _positive_samples(sp["samples"])
        if samples is None:
            return None
        level = _level(sp, len(samples))
        return ratio_interval(samples, level) if spread is None else combined_interval(samples, level, *spread)
    point = sp.get("estimate", sp.get("median"))
    if all(isinstance(sp.get(k), (int, float)) for k in ("ci_low", "ci_high")) and isinstance(point, (int, float)):
        return Interval(float(point), float(sp["ci_low"]), float(sp["ci_high"]), float(sp.get("confidence", 0.95)), 0)
    return None


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def cost_view(run: dict, base: BaselineEntry, sp: dict) -> tuple[dict, str]:
    """speedup = tau x step/round, each factor against the baseline: ("accepts less", "costs more")."""
    cm = run.get("cost_model") or {}
    cost = base.cost
    # like with like: the cost model's tau (tokens emitted per round) against the baseline's, else the
    # acceptance tau against the baseline's acceptance tau
    if cm.get("tau") is not None and cost is not None and cost.tau is not None:
        tau, tau0 = cm["tau"], cost.tau
    else:
        tau, tau0 = run.get("tau"), base.tau.value
    details: dict = {"tau": tau, "tau_baseline": tau0}
    parts = []
    if isinstance(tau, (int, float)) and tau0 > 0:
        details["tau_change"] = tau / tau0 - 1
        details["accepts_less"] = tau < tau0 * (1 - 1e-4)  # baselines keep a few decimals
        parts.append(
            ("accepts less" if details["accepts_less"] else "accepts as much")
            + f": tau {tau:.3f} vs {tau0:.3f} ({_pct(details['tau_change'])})"
        )
    ratios = _positive_samples((cm.get("step_over_round") or {}).get("samples"))
    if ratios is not None and cost is not None:
        iv = ratio_interval(ratios, _level(sp, len(ratios)))
        c0 = cost.step_over_round
        details.update(
            {
                "step_over_round": iv.estimate,
                "step_over_round_ci": [iv.low, iv.high],
                "step_over_round_baseline": c0,
                "round_cost_change": c0 / iv.estimate - 1,
                "round_cost_change_ci": [c0 / iv.high - 1, c0 / iv.low - 1],
            }
        )
        details["costs_more"] = iv.high < c0
        details["costs_less"] = iv.low > c0
        lo, hi = details["round_cost_change_ci"]
        word = "costs more" if details["costs_more"] else "costs less" if details["costs_less"] else "costs the same"
        parts.append(
            f"{word}: round time in plain steps {_pct(details['round_cost_change'])} "
            f"[{_pct(lo)}, {_pct(hi)}] vs baseline"
        )
    elif cost is None:
        parts.append("no cost baseline (re-record the baseline with this suite)")
    else:
        parts.append("report has no step/round samples")
    return details, "; ".join(parts)


def _machine_note(run_state: dict | None, entry: BaselineEntry) -> tuple[list[str], str, list[str]]:
    """What moved between the baseline's machine state (its latest run that recorded one) and the trial's;
    the trial's state in words; and the slowdown's causes outside the build, when every baseline run that
    recorded a state shows one (none recorded: none shown, so nothing is excused)."""
    runs = entry.speedup.runs if entry.speedup is not None else []
    states = [r.state for r in runs if r.state]
    moved = drift(states[-1] if states else None, run_state)
    outside = [outside_causes(s, run_state) for s in states]
    return moved, describe(run_state) if run_state else "", outside[-1] if outside and all(outside) else []


def _undecided_hint(samples, level, edge, spread, runs) -> str:
    """What would decide an inconclusive speedup row: more repeats (about how many), more baseline runs,
    or an A/B run."""
    against = command("bench", "against")
    if samples is None:
        return f"run {command('bench', 'baselines')} to repeat until the interval decides, or A/B ({against})"
    more = repeats_to_decide(samples, level, edge, *(spread or (0.0, 0)))
    ab = f"an A/B run against the baseline build ({against}, interleaved on this runner) decides it"
    if more is None and not spread:
        return f"the estimate sits on the edge: {ab}"
    if more is None:
        why = f"the baseline's between-run spread ({runs} runs) alone spans the edge, so more repeats cannot decide"
        return f"{why}: {ab}; more baseline runs ({command('baseline', 'merge')}) narrow the spread"
    raise_it = f"raise {option('max_repeats')}/{option('time_budget')}"
    return f"about {more} repeats (now {len(samples)}: {raise_it}) would decide it, or {ab}"


def speedup_row(
    label: str, run: dict, entry: BaselineEntry, state: dict | None = None, no_baseline: str = "missing"
) -> GateRow:
    """The speedup verdict. With a baseline of 2+ runs the interval includes their between-run spread
    (fail only beyond it); with one run (or a version-1 file) the spread is unknown, so the row can pass
    (whole interval at or above the band) but never fail: below the band is inconclusive, saying so."""
    base = entry.speedup
    sp = run.get("speedup")
    if base is None:
        return GateRow(label, "speedup", no_baseline, "-", "-", None, "baseline has no speedup for this run")
    band = f">= {base.lower:.3f} ({base.value:.3f} - {base.band:.3f})"
    if not sp:
        return GateRow(
            label, "speedup", "missing", "-", band, None, "report has no throughput measurement (run `bench`)"
        )
    spread = base.spread()
    interval = speedup_interval(sp, spread)
    if interval is None:
        return GateRow(
            label,
            "speedup",
            "inconclusive",
            "-",
            band,
            None,
            "fewer than two usable per-repeat samples: no interval (run `bench` with more repeats)",
        )
    notes = _speedup_notes(run, entry, sp, interval, state)
    measured = f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
    found = verdict(interval, base.lower)
    repeats = f"({interval.n} repeats{notes.with_spread}){notes.noise}"
    if found == "pass":
        message = f"whole interval at or above the band {repeats}; {notes.view}{notes.machine}"
        return GateRow(label, "speedup", "pass", measured, band, interval.low - base.lower, message, notes.details)
    if found == "regression" and spread is not None and notes.outside:
        why = (
            f"whole interval below the band {repeats}, but the machine was slower than in every baseline run, "
            f"for causes outside the build ({'; '.join(notes.outside)}): a slower machine cannot be told from a "
            f"slower build, so not failed; rerun on a quiet runner, or an A/B run against the baseline build "
            f"({command('bench', 'against')}, both builds on the same machine) decides it"
        )
        return _inconclusive_row(label, measured, band, interval.high - base.lower, why, notes)
    if found == "regression" and spread is not None:
        message = f"whole interval below the band {repeats}; {notes.view}{notes.cause}{notes.machine}"
        return GateRow(label, "speedup", "fail", measured, band, interval.high - base.lower, message, notes.details)
    why, hint = _undecided_why(found, sp, base, notes)
    margin = interval.low - base.lower
    return _inconclusive_row(label, measured, band, margin, f"{why}; {hint}{notes.noise}", notes, notes.cause)


def _inconclusive_row(
    label: str, measured: str, band: str, margin: float, why: str, notes: _SpeedupNotes, cause: str = ""
) -> GateRow:
    """An inconclusive speedup row of a measured interval: ``why`` (and what would decide it), then the
    cost-model view, the ``cause`` named for the drift since the baseline ("": none) and the machine's state."""
    message = f"{why}; {notes.view}{cause}{notes.machine}"
    return GateRow(label, "speedup", "inconclusive", measured, band, margin, message, notes.details)


class _SpeedupNotes(NamedTuple):
    """What a speedup row says besides its verdict: its ``details`` and the message's parts."""

    details: dict
    view: str  # the cost-model view (accepts less / costs more)
    noise: str  # the minimum detectable drop, or ""
    machine: str  # the trial's machine state, or ""
    cause: str  # the machine drift since the baseline, or ""
    outside: list[str]  # the slowdown's causes outside the build (machine_state.outside_causes), or []
    with_spread: str  # the baseline's between-run spread included, or ""
    samples: list[float] | None
    level: float | None
    runs: int  # the baseline's runs (at least 1)


def _speedup_notes(run: dict, entry: BaselineEntry, sp: dict, interval: Interval, state: dict | None) -> _SpeedupNotes:
    """The cost-model view, the interval, the baseline's spread, the MDE and the machine's drift."""
    base = entry.speedup
    spread = base.spread()
    runs = max(1, len(base.runs))
    details, view = cost_view(run, entry, sp)
    if entry.settings is None:
        view += (
            "; the baseline records no engine settings (an older suite): re-record it so that a settings change "
            "is refused"
        )
    samples = _positive_samples(sp.get("samples"))
    level = _level(sp, len(samples)) if samples is not None else None
    mde = None if samples is None or base.value <= 0 else detectable_drop(samples, level, base.band / base.value)
    moved, shown, outside = _machine_note(state, entry)
    log_sd = None if spread is None else math.sqrt(spread[0] / (1 + 1 / runs))
    details = {
        **details,
        "interval": {
            "estimate": interval.estimate,
            "low": interval.low,
            "high": interval.high,
            "confidence": interval.level,
            "n": interval.n,
        },
        "baseline_runs": runs,
        "spread": None if spread is None else {"log_var": spread[0], "df": spread[1], "log_sd": log_sd},
        "mde": mde,
        "machine_drift": moved,
        "outside_causes": outside,
    }
    return _SpeedupNotes(
        details,
        view,
        "" if mde is None else f"; MDE {100 * mde:.1f} % below the baseline (this run's noise, 80 % power)",
        f"; machine: {shown}" if shown else "",
        f"; likely cause: the machine changed since the baseline ({'; '.join(moved)})" if moved else "",
        outside,
        f", between-run spread {100 * log_sd:.1f} % over {runs} baseline runs included" if spread else "",
        samples,
        level,
        runs,
    )


def _undecided_why(found: str | None, sp: dict, base: SpeedupBaseline, notes: _SpeedupNotes) -> tuple[str, str]:
    """Why a speedup row is inconclusive, and what would decide it."""
    if found == "regression":  # one baseline run: how far a run may drift from it is not known
        return (
            f"interval below the band, but the baseline records {notes.runs} run, so its between-run spread (other "
            "machines, other days) is unknown and a slower machine cannot be told from a slower build: not failed",
            f"record the baseline on more machines or days ({command('baseline', 'merge')}), or an A/B run against "
            f"the baseline build ({command('bench', 'against')}) decides it",
        )
    stopped = (sp.get("stop") or {}).get("reason") or "the run stopped"
    why = f"interval straddles the lower band edge{notes.with_spread}: {stopped}"
    hint = _undecided_hint(notes.samples, notes.level, base.lower, base.spread(), notes.runs)
    if not sp.get("sequential"):
        hint = f"run {command('bench', 'baselines')} to repeat until the interval decides; {hint}"
    return why, hint
