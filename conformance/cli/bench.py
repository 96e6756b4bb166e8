"""``bench`` (throughput), ``baseline`` (store a report's numbers) and ``gate`` (compare with them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..paths import REPORTS_DIR
from ..progress import progress_printer
from . import options as opt
from .base import EXIT_FAILED, CliError, command, stderr_console, stdout_console
from .generate import require_support

__all__ = ["bench", "baseline", "gate"]


@command()
def bench(
    engine: opt.Engine = "reference",
    model: opt.Model = None,
    drafter: opt.Drafter = None,
    pair: opt.Pair = None,
    pairs_file: opt.PairsFile = None,
    pair_name: opt.PairName = None,
    modes: opt.Modes = None,
    budgets: opt.Budgets = None,
    dtype: opt.DType = None,
    device: opt.Device = None,
    prompts: opt.Prompts = None,
    limit: opt.Limit = None,
    max_new_tokens: opt.MaxNewTokens = None,
    repeats: Annotated[int, typer.Option("--repeats", "-r", help="Interleaved timed rounds (>= 5 for a gate).")] = 5,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples for the CI.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="One untimed run per config first.")] = True,
    isolate: opt.Isolate = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="JSON report path (.md and .html beside it).",
                                                show_default="reports/bench-<engine>.json")] = None,
    engine_option: opt.EngineOptions = None,
    engine_timeout: opt.EngineTimeout = None,
    threads: opt.Threads = None,
    hardware_class: opt.HardwareClass = None,
) -> None:
    """Measure speedup over plain decoding (interleaved repeats, bootstrap CI), tau and acceptance."""
    from ..bench import BenchError, run_bench
    from ..report import new_report, write_report
    from ..session import SuiteSession

    if repeats < 1:
        raise CliError(f"--repeats must be >= 1, got {repeats}")
    if resamples < 100:
        raise CliError(f"--resamples must be >= 100, got {resamples}")
    settings = opt.run_settings(
        engine=engine, model_dir=model, drafter_dir=drafter, pair=pair, pairs_file=pairs_file, pair_name=pair_name,
        modes=modes, budgets=budgets, dtype=dtype, device=device, prompt_set=prompts, limit=limit,
        max_new_tokens=max_new_tokens, isolate=isolate, engine_options=engine_option,
        engine_timeout_s=engine_timeout, torch_threads=threads)
    hw = opt.hw_class(settings.device, hardware_class)
    runs = [("dflash", None)] if "dflash" in settings.modes else []
    runs += [("ddtree", b) for b in settings.budgets] if "ddtree" in settings.modes else []
    session = SuiteSession(settings)
    try:
        eng = session.engine
        session.require_support()  # every budget within capabilities().max_budget, dtype, device
        for mode in ["plain", *settings.modes]:
            require_support(eng, session.config(mode, settings.budgets[0]))
        requests = session.requests()
        total = (len(runs) + 1) * (repeats + int(warmup))
        printer = progress_printer()
        done = [0]

        def step(label: str) -> None:
            progress.update(task, advance=1, description=f"bench {settings.engine}: {label}")
            done[0] += 1
            if printer is not None:  # CI logs: one line per timed run
                printer(f"bench {settings.engine}: {label} ({done[0]}/{total} runs)")

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr_console(), transient=True) as progress:
            task = progress.add_task(f"bench {settings.engine}", total=total)
            try:
                measured = run_bench(eng, requests, lambda m, b: session.config(m, b), runs, repeats=repeats,
                                     warmup=warmup, resamples=resamples, seed=seed, on_step=step)
            except BenchError as exc:
                raise CliError(str(exc), exit_code=EXIT_FAILED) from exc
    finally:
        session.close()
    report = new_report("bench", settings.model_dump(), hw)
    report.update(measured)
    out_path = out if out is not None else REPORTS_DIR / f"bench-{settings.engine.replace(':', '_')}.json"
    paths = write_report(report, out_path)
    table = Table(title=escape(f"bench: {settings.engine} on {settings.pair_name} ({settings.dtype}, {settings.device}, {hw}), "
                               f"{repeats} repeats"))
    for column, justify in (("run", "left"), ("tau", "right"), ("tokens/s", "right"), ("speedup [95% CI]", "right"),
                            ("CV", "right")):
        table.add_column(column, justify=justify)
    for run in report["runs"]:
        sp = run.get("speedup")
        tps = sorted(run["tokens_per_s"])[len(run["tokens_per_s"]) // 2]
        table.add_row(run["label"], f"{run['tau']:.3f}", f"{tps:.1f}",
                      "-" if not sp else f"{sp['median']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]",
                      "-" if not sp or sp["cv"] is None else f"{sp['cv']:.3f}")
    console = stdout_console()
    console.print(table)
    console.print(escape(f"timing basis: {report['bench']['timing_basis']}; wrote {', '.join(map(str, paths))}"),
                  soft_wrap=True)


def _load_report_or_fail(path: Path) -> dict:
    from ..report import ReportError, load_report

    try:
        return load_report(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None


@command()
def baseline(
    report: Annotated[Path, typer.Argument(help="Run report JSON (from `bench`).")],
    baselines: opt.Baselines = None,
    hardware_class: opt.HardwareClass = None,
    update: Annotated[bool, typer.Option("--update", help="Replace existing entries; prints the diff.")] = False,
    tau_band: Annotated[float, typer.Option("--tau-band", help="Tau band, as a fraction of tau.")] = 0.05,
    position_band: Annotated[float, typer.Option("--position-band", help="Per-position band, absolute.")] = 0.05,
    speedup_band: Annotated[float, typer.Option("--speedup-band", help="Speedup band, fraction of speedup.")] = 0.10,
) -> None:
    """Write baselines (tau, per-position floors, speedup, with bands) from a run report."""
    from ..baselines import BaselineError, BaselineExists, baseline_path, entries_from_report, load_baselines
    from ..baselines import merge_entries, write_baselines

    for value, option in ((tau_band, "--tau-band"), (position_band, "--position-band"),
                          (speedup_band, "--speedup-band")):
        if not 0 <= value < 1:
            raise CliError(f"{option} must be in [0, 1), got {value}")
    data = _load_report_or_fail(report)
    hw = hardware_class or data["hardware_class"]
    entries = entries_from_report(data, hw_class=hw, tau_band=tau_band, position_band=position_band,
                                  speedup_band=speedup_band)
    if not entries:
        raise CliError(f"{report} holds no speculative runs to make baselines from")
    path = baseline_path(baselines, hw)
    console = stdout_console()
    try:
        existing = load_baselines(path) if path.exists() else None
        written, diff = write_baselines(path, merge_entries(existing, entries), update=update)
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
    console.print(escape(f"no changes to {written}" if not diff else f"wrote {len(entries)} entries to {written}"),
                  soft_wrap=True)


@command()
def gate(
    report: Annotated[Path, typer.Argument(help="Run report JSON (from `bench`).")],
    baselines: opt.Baselines = None,
    hardware_class: opt.HardwareClass = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the verdicts as JSON.")] = None,
) -> None:
    """Compare a run report with stored baselines.

    Exit codes: 0 all pass; 1 regression (any fail); 3 inconclusive (a speedup CI straddles the
    band's lower edge, no fail); 4 missing baseline or measurement (no fail or inconclusive);
    2 unusable input.
    """
    from ..baselines import BaselineError, baseline_path, load_baselines
    from ..gate import evaluate, exit_code

    data = _load_report_or_fail(report)
    hw = hardware_class or data["hardware_class"]
    path = baseline_path(baselines, hw)
    loaded = None
    if path.exists():
        try:
            loaded = load_baselines(path)
        except BaselineError as exc:
            raise CliError(str(exc)) from None
    rows = evaluate(data, loaded, hw)
    s = data.get("settings", {})
    table = Table(title=escape(f"gate: {s.get('engine')} on {s.get('pair_name')} ({hw}) vs {path}"))
    for column, justify in (("run", "left"), ("metric", "left"), ("status", "left"), ("measured", "right"),
                            ("band", "right"), ("margin", "right"), ("note", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    colours = {"pass": "green", "fail": "red", "inconclusive": "yellow", "missing": "magenta"}
    for r in rows:
        table.add_row(escape(r.run), r.metric, f"[{colours[r.status]}]{r.status}[/]", escape(r.measured),
                      escape(r.band), "-" if r.margin is None else f"{r.margin:+.3f}", escape(r.message))
    console = stdout_console()
    console.print(table)
    code = exit_code(rows)
    counts = {k: sum(r.status == k for r in rows) for k in colours}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"schema": "ddtree-conformance/gate", "schema_version": 1, "report": str(report),
                                   "baselines": str(path), "hardware_class": hw, "exit_code": code,
                                   "counts": counts, "rows": [r.as_dict() for r in rows]}, indent=1) + "\n")
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    verdict = {0: "PASS", 1: "REGRESSION", 3: "INCONCLUSIVE", 4: "MISSING BASELINE"}[code]
    console.print(escape(f"gate {verdict} (exit {code}): {summary}"), soft_wrap=True)
    if not path.exists():
        console.print(escape(f"no baseline file {path}: every run is 'missing'"), soft_wrap=True)
    raise typer.Exit(code)
