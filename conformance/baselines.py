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
from .paths import BASELINES_DIR

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "BASELINES_DIR",
    "BaselineError",
    "BaselineExists",
    "Band",
    "CostBaseline",
    "PositionBand",
    "BaselineEntry",
    "BaselineFile",
    "hardware_class",
    "baseline_path",
    "load_baselines",
    "entries_from_report",
    "merge_entries",
    "render_baselines",
    "write_baselines",
]

SCHEMA = "ddtree-conformance/baselines"
SCHEMA_VERSION = 1

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
    speedup: Band | None = Field(default=None, description="null when the run measured no throughput")
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
    if raw.get("schema_version") != SCHEMA_VERSION:
        raise BaselineError(
            f"{path}: field 'schema_version' is {raw.get('schema_version')!r}; "
            f"this suite reads version {SCHEMA_VERSION}"
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
                else Band(
                    value=_r(point),
                    # never narrower than the baseline run's own CI: a band tighter than the noise
                    # would make the baseline's own engine fail
                    band=_up(max(point * speedup_band, point - (low if low is not None else 0.0)) + 1e-4),
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


def merge_entries(existing: BaselineFile | None, new: list[BaselineEntry]) -> BaselineFile:
    """Replace entries with the same key; keep all others."""
    keep = {e.key: e for e in (existing.entries if existing else [])}
    for entry in new:
        keep[entry.key] = entry
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
        exc = BaselineExists(f"{path} exists and would change ({len(diff)} diff lines); pass --update to replace it")
        exc.diff = diff
        raise exc
    if not diff:
        return path, []
    atomic_write(path, new_text)
    return path, diff
