"""``bench --against ENGINE``: the candidate and a baseline build, interleaved, judged by their ratio.

The measurement and the verdict are :mod:`ddtree_conformance.ab`'s; this module starts the two
engines (each in a :class:`~ddtree_conformance.session.SuiteSession`, the baseline in its own
environment when ``--against`` names a build to install), writes the report and prints its table.
The report's path is ``bench``'s (:func:`~ddtree_conformance.output_paths.output_path`, as ``check``
fixes it: absolute, never an input of the run, inside an ``--out`` folder as ``ab-<engine>.json``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..ab import AgainstError, baseline_for, measure_ab
from ..adapters.process import IsolatedEngine
from ..adapters.registry import create_engine, resolve_engine
from ..bench import BenchError
from ..check_report import engine_identity
from ..option_names import option
from ..progress import progress_printer
from ..report import new_report, write_report
from ..run import Run
from ..sequential import SequentialPlan
from ..session import SuiteSession
from ..settings import SuiteSettings, parse_engine_options
from ..support import unsupported
from .base import EXIT_FAILED, CliError, stdout_console

__all__ = ["bench_against"]


def _baseline_factory(settings: SuiteSettings, baseline) -> Any:
    def make(model_dir: str, drafter_dir: str | None):
        if baseline.installed or settings.isolate:
            return IsolatedEngine(
                baseline.spec,
                model_dir,
                drafter_dir,
                timeout_s=settings.engine_timeout_s,
                start_timeout_s=settings.engine_timeout_s,
                timeout_option=option("engine_timeout_s"),
                torch_threads=settings.torch_threads,
                python=baseline.python,
                sys_path=None if baseline.sys_path is None else list(baseline.sys_path),
                **settings.engine_options,
            )
        return create_engine(baseline.spec, model_dir, drafter_dir, **settings.engine_options)

    return make


def _ready(session: SuiteSession, settings: SuiteSettings, who: str) -> None:
    session.require_support()
    problem = unsupported(
        session.capabilities,
        dtype=settings.dtype,
        device=settings.device,
        modes=settings.modes,
        no_drafter=settings.drafter_dir is None,
    )
    if problem:
        raise CliError(f"{who}: {problem}")


def bench_against(
    settings: SuiteSettings,
    against: str,
    *,
    hw: str,
    plan: SequentialPlan,
    warmup: bool,
    tolerance: float,
    out: Path,
    against_engine: str | None = None,
    against_options: list[str] | None = None,
    spread: tuple[float, int] | None = None,
) -> Path:
    runs = [("dflash", None)] if "dflash" in settings.modes else []
    runs += [("ddtree", b) for b in settings.budgets] if "ddtree" in settings.modes else []
    with tempfile.TemporaryDirectory(prefix="ddtree-ab-") as work:
        try:
            baseline = baseline_for(against, settings.engine, Path(work), against_engine=against_engine)
        except AgainstError as exc:
            raise CliError(str(exc)) from None
        base_settings = _baseline_settings(settings, baseline, against_options)
        part, identity = _measure(
            settings, base_settings, baseline, runs, tolerance=tolerance, plan=plan, warmup=warmup, spread=spread
        )
    report = _ab_report(settings, hw, part, identity, baseline, against)
    paths = write_report(report, out)
    _print_ab(report, settings, hw, paths)
    return paths[0]


def _baseline_settings(settings: SuiteSettings, baseline, against_options: list[str] | None) -> SuiteSettings:
    """The run settings of the baseline build: its spec, and --against-option's options (else, for a build
    of the same engine, the candidate's; another engine its own defaults). An unknown one: exit 2."""
    if against_options is not None:
        options = parse_engine_options(against_options)
    else:
        options = settings.engine_options if baseline.spec == settings.engine else {}
    if not baseline.installed:
        resolve_engine(baseline.spec, options)  # unknown engine or option: exit 2 before any work
    return settings.model_copy(update={"engine": baseline.spec, "engine_options": options})


def _measure(
    settings: SuiteSettings,
    base_settings: SuiteSettings,
    baseline,
    runs: list,
    *,
    tolerance: float,
    plan: SequentialPlan,
    warmup: bool,
    spread: tuple[float, int] | None,
) -> tuple[dict, dict]:
    """Both engines started and checked, then ``measure_ab``: its report part, and both engines' identities."""
    printer = progress_printer()
    candidate = SuiteSession(settings)
    reference = SuiteSession(base_settings, engine_factory=_baseline_factory(base_settings, baseline))
    try:
        _ready(candidate, settings, "candidate")
        _ready(reference, base_settings, f"baseline {baseline.describe()}")
        identity = {"candidate": engine_identity(candidate), "baseline": engine_identity(reference)}
        configs = {Run(mode, budget).label: candidate.config(mode, budget) for mode, budget in runs}
        steps = [0]

        def step(label: str) -> None:
            steps[0] += 1
            if printer is not None:
                printer(f"bench A/B: {label} ({steps[0]} runs)")

        try:
            part = measure_ab(
                candidate.engine,
                reference.engine,
                candidate.requests(),
                configs,
                tolerance=tolerance,
                plan=plan,
                warmup=warmup,
                on_step=step,
                spread=spread,
            )
        except BenchError as exc:
            raise CliError(str(exc), exit_code=EXIT_FAILED) from exc
        return part, identity
    finally:
        candidate.close()
        reference.close()


def _ab_report(settings: SuiteSettings, hw: str, part: dict, identity: dict, baseline, against: str) -> dict:
    installed = f", installed from {baseline.source}" if baseline.installed else ""
    ab = {
        **part["ab"],
        "candidate": _named(identity["candidate"]),
        "baseline": _named(identity["baseline"]) + installed,
        "baseline_engine": identity["baseline"],
        "against": against,
    }
    return {**new_report("ab", settings.model_dump(), hw), **part, "engine": identity["candidate"], "ab": ab}


def _print_ab(report: dict, settings: SuiteSettings, hw: str, paths: list[Path]) -> None:
    table = Table(
        title=escape(
            f"A/B: {report['ab']['candidate']} against {report['ab']['baseline']} "
            f"({settings.pair_name}, {settings.dtype}, {settings.device}, {hw})"
        )
    )
    for column in ("run", "candidate tok/s", "baseline tok/s", "ratio [CI]", "edge", "decision"):
        table.add_column(column, overflow="fold")
    for row in report["ab"]["runs"]:
        ratio = "-" if row["estimate"] is None else f"{row['estimate']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        table.add_row(
            row["label"],
            f"{row['candidate_tokens_per_s']:.1f}",
            f"{row['baseline_tokens_per_s']:.1f}",
            ratio,
            f"{row['edge']:.3f}",
            escape(f"{row['decision']}: {row['reason']}"),
        )
    console = stdout_console()
    console.print(table)
    console.print(escape(f"{report['verdict']['status'].upper()}: {report['verdict']['reason']}"), soft_wrap=True)
    console.print(
        escape(f"machine: {report['ab']['machine_line']}; warm-up: {report['ab']['warmup'].get('reason')}"),
        soft_wrap=True,
    )
    console.print(
        escape(f"wrote {', '.join(map(str, paths))}; `ddtree-conformance gate {paths[0]}` judges it"), soft_wrap=True
    )


def _named(identity: dict) -> str:
    own = " ".join(x for x in (identity.get("name"), identity.get("version")) if x)
    return f"{own} ({identity['spec']})" if own else identity["spec"]
