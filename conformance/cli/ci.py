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
6. summary: ``summary.md`` in the reports folder (``ci.json``: the same job as data), appended to
   ``$GITHUB_STEP_SUMMARY`` on GitHub and sent to ``buildkite-agent annotate`` on Buildkite; one
   ``::error::`` line per failed step on GitHub.

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
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

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
    CommandFailed,
    app,
    command,
)
from .ci_options import CiEngine, CiRun, CiThroughput, Reports, Summary, given, listed
from .ci_output import (
    Step,
    combine,
    gate_summary,
    job_record,
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
    "ci.json",
    "environment.txt",
]


def _say(text: str) -> None:
    print(f"ci: {text}", flush=True)


def _run(name: str, cmd: list[str], **kwargs) -> tuple[Step, subprocess.CompletedProcess]:
    """``cmd`` run as the step ``name``: the step (its exit status and time), and the finished process."""
    started = time.perf_counter()
    _say(f"{name}: {' '.join(cmd)}")
    proc = subprocess.run(cmd, **kwargs)
    return Step(name, code=proc.returncode, seconds=time.perf_counter() - started), proc


class _LogStream(io.TextIOBase):
    """stderr passed through, as a CI log: never a terminal, so a step prints progress lines, not bars."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _invoke(args: tuple[str, ...]) -> tuple[int, str]:
    """``ddtree-conformance ARGS`` run here: its exit status, and the one-line error it failed with ("": none)."""
    # base's app: every command is registered on it once the cli package has loaded (it has: ``ci`` runs)
    suite = typer.main.get_command(app)
    try:
        with (
            contextlib.redirect_stderr(_LogStream(sys.stderr)),
            suite.make_context("ddtree-conformance", list(args)) as ctx,
        ):
            suite.invoke(ctx)
    except CommandFailed as exc:  # an expected failure, printed as its one `error:` line
        return exc.exit_code, exc.message
    except (typer.Exit, click.exceptions.Exit) as exc:
        return exc.exit_code, ""
    except KeyboardInterrupt:
        return 130, ""
    except click.exceptions.ClickException as exc:  # a usage error click found (unknown option)
        exc.show()
        return exc.exit_code, exc.format_message()
    except click.exceptions.Abort:
        return EXIT_FAILED, ""
    return EXIT_OK, ""


def _suite(name: str, *args: str) -> Step:
    """``ddtree-conformance ARGS`` in this process as the step ``name``: its exit status, and the error it
    failed with as its summary until the step says more."""
    started = time.perf_counter()
    _say(f"{name}: ddtree-conformance {' '.join(args)}")
    code, error = _invoke(args)
    return Step(name, code=code, summary=error, seconds=time.perf_counter() - started)


# ------------------------------------------------------------------------------------------ steps


def install(requirements: list[str], engine: str, engine_version: Optional[str]) -> Step:
    wanted = list(requirements)
    if not wanted and engine_version is not None and engine in PINNED_ENGINES:
        version = engine_version if engine_version not in ("", "pinned") else pinned_version(*PINNED_ENGINES[engine])
        wanted = [f"{engine}=={version}"]
    if not wanted:
        return Step("install", skipped=True, summary="nothing to install (the engine is in this environment)")
    step, proc = _run(
        "install",
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
    out = reports / "check.json"
    args = [*run_args, *(a for name in allow_skip for a in ("--allow-skip", name)), "--out", str(out)]
    step = _suite("conformance", "check", *args)
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
    ab_spread: Optional[str] = None,
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
        extra += ["--ab-spread", ab_spread] if ab_spread else []
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
    bench = _suite("bench", "bench", *bench_args, *extra, "--out", str(out))
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
    judged = _suite("gate", "gate", str(out), *gate_extra, "--hardware-class", hw, "--out", str(gate_out))
    result = read_json(gate_out) or {}
    judged.files.append(gate_out)
    judged.summary = gate_summary(judged.code, result.get("rows", []), out)
    return [bench, judged]


# ------------------------------------------------------------------------------------------ the command


def _engine_version(engine: CiEngine) -> Optional[str]:
    """--engine-version, else $DDTREE_ENGINE_VERSION (given but empty: the pinned version)."""
    return engine.engine_version if engine.engine_version is not None else os.environ.get("DDTREE_ENGINE_VERSION")


def _hw(run: CiRun) -> str:
    return opt.hw_class(given(run.device) or "cpu", given(run.hardware_class))


def _limit(text: Optional[str]) -> Optional[str]:
    """--limit: a positive number or 'all' (None: not given); else exit 2."""
    limit = given(text)
    if limit is not None and limit != "all" and not (limit.isdigit() and int(limit) > 0):
        raise CliError(f"--limit must be a positive number of prompts or 'all', got {limit!r}")
    return limit


def _common_args(engine: CiEngine, run: CiRun) -> list[str]:
    """The options every step of the suite takes: --engine, the ones given, --hardware-class."""
    limit = _limit(run.limit)
    flags = (
        ("--pair", run.pair),
        ("--pairs-file", run.pairs_file),
        ("--model", run.model),
        ("--drafter", run.drafter),
        ("--dtype", run.dtype),
        ("--device", run.device),
        ("--modes", run.modes),
        ("--budgets", run.budgets),
        ("--prompts", run.prompts),
        ("--max-new-tokens", run.max_new_tokens),
        ("--threads", run.threads),
        ("--engine-timeout", run.engine_timeout),
    )
    options = listed(engine.engine_option, "DDTREE_ENGINE_OPTIONS")
    return [
        *("--engine", engine.engine),
        *(a for flag, value in flags if given(value) is not None for a in (flag, str(value))),
        *(("--limit", limit) if limit not in (None, "all") else ()),
        *(() if run.isolate is None else ("--isolate" if run.isolate else "--no-isolate",)),
        *(a for option in options for a in ("--engine-option", option)),
        *("--hardware-class", _hw(run)),
    ]


def _bench_args(bench: CiThroughput) -> list[str]:
    """What the bench takes beyond the common options."""
    options = listed(bench.against_option, "DDTREE_AGAINST_OPTIONS")
    return [
        *("--time-budget", str(bench.time_budget), "--max-repeats", str(bench.max_repeats)),
        *(a for option in options for a in ("--against-option", option)),
    ]


@command(
    help=__doc__.split("\n\n", 1)[0] + "\n\nSteps: install, install check, conformance (check), bench, gate, "
    "summary. Every option also reads $DDTREE_<OPTION> (--engine: $DDTREE_ENGINE; list options one value per "
    "line). Exit status: the most severe step's (2, 5, 1, 7, 3, 4), else 0."
)
def ci(
    *,
    under_test: CiEngine,
    run: CiRun,
    bench: CiThroughput,
    reports: Reports = Path("reports/ci"),
    summary: Summary = None,
) -> None:
    if given(bench.ab_spread):  # checked before any step, not after the install and the checks
        from ..ab import parse_ab_spread

        try:
            parse_ab_spread(bench.ab_spread)
        except ValueError as err:
            raise CliError(f"{err} ($DDTREE_AB_SPREAD, the workflow's ab-spread input)") from None
        if not given(bench.against):
            _say(
                "note: --ab-spread is not used: it widens an A/B interval, and no baseline build was given"
                " (--against, the workflow's baseline-engine-requirement)"
            )
    if bench.gate not in GATE_MODES:
        raise CliError(f"--gate must be one of {', '.join(GATE_MODES)}, got {bench.gate!r}")
    common = _common_args(under_test, run)  # --limit checked here: exit 2 before any step
    _clear(reports)
    hw = _hw(run)
    outputs(
        artifact=f"ddtree-conformance-{slug(under_test.engine)}-{slug(run.pair or 'fixture')}-"
        f"{slug(run.dtype or 'float32')}-{slug(hw)}"
    )
    steps = _steps(under_test, run, bench, common, reports, hw=hw)
    title = f"{under_test.engine} on {run.pair or 'fixture'} ({run.dtype or 'float32'}, {hw})"
    _report(title, steps, reports, summary)


def _clear(reports: Path) -> None:
    """The reports folder made, without an earlier run's files (a self-hosted runner keeps its folders)."""
    reports.mkdir(parents=True, exist_ok=True)
    for stale in OUTPUTS:
        (reports / stale).unlink(missing_ok=True)


def _steps(
    engine: CiEngine, run: CiRun, bench: CiThroughput, common: list[str], reports: Path, *, hw: str
) -> list[Step]:
    """Install, install check, conformance, then the bench and the gate unless a step before cannot go on."""
    steps = [
        install(listed(engine.engine_requirement, "DDTREE_ENGINE_REQUIREMENT"), engine.engine, _engine_version(engine))
    ]
    if steps[-1].code == EXIT_OK:
        steps = [*steps, install_check(engine.engine, reports)]
    if any(s.code != EXIT_OK for s in steps):
        return steps
    check_args = [*common, *(a for name in listed(run.only, "DDTREE_CHECKS") for a in ("--check", name))]
    step, _ = conformance(check_args, listed(run.allow_skip, "DDTREE_ALLOW_SKIP"), reports)
    if step.code not in (EXIT_OK, EXIT_FAILED, EXIT_INCOMPLETE):
        return [*steps, step]
    judged = throughput(  # a release needs both verdicts
        [*common, *_bench_args(bench)],
        against=given(bench.against),
        against_engine=given(bench.against_engine),
        tolerance=bench.tolerance,
        ab_spread=given(bench.ab_spread),
        baselines=Path(bench.baselines) if given(bench.baselines) else None,
        hw=hw,
        gate=bench.gate,
        reports=reports,
    )
    return [*steps, step, *judged]


def _report(title: str, steps: list[Step], reports: Path, summary: Optional[Path]) -> None:
    """The job's summary written and published, a line per step; exit with the most severe step's status."""
    job = combine(steps)
    markdown = summary_markdown(title, steps, job, reports)
    (reports / "summary.md").write_text(markdown)
    (reports / "ci.json").write_text(json.dumps(job_record(title, steps, job), indent=1) + "\n")
    publish(markdown, job, steps, summary)
    outputs(**{"exit-code": str(job.code)})
    for step in steps:
        state = "skipped" if step.skipped else f"exit {step.code}"
        _say(f"{step.name}: {state} ({step.seconds:.0f} s): {step.summary}")
    if job.code != EXIT_OK:
        _say(f"FAILED: {job.name}: {job.summary} (exit {job.code}); summary {reports / 'summary.md'}")
        raise typer.Exit(job.code)
    _say(f"passed; summary {reports / 'summary.md'}")
