"""An engine team's first hour, as a test (issue 31): from a folder outside the repository, the engine of
docs/guides/your-engine.md, written out from the guide's own code blocks (so the guide and this test
cannot drift), runs through the guide's own command lines: `check`, the pytest route and `ci`, each in a
fresh process as a user runs them, on CPU, exit 0. The same engine without traces passes with the
documented `--allow-skip` lines, which are exactly what its incomplete message advises, and `ci` takes the
CI guide's `allow-skip` list under `--modes dflash` too (a family it does not plan is a note).

Before: the guide's engine ended INCOMPLETE (exit 7) on CPU ("cuda-graphs did not run on 2 check(s) (engine
cannot switch CUDA graphs per run ...)") in `check` and the pytest route, and `--allow-skip branch-vs-chain`
(the advice for an engine without traces) was a usage error under `--modes dflash`. The guide's `ci` line
needed `--gate off`: on a 2-core x86_64 machine, whose hardware class has a stored baselines file holding
only the reference engine, `--gate auto` failed the job with exit 4 ("MISSING BASELINE: ddtree-B16 all
missing: no baseline for (cpu-x86_64-2c, my_engine:MyEngine, fixture, ddtree, 16)"); now it benches and
gates nothing, saying so (the test pins that hardware class, so it meets the stored file on any machine).

Each command runs with the smallest plan that still exercises its route: the guide's line, then
`--limit 1 --max-new-tokens 8 --modes ddtree` (a later value wins). The first `check` runs every family
with the engine in its own process, as the guide's line does; the other runs keep the families their
point needs (the ones a CPU run cannot apply, the tree checks an engine without traces skips, lossless)
and run the engine in process (`--no-isolate`), which spares a start of torch and the models each.

In CI: the guide's `check` and pytest lines for both engines, and the advice/allow-skip round trip through
`check`. Nightly (the thorough tier, to keep CI inside 12 minutes): the guide's `ci` line and the no-traces
engine under pytest and `ci` (tests/test_ci.py runs the `ci` command itself in CI).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "guides" / "your-engine.md").read_text()
CI_GUIDE = (ROOT / "docs" / "guides" / "ci.md").read_text()
BIN = Path(sys.executable).parent
SMALL = ["--limit", "1", "--max-new-tokens", "8"]
CPU_FAMILIES = ["lossless", "cuda-graphs", "tensor-parallel"]  # what a CPU run cannot apply, and a verdict
TREE_FAMILIES = ["lossless", "tree-structure", "branch-vs-chain", "cuda-graphs"]  # what an engine without traces hides


def only(families: list[str], flag: str = "--check") -> list[str]:
    return [a for family in families for a in (flag, family)]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE, flags=re.S)


def guide_commands(start: str) -> list[list[str]]:
    """The guide's indented command lines that start with ``start``, as argument lists."""
    return [shlex.split(line.strip()) for line in GUIDE.splitlines() if line.startswith("    " + start)]


def documented(start: str, engine: str) -> list[str]:
    (found,) = [c for c in guide_commands(start) if any(engine in a for a in c)]
    return found


def allow_skips(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a.endswith("allow-skip")]


def ci_allow_skip_list() -> list[str]:
    """The CI guide's ``allow-skip: |`` example, one family per line."""
    lines = CI_GUIDE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "allow-skip: |")
    indent = len(lines[start]) - len(lines[start].lstrip())
    names = []
    for line in lines[start + 1 :]:
        if not line.strip() or len(line) - len(line.lstrip()) <= indent:
            break
        names.append(line.strip())
    return names


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder outside the repository holding the guide's two engines, as the guide says to save them."""
    root = tmp_path_factory.mktemp("my-engine-repo")
    assert ROOT not in root.parents
    blocks = python_blocks()
    (root / "my_engine.py").write_text(blocks[0])
    (no_traces,) = [b for b in blocks if "class MyEngineNoTraces" in b]
    (root / "my_engine_no_traces.py").write_text(no_traces)
    return root


def run(folder: Path, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """A documented command in a fresh process, from ``folder``, with this environment's executables."""
    program = str(BIN / args[0]) if (BIN / args[0]).exists() else args[0]
    full_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([program, *args[1:]], cwd=folder, capture_output=True, text=True, env=full_env, timeout=900)


def test_the_guide_documents_every_route_and_its_allow_skip_lines(monkeypatch):
    """Cheap, in the default tier: the blocks and lines the slow test runs are there and well-formed."""
    blocks = python_blocks()
    assert "class MyEngine(Engine)" in blocks[0] and any("class MyEngineNoTraces" in b for b in blocks)
    for block in blocks[:1] + [b for b in blocks if "MyEngineNoTraces" in b]:
        compile(block, "guide", "exec")
    assert documented("ddtree-conformance check", "my_engine:MyEngine")
    assert documented("pytest --ddtree-engine", "my_engine:MyEngine")
    assert "--gate" not in " ".join(documented("ddtree-conformance ci", "my_engine:MyEngine"))  # auto: the default
    check = documented("ddtree-conformance check", "my_engine_no_traces:MyEngineNoTraces")
    under_pytest = documented("pytest --ddtree-engine", "my_engine_no_traces:MyEngineNoTraces")
    assert (
        allow_skips(check) == allow_skips(under_pytest) == ci_allow_skip_list() == ["tree-structure", "branch-vs-chain"]
    )
    from ddtree_conformance.coverage import check_allow_skip
    from ddtree_conformance.settings import SuiteSettings

    assert check_allow_skip(SuiteSettings(allow_skip=allow_skips(check), modes=["dflash"])) == [
        "branch-vs-chain is not planned for --modes dflash"
    ]
    from ddtree_conformance.cli.ci_options import listed

    monkeypatch.setenv("DDTREE_ALLOW_SKIP", "\n".join(ci_allow_skip_list()))  # the CI guide's list, one per line
    assert listed(None, "DDTREE_ALLOW_SKIP") == allow_skips(check)


@pytest.mark.slow
def test_the_guides_engine_passes_check_and_pytest_on_cpu(folder):
    out = folder / "reports-check"
    guide_line = documented("ddtree-conformance check", "my_engine:MyEngine")
    check = run(folder, [*guide_line, *SMALL, "--modes", "ddtree", "--out", f"{out}/"])  # every family, isolated
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    (report_path,) = out.glob("check-*.json")
    report = json.loads(report_path.read_text())
    assert report["verdict"]["status"] == "pass" and report["engine"]["name"] == "my-engine"
    families = {f["family"]: f for f in report["coverage"]["families"]}
    assert families["cuda-graphs"]["status"] == families["tensor-parallel"]["status"] == "not applicable"
    assert "not applicable on this run (cuda-graphs, tensor-parallel)" in report["verdict"]["reason"]
    assert "insufficient evidence" in families["sampling"]["notes"][0]  # --limit 1: too few sampled transitions

    under_pytest = run(
        folder,
        [
            *documented("pytest --ddtree-engine", "my_engine:MyEngine"),
            "--ddtree-limit",
            "1",
            "--ddtree-max-new-tokens",
            "8",
            "--ddtree-modes",
            "ddtree",
            *only(CPU_FAMILIES, "--ddtree-check"),
            "--ddtree-no-isolate",
            "--ddtree-report",
            str(folder / "pytest" / "check.json"),
            "-p",
            "no:cacheprovider",
            "-q",
        ],
    )
    assert under_pytest.returncode == 0, under_pytest.stdout[-3000:] + under_pytest.stderr[-3000:]
    assert "PASS: " in under_pytest.stdout and "not applicable on this run" in under_pytest.stdout


@pytest.mark.thorough  # nightly: the guide's `ci` line (check and pytest above stay in CI; tests/test_ci.py runs `ci`)
def test_the_guides_engine_passes_the_ci_command_on_cpu(folder):
    ci = run(
        folder,
        [
            *documented("ddtree-conformance ci", "my_engine:MyEngine"),
            *SMALL,
            "--modes",
            "ddtree",
            *only(CPU_FAMILIES),
            "--no-isolate",
            "--reports",
            str(folder / "ci"),
        ],
        env={"DDTREE_HARDWARE_CLASS": "cpu-x86_64-2c"},  # the class whose stored file holds the reference engine only
    )
    assert ci.returncode == 0, ci.stdout[-3000:] + ci.stderr[-3000:]
    summary = " ".join((folder / "ci" / "summary.md").read_text().split())
    assert "conformance | 0 | PASS" in summary and "not applicable on this run" in summary
    assert "| gate | 0 | NOTHING GATED " in summary  # the summary's wording: tests/test_ci.py
    gate = json.loads((folder / "ci" / "gate.json").read_text())
    hw, engine = "cpu-x86_64-2c", "my_engine:MyEngine"
    assert [(r["run"], r["metric"], r["status"], r["message"]) for r in gate["rows"]] == [
        ("ddtree-B16", "all", "not gated", f"no baseline for ({hw}, {engine}, fixture, ddtree, 16)")
    ]


@pytest.mark.slow
def test_without_traces_the_documented_allow_skip_lines_pass(folder):
    engine = "my_engine_no_traces:MyEngineNoTraces"
    check = documented("ddtree-conformance check", engine)
    documented_skips = allow_skips(check)
    without = [a for i, a in enumerate(check) if not (a == "--allow-skip" or check[i - 1] == "--allow-skip")]
    ddtree = [*SMALL, "--modes", "ddtree", *only(TREE_FAMILIES), "--no-isolate"]

    first = run(folder, [*without, *ddtree, "--out", str(folder / "nt" / "first.json")])
    assert first.returncode == 7, first.stdout[-3000:] + first.stderr[-3000:]
    advice = re.search(r"opt out with ((?:--allow-skip \S+ ?)+)", " ".join(first.stderr.split()))
    assert advice and allow_skips(advice.group(1).split()) == documented_skips, first.stderr[-2000:]

    again = run(folder, [*check, *ddtree, "--out", str(folder / "nt" / "check.json")])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    report = json.loads((folder / "nt" / "check.json").read_text())
    assert report["verdict"]["status"] == "pass"
    assert [g["family"] for g in report["coverage"]["allowed"]] == documented_skips


@pytest.mark.thorough  # nightly: the same lines under pytest and `ci` (the `check` runs above stay in CI)
def test_without_traces_the_documented_allow_skip_lines_pass_under_pytest_and_ci(folder):
    engine = "my_engine_no_traces:MyEngineNoTraces"
    under_pytest = run(
        folder,
        [
            *documented("pytest --ddtree-engine", engine),
            "--ddtree-limit",
            "1",
            "--ddtree-max-new-tokens",
            "8",
            "--ddtree-modes",
            "ddtree",
            *only(TREE_FAMILIES, "--ddtree-check"),
            "--ddtree-no-isolate",
            "--ddtree-report",
            str(folder / "nt" / "pytest.json"),
            "-p",
            "no:cacheprovider",
            "-q",
        ],
    )
    assert under_pytest.returncode == 0, under_pytest.stdout[-3000:] + under_pytest.stderr[-3000:]

    ci = run(  # the CI guide's list, one per line, under --modes dflash: branch-vs-chain is a note there
        folder,
        ["ddtree-conformance", "ci", "--engine", engine, *SMALL, "--modes", "dflash", "--gate", "off"]
        + [*only(TREE_FAMILIES), "--no-isolate", "--reports", str(folder / "nt-ci")],
        env={"DDTREE_ALLOW_SKIP": "\n".join(ci_allow_skip_list())},
    )
    assert ci.returncode == 0, ci.stdout[-3000:] + ci.stderr[-3000:]
    assert "note: --allow-skip branch-vs-chain is not planned" in ci.stderr  # the note's wording: test_coverage
