"""pytest plugin: ``pytest --ddtree-engine NAME`` runs the conformance checks against that engine.

Every option is prefixed ``--ddtree-`` and is the CLI's option of the same name
(``--ddtree-budgets`` is ``ddtree-conformance check --budgets``; :func:`raw_options` reads them and
:func:`ddtree_conformance.settings.build_settings` validates them, the same function the CLI uses).
So the plugin never clashes with a project's own ``--model``, ``--engine`` or ``--device``: it is
installed with the suite and stays inert until ``--ddtree-engine`` is given.

With ``--ddtree-engine``, the packaged suite (:mod:`ddtree_conformance.suite.test_conformance`)
is collected in addition to whatever paths were named; each planned check is one test item whose
id and JUnit class name carry the engine, dtype and pair (``test_conformance[reference-float32-
fixture|lossless/ddtree-B16]``), so reports from two engines never collide. It passes, fails with
the check's message, or is skipped with its reason.

``--ddtree-pair NAME`` (or ``$DDTREE_PAIR``) takes the target, drafter, dtype, prompts, generation
length and tensor-parallel size from the model-pair registry (:mod:`ddtree_conformance.pairs`);
explicit options override the pair's values. A pair whose models are not on this machine skips the
suite with one reason; an unknown pair or a bad option stops the run with one error naming it.

With pytest-xdist, ``-n auto`` in a GPU run (``-m gpu``) starts one worker per visible GPU and pins
each worker's ``CUDA_VISIBLE_DEVICES`` (:mod:`ddtree_conformance.xdist_gpus`;
``--ddtree-gpus-per-worker N`` for tensor-parallel workers).
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Any

import pytest

from . import option_names
from .adapters.registry import available_engines
from .input_validation import validate_run_inputs
from .option_names import OPTION_FLAGS
from .option_names import pytest_flag as ddtree_flag
from .prompts import PromptError
from .settings import SettingsError, build_settings, shown_default
from .xdist_gpus import XdistGpuPlugin

SUITE = Path(__file__).parent / "suite" / "test_conformance.py"

# (field, argparse keyword arguments, help); the flag is ddtree_flag(field), "{default}" the settings model's
# default (settings.shown_default), so help cannot drift from what a run uses.
_OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "engine",
        {},
        "engine under test: reference, vllm, sglang, an entry-point name or module:Class (turns the plugin on)",
    ),
    (
        "engine_options",
        {"action": "append", "metavar": "KEY=VALUE"},
        "engine option (repeatable), as the CLI's -O/--engine-option",
    ),
    (
        "engine_timeout_s",
        {"type": float},
        "seconds the engine may take to start, answer capabilities() (asked once) "
        "or run one generate before its process group is killed and the "
        "remaining items fail (default {default})",
    ),
    ("model_dir", {}, "target model dir (default: {default}); write --ddtree-model=DIR"),
    ("drafter_dir", {}, "DFlash drafter dir (default: {default}); 'none' for no drafter"),
    ("pair", {}, "named model pair (fixture, qwen3-8b, qwen3-4b, or a pairs file's); default $DDTREE_PAIR"),
    ("pairs_file", {}, "JSON/TOML file of more pairs (default $DDTREE_PAIRS_FILE)"),
    ("pair_name", {}, "name of the model pair (golden files are keyed by it; default {default})"),
    ("modes", {}, "comma-separated speculative modes (default {default})"),
    ("budgets", {}, "comma-separated DDTree budgets (default {default})"),
    ("dtype", {}, "float32 | bfloat16 | float16 (default {default}, the pair's with a pair)"),
    ("device", {}, "cpu, cuda, cuda:N (default {default})"),
    ("prompt_set", {}, "bundled prompt set name or JSONL path (default {default})"),
    ("limit", {"type": int}, "use only the first N prompts"),
    ("max_new_tokens", {"type": int}, "tokens per prompt (default {default}, the pair's with a pair)"),
    ("checks", {"action": "append"}, "keep checks whose id contains this (repeatable)"),
    ("golden_dir", {}, "root of the golden files (default: {default})"),
    ("torch_threads", {"type": int}, "torch CPU threads per process; 0: torch's default (default {default})"),
    (
        "tensor_parallel_size",
        {"type": int},
        "devices each engine shards the target over (default: the pair's, {default})",
    ),
    (
        "allow_skip",
        {"action": "append", "metavar": "FAMILY"},
        "a check family or mode (ddtree, dflash) whose checks may skip because of the engine without making the run "
        "incomplete (exit 7); repeatable",
    ),
    (
        "held_out_prompts",
        {"type": int},
        "prompts drawn at run time from the target, added to the prompt set "
        "(default one per 20 prompts, at least 1; 0: none)",
    ),
    ("profile", {}, "default, or thorough (nightly: over ten times the default's evidence; explicit options win)"),
    (
        "run_seed",
        {"type": int},
        "seed of the held-out prompts and the request order (default: drawn at the run's start; the report records it)",
    ),
]


def _help(field: str, text: str) -> str:
    return text.replace("{default}", shown_default(field) or "none")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("ddtree-conformance", "DDTree conformance suite (ddtree-conformance check, as pytest)")
    for field, kwargs, text in _OPTIONS:
        group.addoption(ddtree_flag(field), dest=f"ddtree_{field}", default=None, help=_help(field, text), **kwargs)
    group.addoption(
        ddtree_flag("isolate"),
        dest="ddtree_isolate",
        action="store_true",
        default=None,
        help="run the engine in its own process (the default)",
    )
    group.addoption(
        "--ddtree-no-isolate", dest="ddtree_isolate", action="store_false", help="run the engine in the pytest process"
    )
    group.addoption(
        "--ddtree-gpus-per-worker",
        dest="ddtree_gpus_per_worker",
        type=int,
        default=None,
        help="GPUs per pytest-xdist worker (default $DDTREE_GPUS_PER_WORKER, else 1); -n auto in a GPU "
        "run starts GPUs // this many workers",
    )
    group.addoption(
        "--ddtree-report",
        dest="ddtree_report",
        default=None,
        metavar="PATH",
        help="the check report's JSON path, Markdown and HTML beside it, as `ddtree-conformance check "
        "--out` (default reports/check-<engine>.json under the directory pytest was started in)",
    )
    # Registered here, before xdist sizes `-n auto` and before any worker touches CUDA.
    if not pluginmanager.has_plugin("ddtree-xdist-gpus"):
        pluginmanager.register(XdistGpuPlugin(), "ddtree-xdist-gpus")


def raw_options(config: pytest.Config) -> dict[str, Any]:
    """The ``--ddtree-*`` option values by settings field (None: not given)."""
    values = {field: config.getoption(f"ddtree_{field}", None) for field, _, _ in _OPTIONS}
    values["isolate"] = config.getoption("ddtree_isolate", None)
    values["pair"] = values["pair"] or os.environ.get("DDTREE_PAIR")
    values["pairs_file"] = values["pairs_file"] or os.environ.get("DDTREE_PAIRS_FILE")
    return values


def active(config: pytest.Config) -> bool:
    return bool(config.getoption("ddtree_engine", None))


def settings_from_config(config: pytest.Config, **overrides: Any):
    """``(SuiteSettings, unavailable)`` from the ``--ddtree-*`` options (``overrides`` win), validated by
    :func:`~ddtree_conformance.settings.build_settings`; a bad value is one ``pytest.UsageError`` naming the
    ``--ddtree-`` option. ``unavailable`` is why a named pair's models are not here (then items skip)."""
    values = raw_options(config)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return build_settings(values, allow_unavailable_pair=True)
    except SettingsError as exc:
        raise pytest.UsageError(f"ddtree-conformance: {exc}") from None


def settings_from_options(config: pytest.Config):
    """The validated settings of this pytest run (cached on the config)."""
    key = "_ddtree_settings"
    if not hasattr(config, key):
        setattr(config, key, settings_from_config(config))
    return getattr(config, key)[0]


def unavailable_reason(config: pytest.Config) -> str | None:
    settings_from_options(config)
    return getattr(config, "_ddtree_settings")[1]


def item_group(settings) -> str:
    """``engine-dtype-pair``: the prefix of every item id, the xdist group and the JUnit class name."""
    engine = re.sub(r"[^A-Za-z0-9_.-]+", "_", settings.engine)
    return f"{engine}-{settings.dtype}-{settings.pair_name}"


def _check_engine_name(name: str) -> None:
    """An engine name that is neither registered nor ``module:Class`` stops the run (no import)."""
    name = name.strip()
    known = available_engines()
    if name not in known and ":" not in name:
        raise pytest.UsageError(
            f"ddtree-conformance: --ddtree-engine: unknown engine {name!r}; known engines: "
            f"{', '.join(sorted(known))} (or give a 'module:Class' path)"
        )


_SPELLING = pytest.StashKey[object]()


def pytest_configure(config: pytest.Config) -> None:
    if not active(config):
        return
    # from here to pytest_unconfigure every message spells options as this plugin does (--ddtree-...)
    config.stash[_SPELLING] = option_names.enter("pytest")
    try:
        _configure(config)
    except BaseException:
        pytest_unconfigure(config)
        raise


def pytest_unconfigure(config: pytest.Config) -> None:
    token = config.stash.get(_SPELLING, None)
    if token is not None:
        del config.stash[_SPELLING]
        option_names.leave(token)


def _configure(config: pytest.Config) -> None:
    settings = settings_from_options(config)  # a bad option or an unknown pair stops the run here, as one error
    _check_engine_name(settings.engine)
    # imported here: the plugin loads in every pytest run of a project that installed the suite, and these
    # import the checks, which import torch
    from .checks import plan
    from .coverage import check_allow_skip
    from .pytest_results import Recorder

    try:
        plan(settings)  # a filter that keeps nothing is a usage error, never an empty pass
        if unavailable_reason(config) is None:  # bad prompts, ids or lengths: before any engine work
            validate_run_inputs(settings)
        allow_skip_notes = check_allow_skip(settings)  # known but not planned here: a note
    except (SettingsError, PromptError) as exc:
        raise pytest.UsageError(f"ddtree-conformance: {exc}") from None
    out = config.getoption("ddtree_report", None)
    out = Path(out) if out else Path("reports") / f"check-{settings.engine.replace(':', '_')}.json"
    if not out.is_absolute():
        out = config.invocation_params.dir / out
    if not config.pluginmanager.has_plugin("ddtree-results"):
        config.pluginmanager.register(Recorder(config, settings, out, allow_skip_notes), "ddtree-results")
    user_paths = (
        [a for a in config.args if a != str(SUITE)] if config.args_source == pytest.Config.ArgsSource.ARGS else []
    )
    config.stash[_USER_PATHS] = user_paths
    if str(SUITE) in config.args:
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --ddtree-engine X` without test paths runs only the conformance suite (said after collection).
        config.args[:] = [str(SUITE)]
    else:
        config.args.append(str(SUITE))


_USER_PATHS = pytest.StashKey[list]()


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str] | None:
    """Which test paths this run collected: the conformance suite, and the project's own tests or none."""
    if not active(config):
        return None
    suite = sum(1 for item in items if Path(str(item.fspath)) == SUITE)
    own = len(items) - suite
    settings = settings_from_options(config)
    lines = [
        f"ddtree-conformance: {suite} conformance item(s) for engine {settings.engine!r} from the packaged suite "
        f"({SUITE})"
    ]
    paths = config.stash.get(_USER_PATHS, [])
    if paths:
        lines.append(f"ddtree-conformance: and {own} item(s) of your own tests from: {', '.join(paths)}")
    else:
        lines.append(
            "ddtree-conformance: no test paths given, so only the conformance suite runs (your project's "
            "testpaths are not collected); to run both, name them: pytest tests --ddtree-engine "
            f"{settings.engine}"
        )
    return lines


class _SuiteModule(pytest.Module):
    """The packaged suite file, collected as the module it is (``ddtree_conformance.suite.test_conformance``).

    Left to pytest's default import mode, a suite file inside a source checkout would be imported
    under the bare name ``conformance.suite.test_conformance``, with the checkout's root put first on
    ``sys.path``: bare ``conformance`` and ``adapters`` would then leak into the user's run.
    """

    def _getobj(self):
        return importlib.import_module("ddtree_conformance.suite.test_conformance")


def pytest_collect_directory(path, parent):
    """The package folders above the suite file of a source checkout (``conformance/``,
    ``conformance/suite/``) are collected as plain folders: a pytest Package would import their
    ``__init__`` under the bare folder names."""
    if not active(parent.config) or not (Path(path) / "__init__.py").is_file():
        return None
    folder = Path(path).resolve()
    if (
        folder.name != "ddtree_conformance"
        and folder in SUITE.resolve().parents
        and folder != SUITE.resolve().parent.parent.parent
    ):
        return pytest.Dir.from_parent(parent, path=Path(path))
    return None


def pytest_pycollect_makemodule(module_path, parent):
    if Path(module_path) == SUITE:
        return _SuiteModule.from_parent(parent, path=Path(module_path))
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A chosen pair that is not on this machine skips the conformance suite, with its reason."""
    if not active(config):
        return
    reason = unavailable_reason(config)
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)) == SUITE:
            item.add_marker(pytest.mark.skip(reason=reason))


assert set(OPTION_FLAGS) >= {field for field, _, _ in _OPTIONS}
