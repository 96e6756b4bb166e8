"""Run reports: every ``bench`` and ``check`` run writes three files next to each other.

* ``<stem>.json``: the versioned run report (schema below); the input to ``gate`` and ``baseline``;
* ``<stem>.md``: the summary table a PR comment would show;
* ``<stem>.html``: one self-contained page (CSS inline, plots as base64 PNGs, no external URLs).

What the Markdown and the HTML show is built in :mod:`ddtree_conformance.report_view` (typed views
the templates read); this module loads, writes and renders reports.

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
from .files import atomic_write, read_json_object
from .rendering import render_html_template, render_markdown_template
from .report_view import build_html_view, build_view, report_verdict

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


def render_markdown(report: dict) -> str:
    return render_markdown_template("report.md.j2", view=build_view(report))


def render_html(report: dict) -> str:
    return render_html_template("report.html.j2", view=build_html_view(report))
