"""Options shared by the commands, spelled, defaulted and documented once.

Every option that feeds a run is validated by :func:`ddtree_conformance.settings.build_settings`,
never here: the aliases below only declare names and help, with ``None`` meaning "not given", so
a named pair's values and the settings' defaults apply (:func:`run_settings`). The default each help
text shows is read from the settings model (:func:`~ddtree_conformance.settings.shown_default`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from ..baselines import hardware_class
from ..settings import GenerateSettings, SuiteSettings, build_settings, shown_default

__all__ = [
    "run_settings",
    "hw_class",
    "option_group",
    "grouped",
    "ModelDirs",
    "PromptInputs",
    "Target",
    "EngineControl",
    "BaselineStore",
]

G = TypeVar("G")
_GROUP_MARK = "__ddtree_option_group__"

Engine = Annotated[
    str, typer.Option("--engine", "-e", help="Engine: built-in name, entry-point name, or module:Class.")
]
EngineOptions = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option",
        "-O",
        metavar="KEY=VALUE",
        help="Engine option (repeatable); VALUE as JSON if it parses. Unknown options are refused.",
    ),
]
EngineTimeout = Annotated[
    Optional[float],
    typer.Option(
        "--engine-timeout",
        help="Seconds the engine may take to start, to answer capabilities() (asked "
        "once) and to run each generate; past it the engine counts as hung, its "
        "process group is killed and the run stops with exit status 5. An "
        "engine run with --no-isolate cannot be timed out.",
        show_default=shown_default("engine_timeout_s"),
    ),
]
Model = Annotated[
    Optional[str],
    typer.Option("--model", "-m", help="Target model dir (HF format).", show_default=shown_default("model_dir")),
]
Drafter = Annotated[
    Optional[str],
    typer.Option(
        "--drafter",
        "-d",
        help="DFlash drafter dir (z-lab format); 'none' for no drafter.",
        show_default=shown_default("drafter_dir"),
    ),
]
Pair = Annotated[
    Optional[str],
    typer.Option(
        "--pair",
        help="Named model pair (fixture, qwen3-8b, qwen3-4b, or a "
        "pairs file's); supplies model, drafter, dtype, prompts.",
    ),
]
PairsFile = Annotated[Optional[str], typer.Option("--pairs-file", help="JSON/TOML file of more named pairs.")]
PairName = Annotated[
    Optional[str],
    typer.Option(
        "--pair-name", help="Model pair name; golden files are keyed by it.", show_default=shown_default("pair_name")
    ),
]
Modes = Annotated[
    Optional[str],
    typer.Option(
        "--modes", help="Comma-separated speculative modes: dflash,ddtree.", show_default=shown_default("modes")
    ),
]
Budgets = Annotated[
    Optional[str],
    typer.Option("--budgets", help="Comma-separated DDTree budgets.", show_default=shown_default("budgets")),
]
DType = Annotated[
    Optional[str], typer.Option("--dtype", help="float32 | bfloat16 | float16.", show_default=shown_default("dtype"))
]
Device = Annotated[
    Optional[str],
    typer.Option("--device", help="Device, e.g. cpu, cuda, cuda:1.", show_default=shown_default("device")),
]
Prompts = Annotated[
    Optional[str],
    typer.Option(
        "--prompts", "-p", help="Prompts JSONL path or bundled set name.", show_default=shown_default("prompt_set")
    ),
]
Limit = Annotated[Optional[int], typer.Option("--limit", "-n", help="Use only the first N prompts.")]
MaxNewTokens = Annotated[
    Optional[int],
    typer.Option(
        "--max-new-tokens", help="Tokens to generate per prompt.", show_default=shown_default("max_new_tokens")
    ),
]
Checks = Annotated[
    Optional[list[str]],
    typer.Option(
        "--check", help="Keep checks whose id contains this (repeatable); a filter that keeps none is an error."
    ),
]
Isolate = Annotated[
    Optional[bool],
    typer.Option(
        "--isolate/--no-isolate", help="Run the engine in its own process.", show_default=shown_default("isolate")
    ),
]
GoldenDir = Annotated[
    Optional[str],
    typer.Option("--golden-dir", help="Root of the golden files.", show_default=shown_default("golden_dir")),
]
Threads = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        help="torch CPU threads per process; 0 = torch's default (the default is fastest for small models on "
        "small CPUs).",
        show_default=shown_default("torch_threads"),
    ),
]
TensorParallel = Annotated[
    Optional[int],
    typer.Option(
        "--tensor-parallel-size",
        help="Shard the target over N devices in every run; the tensor-parallel check "
        "compares N with 1. With 1, that check uses the GPUs visible.",
        show_default=shown_default("tensor_parallel_size"),
    ),
]
AllowSkip = Annotated[
    Optional[list[str]],
    typer.Option(
        "--allow-skip",
        metavar="FAMILY",
        help="A check family (acceptance, tree-structure, ...) or mode (ddtree, dflash) "
        "whose checks may skip because of the engine without making the run "
        "incomplete (exit 7); repeatable. The report lists what was allowed; a family this run does not "
        "plan (branch-vs-chain under --modes dflash) gets a note.",
    ),
]
HeldOutPrompts = Annotated[
    Optional[int],
    typer.Option(
        "--held-out-prompts",
        help="Prompts drawn at run time as the prompt set's users write them and added to the prompt set "
        "(an engine cannot know them); 0: none.",
        show_default="one per 20 prompts, at least 1",
    ),
]
RunSeed = Annotated[
    Optional[int],
    typer.Option(
        "--run-seed",
        help="Seed of the held-out prompts and of the order and batching of requests; the report records the one used.",
        show_default="drawn at the run's start",
    ),
]
Profile = Annotated[
    Optional[str],
    typer.Option(
        "--profile",
        help="How much evidence the run gathers: default, or thorough (nightly: 256 new tokens, two "
        "held-out prompts per prompt, 1000 sampled requests per variant; over ten times the "
        "default's prompts x tokens). Explicit options win.",
        show_default="default",
    ),
]
HardwareClass = Annotated[
    Optional[str],
    typer.Option(
        "--hardware-class",
        help="Hardware class the report is filed under (default: from the device, e.g. "
        "cpu-x86_64-2c, cuda-NVIDIA-H200; or $DDTREE_HARDWARE_CLASS).",
    ),
]
Baselines = Annotated[
    Optional[Path],
    typer.Option(
        "--baselines", help="Baseline file, or folder holding <hardware-class>.json.", show_default="golden/baselines"
    ),
]
Out = Annotated[
    Optional[str],
    typer.Option(
        "--out",
        "-o",
        help="Report path (.md and .html beside it); an existing folder, or a path ending in '/', "
        "gets the default file name inside it.",
    ),
]  # a str, not a Path: a Path drops the trailing '/' that names a folder still to be made


def run_settings(kind: type[SuiteSettings] = SuiteSettings, **values: Any) -> SuiteSettings:
    """Build the run settings from CLI values (None: not given); one SettingsError names the flag."""
    values.setdefault("torch_threads", None)  # not given: the front ends' default (settings.DEFAULT_TORCH_THREADS)
    settings, _ = build_settings(values, kind=kind)
    return settings


def generate_settings(**values: Any) -> GenerateSettings:
    return run_settings(GenerateSettings, **values)  # type: ignore[return-value]


def hw_class(device: str, override: Optional[str]) -> str:
    return hardware_class(device, override)


# ------------------------------------------------------------------------------------------ option groups


def option_group(cls: type[G]) -> type[G]:
    """A frozen dataclass whose fields are options (``Annotated`` aliases with defaults) or nested groups.

    A command parameter typed with a group (see :func:`grouped`) shows on the command line as the
    group's options, in field order, where the parameter stands; the command receives one instance."""
    made = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    setattr(made, _GROUP_MARK, True)
    return made


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and getattr(annotation, _GROUP_MARK, False)


def _group_parameters(group: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group, include_extras=True)
    found: list[inspect.Parameter] = []
    for field in dataclasses.fields(group):
        if _is_group(hints[field.name]):
            found += _group_parameters(hints[field.name])
            continue
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        found.append(
            inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[field.name])
        )
    return found


def _build_group(group: type[G], values: dict[str, Any]) -> G:
    hints = typing.get_type_hints(group, include_extras=True)
    return group(
        **{
            f.name: _build_group(hints[f.name], values) if _is_group(hints[f.name]) else values[f.name]
            for f in dataclasses.fields(group)
        }
    )


def grouped(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with each parameter typed by an :func:`option_group` spread into that group's options.

    Typer reads the returned function's signature (every option keyword-only, in place); a call
    gathers each group's options into one instance of it and calls ``func``."""
    hints = typing.get_type_hints(func, include_extras=True)
    groups: dict[str, type] = {}
    spread: list[inspect.Parameter] = []
    for param in inspect.signature(func).parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if _is_group(annotation):
            groups[param.name] = annotation
            spread += _group_parameters(annotation)
        else:
            spread.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
    names = [p.name for p in spread]
    if len(set(names)) != len(names) or set(groups) & set(names):
        raise TypeError(f"{func.__name__}: a name repeats among options and groups: {names}, {list(groups)}")
    own = set(names) - {p.name for group in groups.values() for p in _group_parameters(group)}

    @functools.wraps(func)
    def call(**values: Any) -> Any:
        built = {name: _build_group(group, values) for name, group in groups.items()}
        return func(**{k: v for k, v in values.items() if k in own}, **built)

    call.__signature__ = inspect.Signature(spread)  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in spread}
    return call


@option_group
class ModelDirs:
    """``--model`` and ``--drafter``."""

    model: Model = None
    drafter: Drafter = None

    def values(self) -> dict[str, Any]:
        return {"model_dir": self.model, "drafter_dir": self.drafter}


@option_group
class PromptInputs:
    """``--dtype``, ``--device``, ``--prompts`` and ``--limit``."""

    dtype: DType = None
    device: Device = None
    prompts: Prompts = None
    limit: Limit = None

    def values(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "device": self.device, "prompt_set": self.prompts, "limit": self.limit}


@option_group
class Target:
    """What a run runs (``check``, ``bench``): the engine, the model pair, modes, budgets and inputs."""

    engine: Engine = "reference"
    dirs: ModelDirs
    pair: Pair = None
    pairs_file: PairsFile = None
    pair_name: PairName = None
    modes: Modes = None
    budgets: Budgets = None
    inputs: PromptInputs
    max_new_tokens: MaxNewTokens = None

    def values(self) -> dict[str, Any]:
        """The settings' values (:func:`run_settings`), None where not given."""
        return {
            "engine": self.engine,
            **self.dirs.values(),
            "pair": self.pair,
            "pairs_file": self.pairs_file,
            "pair_name": self.pair_name,
            "modes": self.modes,
            "budgets": self.budgets,
            **self.inputs.values(),
            "max_new_tokens": self.max_new_tokens,
        }


@option_group
class EngineControl:
    """``--engine-option`` and ``--engine-timeout``."""

    engine_option: EngineOptions = None
    engine_timeout: EngineTimeout = None

    def values(self) -> dict[str, Any]:
        return {"engine_options": self.engine_option, "engine_timeout_s": self.engine_timeout}


@option_group
class BaselineStore:
    """``--baselines`` and ``--hardware-class`` (``baseline``, ``gate``)."""

    baselines: Baselines = None
    hardware_class: HardwareClass = None
