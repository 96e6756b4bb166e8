"""The run settings: the one place where a conformance run's options are validated.

The CLI (``ddtree-conformance check --budgets 16,64``) and the pytest plugin
(``pytest --ddtree-budgets 16,64``) both pass the raw option values to :func:`build_settings`,
which returns a :class:`SuiteSettings` or raises one :class:`SettingsError` naming the option as
the front end running spells it (:mod:`ddtree_conformance.option_names`, where both front ends' flags
are declared, so they cannot drift).

A named model pair (``pair``, ``pairs_file``) supplies defaults for the model dirs, dtype, prompts,
generation length and tensor-parallel size; explicit options win over the pair's values.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .adapters.interface import DType, Mode
from .context_lengths import DECODE_BUDGET
from .option_names import option
from .pairs import PairSpecError, PairUnavailable, get_pair, resolve_pair
from .paths import FIXTURE_DRAFTER, FIXTURE_TARGET, RECORDS_DIR
from .prompts import resolve_prompt_set

__all__ = [
    "SAMPLING_FULL_AT_PROMPTS",
    "SuiteSettings",
    "GenerateSettings",
    "SettingsError",
    "MAX_BUDGET",
    "build_settings",
    "parse_engine_options",
    "shown_default",
    "DEFAULT_TORCH_THREADS",
]

SAMPLING_FULL_AT_PROMPTS = 20  # the front ends' --limit below this samples that share of sampling_requests
MAX_BUDGET = 1 << 16  # no engine drafts trees this large; engines refuse above their own max_budget
DEFAULT_TORCH_THREADS = 1  # when not given: fastest for small models on small CPUs; 0 asks for torch's own
PAIR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DEVICE = re.compile(r"(cpu|cuda|mps|xpu)(:\d+)?")

# profile -> the settings it changes (explicit options win). "thorough" gathers over ten times the default's
# evidence (prompts x tokens: (80 + 160) x 256 against (80 + 4) x 64 on the fixture) for nightly runs.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "thorough": {
        "max_new_tokens": 256,
        "held_out_per_prompt": 2.0,
        "sampling_requests": 1000,
        "branch_rounds": 12,
        "branch_prompts": 16,
    },
}


class SettingsError(ValueError):
    """An option value cannot be used; the message names the option (as the caller spells it)."""


def parse_engine_options(pairs: Any) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` (VALUE parsed as JSON when it parses) or a dict -> dict."""
    if pairs is None:
        return {}
    if isinstance(pairs, dict):
        return dict(pairs)
    if isinstance(pairs, str):
        pairs = [pairs]
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"must be KEY=VALUE, got {pair!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        out: list = []
        for v in value:
            out += _comma_list(v) if isinstance(v, str) else [v]
        return out
    return value


def _existing_dir(value: str, what: str) -> str:
    path = Path(value).expanduser()
    if not path.exists():
        raise ValueError(f"{what} dir {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{what} dir {path} is not a directory")
    return str(path.absolute())  # fixed now: an engine that changes the working folder cannot move it


class SuiteSettings(BaseModel):
    """Everything a conformance run is parameterised by; built by :func:`build_settings`."""

    model_config = ConfigDict(extra="forbid")

    engine: str = "reference"
    engine_options: dict[str, Any] = Field(default_factory=dict)
    engine_timeout_s: float = Field(default=900.0, gt=0, description="start-up, capabilities() and each generate")
    model_dir: str = str(FIXTURE_TARGET)
    drafter_dir: str | None = str(FIXTURE_DRAFTER)
    pair_name: str = "fixture"
    modes: list[Literal["dflash", "ddtree"]] = Field(default_factory=lambda: ["dflash", "ddtree"], min_length=1)
    budgets: list[int] = Field(default_factory=lambda: [16, 64, 256], min_length=1)
    dtype: DType = "float32"
    device: str = "cpu"
    prompt_set: str = "fixture"
    prompt_format: Literal["ids", "text", "chat"] = Field(
        default="ids", description="how prompts become token ids (ddtree_conformance.pairs.format_prompts)"
    )
    limit: int | None = Field(default=None, ge=1, description="use only the first N prompts")
    max_new_tokens: int = Field(default=64, ge=1)
    checks: list[str] | None = Field(default=None, description="keep checks whose id contains one of these")
    isolate: bool = True
    near_tie_bound: float | None = Field(default=None, description="nats; None: the pair's calibration")
    golden_dir: str = str(RECORDS_DIR)
    sampling_requests: int = Field(
        default=200,
        ge=1,
        description="seeded requests per sampling variant (the front ends scale it down by a limit under "
        "SAMPLING_FULL_AT_PROMPTS prompts: build_settings)",
    )
    branch_rounds: int = Field(default=3, ge=1, description="rounds per prompt checked branch-vs-chain")
    branch_prompts: int = Field(default=4, ge=1)
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs the engine shards the target over")
    held_out_per_prompt: float = Field(
        default=0.05,
        ge=0,
        le=100,
        description="held-out prompts per prompt of the set when held_out_prompts is not given (at least one)",
    )
    profile: Literal["default", "thorough"] = Field(
        default="default",
        description="how much evidence a run gathers; thorough (nightly): longer outputs, "
        "two held-out prompts per prompt of the set, more sampled requests and branch "
        "rounds, over ten times the default's prompts x tokens (PROFILES)",
    )
    context_tokens: int = Field(
        default=DECODE_BUDGET,
        ge=1,
        le=1_000_000,
        description="output tokens per mode the context-range check spends: a window up to this long is "
        "decoded at every context length, a longer one at its switching points "
        "(ddtree_conformance.context_lengths)",
    )
    held_out_prompts: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="prompts drawn at run time "
        "as the set's users write them, added to the prompt set (ddtree_conformance.held_out); "
        "None: one per 20 prompts of the set, at least one",
    )
    run_seed: int | None = Field(
        default=None,
        ge=0,
        lt=2**63,
        description="seed of the held-out prompts and the "
        "request order; None: drawn at the run's start (the report records it)",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="torch CPU threads in the suite and engine processes (None: torch's default)"
    )
    allow_skip: list[str] | None = Field(
        default=None,
        description="check families or modes whose checks may skip because of the engine without "
        "making the run incomplete",
    )

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name an engine: a built-in name, an entry-point name or module:Class")
        return value.strip()

    @field_validator("engine_options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> dict[str, Any]:
        return parse_engine_options(value)

    @field_validator("model_dir")
    @classmethod
    def _model(cls, value: str) -> str:
        return _existing_dir(value, "model")

    @field_validator("drafter_dir", mode="before")
    @classmethod
    def _drafter(cls, value: Any) -> str | None:
        if value is None or str(value).strip().lower() in ("", "none"):
            return None
        return _existing_dir(str(value), "drafter")

    @field_validator("pair_name")
    @classmethod
    def _pair_name(cls, value: str) -> str:
        if not PAIR_NAME.fullmatch(value) or ".." in value:
            raise ValueError(
                f"{value!r} is not a pair name (letters, digits, '.', '_', '-'; golden files are "
                "kept under <golden dir>/<pair name>/)"
            )
        return value

    @field_validator("modes", "budgets", "checks", "allow_skip", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, value: list[int]) -> list[int]:
        for b in value:
            if not 1 <= b <= MAX_BUDGET:
                raise ValueError(f"budget {b} is outside 1..{MAX_BUDGET}")
        return list(dict.fromkeys(value))

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        value = value.strip()
        if not DEVICE.fullmatch(value):
            raise ValueError(f"{value!r} is not a device (cpu, cuda, cuda:N)")
        return value

    @field_validator("torch_threads", mode="before")
    @classmethod
    def _threads(cls, value: Any) -> Any:
        return None if value in (0, "0", None) else value

    @field_validator("prompt_set")
    @classmethod
    def _prompts(cls, value: str) -> str:
        path = resolve_prompt_set(value)  # a PromptError (ValueError) names the file or the known sets
        return str(path.absolute()) if Path(value).is_file() else value  # a file: fixed now, a set: its name

    @field_validator("golden_dir")
    @classmethod
    def _golden_dir(cls, value: str) -> str:
        return str(Path(value).expanduser().absolute())

    @field_validator("checks", "allow_skip")
    @classmethod
    def _checks(cls, value: list[str] | None) -> list[str] | None:
        return value or None

    @model_validator(mode="before")
    @classmethod
    def _apply_profile(cls, values: Any) -> Any:
        """A profile's values fill the options not given (explicit options win)."""
        if isinstance(values, dict) and values.get("profile") in PROFILES:
            values = {**PROFILES[values["profile"]], **{k: v for k, v in values.items() if v is not None}}
        return values

    @model_validator(mode="after")
    def _draw_run_seed(self) -> SuiteSettings:
        """A run without ``run_seed`` draws one now: every run sees other held-out prompts and another
        request order, and its settings (the report) record the seed that repeats it. 63 bits: an engine
        that sees a held-out prompt cannot search the seeds for the rest of the run."""
        if self.run_seed is None:
            self.run_seed = secrets.randbits(63)
        return self


class GenerateSettings(SuiteSettings):
    """``ddtree-conformance generate``: one mode, one budget, sampling and stop tokens."""

    mode: Mode = "ddtree"
    budget: int = Field(default=32, ge=1, le=MAX_BUDGET)
    max_new_tokens: int | None = Field(default=None, ge=1, description="None: the prompt's own, else 64")
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int = 0
    stop_token_ids: list[int] | None = Field(default=None, description="None: the target's eos ids")
    batch_size: int = Field(default=4, ge=1)

    @field_validator("stop_token_ids")
    @classmethod
    def _stops(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("token ids are >= 0")
        return value


# How help text names a default that is a path of the bundled data, not the path itself.
_NAMED_DEFAULTS = {
    str(FIXTURE_TARGET): "the bundled fixture target",
    str(FIXTURE_DRAFTER): "the bundled fixture drafter",
    str(RECORDS_DIR): "the bundled golden files",
}
# Defaults a front end applies to a field whose model default is None (build_settings fills them).
_FRONT_END_DEFAULTS = {"torch_threads": DEFAULT_TORCH_THREADS}


def shown_default(field: str, kind: type[SuiteSettings] | None = None) -> str | None:
    """The default of ``field`` as help text shows it (``16,64,256``; ``the bundled fixture target``),
    read from the settings model so that no help text can drift from it; None when there is none."""
    model = kind or SuiteSettings
    if field in _FRONT_END_DEFAULTS:
        return str(_FRONT_END_DEFAULTS[field])
    if field not in model.model_fields:  # pair, pairs_file: options, not settings
        return None
    value = model.model_fields[field].get_default(call_default_factory=True)
    if value is None or value == {}:
        return None
    if isinstance(value, bool):
        return {"isolate": "isolate"}.get(field, str(value).lower()) if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _NAMED_DEFAULTS.get(str(value), str(value))


def _with_pair(values: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """``values`` filled from the named pair (explicit values win), without the pair's own keys; and why
    the pair is unavailable (None: it is here, or none was named)."""
    values = dict(values)
    name, pairs_file = values.pop("pair", None), values.pop("pairs_file", None)
    if not name and not pairs_file:
        return values, None
    pair = get_pair(name, pairs_file)
    try:
        resolved = resolve_pair(pair)
    except PairUnavailable as exc:
        declared = {
            "pair_name": pair.name,
            "dtype": pair.dtype,
            "prompt_format": pair.prompt_format,
            "max_new_tokens": pair.max_new_tokens,
            "tensor_parallel_size": pair.tensor_parallel_size,
        }
        for key, value in declared.items():
            values.setdefault(key, value)
        return values, str(exc)
    for key, value in resolved.suite_settings().items():
        if values.get(key) is None and value is not None:
            values[key] = value
    return values, None


def _bound_sampling(values: dict[str, Any], *, given: bool) -> dict[str, Any]:
    """``--limit`` bounds every check, the sampling checks included: a limit of N prompts under
    :data:`SAMPLING_FULL_AT_PROMPTS` samples N / 20 of the requests per variant (the profile's or the
    default's; at least one). A sampling_requests the caller gave stays as given. Returns the values."""
    try:
        limit = int(values["limit"])
    except (KeyError, TypeError, ValueError):  # not given, or a bad value the settings model names
        return values
    if given or limit < 1 or limit >= SAMPLING_FULL_AT_PROMPTS:
        return values
    full = values.get("sampling_requests", SuiteSettings.model_fields["sampling_requests"].default)
    if not isinstance(full, int):
        return values
    return {**values, "sampling_requests": max(1, math.ceil(full * limit / SAMPLING_FULL_AT_PROMPTS))}


def build_settings(
    raw: dict[str, Any], *, kind: type[SuiteSettings] = SuiteSettings, allow_unavailable_pair: bool = False
) -> tuple[SuiteSettings, str | None]:
    """Validate raw option values (field name -> value; None means "not given") into settings.

    Returns ``(settings, unavailable)``: ``unavailable`` is the reason a named pair's models are not on
    this machine (then only with ``allow_unavailable_pair``: the settings fall back to the fixture's
    dirs so a plan can still be listed). Raises :class:`SettingsError` naming the option as the front end
    running now spells it (:func:`~ddtree_conformance.option_names.option`).
    """
    values = {k: v for k, v in raw.items() if v is not None}
    if values.get("profile") in PROFILES:  # a profile's values win over a pair's, explicit options over both
        values = {**PROFILES[values["profile"]], **values}
    if "torch_threads" in raw:  # a front end's option: not given means DEFAULT_TORCH_THREADS
        values.setdefault("torch_threads", DEFAULT_TORCH_THREADS)
    try:
        values, unavailable = _with_pair(values)
    except PairSpecError as exc:
        raise SettingsError(str(exc)) from None
    if unavailable and not allow_unavailable_pair:
        raise SettingsError(unavailable)
    values = _bound_sampling(values, given=raw.get("sampling_requests") is not None)
    try:
        return kind(**values), unavailable
    except ValidationError as exc:
        messages = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err.get("loc") else ""
            msg = err["msg"].removeprefix("Value error, ")
            given = values.get(field)
            shown = f" (got {given!r})" if given is not None and not isinstance(given, dict) else ""
            messages.append(f"{option(field)}: {msg}{shown}")
        raise SettingsError("; ".join(messages)) from None
