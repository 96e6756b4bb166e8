"""pytest plugin: ``pytest --engine NAME`` runs the conformance checks against that engine.

Options mirror ``ddtree-conformance check``. With ``--engine`` given, the packaged suite
(:mod:`conformance.suite.test_conformance`) is collected in addition to whatever paths were
named; each planned check is one test item that passes, fails with the check's message, or is
skipped with its reason.

``--pair NAME`` (or ``$DDTREE_PAIR``) takes the target, drafter, dtype, prompts, generation
length and tensor-parallel size from the model-pair registry (:mod:`conformance.pairs`; more pairs
from ``--pairs-file`` / ``$DDTREE_PAIRS_FILE``); explicit options override the pair's values. A
pair whose models are not on this machine skips the suite with one reason; an unknown pair or a
bad pairs file stops the run with one error naming the file and field.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SUITE = Path(__file__).parent / "suite" / "test_conformance.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddtree-conformance")
    group.addoption("--engine", default=None, help="engine under test: reference, vllm, sglang, entry point or module:Class")
    group.addoption("--model", default=None, help="target model dir (default: bundled fixture)")
    group.addoption("--drafter", default=None, help="DFlash drafter dir (default: bundled fixture)")
    group.addoption("--pair-name", default=None, help="name of the model pair (golden files are keyed by it)")
    group.addoption("--modes", default="dflash,ddtree", help="comma-separated modes to check")
    group.addoption("--budgets", default="16,64", help="comma-separated DDTree budgets")
    group.addoption("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: float32 (the pair's dtype with --pair)")
    group.addoption("--device", default="cpu")
    group.addoption("--prompt-set", default=None, help="bundled prompt set name or JSONL path (default: fixture)")
    group.addoption("--limit", type=int, default=None, help="use only the first N prompts")
    group.addoption("--max-new-tokens", type=int, default=None, help="default: 64 (the pair's with --pair)")
    group.addoption("--pair", default=None,
                    help="named model pair (conformance/pairs.py: fixture, qwen3-8b, qwen3-4b, or a pairs file's); "
                         "default $DDTREE_PAIR, else the bundled fixture")
    group.addoption("--pairs-file", default=None, help="JSON/TOML file of more pairs (default $DDTREE_PAIRS_FILE)")
    group.addoption("--tensor-parallel-size", type=int, default=None,
                    help="GPUs each engine shards the target over (default: the pair's, 1)")
    group.addoption("--checks", default=None, help="comma-separated check names to keep (substring match)")
    group.addoption("--no-isolate", action="store_true", help="run the engine in this process")
    group.addoption("--torch-threads", type=int, default=1, help="torch CPU threads per process (0: torch default)")
    group.addoption("--engine-timeout", type=float, default=900.0, help="seconds before a silent engine counts as hung")


def chosen_pair(config: pytest.Config):
    """The :class:`~conformance.pairs.ModelPair` named by ``--pair`` / ``$DDTREE_PAIR`` (None: neither given).

    An unknown name or a bad pairs file is one ``pytest.UsageError``.
    """
    from .pairs import PAIR_ENV, PAIRS_FILE_ENV, PairSpecError, get_pair

    name = config.getoption("--pair", None) or os.environ.get(PAIR_ENV)
    pairs_file = config.getoption("--pairs-file", None) or os.environ.get(PAIRS_FILE_ENV)
    if not name and not pairs_file:
        return None
    try:
        return get_pair(name, pairs_file)
    except PairSpecError as exc:
        raise pytest.UsageError(str(exc)) from None


def resolved_pair(config: pytest.Config):
    """``(ResolvedPair | None, skip reason | None)`` for the chosen pair, resolved once per run."""
    from .pairs import PairSpecError, PairUnavailable, resolve_pair

    key = "_ddtree_resolved_pair"
    if not hasattr(config, key):
        pair, value = chosen_pair(config), (None, None)
        if pair is not None:
            try:
                value = (resolve_pair(pair), None)
            except PairUnavailable as exc:
                value = (None, str(exc))
            except PairSpecError as exc:
                raise pytest.UsageError(str(exc)) from None
        setattr(config, key, value)
    return getattr(config, key)


def settings_from_options(config: pytest.Config):
    from conformance.session import SuiteSettings

    opt = config.getoption
    values = {}
    pair = chosen_pair(config)
    if pair is not None:
        resolved, _reason = resolved_pair(config)
        if resolved is not None:
            values.update(resolved.suite_settings())
        else:  # not on this machine: the plan still needs settings; the items are skipped
            values.update(pair_name=pair.name, dtype=pair.dtype, prompt_format=pair.prompt_format,
                          max_new_tokens=pair.max_new_tokens, tensor_parallel_size=pair.tensor_parallel_size)
    explicit = {
        "engine": opt("--engine") or "reference",
        "modes": [m for m in opt("--modes").split(",") if m],
        "budgets": [int(b) for b in opt("--budgets").split(",") if b],
        "dtype": opt("--dtype"),
        "device": opt("--device"),
        "prompt_set": opt("--prompt-set"),
        "limit": opt("--limit"),
        "max_new_tokens": opt("--max-new-tokens"),
        "isolate": not opt("--no-isolate"),
        "timeout_s": opt("--engine-timeout"),
        "torch_threads": opt("--torch-threads") or None,
        "tensor_parallel_size": opt("--tensor-parallel-size"),
    }
    values.update({k: v for k, v in explicit.items() if v is not None or k == "torch_threads"})
    for key, name in (("model_dir", "--model"), ("drafter_dir", "--drafter"), ("pair_name", "--pair-name")):
        if opt(name):
            values[key] = opt(name)
    return SuiteSettings(**values)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A chosen pair that is not on this machine skips the conformance suite, with its reason."""
    if not config.getoption("--engine") or chosen_pair(config) is None:
        return
    _resolved, reason = resolved_pair(config)
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)) == SUITE:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_configure(config: pytest.Config) -> None:
    chosen_pair(config)  # an unknown pair or a bad pairs file stops the run here, as one error
    if not config.getoption("--engine") or str(SUITE) in config.args:
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --engine X` without test paths runs only the conformance suite. (pytest may take
        # a path-like option value such as `--model DIR` for a rootdir hint; `--model=DIR` avoids it.)
        config.args[:] = [str(SUITE)]
    else:
        config.args.append(str(SUITE))
