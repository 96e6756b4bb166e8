"""The pytest route's results: the same check report and verdict as ``ddtree-conformance check``.

Each conformance item leaves its :class:`~ddtree_conformance.checks.result.CheckResult` on the
item (:data:`RESULT_KEY`); :meth:`Recorder.pytest_runtest_makereport` puts it, with the check's family
and mode, on the item's report as JSON, so it reaches the controller with pytest-xdist too. An item
that failed before it had a result (the engine died, an option it cannot run) counts as a failed
check with pytest's message; an item skipped before it ran (the pair is not on this machine) as an
``environment`` skip. The session fixture leaves the run metrics and the engine's identity
(:data:`SESSION_KEY`); an xdist worker sends them to the controller in ``workeroutput``.

At the session's end the controller writes the JSON/Markdown/HTML check report (``--ddtree-report``,
default ``reports/check-<engine>.json``) and, when nothing failed but the coverage is incomplete
(:mod:`ddtree_conformance.coverage`), makes the run exit with status 7, naming why in the summary;
the items keep their own skip reasons.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from .baselines import hardware_class
from .check_report import finish_check_report
from .checks.result import CheckResult
from .coverage import Entry
from .option_names import option
from .report import CHECK_SCHEMA, new_report, write_report

__all__ = ["Recorder", "RESULT_KEY", "SESSION_KEY", "EXIT_INCOMPLETE"]

EXIT_INCOMPLETE = 7  # the CLI's EXIT_INCOMPLETE (cli.base), free among pytest's own exit codes (0-5)
RESULT_KEY = pytest.StashKey[CheckResult]()
SESSION_KEY = pytest.StashKey[dict]()
_WORKER_KEY = "ddtree_session"


def _first_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr) if report.longrepr is not None else ""
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # a skip: (path, line, reason)
        text = str(report.longrepr[2]).removeprefix("Skipped: ")
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[0].split()) if lines else report.outcome


class Recorder:
    """Registered by the plugin when ``--ddtree-engine`` is given (module doc)."""

    def __init__(
        self, config: pytest.Config, settings, out: Path, allow_skip_notes: list[str] | tuple[str, ...] = ()
    ) -> None:
        self.config, self.settings, self.out = config, settings, out
        self.allow_skip_notes = list(allow_skip_notes)  # --ddtree-allow-skip names this run does not plan
        self.entries: dict[str, Entry] = {}
        self.session_info: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.verdict: dict | None = None
        self.written: tuple[Path, ...] = ()

    # -- every process: results onto the reports ---------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        report = yield
        callspec = getattr(item, "callspec", None)
        planned = callspec.params.get("planned_check") if callspec is not None else None
        if planned is None or not (report.when == "call" or report.outcome != "passed"):
            return report
        result = item.stash.get(RESULT_KEY, None)
        if result is None or report.outcome == "failed" and result.status != "fail":
            if report.outcome == "skipped":
                result = CheckResult.skipped(planned.id, _first_line(report), cause="environment")
            else:
                result = CheckResult.failed(planned.id, _first_line(report))
        mode = planned.judged_run.mode if planned.judged_run else None
        report.ddtree_entry = json.dumps({"family": planned.family, "mode": mode, "result": result.model_dump()})
        return report

    # -- the controller (or the only process): gather --------------------------------------
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        raw = getattr(report, "ddtree_entry", None)
        if raw:
            data = json.loads(raw)
            self.entries[report.nodeid] = Entry(data["family"], data["mode"], CheckResult(**data["result"]))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        raw = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
        if raw:
            info = json.loads(raw)
            self.session_info.setdefault("runs", []).extend(info.get("runs", []))
            self.session_info.setdefault("held_out_prompts", []).extend(info.get("held_out_prompts", []))
            if info.get("engine", {}).get("name"):
                self.session_info["engine"] = info["engine"]

    # mutates: session (pytest's hook API: a plugin changes the run's exit status by setting
    # session.exitstatus in pytest_sessionfinish, and an xdist worker hands its data over in the
    # session's config.workeroutput)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        info = session.config.stash.get(SESSION_KEY, None)
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller writes the report
            if info:
                workeroutput[_WORKER_KEY] = json.dumps(info)
            return
        if info:
            self.session_info.setdefault("runs", []).extend(info.get("runs", []))
            self.session_info.setdefault("held_out_prompts", []).extend(info.get("held_out_prompts", []))
            self.session_info["engine"] = info.get("engine") or self.session_info.get("engine")
        if not self.entries:
            return
        self.write_report()
        if self.verdict["status"] == "incomplete" and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = EXIT_INCOMPLETE

    def write_report(self) -> None:
        """The check report of the gathered results, written to ``out``; its verdict kept in ``verdict``."""
        s = self.settings
        partial = new_report("check", s.model_dump(), hardware_class(s.device, None), schema=CHECK_SCHEMA)
        partial["route"] = "pytest"
        report, _, self.verdict = finish_check_report(
            partial,
            list(self.entries.values()),
            allow_skip=s.allow_skip or (),
            runs=self.session_info.get("runs", []),
            engine=self.session_info.get("engine") or {"spec": s.engine, "name": "", "version": ""},
            elapsed_s=time.perf_counter() - self.started,
            allow_skip_notes=self.allow_skip_notes,
        )
        report["held_out_prompts"] = self.session_info.get("held_out_prompts", [])
        self.written = write_report(report, self.out)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.verdict is None:
            return
        status = self.verdict["status"].upper()
        terminalreporter.section("ddtree-conformance")
        code = f" (exit {EXIT_INCOMPLETE})" if status == "INCOMPLETE" else ""
        terminalreporter.line(f"{status}{code}: {self.verdict['reason']}", red=status != "PASS", green=status == "PASS")
        for note in self.allow_skip_notes:
            terminalreporter.line(f"note: {option('allow_skip')} {note}")
        if self.written:
            terminalreporter.line(f"report {self.written[0]} (+ {self.written[1].name}, {self.written[2].name})")
