"""Coverage: which check families ran, on what evidence, and why anything did not. A verdict of its own.

A run's verdict (:func:`verdict`) is one of

* ``fail``: a check failed, or the engine could not start or died;
* ``incomplete``: nothing failed, but a requested mode or check family did not run *because of the
  engine* (a skip with cause ``engine``: mode not offered, no acceptance data, no traces, too few
  prompts for an aggregate band), and the caller did not opt out of that family or mode with
  ``--allow-skip``; exit status 7 in the CLI and the pytest route;
* ``pass``: everything planned ran and passed, or skipped for a reason that is not the engine's
  (no golden file for a custom prompt set, too few sampled transitions for a verdict), or cannot apply
  on this run (*not applicable*: CUDA graphs on a CPU run, tensor parallelism on one device; counted
  apart), or was allowed.

:func:`coverage` builds the table the reports show: one row per family with its checks' counts,
the evidence they judged (requests, prompts, output tokens, speculative rounds, tree nodes, summed
from each check's ``details["evidence"]``) and why anything did not run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from .checks import FAMILIES, SPECULATIVE_MODES, plan
from .checks.families import Scope
from .checks.families import family as declared
from .checks.result import CheckResult
from .option_names import option
from .settings import SettingsError, SuiteSettings

__all__ = [
    "Entry",
    "FamilyRow",
    "Gap",
    "Coverage",
    "coverage",
    "verdict",
    "check_allow_skip",
    "MODE_NAMES",
    "EVIDENCE_KEYS",
]

MODE_NAMES = {"plain": "plain decoding", "dflash": "DFlash", "ddtree": "DDTree"}
EVIDENCE_KEYS = ("requests", "prompts", "tokens", "rounds", "nodes")


@dataclass(frozen=True)
class Entry:
    """One planned check's result, with the family and mode it belongs to."""

    family: str
    mode: str | None
    result: CheckResult


@dataclass(frozen=True)
class Gap:
    """A check that did not run because of the engine."""

    check: str
    family: str
    mode: str | None
    reason: str


@dataclass
class FamilyRow:
    family: str
    planned: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_applicable: int = 0  # skips that cannot apply on this run's device or settings (never incomplete)
    not_run: int = 0
    evidence: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EVIDENCE_KEYS, 0))
    gaps: list[str] = field(default_factory=list)  # distinct reasons the engine gave no chance to run
    notes: list[str] = field(default_factory=list)  # distinct other skip reasons (not applicable, environment, input)
    allowed: bool = False  # the caller opted out of this family's engine gaps

    @property
    def status(self) -> str:
        ran, applicable = self.passed + self.failed, self.planned - self.not_applicable
        if applicable == 0:
            return "not applicable"
        return "ran" if ran == applicable else "did not run" if ran == 0 else "partly ran"


@dataclass
class Coverage:
    rows: list[FamilyRow]
    gaps: list[Gap]  # engine gaps the caller did not allow: these make the run incomplete
    allowed: list[Gap]  # engine gaps the caller allowed (the allow_skip setting)
    allow_skip: list[str]
    missing_modes: dict[str, str]  # requested modes no check of which ran because of the engine -> reason

    @property
    def complete(self) -> bool:
        return not self.gaps

    def reason(self) -> str:
        """One line: why the run is incomplete (empty when it is not)."""
        if not self.gaps:
            return ""
        parts = []
        for mode, why in self.missing_modes.items():
            parts.append(f"{MODE_NAMES.get(mode, mode)} not available in this engine: no {mode} check ran ({why})")
        in_modes = [g for g in self.gaps if g.mode not in self.missing_modes]
        families: dict[str, list[Gap]] = {}
        for gap in in_modes:
            families.setdefault(gap.family, []).append(gap)
        for family, gaps in families.items():
            parts.append(f"{family} did not run on {len(gaps)} check(s) ({gaps[0].reason})")
        names = list(self.missing_modes) + list(families)
        opt_out = " ".join(f"{option('allow_skip')} {name}" for name in names)
        return "; ".join(parts) + f"; opt out with {opt_out}"

    def as_dict(self) -> dict:
        return {
            "complete": self.complete,
            "reason": self.reason(),
            "allow_skip": list(self.allow_skip),
            "missing_modes": dict(self.missing_modes),
            "families": [{**asdict(row), "status": row.status} for row in self.rows],
            "gaps": [asdict(g) for g in self.gaps],
            "allowed": [asdict(g) for g in self.allowed],
        }


def coverage(entries: Iterable[Entry], allow_skip: Sequence[str] = ()) -> Coverage:
    """The coverage table of these results; ``allow_skip`` names families or modes whose engine gaps
    the caller accepts."""
    allowed_names = set(allow_skip)
    rows: dict[str, FamilyRow] = {}
    gaps, allowed = [], []
    by_mode: dict[str, list[Entry]] = {}
    for entry in entries:
        r = entry.result
        row = rows.setdefault(entry.family, FamilyRow(entry.family))
        row.planned += 1
        if entry.mode is not None:
            by_mode.setdefault(entry.mode, []).append(entry)
        evidence = (r.details or {}).get("evidence") or {}
        for key in EVIDENCE_KEYS:
            row.evidence[key] += int(evidence.get(key) or 0)
        if r.details.get("not_run"):
            row.not_run += 1
            continue
        if r.status == "pass":
            row.passed += 1
        elif r.status == "fail":
            row.failed += 1
        elif not r.applicable:
            row.not_applicable += 1
            if r.message not in row.notes:
                row.notes.append(r.message)
        else:
            row.skipped += 1
            if r.cause == "engine" or r.cause is None:
                gap = Gap(r.check, entry.family, entry.mode, r.message)
                if entry.family in allowed_names or (entry.mode is not None and entry.mode in allowed_names):
                    allowed.append(gap)
                    row.allowed = True
                else:
                    gaps.append(gap)
                if r.message not in row.gaps:
                    row.gaps.append(r.message)
            elif r.message not in row.notes:
                row.notes.append(r.message)
    missing_modes = {}
    gap_checks = {g.check for g in gaps}
    for mode, mode_entries in by_mode.items():
        mode_entries = [e for e in mode_entries if e.result.applicable]
        if mode_entries and all(e.result.check in gap_checks for e in mode_entries):
            missing_modes[mode] = mode_entries[0].result.message
    return Coverage(list(rows.values()), gaps, allowed, list(allow_skip), missing_modes)


def verdict(results: Sequence[CheckResult], cover: Coverage, engine_failure: str | None = None) -> dict:
    """``{"status": "pass" | "fail" | "incomplete", "reason": one line}`` (module doc)."""
    failed = [r for r in results if r.status == "fail"]
    if engine_failure:
        return {"status": "fail", "reason": f"the engine failed: {engine_failure}"}
    if failed:
        return {
            "status": "fail",
            "reason": f"{len(failed)} of {len(results)} checks failed; first: "
            f"{failed[0].check}: {' '.join(failed[0].message.split())[:300]}",
        }
    if not cover.complete:
        return {"status": "incomplete", "reason": cover.reason()}
    allowed = f"; allowed to skip: {', '.join(cover.allow_skip)}" if cover.allowed else ""
    skipped = sum(r.status == "skip" for r in results)
    inapplicable = [r for r in results if r.status == "skip" and not r.applicable]
    others = skipped - len(inapplicable) - len(cover.allowed)
    na = ""
    if inapplicable:
        families = sorted({r.check.split("/", 1)[0] for r in inapplicable})
        na = f", {len(inapplicable)} not applicable on this run ({', '.join(families)})"
    note = f", {others} skipped for reasons that are not the engine's" if others > 0 else ""
    return {"status": "pass", "reason": f"{len(results) - skipped} of {len(results)} checks passed{na}{note}{allowed}"}


def check_allow_skip(settings: SuiteSettings) -> list[str]:
    """Refuse an ``--allow-skip`` name the suite has never heard of (a usage error listing every known
    name: each check family it can plan, and each mode); return one note per known name that this run
    does not plan (``branch-vs-chain is not planned for --modes dflash``), so one CI configuration serves
    every set of modes, dtypes and ``--check`` filters."""
    names = list(dict.fromkeys(settings.allow_skip or []))
    known = set(FAMILIES) | set(SPECULATIVE_MODES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SettingsError(
            f"{option('allow_skip')} {','.join(unknown)}: not a check family or mode; known: {', '.join(sorted(known))}"
        )
    unfiltered = {c.family for c in plan(settings.model_copy(update={"checks": None}))}
    planned = {c.family for c in plan(settings)}
    modes = ",".join(settings.modes)
    notes = []
    for name in names:
        if name in SPECULATIVE_MODES:
            if name not in settings.modes:
                notes.append(f"{name} is not planned for {option('modes')} {modes}")
        elif name not in unfiltered:
            if declared(name).scope is Scope.POOLED_LOW_PRECISION:
                notes.append(f"{name} is not planned for {option('dtype')} {settings.dtype} (bfloat16, float16)")
            else:
                notes.append(f"{name} is not planned for {option('modes')} {modes}")
        elif name not in planned:
            kept = ",".join(settings.checks or [])
            notes.append(f"{name} is not planned: {option('checks')} {kept} keeps none of its checks")
    return notes
