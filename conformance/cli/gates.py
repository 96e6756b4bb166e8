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


ReportsArg = Annotated[
    list[Path],
    typer.Argument(
        help="Run report JSON (from `bench`); several make one baseline of several runs (their spread).",
        metavar="REPORT...",
    ),
]
Update = Annotated[bool, typer.Option("--update", help="Replace existing entries; prints the diff.")]
Merge = Annotated[
    bool,
    typer.Option(
        "--merge",
        help="Add the reports' runs to existing entries (the between-run spread grows with them) instead of "
        "replacing them; prints the diff.",
    ),
]
TauBand = Annotated[float, typer.Option("--tau-band", help="Tau band, as a fraction of tau.")]
PositionBand = Annotated[float, typer.Option("--position-band", help="Per-position band, absolute.")]
SpeedupBand = Annotated[
    float,
    typer.Option("--speedup-band", help="Speedup band, fraction of speedup (widened to the report's own interval)."),
]
ReportArg = Annotated[Path, typer.Argument(help="Run report JSON (from `bench`).")]
GateOut = Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the verdicts as JSON.")]
OnlyBaselined = Annotated[
    bool,
    typer.Option(
        "--only-baselined",
        help="Gate only the runs and metrics that have a stored baseline: the rest are 'not gated' (shown, "
        "with the reason) instead of 'missing' (exit 4); a report that lacks a measurement is still "
        "missing. `ci --gate auto` passes it.",
    ),
]


@opt.option_group
class Bands:
    """The bands a baseline allows around its numbers."""

    tau_band: TauBand = 0.05
    position_band: PositionBand = 0.05
    speedup_band: SpeedupBand = 0.02

    def checked(self) -> Bands:
        """These bands; one outside [0, 1): exit 2, naming it."""
        for value, option in (
            (self.tau_band, "--tau-band"),
            (self.position_band, "--position-band"),
            (self.speedup_band, "--speedup-band"),
        ):
            if not 0 <= value < 1:
                raise CliError(f"{option} must be in [0, 1), got {value}")
        return self


@command()
def baseline(
    reports: ReportsArg, *, store: opt.BaselineStore, update: Update = False, merge: Merge = False, bands: Bands
) -> None:
    """Write baselines (tau, per-position floors, speedup, with bands) from run reports.

    Several reports (runs on other machines or days), or --merge into an existing file, record the
    speedup's between-run spread: the gate fails a speedup only beyond it."""
    bands.checked()
    if update and merge:
        raise CliError("--update replaces entries and --merge adds runs to them: give one")
    hw, made = _baseline_entries(reports, store.hardware_class, bands)
    path = baseline_path(store.baselines, hw)
    final, written, diff = _write_baseline(path, made, update=update, merge=merge)
    _print_baseline(made[0], final, written, diff)


def _baseline_entries(reports: list[Path], hardware_class: Optional[str], bands: Bands) -> tuple[str, list]:
    """Each report's baseline entries, and the hardware class they are filed under (the first report's
    unless given). An A/B report, or one without speculative runs: exit 2."""
    hw, made = hardware_class, []
    for report in reports:
        data = _load_report_or_fail(report)
        if data.get("kind") == "ab":
            raise CliError(f"{report} is an A/B report: it compares two builds on one runner and makes no baselines")
        hw = hw or data["hardware_class"]
        entries = entries_from_report(
            data,
            hw_class=hw,
            tau_band=bands.tau_band,
            position_band=bands.position_band,
            speedup_band=bands.speedup_band,
        )
        if not entries:
            raise CliError(f"{report} holds no speculative runs to make baselines from")
        made.append(entries)
    return hw, made


def _write_baseline(path: Path, made: list, *, update: bool, merge: bool):
    """The reports' entries combined, merged into the file's and written: (final, written path, diff)."""
    try:
        combined = merge_entries(None, made[0])
        for more in made[1:]:
            combined = merge_entries(combined, more, merge=True)
        existing = load_baselines(path) if path.exists() else None
        final = merge_entries(existing, combined.entries, merge=merge)
        written, diff = write_baselines(path, final, update=update or merge)
    except BaselineExists as exc:
        _print_lines(exc.diff)
        raise CliError(str(exc)) from None
    except BaselineError as exc:
        raise CliError(str(exc)) from None
    return final, written, diff


def _print_lines(lines) -> None:
    console = stdout_console()
    for line in lines:
        console.print(escape(line), soft_wrap=True, highlight=False)


def _print_baseline(entries: list, final, written: Path, diff: list[str]) -> None:
    console = stdout_console()
    _print_lines(diff)
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
    report: ReportArg, *, store: opt.BaselineStore, out: GateOut = None, only_baselined: OnlyBaselined = False
) -> None:
    """Compare a run report with stored baselines.

    Exit codes: 0 all pass (rows 'not gated' under --only-baselined aside); 1 regression (any fail);
    3 inconclusive (a speedup CI straddles the band's lower edge, no fail); 4 missing baseline or
    measurement (no fail or inconclusive);
    6 refused: the report's engine settings (CUDA graphs, attention backend, ...) differ from the
    baseline's (wins over every other status); 2 unusable input.
    """
    data = _load_report_or_fail(report)
    hw = store.hardware_class or data["hardware_class"]
    stored = data.get("kind") != "ab"  # an A/B report carries its own edge and needs no stored baselines
    rows, path, code = _judge(data, store.baselines, hw, only_baselined=only_baselined)
    colours = _gate_colours()
    _print_gate_table(data, rows, hw, path, colours)
    counts = {k: sum(r.status == k for r in rows) for k in colours}
    if out is not None:
        _write_gate_json(out, report=report, path=path, hw=hw, code=code, counts=counts, rows=rows)
    _print_gate_verdict(rows, code, counts)
    if stored and not path.exists():
        from ..gate import NOT_GATED

        every = NOT_GATED if only_baselined else "missing"
        stdout_console().print(escape(f"no baseline file {path}: every run is '{every}'"), soft_wrap=True)
    raise typer.Exit(code)


def _judge(data: dict, baselines: Optional[Path], hw: str, *, only_baselined: bool) -> tuple[list, Path, int]:
    """The gate's rows, what they were compared with (the baseline file, or the A/B report's baseline
    build) and the exit status."""
    from .. import ab  # imported here: ab and gate pull scipy
    from ..gate import evaluate, exit_code

    if data.get("kind") == "ab":
        rows = ab.evaluate(data)
        return rows, Path(f"A/B baseline {data.get('ab', {}).get('against', '?')}"), ab.exit_code(rows)
    path = baseline_path(baselines, hw)
    loaded = None
    if path.exists():
        try:
            loaded = load_baselines(path)
        except BaselineError as exc:
            raise CliError(str(exc)) from None
    rows = evaluate(data, loaded, hw, only_baselined=only_baselined)
    return rows, path, exit_code(rows)


def _gate_colours() -> dict[str, str]:
    from ..gate import NOT_GATED

    return {
        "pass": "green",
        "fail": "red",
        "inconclusive": "yellow",
        "missing": "magenta",
        "refused": "red",
        NOT_GATED: "cyan",
    }


def _print_gate_table(data: dict, rows: list, hw: str, path: Path, colours: dict[str, str]) -> None:
    from ..machine_state import describe

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
    machine = (data.get("bench") or data.get("ab") or {}).get("machine")
    if machine:
        console.print(escape(f"machine during the bench: {describe(machine)}"), soft_wrap=True)


def _write_gate_json(out: Path, *, report: Path, path: Path, hw: str, code: int, counts: dict, rows: list) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    found = {
        "schema": "ddtree-conformance/gate",
        "schema_version": 1,
        "report": str(report),
        "baselines": str(path),
        "hardware_class": hw,
        "exit_code": code,
        "counts": counts,
        "rows": [r.as_dict() for r in rows],
    }
    out.write_text(json.dumps(found, indent=1) + "\n")


def _print_gate_verdict(rows: list, code: int, counts: dict[str, int]) -> None:
    from ..gate import NOT_GATED

    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    verdict = {0: "PASS", 1: "REGRESSION", 3: "INCONCLUSIVE", 4: "MISSING BASELINE", 6: "REFUSED: SETTINGS CHANGED"}[
        code
    ]
    if rows and all(r.status == NOT_GATED for r in rows):
        verdict = "NOTHING GATED"
    stdout_console().print(escape(f"gate {verdict} (exit {code}): {summary}"), soft_wrap=True)
