"""``ddtree-conformance ci``: everything an engine repository's CI job does, in one command.

GitHub Actions (``.github/workflows/conformance.yml``) and Buildkite (``docs/examples/buildkite-
pipeline.yml``) both call it; neither keeps logic of its own. The steps:

1. install: the engine's requirements into this environment (``--engine-requirement``, or
   ``--engine-version`` for an engine this suite pins: vllm, sglang; empty means the pinned version);
2. install check: the suite's version, the engine imports here, ``pip freeze`` into the reports;
3. conformance: ``ddtree-conformance check`` (its JSON/Markdown/HTML report, and a JUnit file made
   from it), with the coverage verdict: an engine without DDTree is INCOMPLETE (exit 7), never green,
   unless ``--allow-skip`` says otherwise;
4. bench: A/B against ``--against`` when given (no stored baselines), else sequential against the
   stored baselines of this hardware class; ``--gate auto`` skips the throughput gate, saying so, when
   neither exists here, ``--gate required`` fails the job then (exit 4), ``--gate off`` never runs it;
5. gate: ``ddtree-conformance gate`` on the bench's report; under ``--gate auto`` it gates exactly the
   runs and metrics that have a stored baseline (hardware class, engine, pair, mode, budget) and the
   summary names the rest, "not gated", with the reason (``gate --only-baselined``); under ``--gate
   required`` a missing baseline fails the job (exit 4);
6. summary: ``summary.md`` in the reports folder, appended to ``$GITHUB_STEP_SUMMARY`` on GitHub and
   sent to ``buildkite-agent annotate`` on Buildkite; one ``::error::`` line per failed step on GitHub.

Each step is the suite's own command (``check``, ``bench``, ``gate``), run in this process (one start
of torch; engines still run in their own processes) in the working directory, so ``--engine
my_pkg:MyEngine`` resolves from the engine repository. The exit status is the most severe of the
steps': 2 usage, 5 engine (could not install, import, start), 1 a conformance failure or a throughput
regression, 7 incomplete coverage, 3 throughput inconclusive, 4 missing baseline (``--gate
required``), else 0; the last line names the reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from .. import __version__
from ..adapters.interface import EngineError, EngineUsageError
from ..adapters.registry import load_engine_class
from ..baselines import baseline_path
from ..pins import pinned_version
from . import options as opt
from .base import (
    EXIT_ENGINE,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    app,
    command,
)
from .ci_output import (
    Step,
    combine,
    gate_summary,
    junit_from_report,
    outputs,
    publish,
    read_json,
    slug,
    summary_markdown,
)

__all__ = ["ci", "install", "install_check", "conformance", "throughput", "PINNED_ENGINES"]

PINNED_ENGINES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang")}  # engine -> (extra, distribution)
GATE_MODES = ("auto", "required", "off")
OUTPUTS = [f"{stem}.{ext}" for stem in ("check", "ab", "bench") for ext in ("json", "md", "html")] + [
    "gate.json",
    "junit.xml",
    "summary.md",
    "environment.txt",
]


def _say(text: str) -> None:
    print(f"ci: {text}", flush=True)


def _run(step: Step, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    started = time.perf_counter()
    _say(f"{step.name}: {' '.join(cmd)}")
    proc = subprocess.run(cmd, **kwargs)
    step.code = proc.returncode
    step.seconds += time.perf_counter() - started
    return proc


class _ErrorLines(io.TextIOBase):
    """stderr, passed through, remembering the last ``error: ...`` line (a step's reason when it left no report)."""

    def __init__(self, stream) -> None:
        self.stream, self.last, self._line = stream, "", ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self._line += text
        *done, self._line = self._line.split("\n")
        self.last = next((line for line in reversed(done) if line.startswith("error: ")), self.last)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _suite(step: Step, *args: str) -> int:
    """``ddtree-conformance ARGS`` in this process; its exit status becomes the step's, and its last
    ``error:`` line the step's summary until the step says more."""
    # base's app: every command is registered on it once the cli package has loaded (it has: ``ci`` runs)
    started = time.perf_counter()
    _say(f"{step.name}: ddtree-conformance {' '.join(args)}")
    errors = _ErrorLines(sys.stderr)
    try:
        with contextlib.redirect_stderr(errors):
            code = app(list(args), prog_name="ddtree-conformance", standalone_mode=False)
    except click.exceptions.ClickException as exc:  # a usage error click found (unknown option)
        exc.show()
        code = exc.exit_code
        errors.last = f"error: {exc.format_message()}"
    except click.exceptions.Abort:
        code = EXIT_FAILED
    step.code = code if isinstance(code, int) else EXIT_OK
    step.summary = errors.last.removeprefix("error: ")
    step.seconds += time.perf_counter() - started
    return step.code


# ------------------------------------------------------------------------------------------ steps


def install(requirements: list[str], engine: str, engine_version: Optional[str]) -> Step:
    step = Step("install")
    wanted = list(requirements)
    if not wanted and engine_version is not None and engine in PINNED_ENGINES:
        version = engine_version if engine_version not in ("", "pinned") else pinned_version(*PINNED_ENGINES[engine])
        wanted = [f"{engine}=={version}"]
    if not wanted:
        step.skipped, step.summary = True, "nothing to install (the engine is in this environment)"
        return step
    proc = _run(
        step,
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *wanted],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        print(tail, file=sys.stderr, flush=True)
        step.code, step.summary = EXIT_ENGINE, f"pip could not install {' '.join(wanted)}"
    else:
        step.summary = f"installed {' '.join(wanted)}"
    return step


def install_check(engine: str, reports: Path) -> Step:

    step = Step("install check")
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--disable-pip-version-check"], capture_output=True, text=True
    )
    environment = reports / "environment.txt"
    environment.write_text(frozen.stdout)
    step.files.append(environment)
    try:
        cls = load_engine_class(engine)
    except EngineUsageError as exc:  # no engine of that name: the caller's mistake
        step.code, step.summary = EXIT_USAGE, str(exc)
        return step
    except EngineError as exc:  # named, but it does not import here
        step.code, step.summary = EXIT_ENGINE, str(exc)
        return step
    step.summary = f"ddtree-conformance {__version__}; engine {engine!r} imports here ({cls.__module__}.{cls.__name__})"
    _say(step.summary)
    return step


def conformance(run_args: list[str], allow_skip: list[str], reports: Path) -> tuple[Step, dict | None]:
    step = Step("conformance")
    out = reports / "check.json"
    args = [*run_args, *(a for name in allow_skip for a in ("--allow-skip", name)), "--out", str(out)]
    _suite(step, "check", *args)
    report = read_json(out)
    if report is None:
        step.summary = f"the check did not run (exit {step.code}): {step.summary or 'see the log'}"
        return step, None
    step.files += [out, out.with_suffix(".md"), out.with_suffix(".html")]
    verdict = report.get("verdict") or {}
    step.summary = f"{verdict.get('status', '?').upper()}: {verdict.get('reason', '')}"
    junit = reports / "junit.xml"
    junit.write_text(junit_from_report(report))
    step.files.append(junit)
    return step, report


def throughput(
    bench_args: list[str],
    *,
    against: Optional[str],
    against_engine: Optional[str],
    tolerance: float,
    baselines: Optional[Path],
    hw: str,
    gate: str,
    reports: Path,
) -> list[Step]:
    bench, judged = Step("bench"), Step("gate")
    if gate == "off":
        bench.skipped = judged.skipped = True
        bench.summary = judged.summary = "not run (--gate off)"
        return [bench, judged]
    if against is not None:
        out = reports / "ab.json"
        extra = ["--against", against, "--tolerance", str(tolerance)]
        extra += ["--against-engine", against_engine] if against_engine else []
        gate_extra: list[str] = []
    else:
        stored = baseline_path(baselines, hw)
        if not stored.exists() and gate == "auto":
            bench.skipped = judged.skipped = True
            bench.summary = judged.summary = (
                f"not run: no stored baselines for {hw} ({stored}) and no --against "
                "baseline build (give one for an A/B run, or --gate required)"
            )
            return [bench, judged]
        out = reports / "bench.json"
        extra = ["--baselines", str(baselines or stored.parent)] if stored.exists() else []
        gate_extra = ["--baselines", str(baselines)] if baselines is not None else []
        gate_extra += ["--only-baselined"] if gate == "auto" else []  # the rest: "not gated", said in the summary
    _suite(bench, "bench", *bench_args, *extra, "--out", str(out))
    if bench.code in (EXIT_FAILED, EXIT_INCONCLUSIVE) and against is not None and out.is_file():
        bench.code = EXIT_OK  # `bench --against` exits with its A/B verdict; the gate step judges (and says) it
    if bench.code != 0 or not out.is_file():
        bench.summary = f"the bench failed (exit {bench.code})"
        bench.code = bench.code or EXIT_FAILED
        judged.skipped, judged.summary = True, "not run: no bench report"
        return [bench, judged]
    bench.files += [out, out.with_suffix(".md"), out.with_suffix(".html")]
    bench.summary = (
        f"A/B against {against} (interleaved on this runner): wrote {out.name}"
        if against is not None
        else f"against the stored baselines of {hw}: wrote {out.name}"
    )
    gate_out = reports / "gate.json"
    _suite(judged, "gate", str(out), *gate_extra, "--hardware-class", hw, "--out", str(gate_out))
    result = read_json(gate_out) or {}
    judged.files.append(gate_out)
    judged.summary = gate_summary(judged.code, result.get("rows", []), out)
    return [bench, judged]


# ------------------------------------------------------------------------------------------ the command


def _env(name: str, text: str, **kwargs) -> typer.models.OptionInfo:
    """An option that also reads ``$DDTREE_<NAME>`` (what the GitHub workflow and the Buildkite pipeline set)."""
    return typer.Option(name, envvar="DDTREE_" + name[2:].upper().replace("-", "_"), help=text, **kwargs)


def _listed(values: list[str] | None, env: str) -> list[str]:
    """Repeated values, or ``$DDTREE_<ENV>`` one per line: a requirement may hold spaces."""
    raw = values if values else os.environ.get(env, "").splitlines()
    return [v.strip() for value in raw for v in value.splitlines() if v.strip()]


def _given(value: str | None) -> str | None:
    return value if value not in (None, "") else None


@command(
    help=__doc__.split("\n\n", 1)[0] + "\n\nSteps: install, install check, conformance (check), bench, gate, "
    "summary. Every option also reads $DDTREE_<OPTION> (--engine: $DDTREE_ENGINE; list options one value per "
    "line). Exit status: the most severe step's (2, 5, 1, 7, 3, 4), else 0."
)
def ci(
    engine: Annotated[str, _env("--engine", "Engine: built-in name, entry-point name, or module:Class.")] = "reference",
    engine_option: Annotated[
        Optional[list[str]],
        typer.Option(
            "--engine-option",
            "-O",
            metavar="KEY=VALUE",
            help="Engine option (repeatable; $DDTREE_ENGINE_OPTIONS: one per line).",
        ),
    ] = None,
    engine_requirement: Annotated[
        Optional[list[str]],
        typer.Option(
            "--engine-requirement",
            metavar="REQ",
            help="pip requirement installing the engine first (repeatable; $DDTREE_ENGINE_REQUIREMENT: one per line).",
        ),
    ] = None,
    engine_version: Annotated[
        Optional[str],
        typer.Option(
            "--engine-version",
            help="Install this version of an engine the suite pins (vllm, sglang); 'pinned': the "
            "pinned one. Not given: install nothing. ($DDTREE_ENGINE_VERSION)",
        ),
    ] = None,
    pair: Annotated[
        Optional[str], _env("--pair", "Named model pair (fixture, qwen3-8b, qwen3-4b, or a pairs file's).")
    ] = None,
    pairs_file: Annotated[Optional[str], _env("--pairs-file", "JSON/TOML file of more named pairs.")] = None,
    model: Annotated[Optional[str], _env("--model", "Target model dir.")] = None,
    drafter: Annotated[Optional[str], _env("--drafter", "DFlash drafter dir.")] = None,
    dtype: Annotated[Optional[str], _env("--dtype", "float32 | bfloat16 | float16.")] = None,
    device: Annotated[Optional[str], _env("--device", "cpu, cuda, cuda:N.")] = None,
    modes: Annotated[Optional[str], _env("--modes", "Comma-separated speculative modes.")] = None,
    budgets: Annotated[Optional[str], _env("--budgets", "Comma-separated DDTree budgets.")] = None,
    prompts: Annotated[Optional[str], _env("--prompts", "Prompts JSONL path or bundled set name.")] = None,
    limit: Annotated[Optional[str], _env("--limit", "Prompts per run: a number, or 'all'.", show_default="all")] = None,
    max_new_tokens: Annotated[Optional[int], _env("--max-new-tokens", "Tokens per prompt.")] = None,
    only: Annotated[
        Optional[list[str]],
        typer.Option("--check", help="Keep checks whose id contains this (repeatable; $DDTREE_CHECKS: one per line)."),
    ] = None,
    allow_skip: Annotated[
        Optional[list[str]],
        typer.Option(
            "--allow-skip",
            metavar="FAMILY",
            help="A check family or mode that may skip because of the engine "
            "(repeatable; $DDTREE_ALLOW_SKIP: one per line); one this run does not plan is a note.",
        ),
    ] = None,
    isolate: Annotated[
        Optional[bool],
        typer.Option(
            "--isolate/--no-isolate",
            envvar="DDTREE_ISOLATE",
            help="Run the engine in its own process.",
            show_default="isolate",
        ),
    ] = None,
    threads: Annotated[Optional[int], _env("--threads", "torch CPU threads per process; 0: torch's default.")] = None,
    engine_timeout: opt.EngineTimeout = None,
    hardware_class: Annotated[
        Optional[str],
        _env("--hardware-class", "Hardware class the reports are filed under (baselines are keyed by it)."),
    ] = None,
    against: Annotated[
        Optional[str],
        _env(
            "--against",
            "A/B baseline build (bench --against): an engine here, a requirement, a wheel or a folder. "
            "Without it: stored baselines.",
            metavar="ENGINE",
        ),
    ] = None,
    against_engine: Annotated[
        Optional[str], _env("--against-engine", "The spec the installed baseline runs as.")
    ] = None,
    against_option: Annotated[
        Optional[list[str]],
        typer.Option("--against-option", metavar="KEY=VALUE", help="The A/B baseline's engine options (repeatable)."),
    ] = None,
    tolerance: Annotated[float, _env("--tolerance", "A/B: allowed slowdown (edge 1 - tolerance).")] = 0.05,
    baselines: Annotated[
        Optional[str],
        _env(
            "--baselines", "Stored baselines: a file, or a folder of <hardware-class>.json.", show_default="the suite's"
        ),
    ] = None,
    gate: Annotated[
        str,
        _env(
            "--gate",
            "auto: gate throughput against --against (A/B), else every run and metric that has a stored "
            "baseline, and say in the summary what was not gated and why; required: a missing baseline fails "
            "(exit 4); off: no bench.",
        ),
    ] = "auto",
    time_budget: Annotated[
        float, _env("--time-budget", "Bench: seconds of timed repeats before an undecided interval stops.")
    ] = 600.0,
    max_repeats: Annotated[int, _env("--max-repeats", "Bench: repeat cap.")] = 60,
    reports: Annotated[Path, _env("--reports", "Folder of every report, the JUnit file and the summary.")] = Path(
        "reports/ci"
    ),
    summary: Annotated[
        Optional[Path],
        typer.Option("--summary", help="Also append the summary here.", show_default="$GITHUB_STEP_SUMMARY when set"),
    ] = None,
) -> None:
    if gate not in GATE_MODES:
        raise CliError(f"--gate must be one of {', '.join(GATE_MODES)}, got {gate!r}")
    limit = _given(limit)
    if limit is not None and limit != "all" and not (limit.isdigit() and int(limit) > 0):
        raise CliError(f"--limit must be a positive number of prompts or 'all', got {limit!r}")
    if engine_version is None:
        engine_version = os.environ.get("DDTREE_ENGINE_VERSION")  # given but empty: the pinned version
    reports.mkdir(parents=True, exist_ok=True)
    for stale in OUTPUTS:  # a self-hosted runner keeps its folders: never report an earlier run's files
        (reports / stale).unlink(missing_ok=True)
    common: list[str] = ["--engine", engine]
    for flag, value in (
        ("--pair", pair),
        ("--pairs-file", pairs_file),
        ("--model", model),
        ("--drafter", drafter),
        ("--dtype", dtype),
        ("--device", device),
        ("--modes", modes),
        ("--budgets", budgets),
        ("--prompts", prompts),
        ("--max-new-tokens", max_new_tokens),
        ("--threads", threads),
        ("--engine-timeout", engine_timeout),
    ):
        if _given(value) is not None:
            common += [flag, str(value)]
    if limit not in (None, "all"):
        common += ["--limit", limit]
    if isolate is not None:
        common.append("--isolate" if isolate else "--no-isolate")
    for option in _listed(engine_option, "DDTREE_ENGINE_OPTIONS"):
        common += ["--engine-option", option]
    hw = opt.hw_class(_given(device) or "cpu", _given(hardware_class))
    common += ["--hardware-class", hw]
    check_args = [*common, *(a for name in _listed(only, "DDTREE_CHECKS") for a in ("--check", name))]
    bench_args = [*common, "--time-budget", str(time_budget), "--max-repeats", str(max_repeats)]
    bench_args += [
        a for option in _listed(against_option, "DDTREE_AGAINST_OPTIONS") for a in ("--against-option", option)
    ]
    outputs(
        artifact=f"ddtree-conformance-{slug(engine)}-{slug(pair or 'fixture')}-{slug(dtype or 'float32')}-{slug(hw)}"
    )

    steps = [install(_listed(engine_requirement, "DDTREE_ENGINE_REQUIREMENT"), engine, engine_version)]
    if steps[-1].code == EXIT_OK:
        steps.append(install_check(engine, reports))
    if all(s.code == EXIT_OK for s in steps):
        step, _ = conformance(check_args, _listed(allow_skip, "DDTREE_ALLOW_SKIP"), reports)
        steps.append(step)
        if step.code in (EXIT_OK, EXIT_FAILED, EXIT_INCOMPLETE):  # a release needs both verdicts
            steps += throughput(
                bench_args,
                against=_given(against),
                against_engine=_given(against_engine),
                tolerance=tolerance,
                baselines=Path(baselines) if _given(baselines) else None,
                hw=hw,
                gate=gate,
                reports=reports,
            )
    job = combine(steps)
    title = f"{engine} on {pair or 'fixture'} ({dtype or 'float32'}, {hw})"
    markdown = summary_markdown(title, steps, job, reports)
    (reports / "summary.md").write_text(markdown)
    publish(markdown, job, steps, summary)
    outputs(**{"exit-code": str(job.code)})
    for step in steps:
        state = "skipped" if step.skipped else f"exit {step.code}"
        _say(f"{step.name}: {state} ({step.seconds:.0f} s): {step.summary}")
    if job.code != EXIT_OK:
        _say(f"FAILED: {job.name}: {job.summary} (exit {job.code}); summary {reports / 'summary.md'}")
        raise typer.Exit(job.code)
    _say(f"passed; summary {reports / 'summary.md'}")
