"""The ``ddtree-conformance`` command line.

Layout (for whoever adds the next command):

1. **Errors** -- :class:`CliError` and :func:`cli_errors`. A command registered with
   :func:`command` runs inside :func:`cli_errors`, which turns every expected failure (CliError,
   EngineError/PairError, PromptError, pydantic ValidationError, OSError) into ONE line
   ``error: ...`` on stderr and exit code 2 (:data:`EXIT_USAGE`). Raise :class:`CliError` for your
   own checks; ``CliError(msg, exit_code=EXIT_FAILED)`` for "ran, but something failed".
2. **Shared options** -- ``Annotated`` aliases (:data:`EngineOpt`, :data:`ModelOpt`, ...) so every
   command spells, defaults and documents an option the same way.
3. **Shared steps** -- validation and plumbing every engine-driving command needs:
   :func:`resolve_pair`, :func:`open_engine`, :func:`make_run_config`, :func:`require_support`,
   :func:`make_sampling`, :func:`load_prompt_set`, :func:`default_stop_tokens`,
   :func:`build_requests`, :func:`run_prompts` (chunked, with a progress bar), :class:`JsonlSink`
   (crash-safe JSONL output) and :func:`summary_table`.
4. **Commands** -- ``generate`` and ``engines``. A new command is a function decorated with
   ``@command()`` that takes the shared options and calls the shared steps.
"""

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, Optional

import click
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from adapters.interface import Engine, EngineError, Request, RequestResult, RunConfig
from adapters.registry import create_engine, list_engines, load_engine_class

from . import __version__
from .golden import GoldenError
from .paths import FIXTURE_DRAFTER, FIXTURE_TARGET, GOLDEN_DIR, REPORTS_DIR
from .prompts import Prompt, PromptError, load_prompts
from .session import SuiteSettings

__all__ = [
    "app",
    "command",
    "CliError",
    "cli_errors",
    "fail",
    "EXIT_USAGE",
    "EXIT_FAILED",
    "MODES",
    "DTYPES",
    "resolve_pair",
    "open_engine",
    "make_run_config",
    "require_support",
    "Sampling",
    "make_sampling",
    "load_prompt_set",
    "default_stop_tokens",
    "build_requests",
    "run_prompts",
    "JsonlSink",
    "result_row",
    "summary_table",
]

app = typer.Typer(
    name="ddtree-conformance",
    help="Cross-engine conformance suite for DDTree speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

MODES = ("plain", "dflash", "ddtree")
DTYPES = ("float32", "bfloat16", "float16")

# --------------------------------------------------------------------------------------------
# 1. Errors
# --------------------------------------------------------------------------------------------

EXIT_FAILED = 1  # the command ran but something it checked or ran failed
EXIT_USAGE = 2  # the command could not run as asked (bad option, bad input, unusable model)


class CliError(Exception):
    """A problem the user can act on; printed as one line, no traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fail(message: str, exit_code: int = EXIT_USAGE) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit."""
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)
    raise typer.Exit(exit_code)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return f"invalid {exc.title}: " + "; ".join(parts)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn expected failures into one stderr line and an exit code; let real bugs show."""
    try:
        yield
    except (typer.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise
    except CliError as exc:
        fail(str(exc), exc.exit_code)
    except (EngineError, PromptError, GoldenError) as exc:
        fail(str(exc))
    except ValidationError as exc:
        fail(_validation_message(exc))
    except OSError as exc:
        if exc.strerror and exc.filename:
            fail(f"{exc.strerror}: {exc.filename}")
        fail(str(exc))


def command(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a subcommand of :data:`app`, run inside :func:`cli_errors`."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def guarded(*a: Any, **k: Any) -> Any:
            with cli_errors():
                return func(*a, **k)

        app.command(*args, **kwargs)(guarded)
        return func

    return decorate


def _version(value: bool) -> None:
    if value:
        print(f"ddtree-conformance {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Cross-engine conformance suite for DDTree speculative decoding."""
    _quiet_model_loading()


def _quiet_model_loading() -> None:
    """Keep stderr for our own messages: no weight-loading progress bars from HF libraries."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


# --------------------------------------------------------------------------------------------
# 2. Shared options
# --------------------------------------------------------------------------------------------

EngineOpt = Annotated[
    str, typer.Option("--engine", "-e", help="Engine: built-in name, entry-point name, or module:Class.")
]
EngineOptionsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option", "-O", metavar="KEY=VALUE", help="Engine option (repeatable); VALUE as JSON if it parses."
    ),
]
ModelOpt = Annotated[
    Path, typer.Option("--model", "-m", help="Target model dir (HF format).", show_default="golden/fixture/target")
]
DrafterOpt = Annotated[
    str,
    typer.Option(
        "--drafter", "-d", help="DFlash drafter dir (z-lab format); 'none' for no drafter.",
        show_default="golden/fixture/drafter",
    ),
]
ModeOpt = Annotated[str, typer.Option("--mode", help="Decoding mode: plain | dflash | ddtree.")]
BudgetOpt = Annotated[int, typer.Option("--budget", "-B", help="DDTree node budget (non-root nodes), >= 1.")]
DTypeOpt = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="Device, e.g. cpu, cuda, cuda:1.")]
PromptsOpt = Annotated[str, typer.Option("--prompts", "-p", help="Prompts JSONL path or bundled set name.")]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", "-n", help="Use only the first N prompts.")]
MaxNewTokensOpt = Annotated[
    Optional[int],
    typer.Option(
        "--max-new-tokens",
        help="Tokens to generate per prompt; overrides the prompt set's own limits. (default: the set's own, else 64)",
    ),
]
TemperatureOpt = Annotated[float, typer.Option("--temperature", "-t", help="Sampling temperature; 0 = greedy.")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass, in (0, 1].")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Top-k sampling; 0 disables.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Per-request sampling seed.")]
StopTokenOpt = Annotated[
    Optional[list[int]],
    typer.Option(
        "--stop-token",
        help="Stop token id (repeatable). (default: the eos ids in the target's generation_config.json)",
    ),
]
TraceOpt = Annotated[bool, typer.Option("--trace/--no-trace", help="Record per-round traces.")]
BatchSizeOpt = Annotated[int, typer.Option("--batch-size", help="Prompts per engine.generate call (chunk).")]
OutOpt = Annotated[
    Optional[Path], typer.Option("--out", "-o", help="Output JSONL. (default: reports/<command>-<mode>.jsonl)")
]

DEFAULT_MAX_NEW_TOKENS = 64

# --------------------------------------------------------------------------------------------
# 3. Shared steps
# --------------------------------------------------------------------------------------------


def check_choice(value: str, choices: Sequence[str], option: str) -> str:
    if value not in choices:
        raise CliError(f"{option} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_min(value: int | None, minimum: int, option: str) -> None:
    if value is not None and value < minimum:
        raise CliError(f"{option} must be >= {minimum}, got {value}")


def resolve_pair(model: Path, drafter: str | Path | None) -> tuple[Path, Path | None]:
    """Check the model (and drafter) dirs exist; ``drafter`` 'none'/'' means no drafter."""
    model = Path(model)
    if not model.is_dir():
        what = "does not exist" if not model.exists() else "is not a directory"
        raise CliError(f"model dir {model} {what} (--model)")
    if drafter is None or str(drafter).strip().lower() in ("", "none"):
        return model, None
    drafter_path = Path(drafter)
    if not drafter_path.is_dir():
        what = "does not exist" if not drafter_path.exists() else "is not a directory"
        raise CliError(f"drafter dir {drafter_path} {what} (--drafter; 'none' for plain-only runs)")
    return model, drafter_path


def parse_engine_options(pairs: Sequence[str] | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--engine-option must be KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def open_engine(engine: str, model: Path, drafter: Path | None, **options: Any) -> Engine:
    """Import and construct the engine; pair problems surface here as PairError (one line)."""
    load_engine_class(engine)  # unknown or unavailable engines fail before any model work
    return create_engine(engine, model, drafter, **options)


def make_run_config(
    mode: str, budget: int, dtype: str, device: str, *, trace: bool = False, timing: bool = False
) -> RunConfig:
    check_choice(mode, MODES, "--mode")
    check_choice(dtype, DTYPES, "--dtype")
    check_min(budget, 1, "--budget")
    return RunConfig(mode=mode, budget=budget, dtype=dtype, device=device, trace=trace, timing=timing)


def require_support(engine: Engine, config: RunConfig) -> None:
    """Fail early when the engine says it cannot run this config here."""
    caps = engine.capabilities()
    if config.mode not in caps.modes:
        hint = " (no drafter given?)" if config.mode != "plain" and engine.drafter_dir is None else ""
        raise CliError(
            f"engine {caps.name!r} cannot run mode {config.mode} here{hint}; it supports: {', '.join(caps.modes)}"
        )
    if config.dtype not in caps.dtypes:
        raise CliError(
            f"engine {caps.name!r} does not support dtype {config.dtype}; it supports: {', '.join(caps.dtypes)}"
        )
    device_kind = config.device.split(":", 1)[0]
    if config.device not in caps.devices and device_kind not in caps.devices:
        raise CliError(
            f"engine {caps.name!r} cannot use device {config.device} here; available: {', '.join(caps.devices)}"
        )


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


def make_sampling(temperature: float, top_p: float, top_k: int, seed: int) -> Sampling:
    if temperature < 0:
        raise CliError(f"--temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise CliError(f"--top-p must be in (0, 1], got {top_p}")
    check_min(top_k, 0, "--top-k")
    return Sampling(temperature, top_p, top_k, seed)


def load_prompt_set(prompts: str, model: Path, limit: int | None = None) -> list[Prompt]:
    """Load a prompt set, encoding text prompts with the target's tokenizer; apply ``--limit``."""
    check_min(limit, 1, "--limit")
    loaded = load_prompts(prompts, tokenizer_dir=model)
    return loaded[:limit] if limit is not None else loaded


def default_stop_tokens(model: Path) -> list[int]:
    """The eos id(s) in ``<model>/generation_config.json``; [] when there are none."""
    path = Path(model) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError):
        raise CliError(f"{path} is not a valid JSON object; pass --stop-token explicitly") from None
    if eos is None:
        return []
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CliError(f"{path}: eos_token_id {eos!r} is not a token id or list of token ids")
    return list(dict.fromkeys(ids))


def build_requests(
    prompts: Sequence[Prompt], max_new_tokens: int | None, stop_token_ids: Sequence[int], sampling: Sampling
) -> list[Request]:
    """One Request per prompt; ``max_new_tokens`` None means the prompt's own limit, else 64."""
    check_min(max_new_tokens, 1, "--max-new-tokens")
    for token in stop_token_ids:
        check_min(token, 0, "--stop-token")
    return [
        Request(
            prompt_ids=p.prompt_ids,
            max_new_tokens=max_new_tokens or p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            stop_token_ids=list(stop_token_ids),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sampling.seed,
        )
        for p in prompts
    ]


def _stderr_console() -> Console:
    return Console(stderr=True)


def stdout_console() -> Console:
    """Rich console for results; wide when not a terminal, so logs and pipes get whole tables."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))


def run_prompts(
    engine: Engine,
    requests: Sequence[Request],
    config: RunConfig,
    *,
    batch_size: int = 4,
    on_chunk: Callable[[int, list[RequestResult]], None] | None = None,
    description: str = "generating",
) -> list[RequestResult]:
    """Run requests through ``engine.generate`` in chunks, with a progress bar on stderr.

    ``on_chunk(start_index, results)`` is called after every chunk (for incremental output).
    """
    check_min(batch_size, 1, "--batch-size")
    results: list[RequestResult] = []
    console = _stderr_console()
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
            out = engine.generate(chunk, config)
            if len(out) != len(chunk):
                raise EngineError(f"engine {engine.name!r} returned {len(out)} results for {len(chunk)} requests")
            results.extend(out)
            if on_chunk is not None:
                on_chunk(start, out)
            progress.advance(task, len(chunk))
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

    def __enter__(self) -> "JsonlSink":
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
    for name, justify in (("category", "left"), ("prompts", "right"), ("errors", "right"), ("tokens", "right"),
                          ("mean tau", "right")):
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


# --------------------------------------------------------------------------------------------
# 4. Commands (add new ones below with @command(); see the module docstring)
# --------------------------------------------------------------------------------------------


@command()
def generate(
    engine: EngineOpt = "reference",
    model: ModelOpt = FIXTURE_TARGET,
    drafter: DrafterOpt = str(FIXTURE_DRAFTER),
    mode: ModeOpt = "ddtree",
    budget: BudgetOpt = 32,
    dtype: DTypeOpt = "float32",
    device: DeviceOpt = "cpu",
    prompts: PromptsOpt = "fixture",
    limit: LimitOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    stop_token: StopTokenOpt = None,
    trace: TraceOpt = False,
    batch_size: BatchSizeOpt = 4,
    out: OutOpt = None,
    engine_option: EngineOptionsOpt = None,
) -> None:
    """Run a prompt set through an engine and write one JSON line per prompt."""
    # Validate everything cheap before touching models.
    config = make_run_config(mode, budget, dtype, device, trace=trace)
    sampling = make_sampling(temperature, top_p, top_k, seed)
    check_min(max_new_tokens, 1, "--max-new-tokens")
    check_min(batch_size, 1, "--batch-size")
    options = parse_engine_options(engine_option)
    model_dir, drafter_dir = resolve_pair(model, drafter)
    prompt_set = load_prompt_set(prompts, model_dir, limit)
    stops = list(stop_token) if stop_token else default_stop_tokens(model_dir)
    requests = build_requests(prompt_set, max_new_tokens, stops, sampling)
    out_path = out if out is not None else REPORTS_DIR / f"generate-{mode}.jsonl"

    with open_engine(engine, model_dir, drafter_dir, **options) as eng:
        require_support(eng, config)
        with JsonlSink(out_path) as sink:

            def write_chunk(start: int, chunk: list[RequestResult]) -> None:
                sink.write([result_row(prompt_set[start + i], r) for i, r in enumerate(chunk)])

            try:
                results = run_prompts(eng, requests, config, batch_size=batch_size, on_chunk=write_chunk,
                                      description=f"{eng.name} {mode}")
            except EngineError as exc:
                kept = f" ({sink.rows} results kept in {sink.partial})" if sink.rows else ""
                raise EngineError(f"{exc}{kept}") from exc
            written = sink.commit()

    console = stdout_console()
    console.print(summary_table(prompt_set, results, title=escape(f"{eng.name} {mode} on {prompts}")))
    console.print(escape(f"wrote {len(results)} results to {written}"), soft_wrap=True)
    failed = [(p, r) for p, r in zip(prompt_set, results) if r.finish_reason == "error"]
    if failed:
        first_prompt, first = failed[0]
        raise CliError(
            f"{len(failed)} of {len(results)} requests failed (first: prompt {first_prompt.id!r}: {first.error}); "
            f"results written to {written}",
            exit_code=EXIT_FAILED,
        )


@command()
def engines(
    model: ModelOpt = FIXTURE_TARGET,
    drafter: DrafterOpt = str(FIXTURE_DRAFTER),
) -> None:
    """List engine adapters and what each can do here with the given model pair."""
    model_dir, drafter_dir = resolve_pair(model, drafter)
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



ModesOpt = Annotated[str, typer.Option("--modes", help="Comma-separated modes to check: dflash,ddtree.")]
BudgetsOpt = Annotated[str, typer.Option("--budgets", help="Comma-separated DDTree budgets.")]
PairNameOpt = Annotated[str, typer.Option("--pair-name", help="Model pair name; golden files are keyed by it.")]
GoldenDirOpt = Annotated[Path, typer.Option("--golden-dir", help="Root of the golden files.")]
ThreadsOpt = Annotated[int, typer.Option("--threads", help="torch CPU threads per process; 0 = torch's default. "
                                                           "1 is fastest for small models on small CPUs.")]
HardwareClassOpt = Annotated[
    Optional[str], typer.Option("--hardware-class", help="Hardware class the report is filed under "
                                "(default: from the device, e.g. cpu-x86_64-2c, cuda-NVIDIA-H200; "
                                "or $DDTREE_HARDWARE_CLASS).")
]


def _hw_class(device: str, override: Optional[str]) -> str:
    from .baselines import hardware_class

    return hardware_class(device, override)


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{option} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        fail(f"{option} needs integers >= 1, got {text!r}")
    return values


def _mode_list(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    for m in modes:
        check_choice(m, ("dflash", "ddtree"), "--modes")
    return modes


def suite_settings(engine, model, drafter, pair_name, modes, budgets, dtype, device, prompts, limit,
                   max_new_tokens, isolate, golden_dir, options, threads: int = 0,
                   tensor_parallel_size: int = 1) -> SuiteSettings:
    check_choice(dtype, DTYPES, "--dtype")
    check_min(max_new_tokens, 1, "--max-new-tokens")
    check_min(tensor_parallel_size, 1, "--tensor-parallel-size")
    model_dir, drafter_dir = resolve_pair(model, drafter)
    if engine == "reference":  # validate the pair here so a mismatch is one line, not a failed run
        from adapters.reference.engine import ReferenceEngine

        reference = ReferenceEngine(str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if tensor_parallel_size > 1:
            try:
                reference.validate_tensor_parallel(tensor_parallel_size, device)
            except EngineError as exc:
                fail(f"--tensor-parallel-size: {exc}")
    load_prompt_set(prompts, model_dir, limit)
    return SuiteSettings(
        engine=engine, model_dir=str(model_dir), drafter_dir=None if drafter_dir is None else str(drafter_dir),
        pair_name=pair_name, modes=_mode_list(modes), budgets=_int_list(budgets, "--budgets"), dtype=dtype,
        device=device, prompt_set=prompts, limit=limit, max_new_tokens=max_new_tokens, isolate=isolate,
        golden_dir=str(golden_dir), engine_options=options, torch_threads=threads or None,
        tensor_parallel_size=tensor_parallel_size,
    )


@command()
def check(
    engine: EngineOpt = "reference",
    model: ModelOpt = FIXTURE_TARGET,
    drafter: DrafterOpt = str(FIXTURE_DRAFTER),
    pair_name: PairNameOpt = "fixture",
    modes: ModesOpt = "dflash,ddtree",
    budgets: BudgetsOpt = "16,64",
    dtype: DTypeOpt = "float32",
    device: DeviceOpt = "cpu",
    prompts: PromptsOpt = "fixture",
    limit: LimitOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per prompt.")] = 64,
    only: Annotated[Optional[list[str]], typer.Option("--check", help="Keep checks whose id contains this "
                                                                        "(repeatable).")] = None,
    isolate: Annotated[bool, typer.Option("--isolate/--no-isolate", help="Run the engine in its own process.")] = True,
    golden_dir: GoldenDirOpt = GOLDEN_DIR / "records",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="JSON report path.")] = None,
    engine_option: EngineOptionsOpt = None,
    threads: ThreadsOpt = 1,
    hardware_class: HardwareClassOpt = None,
    tensor_parallel_size: Annotated[int, typer.Option(
        "--tensor-parallel-size", help="Shard the target over N devices in every run; the tensor-parallel check "
                                       "compares N with 1. With 1, that check uses the GPUs visible (on CPU it "
                                       "runs only when N >= 2 is asked for).")] = 1,
) -> None:
    """Run the conformance checks against one engine; exit 1 if any check fails."""
    import time

    from .checks import plan, run_plan
    from .session import SuiteSession

    settings = suite_settings(engine, model, drafter, pair_name, modes, budgets, dtype, device, prompts, limit,
                              max_new_tokens, isolate, golden_dir, parse_engine_options(engine_option), threads,
                              tensor_parallel_size)
    checks = plan(settings, only)
    if not checks:
        fail(f"no checks match --check {only}")
    session = SuiteSession(settings)
    started = time.perf_counter()
    try:
        with Progress(console=_stderr_console(), transient=True) as progress:
            task = progress.add_task(f"{engine}: {len(checks)} checks", total=len(checks))
            results = run_plan(session, checks, on_result=lambda r: progress.advance(task))
        from .report import runs_from_session

        run_metrics = runs_from_session(session)
    finally:
        session.close()
    elapsed = time.perf_counter() - started
    table = Table(title=escape(f"{engine} on {pair_name} ({dtype}, {device})"))
    for column in ("check", "status", "message"):
        table.add_column(column, overflow="fold")
    colours = {"pass": "green", "fail": "red", "skip": "yellow"}
    for r in results:
        table.add_row(escape(r.check), f"[{colours[r.status]}]{r.status}[/]", escape(r.message))
    console = stdout_console()
    console.print(table)
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    from .report import CHECK_SCHEMA, new_report, write_report

    report = new_report("check", settings.model_dump(), _hw_class(settings.device, hardware_class),
                        schema=CHECK_SCHEMA)
    report.update({"elapsed_s": round(elapsed, 2), "counts": counts, "results": [r.model_dump() for r in results],
                   "runs": run_metrics})
    out_path = out if out is not None else REPORTS_DIR / f"check-{engine.replace(':', '_')}.json"
    out_path, md_path, html_path = write_report(report, out_path)
    console.print(escape(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped "
                         f"in {elapsed:.0f} s; report {out_path} (+ {md_path.name}, {html_path.name})"), soft_wrap=True)
    if counts["fail"]:
        raise CliError(f"{counts['fail']} of {len(results)} checks failed", exit_code=EXIT_FAILED)


@command()
def record(
    model: ModelOpt = FIXTURE_TARGET,
    drafter: DrafterOpt = str(FIXTURE_DRAFTER),
    pair_name: PairNameOpt = "fixture",
    budgets: BudgetsOpt = "16,32,64,256",
    dtype: DTypeOpt = "float32",
    device: DeviceOpt = "cpu",
    prompts: PromptsOpt = "fixture",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per prompt.")] = 64,
    golden_dir: GoldenDirOpt = GOLDEN_DIR / "records",
    update: Annotated[bool, typer.Option("--update", help="Replace an existing golden file; prints the diff.")] = False,
    threads: ThreadsOpt = 1,
) -> None:
    """Record golden outputs, top-2 gaps and acceptance traces with the reference engine."""
    from .golden import GoldenExists, golden_path, record_golden, write_golden
    from .session import SuiteSession

    settings = suite_settings("reference", model, drafter, pair_name, "dflash,ddtree", budgets, dtype, device,
                              prompts, None, max_new_tokens, False, golden_dir, {}, threads)
    path = golden_path(golden_dir, pair_name, prompts, dtype)
    if path.exists() and not update:
        raise GoldenExists(f"{path} exists; pass --update to replace it (a diff will be shown)")
    session = SuiteSession(settings)
    try:
        golden = record_golden(session, settings.budgets,
                               progress=lambda key: _stderr_console().print(escape(f"recorded {key}")))
    finally:
        session.close()
    written, diff = write_golden(golden_dir, golden, update=update)
    console = stdout_console()
    for line in diff:
        console.print(escape(line), soft_wrap=True)
    console.print(escape(f"wrote {written}"), soft_wrap=True)



# --------------------------------------------------------------------------------------------
# bench, baseline, gate (throughput and acceptance baselines; see conformance/bench.py, gate.py)
# --------------------------------------------------------------------------------------------

BaselinesOpt = Annotated[
    Optional[Path], typer.Option("--baselines", help="Baseline file, or folder holding <hardware-class>.json.",
                                 show_default="golden/baselines")
]


@command()
def bench(
    engine: EngineOpt = "reference",
    model: ModelOpt = FIXTURE_TARGET,
    drafter: DrafterOpt = str(FIXTURE_DRAFTER),
    pair_name: PairNameOpt = "fixture",
    modes: ModesOpt = "dflash,ddtree",
    budgets: BudgetsOpt = "16,64",
    dtype: DTypeOpt = "float32",
    device: DeviceOpt = "cpu",
    prompts: PromptsOpt = "fixture",
    limit: LimitOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per prompt.")] = 64,
    repeats: Annotated[int, typer.Option("--repeats", "-r", help="Interleaved timed rounds (>= 5 for a gate).")] = 5,
    resamples: Annotated[int, typer.Option("--resamples", help="Bootstrap resamples for the CI.")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help="One untimed run per config first.")] = True,
    isolate: Annotated[bool, typer.Option("--isolate/--no-isolate", help="Run the engine in its own process.")] = True,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="JSON report path (.md and .html beside it).",
                                                show_default="reports/bench-<engine>.json")] = None,
    engine_option: EngineOptionsOpt = None,
    threads: ThreadsOpt = 1,
    hardware_class: HardwareClassOpt = None,
) -> None:
    """Measure speedup over plain decoding (interleaved repeats, bootstrap CI), tau and acceptance."""
    from .bench import BenchError, run_bench
    from .report import new_report, write_report
    from .session import SuiteSession

    check_min(repeats, 1, "--repeats")
    check_min(resamples, 100, "--resamples")
    settings = suite_settings(engine, model, drafter, pair_name, modes, budgets, dtype, device, prompts, limit,
                              max_new_tokens, isolate, GOLDEN_DIR / "records", parse_engine_options(engine_option),
                              threads)
    hw = _hw_class(device, hardware_class)
    runs = [("dflash", None)] if "dflash" in settings.modes else []
    runs += [("ddtree", b) for b in settings.budgets] if "ddtree" in settings.modes else []
    session = SuiteSession(settings)
    try:
        eng = session.engine
        for mode in ["plain", *settings.modes]:
            require_support(eng, session.config(mode, settings.budgets[0]))
        requests = session.requests()
        total = (len(runs) + 1) * (repeats + int(warmup))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=_stderr_console(), transient=True) as progress:
            task = progress.add_task(f"bench {engine}", total=total)
            try:
                measured = run_bench(eng, requests, lambda m, b: session.config(m, b), runs, repeats=repeats,
                                     warmup=warmup, resamples=resamples, seed=seed,
                                     on_step=lambda label: progress.update(task, advance=1,
                                                                           description=f"bench {engine}: {label}"))
            except BenchError as exc:
                raise CliError(str(exc), exit_code=EXIT_FAILED) from exc
    finally:
        session.close()
    report = new_report("bench", settings.model_dump(), hw)
    report.update(measured)
    out_path = out if out is not None else REPORTS_DIR / f"bench-{engine.replace(':', '_')}.json"
    paths = write_report(report, out_path)
    table = Table(title=escape(f"bench: {engine} on {pair_name} ({dtype}, {device}, {hw}), {repeats} repeats"))
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
    from .report import ReportError, load_report

    try:
        return load_report(path)
    except ReportError as exc:
        raise CliError(str(exc)) from None


@command()
def baseline(
    report: Annotated[Path, typer.Argument(help="Run report JSON (from `bench`).")],
    baselines: BaselinesOpt = None,
    hardware_class: HardwareClassOpt = None,
    update: Annotated[bool, typer.Option("--update", help="Replace existing entries; prints the diff.")] = False,
    tau_band: Annotated[float, typer.Option("--tau-band", help="Tau band, as a fraction of tau.")] = 0.05,
    position_band: Annotated[float, typer.Option("--position-band", help="Per-position band, absolute.")] = 0.05,
    speedup_band: Annotated[float, typer.Option("--speedup-band", help="Speedup band, fraction of speedup.")] = 0.10,
) -> None:
    """Write baselines (tau, per-position floors, speedup, with bands) from a run report."""
    from .baselines import BaselineError, BaselineExists, baseline_path, entries_from_report, load_baselines
    from .baselines import merge_entries, write_baselines

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
    baselines: BaselinesOpt = None,
    hardware_class: HardwareClassOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the verdicts as JSON.")] = None,
) -> None:
    """Compare a run report with stored baselines.

    Exit codes: 0 all pass; 1 regression (any fail); 3 inconclusive (a speedup CI straddles the
    band's lower edge, no fail); 4 missing baseline or measurement (no fail or inconclusive);
    2 unusable input.
    """
    from .baselines import BaselineError, baseline_path, load_baselines
    from .gate import evaluate, exit_code

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


if __name__ == "__main__":
    app()
