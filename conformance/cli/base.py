"""The ``ddtree-conformance`` application object, its exit statuses and its error handling.

A command registered with :func:`command` runs inside :func:`cli_errors`, which turns every
expected failure into ONE line ``error: ...`` on stderr and a documented exit status
(:data:`EXIT_STATUSES`); real bugs still show their traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import click
import typer
from pydantic import ValidationError
from rich.console import Console

from .. import __version__
from ..adapters.interface import EngineDied, EngineError, EngineUsageError
from ..golden_files import GoldenError
from ..prompts import PromptError
from ..settings import SettingsError
from .options import grouped

__all__ = [
    "app",
    "command",
    "CliError",
    "CommandFailed",
    "EngineFailed",
    "cli_errors",
    "fail",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_INCONCLUSIVE",
    "EXIT_MISSING_BASELINE",
    "EXIT_ENGINE",
    "EXIT_SETTINGS_CHANGED",
    "EXIT_INCOMPLETE",
    "EXIT_STATUSES",
    "stderr_console",
    "stdout_console",
]

EXIT_OK = 0  # everything checked passed
EXIT_FAILED = 1  # the command ran and something it checked failed (a conformance failure, a regression)
EXIT_USAGE = 2  # the command could not run as asked: bad option, bad input file, unusable model dir
EXIT_INCONCLUSIVE = 3  # gate, bench --against: a speedup interval straddles the band's edge after the time budget
EXIT_MISSING_BASELINE = 4  # gate: no baseline (or no measurement) for a run
EXIT_ENGINE = 5  # the engine under test could not start, hung past --engine-timeout, or died
EXIT_SETTINGS_CHANGED = 6  # gate: the report's engine settings differ from the baseline's (not compared)
EXIT_INCOMPLETE = 7  # nothing failed, but a requested mode or check family did not run because of the engine

EXIT_STATUSES: dict[int, str] = {
    EXIT_OK: "all checks passed",
    EXIT_FAILED: "a check failed (conformance failure, or a result that breaks the integrity rules) or the gate "
    "(or an A/B bench) found a regression",
    EXIT_USAGE: "usage error: bad option, unknown engine or engine option, a budget above the engine's largest, "
    "bad input file or unusable model dir; nothing was run",
    EXIT_INCONCLUSIVE: "gate and A/B bench only: inconclusive (the interval still straddles the band when its budget "
    "ran out)",
    EXIT_MISSING_BASELINE: "gate only: a baseline or a measurement is missing",
    EXIT_ENGINE: "the engine could not start, hung past --engine-timeout, or died (crash, out of memory); the run "
    "stopped there (the report marks the remaining checks not run) and the engine's log tail is printed",
    EXIT_SETTINGS_CHANGED: "gate only: refused, the report's engine settings that change speed (CUDA graphs, "
    "attention backend, ...) differ from the baseline's; nothing was compared",
    EXIT_INCOMPLETE: "incomplete: nothing failed, but a requested mode or check family did not run because of the "
    "engine (mode not offered, no acceptance data, no traces, too few prompts); the report's "
    "coverage table says which and why; --allow-skip FAMILY opts out (a family that cannot apply on the "
    "run's device, such as CUDA graphs on CPU, is not applicable, never incomplete)",
}

EXIT_HELP = "Exit statuses: " + "; ".join(f"{code} {text}" for code, text in EXIT_STATUSES.items()) + "."

app = typer.Typer(
    name="ddtree-conformance",
    help="Cross-engine conformance suite for DDTree speculative decoding.\n\n" + EXIT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


class CliError(Exception):
    """A problem the user can act on; printed as one line, no traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class EngineFailed(CliError):
    """The engine under test could not start or died: exit :data:`EXIT_ENGINE`, with its log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message, EXIT_ENGINE)
        self.log_tail = log_tail


class CommandFailed(typer.Exit):
    """The exit of a command that failed as expected (:func:`fail`): its status, and the one line it
    printed as ``error: <message>`` (``ci`` makes it its step's summary)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(exit_code)
        self.message = message


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fail(message: str, exit_code: int = EXIT_USAGE, details: str = "") -> NoReturn:
    """Print ``error: <message>`` as one line on stderr (then ``details`` verbatim) and exit
    (:class:`CommandFailed`)."""
    line = _one_line(message)
    print(f"error: {line}", file=sys.stderr, flush=True)
    if details.strip():
        print(details.rstrip(), file=sys.stderr, flush=True)
    raise CommandFailed(line, exit_code)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return f"invalid {exc.title}: " + "; ".join(parts)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn expected failures into one stderr line and an exit status; let real bugs show."""
    try:
        yield
    except (typer.Exit, click.exceptions.ClickException, click.exceptions.Abort):
        raise
    except EngineFailed as exc:
        tail = f"--- engine log tail ---\n{exc.log_tail}" if exc.log_tail.strip() else ""
        fail(str(exc).split("\n", 1)[0], exc.exit_code, tail)
    except CliError as exc:
        fail(str(exc), exc.exit_code)
    except (SettingsError, EngineUsageError) as exc:  # unknown engine or option: nothing was started
        fail(str(exc))
    except EngineDied as exc:  # could not start, crashed, hung, killed: one line, then its log tail
        tail = f"--- engine log tail ---\n{exc.log_tail}" if exc.log_tail.strip() else ""
        fail(str(exc).split("\n", 1)[0], EXIT_ENGINE, tail)
    except EngineError as exc:  # raised by an engine in this process while starting: it cannot start
        first, _, rest = str(exc).partition("\n")
        fail(first, EXIT_ENGINE, rest)
    except (PromptError, GoldenError) as exc:
        fail(str(exc))
    except ValidationError as exc:
        fail(_validation_message(exc))
    except OSError as exc:
        if exc.strerror and exc.filename:
            fail(f"{exc.strerror}: {exc.filename}")
        fail(str(exc))


def command(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function as a subcommand of :data:`app`, run inside :func:`cli_errors`; a parameter
    typed with an option group takes that group's options (:func:`.options.grouped`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        spread = grouped(func)

        @functools.wraps(spread)
        def guarded(*a: Any, **k: Any) -> Any:
            with cli_errors():
                return spread(*a, **k)

        app.command(*args, **kwargs)(guarded)
        return func

    return decorate


def _version(value: bool) -> None:
    if value:
        print(f"ddtree-conformance {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Cross-engine conformance suite for DDTree speculative decoding."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def stderr_console() -> Console:
    return Console(stderr=True)


def stdout_console() -> Console:
    """Rich console for results; wide when not a terminal, so logs and pipes get whole tables."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))
