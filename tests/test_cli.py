"""The CLI: generate and engines, and one clear stderr line + exit 2 for every usage problem."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_conformance.cli import app
from ddtree_conformance.cli.base import EXIT_STATUSES
from ddtree_conformance.report import render_markdown

# Engines that need no model compute, so CLI plumbing is tested quickly.
FAKE_ENGINES = '''
from ddtree_conformance.adapters.interface import Capabilities, Engine, EngineError, RequestResult, Timings

class _Base(Engine):
    def capabilities(self):
        return Capabilities(name=self.name, modes=["plain", "dflash", "ddtree"], dtypes=["float32"],
                            devices=["cpu"], sampling=True, traces=False, per_round_acceptance=False)

class EchoEngine(_Base):
    """Output: the prompt repeated up to max_new_tokens (a valid result); the stop ids it was given
    are echoed in the timings' stage names."""
    name = "echo"
    def generate(self, requests, config):
        return [RequestResult(output_ids=(r.prompt_ids * r.max_new_tokens)[:r.max_new_tokens], finish_reason="length",
                              timings=Timings(stages={f"stop {t}": 0.0 for t in r.stop_token_ids}))
                for r in requests]

class CrashEngine(_Base):
    """Fails on its second batch."""
    name = "crash"
    calls = 0
    def generate(self, requests, config):
        type(self).calls += 1
        if type(self).calls > 1:
            raise EngineError("crash engine: device lost")
        return [RequestResult(output_ids=[1] * r.max_new_tokens, finish_reason="length") for r in requests]

class FailingRequestEngine(_Base):
    name = "failing"
    def generate(self, requests, config):
        return [RequestResult(output_ids=[], finish_reason="error", error="prompt too long") for r in requests]
'''

PROMPTS = [
    {"id": "m1", "category": "math", "prompt_ids": [1, 2, 3]},
    {"id": "c1", "category": "code", "prompt_ids": [7, 8]},
]


@pytest.fixture(scope="session")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    from ddtree_conformance.testing.random_pair import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("cli-pair"))


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture
def fake_engines(tmp_path, monkeypatch):
    (tmp_path / "ddtc_cli_fakes.py").write_text(textwrap.dedent(FAKE_ENGINES))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    sys.modules.pop("ddtc_cli_fakes", None)
    importlib.invalidate_caches()
    return "ddtc_cli_fakes"


def invoke(*args: str):
    runner = CliRunner(env={"HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    return runner.invoke(app, [str(a) for a in args])


def base_args(pair, prompts_file, out):
    target, drafter = pair
    return [
        "generate",
        "--model",
        target,
        "--drafter",
        drafter,
        "--prompts",
        prompts_file,
        "--out",
        out,
        "--max-new-tokens",
        "4",
        "--budget",
        "4",
    ]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _messages(result) -> list[str]:
    """stderr without the progress lines (``[ddtree] ...``, printed when stderr is not a terminal)."""
    return [line for line in result.stderr.strip().splitlines() if not line.startswith("[ddtree] ")]


def assert_engine_error(result, *fragments: str) -> str:
    """Exit 5 (the engine could not start or died): one error line naming the cause, then its log tail."""
    assert result.exit_code == 5, (result.exit_code, result.output, result.exception)
    line = _messages(result)[0]
    assert line.startswith("error: ") and "Traceback" not in line
    for fragment in fragments:
        assert fragment in line, line
    return line


def assert_usage_error(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = _messages(result)
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: ")
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in line, line
    return line


# ------------------------------------------------------------------ generate: happy paths


def test_generate_ddtree_matches_plain(pair, prompts_file, tmp_path, monkeypatch):
    out = tmp_path / "ddtree.jsonl"
    result = invoke(*base_args(pair, prompts_file, out), "--trace", "--batch-size", "1")
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["m1", "c1"]
    assert [r["category"] for r in rows] == ["math", "code"]
    assert rows[0]["prompt_ids"] == [1, 2, 3]
    for row in rows:
        assert {"output_ids", "finish_reason", "rounds", "acceptance_lengths", "timings", "traces", "error"} <= set(row)
        assert row["finish_reason"] == "length" and len(row["output_ids"]) == 4
        assert row["traces"] and len(row["traces"]) == row["rounds"]
    assert not out.with_name(out.name + ".partial").exists()
    for fragment in ("category", "mean tau", "math", "code", "all", "wrote 2 results"):
        assert fragment in result.stdout

    # plain decoding, default output path: fp32 greedy DDTree must be lossless.
    monkeypatch.chdir(tmp_path)
    target, drafter = pair
    result = invoke(
        "generate",
        "--model",
        target,
        "--drafter",
        drafter,
        "--prompts",
        prompts_file,
        "--mode",
        "plain",
        "--max-new-tokens",
        "4",
    )
    assert result.exit_code == 0, result.output
    plain = read_jsonl(tmp_path / "reports" / "generate-plain.jsonl")
    assert [r["output_ids"] for r in plain] == [r["output_ids"] for r in rows]
    assert all(r["traces"] is None for r in plain)


def test_generate_stop_tokens_limits_and_text(pair, tmp_path, fake_engines):
    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7, 5]}))
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 11, "world": 12}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(target / "tokenizer.json"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "t", "category": "chat", "text": "hello world", "max_new_tokens": 9})
        + "\n"
        + json.dumps({"id": "i", "category": "chat", "prompt_ids": [3]})
        + "\n"
        + json.dumps({"id": "j", "category": "chat", "prompt_ids": [4]})
        + "\n"
    )
    out = tmp_path / "o.jsonl"
    common = [
        "generate",
        "--engine",
        f"{fake_engines}:EchoEngine",
        "--model",
        target,
        "--drafter",
        "none",
        "--prompts",
        prompts,
        "--out",
        out,
    ]

    result = invoke(*common, "--limit", "2")
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["t", "i"]
    assert rows[0]["prompt_ids"] == [11, 12]
    assert rows[0]["output_ids"] == [11, 12] * 4 + [11]  # the prompt's own limit, 9
    assert rows[1]["output_ids"] == [3] * 64  # default limit 64
    assert all(set(r["timings"]["stages"]) == {"stop 5", "stop 7"} for r in rows)  # eos ids from generation_config

    result = invoke(*common, "--stop-token", "1", "--stop-token", "2", "--max-new-tokens", "3")
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert len(rows) == 3
    assert rows[0]["output_ids"] == [11, 12, 11]  # explicit options win
    assert set(rows[0]["timings"]["stages"]) == {"stop 1", "stop 2"}


def test_generate_crash_keeps_partial_results(pair, prompts_file, tmp_path, fake_engines):
    out = tmp_path / "o.jsonl"
    result = invoke(
        "generate",
        "--engine",
        f"{fake_engines}:CrashEngine",
        "--model",
        pair[0],
        "--drafter",
        pair[1],
        "--prompts",
        prompts_file,
        "--out",
        out,
        "--batch-size",
        "1",
        "--no-isolate",
    )
    line = assert_engine_error(result, "crash engine: device lost", "1 results kept in", "o.jsonl.partial")
    assert line
    assert not out.exists()
    assert [r["id"] for r in read_jsonl(out.with_name("o.jsonl.partial"))] == ["m1"]


def test_generate_failed_requests_exit_1(pair, prompts_file, tmp_path, fake_engines):
    out = tmp_path / "o.jsonl"
    result = invoke(
        "generate",
        "--engine",
        f"{fake_engines}:FailingRequestEngine",
        "--model",
        pair[0],
        "--drafter",
        pair[1],
        "--prompts",
        prompts_file,
        "--out",
        out,
    )
    assert result.exit_code == 1
    (line,) = _messages(result)  # one line: what failed, the first reason, where the results are
    assert line.startswith("error: 2 of 2 requests failed (first: prompt 'm1': "), line
    assert line.endswith(f"prompt too long); results written to {out}"), line
    assert len(read_jsonl(out)) == 2


# ------------------------------------------------------------------ generate: usage errors


def test_missing_model_dir(pair, prompts_file, tmp_path):
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl")
    args[args.index("--model") + 1] = tmp_path / "nowhere"
    assert_usage_error(invoke(*args), "model dir", "nowhere", "does not exist", "--model")


def test_missing_drafter_dir(pair, prompts_file, tmp_path):
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl")
    args[args.index("--drafter") + 1] = tmp_path / "nodrafter"
    assert_usage_error(invoke(*args), "drafter dir", "nodrafter", "does not exist")


@pytest.mark.parametrize(
    "edit, fragments, isolated",
    [
        (lambda c: c.update(vocab_size=50), ["vocab_size 50", "target vocab_size 97"], True),
        (lambda c: c.update(hidden_size=32), ["hidden_size 32", "target hidden_size 64"], False),
        (lambda c: c["dflash_config"].update(target_layer_ids=[99]), ["dflash_config.target_layer_ids", "[99]"], False),
        (
            lambda c: c["dflash_config"].update(mask_token_id=10**6),
            ["dflash_config.mask_token_id 1000000", "outside the vocabulary"],
            False,
        ),
    ],
    ids=["vocab_size", "hidden_size", "target_layer_ids", "mask_token_id"],
)
def test_drafter_target_mismatch(pair, prompts_file, tmp_path, edit, fragments, isolated):
    """The same line from an engine in its own process (the default) and in process (the rows where the
    message, not the process, is the subject: an engine's start costs seconds)."""
    drafter = tmp_path / "drafter"
    shutil.copytree(pair[1], drafter)
    config = json.loads((drafter / "config.json").read_text())
    edit(config)
    (drafter / "config.json").write_text(json.dumps(config))
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl")
    args[args.index("--drafter") + 1] = drafter
    args += [] if isolated else ["--no-isolate"]
    assert_engine_error(invoke(*args), "engine 'reference' failed to start", *fragments)
    assert not (tmp_path / "o.jsonl.partial").exists()


def test_engine_not_installed_here_is_an_engine_failure(pair, prompts_file, tmp_path):
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl") + ["--engine", "sglang"]
    assert_engine_error(invoke(*args), "engine 'sglang' is not available here", "sglang")


@pytest.mark.parametrize(
    "option, value, fragments",
    [
        ("--budget", "0", ["--budget: Input should be greater than or equal to 1 (got 0)"]),
        ("--max-new-tokens", "0", ["--max-new-tokens: Input should be greater than or equal to 1"]),
        ("--engine", "tensorrt", ["unknown engine 'tensorrt'", "reference", "vllm", "sglang"]),
        ("--engine", "os:path", ["not a subclass of ddtree_conformance.adapters.interface.Engine"]),
        ("--mode", "tree", ["--mode: Input should be 'plain', 'dflash' or 'ddtree'"]),
        ("--dtype", "int8", ["--dtype: Input should be 'float32', 'bfloat16' or 'float16'"]),
        ("--top-p", "1.5", ["--top-p: Input should be less than or equal to 1"]),
        ("--temperature", "-1", ["--temperature: Input should be greater than or equal to 0"]),
        ("--limit", "0", ["--limit: Input should be greater than or equal to 1"]),
        ("--batch-size", "0", ["--batch-size: Input should be greater than or equal to 1"]),
        ("--device", "tpu", ["--device: 'tpu' is not a device"]),
        ("--engine-option", "novalue", ["--engine-option: must be KEY=VALUE, got 'novalue'"]),
        ("--prompts", "no-such-set", ["prompt set 'no-such-set' not found"]),
        ("--drafter", "none", ["cannot run mode ddtree", "no drafter given"]),
    ],
)
def test_bad_options(pair, prompts_file, tmp_path, option, value, fragments):
    # in process: each is refused before generating (--drafter none after capabilities()); the engine's
    # own process changes nothing here and costs seconds to start
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl") + ["--no-isolate"]
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    assert_usage_error(invoke(*args), *fragments)
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    "lines, fragments",
    [
        (['{"id": "a", "prompt_ids": [1]}', '{"id": "b", "text": ""}'], [":2:", "field 'text'", "prompt 'b' is empty"]),
        (['{"id": "a", "prompt_ids": []}'], [":1:", "field 'prompt_ids'", "is empty"]),
        (['{"id": "a", "prompt_ids": [1]'], [":1:", "bad JSON"]),
        (['{"prompt_ids": [1]}'], [":1:", "field 'id'", "missing"]),
        (['{"id": "a", "prompt_ids": [1]}', '{"id": "a", "prompt_ids": [2]}'], [":2:", "duplicate id 'a'"]),
        (['{"id": "a", "prompt_ids": [-1]}'], [":1:", "negative token id"]),
        (['{"id": "a", "text": "hi"}'], [":1:", "tokenizer.json does not exist"]),
    ],
    ids=["empty-text", "empty-ids", "bad-json", "missing-id", "duplicate-id", "negative-id", "no-tokenizer"],
)
def test_bad_prompts_file(pair, tmp_path, lines, fragments):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    result = invoke(*base_args(pair, prompts, tmp_path / "o.jsonl"))
    assert_usage_error(result, str(prompts), *fragments)


# ------------------------------------------------------------------ engines


def test_engines_lists_capabilities_and_unavailable(pair):
    result = invoke("engines", "--model", pair[0], "--drafter", pair[1])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for fragment in (
        "reference",
        "built-in",
        "ok",
        "plain,dflash,ddtree",
        "float32,bfloat16,float16",
        "cpu",
        "unavailable",
        "vllm: engine 'vllm' is not available here: No module named '",
        "sglang: engine 'sglang' is not available here",
    ):
        assert fragment in out, out


def test_engines_reports_pair_errors_per_engine(pair, tmp_path):
    drafter = tmp_path / "drafter"
    shutil.copytree(pair[1], drafter)
    config = json.loads((drafter / "config.json").read_text())
    config["vocab_size"] = 50
    (drafter / "config.json").write_text(json.dumps(config))
    result = invoke("engines", "--model", pair[0], "--drafter", drafter)
    assert result.exit_code == 0, result.output
    assert "error" in result.stdout and "reference: drafter" in result.stdout and "vocab_size 50" in result.stdout


def test_engines_missing_model(tmp_path):
    assert_usage_error(invoke("engines", "--model", tmp_path / "gone"), "model dir", "does not exist")


def test_version_and_help():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith("ddtree-conformance ")
    result = invoke("--help")
    assert result.exit_code == 0 and "generate" in result.stdout and "engines" in result.stdout


# ------------------------------------------------------------------ check and record


def _suite_args(pair, prompts_file, golden_dir):
    target, drafter = pair
    return [
        "--model",
        target,
        "--drafter",
        drafter,
        "--prompts",
        prompts_file,
        "--pair-name",
        "random",
        "--golden-dir",
        golden_dir,
        "--max-new-tokens",
        "8",
    ]


def test_check_passes_reference_and_writes_report(pair, prompts_file, tmp_path):
    out = tmp_path / "report.json"
    result = invoke(
        "check",
        *_suite_args(pair, prompts_file, tmp_path / "golden"),
        "--budgets",
        "4",
        "--check",
        "lossless",
        "--check",
        "tree-structure",
        "--no-isolate",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["schema_version"] == 1 and report["counts"] == {"pass": 4, "fail": 0, "skip": 0, "not_run": 0}


def test_check_fails_a_mutant_with_exit_1(pair, prompts_file, tmp_path):
    result = invoke(
        "check",
        *_suite_args(pair, prompts_file, tmp_path / "golden"),
        "--budgets",
        "8",
        "--modes",
        "ddtree",
        "--check",
        "tree-structure",
        "--no-isolate",
        "--engine",
        "ddtree_conformance.testing.mutants:FlatPositions",
        "--out",
        tmp_path / "r.json",
    )
    assert result.exit_code == 1, result.output
    assert "flat index" in result.output
    assert "1 of 1 checks failed" in result.stderr


def test_record_refuses_overwrite_then_updates_with_diff(pair, prompts_file, tmp_path):
    args = ["record", *_suite_args(pair, prompts_file, tmp_path / "golden"), "--budgets", "4"]
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    assert "new golden file" in first.output
    second = invoke(*args)
    assert_usage_error(second, "exists", "--update")
    third = invoke(*args, "--update")
    assert third.exit_code == 0 and "no changes" in third.output, third.output


# 15 s of a CI worker: nightly (thorough); the TP check failing and passing stays in CI
# (test_reference_tensor_parallel.py, test_tensor_parallel.py)
@pytest.mark.thorough
def test_check_runs_the_tp_check_on_cpu_when_asked(tmp_path):
    """The fixture pair (the random pair's vocabulary does not split): reference TP=2 as gloo ranks. The
    run that passes is the CLI's default path: the engine in its own process, which starts rank 1 itself;
    the fixture's outputs and per-round acceptance survive the sharding's reduction order exactly."""
    out = tmp_path / "tp.json"
    args = [
        "check",
        "--check",
        "tensor-parallel",
        "--modes",
        "ddtree",
        "--budgets",
        "16",
        "--limit",
        "2",
        "--max-new-tokens",
        "16",
        "--no-isolate",
        "--out",
        out,
    ]
    skipped = invoke(*args)
    assert skipped.exit_code == 0, skipped.output
    assert "on CPU it runs when asked: --tensor-parallel-size N" in json.loads(out.read_text())["results"][0]["message"]
    isolated = [a for a in args if a != "--no-isolate"]
    isolated[isolated.index("--modes") + 1] = "dflash,ddtree"
    isolated[isolated.index("--limit") + 1] = "4"
    isolated[isolated.index("--max-new-tokens") + 1] = "32"
    ran = invoke(*isolated, "--tensor-parallel-size", "2", "--held-out-prompts", "0")  # fp32 ties: none here
    assert ran.exit_code == 0, ran.output
    results = json.loads(out.read_text())["results"]
    assert [r["check"] for r in results] == ["tensor-parallel/dflash", "tensor-parallel/ddtree-B16"]
    for result in results:  # the four prompts of the set
        assert result["status"] == "pass", result["message"]
        assert result["details"]["tp"] == 2, result["details"]
        assert "TP=2 (tensor_parallel_size 2 (settings)): " in result["message"]
        assert "4 match, 0 near-tie (exact)" in result["message"]
        assert "per-round acceptance equals TP=1" in result["message"]
    assert_usage_error(invoke(*args, "--tensor-parallel-size", "0"), "--tensor-parallel-size")
    assert_usage_error(
        invoke(*args, "--tensor-parallel-size", "64"),
        "--tensor-parallel-size 64: engine 'reference' accepts at most",
        "(capabilities().max_tensor_parallel)",
    )


def test_check_rejects_bad_budgets(pair, prompts_file, tmp_path):
    result = invoke("check", *_suite_args(pair, prompts_file, tmp_path), "--budgets", "0,4")
    assert_usage_error(result, "--budgets")


def test_help_documents_the_exit_statuses():
    for command in ([], ["check"]):
        text = " ".join(invoke(*command, "--help").stdout.split())
        for code, meaning in EXIT_STATUSES.items():  # each status with the start of its meaning
            assert f"{code} {' '.join(meaning.split()[:5])}" in text, code


def test_check_prints_one_line_per_check_and_a_heartbeat_when_not_a_terminal(pair, prompts_file, tmp_path):
    runner = CliRunner(env={"DDTREE_HEARTBEAT_S": "0.5"})
    result = runner.invoke(
        app,
        [
            str(a)
            for a in (
                "check",
                *_suite_args(pair, prompts_file, tmp_path / "golden"),
                "--budgets",
                "4",
                "--modes",
                "ddtree",
                "--check",
                "lossless",
                "--check",
                "tree-structure",
                "--engine-timeout",  # start-up shares it: 8 s leaves a loaded CI machine room to start
                "8",
                "--engine",
                "ddtree_conformance.testing.misbehaving:HangInGenerate",
                "-O",
                "helper=false",
                "--out",
                tmp_path / "r.json",
            )
        ],
    )
    assert result.exit_code == 5, result.output
    progress = [line for line in result.stderr.splitlines() if line.startswith("[ddtree] ")]
    name = "ddtree_conformance.testing.misbehaving:HangInGenerate"
    assert progress[0] == f"[ddtree] check: 2 checks against engine '{name}'"
    beats = [
        line
        for line in progress
        if line.startswith(f"[ddtree] waiting for engine '{name}': generate 3 requests (plain), ")
    ]
    assert beats and beats[0].endswith(" s"), progress
    assert re.fullmatch(r"\[ddtree\] check lossless/ddtree-B4: fail \(\d+\.\d s\): .*", progress[-1]), progress
    assert "hung: no answer to" in progress[-1], progress


def test_check_with_a_passing_engine_prints_progress_lines(pair, prompts_file, tmp_path):
    result = invoke(
        "check",
        *_suite_args(pair, prompts_file, tmp_path / "golden"),
        "--budgets",
        "4",
        "--modes",
        "ddtree",
        "--check",
        "lossless",
        "--no-isolate",
        "--out",
        tmp_path / "r.json",
    )
    assert result.exit_code == 0, result.output
    line = (
        r"^\[ddtree\] check lossless/ddtree-B4: pass \(\d+\.\d s\): 3 match, 0 near-tie \(exact\); "
        r"48 positions equal the fp32 target's argmax; plain and ddtree-B4 both ran with attention backend sdpa$"
    )
    assert re.search(line, result.stderr, re.M), result.stderr
    report = json.loads((tmp_path / "r.json").read_text())  # the seed drawn and the held-out prompt it gave
    seed = report["settings"]["run_seed"]
    assert isinstance(seed, int) and [p["id"] for p in report["held_out_prompts"]] == [f"held-out-{seed}-0"]


def test_a_check_run_stopped_midway_leaves_a_partial_report(pair, prompts_file, tmp_path, monkeypatch):
    """The JSON report is rewritten after every check: a run killed at a deadline keeps what finished."""
    from ddtree_conformance import checks

    real = checks.run_plan

    def stopped_after_the_first(session, planned, on_result=None):
        def first_then_stop(result):
            on_result(result)
            raise KeyboardInterrupt  # what a kill at the deadline leaves: the reports written so far

        return real(session, planned, on_result=first_then_stop)

    monkeypatch.setattr(checks, "run_plan", stopped_after_the_first)
    out = tmp_path / "r.json"
    invoke(
        "check",
        *_suite_args(pair, prompts_file, tmp_path / "golden"),
        "--budgets",
        "4",
        "--modes",
        "ddtree",
        "--check",
        "lossless",
        "--check",
        "tree-structure",
        "--no-isolate",
        "--out",
        out,
    )
    report = json.loads(out.read_text())
    assert report["partial"] is True and report["schema"] == "ddtree-conformance/check-report"
    assert [(r["check"], r["status"]) for r in report["results"]] == [
        ("lossless/ddtree-B4", "pass"),
        ("tree-structure/ddtree-B4", "skip"),
    ]
    assert report["results"][1]["message"] == "not run: the run stopped before this check"
    assert report["counts"] == {"pass": 1, "fail": 0, "skip": 0, "not_run": 1}
    assert "Partial report" in render_markdown(report)
    assert not out.with_suffix(".md").exists()  # Markdown and HTML come with the complete report only


def test_record_limit_update_over_a_corrupt_file_and_pair_names(pair, prompts_file, tmp_path):
    golden = tmp_path / "golden"
    args = ["record", *_suite_args(pair, prompts_file, golden), "--budgets", "4"]
    first = invoke(*args, "--limit", "1")
    assert first.exit_code == 0, first.output
    path = golden / "random" / "p-float32.json"
    assert list(json.loads(path.read_text())["records"]) == ["m1"]
    path.write_bytes(b"\x00\xffgarbage")
    assert_usage_error(invoke(*args), "exists", "--update")  # refused before the run, as for a good file
    updated = invoke(*args, "--update")
    assert updated.exit_code == 0, updated.output
    warning = f"warning: replacing an unreadable golden file: {path}: not UTF-8 text (byte 0xff at offset 1)"
    assert any(line.startswith(warning) for line in updated.stderr.splitlines()), updated.stderr
    assert list(json.loads(path.read_text())["records"]) == ["m1", "c1"]
    escaped = invoke("record", *_suite_args(pair, prompts_file, golden), "--pair-name", "../x")
    assert_usage_error(escaped, "--pair-name: '../x' is not a pair name")
    assert not (tmp_path / "x").exists()


def test_check_on_a_non_utf8_golden_file_names_it(pair, prompts_file, tmp_path):
    golden = tmp_path / "golden"
    (golden / "random").mkdir(parents=True)
    bad = golden / "random" / "p-float32.json"
    bad.write_bytes(b"\xe9")
    args = [
        "check",
        *_suite_args(pair, prompts_file, golden),
        "--budgets",
        "4",
        "--modes",
        "ddtree",
        "--no-isolate",
        "--out",
        tmp_path / "r.json",
    ]
    assert_usage_error(
        invoke(*args, "--check", "golden"), f"{bad}: not UTF-8 text (byte 0xe9 at offset 0); is it a golden file?"
    )
    assert not (tmp_path / "r.json").exists()
    assert invoke(*args, "--check", "lossless").exit_code == 0  # a plan that does not read it runs


def test_generate_refuses_a_budget_above_the_engines(pair, prompts_file, tmp_path):
    args = base_args(pair, prompts_file, tmp_path / "o.jsonl")
    args[args.index("--budget") + 1] = "5000"
    assert_usage_error(invoke(*args, "--no-isolate"), "--budget 5000: engine 'reference' accepts budgets up to 4096")
    args[args.index("--budget") + 1] = "100000000"
    assert_usage_error(invoke(*args), "--budget: Input should be less than or equal to 65536")
    assert not (tmp_path / "o.jsonl.partial").exists()


def test_unknown_engine_option_is_refused_by_every_command(pair, prompts_file, tmp_path):
    for command in (
        base_args(pair, prompts_file, tmp_path / "o.jsonl"),
        ["check", *_suite_args(pair, prompts_file, tmp_path / "golden"), "--out", tmp_path / "r.json"],
    ):
        assert_usage_error(
            invoke(*command, "-O", "bulider=vectorized"),
            "engine 'reference': unknown option(s) bulider; known: cuda_graphs, device_tree, fused_layers",
        )
