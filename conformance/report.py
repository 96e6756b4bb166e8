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
``edge``, ``stop``; see :mod:`ddtree_conformance.bench`);
bench reports also carry ``bench`` (procedure), check reports ``counts`` and ``results``.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
import platform
from pathlib import Path
from typing import Any

from .files import atomic_write, read_json_object
from .report_plots import plots
from .report_tables import detail_tables_html
from .report_trees import trees_html
from .run import Run

__all__ = ["RUN_SCHEMA", "RUN_SCHEMA_VERSION", "ReportError", "new_report", "environment", "write_partial_report",
           "write_report", "load_report", "render_markdown", "render_html"]

RUN_SCHEMA = "ddtree-conformance/run-report"
RUN_SCHEMA_VERSION = 1
CHECK_SCHEMA = "ddtree-conformance/check-report"
KNOWN_SCHEMAS = {RUN_SCHEMA: RUN_SCHEMA_VERSION, CHECK_SCHEMA: 1}


class ReportError(ValueError):
    """A report file cannot be read as a run report; the message names the file and field."""


def environment() -> dict[str, Any]:
    import numpy
    import torch
    import transformers

    from . import __version__

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
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
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
        raise ReportError(f"{path}: field 'schema_version' is {report.get('schema_version')!r}; "
                          f"this suite reads version {KNOWN_SCHEMAS[schema]} of {schema}")
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
    pending = [{"check": c.id, "status": "skip", "message": "not run: the run stopped before this check",
                "details": {"not_run": True}} for c in planned if c.id not in done]
    results = [r.model_dump() for r in finished] + pending
    counts = {s: sum(r.status == s and not r.details.get("not_run") for r in finished)
              for s in ("pass", "fail", "skip")}
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


# -------------------------------------------------------------------------- rendering helpers


def _title(report: dict) -> str:
    s = report.get("settings", {})
    kind = report.get("kind", "run")
    return (f"ddtree-conformance {kind}: {s.get('engine', '?')} on {s.get('pair_name', '?')} "
            f"({s.get('dtype', '?')}, {s.get('device', '?')}, {report.get('hardware_class', '?')})")


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


def _summary_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    bench = report.get("kind") == "bench"
    head = ["run", "tau", "tau (mean of responses)", "accept d=1/2/3/4"]
    if bench:
        head += ["tokens/s (median)", "speedup [CI]", "tau x step/round (step / round)", "CV", "stopped"]
    rows = []
    for run in report.get("runs", []):
        row = [run.get("label") or run["mode"], _fmt(run.get("tau")), _fmt(run.get("tau_per_response_mean")),
               _positions_cell(run)]
        if bench:
            tps = run.get("tokens_per_s") or []
            med = sorted(tps)[len(tps) // 2] if tps else None
            sp = run.get("speedup") or {}
            stop = sp.get("stop") or {}
            row += [_fmt(med, 1), _speedup_cell(run), _cost_cell(run), _fmt(sp.get("cv"), 3) if sp else "-",
                    f"{stop['decision']} after {stop['repeats']}" if stop else "-"]
        rows.append(row)
    return head, rows


def _context_lines(report: dict) -> list[str]:
    s = report.get("settings", {})
    lines = [f"prompts: {s.get('prompt_set')} (limit {s.get('limit') or 'none'}), "
             f"max new tokens {s.get('max_new_tokens')}"]
    b = report.get("bench")
    if b:
        lines.append(f"{b['repeats']} interleaved repeats ({b['interleaving']}); timing basis: {b['timing_basis']}; "
                     f"CI: {b['ci']}")
        if b.get("speedup_definition"):
            lines.append(f"speedup: {b['speedup_definition']}" + (f"; sequential plan {b['plan']}"
                                                                   if b.get("sequential") else ""))
        lines.append(f"tau: {b['tau_definition']}")
    counts = report.get("counts")
    if counts:
        lines.append(f"checks: {counts.get('pass', 0)} passed, {counts.get('fail', 0)} failed, "
                     f"{counts.get('skip', 0)} skipped")
    lines.append(f"created {report.get('created')}; suite {report.get('environment', {}).get('ddtree_conformance')}, "
                 f"torch {report.get('environment', {}).get('torch')}")
    return lines


def render_markdown(report: dict) -> str:
    out = [f"### {_title(report)}", ""]
    if report.get("partial"):
        not_run = report.get("counts", {}).get("not_run", "?")
        out += [f"**Partial report: the run stopped before it finished ({not_run} checks not run).**", ""]
    out += [f"- {line}" for line in _context_lines(report)]
    out.append("")
    head, rows = _summary_rows(report)
    if rows:
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out.append("")
    failed = [r for r in report.get("results", []) if r.get("status") == "fail"]
    if failed:
        out += ["**Failed checks**", "", "| check | message |", "|---|---|"]
        out += [f"| {r['check']} | {' '.join(str(r.get('message', '')).split()).replace('|', '/')} |"
                for r in failed]
        out.append("")
    return "\n".join(out) + "\n"


_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1150px;color:#222;
line-height:1.4;padding:0 16px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
ul.meta{color:#555;font-size:13px;margin:6px 0 0;padding-left:18px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #d0d7de;padding:5px 9px;text-align:right;vertical-align:top}
th{background:#f3f5f7}td:first-child,th:first-child{text-align:left}
td.msg{text-align:left;max-width:640px;font-size:12px;color:#444}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:18px}
figure{margin:0;border:1px solid #e1e4e8;border-radius:6px;padding:10px;background:#fff}
figure img{width:100%;height:auto}figcaption{font-size:12px;color:#555;margin-top:4px}
figure h3{font-size:14px;margin:0 0 6px}
.pass{color:#1a7f37;font-weight:600}.fail{color:#cf222e;font-weight:600}.skip{color:#9a6700}
"""


def render_html(report: dict) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(_title(report))}</title><style>{_CSS}</style></head><body>",
             f"<h1>{esc(_title(report))}</h1>", '<ul class="meta">']
    parts += [f"<li>{esc(line)}</li>" for line in _context_lines(report)]
    parts.append("</ul>")
    head, rows = _summary_rows(report)
    if rows:
        parts.append("<h2>Summary</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    parts.append('<h2>Plots</h2><div class="grid">')
    # Runs without a tau (an engine that reports no acceptance data) have nothing to plot: left out,
    # the plots show their "no data" placeholders instead of failing on the missing number.
    plotted = {**report, "runs": [r for r in report.get("runs", []) if r.get("tau") is not None]}
    for title, caption, data in plots(plotted):
        parts.append(f'<figure><h3>{esc(title)}</h3><img alt="{esc(title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{esc(caption)}</figcaption></figure>")
    parts.append("</div>")
    results = report.get("results") or []
    parts.append(trees_html(results))
    parts.append(detail_tables_html(results))
    if results:
        order = {"fail": 0, "skip": 1, "pass": 2}
        parts.append("<h2>Checks</h2><table><tr><th>check</th><th>status</th><th>message</th></tr>")
        for r in sorted(results, key=lambda r: order.get(r.get("status"), 3)):
            status = r.get("status", "?")
            parts.append(f"<tr><td>{esc(r.get('check', '?'))}</td><td class=\"{esc(status)}\">{esc(status)}</td>"
                         f"<td class=\"msg\">{esc(str(r.get('message', '')))}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def runs_from_session(session) -> list[dict[str, Any]]:
    """Acceptance metrics of the speculative runs a ``check`` session already made on its default
    prompt set (no new engine work); one entry per (mode, budget), no throughput."""
    from .bench import acceptance_summary

    engine = session.engines.started()
    if engine is None:
        return []
    default = tuple(r.model_dump_json() for r in session.requests())
    tp = session.settings.tensor_parallel_size
    found: dict[tuple, list] = {}
    for stored in session.runs():
        run = stored.run
        if (stored.engine_id == id(engine) and run.speculative and stored.requests == default and run.tensor_parallel_size == tp
                and (run.mode, run.budget) not in found):
            found[(run.mode, run.budget)] = stored.results
    runs = []
    for (mode, budget), results in sorted(found.items(), key=lambda kv: (kv[0][0] != "dflash", kv[0][1] or 0)):
        if any(r.finish_reason == "error" for r in results):
            continue
        runs.append({"mode": mode, "budget": budget, "label": Run(mode, budget).label,
                     **acceptance_summary(results)})
    return runs
