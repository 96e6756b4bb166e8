"""What a rendered report shows: the typed values the report templates read, built from a report dict.

The templates in ``templates/`` (``report.md.j2``, ``report.html.j2``) get one :class:`ReportView`
as ``view`` and read only attributes of the frozen dataclasses below; no dict key is part of the
contract between this module and a template. :mod:`ddtree_conformance.rendering` renders with
``StrictUndefined``, so a template reading a field a view does not have fails instead of rendering
blank. Every cell and line is already a string here: a template lays out, it computes nothing.

:func:`build_view` is what every report shows (its Markdown and its HTML); :func:`build_html_view`
adds what only the HTML page shows (plots as base64 PNGs, the first failing round's trees).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .context_lengths import report_line
from .option_names import option
from .rendering import Markup
from .report_plots import plots
from .report_trees import trees_html

__all__ = [
    "Banner",
    "Table",
    "CheckRow",
    "CheckTable",
    "Plot",
    "ReportView",
    "build_view",
    "build_html_view",
    "report_verdict",
]

Rows = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Banner:
    """The verdict at the top of a report: ``status`` (also the banner's CSS class), its word, why."""

    status: str
    word: str
    reason: str


@dataclass(frozen=True)
class Table:
    """A table of strings (``head``, ``rows``) and the lines under it (``notes``)."""

    head: tuple[str, ...]
    rows: Rows
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckRow:
    """One check result: its shown status (``not run``, ``skip (engine)``...) and the status's CSS class."""

    check: str
    status: str
    css: str
    message: str
    detectable: str
    passed: bool


@dataclass(frozen=True)
class CheckTable:
    """A table a check put in its details (``details["tables"]``), with the check that made it."""

    check: str
    status: str
    title: str
    columns: tuple[str, ...]
    rows: Rows
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Plot:
    """A figure of the HTML page: title, caption, and the PNG as base64."""

    title: str
    caption: str
    data: str


@dataclass(frozen=True)
class ReportView:
    """Everything a report template reads. ``partial``: the count of checks not run (or ``"?"``) when
    the run stopped before it finished, else None. ``plots`` and ``first_round`` are the HTML page's
    (:func:`build_html_view`); a :func:`build_view` has none."""

    title: str
    banner: Banner | None
    context: tuple[str, ...]
    partial: int | str | None
    summary: Table
    coverage: Table | None
    checks: tuple[CheckRow, ...]
    not_passed: tuple[CheckRow, ...]
    tables: tuple[CheckTable, ...]
    ab: Table | None
    plots: tuple[Plot, ...] = ()
    first_round: Markup = Markup("")


# -------------------------------------------------------------------------- verdict and title


def report_verdict(report: dict) -> dict | None:
    """``{"status", "reason"}`` of a report that has a verdict (check and A/B reports; older check
    reports: from their counts), else None (a bench report is judged by ``gate``)."""
    if isinstance(report.get("verdict"), dict):
        return report["verdict"]
    counts = report.get("counts")
    if report.get("kind") != "check" or not counts:
        return None
    if counts.get("fail"):
        return {"status": "fail", "reason": f"{counts['fail']} checks failed"}
    return {
        "status": "pass",
        "reason": f"{counts.get('pass', 0)} checks passed, {counts.get('skip', 0)} skipped "
        "(a report without a coverage table)",
    }


def _banner(report: dict) -> Banner | None:
    found = report_verdict(report)
    if found is None:
        return None
    status = str(found["status"])
    return Banner(status=status, word=status.upper(), reason=str(found.get("reason", "")))


def _engine_name(report: dict) -> str:
    """The engine as it names itself (``capabilities().name`` and version), and the spec it was run by."""
    s = report.get("settings", {})
    engine = report.get("engine") or {}
    spec = engine.get("spec") or s.get("engine", "?")
    own = " ".join(x for x in (engine.get("name"), engine.get("version")) if x)
    return f"{own} ({spec})" if own and engine.get("name") != spec else (own or spec)


def _title(report: dict) -> str:
    s = report.get("settings", {})
    kind = report.get("kind", "run")
    return (
        f"ddtree-conformance {kind}: {_engine_name(report)} on {s.get('pair_name', '?')} "
        f"({s.get('dtype', '?')}, {s.get('device', '?')}, {report.get('hardware_class', '?')})"
    )


# -------------------------------------------------------------------------- cells


def _fmt(x: Any, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _speedup_cell(run: dict) -> str:
    sp = run.get("speedup")
    if not sp:
        return "-"
    point = sp.get("estimate", sp.get("median"))
    return f"{point:.3f}x [{_fmt(sp.get('ci_low'))}, {_fmt(sp.get('ci_high'))}]"


def _cost_cell(run: dict) -> str:
    cm = run.get("cost_model") or {}
    ratio = (cm.get("step_over_round") or {}).get("estimate")
    if cm.get("tau") is None or not ratio:
        return "-"
    return f"{cm['tau']:.2f} x {ratio:.3f} ({cm['step_s'] * 1e3:.2f} / {cm['round_s'] * 1e3:.2f} ms)"


def _positions_cell(run: dict, depth: int = 4) -> str:
    pos = run.get("per_position") or []
    if not pos:
        return "-"
    shown = " / ".join(f"{p:.2f}" for p in pos[:depth])
    return shown + (" ..." if len(pos) > depth else "")


def _bench_cells(run: dict) -> tuple[str, ...]:
    """A bench run's throughput cells: median tokens/s, speedup [CI], cost model, CV, when it stopped."""
    tps = run.get("tokens_per_s") or []
    med = sorted(tps)[len(tps) // 2] if tps else None
    sp = run.get("speedup") or {}
    stop = sp.get("stop") or {}
    return (
        _fmt(med, 1),
        _speedup_cell(run),
        _cost_cell(run),
        _fmt(sp.get("cv"), 3) if sp else "-",
        f"{stop['decision']} after {stop['repeats']}" if stop else "-",
    )


# -------------------------------------------------------------------------- sections


def _summary(report: dict) -> Table:
    bench = report.get("kind") == "bench"
    head = ("run", "tau", "tau (mean of responses)", "accept d=1/2/3/4")
    if bench:
        head += ("tokens/s (median)", "speedup [CI]", "tau x step/round (step / round)", "CV", "stopped")
    rows = tuple(
        (
            str(run.get("label") or run["mode"]),
            _fmt(run.get("tau")),
            _fmt(run.get("tau_per_response_mean")),
            _positions_cell(run),
            *(_bench_cells(run) if bench else ()),
        )
        for run in report.get("runs", [])
    )
    return Table(head=head, rows=rows)


def _context_lines(report: dict) -> tuple[str, ...]:
    s = report.get("settings", {})
    lines = [
        f"prompts: {s.get('prompt_set')} (limit {s.get('limit') or 'none'}), max new tokens {s.get('max_new_tokens')}"
    ]
    b = report.get("bench")
    if b:
        lines.append(
            f"{b['repeats']} interleaved repeats ({b['interleaving']}); timing basis: {b['timing_basis']}; "
            f"CI: {b['ci']}"
        )
        if b.get("speedup_definition"):
            lines.append(
                f"speedup: {b['speedup_definition']}"
                + (f"; sequential plan {b['plan']}" if b.get("sequential") else "")
            )
        lines.append(f"tau: {b['tau_definition']}")
    counts = report.get("counts")
    if counts:
        not_run = f", {counts['not_run']} not run" if counts.get("not_run") else ""
        families = (report.get("coverage") or {}).get("families", [])
        inapplicable = sum(f.get("not_applicable", 0) for f in families)
        na = f" ({inapplicable} not applicable on this run)" if inapplicable else ""
        lines.append(
            f"checks: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
            f"{counts.get('skip', 0)} skipped{na}{not_run}"
        )
    if s.get("run_seed") is not None and report.get("kind") == "check":
        held = report.get("held_out_prompts")
        lines.append(
            f"run seed {s['run_seed']}"
            + (f"; {len(held)} held-out prompts drawn at run time" if held is not None else "")
        )
    context = report_line(report.get("results") or []) if report.get("kind") == "check" else None
    if context:
        lines.append(context)
    allowed = (report.get("coverage") or {}).get("allow_skip")
    if allowed:
        lines.append(f"allowed to skip ({option('allow_skip')}): {', '.join(allowed)}")
    env = report.get("environment", {})
    lines.append(
        f"created {report.get('created')}; suite {env.get('ddtree_conformance')}, torch {env.get('torch')}"
        + (f"; route {report['route']}" if report.get("route") else "")
    )
    return tuple(lines)


_COVERAGE_HEAD = (
    "family",
    "ran",
    "pass / fail / skip / n/a",
    "requests",
    "prompts",
    "tokens",
    "rounds",
    "nodes",
    "did not run: why",
)


def _coverage_row(f: dict) -> tuple[str, ...]:
    """One family of the coverage table: counts, evidence, and why what did not run did not."""
    ev = f.get("evidence") or {}
    why = [*(f"{g} (engine{'; allowed' if f.get('allowed') else ''})" for g in f.get("gaps", [])), *f.get("notes", [])]
    if f.get("not_run"):
        why.append(f"{f['not_run']} not run (the run stopped)")
    return (
        str(f["family"]),
        str(f.get("status", "")),
        f"{f['passed']} / {f['failed']} / {f['skipped']} / {f.get('not_applicable', 0)}",
        *(str(ev.get(k, 0)) for k in ("requests", "prompts", "tokens", "rounds", "nodes")),
        "; ".join(why) or "-",
    )


def _coverage(report: dict) -> Table | None:
    cover = report.get("coverage")
    if not cover:
        return None
    notes = [f"incomplete: {cover['reason']}"] if cover.get("reason") else []
    notes += [
        f"allowed ({option('allow_skip')}): {gap['check']}: {gap['reason']}" for gap in cover.get("allowed", [])[:20]
    ]
    notes += [f"{option('allow_skip')}: {line}" for line in cover.get("allow_skip_notes", [])]
    rows = tuple(_coverage_row(f) for f in cover.get("families", []))
    return Table(head=_COVERAGE_HEAD, rows=rows, notes=tuple(notes))


def _status_of(result: dict) -> tuple[str, str]:
    """(shown status, css class) of a result."""
    status = str(result.get("status", "?"))
    if (result.get("details") or {}).get("not_run"):
        return "not run", "skip"
    if status == "skip" and result.get("cause") == "not-applicable":
        return "not applicable", "skip"
    if status == "skip" and result.get("cause"):
        return f"skip ({result['cause']})", "skip"
    return status, status


def _check_row(result: dict) -> CheckRow:
    status, css = _status_of(result)
    return CheckRow(
        check=str(result.get("check", "?")),
        status=status,
        css=css,
        message=str(result.get("message", "")),
        detectable=str((result.get("details") or {}).get("detectable") or "-"),
        passed=result.get("status") == "pass",
    )


def _results(report: dict) -> tuple[CheckRow, ...]:
    """Every result, sorted fail, skip, pass, each with its shown status."""
    order = {"fail": 0, "skip": 1, "pass": 2}
    ranked = sorted(report.get("results") or [], key=lambda r: order.get(r.get("status"), 3))
    return tuple(_check_row(r) for r in ranked)


def _tables(report: dict) -> tuple[CheckTable, ...]:
    """Tables a check put in its details (``details["tables"]``: title, columns, rows, notes)."""
    return tuple(
        CheckTable(
            check=str(result.get("check", "?")),
            status=str(result.get("status", "?")),
            title=str(table.get("title", "Table")),
            columns=tuple(str(c) for c in table["columns"]),
            rows=tuple(tuple(str(c) for c in row) for row in table["rows"]),
            notes=tuple(str(n) for n in table.get("notes") or []),
        )
        for result in report.get("results") or []
        for table in (result.get("details") or {}).get("tables") or []
        if table.get("columns") and table.get("rows")
    )


_AB_HEAD = ("run", "candidate tokens/s", "baseline tokens/s", "ratio [CI]", "edge", "decision")


def _ab(report: dict) -> Table | None:
    ab = report.get("ab")
    if not ab:
        return None
    rows = tuple(
        (
            str(r["label"]),
            _fmt(r.get("candidate_tokens_per_s"), 1),
            _fmt(r.get("baseline_tokens_per_s"), 1),
            f"{_fmt(r.get('estimate'))} [{_fmt(r.get('ci_low'))}, {_fmt(r.get('ci_high'))}]",
            _fmt(r.get("edge")),
            f"{r.get('decision', '-')}: {r.get('reason', '')}",
        )
        for r in ab.get("runs", [])
    )
    notes = (
        f"candidate: {ab.get('candidate', '?')}; baseline: {ab.get('baseline', '?')}",
        f"{ab.get('definition', '')}",
        f"order: {ab['order']}" if ab.get("order") else "",
        f"machine: {ab['machine_line']}" if ab.get("machine_line") else "",
        f"warm-up: {ab['warmup']['reason']}" if (ab.get("warmup") or {}).get("reason") else "",
    )
    return Table(head=_AB_HEAD, rows=rows, notes=tuple(n for n in notes if n))


# -------------------------------------------------------------------------- views


def build_view(report: dict) -> ReportView:
    """What every rendering of ``report`` shows (its Markdown; its HTML adds :func:`build_html_view`'s)."""
    checks = _results(report)
    partial = report.get("counts", {}).get("not_run", "?") if report.get("partial") else None
    return ReportView(
        title=_title(report),
        banner=_banner(report),
        context=_context_lines(report),
        partial=partial,
        summary=_summary(report),
        coverage=_coverage(report),
        checks=checks,
        not_passed=tuple(r for r in checks if not r.passed),
        tables=_tables(report),
        ab=_ab(report),
    )


def build_html_view(report: dict) -> ReportView:
    """:func:`build_view` with the HTML page's plots and its drawing of the first failing round."""
    # Runs without a tau (an engine that reports no acceptance data) have nothing to plot.
    plotted = {**report, "runs": [r for r in report.get("runs", []) if r.get("tau") is not None]}
    return replace(
        build_view(report),
        plots=tuple(Plot(title=t, caption=c, data=d) for t, c, d in plots(plotted)),
        first_round=Markup(trees_html(report.get("results") or [])),
    )
