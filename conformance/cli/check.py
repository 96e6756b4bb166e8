"""``check`` (the conformance plan against one engine) and ``record`` (golden files)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

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
    only: opt.Checks = None,
    isolate: opt.Isolate = None,
    golden_dir: opt.GoldenDir = None,
    out: opt.Out = None,
    engine_option: opt.EngineOptions = None,
    engine_timeout: opt.EngineTimeout = None,
    threads: opt.Threads = None,
    hardware_class: opt.HardwareClass = None,
    tensor_parallel_size: opt.TensorParallel = None,
    held_out_prompts: opt.HeldOutPrompts = None,
    run_seed: opt.RunSeed = None,
    profile: opt.Profile = None,
    allow_skip: opt.AllowSkip = None,
) -> None:
    settings = opt.run_settings(
        engine=engine,
        model_dir=model,
        drafter_dir=drafter,
        pair=pair,
        pairs_file=pairs_file,
        pair_name=pair_name,
        modes=modes,
        budgets=budgets,
        dtype=dtype,
        device=device,
        prompt_set=prompts,
        limit=limit,
        max_new_tokens=max_new_tokens,
        checks=only,
        isolate=isolate,
        golden_dir=golden_dir,
        engine_options=engine_option,
        engine_timeout_s=engine_timeout,
        torch_threads=threads,
        tensor_parallel_size=tensor_parallel_size,
        held_out_prompts=held_out_prompts,
        run_seed=run_seed,
        profile=profile,
        allow_skip=allow_skip,
    )
    validate_run_inputs(settings)  # bad prompts, ids or lengths: exit 2 before any engine work (and heavy import)
    out_path = output_path(
        out, REPORTS_DIR / f"check-{settings.engine.replace(':', '_')}.json", settings, pairs_file=pairs_file
    )  # absolute, never an input of the run

    # imported here: the checks pull torch; --help and bad input are refused without it
    from ..adapters.interface import EngineDied, EngineError, EngineUsageError
    from ..adapters.registry import resolve_engine
    from ..check_report import engine_identity, entries_of, finish_check_report
    from ..checks import needs_golden, plan, run_plan
    from ..checks.runner import not_run, one_line
    from ..coverage import check_allow_skip
    from ..golden_files import load_golden
    from ..oracle import hold as hold_oracle
    from ..progress import progress_printer
    from ..report import CHECK_SCHEMA, new_report, write_partial_report, write_report
    from ..session import SuiteSession
    from ..session.run_metrics import runs_from_session

    try:
        resolve_engine(settings.engine, settings.engine_options)  # unknown engine or option: exit 2 before any work
    except EngineUsageError:
        raise
    except EngineError as exc:  # named right, but its module does not import here: exit 5, with a report
        import_failure: EngineError | None = exc
    else:
        import_failure = None
    checks = plan(settings)
    for note in check_allow_skip(settings):  # a known name this run does not plan: a note, not an error
        print(f"note: --allow-skip {note}", file=sys.stderr, flush=True)
    if needs_golden(checks):
        load_golden(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)  # unreadable: exit 2
    partial = new_report(
        "check", settings.model_dump(), opt.hw_class(settings.device, hardware_class), schema=CHECK_SCHEMA
    )
    printer = progress_printer()
    started = time.perf_counter()
    if import_failure is not None:
        results = not_run(checks, f"the engine could not start: {one_line(import_failure)}")
        failure = EngineDied(one_line(import_failure), str(import_failure).partition("\n")[2])
        identity = {"spec": settings.engine, "name": "", "version": ""}
        run_metrics, held_out = [], []
    else:
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
                finished: list = []

                def keep(result) -> None:  # the partial report: a run killed at a deadline keeps what finished
                    finished.append(result)
                    write_partial_report(partial, finished, checks, out_path)

                if printer is not None:
                    results = run_plan(session, checks, on_result=lambda r: (keep(r), printer(progress_line(r))))
                else:
                    with Progress(console=stderr_console(), transient=True) as progress:
                        task = progress.add_task(f"{settings.engine}: {len(checks)} checks", total=len(checks))
                        results = run_plan(session, checks, on_result=lambda r: (keep(r), progress.advance(task)))
            failure = session.failure
            identity = engine_identity(session)
            try:
                run_metrics = runs_from_session(session)
            except Exception:  # a dead engine leaves partial runs: the report keeps the checks' results
                run_metrics = []
            held_out = [{"id": p.id, "prompt_ids": p.prompt_ids} for p in session.inputs.drawn_held_out()]
        finally:
            session.close()
    elapsed = time.perf_counter() - started
    table = Table(title=escape(f"{settings.engine} on {settings.pair_name} ({settings.dtype}, {settings.device})"))
    for column in ("check", "status", "message"):
        table.add_column(column, overflow="fold")
    colours = {"pass": "green", "fail": "red", "skip": "yellow"}
    for r in results:
        status = "not run" if r.details.get("not_run") else r.status if r.applicable else "n/a"
        table.add_row(escape(r.check), f"[{colours[r.status]}]{status}[/]", escape(r.message))
    console = stdout_console()
    console.print(table)
    report, _, found = finish_check_report(
        partial,
        entries_of(checks, results),
        allow_skip=settings.allow_skip or (),
        runs=run_metrics,
        engine=identity,
        elapsed_s=elapsed,
        engine_failure=None if failure is None else (str(failure), failure.log_tail),
        allow_skip_notes=check_allow_skip(settings),
    )
    counts = report["counts"]
    report["held_out_prompts"] = held_out
    out_path, md_path, html_path = write_report(report, out_path)
    not_run_note = f", {counts['not_run']} not run" if counts["not_run"] else ""
    inapplicable = sum(not r.applicable for r in results)
    na_note = f" ({inapplicable} not applicable on this run)" if inapplicable else ""
    console.print(
        escape(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped{na_note}{not_run_note} "
            f"in {elapsed:.0f} s; report {out_path} (+ {md_path.name}, {html_path.name})"
        ),
        soft_wrap=True,
    )
    if failure is not None:
        skipped = f" ({counts['not_run']} of {len(results)} checks not run)" if counts["not_run"] else ""
        raise EngineFailed(f"{one_line(failure)}{skipped}", failure.log_tail)
    if counts["fail"]:
        raise CliError(f"{counts['fail']} of {len(results)} checks failed", exit_code=EXIT_FAILED)
    if found["status"] == "incomplete":
        raise CliError(f"run incomplete: {found['reason']}", exit_code=EXIT_INCOMPLETE)


@command()
def record(
    model: opt.Model = None,
    drafter: opt.Drafter = None,
    pair_name: opt.PairName = None,
    budgets: Annotated[
        Optional[str], typer.Option("--budgets", help="Comma-separated DDTree budgets.", show_default="16,32,64,256")
    ] = None,
    dtype: opt.DType = None,
    device: opt.Device = None,
    prompts: opt.Prompts = None,
    limit: opt.Limit = None,
    max_new_tokens: opt.MaxNewTokens = None,
    golden_dir: opt.GoldenDir = None,
    update: Annotated[
        bool,
        typer.Option(
            "--update",
            help="Replace an existing golden file; prints the diff. "
            "Refused when it would drop records, budgets or output "
            "tokens the file holds.",
        ),
    ] = False,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace an existing golden file even where it drops records, budgets or output tokens "
            "(implies --update).",
        ),
    ] = False,
    threads: opt.Threads = None,
) -> None:
    """Record golden outputs, top-2 gaps and acceptance traces with the reference engine."""
    settings = opt.run_settings(
        engine="reference",
        model_dir=model,
        drafter_dir=drafter,
        pair_name=pair_name,
        budgets=budgets or "16,32,64,256",
        dtype=dtype,
        device=device,
        prompt_set=prompts,
        limit=limit,
        max_new_tokens=max_new_tokens,
        isolate=False,
        golden_dir=golden_dir,
        torch_threads=threads,
        held_out_prompts=0,
    )  # golden files hold the prompt set's prompts only
    prompt_set = validate_run_inputs(settings)

    from ..golden_files import (
        GoldenError,
        GoldenExists,
        golden_losses,
        golden_path,
        load_golden,
        record_golden,
        refusal,
        write_golden,
    )
    from ..session import SuiteSession

    path = golden_path(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)
    if path.exists() and not (update or replace):
        raise GoldenExists(f"{path} exists; pass --update to replace it (a diff will be shown)")
    if path.exists() and not replace:  # what the update would drop, refused before the run
        try:
            old = load_golden(settings.golden_dir, settings.pair_name, settings.prompt_set, settings.dtype)
        except GoldenError:
            old = None  # unreadable: replaced with a warning naming it
        keys = [Run("dflash").golden_key] + [Run("ddtree", b).golden_key for b in settings.budgets]
        losses = [] if old is None else golden_losses(old, [p.id for p in prompt_set], keys, settings.max_new_tokens)
        if losses:
            raise GoldenExists(refusal(path, losses))
    session = SuiteSession(settings)
    try:
        golden = record_golden(
            session, settings.budgets, progress=lambda key: stderr_console().print(escape(f"recorded {key}"))
        )
    finally:
        session.close()
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
