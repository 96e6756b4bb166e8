"""The A/B gate: judging an A/B report (``bench --against``, :mod:`ddtree_conformance.ab`) with no
stored baselines. Each run's ratio interval is recomputed from its per-repeat samples and set against
its edge: pass when wholly at or above, fail when wholly below, else inconclusive, saying what would
decide it (``docs/reference/bench-and-gates.md``)."""

from __future__ import annotations

from collections.abc import Sequence

from .gate import EXIT_INCONCLUSIVE, EXIT_PASS, EXIT_REGRESSION, GateRow, speedup_interval
from .machine_state import noise_causes
from .option_names import option
from .sequential import repeats_to_decide, spread_decides_nothing, verdict

__all__ = ["ab_verdict", "evaluate", "exit_code"]


# Each build runs in its own process, and a process can run a few per cent slow for a whole run (A/A runs:
# between-run sd 1-2 % on a CPU and on a GPU's launch-bound fixture pair, one process 8.5 % slow; 0.21 % on
# an 8B-shaped pair; docs/reference/bench-and-gates.md). A failure judged without that spread says so.
NO_SPREAD = (
    "; no between-process spread in the interval: a process of a correct build can run a few per cent slow"
    " for a whole run; measure it with A/A runs on this runner (scripts/ab_bias.py --pool) and give --ab-spread"
)


def evaluate(report: dict) -> list[GateRow]:
    """Gate rows of an A/B report: each run's ratio interval, recomputed from its samples, against its
    edge (pass: wholly at or above; fail: wholly below; else inconclusive)."""
    rows = []
    machine = (report.get("ab") or {}).get("machine")
    for run in report.get("runs", []):
        ab = run.get("ab") or {}
        label = run.get("label", "?")
        edge = ab.get("edge")
        if not isinstance(edge, (int, float)):
            rows.append(GateRow(label, "A/B ratio", "missing", "-", "-", None, "the report has no A/B edge"))
            continue
        band = f">= {edge:.3f} (candidate/baseline throughput)"
        given = ab.get("spread") or {}
        spread = (float(given["log_var"]), int(given["df"])) if given.get("log_var") and given.get("df") else None
        interval = speedup_interval(ab, spread)
        if spread:
            band += f", between-process spread {100 * spread[0] ** 0.5:.1f} % included"
        if interval is None:
            rows.append(
                GateRow(
                    label,
                    "A/B ratio",
                    "inconclusive",
                    "-",
                    band,
                    None,
                    "fewer than two usable per-repeat ratios: no interval",
                )
            )
            continue
        measured = f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
        tau, tau0 = run.get("tau"), run.get("baseline_tau")
        accepts = "" if tau is None or tau0 is None else f"; tau {tau:.3f} vs baseline {tau0:.3f}"
        found = verdict(interval, edge)
        if found == "pass":
            rows.append(
                GateRow(
                    label,
                    "A/B ratio",
                    "pass",
                    measured,
                    band,
                    interval.low - edge,
                    f"whole interval at or above the edge ({interval.n} repeats){accepts}",
                )
            )
        elif found == "regression":
            rows.append(
                GateRow(
                    label,
                    "A/B ratio",
                    "fail",
                    measured,
                    band,
                    interval.high - edge,
                    f"candidate slower than the baseline: whole interval below the edge ({interval.n} "
                    f"repeats){accepts}{'' if spread else NO_SPREAD}",
                )
            )
        else:
            why = (ab.get("stop") or {}).get("reason") or "the run stopped"
            hint = _undecided_hint(ab, interval, edge, spread, machine)
            rows.append(
                GateRow(
                    label,
                    "A/B ratio",
                    "inconclusive",
                    measured,
                    band,
                    interval.low - edge,
                    f"interval straddles the edge: {why}{accepts}{hint}",
                )
            )
    return rows or [GateRow("-", "A/B ratio", "missing", "-", "-", None, "the report holds no A/B runs")]


def _undecided_hint(ab: dict, interval, edge: float, spread: tuple[float, int] | None, machine: dict | None) -> str:
    """What would decide an inconclusive A/B row: the noise's likely cause where the run's machine state
    shows one (other processes busy, throttling, a moving clock), and about how many repeats would."""
    causes = noise_causes(machine)
    cause = f"; likely cause of the noise: {'; '.join(causes)}: a quieter runner decides it sooner" if causes else ""
    samples = [float(x) for x in ab.get("samples") or [] if isinstance(x, (int, float)) and x > 0]
    more = repeats_to_decide(samples, 1 - interval.level, edge, *(spread or (0.0, 0))) if len(samples) > 1 else None
    raise_it = f"raise {option('max_repeats')}/{option('time_budget')}"
    if more is None and spread and spread_decides_nothing(samples, 1 - interval.level, spread, edge):
        return (
            f"{cause}; the between-process spread ({100 * spread[0] ** 0.5:.1f} %) alone keeps the interval across"
            " the edge: more repeats would not decide it; a workload whose processes differ less (a full-size model"
            " on a GPU rather than the launch-bound fixture pair) or a wider --tolerance would"
        )
    if more is None:
        return f"{cause}; the estimate sits on the edge: more repeats would not decide it"
    return f"{cause}; about {more} repeats (now {len(samples)}: {raise_it}) would decide it"


def ab_verdict(rows: Sequence[GateRow]) -> dict:
    """``{"status": pass | fail | inconclusive, "reason"}`` for the report's banner."""
    failed = [r for r in rows if r.status == "fail"]
    if failed:
        return {
            "status": "fail",
            "reason": f"A/B: candidate slower than the baseline on "
            f"{', '.join(r.run for r in failed)}: ratio {failed[0].measured}, "
            f"edge {failed[0].band}",
        }
    unsure = [r for r in rows if r.status in ("inconclusive", "missing")]
    if unsure:
        return {"status": "inconclusive", "reason": f"A/B: {unsure[0].run}: {unsure[0].message}"}
    return {
        "status": "pass",
        "reason": "A/B: the candidate keeps the baseline's throughput on "
        f"{', '.join(r.run for r in rows)} (ratio {rows[0].measured})",
    }


def exit_code(rows: Sequence[GateRow]) -> int:
    statuses = {r.status for r in rows}
    if "fail" in statuses:
        return EXIT_REGRESSION
    if statuses & {"inconclusive", "missing"}:
        return EXIT_INCONCLUSIVE
    return EXIT_PASS
