"""pytest plugin: ``pytest --engine NAME`` runs the conformance checks against that engine.

Options mirror ``ddtree-conformance check``. With ``--engine`` given, the packaged suite
(:mod:`conformance.suite.test_conformance`) is collected in addition to whatever paths were
named; each planned check is one test item that passes, fails with the check's message, or is
skipped with its reason.
"""

from __future__ import annotations

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
    group.addoption("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    group.addoption("--device", default="cpu")
    group.addoption("--prompt-set", default="fixture", help="bundled prompt set name or JSONL path")
    group.addoption("--limit", type=int, default=None, help="use only the first N prompts")
    group.addoption("--max-new-tokens", type=int, default=64)
    group.addoption("--checks", default=None, help="comma-separated check names to keep (substring match)")
    group.addoption("--no-isolate", action="store_true", help="run the engine in this process")
    group.addoption("--torch-threads", type=int, default=1, help="torch CPU threads per process (0: torch default)")
    group.addoption("--engine-timeout", type=float, default=900.0, help="seconds before a silent engine counts as hung")


def settings_from_options(config: pytest.Config):
    from conformance.session import SuiteSettings

    opt = config.getoption
    values = {
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
    }
    for key, name in (("model_dir", "--model"), ("drafter_dir", "--drafter"), ("pair_name", "--pair-name")):
        if opt(name):
            values[key] = opt(name)
    return SuiteSettings(**values)


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--engine") or str(SUITE) in config.args:
        return
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        # `pytest --engine X` without test paths runs only the conformance suite. (pytest may take
        # a path-like option value such as `--model DIR` for a rootdir hint; `--model=DIR` avoids it.)
        config.args[:] = [str(SUITE)]
    else:
        config.args.append(str(SUITE))
