"""Running planned checks: one :class:`PlannedCheck` per check id, :func:`run_plan` for a list.

Rules that hold for every check, whatever it does:

* A check never crashes the run: an exception becomes a failed check ("check crashed: ...").
* A check that used a run holding a failed result (the engine's own error, or one the integrity
  rules made, :mod:`ddtree_conformance.integrity`) fails, with the first such message (which names
  the request and the field). A broken run never looks like a pass, and never hides behind a skip.
  The check's own verdict is kept in the details (``check_status``, ``check_message``).
* An engine that cannot start or dies (:class:`~ddtree_conformance.adapters.interface.EngineDied`)
  stops the run: the check it happened in fails with the cause, and :func:`run_plan` marks every
  remaining check "not run" (a skip with ``details["not_run"]``) without asking the engine again.
  :meth:`PlannedCheck.run` raises it (the pytest plugin turns it into one failing item per check).
* The oracle's files (golden records, the pair manifest and its calibration) are held in memory
  before the first check (:mod:`ddtree_conformance.oracle`); a check after which one of them has
  changed on disk fails, naming the file, whatever its own verdict (kept in the details).
* Each result carries its wall time in ``details["elapsed_s"]``, the evidence it judged in
  ``details["evidence"]`` (:func:`evidence`: the engine's requests, prompts, tokens, rounds and tree
  nodes in the runs it used), which the report's coverage table sums per family, and what that evidence
  could have seen in ``details["detectable"]`` (:mod:`ddtree_conformance.evidence`).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..adapters.interface import EngineDied
from ..evidence import Evidence, detectable
from ..golden_files import GoldenError
from ..integrity import is_integrity_error
from ..oracle import changed_on_disk, hold
from ..prompts import PromptError
from ..run import Run
from ..session import SuiteSession, UsedRun
from .result import CheckResult

__all__ = ["PlannedCheck", "run_plan", "not_run", "consumed_error", "one_line", "evidence"]


def one_line(text: object) -> str:
    return " ".join(str(text).split("\n", 1)[0].split())


def consumed_error(used: Sequence[UsedRun]) -> str | None:
    """The message of the first failed result in the runs a check used, naming run and request."""
    for run in used:
        for index, result in enumerate(run.results):
            if result.finish_reason != "error":
                continue
            text = one_line(result.error or "no message")
            if is_integrity_error(result):  # it names the request and field already
                return text
            who = run.engine.role.value
            prompt = run.prompts[index] if index < len(run.prompts) else f"request {index}"
            return f"{who} error in the {run.label} run on request {index} ({prompt}): {text}"
    return None


def evidence(used: Sequence[UsedRun]) -> dict[str, int]:
    """What the engine under test gave the check: requests and distinct prompts, output tokens,
    speculative rounds and traced tree nodes (root excluded), each run counted once."""
    seen: set[tuple] = set()
    prompts: set[str] = set()
    total = {"requests": 0, "tokens": 0, "rounds": 0, "nodes": 0}
    for run in used:
        key = (run.run, id(run.results))
        if run.engine.oracle or key in seen:
            continue
        seen.add(key)
        prompts.update(run.prompts)
        for result in run.results:
            total["requests"] += 1
            total["tokens"] += len(result.output_ids or [])
            if run.run.speculative:
                total["rounds"] += result.rounds or len(result.acceptance_lengths or [])
                total["nodes"] += sum(max(0, len(t.tree_tokens) - 1) for t in result.traces or [])
    return {"prompts": len(prompts), **total}


@dataclass(frozen=True)
class PlannedCheck:
    """One check of a plan: its id (``family/run label[/variant]``), the function and its arguments,
    the check family and the run it judges (None for checks that are not about one run)."""

    id: str
    function: Callable[..., CheckResult]
    params: dict = field(default_factory=dict)
    family: str = ""
    judged_run: Run | None = None
    evidence: Evidence = Evidence.OUTPUTS  # what the family counts (its declaration: .families)

    def run(self, session: SuiteSession) -> CheckResult:
        """The check's result (see module doc); raises :class:`EngineDied` when the engine is gone."""
        if session.failure is not None:
            raise session.dead_again()
        started = time.perf_counter()
        hold(session)  # the oracle's files, read before this check can start the engine
        with session.watch() as used:
            try:
                result = self.function(session, **self.params)
            except EngineDied:
                raise
            except (GoldenError, PromptError) as exc:  # an input file the check needs: one line naming it
                result = CheckResult.failed(self.id, one_line(exc))
            except Exception as exc:  # a check crash is a failed check, not a dead run
                if session.failure is not None:
                    raise session.failure from exc
                result = CheckResult.failed(
                    self.id,
                    f"check crashed: {type(exc).__name__}: {one_line(exc)}",
                    traceback=traceback.format_exc(limit=-8),
                )
        if session.failure is not None:  # the engine died inside, whatever the check made of it
            raise session.failure
        error = consumed_error(used) or changed_on_disk(session)
        if error is not None:
            result = CheckResult.failed(
                self.id,
                error,
                check_status=result.status,
                check_message=result.message,
                **{k: v for k, v in result.details.items() if k not in ("check_status", "check_message")},
            )
        details = {**result.details, "elapsed_s": round(time.perf_counter() - started, 2), "evidence": evidence(used)}
        if result.status != "skip" and (line := detectable(self.evidence, result.details)):
            details["detectable"] = line
        return result.model_copy(update={"check": self.id, "details": details})


def not_run(checks: Sequence[PlannedCheck], reason: str) -> list[CheckResult]:
    """``checks`` marked not run (skips with ``details["not_run"]``), each saying why."""
    return [
        CheckResult(check=c.id, status="skip", message=f"not run: {reason}", details={"not_run": True}, cause="engine")
        for c in checks
    ]


def run_plan(
    session: SuiteSession, checks: list[PlannedCheck], on_result: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Run ``checks`` in order; stops at an engine failure (module doc). ``session.failure`` then
    says what happened."""
    results: list[CheckResult] = []
    for index, check in enumerate(checks):
        started = time.perf_counter()
        try:
            result = check.run(session)
        except EngineDied as exc:
            result = CheckResult(
                check=check.id,
                status="fail",
                message=one_line(exc),
                details={"engine_failed": True, "elapsed_s": round(time.perf_counter() - started, 2)},
            )
            results.append(result)
            if on_result:
                on_result(result)
            results += not_run(checks[index + 1 :], f"the engine failed during {check.id}")
            break
        results.append(result)
        if on_result:
            on_result(result)
    return results
