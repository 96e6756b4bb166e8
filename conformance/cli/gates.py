"""``baseline`` (store a report's numbers, one run or several) and ``gate`` (compare a report with them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..baselines import (
    BaselineError,
    BaselineExists,
    baseline_path,
    entries_from_report,
    load_baselines,
    merge_entries,
    write_baselines,
)
from ..report import ReportError, load_report
from . import options as opt
from .base import CliError, command, stdout_console

__all__ = ["baseline", "gate"]


def _load_report_or_fail(path: Path) -> dict:
    try:
        return load_report(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None


@command()
def baseline(
    reports: Annotated[
        list[Path],
        typer.Argument(
            help="Run report JSON (from `bench`); several make one baseline of several runs (their spread).",
            metavar="REPORT...",
        ),
    ],
    baselines: opt.Baselines = None,
    hardware_class: opt.HardwareClass = None,
    update: Annotated[bool, typer.Option("--update", help="Replace existing entries; prints the diff.")] = False,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Add the reports' runs to existing entries (the between-run spread grows with them) instead of "
            "replacing them; prints the diff.",
        ),
    ] = False,
    tau_band: Annotated[float, typer.Option("--tau-band", help="Tau band, as a fraction of tau.")] = 0.05,
    position_band: Annotated[float, typer.Option("--position-band", help="Per-position band, absolute.")] = 0.05,
    speedup_band: Annotated[
        float,
        typer.Option(
            "--speedup-band", help="Speedup band, fraction of speedup (widened to the report's own interval)."
        ),
    ] = 0.02,
) -> None:
    """Write baselines (tau, per-position floors, speedup, with bands) from run reports.

    Several reports (runs on other machines or days), or --merge into an existing file, record the
    speedup's between-run spread: the gate fails a speedup only beyond it."""
    for value, option in (
        (tau_band, "--tau-band"),
        (position_band, "--position-band"),
        (speedup_band, "--speedup-band"),
    ):
        if not 0 <= value < 1:
            raise CliError(f"{option} must be in [0, 1), got {value}")
    if update and merge:
        raise CliError("--update replaces entries and --merge adds runs to them: give one")
    hw, made = hardware_class, []
    for report in reports:
        data = _load_report_or_fail(report)
        if data.get("kind") == "ab":
            raise CliError(f"{report} is an A/B report: it compares two builds on one runner and makes no baselines")
        hw = hw or data["hardware_class"]
        entries = entries_from_report(
            data, hw_class=hw, tau_band=tau_band, position_band=position_band, speedup_band=speedup_band
        )
        if not entries:
            raise CliError(f"{report} holds no speculative runs to make baselines from")
        made.append(entries)
    path = baseline_path(baselines, hw)
    console = stdout_console()
    entries = made[0]
    try:
        combined = merge_entries(None, made[0])
        for more in made[1:]:
            combined = merge_entries(combined, more, merge=True)
        existing = load_baselines(path) if path.exists() else None
        final = merge_entries(existing, combined.entries, merge=merge)
        written, diff = write_baselines(path, final, update=update or merge)
    except BaselineExists as exc:
        for line in exc.diff:
            console.print(escape(line), soft_wrap=True, highlight=False)
        raise CliError(str(exc)) from None
    except BaselineError as exc:
        raise CliError(str(exc)) from None
    for line in diff:
        console.print(escape(line), soft_wrap=True, highlight=False)
    if any(e.speedup is None for e in entries):
        console.print("note: the report has no throughput; speedup baselines left empty (run `bench`)")
    spreads = [
        f"{e.mode}{'' if e.budget is None else f'-B{e.budget}'}: {len(e.speedup.runs)} runs, spread "
        + ("unknown (one run)" if e.speedup.spread_log_sd is None else f"{100 * e.speedup.spread_log_sd:.2f} %")
        for e in final.entries
        if e.speedup is not None and e.key in {x.key for x in entries}
    ]
    if spreads:
        console.print(escape("speedup runs: " + "; ".join(spreads)), soft_wrap=True)
    console.print(
        escape(f"no changes to {written}" if not diff else f"wrote {len(entries)} entries to {written}"), soft_wrap=True
    )


@command()
def gate(
    report: Annotated[Path, typer.Argument(help="Run report JSON (from `bench`).")],
    baselines: opt.Baselines = None,
    hardware_class: opt.HardwareClass = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the verdicts as JSON.")] = None,
    only_baselined: Annotated[
        bool,
        typer.Option(
            "--only-baselined",
            help="Gate only the runs and metrics that have a stored baseline: the rest are 'not gated' (shown, "
            "with the reason) instead of 'missing' (exit 4); a report that lacks a measurement is still "
            "missing. `ci --gate auto` passes it.",
        ),
    ] = False,
) -> None:
    """Compare a run report with stored baselines.

    Exit codes: 0 all pass (rows 'not gated' under --only-baselined aside); 1 regression (any fail);
    3 inconclusive (a speedup CI straddles the band's lower edge, no fail); 4 missing baseline or
    measurement (no fail or inconclusive);
    6 refused: the report's engine settings (CUDA graphs, attention backend, ...) differ from the
    baseline's (wins over every other status); 2 unusable input.
    """
    from .. import ab  # imported here: ab and gate pull scipy
    from ..gate import NOT_GATED, evaluate, exit_code

    data = _load_report_or_fail(report)
    hw = hardware_class or data["hardware_class"]
    path = baseline_path(baselines, hw)
    stored = data.get("kind") != "ab"  # an A/B report carries its own edge and needs no stored baselines
    if stored:
        loaded = None
        if path.exists():
            try:
                loaded = load_baselines(path)
            except BaselineError as exc:
                raise CliError(str(exc)) from None
        rows = evaluate(data, loaded, hw, only_baselined=only_baselined)
    else:
        rows = ab.evaluate(data)
        path = Path(f"A/B baseline {data.get('ab', {}).get('against', '?')}")
    s = data.get("settings", {})
    table = Table(title=escape(f"gate: {s.get('engine')} on {s.get('pair_name')} ({hw}) vs {path}"))
    for column, justify in (
        ("run", "left"),
        ("metric", "left"),
        ("status", "left"),
        ("measured", "right"),
        ("band", "right"),
        ("margin", "right"),
        ("note", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    colours = {
        "pass": "green",
        "fail": "red",
        "inconclusive": "yellow",
        "missing": "magenta",
        "refused": "red",
        NOT_GATED: "cyan",
    }
    for r in rows:
        table.add_row(
            escape(r.run),
            r.metric,
            f"[{colours[r.status]}]{r.status}[/]",
            escape(r.measured),
            escape(r.band),
            "-" if r.margin is None else f"{r.margin:+.3f}",
            escape(r.message),
        )
    console = stdout_console()
    console.print(table)
    from ..machine_state import describe

    machine = (data.get("bench") or data.get("ab") or {}).get("machine")
    if machine:
        console.print(escape(f"machine during the bench: {describe(machine)}"), soft_wrap=True)
    code = exit_code(rows) if stored else ab.exit_code(rows)
    counts = {k: sum(r.status == k for r in rows) for k in colours}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "schema": "ddtree-conformance/gate",
                    "schema_version": 1,
                    "report": str(report),
                    "baselines": str(path),
                    "hardware_class": hw,
                    "exit_code": code,
                    "counts": counts,
                    "rows": [r.as_dict() for r in rows],
                },
                indent=1,
            )
            + "\n"
        )
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    verdict = {0: "PASS", 1: "REGRESSION", 3: "INCONCLUSIVE", 4: "MISSING BASELINE", 6: "REFUSED: SETTINGS CHANGED"}[
        code
    ]
    if rows and all(r.status == NOT_GATED for r in rows):
        verdict = "NOTHING GATED"
    console.print(escape(f"gate {verdict} (exit {code}): {summary}"), soft_wrap=True)
    if stored and not path.exists():
        every = NOT_GATED if only_baselined else "missing"
        console.print(escape(f"no baseline file {path}: every run is '{every}'"), soft_wrap=True)
    raise typer.Exit(code)
