"""``check`` (the conformance plan against one engine) and ``record`` (golden files)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any, NamedTuple, Optional

import typer
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ..input_validation import validate_run_inputs
from ..output_paths import output_path
from ..paths import REPORTS_DIR
from ..run import Run
from . import options as opt
from .base import (
    EXIT_FAILED,
    EXIT_HELP,
    EXIT_INCOMPLETE,
    CliError,
    EngineFailed,
    command,
    stderr_console,
    stdout_console,
)

__all__ = ["check", "record"]


@command(help="Run the conformance checks against one engine.\n\n" + EXIT_HELP)
def check(
    *,
    target: opt.Target,
    only: opt.Checks = None,
    isolate: opt.Isolate = None,
    golden_dir: opt.GoldenDir = None,
    out: opt.Out = None,
    control: opt.EngineControl,
    threads: opt.Threads = None,
    hardware_class: opt.HardwareClass = None,
    tensor_parallel_size: opt.TensorParallel = None,
    held_out_prompts: opt.HeldOutPrompts = None,
    run_seed: opt.RunSeed = None,
    profile: opt.Profile = None,
    allow_skip: opt.AllowSkip = None,
) -> None:
    settings = opt.run_settings(
        **target.values(),
        checks=only,
        isolate=isolate,
        golden_dir=golden_dir,
        **control.values(),
        torch_threads=threads,
        tensor_parallel_size=tensor_parallel_size,
        held_out_prompts=held_out_prompts,
        run_seed=run_seed,
        profile=profile,
        allow_skip=allow_skip,
    )
    validate_run_inputs(settings)  # bad prompts, ids or lengths: exit 2 before any engine work (and heavy import)
    out_path = output_path(
        out, REPORTS_DIR / f"check-{settings.engine.replace(':', '_')}.json", settings, pairs_file=target.pairs_file
    )  # absolute, never an input of the run
    import_failure = _engine_import_failure(settings)
    checks = _planned_checks(settings)
    from ..report import CHECK_SCHEMA, new_report

    partial = new_report(
        "check", settings.model_dump(), opt.hw_class(settings.device, hardware_class), schema=CHECK_SCHEMA
    )
    started = time.perf_counter()
    if import_failure is not None:
        ran = _not_started(settings, checks, import_failure)
    else:
        ran = _run_checks(settings, checks, partial, out_path)
    elapsed = time.perf_counter() - started
    _print_results(settings, ran.results)
    counts, found = _write_check_report(settings, checks, ran, partial, out_path, elapsed)
    _check_exit(ran, counts, found)


class _Ran(NamedTuple):
    """What a check run left: the results, the engine's failure (None: none), its identity and run metrics."""

    results: list
    failure: Any
    identity: dict
    run_metrics: list
    held_out: list


def _engine_import_failure(settings) -> Any:
    """The EngineError of an engine named right whose module does not import here (exit 5, with a report);
    None when it imports. An unknown engine or option raises (exit 2 before any work)."""
    from ..adapters.interface import EngineError, EngineUsageError
    from ..adapters.registry import resolve_engine

    try:
        resolve_engine(settings.engine, settings.engine_options)
    except EngineUsageError:
        raise
    except EngineError as exc:
        return exc
    return None


def _planned_checks(settings) -> list:
    """The plan; notes on --allow-skip names it does not plan; the golden file read when needed (exit 2)."""
    from ..checks import needs_golden, plan
    from ..coverage import check_allow_skip
    from ..golden_files import load_golden

    checks = plan(settings)
    for note in check_allow_skip(settings):  # a known name this run does not plan: a note, not an error
        print(f"note: --allow-skip {note}", file=sys.stderr, flush=True)
    if needs_golden(checks):
        load_golden(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)  # unreadable: exit 2
    return checks


def _not_started(settings, checks: list, import_failure: Exception) -> _Ran:
    from ..adapters.interface import EngineDied
    from ..checks.runner import not_run, one_line

    return _Ran(
        results=not_run(checks, f"the engine could not start: {one_line(import_failure)}"),
        failure=EngineDied(one_line(import_failure), str(import_failure).partition("\n")[2]),
        identity={"spec": settings.engine, "name": "", "version": ""},
        run_metrics=[],
        held_out=[],
    )


def _run_checks(settings, checks: list, partial: dict, out_path) -> _Ran:
    """Run the plan in a session; the partial report is rewritten after each check (a run killed at a
    deadline keeps what finished)."""
    from ..adapters.interface import EngineDied
    from ..check_report import engine_identity
    from ..checks.runner import not_run, one_line
    from ..oracle import hold as hold_oracle
    from ..progress import progress_printer
    from ..session import SuiteSession
    from ..session.run_metrics import runs_from_session

    printer = progress_printer()
    session = SuiteSession(settings, progress=printer)
    if printer is not None:
        printer(f"check: {len(checks)} checks against engine {settings.engine!r}")
    try:
        hold_oracle(session)  # golden records, manifest and calibration held before the engine starts
        try:
            session.require_support()
        except EngineDied as exc:
            results = not_run(checks, f"the engine could not start: {one_line(exc)}")
        else:
            results = _run_plan(session, settings, checks, partial, out_path, printer)
        failure, identity = session.failure, engine_identity(session)
        try:
            run_metrics = runs_from_session(session)
        except Exception:  # a dead engine leaves partial runs: the report keeps the checks' results
            run_metrics = []
        held_out = [{"id": p.id, "prompt_ids": p.prompt_ids} for p in session.inputs.drawn_held_out()]
        return _Ran(results, failure, identity, run_metrics, held_out)
    finally:
        session.close()


def _run_plan(session, settings, checks: list, partial: dict, out_path, printer) -> list:
    """``run_plan`` with progress: a line per check in CI logs, else a bar on stderr."""
    from ..checks import run_plan
    from ..report import write_partial_report

    finished: list = []

    def keep(result) -> None:
        finished.append(result)
        write_partial_report(partial, finished, checks, out_path)

    if printer is not None:
        return run_plan(session, checks, on_result=lambda r: (keep(r), printer(progress_line(r))))
    with Progress(console=stderr_console(), transient=True) as progress:
        task = progress.add_task(f"{settings.engine}: {len(checks)} checks", total=len(checks))
        return run_plan(session, checks, on_result=lambda r: (keep(r), progress.advance(task)))


def _print_results(settings, results: list) -> None:
    table = Table(title=escape(f"{settings.engine} on {settings.pair_name} ({settings.dtype}, {settings.device})"))
    for column in ("check", "status", "message"):
        table.add_column(column, overflow="fold")
    colours = {"pass": "green", "fail": "red", "skip": "yellow"}
    for r in results:
        status = "not run" if r.details.get("not_run") else r.status if r.applicable else "n/a"
        table.add_row(escape(r.check), f"[{colours[r.status]}]{status}[/]", escape(r.message))
    stdout_console().print(table)


def _write_check_report(settings, checks: list, ran: _Ran, partial: dict, out_path, elapsed: float):
    """The finished report written (JSON, Markdown, HTML) and its line printed; its counts and verdict."""
    from ..check_report import entries_of, finish_check_report
    from ..coverage import check_allow_skip
    from ..report import write_report

    report, _, found = finish_check_report(
        partial,
        entries_of(checks, ran.results),
        allow_skip=settings.allow_skip or (),
        runs=ran.run_metrics,
        engine=ran.identity,
        elapsed_s=elapsed,
        engine_failure=None if ran.failure is None else (str(ran.failure), ran.failure.log_tail),
        allow_skip_notes=check_allow_skip(settings),
    )
    counts = report["counts"]
    json_path, md_path, html_path = write_report({**report, "held_out_prompts": ran.held_out}, out_path)
    not_run_note = f", {counts['not_run']} not run" if counts["not_run"] else ""
    inapplicable = sum(not r.applicable for r in ran.results)
    na_note = f" ({inapplicable} not applicable on this run)" if inapplicable else ""
    stdout_console().print(
        escape(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped{na_note}{not_run_note} "
            f"in {elapsed:.0f} s; report {json_path} (+ {md_path.name}, {html_path.name})"
        ),
        soft_wrap=True,
    )
    return counts, found


def _check_exit(ran: _Ran, counts: dict, found: dict) -> None:
    """Exit 5 when the engine failed, 1 when a check failed, 7 when the run is incomplete; else return."""
    from ..checks.runner import one_line

    total = len(ran.results)
    if ran.failure is not None:
        skipped = f" ({counts['not_run']} of {total} checks not run)" if counts["not_run"] else ""
        raise EngineFailed(f"{one_line(ran.failure)}{skipped}", ran.failure.log_tail)
    if counts["fail"]:
        raise CliError(f"{counts['fail']} of {total} checks failed", exit_code=EXIT_FAILED)
    if found["status"] == "incomplete":
        raise CliError(f"run incomplete: {found['reason']}", exit_code=EXIT_INCOMPLETE)


RecordBudgets = Annotated[
    Optional[str], typer.Option("--budgets", help="Comma-separated DDTree budgets.", show_default="16,32,64,256")
]
Update = Annotated[
    bool,
    typer.Option(
        "--update",
        help="Replace an existing golden file; prints the diff. "
        "Refused when it would drop records, budgets or output "
        "tokens the file holds.",
    ),
]
Replace = Annotated[
    bool,
    typer.Option(
        "--replace",
        help="Replace an existing golden file even where it drops records, budgets or output tokens "
        "(implies --update).",
    ),
]


@command()
def record(
    *,
    dirs: opt.ModelDirs,
    pair_name: opt.PairName = None,
    budgets: RecordBudgets = None,
    inputs: opt.PromptInputs,
    max_new_tokens: opt.MaxNewTokens = None,
    golden_dir: opt.GoldenDir = None,
    update: Update = False,
    replace: Replace = False,
    threads: opt.Threads = None,
) -> None:
    """Record golden outputs, top-2 gaps and acceptance traces with the reference engine."""
    settings = opt.run_settings(
        engine="reference",
        **dirs.values(),
        pair_name=pair_name,
        budgets=budgets or "16,32,64,256",
        **inputs.values(),
        max_new_tokens=max_new_tokens,
        isolate=False,
        golden_dir=golden_dir,
        torch_threads=threads,
        held_out_prompts=0,
    )  # golden files hold the prompt set's prompts only
    prompt_set = validate_run_inputs(settings)
    _refuse_overwrite(settings, prompt_set, update=update, replace=replace)
    golden = _record_golden(settings)
    _write_golden(settings, golden, update=update, replace=replace)


def _refuse_overwrite(settings, prompt_set, *, update: bool, replace: bool) -> None:
    """An existing golden file is kept without --update, and refused before the run where the update
    would drop records, budgets or tokens (unless --replace)."""
    from ..golden_files import GoldenError, GoldenExists, golden_losses, golden_path, load_golden, refusal

    path = golden_path(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)
    if path.exists() and not (update or replace):
        raise GoldenExists(f"{path} exists; pass --update to replace it (a diff will be shown)")
    if not path.exists() or replace:
        return
    try:
        old = load_golden(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)
    except GoldenError:
        return  # unreadable: replaced with a warning naming it
    keys = [Run("dflash").golden_key] + [Run("ddtree", b).golden_key for b in settings.budgets]
    losses = golden_losses(old, [p.id for p in prompt_set], keys, settings.max_new_tokens)
    if losses:
        raise GoldenExists(refusal(path, losses))


def _record_golden(settings):
    from ..golden_files import record_golden
    from ..session import SuiteSession

    session = SuiteSession(settings)
    try:
        return record_golden(
            session, settings.budgets, progress=lambda key: stderr_console().print(escape(f"recorded {key}"))
        )
    finally:
        session.close()


def _write_golden(settings, golden, *, update: bool, replace: bool) -> None:
    from ..golden_files import write_golden

    written, diff = write_golden(
        settings.golden_dir,
        golden,
        update=update,
        replace=replace,
        warn=lambda text: print(f"warning: {text}", file=sys.stderr, flush=True),
    )
    console = stdout_console()
    for line in diff:
        console.print(escape(line), soft_wrap=True)
    console.print(escape(f"wrote {written}"), soft_wrap=True)


def progress_line(result) -> str:
    """``check ID: STATUS (S s): first line of the message``, so a CI log stopped at a deadline still
    says why a check failed, and what a pass measured (excused positions and rounds, tau)."""
    line = f"check {result.check}: {result.status} ({result.details.get('elapsed_s', 0.0):.1f} s)"
    if result.message:
        first = result.message.splitlines()[0]
        line += ": " + (first if len(first) <= 400 else first[:399] + "…")
    return line
