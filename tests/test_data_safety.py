"""Nothing the suite reads is ever overwritten by a run, and no run leaves anything behind: reports go
where --out says (inside a folder, never onto a golden, model, prompts, pairs or calibration file),
record --update never drops data silently, concurrent writers take turns, paths are fixed before the
engine starts, and the engine's whole process tree ends with the run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from ddtree_conformance.cli import app
from ddtree_conformance.testing.misbehaving import CATALOGUE
from ddtree_conformance.testing.processes import pid_alive

pytest_plugins = ["pytester"]

WRITER = textwrap.dedent("""
    import sys
    from ddtree_conformance.files import atomic_write
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    failures = 0
    for i in range(count):
        try:
            atomic_write(path, '{"writer": "%s", "i": %d, "pad": "%s"}\\n' % (tag, i, "x" * 200_000))
        except OSError as exc:
            failures += 1
            print(type(exc).__name__, exc, file=sys.stderr)
    print(failures)
""")


def test_lock_files_stay_bounded_however_many_paths_are_written(tmp_path):
    """One lock file per first byte of the path's hash (before: one per path, never removed; a day of test
    runs left thousands in the lock folder), and one path always gets the same lock."""
    from ddtree_conformance.files import atomic_write, write_lock

    locks = {write_lock(tmp_path / f"report-{i}.json").lock_file for i in range(3000)}
    assert 200 < len(locks) <= 256
    assert write_lock(tmp_path / "a.json").lock_file == write_lock(tmp_path / "x" / ".." / "a.json").lock_file
    for i in range(20):  # paths sharing a lock only take turns
        atomic_write(tmp_path / f"w{i}.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"w{i}.json" for i in range(20))


def test_concurrent_writers_never_delete_each_others_temporary_files(tmp_path):
    """Two processes, 40 writes each to one path: every write lands, the file is one whole write, and
    no temporary file is left (before: 40 of 80 writes failed with FileNotFoundError)."""
    path = tmp_path / "report.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), tag, "40"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in ("a", "b")
    ]
    outcomes = [p.communicate(timeout=300) for p in procs]
    assert [int(out.strip()) for out, _ in outcomes] == [0, 0], [err[-500:] for _, err in outcomes]
    assert json.loads(path.read_text())["writer"] in ("a", "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_detached_grandchild_of_the_engine_ends_with_the_run(tmp_path, random_pair):
    """The engine starts a grandchild in its own session and lets its parent exit: outside the
    engine's process group and no descendant of it. It still ends with the run (before: it outlived it)."""
    target, drafter = random_pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [1, 2, 3]}\n')
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        app,
        [
            str(a)
            for a in (
                "check",
                "--engine",
                CATALOGUE["detached grandchild"].engine,
                "--model",
                target,
                "--drafter",
                drafter,
                "--prompts",
                prompts,
                "--golden-dir",
                tmp_path / "golden",
                "--max-new-tokens",
                "4",
                "--modes",
                "dflash",
                "--check",
                "lossless",
                "--engine-timeout",
                "120",
                "-O",
                f"pid_file={tmp_path / 'pid'}",
                "--out",
                out,
            )
        ],
    )
    assert result.exit_code in (0, 1), result.output  # a verdict (its echo outputs fail the fp32 oracle)
    text = result.stderr + result.stdout
    report = json.loads(out.read_text())
    assert report["counts"]["pass"] + report["counts"]["fail"] == 1  # judged: the engine ran to the end
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), f"grandchild {pid} outlived the run ({text[-300:]})"


# ------------------------------------------------------------------ --out
ECHO_ENGINE = '''
import os
from ddtree_conformance.adapters.interface import Capabilities, Engine, RequestResult

class Echo(Engine):
    """Outputs of token 1; with option chdir, changes the working folder when it starts (as an engine
    run in the suite's process may)."""
    name = "echo"
    OPTIONS = ("chdir",)
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.options.get("chdir"):
            os.chdir(self.options["chdir"])
    def capabilities(self):
        return Capabilities(name=self.name, modes=["plain", "dflash", "ddtree"], dtypes=["float32"],
                            devices=["cpu"], sampling=True, traces=False, per_round_acceptance=False)
    def generate(self, requests, config):
        return [RequestResult(output_ids=[1] * r.max_new_tokens, finish_reason="length") for r in requests]
'''


@pytest.fixture
def run_dir(tmp_path, monkeypatch, random_pair):
    """A copy of the random pair with a calibration manifest beside it, prompts, a golden file and a
    pairs file naming them; the echo engine importable; the working folder ``tmp_path``."""
    target, drafter, golden = tmp_path / "pair" / "target", tmp_path / "pair" / "drafter", tmp_path / "golden"
    shutil.copytree(random_pair[0], target)
    shutil.copytree(random_pair[1], drafter)
    (tmp_path / "pair" / "MANIFEST.json").write_text("{}\n")
    (golden / "mine").mkdir(parents=True)
    (golden / "mine" / "prompts-float32.json").write_text("{}\n")
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "prompt_ids": [1, 2, 3]}\n')
    (tmp_path / "pairs.json").write_text(
        json.dumps(
            {
                "pairs": {
                    "mine": {
                        "target": str(target),
                        "drafter": str(drafter),
                        "block_size": 8,
                        "dtype": "float32",
                        "prompts": str(tmp_path / "prompts.jsonl"),
                        "prompt_format": "ids",
                    }
                }
            }
        )
    )
    (tmp_path / "ddtc_echo_engine.py").write_text(textwrap.dedent(ECHO_ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _echo_check(root, out, *extra):
    args = [
        "check",
        "--engine",
        "ddtc_echo_engine:Echo",
        "--pairs-file",
        root / "pairs.json",
        "--pair",
        "mine",
        "--golden-dir",
        root / "golden",
        "--no-isolate",
        "--max-new-tokens",
        "4",
        "--modes",
        "dflash",
        "--check",
        "lossless",
        "--held-out-prompts",
        "0",
        *(["--out", out] if out is not None else []),
        *extra,
    ]
    return CliRunner().invoke(app, [str(a) for a in args])


PROTECTED = {
    "a golden file": "golden/mine/prompts-float32.json",
    "the model's config.json": "pair/target/config.json",
    "a drafter file": "pair/drafter/config.json",
    "the prompts file": "prompts.jsonl",
    "the pairs file": "pairs.json",
    "the calibration manifest": "pair/MANIFEST.json",
    "a golden file, as the JSON of --out without a suffix": "golden/mine/prompts-float32",
}


@pytest.mark.parametrize("case", list(PROTECTED))
def test_out_is_refused_when_it_names_an_input_of_the_run(run_dir, case):
    """Before: the report overwrote the file (exit 0), and the next run on it failed to start."""
    target = run_dir / PROTECTED[case]
    protected = target if target.suffix else target.with_suffix(".json")
    before = protected.read_bytes()
    result = _echo_check(run_dir, target)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "would overwrite" in result.stderr and str(protected) in result.stderr
    assert protected.read_bytes() == before


def test_out_naming_a_folder_writes_inside_it(run_dir):
    """Before: ``--out reports-dir`` wrote ``reports-dir.json`` beside the folder."""
    (run_dir / "reports-dir").mkdir()
    result = _echo_check(run_dir, "reports-dir")
    assert result.exit_code in (0, 1), result.output  # a verdict (its echo outputs fail the fp32 oracle)
    assert (run_dir / "reports-dir" / "check-ddtc_echo_engine_Echo.json").is_file()
    assert not (run_dir / "reports-dir.json").exists()


@pytest.mark.parametrize("spelling", ["new-dir/", "a/b/new-dir/"])
def test_out_naming_a_folder_still_to_be_made_creates_it_and_writes_inside(run_dir, spelling):
    """Before: ``--out newdir/`` for a folder that did not exist wrote ``newdir.json`` beside it."""
    result = _echo_check(run_dir, spelling)
    assert result.exit_code in (0, 1), result.output  # a verdict (its echo outputs fail the fp32 oracle)
    folder = run_dir / spelling
    assert (folder / "check-ddtc_echo_engine_Echo.json").is_file()
    assert (folder / "check-ddtc_echo_engine_Echo.md").is_file()
    assert not (run_dir / (spelling.rstrip("/") + ".json")).exists()
    (run_dir / "a-file").write_text("")
    refused = _echo_check(run_dir, "a-file/")
    assert refused.exit_code == 2, refused.output
    assert "--out a-file/: " in refused.stderr and "is a file, not a folder" in refused.stderr


def test_generate_out_naming_a_folder_still_to_be_made_writes_inside(run_dir):
    args = ["generate", "--engine", "ddtc_echo_engine:Echo", "--mode", "plain", "--no-isolate"]
    args += ["--model", "pair/target", "--drafter", "none", "--prompts", "prompts.jsonl", "--max-new-tokens", "2"]
    result = CliRunner().invoke(app, [*args, "--out", "gen/"])
    assert result.exit_code == 0, result.output
    assert (run_dir / "gen" / "generate-plain.jsonl").is_file()


def test_a_test_that_writes_into_the_reports_folder_fails(pytester):
    """The guard in tests/conftest.py: a test that writes into ``reports/`` (the README's `check` keeps its
    report there; two pytest-route tests overwrote it, issue 31) fails, naming the file."""
    from pathlib import Path

    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_writes="""
        from pathlib import Path

        def test_writes_a_report():
            Path("reports").mkdir(exist_ok=True)
            Path("reports/check-reference.json").write_text("{}")

        def test_writes_under_tmp_path(tmp_path):
            (tmp_path / "reports").mkdir()
            (tmp_path / "reports" / "check.json").write_text("{}")
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "-q")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*this test wrote into the user's reports folder*check-reference.json*"])


def test_an_engine_that_changes_the_working_folder_cannot_move_the_report(run_dir):
    """``--no-isolate``: the engine chdirs when it starts; the report still lands at the relative
    --out as it was when the command began, and the command names that path."""
    elsewhere = run_dir / "elsewhere"
    elsewhere.mkdir()
    result = _echo_check(run_dir, "r.json", "-O", f"chdir={elsewhere}")
    assert result.exit_code in (0, 1), result.output  # a verdict (its echo outputs fail the fp32 oracle)
    assert (run_dir / "r.json").is_file() and not (elsewhere / "r.json").exists()
    assert str(run_dir / "r.json") in "".join(result.stdout.split())  # the path named (rich may wrap it)


# ------------------------------------------------------------------ record --update
def _record(random_pair, root, *extra):
    target, drafter = random_pair
    args = [
        "record",
        "--model",
        target,
        "--drafter",
        drafter,
        "--prompts",
        root / "p.jsonl",
        "--pair-name",
        "random",
        "--golden-dir",
        root / "golden",
        *extra,
    ]
    return CliRunner().invoke(app, [str(a) for a in args])


def test_record_update_refuses_to_drop_records_budgets_or_tokens_without_replace(random_pair, tmp_path):
    """Before: an update with a smaller --limit, --budgets or --max-new-tokens replaced the file (80
    records became 3), printing a diff but asking nothing."""
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt_ids": [1, 2, 3]}\n{"id": "b", "prompt_ids": [7, 8]}\n')
    first = _record(random_pair, tmp_path, "--budgets", "4,8", "--max-new-tokens", "8")
    assert first.exit_code == 0, first.output
    path = tmp_path / "golden" / "random" / "p-float32.json"
    before = path.read_bytes()
    for extra, lost in (
        (["--limit", "1", "--budgets", "4,8", "--max-new-tokens", "8"], "1 of 2 records (b)"),
        (["--budgets", "4", "--max-new-tokens", "8"], "acceptance of ddtree-8"),
        (["--budgets", "4,8", "--max-new-tokens", "6"], "output tokens past 6"),
    ):
        refused = _record(random_pair, tmp_path, "--update", *extra)
        assert refused.exit_code == 2, (extra, refused.output)
        assert f"the update would drop {lost}" in refused.stderr and "--replace" in refused.stderr, refused.stderr
        assert path.read_bytes() == before
    replaced = _record(random_pair, tmp_path, "--replace", "--limit", "1", "--budgets", "4", "--max-new-tokens", "6")
    assert replaced.exit_code == 0, replaced.output
    assert list(json.loads(path.read_text())["records"]) == ["a"] and "prompt b removed" in replaced.output
