"""``generate`` (one engine, one mode, results to JSONL) and ``engines`` (what is installed here)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..adapters.interface import (
    Capabilities,
    Engine,
    EngineDied,
    EngineError,
    EngineUsageError,
    Request,
    RequestResult,
    RunConfig,
)
from ..adapters.process import IsolatedEngine
from ..adapters.registry import create_engine, list_engines, load_engine_class, resolve_engine
from ..input_validation import pair_limits, validate_prompts
from ..integrity import PairLimits, is_integrity_error, validate_results
from ..option_names import option
from ..output_paths import output_path
from ..paths import REPORTS_DIR
from ..progress import Heartbeat, progress_printer
from ..prompts import Prompt, load_prompts, resolve_prompt_set
from ..settings import GenerateSettings
from ..support import unsupported
from . import options as opt
from .base import EXIT_FAILED, CliError, command, stderr_console, stdout_console
from .generate_options import BatchSize, Budget, GenerateOut, MaxNewTokens, Mode, Sampling, Trace

__all__ = [
    "generate",
    "engines",
    "default_stop_tokens",
    "build_requests",
    "run_prompts",
    "JsonlSink",
    "result_row",
    "summary_table",
    "require_support",
    "open_engine",
]

DEFAULT_MAX_NEW_TOKENS = 64


def open_engine(settings: GenerateSettings) -> Engine:
    """The engine under test: in its own process unless ``--no-isolate``."""
    resolve_engine(settings.engine, settings.engine_options)  # unknown engine/option: fails before any model work
    if settings.isolate:
        return IsolatedEngine(
            settings.engine,
            settings.model_dir,
            settings.drafter_dir,
            timeout_s=settings.engine_timeout_s,
            start_timeout_s=settings.engine_timeout_s,
            timeout_option=option("engine_timeout_s"),
            torch_threads=settings.torch_threads,
            **settings.engine_options,
        )
    try:
        return create_engine(settings.engine, settings.model_dir, settings.drafter_dir, **settings.engine_options)
    except EngineUsageError:
        raise
    except Exception as exc:  # as an isolated engine's start failure reads (and as `check` says it in process)
        raise EngineDied(f"engine {settings.engine!r} failed to start: {type(exc).__name__}: {exc}") from exc


def require_support(engine: Engine, config: RunConfig) -> Capabilities:
    """Fail early (a usage error) when the engine says it cannot run this config here
    (:func:`~ddtree_conformance.support.unsupported`); returns its capabilities."""
    caps = engine.capabilities()
    problem = unsupported(
        caps,
        dtype=config.dtype,
        device=config.device,
        modes=[config.mode],
        budgets=[config.budget] if config.mode == "ddtree" else [],
        budget_option="budget",
        tensor_parallel_size=config.tensor_parallel_size,
        no_drafter=engine.drafter_dir is None,
    )
    if problem:
        raise CliError(problem)
    return caps


def default_stop_tokens(model: str | Path) -> list[int]:
    """The eos id(s) in ``<model>/generation_config.json``; [] when there are none."""
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (ValueError, RecursionError, AttributeError):  # not JSON, not UTF-8, too deep, not an object
        raise CliError(f"{path} is not a valid JSON object; pass --stop-token explicitly") from None
    if eos is None:
        return []
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CliError(f"{path}: eos_token_id {eos!r} is not a token id or list of token ids")
    return list(dict.fromkeys(ids))


def build_requests(
    prompts: Sequence[Prompt], settings: GenerateSettings, stop_token_ids: Sequence[int]
) -> list[Request]:
    """One Request per prompt; ``max_new_tokens`` None means the prompt's own limit, else 64."""
    return [
        Request(
            prompt_ids=p.prompt_ids,
            max_new_tokens=settings.max_new_tokens or p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            stop_token_ids=list(stop_token_ids),
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            seed=settings.seed,
        )
        for p in prompts
    ]


def run_prompts(
    engine: Engine,
    requests: Sequence[Request],
    config: RunConfig,
    *,
    batch_size: int = 4,
    on_chunk: Callable[[int, list[RequestResult]], None] | None = None,
    description: str = "generating",
    validate: Callable[[int, list[Request], list[RequestResult]], list[RequestResult]] | None = None,
) -> list[RequestResult]:
    """Run requests through ``engine.generate`` in chunks, with a progress bar on stderr (progress
    lines and a heartbeat when stderr is not a terminal).

    ``validate(start_index, chunk, results)`` checks each chunk's results (the integrity rules) before
    ``on_chunk(start_index, results)`` sees them (for incremental output). Without ``validate``, a
    chunk with a result count other than its request count is an :class:`EngineError`.
    """
    results: list[RequestResult] = []
    console = stderr_console()
    printer = None if console.is_terminal else progress_printer(True)
    name = getattr(engine, "name", "engine")
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(description, total=len(requests))
        for start in range(0, len(requests), batch_size):
            chunk = list(requests[start : start + batch_size])
            with Heartbeat(printer, name, f"generate {len(chunk)} request{'' if len(chunk) == 1 else 's'}"):
                out = engine.generate(chunk, config)
            if validate is not None:
                out = validate(start, chunk, out)
            elif not isinstance(out, list) or len(out) != len(chunk):
                got = len(out) if isinstance(out, list) else type(out).__name__
                raise EngineError(f"engine {name!r} returned {got} results for {len(chunk)} requests")
            results.extend(out)
            if on_chunk is not None:
                on_chunk(start, out)
            progress.advance(task, len(chunk))
            if printer is not None:
                printer(f"{description}: {min(start + batch_size, len(requests))}/{len(requests)} requests")
    return results


class JsonlSink:
    """Crash-safe JSONL output: rows go to ``<out>.partial`` (flushed per chunk) and are renamed
    to ``out`` only when :meth:`commit` is called. After a crash the ``.partial`` file keeps what
    was done."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.partial = self.out.with_name(self.out.name + ".partial")
        self.rows = 0
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.partial, "w", encoding="utf-8")

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.rows += len(rows)

    def commit(self) -> Path:
        self._file.close()
        os.replace(self.partial, self.out)
        return self.out

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_row(prompt: Prompt, result: RequestResult) -> dict[str, Any]:
    """The JSON line for one prompt: its id, category and prompt ids, then the result."""
    head = {"id": prompt.id, "category": prompt.category, "prompt_ids": prompt.prompt_ids}
    return {**head, **result.model_dump(mode="json")}


def summary_table(prompts: Sequence[Prompt], results: Sequence[RequestResult], title: str = "summary") -> Table:
    """Per category: prompts, errors, generated tokens and mean tau (mean of per-prompt tau)."""
    groups: dict[str, list[RequestResult]] = {}
    for prompt, result in zip(prompts, results):
        groups.setdefault(prompt.category, []).append(result)
    table = Table(title=title)
    for name, justify in (
        ("category", "left"),
        ("prompts", "right"),
        ("errors", "right"),
        ("tokens", "right"),
        ("mean tau", "right"),
    ):
        table.add_column(name, justify=justify)

    def row(label: str, rs: Sequence[RequestResult], **style: Any) -> None:
        taus = [r.tau for r in rs if r.finish_reason != "error" and r.tau is not None]
        tau = f"{sum(taus) / len(taus):.3f}" if taus else "-"
        errors = sum(r.finish_reason == "error" for r in rs)
        table.add_row(label, str(len(rs)), str(errors), str(sum(len(r.output_ids) for r in rs)), tau, **style)

    for category in sorted(groups):
        row(category, groups[category])
    if len(groups) > 1:
        table.add_section()
        row("all", list(results), style="bold")
    return table


@command()
def generate(
    *,
    engine: opt.Engine = "reference",
    dirs: opt.ModelDirs,
    mode: Mode = None,
    budget: Budget = None,
    inputs: opt.PromptInputs,
    max_new_tokens: MaxNewTokens = None,
    sampling: Sampling,
    trace: Trace = False,
    batch_size: BatchSize = None,
    out: GenerateOut = None,
    control: opt.EngineControl,
    isolate: opt.Isolate = None,
    threads: opt.Threads = None,
) -> None:
    """Run a prompt set through an engine (in its own process) and write one JSON line per prompt."""
    settings = opt.generate_settings(
        engine=engine,
        **dirs.values(),
        mode=mode,
        budget=budget,
        **inputs.values(),
        max_new_tokens=max_new_tokens,
        **sampling.values(),
        batch_size=batch_size,
        **control.values(),
        isolate=isolate,
        torch_threads=threads,
    )
    config = RunConfig(
        mode=settings.mode,
        budget=settings.budget,
        dtype=settings.dtype,
        device=settings.device,
        trace=trace,
        tensor_parallel_size=settings.tensor_parallel_size,
    )
    prompt_set = _prompt_set(settings)
    stops = settings.stop_token_ids if settings.stop_token_ids is not None else default_stop_tokens(settings.model_dir)
    requests = build_requests(prompt_set, settings, stops)
    out_path = output_path(
        out,
        REPORTS_DIR / f"generate-{settings.mode}.jsonl",
        settings,
        files=lambda path: [path, path.with_name(path.name + ".partial")],
    )
    results, written = _generate(settings, config, prompt_set, requests, out_path)
    console = stdout_console()
    console.print(
        summary_table(prompt_set, results, title=escape(f"{settings.engine} {settings.mode} on {settings.prompt_set}"))
    )
    console.print(escape(f"wrote {len(results)} results to {written}"), soft_wrap=True)
    _fail_on_errors(prompt_set, results, written)


def _prompt_set(settings: GenerateSettings) -> list[Prompt]:
    """The prompts (the first --limit), checked against the pair's limits: exit 2 before any engine work."""
    prompt_path = resolve_prompt_set(settings.prompt_set)
    prompt_set = load_prompts(prompt_path, tokenizer_dir=settings.model_dir)
    prompt_set = prompt_set[: settings.limit] if settings.limit else prompt_set
    validate_prompts(
        prompt_set,
        prompt_path,
        pair_limits(settings.model_dir),
        lambda p: settings.max_new_tokens or p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        "max_new_tokens",
    )
    return prompt_set


def _generate(
    settings: GenerateSettings, config: RunConfig, prompt_set: list[Prompt], requests: list[Request], out_path: Path
) -> tuple[list[RequestResult], Path]:
    """The engine started, checked for support, and run over the requests into the JSONL file."""
    limits = PairLimits.read(settings.model_dir, settings.drafter_dir)
    with open_engine(settings) as eng:
        with Heartbeat(progress_printer(), settings.engine, "start and capabilities()"):
            caps = require_support(eng, config)
        return _generate_into(out_path, eng, settings, config, caps, limits, prompt_set, requests)


def _generate_into(
    out_path: Path,
    eng: Engine,
    settings: GenerateSettings,
    config: RunConfig,
    caps: Capabilities,
    limits: PairLimits,
    prompt_set: list[Prompt],
    requests: list[Request],
) -> tuple[list[RequestResult], Path]:
    """Results written as they come (``.partial`` until the last), each chunk checked against the
    integrity rules first: the file holds only results that keep them."""
    labels = [f"prompt {p.id}" for p in prompt_set]
    with JsonlSink(out_path) as sink:

        def validate(start: int, chunk: list[Request], got: list[RequestResult]) -> list[RequestResult]:
            return validate_results(
                chunk, got, config, limits, caps, labels[start : start + len(chunk)], settings.engine, first_index=start
            )

        def write_chunk(start: int, chunk: list[RequestResult]) -> None:
            bad = next((i for i, r in enumerate(chunk) if is_integrity_error(r)), None)
            valid = chunk if bad is None else chunk[:bad]
            sink.write([result_row(prompt_set[start + i], r) for i, r in enumerate(valid)])
            if bad is not None:  # never written: the file holds only results that keep the rules
                kept = f"; {sink.rows} valid results kept in {sink.partial}" if sink.rows else ""
                raise CliError(f"{chunk[bad].error.splitlines()[0]}{kept}", exit_code=EXIT_FAILED)

        description = f"{settings.engine} {settings.mode}"
        try:
            results = run_prompts(
                eng,
                requests,
                config,
                batch_size=settings.batch_size,
                on_chunk=write_chunk,
                description=description,
                validate=validate,
            )
        except EngineDied as exc:
            kept = f" ({sink.rows} results kept in {sink.partial})" if sink.rows else ""
            raise EngineDied(f"{str(exc).splitlines()[0]}{kept}", exc.log_tail) from exc
        except EngineError as exc:
            kept = f" ({sink.rows} results kept in {sink.partial})" if sink.rows else ""
            raise EngineError(f"{exc}{kept}") from exc
        return results, sink.commit()


def _fail_on_errors(prompt_set: list[Prompt], results: list[RequestResult], written: Path) -> None:
    """Exit 1 when a request failed, naming the first."""
    failed = [(p, r) for p, r in zip(prompt_set, results) if r.finish_reason == "error"]
    if failed:
        first_prompt, first = failed[0]
        raise CliError(
            f"{len(failed)} of {len(results)} requests failed (first: prompt {first_prompt.id!r}: "
            f"{first.error}); results written to {written}",
            exit_code=EXIT_FAILED,
        )


@command()
def engines(model: opt.Model = None, drafter: opt.Drafter = None) -> None:
    """List engine adapters and what each can do here with the given model pair."""
    settings = opt.run_settings(model_dir=model, drafter_dir=drafter)
    model_dir, drafter_dir = settings.model_dir, settings.drafter_dir
    table = Table(title=escape(f"engines (model {model_dir}, drafter {drafter_dir or 'none'})"))
    for name in ("engine", "source", "status", "version", "modes", "dtypes", "devices", "sampling", "traces"):
        table.add_column(name)
    notes: list[str] = []
    for entry in list_engines():
        try:
            load_engine_class(entry.name)
        except EngineError as exc:
            table.add_row(entry.name, entry.source, "[yellow]unavailable[/]")
            notes.append(f"{entry.name}: {exc}")
            continue
        try:
            with create_engine(entry.name, model_dir, drafter_dir) as eng:
                caps = eng.capabilities()
        except Exception as exc:  # one broken adapter must not hide the others
            table.add_row(entry.name, entry.source, "[red]error[/]")
            notes.append(f"{entry.name}: {exc if isinstance(exc, EngineError) else f'{type(exc).__name__}: {exc}'}")
            continue
        table.add_row(
            entry.name,
            entry.source,
            "[green]ok[/]",
            caps.version,
            ",".join(caps.modes),
            ",".join(caps.dtypes),
            ",".join(caps.devices),
            "yes" if caps.sampling else "no",
            "yes" if caps.traces else "no",
        )
    console = stdout_console()
    console.print(table)
    for note in notes:
        console.print(escape(note), soft_wrap=True)
