"""What ``ddtree-conformance ci`` leaves behind: the JUnit file of a check report, the gate step's line, the job
summary, and where each CI system shows it (GitHub's step summary, ``::error::`` lines and step outputs;
Buildkite's annotation)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .base import (
    EXIT_ENGINE,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_INCONCLUSIVE,
    EXIT_MISSING_BASELINE,
    EXIT_OK,
    EXIT_USAGE,
)

__all__ = [
    "Step",
    "combine",
    "gate_summary",
    "junit_from_report",
    "summary_markdown",
    "publish",
    "outputs",
    "slug",
    "read_json",
]

# most severe first; a status not named here (a gate refusal of a later suite) ranks right after EXIT_FAILED
SEVERITY = [EXIT_USAGE, EXIT_ENGINE, EXIT_FAILED, EXIT_INCOMPLETE, EXIT_INCONCLUSIVE, EXIT_MISSING_BASELINE]


@dataclass
class Step:
    """One step of the job: its name, exit status, one line saying what came of it, and its files."""

    name: str
    code: int = EXIT_OK
    summary: str = ""
    files: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    skipped: bool = False


def _rank(code: int) -> float:
    return SEVERITY.index(code) if code in SEVERITY else SEVERITY.index(EXIT_FAILED) + 0.5


def combine(steps: list[Step]) -> Step:
    """The job's verdict: the most severe step (:data:`SEVERITY`), or a pass."""
    failed = [s for s in steps if s.code != EXIT_OK and not s.skipped]
    return min(failed, key=lambda s: _rank(s.code)) if failed else Step("job", EXIT_OK, "every step passed")


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def junit_from_report(report: dict) -> str:
    """A JUnit file of a check report: one test case per check (failure and skipped elements with the
    message), class name ``ddtree.<engine>-<dtype>-<pair>`` as the pytest route names it."""
    s = report.get("settings", {})
    names = (s.get("engine"), s.get("dtype"), s.get("pair_name"))
    group = "ddtree." + "-".join(str(x).replace(":", "_") for x in names)
    results = report.get("results", [])
    counts = report.get("counts", {})
    suite = ET.Element(
        "testsuite",
        name="ddtree-conformance",
        tests=str(len(results)),
        failures=str(counts.get("fail", 0)),
        errors="0",
        skipped=str(counts.get("skip", 0) + counts.get("not_run", 0)),
        time=str(report.get("elapsed_s", 0)),
    )
    for r in results:
        case = ET.SubElement(
            suite, "testcase", classname=group, name=r["check"], time=str((r.get("details") or {}).get("elapsed_s", 0))
        )
        if r["status"] == "fail":
            ET.SubElement(case, "failure", message=" ".join(str(r.get("message", "")).split())[:2000])
        elif r["status"] == "skip":
            ET.SubElement(case, "skipped", message=" ".join(str(r.get("message", "")).split())[:2000])
    verdict = report.get("verdict") or {}
    if verdict.get("status") == "incomplete":  # a JUnit reader sees the job's verdict, not only the skips
        case = ET.SubElement(suite, "testcase", classname=group, name="coverage")
        ET.SubElement(case, "failure", message=f"incomplete: {verdict.get('reason', '')}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.tostring(root, encoding="unicode") + "\n"


def job_record(title: str, steps: list[Step], job: Step) -> dict:
    """``ci.json``: the job as data (what ``summary.md`` renders): its title, exit status, the step that
    decided it, and every step's name, exit status (None: skipped), one-line result, seconds and files."""
    return {
        "title": title,
        "code": job.code,
        "decided_by": job.name if job.code else None,
        "summary": job.summary,
        "steps": [
            {
                "name": s.name,
                "code": None if s.skipped else s.code,
                "summary": " ".join(s.summary.split()),
                "seconds": round(s.seconds, 3),
                "files": [str(f) for f in s.files],
            }
            for s in steps
        ],
    }


def summary_markdown(title: str, steps: list[Step], job: Step, reports: Path) -> str:
    word = {
        EXIT_OK: "PASS",
        EXIT_INCOMPLETE: "INCOMPLETE",
        EXIT_INCONCLUSIVE: "INCONCLUSIVE",
        EXIT_MISSING_BASELINE: "MISSING BASELINE",
        EXIT_USAGE: "USAGE ERROR",
    }.get(job.code, "FAIL")
    lines = [
        f"## DDTree conformance: {word}: {title}",
        "",
        f"**{job.name}**: {job.summary}" if job.code else "Every step passed.",
        "",
        "| step | exit | result |",
        "|---|---:|---|",
    ]
    for step in steps:
        code = "-" if step.skipped else str(step.code)
        lines.append(f"| {step.name} | {code} | {' '.join(step.summary.split()).replace('|', '/')} |")
    lines.append("")
    for name in ("check.md", "ab.md", "bench.md"):
        part = reports / name
        if part.is_file():
            lines += [part.read_text().rstrip(), ""]
    gate = read_json(reports / "gate.json")
    if gate and gate.get("rows"):
        lines += ["**Gate**", "", "| run | metric | status | measured | band | note |", "|---|---|---|---:|---:|---|"]
        for r in gate["rows"]:
            note = " ".join(str(r.get("message", "")).split()).replace("|", "/")
            lines.append(f"| {r['run']} | {r['metric']} | {r['status']} | {r['measured']} | {r['band']} | {note} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def gate_summary(code: int, rows: list[dict], bench_report: Path) -> str:
    """The gate step's line: its verdict and first row that did not pass; then what was not gated and why
    (``--gate auto``), and how to record the baselines that would gate it."""
    from ..gate import NOT_GATED  # here: gate pulls scipy; `ci --help` stays fast

    words = {0: "PASS", 1: "REGRESSION", 3: "INCONCLUSIVE", 4: "MISSING BASELINE", 6: "REFUSED: SETTINGS CHANGED"}
    ungated = [r for r in rows if r.get("status") == NOT_GATED]
    gated = [r for r in rows if r.get("status") != NOT_GATED]
    bad = [r for r in gated if r.get("status") != "pass"]
    first = f": {bad[0]['run']} {bad[0]['metric']} {bad[0]['status']}: {bad[0]['message']}" if bad else ""
    word = words.get(code, f"exit {code}")
    if ungated and not gated:
        word = "NOTHING GATED (no stored baseline for any run of this engine here; --gate auto)"
    elif ungated:
        word += f" ({len(gated)} row{'' if len(gated) == 1 else 's'} gated)"
    if not ungated:
        return f"{word}{first}"
    runs = "; ".join(f"{r['run']}{'' if r['metric'] == 'all' else ' ' + r['metric']} ({r['message']})" for r in ungated)
    return (
        f"{word}{first}; not gated: {runs}; `ddtree-conformance baseline {bench_report} --baselines DIR` records "
        "them from this bench for `ci --baselines DIR` (or give --against for A/B; --gate required fails on a "
        "missing baseline)"
    )


def publish(markdown: str, job: Step, steps: list[Step], summary: Optional[Path]) -> None:
    """The summary where the CI system shows it: GitHub's step summary and ``::error::`` lines, Buildkite's
    annotation."""
    target = summary or (Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if target is not None:
        with open(target, "a", encoding="utf-8") as f:
            f.write(markdown)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for step in steps:
            if step.code and not step.skipped:
                print(f"::error title=ddtree-conformance {step.name}::{' '.join(step.summary.split())}", flush=True)
    agent = shutil.which("buildkite-agent") if os.environ.get("BUILDKITE") else None
    if agent:
        style = "success" if job.code == EXIT_OK else "error" if job.code in (EXIT_FAILED, EXIT_ENGINE) else "warning"
        subprocess.run(
            [agent, "annotate", "--style", style, "--context", "ddtree-conformance"],
            input=markdown,
            text=True,
            check=False,
        )


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in str(text))


def outputs(**values: str) -> None:
    """Step outputs on GitHub (``$GITHUB_OUTPUT``): the artifact name, the exit status."""
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.writelines(f"{key}={value}\n" for key, value in values.items())
