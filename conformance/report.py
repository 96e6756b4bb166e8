"""Run reports: every ``bench`` and ``check`` run writes three files next to each other.

* ``<stem>.json``: the versioned run report (schema below); the input to ``gate`` and ``baseline``;
* ``<stem>.md``: the summary table a PR comment would show;
* ``<stem>.html``: one self-contained page (CSS inline, plots as base64 PNGs, no external URLs).

Run-report schema (``schema: ddtree-conformance/run-report``; check reports keep their own
``schema: ddtree-conformance/check-report`` name and add the same fields):

``schema_version`` (int), ``kind`` ("bench" | "check"), ``created`` (ISO-8601 UTC),
``hardware_class``, ``environment`` (versions, platform), ``settings`` (the suite settings),
``runs``: one object per (mode, budget) with ``mode``, ``budget``, ``label``, ``tau``,
``tau_per_response_mean``, ``per_position`` (rate at depth 1..L), ``histogram`` (acceptance length
-> rounds), ``rounds``, and for bench runs ``tokens``, ``tokens_per_s`` (per repeat), ``cost_model``
(``tau``, ``step_s``, ``round_s``, ``step_over_round``) and ``speedup`` (``estimate``, ``median``,
``ci_low``, ``ci_high``, ``confidence``, ``samples``, ``cv``, ``alpha``, ``sequential``, ``looks``,
``edge``, ``stop``, ``spread`` against a baseline of several runs; see :mod:`ddtree_conformance.bench`);
bench reports also carry ``bench`` (procedure; ``machine``: the machine's state and identity,
``warmup``: its rounds and why it stopped), check reports ``counts`` and ``results``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from pathlib import Path
from typing import Any

from . import __version__
from .context_lengths import report_line
from .files import atomic_write, read_json_object
from .option_names import option
from .rendering import Markup, render_html_template, render_markdown_template
from .report_plots import plots
from .report_trees import trees_html

__all__ = [
    "RUN_SCHEMA",
    "RUN_SCHEMA_VERSION",
    "ReportError",
    "new_report",
    "environment",
    "write_partial_report",
    "write_report",
    "load_report",
    "render_markdown",
    "render_html",
    "report_verdict",
]

RUN_SCHEMA = "ddtree-conformance/run-report"
RUN_SCHEMA_VERSION = 1
CHECK_SCHEMA = "ddtree-conformance/check-report"
KNOWN_SCHEMAS = {RUN_SCHEMA: RUN_SCHEMA_VERSION, CHECK_SCHEMA: 1}


class ReportError(ValueError):
    """A report file cannot be read as a run report; the message names the file and field."""


def environment() -> dict[str, Any]:
    import numpy  # heavy: only a report of a run needs them (the CLI imports this module for --help)
    import torch
    import transformers

    return {
        "ddtree_conformance": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
    }


def new_report(kind: str, settings: dict, hardware_class: str, *, schema: str = RUN_SCHEMA) -> dict[str, Any]:
    return {
        "schema": schema,
        "schema_version": KNOWN_SCHEMAS[schema],
        "kind": kind,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "hardware_class": hardware_class,
        "environment": environment(),
        "settings": settings,
        "runs": [],
    }


def load_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    report = read_json_object(path, ReportError, "report file")
    schema = report.get("schema")
    if schema not in KNOWN_SCHEMAS:
        raise ReportError(f"{path}: field 'schema' is {schema!r}; expected one of {sorted(KNOWN_SCHEMAS)}")
    if report.get("schema_version") != KNOWN_SCHEMAS[schema]:
        raise ReportError(
            f"{path}: field 'schema_version' is {report.get('schema_version')!r}; "
            f"this suite reads version {KNOWN_SCHEMAS[schema]} of {schema}"
        )
    for field in ("runs", "settings", "hardware_class"):
        if field not in report:
            raise ReportError(f"{path}: field '{field}' is missing (a report from an older suite?)")
    for i, run in enumerate(report["runs"]):
        for field in ("mode", "budget", "tau"):
            if field not in run:
                raise ReportError(f"{path}: field 'runs.{i}.{field}' is missing")
    return report


# -------------------------------------------------------------------------- writing


def report_paths(out: str | Path) -> tuple[Path, Path, Path]:
    """``out`` is the JSON path (``.json`` added when missing); Markdown and HTML sit beside it."""
    out = Path(out)
    json_path = out if out.suffix == ".json" else out.with_name(out.name + ".json")
    return json_path, json_path.with_suffix(".md"), json_path.with_suffix(".html")


def write_partial_report(report: dict[str, Any], finished: list, planned: list, out: str | Path) -> Path:
    """The JSON report of a check run still going: ``finished`` results, the rest of ``planned`` not
    run, ``"partial": true``. Rewritten after every check, so a run killed at a deadline (or by the
    OOM killer) leaves a report of what finished; the complete report replaces it at the end."""
    done = {r.check for r in finished}
    pending = [
        {
            "check": c.id,
            "status": "skip",
            "message": "not run: the run stopped before this check",
            "details": {"not_run": True},
        }
        for c in planned
        if c.id not in done
    ]
    results = [r.model_dump() for r in finished] + pending
    counts = {
        s: sum(r.status == s and not r.details.get("not_run") for r in finished) for s in ("pass", "fail", "skip")
    }
    counts["not_run"] = len(planned) - sum(not r.details.get("not_run") for r in finished)
    body = dict(report, partial=True, counts=counts, results=results)
    json_path = report_paths(out)[0]
    atomic_write(json_path, json.dumps(body, indent=1) + "\n")
    return json_path


def write_report(report: dict[str, Any], out: str | Path) -> tuple[Path, Path, Path]:
    json_path, md_path, html_path = report_paths(out)
    atomic_write(json_path, json.dumps(report, indent=1) + "\n")
    atomic_write(md_path, render_markdown(report))
    atomic_write(html_path, render_html(report))
    return json_path, md_path, html_path


# -------------------------------------------------------------------------- rendering


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


def _banner(report: dict) -> dict | None:
    found = report_verdict(report)
    if found is None:
        return None
    return {"status": found["status"], "word": found["status"].upper(), "reason": found.get("reason", "")}


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


def _summary(report: dict) -> dict:
    bench = report.get("kind") == "bench"
    head = ["run", "tau", "tau (mean of responses)", "accept d=1/2/3/4"]
    if bench:
        head += ["tokens/s (median)", "speedup [CI]", "tau x step/round (step / round)", "CV", "stopped"]
    rows = []
    for run in report.get("runs", []):
        row = [
            run.get("label") or run["mode"],
            _fmt(run.get("tau")),
            _fmt(run.get("tau_per_response_mean")),
            _positions_cell(run),
        ]
        if bench:
            tps = run.get("tokens_per_s") or []
            med = sorted(tps)[len(tps) // 2] if tps else None
            sp = run.get("speedup") or {}
            stop = sp.get("stop") or {}
            row += [
                _fmt(med, 1),
                _speedup_cell(run),
                _cost_cell(run),
                _fmt(sp.get("cv"), 3) if sp else "-",
                f"{stop['decision']} after {stop['repeats']}" if stop else "-",
            ]
        rows.append(row)
    return {"head": head, "rows": rows}


def _context_lines(report: dict) -> list[str]:
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
    return lines


def _coverage(report: dict) -> dict | None:
    cover = report.get("coverage")
    if not cover:
        return None
    head = [
        "family",
        "ran",
        "pass / fail / skip / n/a",
        "requests",
        "prompts",
        "tokens",
        "rounds",
        "nodes",
        "did not run: why",
    ]
    rows = []
    for f in cover.get("families", []):
        ev = f.get("evidence") or {}
        why = [
            *(f"{g} (engine{'; allowed' if f.get('allowed') else ''})" for g in f.get("gaps", [])),
            *f.get("notes", []),
        ]
        if f.get("not_run"):
            why.append(f"{f['not_run']} not run (the run stopped)")
        rows.append(
            [
                f["family"],
                f.get("status", ""),
                f"{f['passed']} / {f['failed']} / {f['skipped']} / {f.get('not_applicable', 0)}",
                *(str(ev.get(k, 0)) for k in ("requests", "prompts", "tokens", "rounds", "nodes")),
                "; ".join(why) or "-",
            ]
        )
    notes = []
    if cover.get("reason"):
        notes.append(f"incomplete: {cover['reason']}")
    for gap in cover.get("allowed", [])[:20]:
        notes.append(f"allowed ({option('allow_skip')}): {gap['check']}: {gap['reason']}")
    notes += [f"{option('allow_skip')}: {line}" for line in cover.get("allow_skip_notes", [])]
    return {"head": head, "rows": rows, "notes": notes}


def _status_of(result: dict) -> tuple[str, str]:
    """(shown status, css class) of a result."""
    status = result.get("status", "?")
    if (result.get("details") or {}).get("not_run"):
        return "not run", "skip"
    if status == "skip" and result.get("cause") == "not-applicable":
        return "not applicable", "skip"
    if status == "skip" and result.get("cause"):
        return f"skip ({result['cause']})", "skip"
    return status, status


def _results(report: dict) -> tuple[list[dict], list[dict]]:
    """(every result sorted fail, skip, pass; the ones that did not pass), each with its shown status."""
    order = {"fail": 0, "skip": 1, "pass": 2}
    rows = []
    for r in sorted(report.get("results") or [], key=lambda r: order.get(r.get("status"), 3)):
        status, css = _status_of(r)
        rows.append(
            {
                "check": r.get("check", "?"),
                "status": status,
                "css": css,
                "message": str(r.get("message", "")),
                "detectable": str((r.get("details") or {}).get("detectable") or "-"),
                "passed": r.get("status") == "pass",
            }
        )
    return rows, [r for r in rows if not r["passed"]]


def _tables(report: dict) -> list[dict]:
    """Tables a check put in its details (``details["tables"]``: title, columns, rows, notes)."""
    out = []
    for result in report.get("results") or []:
        for table in (result.get("details") or {}).get("tables") or []:
            if table.get("columns") and table.get("rows"):
                out.append(
                    {
                        "check": result.get("check", "?"),
                        "status": result.get("status", "?"),
                        "title": table.get("title", "Table"),
                        "columns": [str(c) for c in table["columns"]],
                        "rows": [[str(c) for c in row] for row in table["rows"]],
                        "notes": [str(n) for n in table.get("notes") or []],
                    }
                )
    return out


def _ab(report: dict) -> dict | None:
    ab = report.get("ab")
    if not ab:
        return None
    head = ["run", "candidate tokens/s", "baseline tokens/s", "ratio [CI]", "edge", "decision"]
    rows = [
        [
            r["label"],
            _fmt(r.get("candidate_tokens_per_s"), 1),
            _fmt(r.get("baseline_tokens_per_s"), 1),
            f"{_fmt(r.get('estimate'))} [{_fmt(r.get('ci_low'))}, {_fmt(r.get('ci_high'))}]",
            _fmt(r.get("edge")),
            f"{r.get('decision', '-')}: {r.get('reason', '')}",
        ]
        for r in ab.get("runs", [])
    ]
    notes = [
        f"candidate: {ab.get('candidate', '?')}; baseline: {ab.get('baseline', '?')}",
        f"{ab.get('definition', '')}",
        f"order: {ab['order']}" if ab.get("order") else "",
        f"machine: {ab['machine_line']}" if ab.get("machine_line") else "",
        f"warm-up: {ab['warmup']['reason']}" if (ab.get("warmup") or {}).get("reason") else "",
    ]
    return {"head": head, "rows": rows, "notes": [n for n in notes if n]}


def _view(report: dict) -> dict[str, Any]:
    checks, not_passed = _results(report)
    partial = report.get("counts", {}).get("not_run", "?") if report.get("partial") else None
    return {
        "title": _title(report),
        "banner": _banner(report),
        "context": _context_lines(report),
        "partial": partial,
        "summary": _summary(report),
        "coverage": _coverage(report),
        "checks": checks,
        "not_passed": not_passed,
        "tables": _tables(report),
        "ab": _ab(report),
    }


def render_markdown(report: dict) -> str:
    return render_markdown_template("report.md.j2", **_view(report))


def render_html(report: dict) -> str:
    # Runs without a tau (an engine that reports no acceptance data) have nothing to plot.
    plotted = {**report, "runs": [r for r in report.get("runs", []) if r.get("tau") is not None]}
    return render_html_template(
        "report.html.j2",
        **_view(report),
        plots=[{"title": t, "caption": c, "data": d} for t, c, d in plots(plotted)],
        first_round=Markup(trees_html(report.get("results") or [])),
    )
