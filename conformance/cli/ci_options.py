"""The options of ``ddtree-conformance ci`` (:mod:`.ci`): its own spellings of the suite's options, each
also read from ``$DDTREE_<OPTION>`` (what the GitHub workflow and the Buildkite pipeline set), in three
groups: the engine and what installs it, what the steps run, and the throughput gate."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import options as opt

__all__ = ["CiEngine", "CiRun", "CiThroughput", "Reports", "Summary", "env_option", "listed", "given"]


def env_option(name: str, text: str, **kwargs) -> typer.models.OptionInfo:
    """An option that also reads ``$DDTREE_<NAME>`` (what the GitHub workflow and the Buildkite pipeline set)."""
    return typer.Option(name, envvar="DDTREE_" + name[2:].upper().replace("-", "_"), help=text, **kwargs)


def listed(values: list[str] | None, env: str) -> list[str]:
    """Repeated values, or ``$DDTREE_<ENV>`` one per line: a requirement may hold spaces."""
    raw = values if values else os.environ.get(env, "").splitlines()
    return [v.strip() for value in raw for v in value.splitlines() if v.strip()]


def given(value: str | None) -> str | None:
    return value if value not in (None, "") else None


EngineSpec = Annotated[str, env_option("--engine", "Engine: built-in name, entry-point name, or module:Class.")]
EngineOption = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-option",
        "-O",
        metavar="KEY=VALUE",
        help="Engine option (repeatable; $DDTREE_ENGINE_OPTIONS: one per line).",
    ),
]
EngineRequirement = Annotated[
    Optional[list[str]],
    typer.Option(
        "--engine-requirement",
        metavar="REQ",
        help="pip requirement installing the engine first (repeatable; $DDTREE_ENGINE_REQUIREMENT: one per line).",
    ),
]
EngineVersion = Annotated[
    Optional[str],
    typer.Option(
        "--engine-version",
        help="Install this version of an engine the suite pins (vllm, sglang); 'pinned': the "
        "pinned one. Not given: install nothing. ($DDTREE_ENGINE_VERSION)",
    ),
]
Text = Optional[str]
Checks = Annotated[
    Optional[list[str]],
    typer.Option("--check", help="Keep checks whose id contains this (repeatable; $DDTREE_CHECKS: one per line)."),
]
AllowSkip = Annotated[
    Optional[list[str]],
    typer.Option(
        "--allow-skip",
        metavar="FAMILY",
        help="A check family or mode that may skip because of the engine "
        "(repeatable; $DDTREE_ALLOW_SKIP: one per line); one this run does not plan is a note.",
    ),
]
Isolate = Annotated[
    Optional[bool],
    typer.Option(
        "--isolate/--no-isolate",
        envvar="DDTREE_ISOLATE",
        help="Run the engine in its own process.",
        show_default="isolate",
    ),
]
Against = Annotated[
    Text,
    env_option(
        "--against",
        "A/B baseline build (bench --against): an engine here, a requirement, a wheel or a folder. "
        "Without it: stored baselines.",
        metavar="ENGINE",
    ),
]
AgainstOption = Annotated[
    Optional[list[str]],
    typer.Option("--against-option", metavar="KEY=VALUE", help="The A/B baseline's engine options (repeatable)."),
]
Baselines = Annotated[
    Text,
    env_option(
        "--baselines", "Stored baselines: a file, or a folder of <hardware-class>.json.", show_default="the suite's"
    ),
]
Gate = Annotated[
    str,
    env_option(
        "--gate",
        "auto: gate throughput against --against (A/B), else every run and metric that has a stored "
        "baseline, and say in the summary what was not gated and why; required: a missing baseline fails "
        "(exit 4); off: no bench.",
    ),
]
Reports = Annotated[Path, env_option("--reports", "Folder of every report, the JUnit file and the summary.")]
Summary = Annotated[
    Optional[Path],
    typer.Option("--summary", help="Also append the summary here.", show_default="$GITHUB_STEP_SUMMARY when set"),
]


@opt.option_group
class CiEngine:
    """The engine under test, and what installs it."""

    engine: EngineSpec = "reference"
    engine_option: EngineOption = None
    engine_requirement: EngineRequirement = None
    engine_version: EngineVersion = None


@opt.option_group
class CiRun:
    """What the check and the bench run, as the suite's own options."""

    pair: Annotated[
        Text, env_option("--pair", "Named model pair (fixture, qwen3-8b, qwen3-4b, or a pairs file's).")
    ] = None
    pairs_file: Annotated[Text, env_option("--pairs-file", "JSON/TOML file of more named pairs.")] = None
    model: Annotated[Text, env_option("--model", "Target model dir.")] = None
    drafter: Annotated[Text, env_option("--drafter", "DFlash drafter dir.")] = None
    dtype: Annotated[Text, env_option("--dtype", "float32 | bfloat16 | float16.")] = None
    device: Annotated[Text, env_option("--device", "cpu, cuda, cuda:N.")] = None
    modes: Annotated[Text, env_option("--modes", "Comma-separated speculative modes.")] = None
    budgets: Annotated[Text, env_option("--budgets", "Comma-separated DDTree budgets.")] = None
    prompts: Annotated[Text, env_option("--prompts", "Prompts JSONL path or bundled set name.")] = None
    limit: Annotated[Text, env_option("--limit", "Prompts per run: a number, or 'all'.", show_default="all")] = None
    max_new_tokens: Annotated[Optional[int], env_option("--max-new-tokens", "Tokens per prompt.")] = None
    only: Checks = None
    allow_skip: AllowSkip = None
    isolate: Isolate = None
    threads: Annotated[Optional[int], env_option("--threads", "torch CPU threads per process; 0: torch's default.")] = (
        None
    )
    engine_timeout: opt.EngineTimeout = None
    hardware_class: Annotated[
        Text, env_option("--hardware-class", "Hardware class the reports are filed under (baselines are keyed by it).")
    ] = None


@opt.option_group
class CiThroughput:
    """The bench and the gate: A/B against a build, or the stored baselines."""

    against: Against = None
    against_engine: Annotated[Text, env_option("--against-engine", "The spec the installed baseline runs as.")] = None
    against_option: AgainstOption = None
    tolerance: Annotated[float, env_option("--tolerance", "A/B: allowed slowdown (edge 1 - tolerance).")] = 0.05
    ab_spread: Annotated[
        Text,
        env_option(
            "--ab-spread",
            "A/B: the between-process spread SD:DF that A/A runs measured on this runner class and pair "
            "(scripts/ab_bias.py --pool); the bench's interval includes it.",
            metavar="SD:DF",
        ),
    ] = None
    baselines: Baselines = None
    gate: Gate = "auto"
    time_budget: Annotated[
        float, env_option("--time-budget", "Bench: seconds of timed repeats before an undecided interval stops.")
    ] = 600.0
    max_repeats: Annotated[int, env_option("--max-repeats", "Bench: repeat cap.")] = 60
