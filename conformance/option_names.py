"""How options are spelled, in one place: everything else names an option by its settings field.

Each front end spells the options its own way: the CLI ``--max-new-tokens``, the pytest plugin
``--ddtree-max-new-tokens``. A message anywhere else (a settings error, a check's hint, the coverage
notes, the report) names the option by its field and asks :func:`option`, which spells it as the
front end running now does; each front end enters its spelling (:func:`spelled_by`) around its work,
and the CLI's is the default. So a message reads right in both front ends, and no module outside the
front ends and this one writes a flag.

* :data:`OPTION_FLAGS`: settings field (and ``generate``'s options) -> its CLI flag; the pytest
  flag is the same name behind :data:`PYTEST_PREFIX` (:func:`pytest_flag`).
* :data:`COMMAND_FLAGS`: options of the CLI's other commands that messages point to (``golden
  --update``, ``bench --against``); only the CLI has them, so they read the same everywhere, and
  :func:`command` names one with its command.
* :data:`PLUGIN_FLAGS`: options only the pytest plugin has.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = [
    "CLI_PREFIX",
    "COMMAND_FLAGS",
    "OPTION_FLAGS",
    "PLUGIN_FLAGS",
    "PYTEST_PREFIX",
    "command",
    "option",
    "pytest_flag",
    "spelled_by",
]

CLI_PREFIX = "--"
PYTEST_PREFIX = "--ddtree-"
FRONT_ENDS = {"cli": CLI_PREFIX, "pytest": PYTEST_PREFIX}

# settings field -> CLI flag (the pytest flag: pytest_flag(field))
OPTION_FLAGS: dict[str, str] = {
    "engine": "--engine",
    "engine_options": "--engine-option",
    "engine_timeout_s": "--engine-timeout",
    "model_dir": "--model",
    "drafter_dir": "--drafter",
    "pair": "--pair",
    "pairs_file": "--pairs-file",
    "pair_name": "--pair-name",
    "modes": "--modes",
    "budgets": "--budgets",
    "dtype": "--dtype",
    "device": "--device",
    "prompt_set": "--prompts",
    "limit": "--limit",
    "max_new_tokens": "--max-new-tokens",
    "checks": "--check",
    "isolate": "--isolate",
    "golden_dir": "--golden-dir",
    "torch_threads": "--threads",
    "tensor_parallel_size": "--tensor-parallel-size",
    "held_out_prompts": "--held-out-prompts",
    "profile": "--profile",
    "run_seed": "--run-seed",
    "allow_skip": "--allow-skip",
    # generate
    "mode": "--mode",
    "budget": "--budget",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "seed": "--seed",
    "stop_token_ids": "--stop-token",
    "batch_size": "--batch-size",
}

# options of the CLI's commands that messages point to: name -> flag (the CLI's in every front end)
COMMAND_FLAGS: dict[str, str] = {
    "out": "--out",
    "update": "--update",
    "replace": "--replace",
    "merge": "--merge",
    "against": "--against",
    "baselines": "--baselines",
    "max_repeats": "--max-repeats",
    "time_budget": "--time-budget",
}

# options only the pytest plugin has: name -> flag
PLUGIN_FLAGS: dict[str, str] = {"gpus_per_worker": PYTEST_PREFIX + "gpus-per-worker"}

_PREFIX: ContextVar[str] = ContextVar("ddtree_option_prefix", default=CLI_PREFIX)


def pytest_flag(field: str) -> str:
    """The pytest option of settings ``field``: :data:`PYTEST_PREFIX` + the CLI flag's name."""
    return PYTEST_PREFIX + OPTION_FLAGS[field].removeprefix(CLI_PREFIX)


def option(name: str) -> str:
    """Option ``name`` (a settings field, a command's or the plugin's option) as the front end running
    now spells it; a name no front end has is returned as it is (a field without an option)."""
    if name in OPTION_FLAGS:
        return _PREFIX.get() + OPTION_FLAGS[name].removeprefix(CLI_PREFIX)
    return COMMAND_FLAGS.get(name) or PLUGIN_FLAGS.get(name) or name


def command(name: str, *options: str) -> str:
    """A CLI command with some of its options, for a hint: ``command("bench", "against")`` ->
    ```bench --against``` (only the CLI has these commands)."""
    flags = [COMMAND_FLAGS.get(o) or OPTION_FLAGS[o] for o in options]
    return "`" + " ".join([name, *flags]) + "`"


@contextmanager
def spelled_by(front_end: str) -> Iterator[None]:
    """Spell options as ``front_end`` (``"cli"`` or ``"pytest"``) does while the block runs."""
    token = _PREFIX.set(FRONT_ENDS[front_end])
    try:
        yield
    finally:
        _PREFIX.reset(token)


def enter(front_end: str):
    """:func:`spelled_by` for a front end whose work spans hooks (the pytest plugin: from its configure
    hook to its unconfigure hook): returns the token :func:`leave` takes."""
    return _PREFIX.set(FRONT_ENDS[front_end])


def leave(token) -> None:
    _PREFIX.reset(token)
