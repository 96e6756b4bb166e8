"""``ddtree-conformance ci`` end to end, from a second git repository standing in for an engine's, run
the way its CI runs it: the reusable GitHub workflow's step (its environment, its one command) and the
Buildkite example's command, each in a fresh process. Tiny random pair, one prompt, few checks.

* the reference engine (its decode clock injected), A/B against itself: PASS, exit 0, job summary and
  step outputs written;
* an engine without DDTree: INCOMPLETE, exit 7, "DDTree not available in this engine" in the summary
  and in the Buildkite annotation, never a green job;
* a slower build under A/B (its injected decode clock runs four times the baseline's): the gate fails
  the job (exit 1), naming the A/B ratio.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "conformance.yml"
BUILDKITE = ROOT / "docs" / "examples" / "buildkite-pipeline.yml"
BIN = Path(sys.executable).parent

ENGINES = '''
"""The engine repository's own engines: the reference engine reporting an injected decode clock of
20 us x CLOCK_SCALE per round (under the wall clock the bench checks it against), so A/B verdicts here
come from the injected times, not from this machine's load."""
from ddtree_conformance.adapters.reference.engine import ReferenceEngine


class Clocked(ReferenceEngine):
    name = "clocked"
    CLOCK_SCALE = 1.0

    def generate(self, requests, config):
        out = []
        for r in super().generate(requests, config):
            seconds = 2e-5 * self.CLOCK_SCALE * max(1, r.rounds or len(r.output_ids))
            timings = r.timings.model_copy(update={"decode": seconds, "stages": {"round_wall": seconds}})
            out.append(r.model_copy(update={"timings": timings}))
        return out


class Fast(Clocked):
    """The baseline build: a quarter of the candidate's decode time."""
    CLOCK_SCALE = 0.25
'''


def ci_job(reports: Path) -> tuple[dict, dict[str, dict]]:
    """The job ``ci`` wrote (``ci.json``) and its steps by name."""
    job = json.loads((reports / "ci.json").read_text())
    return job, {step["name"]: step for step in job["steps"]}


@pytest.fixture(scope="module")
def engine_repo(tmp_path_factory):
    """A git repository of an engine team: its engines module, committed; plus the tiny pair and prompts."""
    from ddtree_conformance.testing.random_pair import write_random_pair

    root = tmp_path_factory.mktemp("engine-repo")
    (root / "ci_engines.py").write_text(ENGINES)
    for args in (
        ["init", "-q"],
        ["add", "ci_engines.py"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "engine"],
    ):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    data = tmp_path_factory.mktemp("ci-data")
    target, drafter = write_random_pair(data / "pair")
    prompts = data / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "category": "math", "prompt_ids": [1, 2, 3, 4]}) + "\n")
    # what a real run takes from the pair; small: one prompt, 8 tokens, B=4, two check families
    small = {
        "DDTREE_MODEL": str(target),
        "DDTREE_DRAFTER": str(drafter),
        "DDTREE_PROMPTS": str(prompts),
        "DDTREE_MAX_NEW_TOKENS": "8",
        "DDTREE_ISOLATE": "false",
        "DDTREE_MAX_REPEATS": "3",
        "DDTREE_TIME_BUDGET": "60",
    }
    return root, small


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDTREE_", "GITHUB_", "BUILDKITE", "PYTEST_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def workflow_step_env(inputs: dict[str, str], runner_temp: Path) -> tuple[dict[str, str], str]:
    """The ci step's environment as GitHub would set it from these inputs (job env + step env), and its
    script. Only plain ``${{ inputs.x }}`` values are substituted; the rest is set as the expressions say."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    declared = workflow[True]["workflow_call"]["inputs"]
    values = {name: str(spec.get("default", "")) for name, spec in declared.items()}
    values.update(inputs)
    job = workflow["jobs"]["conformance"]
    (step,) = [s for s in job["steps"] if s.get("id") == "ci"]
    env = {}
    for key, value in {**job["env"], **step.get("env", {})}.items():
        text = str(value)
        for name, given in values.items():
            text = text.replace(f"${{{{ inputs.{name} }}}}", given)
        if "${{" not in text:
            env[key] = text
    env["DDTREE_REPORTS"] = str(runner_temp / "ddtree-reports")  # ${{ runner.temp }}/ddtree-reports
    return env, step["run"]


def run_workflow_step(repo: Path, small: dict, inputs: dict[str, str], tmp: Path) -> subprocess.CompletedProcess:
    env, script = workflow_step_env(inputs, tmp)
    venv_bin = tmp / "ddtree-venv" / "bin"  # the venv the install steps made: this one
    venv_bin.parent.mkdir(parents=True, exist_ok=True)
    venv_bin.symlink_to(BIN)
    github = {
        "RUNNER_TEMP": str(tmp),
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "GITHUB_OUTPUT": str(tmp / "output"),
    }
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=repo,
        env=clean_env(**{**env, **small, **github}),
        capture_output=True,
        text=True,
        timeout=600,
    )


def buildkite_command(repo: Path, small: dict, overrides: dict[str, str], tmp: Path) -> subprocess.CompletedProcess:
    pipeline = yaml.safe_load(BUILDKITE.read_text())
    (step,) = pipeline["steps"]
    commands = step["command"]
    # the install lines need the network: checked here, replaced by this environment's venv
    assert commands[:3] == [
        "python3 -m venv .ddtree-venv",
        ".ddtree-venv/bin/python -m pip install -q --upgrade pip",
        '.ddtree-venv/bin/python -m pip install -q "$$DDTREE_SUITE"',
    ]
    assert "ddtree-conformance[gpu] @ git+https://github.com/" in pipeline["env"]["DDTREE_SUITE"]
    (repo / ".ddtree-venv").symlink_to(BIN.parent, target_is_directory=True)
    agent = tmp / "agent-bin"
    agent.mkdir()
    (agent / "buildkite-agent").write_text(
        f'#!/bin/bash\necho "$*" > "{tmp}/annotate-args"\ncat > "{tmp}/annotation"\n'
    )
    (agent / "buildkite-agent").chmod(0o755)
    env = clean_env(**{**{k: str(v) for k, v in pipeline["env"].items()}, **small, **overrides, "BUILDKITE": "true"})
    env["PATH"] = f"{agent}{os.pathsep}{env['PATH']}"
    try:
        return subprocess.run(shlex.split(commands[-1]), cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    finally:
        (repo / ".ddtree-venv").unlink()


def test_the_reference_passes_as_the_github_workflow_runs_it(engine_repo, tmp_path):
    repo, small = engine_repo
    proc = run_workflow_step(
        repo,
        small,
        {
            "engine": "ci_engines:Clocked",
            "baseline-engine-requirement": "ci_engines:Clocked",
            "device": "cpu",
            "dtype": "float32",
            "modes": "ddtree",
            "budgets": "4",
            "limit": "1",
            "checks": "lossless\ntree-structure",
        },
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (tmp_path / "summary.md").read_text()
    job, steps = ci_job(tmp_path / "ddtree-reports")
    assert job["code"] == 0 and job["title"] == "ci_engines:Clocked on fixture (float32, gpu-h200)", job
    assert summary.startswith("## DDTree conformance: PASS: ci_engines:Clocked")
    assert "A/B" in summary and steps["gate"]["code"] == 0
    outputs = dict(line.split("=", 1) for line in (tmp_path / "output").read_text().splitlines())
    assert outputs["exit-code"] == "0" and outputs["artifact"].startswith("ddtree-conformance-ci_engines_Clocked-")
    reports = tmp_path / "ddtree-reports"
    assert {p.name for p in reports.iterdir()} >= {
        "check.json",
        "check.md",
        "check.html",
        "junit.xml",
        "ab.json",
        "gate.json",
        "summary.md",
        "ci.json",
        "environment.txt",
    }
    cases = list(ET.parse(reports / "junit.xml").getroot().iter("testcase"))
    assert [c.get("name") for c in cases] == ["lossless/ddtree-B4", "tree-structure/ddtree-B4"]
    assert "::error" not in proc.stdout


def test_an_engine_without_ddtree_is_incomplete_as_buildkite_runs_it(engine_repo, tmp_path):
    repo, small = engine_repo
    proc = buildkite_command(
        repo,
        small,
        {
            "DDTREE_ENGINE": "ddtree_conformance.testing.coverage_engines:NoDDTree",
            "DDTREE_ENGINE_VERSION": "",
            "DDTREE_PAIR": "",
            "DDTREE_DEVICE": "cpu",
            "DDTREE_DTYPE": "float32",
            "DDTREE_MODES": "ddtree",
            "DDTREE_BUDGETS": "4",
            "DDTREE_LIMIT": "1",
            "DDTREE_GATE": "off",
            "DDTREE_REPORTS": str(tmp_path / "reports"),
        },
        tmp_path,
    )
    assert proc.returncode == 7, proc.stdout[-3000:] + proc.stderr[-3000:]
    job, steps = ci_job(tmp_path / "reports")
    assert job["code"] == 7 and job["decided_by"] == "conformance", job
    assert steps["conformance"]["summary"].startswith("INCOMPLETE: DDTree not available in this engine"), steps
    assert f"ci: FAILED: conformance: {steps['conformance']['summary']} (exit 7)" in proc.stdout
    annotation = (tmp_path / "annotation").read_text()
    assert (
        annotation.startswith("## DDTree conformance: INCOMPLETE")
        and "DDTree not available in this engine" in annotation
    )
    assert (tmp_path / "annotate-args").read_text().split() == [
        "annotate",
        "--style",
        "warning",
        "--context",
        "ddtree-conformance",
    ]


def test_a_slower_build_under_ab_fails_the_job(engine_repo, tmp_path, monkeypatch):
    """In this process (CliRunner), from the engine repository: candidate ci_engines:Clocked against the
    baseline ci_engines:Fast, whose injected decode clock runs at a quarter of the candidate's. Stored
    baselines exist for the hardware class too: a baseline build given, A/B is the gate."""
    from ddtree_conformance.baselines import BaselineFile, write_baselines
    from ddtree_conformance.cli import app

    repo, small = engine_repo
    for key, value in small.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo)
    write_baselines(tmp_path / "stored" / "test-ab-hw.json", BaselineFile())
    monkeypatch.setenv("DDTREE_BASELINES", str(tmp_path / "stored"))
    monkeypatch.setenv("DDTREE_HARDWARE_CLASS", "test-ab-hw")
    result = CliRunner().invoke(
        app,
        [
            "ci",
            "--engine",
            "ci_engines:Clocked",
            "--against",
            "ci_engines:Fast",
            "--ab-spread",  # a measured between-process spread (the workflow's ab-spread, $DDTREE_AB_SPREAD)
            "0.02:12",
            "--device",
            "cpu",
            "--modes",
            "ddtree",
            "--budgets",
            "4",
            "--limit",
            "1",
            "--check",
            "lossless",
            "--reports",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 1, result.output
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert summary.startswith("## DDTree conformance: FAIL")
    assert "conformance | 0 | PASS" in summary  # the slower build is conformant: only the throughput fails it
    # bench exits 1 on its FAIL verdict alone; in ci the bench step stays 0 and the gate step judges it
    _, steps = ci_job(tmp_path / "r")
    bench, gate = steps["bench"], steps["gate"]
    assert bench["code"] == 0 and bench["summary"].startswith("A/B against ci_engines:Fast (interleaved"), bench
    assert bench["summary"].endswith("wrote ab.json"), bench
    assert gate["code"] == 1 and gate["summary"].startswith("REGRESSION: ddtree-B4 A/B ratio fail"), gate
    assert "candidate slower than the baseline" in gate["summary"], gate
    assert (tmp_path / "r" / "ab.json").is_file() and not (tmp_path / "r" / "bench.json").exists()
    (run,) = json.loads((tmp_path / "r" / "ab.json").read_text())["runs"]
    assert run["ab"]["spread"] == {"log_var": pytest.approx(0.02**2), "df": 12}, run["ab"]  # it reached the bench


def test_gate_auto_gates_exactly_what_has_a_baseline(engine_repo, tmp_path, monkeypatch):
    """Issue 31: the hardware class has a stored baselines file, but it holds nothing for this engine, then
    only some of its runs and metrics. `--gate auto` gates the rows that have a baseline and names the rest,
    "not gated", with the reason, exit 0; a regression in a gated row still fails; `--gate required` fails
    on the missing baseline (exit 4). Before: exit 4 ("MISSING BASELINE: ddtree-B4 all missing: no baseline
    for (...)") under auto too. Tau only: the speedup rows here have no baseline, so no timing of this
    machine decides anything."""
    from ddtree_conformance.baselines import BaselineFile, entries_from_report, load_baselines, write_baselines
    from ddtree_conformance.cli import app

    repo, small = engine_repo
    for key, value in small.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo)
    hw, engine = "test-auto-hw", "ci_engines:Clocked"
    stored = tmp_path / "stored" / f"{hw}.json"
    monkeypatch.setenv("DDTREE_BASELINES", str(stored.parent))
    monkeypatch.setenv("DDTREE_HARDWARE_CLASS", hw)

    def ci(reports: str, *extra: str):
        args = ["ci", "--engine", engine, "--device", "cpu", "--modes", "ddtree", "--budgets", "4,8", "--limit", "1"]
        result = CliRunner().invoke(app, [*args, "--check", "lossless", "--reports", str(tmp_path / reports), *extra])
        summary = (tmp_path / reports / "summary.md").read_text()
        gate = json.loads((tmp_path / reports / "gate.json").read_text())
        return result, " ".join(summary.split()), {(r["run"], r["metric"]): r["status"] for r in gate["rows"]}

    # 1. the file holds another engine's baselines only
    other = json.loads((ROOT / "golden" / "baselines" / "cpu-x86_64-2c.json").read_text())["entries"][0]
    write_baselines(stored, BaselineFile(entries=[{**other, "hardware_class": hw}]))
    result, summary, rows = ci("r1")
    assert result.exit_code == 0, result.output
    pair = json.loads((tmp_path / "r1" / "bench.json").read_text())["settings"]["pair_name"]
    assert rows == {("ddtree-B4", "all"): "not gated", ("ddtree-B8", "all"): "not gated"}
    gate = ci_job(tmp_path / "r1")[1]["gate"]
    nothing, not_gated = gate["summary"].split("; not gated: ")
    assert gate["code"] == 0 and nothing.startswith("NOTHING GATED (no stored baseline"), gate
    assert nothing.endswith("--gate auto)"), gate
    missing = [f"ddtree-B{b} (no baseline for ({hw}, {engine}, {pair}, ddtree, {b}))" for b in (4, 8)]
    advice = f"`ddtree-conformance baseline {tmp_path / 'r1' / 'bench.json'} --baselines DIR`"
    assert not_gated.split("; ")[:2] == missing and not_gated.split("; ")[2].startswith(advice), gate

    # 2. it holds ddtree-B4's tau (no speedup), recorded from that bench: that is gated
    report = json.loads((tmp_path / "r1" / "bench.json").read_text())
    (b4,) = [e for e in entries_from_report(report, hw_class=hw) if e.budget == 4]
    kept = load_baselines(stored).entries + [b4.model_copy(update={"speedup": None})]
    write_baselines(stored, BaselineFile(entries=kept), update=True)
    result, summary, rows = ci("r2")
    assert result.exit_code == 0, result.output
    assert rows == {
        ("ddtree-B4", "tau"): "pass",  # the random pair accepts no drafts: no per-position floors to gate
        ("ddtree-B4", "speedup"): "not gated",
        ("ddtree-B8", "all"): "not gated",
    }
    gate = ci_job(tmp_path / "r2")[1]["gate"]
    passed, not_gated = gate["summary"].split("; not gated: ")
    assert gate["code"] == 0 and passed == "PASS (1 row gated)", gate
    assert not_gated.split("; ")[:2] == [
        "ddtree-B4 speedup (baseline has no speedup for this run)",
        f"ddtree-B8 (no baseline for ({hw}, {engine}, {pair}, ddtree, 8))",
    ], gate
    assert "ci: passed" in result.stdout

    # 3. a gated row that regresses still fails under auto (the gate, as ci runs it, on that bench report)
    raised = b4.model_copy(update={"speedup": None, "tau": b4.tau.model_copy(update={"value": b4.tau.value + 1})})
    write_baselines(stored, BaselineFile(entries=[raised]), update=True)
    gated = CliRunner().invoke(
        app, ["gate", str(tmp_path / "r2" / "bench.json"), "--baselines", str(stored), "--only-baselined"]
    )
    assert gated.exit_code == 1 and "gate REGRESSION (exit 1): 1 fail, 2 not gated" in gated.stdout

    # 4. --gate required: the same file fails the job on what has no baseline
    write_baselines(stored, BaselineFile(entries=kept), update=True)
    result, summary, rows = ci("r3", "--gate", "required")
    assert result.exit_code == 4, result.output
    assert rows[("ddtree-B8", "all")] == rows[("ddtree-B4", "speedup")] == "missing"
    gate = ci_job(tmp_path / "r3")[1]["gate"]
    assert gate["code"] == 4 and gate["summary"].startswith("MISSING BASELINE: ddtree-B4 speedup missing"), gate


def test_ci_refuses_bad_options(tmp_path):
    from ddtree_conformance.cli import app

    result = CliRunner().invoke(app, ["ci", "--limit", "0", "--reports", str(tmp_path)])
    assert result.exit_code == 2 and "--limit must be a positive number of prompts or 'all'" in result.stderr
    result = CliRunner().invoke(app, ["ci", "--gate", "sometimes", "--reports", str(tmp_path)])
    assert result.exit_code == 2 and "--gate must be one of auto, required, off" in result.stderr
    # a malformed --ab-spread stops the job before the install and the checks, naming the option and its variable
    result = CliRunner().invoke(app, ["ci", "--ab-spread", "0.02", "--reports", str(tmp_path)])
    assert result.exit_code == 2 and "--ab-spread must be SD:DF" in result.stderr, result.output
    assert "DDTREE_AB_SPREAD" in result.stderr
    # one without a baseline build is not used, and the log says so (here the bad --gate then stops the job)
    result = CliRunner().invoke(
        app, ["ci", "--ab-spread", "0.02:12", "--gate", "sometimes", "--reports", str(tmp_path)]
    )
    assert result.exit_code == 2 and "--ab-spread is not used" in result.output, result.output
    # the bench refuses it without --against, before any engine starts
    small = ["--modes", "ddtree", "--budgets", "4", "--limit", "1", "--max-new-tokens", "4", "--max-repeats", "3"]
    result = CliRunner().invoke(app, ["bench", "--ab-spread", "0.02:12", *small, "--out", str(tmp_path / "b.json")])
    assert result.exit_code == 2 and "--ab-spread is the A/B interval's" in result.stderr, result.output


def test_a_spread_from_the_environment_does_not_stop_a_stored_baseline_bench(tmp_path, monkeypatch):
    """The reusable workflow sets $DDTREE_AB_SPREAD for the whole job, and `ci` runs `bench` in its own process,
    which reads it too: a job without a baseline build benches against the stored baselines, and the spread
    (meant for an A/B interval) is noted and left unused there, not an error that fails the bench step."""
    from ddtree_conformance.cli import app

    monkeypatch.setenv("DDTREE_AB_SPREAD", "0.02:12")
    small = ["--modes", "ddtree", "--budgets", "4", "--limit", "1", "--max-new-tokens", "4", "--max-repeats", "3"]
    result = CliRunner().invoke(app, ["bench", *small, "--out", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    assert "$DDTREE_AB_SPREAD is not used" in result.stderr and (tmp_path / "b.json").is_file()


def test_a_malformed_spread_from_the_environment_is_one_error_naming_the_variable(tmp_path, monkeypatch):
    """Unused or not, a malformed $DDTREE_AB_SPREAD stops the bench before it runs, naming the variable."""
    from ddtree_conformance.cli import app

    monkeypatch.setenv("DDTREE_AB_SPREAD", "0.02")
    for against in ([], ["--against", "reference"]):
        result = CliRunner().invoke(app, ["bench", "--limit", "1", *against, "--out", str(tmp_path / "b.json")])
        assert result.exit_code == 2, result.output
        assert "--ab-spread must be SD:DF" in result.stderr and "(from $DDTREE_AB_SPREAD)" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "b.json").exists()


def test_junit_from_a_check_report_marks_an_incomplete_run():
    from ddtree_conformance.cli.ci import junit_from_report

    report = {
        "settings": {"engine": "x:Y", "dtype": "float32", "pair_name": "fixture"},
        "counts": {"pass": 1, "fail": 0, "skip": 1},
        "results": [
            {"check": "lossless/ddtree-B4", "status": "pass", "message": ""},
            {"check": "acceptance/ddtree-B4", "status": "skip", "message": "no acceptance data"},
        ],
        "verdict": {"status": "incomplete", "reason": "acceptance did not run"},
    }
    root = ET.fromstring(junit_from_report(report))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["acceptance/ddtree-B4"].find("skipped").get("message") == "no acceptance data"
    assert cases["coverage"].find("failure").get("message") == "incomplete: acceptance did not run"
    assert {c.get("classname") for c in cases.values()} == {"ddtree.x_Y-float32-fixture"}


def test_a_step_that_fails_takes_its_error_as_summary(capsys):
    """A step's summary is the error its command failed with (a typed exit, CommandFailed), not a line read
    back from stderr; the line is still printed once."""
    from ddtree_conformance.cli.base import EXIT_USAGE
    from ddtree_conformance.cli.ci import _suite

    step = _suite("conformance", "check", "--engine", "no_such_engine_here")
    assert (step.name, step.code) == ("conformance", EXIT_USAGE)
    assert "no_such_engine_here" in step.summary and not step.summary.startswith("error:")
    assert capsys.readouterr().err.count(f"error: {step.summary}\n") == 1
