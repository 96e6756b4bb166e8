"""Stored performance baselines: what ``gate`` compares a run report against.

One JSON file per hardware class (``golden/baselines/<hardware-class>.json``), sorted and indented
so a change reads as a small diff. Each entry is keyed by (hardware class, engine, model pair,
mode, budget) and holds three metrics, each ``{"value": ..., "band": ...}`` with an *absolute*
band (same unit as the value); the lower edge of the acceptable range is ``value - band``:

* ``tau``: pooled mean acceptance length (bonus included);
* ``per_position``: per-depth acceptance rates (``values[d-1]`` for depth d) and one band; the
  floor at depth d is ``values[d-1] - band``;
* ``speedup``: throughput over plain decoding in the same process (the cost model's
  tau x plain step time / round time, geometric mean over repeats); the gate judges it by the
  run's confidence interval, not the point value;
* ``cost`` (optional): the measured plain step time / round time and both times, so the gate can
  say whether a slower run "accepts less" (tau) or "costs more" (round time in plain steps);
* ``settings`` (optional): the engine settings that change speed (``bench.engine_settings``): a
  report measured under other settings is not compared with it (the gate refuses).

**Version 2** keeps every bench run a speedup baseline was made from (``speedup.runs``: each run's
estimate, interval, repeats, per-repeat noise, when, on which machine - host, boot id, GPU - and the
machine's state: clocks, power, temperature, host load). Several runs, on different machines or days,
give the baseline's **between-run spread** (``speedup.spread_log_sd``, the standard deviation of the
runs' log estimates); the value is then the runs' geometric mean, and the gate widens its interval by
that spread (``docs/reference/bench-and-gates.md``). ``ddtree-conformance baseline --merge`` adds runs
to an entry. Version 1 files (one run, no spread) are still read, each speedup as one run.

Nothing here is ever judged against a baseline from another hardware class.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import platform
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .files import atomic_write, read_json_object
from .option_names import option
from .paths import BASELINES_DIR

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "BASELINES_DIR",
    "BaselineError",
    "BaselineExists",
    "Band",
    "SpeedupRun",
    "SpeedupBaseline",
    "CostBaseline",
    "PositionBand",
    "BaselineEntry",
    "BaselineFile",
    "hardware_class",
    "baseline_path",
    "load_baselines",
    "entries_from_report",
    "merge_entries",
    "merge_runs",
    "render_baselines",
    "write_baselines",
]

SCHEMA = "ddtree-conformance/baselines"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no runs kept (one run each, no spread)

# Default tolerance bands used when a baseline is made from a report.
DEFAULT_TAU_BAND = 0.05  # relative: a 5 % drop in tau is a regression
DEFAULT_POSITION_BAND = 0.05  # absolute, in acceptance-rate units
# relative: a speedup more than 2 % below the baseline is a regression. Widened to the baseline run's
# own lower CI half-width, so a noisy baseline cannot fail its own engine. 2 % sits half-way to the
# smallest slowdown the gate must catch (a verify 5 % slower costs ~4 % of the round on an 8B target).
DEFAULT_SPEEDUP_BAND = 0.02


class BaselineError(ValueError):
    """A baseline file is missing, unreadable or malformed; the message names the file and field."""


class BaselineExists(BaselineError):
    """Writing would replace existing baselines and ``--update`` was not given."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Band(_Model):
    value: float
    band: float = Field(ge=0)

    @property
    def lower(self) -> float:
        return self.value - self.band


class PositionBand(_Model):
    values: list[float] = Field(description="acceptance rate at depth d = 1..len(values)")
    band: float = Field(ge=0)

    @property
    def floors(self) -> list[float]:
        return [max(0.0, v - self.band) for v in self.values]


class SpeedupRun(_Model):
    """One bench run a speedup baseline was made from."""

    estimate: float = Field(gt=0, description="the run's speedup (geometric mean over its repeats)")
    ci_low: float | None = None
    ci_high: float | None = None
    repeats: int | None = None
    log_sd: float | None = Field(default=None, description="standard deviation of the log speedup per repeat")
    created: str | None = Field(default=None, description="when the report was made")
    machine: dict[str, Any] = Field(default_factory=dict, description="host, boot id, GPU name and UUID")
    state: dict[str, Any] | None = Field(default=None, description="clocks, power, temperature, host load (summary)")


class SpeedupBaseline(Band):
    """The speedup band, with the runs it was made from and their between-run spread."""

    band_fraction: float | None = Field(default=None, description="the band as a fraction of the value")
    runs: list[SpeedupRun] = Field(default_factory=list)
    spread_log_sd: float | None = Field(default=None, description="sd of the runs' log estimates (2+ runs)")

    def spread(self) -> tuple[float, int] | None:
        """(variance, degrees of freedom) by which a new run's log speedup may differ from the value:
        ``s^2 (1 + 1/m)`` over the m runs' log estimates (a prediction for one more run, and the value's
        own uncertainty), ``m - 1`` df; None below two runs (unknown)."""
        m = len(self.runs)
        if m < 2:
            return None
        logs = [math.log(r.estimate) for r in self.runs]
        mean = sum(logs) / m
        var = sum((x - mean) ** 2 for x in logs) / (m - 1)
        return var * (1 + 1 / m), m - 1


class CostBaseline(_Model):
    tau: float | None = Field(default=None, gt=0, description="decode tokens emitted per round (the cost model's tau)")
    step_over_round: float = Field(gt=0, description="plain decode step time / speculative round time")
    step_s: float | None = Field(default=None, description="plain decode step time, seconds")
    round_s: float | None = Field(default=None, description="speculative round time, seconds")
    clock: str | None = Field(default=None, description="device (CUDA events), engine or call")


class BaselineEntry(_Model):
    hardware_class: str
    engine: str
    pair: str
    mode: str
    budget: int | None = Field(default=None, description="DDTree budget; null for dflash")
    tau: Band
    per_position: PositionBand
    speedup: SpeedupBaseline | None = Field(default=None, description="null when the run measured no throughput")
    cost: CostBaseline | None = Field(default=None, description="the cost model's times; null without them")
    settings: dict[str, bool | int | float | str | None] | None = Field(
        default=None,
        description="the engine settings that change speed, as the bench recorded them (CUDA graphs, "
        "attention backend, overlap scheduling, dtype, ...); the gate refuses a report "
        "whose settings differ. null: recorded by a suite that kept none",
    )
    source: dict[str, Any] = Field(default_factory=dict, description="where the numbers came from")

    @property
    def key(self) -> tuple[str, str, str, str, int | None]:
        return (self.hardware_class, self.engine, self.pair, self.mode, self.budget)


class BaselineFile(_Model):
    schema_: str = Field(default=SCHEMA, alias="schema")
    schema_version: int = SCHEMA_VERSION
    entries: list[BaselineEntry] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def find(self, hardware_class: str, engine: str, pair: str, mode: str, budget: int | None) -> BaselineEntry | None:
        key = (hardware_class, engine, pair, mode, budget if mode == "ddtree" else None)
        return next((e for e in self.entries if e.key == key), None)


# -------------------------------------------------------------------------- hardware class


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip()).strip("-")


def hardware_class(device: str = "cpu", override: str | None = None) -> str:
    """A short name for the machine class, e.g. ``cpu-x86_64-2c`` or ``cuda-NVIDIA-H200``.

    ``override`` (the ``--hardware-class`` option) or ``$DDTREE_HARDWARE_CLASS`` wins.
    """
    chosen = override or os.environ.get("DDTREE_HARDWARE_CLASS")
    if chosen:
        return _slug(chosen)
    kind = device.split(":", 1)[0]
    if kind == "cuda":
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else 0
        name = torch.cuda.get_device_name(index) if torch.cuda.is_available() else "unknown"
        return _slug(f"cuda-{name}")
    if kind == "cpu":
        return _slug(f"cpu-{platform.machine() or 'unknown'}-{os.cpu_count() or 0}c")
    return _slug(f"{kind}-{platform.machine() or 'unknown'}")


def baseline_path(baselines: str | Path | None, hw_class: str) -> Path:
    """``baselines`` may be a file (used as is) or a folder (``<folder>/<hardware class>.json``)."""
    root = Path(baselines) if baselines is not None else BASELINES_DIR
    if root.suffix == ".json" or root.is_file():
        return root
    return root / f"{hw_class}.json"


# -------------------------------------------------------------------------- load / write


def load_baselines(path: str | Path) -> BaselineFile:
    """Read and validate one baseline file; every problem is one message naming file and field."""
    path = Path(path)
    raw = read_json_object(path, BaselineError, "baseline file")
    if raw.get("schema") != SCHEMA:
        raise BaselineError(f"{path}: field 'schema' is {raw.get('schema')!r}, expected {SCHEMA!r}")
    if raw.get("schema_version") not in READABLE_VERSIONS:
        raise BaselineError(
            f"{path}: field 'schema_version' is {raw.get('schema_version')!r}; "
            f"this suite reads versions {', '.join(map(str, READABLE_VERSIONS))} (and writes {SCHEMA_VERSION})"
        )
    try:
        parsed = BaselineFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise BaselineError(f"{path}: field '{loc}': {err['msg']}") from None
    seen: set = set()
    for i, entry in enumerate(parsed.entries):
        if entry.key in seen:
            raise BaselineError(f"{path}: field 'entries.{i}': duplicate key {entry.key}")
        seen.add(entry.key)
    return parsed


def _sort_key(entry: BaselineEntry):
    return (entry.hardware_class, entry.engine, entry.pair, entry.mode, entry.budget or 0)


def render_baselines(baselines: BaselineFile) -> str:
    data = baselines.model_dump(mode="json", by_alias=True)
    data["schema_version"] = SCHEMA_VERSION  # a version-1 file read here is written as version 2
    data["entries"] = [e.model_dump(mode="json") for e in sorted(baselines.entries, key=_sort_key)]
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _r(x: float, digits: int = 4) -> float:
    return round(float(x), digits)


def _up(x: float, digits: int = 4) -> float:
    """Round a band up, so rounding never narrows it."""
    return math.ceil(float(x) * 10**digits - 1e-9) / 10**digits


def entries_from_report(
    report: dict,
    *,
    hw_class: str | None = None,
    tau_band: float = DEFAULT_TAU_BAND,
    position_band: float = DEFAULT_POSITION_BAND,
    speedup_band: float = DEFAULT_SPEEDUP_BAND,
) -> list[BaselineEntry]:
    """Baseline entries from a run report (``report.py`` schema); bands as documented above."""
    hw = hw_class or report.get("hardware_class") or "unknown"
    settings = report.get("settings", {})
    entries = []
    for run in report.get("runs", []):
        if run.get("mode") == "plain" or run.get("tau") is None:
            continue
        speed = run.get("speedup")
        point = None if not speed else speed.get("estimate", speed.get("median"))
        low = None if not speed else speed.get("ci_low")
        cm = run.get("cost_model") or {}
        ratio = (cm.get("step_over_round") or {}).get("estimate")
        entries.append(
            BaselineEntry(
                hardware_class=hw,
                engine=settings.get("engine", "unknown"),
                pair=settings.get("pair_name", "unknown"),
                mode=run["mode"],
                budget=run.get("budget") if run["mode"] == "ddtree" else None,
                tau=Band(value=_r(run["tau"]), band=_up(run["tau"] * tau_band)),
                per_position=PositionBand(values=[_r(v) for v in run.get("per_position", [])], band=position_band),
                speedup=None
                if point is None
                else SpeedupBaseline(
                    value=_r(point),
                    # never narrower than the baseline run's own CI: a band tighter than the noise
                    # would make the baseline's own engine fail (with one run; runs merged later
                    # bring the spread instead: merge_runs)
                    band=_up(max(point * speedup_band, point - (low if low is not None else 0.0)) + 1e-4),
                    band_fraction=speedup_band,
                    runs=[_run_record(report, speed)],
                ),
                settings=report.get("bench", {}).get("engine_settings"),
                cost=None
                if not ratio or ratio <= 0
                else CostBaseline(
                    tau=_r(cm["tau"], 6) if cm.get("tau") else None,
                    step_over_round=_r(ratio, 6),
                    step_s=_r(cm["step_s"], 9) if cm.get("step_s") else None,
                    round_s=_r(cm["round_s"], 9) if cm.get("round_s") else None,
                    clock=report.get("bench", {}).get("clock"),
                ),
                source={
                    "report_created": report.get("created"),
                    "prompts": settings.get("prompt_set"),
                    "limit": settings.get("limit"),
                    "max_new_tokens": settings.get("max_new_tokens"),
                    "dtype": settings.get("dtype"),
                    "repeats": None
                    if not speed
                    else (speed.get("stop") or {}).get("repeats", report.get("bench", {}).get("repeats")),
                    "speedup_cv": None if not speed else speed.get("cv"),
                },
            )
        )
    return entries


def _run_record(report: dict, speed: dict) -> SpeedupRun:
    machine = (report.get("bench") or {}).get("machine") or {}
    samples = [x for x in speed.get("samples") or [] if isinstance(x, (int, float)) and x > 0]
    logs = [math.log(x) for x in samples]
    sd = None
    if len(logs) > 1:
        mean = sum(logs) / len(logs)
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return SpeedupRun(
        estimate=_r(speed.get("estimate", speed.get("median")), 6),
        ci_low=None if speed.get("ci_low") is None else _r(speed["ci_low"], 6),
        ci_high=None if speed.get("ci_high") is None else _r(speed["ci_high"], 6),
        repeats=len(samples) or None,
        log_sd=None if sd is None else _r(sd, 6),
        created=report.get("created"),
        machine=machine.get("identity") or {},
        state={k: v for k, v in machine.items() if k not in ("per_repeat", "identity")} or None,
    )


def _legacy_run(entry: BaselineEntry) -> SpeedupRun:
    """A version-1 entry's speedup as its one run (its value; its report's date)."""
    return SpeedupRun(estimate=entry.speedup.value, created=entry.source.get("report_created"))


def merge_runs(old: BaselineEntry, new: BaselineEntry) -> BaselineEntry:
    """``old`` with ``new``'s speedup runs added: the value becomes the geometric mean of all runs, the
    band ``band_fraction`` of it (the spread, not a widened band, now carries the noise), the spread the
    runs' sd of log estimates; tau, per-position rates, cost and settings are the newer entry's. Runs
    measured under other engine settings are refused."""
    if old.settings and new.settings and old.settings != new.settings:
        raise BaselineError(
            f"{new.key}: the new run's engine settings {new.settings} differ from the baseline's {old.settings}; "
            f"runs under other settings cannot make one baseline (record it apart, or replace with {option('update')})"
        )
    if old.speedup is None or new.speedup is None:
        return new if new.speedup is not None else old
    runs = list(old.speedup.runs or [_legacy_run(old)])
    seen = {(r.created, r.estimate) for r in runs}
    runs += [r for r in new.speedup.runs if (r.created, r.estimate) not in seen]
    value = math.exp(sum(math.log(r.estimate) for r in runs) / len(runs))
    fraction = new.speedup.band_fraction or old.speedup.band_fraction or DEFAULT_SPEEDUP_BAND
    merged = SpeedupBaseline(value=_r(value), band=_up(value * fraction + 1e-4), band_fraction=fraction, runs=runs)
    spread = merged.spread()
    merged.spread_log_sd = None if spread is None else _r(math.sqrt(spread[0] / (1 + 1 / len(runs))), 6)
    return new.model_copy(update={"speedup": merged})


def merge_entries(existing: BaselineFile | None, new: list[BaselineEntry], *, merge: bool = False) -> BaselineFile:
    """Replace entries with the same key (``merge``: add their runs instead, :func:`merge_runs`); keep all
    others."""
    keep = {e.key: e for e in (existing.entries if existing else [])}
    for entry in new:
        keep[entry.key] = merge_runs(keep[entry.key], entry) if merge and entry.key in keep else entry
    return BaselineFile(entries=list(keep.values()))


def write_baselines(path: str | Path, baselines: BaselineFile, *, update: bool = False) -> tuple[Path, list[str]]:
    """Write atomically (tempfile + os.replace, mode 0644); returns the unified diff lines.

    Refuses (:class:`BaselineExists`) to replace an existing file with different content unless
    ``update``; the exception carries the diff in ``.diff``.
    """
    path = Path(path)
    new_text = render_baselines(baselines)
    old_text = path.read_text() if path.exists() else ""
    if path.exists():
        load_baselines(path)  # never silently replace a file we cannot read
    diff = list(
        difflib.unified_diff(
            old_text.splitlines(),
            new_text.splitlines(),
            fromfile=f"a/{path.name}" if old_text else "/dev/null",
            tofile=f"b/{path.name}",
            lineterm="",
        )
    )
    if path.exists() and diff and not update:
        exc = BaselineExists(
            f"{path} exists and would change ({len(diff)} diff lines); pass {option('update')} to replace it"
        )
        exc.diff = diff
        raise exc
    if not diff:
        return path, []
    atomic_write(path, new_text)
    return path, diff
