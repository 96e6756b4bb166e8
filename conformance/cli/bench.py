"""``bench``: throughput against plain decoding, or A/B against another build (:mod:`.ab`).

``baseline`` and ``gate`` are in :mod:`.gates`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..baselines import BaselineError, baseline_path, load_baselines
from ..input_validation import validate_run_inputs
from ..output_paths import output_path
from ..paths import REPORTS_DIR
from ..progress import progress_printer
from ..report import new_report, write_report
from ..run import Run
from ..support import unsupported
from . import options as opt
from .base import EXIT_FAILED, EXIT_INCONCLUSIVE, CliError, command, stderr_console, stdout_console
from .gates import _load_report_or_fail

__all__ = ["bench"]


GateAgainst = Annotated[
    Optional[Path],
    typer.Option(
        "--baselines",
        help="Go sequential: repeat until every run's speedup interval clears the lower edge of its "
        "band in these baselines (file, or folder holding <hardware-class>.json), or the time "
        "budget is spent. Without it: --repeats fixed repeats.",
    ),
]


Repeats = Annotated[int, typer.Option("--repeats", "-r", help="Fixed repeats when no --baselines are given.")]
Alpha = Annotated[
    float,
    typer.Option("--alpha", help="Error budget of the interval (each wrong verdict <= alpha/2), spent over the looks."),
]
MinRepeats = Annotated[int, typer.Option("--min-repeats", help="Sequential: first look after this many repeats.")]
MaxRepeats = Annotated[int, typer.Option("--max-repeats", help="Sequential: stop undecided after this many repeats.")]
TimeBudget = Annotated[
    float,
    typer.Option(
        "--time-budget", help="Sequential: stop undecided once the timed repeats have taken this many seconds."
    ),
]
Warmup = Annotated[bool, typer.Option("--warmup/--no-warmup", help="One untimed call per config first.")]
Against = Annotated[
    Optional[str],
    typer.Option(
        "--against",
        metavar="ENGINE",
        help="A/B: measure the engine against this baseline build, interleaved on the "
        "same runner, instead of against plain decoding: an engine here (name or "
        "module:Class), or a build of --engine to install apart (a requirement, a "
        "wheel or a folder). Sequential on the throughput ratio; `gate` judges "
        "the report.",
    ),
]
AgainstEngine = Annotated[
    Optional[str],
    typer.Option(
        "--against-engine", help="A/B: the engine spec the installed baseline runs as.", show_default="--engine"
    ),
]
AgainstOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--against-option",
        metavar="KEY=VALUE",
        help="A/B: the baseline's engine options (repeatable).",
        show_default="--engine-option's",
    ),
]
Tolerance = Annotated[
    float,
    typer.Option(
        "--tolerance", help="A/B: the candidate may be this fraction slower than the baseline (edge 1 - tolerance)."
    ),
]
AbSpread = Annotated[
    Optional[str],
    typer.Option(
        "--ab-spread",
        envvar="DDTREE_AB_SPREAD",  # so `ci`, which runs `bench`, takes it from the CI config's environment
        metavar="SD:DF",
        help="A/B: the between-process sd of the log throughput ratio that A/A runs on this kind of runner "
        "measured, with its degrees of freedom (e.g. 0.0235:10; scripts/ab_bias.py --pool): the interval "
        "includes it. Not given: none.",
    ),
]
BenchOut = Annotated[
    Optional[str],  # a str, as check's --out: a Path drops the trailing '/' that names a folder still to be made
    typer.Option(
        "--out",
        "-o",
        help="JSON report path (.md and .html beside it); an existing folder, or a path ending in '/', gets "
        "the default file name inside it.",
        show_default="reports/bench-<engine>.json (A/B: ab-<engine>.json)",
    ),
]


@opt.option_group
class Timing:
    """How a bench repeats: fixed --repeats, or sequential against --baselines."""

    repeats: Repeats = 5
    baselines: GateAgainst = None
    alpha: Alpha = 0.05
    min_repeats: MinRepeats = 3
    max_repeats: MaxRepeats = 60
    time_budget: TimeBudget = 600.0
    warmup: Warmup = True

    def plan(self):
        """The sequential plan (:class:`~ddtree_conformance.sequential.SequentialPlan`); bad values: exit 2."""
        from ..sequential import SequentialPlan

        if self.repeats < 2:
            raise CliError(f"--repeats must be >= 2 (an interval needs two repeats), got {self.repeats}")
        try:
            return SequentialPlan(
                alpha=self.alpha,
                min_repeats=self.min_repeats,
                max_repeats=self.max_repeats,
                time_budget_s=self.time_budget,
            )
        except ValueError as exc:
            raise CliError(f"--alpha/--min-repeats/--max-repeats/--time-budget: {exc}") from None


@opt.option_group
class AgainstBuild:
    """``bench --against``: the A/B run's baseline build and its verdict's edge."""

    against: Against = None
    against_engine: AgainstEngine = None
    against_option: AgainstOption = None
    tolerance: Tolerance = 0.05
    ab_spread: AbSpread = None


@command()
def bench(
    ctx: typer.Context,
    *,
    target: opt.Target,
    timing: Timing,
    ab_build: AgainstBuild,
    isolate: opt.Isolate = None,
    out: BenchOut = None,
    control: opt.EngineControl,
    threads: opt.Threads = None,
    hardware_class: opt.HardwareClass = None,
) -> None:
    """Measure speedup over plain decoding: paired, interleaved repeats; sequential against --baselines."""
    # imported where used (as in every command): they pull torch, numpy or scipy; --help and bad options stay fast
    plan = timing.plan()
    settings = opt.run_settings(
        **target.values(), isolate=isolate, **control.values(), torch_threads=threads, held_out_prompts=0
    )  # a bench times the bundled prompts only: every run and its baseline time the same set
    validate_run_inputs(settings)
    kind = "bench" if ab_build.against is None else "ab"  # an A/B report is named so, in reports/ or an --out folder
    out_path = output_path(
        out,
        REPORTS_DIR / f"{kind}-{settings.engine.replace(':', '_')}.json",
        settings,
        pairs_file=target.pairs_file,
        extra=[timing.baselines],
    )  # absolute, never an input of the run; `--out DIR/` makes the folder and writes inside
    hw = opt.hw_class(settings.device, hardware_class)
    from_env = _from_environment(ctx, "ab_spread")
    _ab_spread(ab_build.ab_spread, from_env)  # a malformed spread is an error wherever it came from, before any run
    if ab_build.ab_spread and ab_build.against is None:  # never ignored silently
        _unused_ab_spread(from_env)
    if ab_build.against is not None:  # A/B: conformance/cli/ab.py
        _bench_ab(settings, ab_build, timing, plan, hw=hw, out_path=out_path)
        return
    report = {**new_report("bench", settings.model_dump(), hw), **_measure(settings, timing, plan, hw)}
    paths = write_report(report, out_path)
    _print_bench(report, settings, hw, paths)


def _bench_ab(settings, ab_build: AgainstBuild, timing: Timing, plan, *, hw: str, out_path: Path) -> None:
    """The A/B run; exits with its verdict (1 fail, 3 inconclusive), as `gate` does."""
    from .ab import bench_against

    if timing.baselines is not None:
        raise CliError("--against and --baselines: an A/B run needs no stored baselines; give one of them")
    written = bench_against(
        settings,
        ab_build.against,
        hw=hw,
        plan=plan,
        warmup=timing.warmup,
        tolerance=ab_build.tolerance,
        out=out_path,
        against_engine=ab_build.against_engine,
        against_options=ab_build.against_option,
        spread=_ab_spread(ab_build.ab_spread),
    )
    found = _load_report_or_fail(written).get("verdict") or {}
    code = {"fail": EXIT_FAILED, "inconclusive": EXIT_INCONCLUSIVE}.get(found.get("status"))
    if code is not None:
        raise CliError(f"A/B {found['status'].upper()}: {found.get('reason', '')}", exit_code=code)


def _measure(settings, timing: Timing, plan, hw: str) -> dict:
    """The bench's measurement (``run_bench``): the engine started, checked for support and timed."""
    from ..session import SuiteSession

    runs = [("dflash", None)] if "dflash" in settings.modes else []
    runs += [("ddtree", b) for b in settings.budgets] if "ddtree" in settings.modes else []
    edges, spreads = _edges(timing.baselines, hw, settings, runs) if timing.baselines is not None else (None, None)
    session = SuiteSession(settings)
    try:
        eng = session.engine
        session.require_support()  # every budget within capabilities().max_budget, dtype, device
        problem = unsupported(
            session.capabilities,
            dtype=settings.dtype,
            device=settings.device,
            modes=["plain", *settings.modes],
            no_drafter=settings.drafter_dir is None,
        )
        if problem:
            raise CliError(problem)
        return _timed(session, eng, settings, runs, timing, plan, edges, spreads)
    finally:
        session.close()


def _timed(session, eng, settings, runs, timing: Timing, plan, edges, spreads) -> dict:
    """``run_bench`` with a progress bar on stderr (and a line per timed run in CI logs)."""
    from ..bench import BenchError, run_bench

    one_run = [label for label in (edges or {}) if label not in (spreads or {})]
    requests = session.requests()
    printer = progress_printer()
    done = [0]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr_console(), transient=True) as progress:
        task = progress.add_task(f"bench {settings.engine}", total=None)

        def step(label: str) -> None:
            progress.update(task, advance=1, description=f"bench {settings.engine}: {label}")
            done[0] += 1
            if printer is not None:  # CI logs: one line per timed run
                printer(f"bench {settings.engine}: {label} ({done[0]} runs)")

        try:
            return run_bench(
                eng,
                requests,
                lambda m, b: session.config(m, b),
                runs,
                repeats=timing.repeats,
                edges=edges,
                spreads=spreads,
                one_run=one_run,
                plan=plan,
                warmup=timing.warmup,
                on_step=step,
            )
        except BenchError as exc:
            raise CliError(str(exc), exit_code=EXIT_FAILED) from exc


def _bench_table(report: dict, settings, hw: str) -> Table:
    table = Table(
        title=escape(
            f"bench: {settings.engine} on {settings.pair_name} ({settings.dtype}, "
            f"{settings.device}, {hw}), {report['bench']['repeats']} repeats, clock "
            f"{report['bench']['clock']}"
        )
    )
    for column, justify in (
        ("run", "left"),
        ("tau", "right"),
        ("step ms", "right"),
        ("round ms", "right"),
        ("speedup [CI]", "right"),
        ("CV", "right"),
        ("stopped", "left"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    for run in report["runs"]:
        sp, cm = run.get("speedup"), run.get("cost_model") or {}
        table.add_row(
            run["label"],
            f"{run['tau']:.3f}",
            f"{cm['step_s'] * 1e3:.2f}" if cm.get("step_s") else "-",
            f"{cm['round_s'] * 1e3:.2f}" if cm.get("round_s") else "-",
            "-" if not sp else f"{sp['estimate']:.3f}x [{_fmt(sp['ci_low'])}, {_fmt(sp['ci_high'])}]",
            "-" if not sp or sp["cv"] is None else f"{sp['cv']:.3f}",
            "-" if not sp else escape(f"{sp['stop']['decision']}: {sp['stop']['reason']}"),
        )
    return table


def _print_bench(report: dict, settings, hw: str, paths) -> None:
    from ..machine_state import describe

    console = stdout_console()
    console.print(_bench_table(report, settings, hw))
    shown = ", ".join(f"{k}={v}" for k, v in sorted(report["bench"]["engine_settings"].items()))
    console.print(escape(f"engine settings: {shown or 'none reported'}"), soft_wrap=True)
    console.print(escape(f"machine: {describe(report['bench'].get('machine'))}"), soft_wrap=True)
    console.print(escape(f"warm-up: {report['bench']['warmup'].get('reason')}"), soft_wrap=True)
    busy = [f"{r['label']} {r['gpu_busy_share']:.0%}" for r in report["runs"] if r.get("gpu_busy_share") is not None]
    if busy:
        console.print(escape("GPU busy share (one profiled call each): " + ", ".join(busy)), soft_wrap=True)
    for warning in report["bench"]["warnings"]:
        stderr_console().print(escape(f"warning: {warning}"), soft_wrap=True)
    console.print(escape(f"wrote {', '.join(map(str, paths))}"), soft_wrap=True)


def _from_environment(ctx: typer.Context, param: str) -> bool:
    """Whether the parameter's value came from its environment variable (click's ParameterSource; compared by
    name, since typer may carry its own click)."""
    return getattr(ctx.get_parameter_source(param), "name", None) == "ENVIRONMENT"


def _unused_ab_spread(from_env: bool) -> None:
    """An A/B spread without a baseline build: refused when given on the command line; from the environment
    (``$DDTREE_AB_SPREAD``, set for a whole CI job, whose stored-baseline runs read it too) noted and left unused."""
    if not from_env:
        raise CliError(
            "--ab-spread is the A/B interval's between-process spread: it needs --against (a stored baseline"
            " carries its own between-run spread)"
        )
    stderr_console().print(
        "note: $DDTREE_AB_SPREAD is not used: it widens an A/B interval, and this bench has no --against"
        " (a stored baseline carries its own between-run spread)",
        soft_wrap=True,
    )


def _ab_spread(text: str | None, from_env: bool = False) -> tuple[float, int] | None:
    """``SD:DF`` (``0.0235:10``) as (variance, df); None when not given. A malformed one is an error naming where
    it came from."""
    from ..ab import parse_ab_spread

    if not text:
        return None
    try:
        return parse_ab_spread(text)
    except ValueError as err:
        raise CliError(f"{err} (from $DDTREE_AB_SPREAD)" if from_env else str(err)) from None


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _edges(baselines: Path, hw: str, settings, runs) -> tuple[dict[str, float], dict[str, tuple[float, int]]]:
    """Lower speedup edges per run label from the baselines of this hardware class, and the between-run
    spread of those of 2+ runs. Runs without a speedup baseline are measured alongside, with no edge; with
    none at all the bench runs its fixed --repeats (the gate then reports the baseline as missing). An
    unreadable file is an error."""
    path = baseline_path(baselines, hw)
    labels = ", ".join(Run(m, b).label for m, b in runs)
    if not path.exists():
        stderr_console().print(
            escape(f"note: no baseline file {path} for hardware class {hw}: --repeats fixed repeats, not sequential"),
            soft_wrap=True,
        )
        return {}, {}
    try:
        loaded = load_baselines(path)
    except BaselineError as exc:
        raise CliError(str(exc)) from None
    edges, spreads = {}, {}
    for mode, budget in runs:
        entry = loaded.find(hw, settings.engine, settings.pair_name, mode, budget)
        if entry is not None and entry.speedup is not None:
            edges[Run(mode, budget).label] = entry.speedup.lower
            if entry.speedup.spread() is not None:
                spreads[Run(mode, budget).label] = entry.speedup.spread()
    if not edges:
        stderr_console().print(
            escape(
                f"note: {path} has no speedup baseline for {settings.engine} on "
                f"{settings.pair_name} ({labels}): --repeats fixed repeats, not sequential"
            ),
            soft_wrap=True,
        )
    return edges, spreads
