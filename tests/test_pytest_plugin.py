"""The pytest plugin as an engine team meets it: installed, inside their own test tree.

Every run here is pytest started in a temporary project that is not this repository. Its conftest
defines ``--model``, ``--engine`` and ``--device``, as vLLM's test tree does; the suite's plugin
loads there through its ``pytest11`` entry point and must neither clash with those options nor run
anything unless ``--ddtree-engine`` is given. One run is a real subprocess with the engine in its own
process, as a user runs it; the others run in-process (pytester) to keep the tier fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import ddtree_conformance

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
EDITABLE = Path(ddtree_conformance.__file__).resolve().is_relative_to(ROOT)

CONFTEST = """
import json
import os
import sys


def pytest_addoption(parser):
    # what vLLM's tests/conftest.py and many engine repositories declare
    parser.addoption("--model", action="store", default="facebook/opt-125m")
    parser.addoption("--engine", action="store", default="v1")
    parser.addoption("--device", action="store", default="cpu")


def pytest_sessionfinish(session):
    probe = os.environ.get("MODULE_PROBE")
    if probe:  # what the run imported under the bare names, and what it put on sys.path
        bare = sorted(k for k in sys.modules if k.split(".")[0] in ("conformance", "adapters"))
        with open(probe, "w") as f:
            json.dump({"bare": bare, "sys_path": sys.path}, f)
"""

LOCAL_TEST = """
def test_own_options(request):
    assert request.config.getoption("--model") == "my-model"
    assert request.config.getoption("--engine") == "my-engine"
    assert request.config.getoption("--device") == "my-device"
"""

# An engine of "another team": the reference engine behind module:Class, needing an option to start.
WRAPPED_ENGINE = """
from ddtree_conformance.adapters.interface import EngineError
from ddtree_conformance.adapters.reference.engine import ReferenceEngine


class Wrapped(ReferenceEngine):
    name = "wrapped"
    OPTIONS = ReferenceEngine.OPTIONS + ("marker",)  # declared: undeclared options are refused before start

    def __init__(self, model_dir, drafter_dir=None, **options):
        marker = options.pop("marker", None)
        if marker != 7:  # the value arrives parsed as JSON: the int 7
            raise EngineError(f"engine 'wrapped': option marker must be 7, got {marker!r}")
        super().__init__(model_dir, drafter_dir, **options)
"""

# Small and real: one prompt, short generations, one budget, one check.
FAST = [
    "--ddtree-limit",
    "1",
    "--ddtree-budgets",
    "16",
    "--ddtree-max-new-tokens",
    "8",
    "--ddtree-check",
    "lossless/dflash",
]
OWN = ["--model", "my-model", "--engine", "my-engine", "--device", "my-device"]
REFERENCE_ID = "test_conformance[reference-float32-fixture|lossless/dflash]"
WRAPPED_ID = "test_conformance[my_engine_Wrapped-float32-fixture|lossless/dflash]"


def write_project(root: Path) -> Path:
    (root / "tests").mkdir(parents=True, exist_ok=True)
    (root / "tests" / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "tests" / "test_local.py").write_text(textwrap.dedent(LOCAL_TEST))
    (root / "my_engine.py").write_text(textwrap.dedent(WRAPPED_ENGINE))
    return root


def junit_cases(path: Path) -> dict[str, ET.Element]:
    """JUnit test cases by ``classname::name``."""
    return {f"{c.get('classname')}::{c.get('name')}": c for c in ET.parse(path).getroot().iter("testcase")}


@pytest.fixture
def repo(pytester: pytest.Pytester, monkeypatch) -> pytest.Pytester:
    """An engine repository, run in-process; its ``my_engine`` module is importable (this one: another
    test's ``my_engine`` module, cached in this worker, must not answer)."""
    write_project(pytester.path)
    monkeypatch.delitem(sys.modules, "my_engine", raising=False)
    pytester.syspathinsert()
    yield pytester
    sys.modules.pop("my_engine", None)


def run_in_repo(repo: pytest.Pytester, *args: str) -> pytest.RunResult:
    return repo.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *args)


def text(result: pytest.RunResult) -> str:
    return result.stdout.str() + result.stderr.str()


# ------------------------------------------------------------------ one real subprocess run


@pytest.fixture(scope="module")
def subprocess_run(tmp_path_factory):
    """``pytest`` in a fresh process in the engine repository: its own test and the suite's item in one
    run, with the repository's --model/--engine/--device, the engine in its own process, JUnit out."""
    project = write_project(tmp_path_factory.mktemp("engine-repo"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DDTREE_"))}
    env["MODULE_PROBE"] = str(project / "modules.json")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::DeprecationWarning",
            "-q",
            "tests",
            *OWN,
            "--ddtree-engine",
            "reference",
            *FAST,
            "--ddtree-engine-option",
            "cuda_graphs=off",
            "--junitxml",
            "reference.xml",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, project


@pytest.mark.slow
def test_conformance_items_run_beside_the_projects_own_options(subprocess_run):
    proc, project = subprocess_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already used" not in proc.stdout + proc.stderr
    cases = junit_cases(project / "reference.xml")
    assert set(cases) == {"tests.test_local::test_own_options", f"ddtree.reference-float32-fixture::{REFERENCE_ID}"}
    assert all(len(case) == 0 for case in cases.values()), "a case failed or skipped"  # no failure/skip child


@pytest.mark.slow
def test_a_conformance_run_imports_nothing_under_the_bare_names(subprocess_run):
    proc, project = subprocess_run
    probe = json.loads((project / "modules.json").read_text())
    assert probe["bare"] == []
    assert str(ROOT) not in probe["sys_path"]


# ------------------------------------------------------------------ in-process runs


def test_without_ddtree_engine_the_plugin_is_inert_beside_the_projects_options(repo):
    # --ddtree-budgets is accepted (so the plugin is loaded) and does nothing without --ddtree-engine
    result = run_in_repo(repo, "-q", "tests", *OWN, "--ddtree-budgets", "16")
    assert result.ret == 0, text(result)
    result.assert_outcomes(passed=1)
    assert "already used" not in text(result) and "test_conformance" not in text(result)


def test_two_engines_never_collide_in_junit_and_engine_options_arrive_typed(repo):
    """Reference and a module:Class wrapper of it that starts only when -O marker=7 arrives as the int 7."""
    first = run_in_repo(repo, "-q", "--ddtree-engine", "reference", *FAST, "--ddtree-no-isolate", "--junitxml", "a.xml")
    assert first.ret == 0, text(first)
    second = run_in_repo(
        repo,
        "-q",
        "--ddtree-engine",
        "my_engine:Wrapped",
        *FAST,
        "--ddtree-no-isolate",
        "--ddtree-engine-option",
        "marker=7",
        "--junitxml",
        "b.xml",
    )
    assert second.ret == 0, text(second)
    assert set(junit_cases(repo.path / "a.xml")) == {f"ddtree.reference-float32-fixture::{REFERENCE_ID}"}
    assert set(junit_cases(repo.path / "b.xml")) == {f"ddtree.my_engine_Wrapped-float32-fixture::{WRAPPED_ID}"}


def test_engine_options_reach_the_engine_and_bad_ones_fail_naming_it(repo):
    missing = run_in_repo(repo, "-q", "--ddtree-engine", "my_engine:Wrapped", *FAST, "--ddtree-no-isolate")
    assert missing.ret == 1 and "option marker must be 7, got None" in text(missing), text(missing)
    bogus = run_in_repo(
        repo,
        "-q",
        "--ddtree-engine",
        "my_engine:Wrapped",
        *FAST,
        "--ddtree-no-isolate",
        "--ddtree-engine-option",
        "marker=7",
        "--ddtree-engine-option",
        "cuda_graphs=bogus",
    )
    assert bogus.ret == 1, text(bogus)
    assert "cuda_graphs must be 'on' or 'off'" in text(bogus) and "got 'bogus'" in text(bogus)


def test_node_ids_carry_engine_dtype_and_pair(repo):
    result = run_in_repo(
        repo,
        "--collect-only",
        "-q",
        "--ddtree-engine",
        "my_engine:Wrapped",
        "--ddtree-dtype",
        "bfloat16",
        "--ddtree-pair-name",
        "mine",
        "--ddtree-check",
        "lossless/dflash",
    )
    assert result.ret == 0, text(result)
    ids = [line.split("::", 1)[1] for line in result.stdout.lines if "::test_conformance[" in line]
    (item,) = ids  # test_conformance[<engine>-<dtype>-<pair>|<check>]
    assert item.startswith("test_conformance[") and item.endswith("]"), text(result)
    assert item[len("test_conformance[") : -1].split("-") == ["my_engine_Wrapped", "bfloat16", "mine|lossless/dflash"]


@pytest.fixture
def nothing_selected(repo):
    return run_in_repo(repo, "-q", "--ddtree-engine", "reference", "--ddtree-check", "nosuch")


def test_a_check_filter_that_keeps_nothing_is_a_usage_error_naming_the_option(nothing_selected):
    result = nothing_selected
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text(result)
    assert "--ddtree-check nosuch keeps none" in text(result)
    assert "Traceback" not in text(result) and "pytest_generate_tests" not in text(result)
    from ddtree_conformance.option_names import option

    assert option("checks") == "--check"  # the plugin's spelling ended with its (in-process) run


def test_a_check_filter_that_keeps_nothing_fails_the_run(nothing_selected):
    """Whatever the form of the error, an empty selection never passes and never runs nothing silently."""
    result = nothing_selected
    assert result.ret not in (0, pytest.ExitCode.NO_TESTS_COLLECTED), text(result)
    assert "nosuch keeps none" in text(result)


def test_cli_check_filter_that_keeps_nothing_is_a_usage_error(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ddtree_conformance.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["check", "--check", "nosuch"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --check nosuch keeps none of the"), result.stderr
    assert "lossless" in lines[0]  # it lists what could be selected
    assert not (tmp_path / "reports").exists()  # nothing ran


def test_every_family_selected_by_substring_keeps_checks():
    """Each check family's name, and each mode/budget/variant suffix, selects a non-empty plan."""
    from ddtree_conformance.checks import plan
    from ddtree_conformance.settings import SettingsError, build_settings

    settings, _ = build_settings({"budgets": "16,64"})
    full = plan(settings)
    families = sorted({c.id.split("/")[0] for c in full})
    assert len(families) >= 10
    for needle in [*families, "ddtree-B16", "ddtree-B64", "dflash", "top_k"]:
        kept = plan(settings, only=[needle])
        assert kept and all(needle in c.id for c in kept), needle
    with pytest.raises(SettingsError, match="keeps none"):
        plan(settings, only=["nosuch"])


def test_a_prompt_past_the_vocabulary_is_a_usage_error_before_any_engine_work(repo):
    prompts = repo.path / "bad.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 2]}\n{"id": "b", "prompt_ids": [99999]}\n')
    result = run_in_repo(repo, "-q", "--ddtree-engine", "reference", f"--ddtree-prompts={prompts}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text(result)
    assert f"{prompts}:2: field 'prompt_ids'" in text(result) and "outside the vocabulary" in text(result)
    assert "Traceback" not in text(result)


def test_the_run_says_which_test_paths_it_collected(repo):
    """`pytest --ddtree-engine X` without paths runs only the suite, and says so; with paths, both run."""
    alone = run_in_repo(
        repo, "--collect-only", "-q", "--ddtree-engine", "reference", "--ddtree-check", "lossless/dflash"
    )
    assert alone.ret == 0, text(alone)
    assert "ddtree-conformance: 1 conformance item(s) for " in text(alone), text(alone)  # the count
    assert "for engine 'reference' from the packaged suite" in text(alone)
    assert "no test paths given, so only the conformance suite runs" in text(alone)
    assert "pytest tests --ddtree-engine reference" in text(alone)
    both = run_in_repo(
        repo, "--collect-only", "-q", "tests", *OWN, "--ddtree-engine", "reference", "--ddtree-check", "lossless/dflash"
    )
    assert both.ret == 0, text(both)
    assert "ddtree-conformance: and 1 item(s) of your own tests" in text(both), text(both)  # the count
    assert any(line.endswith("own tests from: tests") for line in text(both).splitlines())  # the paths, all
    assert "test_own_options" in text(both)
