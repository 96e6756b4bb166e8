"""Misbehaving engines (conformance/testing/misbehaving.py): none passes, each with its exact verdict.

Every row runs ``ddtree-conformance check`` in this process (typer's CliRunner) on the random pair,
two prompts, 8 new tokens, DDTree at B=4, one check family, and asserts the exit status, the
verdict of each check and its message (which names the request and the field). Faults of the
result run in-process (``--no-isolate``); faults of the process (crash, hang, OOM, no start) run
isolated with short timeouts, the way a user runs them.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_conformance.cli import app
from ddtree_conformance.testing import misbehaving
from ddtree_conformance.testing.misbehaving import CATALOGUE
from ddtree_conformance.testing.processes import pid_alive

PROMPTS = [
    {"id": "a", "category": "x", "prompt_ids": [1, 2, 3, 4]},
    {"id": "b", "category": "x", "prompt_ids": [9, 8, 7, 6, 5, 4, 3]},
    {"id": "c", "category": "x", "prompt_ids": [11]},
]
M = "ddtree_conformance.testing.misbehaving:"


@pytest.fixture(scope="module")
def suite(random_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("misbehaving")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    target, drafter = random_pair
    return {"target": target, "drafter": drafter, "prompts": prompts, "root": root}


def check(suite, engine: str, families: list[str], *extra: str):
    """``ddtree-conformance check`` on the small run; returns (result, report or None, stderr lines)."""
    out = suite["root"] / f"{engine.rsplit(':', 1)[-1]}-{'-'.join(families)}.json"
    args = [
        "check",
        "--engine",
        engine,
        "--model",
        suite["target"],
        "--drafter",
        suite["drafter"],
        "--prompts",
        suite["prompts"],
        "--pair-name",
        "random",
        "--golden-dir",
        suite["root"] / "golden",
        "--max-new-tokens",
        "8",
        "--limit",
        "2",
        "--modes",
        "ddtree",
        "--budgets",
        "4",
        "--out",
        out,
        "--held-out-prompts",
        "0",
    ]  # a and b differ in length: results swapped between them show in integrity
    for family in families:
        args += ["--check", family]
    result = CliRunner().invoke(app, [str(a) for a in (*args, *extra)])
    report = json.loads(out.read_text()) if out.is_file() else None
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[ddtree] ")]
    return result, report, lines


def any_request(pattern: str) -> str:
    """``pattern`` with its request named as any request of the run: the engine gets the requests shuffled
    and beside a held-out prompt (ddtree_conformance.session.mixing), so which one a fault lands on varies."""
    pattern = re.sub(r"request\\ [01]\\ \\\(prompt\\ [ab]\\\)", r"request \\d+ \\(prompt [^)]+\\)", pattern)
    return re.sub(
        r"returned\\ \d+\\ results?\\ for\\ \d+\\ requests", r"returned \\d+ results? for \\d+ requests", pattern
    )


def verdicts(report) -> dict[str, tuple[str, str]]:
    return {
        r["check"]: ("not run" if r["details"].get("not_run") else r["status"], r["message"]) for r in report["results"]
    }


# fault -> regex the failing check's message must match in full (the check family: CATALOGUE[fault].checks)
RESULT_FAULTS = {
    "one result too few": re.escape(
        f"integrity: engine '{M}OneResultTooFew' returned 1 result for 2 requests (mode ddtree, budget 4)"
    ),
    "one result too many": re.escape(
        f"integrity: engine '{M}OneResultTooMany' returned 3 results for 2 requests (mode ddtree, budget 4)"
    ),
    "results out of order": re.escape(
        "integrity: request 0 (prompt a): field traces[0].start: 7, expected 4 (prompt of 4 tokens + 0 committed "
        "after the prefill's token)"
    ),
    "negative output ids": re.escape(
        "integrity: request 1 (prompt b): field output_ids: token -5 at index 7 is outside the vocabulary (size 97)"
    ),
    "ids beyond the vocabulary": re.escape(
        "integrity: request 1 (prompt b): field output_ids: token 5000 at index 7 is outside the vocabulary (size 97)"
    ),
    "output longer than max_new_tokens": re.escape(
        "integrity: request 0 (prompt a): field output_ids: 9 tokens, more than max_new_tokens 8"
    ),
    "wrong finish_reason": re.escape(
        "integrity: request 0 (prompt a): field finish_reason: 'stop', but the last output token "
    )
    + r"\d+"
    + re.escape(" is not a stop token of the request []"),
    "emits past a stop token": re.escape("integrity: request 0 (prompt a): field output_ids: stop token ")
    + r"\d+ at index \d+"
    + re.escape(" is followed by 1 more token(s)"),
    "tau 66 on a small block": re.escape(
        "integrity: request 0 (prompt a): field acceptance_lengths: round 0 accepts 66 tokens; each round's "
        "acceptance length must be in 1..8 (the drafter's block size) in mode ddtree"
    ),
    "acceptance lengths do not add up": re.escape("integrity: request 0 (prompt a): field acceptance_lengths: ")
    + r"\d+ rounds committing \d+ tokens after "
    r"the prefill's one do not add up to the output's 8 tokens \(the last round may only be cut short: "
    r"expected \d+ < 8 <= \d+\)",
    "per-round acceptance dropped while promised": re.escape(
        "integrity: request 0 (prompt a): field acceptance_lengths: missing, though the engine's capabilities "
        "promise per-round acceptance in mode ddtree"
    ),
    "traces dropped while promised": re.escape(
        "integrity: request 0 (prompt a): field traces: missing, though traces were asked for and the engine's "
        "capabilities promise them in mode ddtree"
    ),
    "garbage traces": re.escape("integrity: request 0 (prompt a): field traces[0].bonus: token ")
    + r"\d+, but the output has \d+ at index \d+",
    "drafter logits that are not finite": re.escape(
        "integrity: request 0 (prompt a): field traces[0].draft_logits: row 0 token 0 is nan: logits must be "
        "finite or -inf"
    ),
    "results that are not RequestResults": re.escape(
        "integrity: request 0 (prompt a): field result: not a RequestResult (dict)"
    ),
}


@pytest.mark.parametrize("fault", list(RESULT_FAULTS))
def test_corrupt_results_fail_naming_request_and_field(suite, fault):
    message, entry = RESULT_FAULTS[fault], CATALOGUE[fault]
    [family] = entry.checks
    assert not entry.isolate
    result, report, lines = check(suite, entry.engine, [family], "--no-isolate")
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert lines == ["error: 1 of 1 checks failed"], lines
    [(check_id, (status, text))] = verdicts(report).items()
    assert check_id == f"{family}/ddtree-B4" and status == "fail"
    assert re.fullmatch(any_request(message), text), text
    assert "Traceback" not in result.output and "check crashed" not in text


def test_every_catalogue_entry_is_tested():
    process = {
        "cannot start",
        "hang at start-up",
        "hang in capabilities",
        "crash in generate",
        "hang in generate",
        "out of memory",
        "unknown option",
        "no acceptance data (honest)",
        "detached grandchild",
    }
    assert set(CATALOGUE) == set(RESULT_FAULTS) | process
    assert len([f for f in CATALOGUE.values() if f.engine.startswith(M)]) >= 15


def test_engine_without_acceptance_data_is_incomplete_and_its_report_renders(suite):
    """An honest engine without acceptance data: nothing fails, but the acceptance family did not run
    because of the engine, so the run is incomplete (exit 7) until the caller allows that skip."""
    entry = CATALOGUE["no acceptance data (honest)"]
    result, report, _ = check(suite, entry.engine, list(entry.checks), "--no-isolate")
    assert result.exit_code == 7, result.output
    assert "error: run incomplete: acceptance did not run on 1 check(s)" in result.stderr
    results = {r["check"]: r for r in report["results"]}
    assert sorted(results) == ["acceptance/ddtree-B4", "lossless/ddtree-B4"]
    lossless, acceptance = results["lossless/ddtree-B4"], results["acceptance/ddtree-B4"]
    assert lossless["status"] == "pass", lossless["message"]
    assert (lossless["details"]["compared"], lossless["details"]["differing"]) == (2, [])
    assert (lossless["details"]["scoring"]["positions"], lossless["details"]["scoring"]["outside"]) == (32, 0)
    assert (acceptance["status"], acceptance["cause"]) == ("skip", "engine"), acceptance["message"]
    assert acceptance["message"] == "engine reports neither per-round nor aggregate acceptance"
    assert report["runs"][0]["tau"] is None
    html = Path(suite["root"] / "NoAcceptanceData-lossless-acceptance.html").read_text()
    assert "<tr><td>ddtree-B4</td><td>-</td>" in html  # no tau: a dash, not a crash
    assert html.count('src="data:image/png;base64,') == 0  # nothing to plot: no placeholder panels
    allowed, report, _ = check(suite, entry.engine, list(entry.checks), "--no-isolate", "--allow-skip", "acceptance")
    assert allowed.exit_code == 0, allowed.output
    assert report["coverage"]["allowed"][0]["family"] == "acceptance"


def _log_pid(text: str) -> int:
    return int(re.search(r"started helper process (\d+)", text).group(1))


# fault -> (first line on stderr (regex), a line of the log tail, verdicts of the two checks); each runs
# CATALOGUE[fault].checks isolated, with --engine-timeout CATALOGUE[fault].timeout
PROCESS_FAULTS = {
    "cannot start": (
        re.escape(
            f"error: engine '{M}CannotStart' failed to start: RuntimeError: no accelerator found for this "
            "engine (simulated) (2 of 2 checks not run)"
        ),
        "looking for an accelerator (simulated)",
        ("not run", "not run"),
    ),
    "hang at start-up": (
        re.escape(
            f"error: engine '{M}HangAtStart' hung: no answer to start within 3 s (--engine-timeout); its "
            "process group was killed (2 of 2 checks not run)"
        ),
        "loading weights forever (simulated hang at start-up)",
        ("not run", "not run"),
    ),
    "hang in capabilities": (
        re.escape(
            f"error: engine '{M}HangInCapabilities' hung: no answer to capabilities within 3 s "
            "(--engine-timeout); its process group was killed (2 of 2 checks not run)"
        ),
        "capabilities() called: hanging (simulated)",
        ("not run", "not run"),
    ),
    "crash in generate": (
        re.escape(f"error: engine '{M}CrashInGenerate' crashed during generate: exit code 139 (1 of 2 checks not run)"),
        "about to crash: simulated segfault in the engine's kernel",
        ("fail", "not run"),
    ),
    "hang in generate": (
        re.escape(
            f"error: engine '{M}HangInGenerate' hung: no answer to generate within 5 s (--engine-timeout); "
            "its process group was killed (1 of 2 checks not run)"
        ),
        "hanging in generate (simulated)",
        ("fail", "not run"),
    ),
    "out of memory": (
        re.escape(
            f"error: engine '{M}OutOfMemory' crashed during generate: killed by SIGKILL (as the "
            "out-of-memory killer does: out of memory?) (1 of 2 checks not run)"
        ),
        "allocating the KV cache (simulated out of memory: the OOM killer sends SIGKILL)",
        ("fail", "not run"),
    ),
}


def test_an_engine_module_that_raises_on_import_exits_5_with_a_report(suite, tmp_path, monkeypatch, request):
    """The docs promise a report whenever the engine cannot start; one whose module raises on import got
    none (before: exit 5, the line below, and no report file)."""
    (tmp_path / "ddtc_raises_on_import.py").write_text("raise RuntimeError('missing libcuda.so.1 (simulated)')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: __import__("sys").modules.pop("ddtc_raises_on_import", None))
    result, report, lines = check(suite, "ddtc_raises_on_import:Engine", ["lossless", "tree-structure"])
    assert result.exit_code == 5, result.output
    why = (
        "engine 'ddtc_raises_on_import:Engine' is not available here: importing ddtc_raises_on_import failed "
        "with RuntimeError: missing libcuda.so.1 (simulated)"
    )
    assert lines == [f"error: {why} (2 of 2 checks not run)"]
    assert report is not None and report["verdict"]["status"] == "fail"
    assert report["verdict"]["reason"] == f"the engine failed: {why}"
    assert report["engine_failure"]["message"] == why
    assert {s for s, _ in verdicts(report).values()} == {"not run"}
    assert all(m == f"not run: the engine could not start: {why}" for _, m in verdicts(report).values())


@pytest.mark.parametrize("fault", list(PROCESS_FAULTS))
def test_engine_that_cannot_start_or_dies_stops_the_run_with_exit_5(suite, fault):
    first, tail_line, statuses = PROCESS_FAULTS[fault]
    entry = CATALOGUE[fault]
    assert entry.isolate and entry.checks == ("lossless", "tree-structure")
    result, report, lines = check(suite, entry.engine, list(entry.checks), "--engine-timeout", f"{entry.timeout:g}")
    assert result.exit_code == 5, (result.exit_code, result.output)
    assert re.fullmatch(first, lines[0]), lines[0]
    assert lines[1] == "--- engine log tail ---" and tail_line in lines[2:], lines
    assert lines[2:].count(tail_line) == 1  # capabilities() asked once, start tried once: never retried
    got = verdicts(report)
    assert tuple(s for s, _ in got.values()) == statuses, got
    if statuses[0] == "fail":
        assert got["lossless/ddtree-B4"][1] == lines[0].removeprefix("error: ").rsplit(" (1 of 2", 1)[0]
    assert got["tree-structure/ddtree-B4"][1].startswith("not run: ")
    assert report["engine_failure"]["log_tail"].splitlines()[-1] == lines[-1]
    if fault == "hang in generate":  # the helper process the engine started went with its process group
        pid = _log_pid(result.stderr)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid), f"helper {pid} survived the engine's timeout"


def test_unknown_option_is_refused_before_anything_starts(suite):
    fault = CATALOGUE["unknown option"]
    options = [a for k, v in fault.options.items() for a in ("-O", f"{k}={v}")]
    result, report, lines = check(suite, fault.engine, ["lossless"], *options)
    assert result.exit_code == 2 and report is None
    (line,) = lines  # one error, naming the engine, the option and the ones it knows
    assert line.startswith("error: engine 'reference': unknown option(s) bulider;"), line
    assert line.endswith("; known: cuda_graphs, device_tree, fused_layers"), line


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "nosuch"], "error: unknown engine 'nosuch'; known engines: "),
        (["--budgets", "100000000"], "error: --budgets: budget 100000000 is outside 1..65536 (got '100000000')"),
        (
            ["--budgets", "5000", "--no-isolate"],
            "error: --budgets 5000: engine 'reference' accepts budgets up to 4096 (capabilities().max_budget)",
        ),
        (["--device", "cuda", "--no-isolate"], "error: --device cuda: engine 'reference' can use cpu here"),
    ],
    ids=["unknown-engine", "budget-above-any", "budget-above-engine", "device-not-here"],
)
def test_usage_errors_are_one_line_and_exit_2(suite, args, message):
    if "cuda" in args:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    result, report, lines = check(suite, "reference", ["lossless"], *args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert report is None


def test_generate_never_writes_an_invalid_result(suite, tmp_path):
    out = tmp_path / "g.jsonl"
    result = CliRunner().invoke(
        app,
        [
            str(a)
            for a in (
                "generate",
                "--engine",
                CATALOGUE["ids beyond the vocabulary"].engine,
                "--model",
                suite["target"],
                "--drafter",
                suite["drafter"],
                "--prompts",
                suite["prompts"],
                "--limit",
                "2",
                "--max-new-tokens",
                "8",
                "--budget",
                "4",
                "--batch-size",
                "2",
                "--no-isolate",
                "--out",
                out,
            )
        ],
    )
    assert result.exit_code == 1, result.output
    partial = out.with_name("g.jsonl.partial")
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[ddtree] ")]
    (line,) = lines  # the integrity error (its wording: FAULTS above), then what was kept
    assert line.startswith("error: integrity: request 1 (prompt b): ") and "token 5000 at index 7" in line, line
    assert line.endswith(f"; 1 valid results kept in {partial}"), line
    assert not out.exists()
    assert [json.loads(line)["id"] for line in partial.read_text().splitlines()] == ["a"]


def test_generate_with_a_crashing_engine_exits_5_with_its_log_tail(suite, tmp_path):
    result = CliRunner().invoke(
        app,
        [
            str(a)
            for a in (
                "generate",
                "--engine",
                CATALOGUE["crash in generate"].engine,
                "--model",
                suite["target"],
                "--drafter",
                suite["drafter"],
                "--prompts",
                suite["prompts"],
                "--limit",
                "2",
                "--out",
                tmp_path / "g.jsonl",
                "--engine-timeout",
                "10",
            )
        ],
    )
    assert result.exit_code == 5, result.output
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[ddtree] ")]
    assert lines[0].startswith(f"error: engine '{M}CrashInGenerate' "), lines  # wording: tests/test_isolation.py
    assert lines[0].endswith(" during generate: exit code 139"), lines
    assert lines[1:] == ["--- engine log tail ---", "about to crash: simulated segfault in the engine's kernel"]


def test_pytest_items_after_the_engine_died_fail_fast_with_one_line(suite, tmp_path, capsys):
    code = pytest.main(
        [
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
            "-rf",
            str(tmp_path),
            "--ddtree-engine",
            CATALOGUE["crash in generate"].engine,
            f"--ddtree-model={suite['target']}",
            f"--ddtree-drafter={suite['drafter']}",
            f"--ddtree-prompts={suite['prompts']}",
            "--ddtree-limit",
            "2",
            "--ddtree-max-new-tokens",
            "8",
            "--ddtree-modes",
            "ddtree",
            "--ddtree-budgets",
            "4",
            "--ddtree-check",
            "lossless",
            "--ddtree-check",
            "tree-structure",
            "--ddtree-engine-timeout",
            "10",
            f"--ddtree-golden-dir={tmp_path / 'golden'}",
            f"--ddtree-report={tmp_path / 'check.json'}",  # never the user's reports/ (issue 31)
        ]
    )
    out, err = capsys.readouterr()
    assert code == pytest.ExitCode.TESTS_FAILED, out + err
    assert "2 failed" in out
    died = f"engine '{M}CrashInGenerate' crashed during generate: exit code 139"
    lines = out.splitlines()
    first = lines.index(died)  # the item it happened in: the cause, then the engine's log tail
    assert lines[first + 1 : first + 3] == [
        "--- engine log tail ---",
        "about to crash: simulated segfault in the engine's kernel",
    ]
    later = [line for line in lines[first + 3 :] if line.startswith(f"not run: engine '{M}CrashInGenerate' ")]
    assert later and all(line.endswith(f" is not restarted: {died}") for line in later), lines[first:]
    assert "Traceback" not in out and "During handling" not in out


def test_misbehaving_module_imports_no_torch():
    """The process faults start in about a second because their module imports nothing heavy."""
    import subprocess
    import sys

    code = "import sys, ddtree_conformance.testing.misbehaving; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    assert misbehaving.CATALOGUE is CATALOGUE


def test_pytest_refuses_a_budget_above_the_engines_in_every_item(suite, tmp_path, capsys):
    code = pytest.main(
        [
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
            str(tmp_path),
            "--ddtree-engine",
            "reference",
            "--ddtree-no-isolate",
            f"--ddtree-model={suite['target']}",
            f"--ddtree-drafter={suite['drafter']}",
            f"--ddtree-prompts={suite['prompts']}",
            "--ddtree-modes",
            "ddtree",
            "--ddtree-budgets",
            "4,5000",
            "--ddtree-check",
            "lossless",
            f"--ddtree-golden-dir={tmp_path / 'golden'}",
            f"--ddtree-report={tmp_path / 'check.json'}",  # never the user's reports/ (issue 31)
        ]
    )
    out, err = capsys.readouterr()
    assert code == pytest.ExitCode.TESTS_FAILED and "2 failed" in out, out + err
    message = (
        "ddtree-conformance: --ddtree-budgets 5000: engine 'reference' accepts budgets up to 4096 "
        "(capabilities().max_budget)"
    )
    assert out.splitlines().count(message) == 2, out


def test_pytest_with_an_unknown_engine_stops_with_one_error(tmp_path, capsys):
    code = pytest.main(["-p", "no:cacheprovider", "--co", "-q", str(tmp_path), "--ddtree-engine", "nosuch"])
    out, err = capsys.readouterr()
    assert code == pytest.ExitCode.USAGE_ERROR, out + err
    (line,) = [line for line in err.splitlines() if line.startswith("ERROR: ")]
    assert line.startswith("ERROR: ddtree-conformance: --ddtree-engine: unknown engine"), line
    assert "'nosuch'; known engines: " in line, line
    assert "Traceback" not in out + err


# -- the rules themselves: the reference engine keeps them in every edge case ------------------------
def test_reference_results_keep_every_integrity_rule(reference_engine, random_pair):
    """Stops inside a round, at the prefill's token and at a round's end, limits from 1 token up,
    traced: no rule fires on the correct engine (the rules never fail a correct engine)."""
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.integrity import PairLimits, result_problem

    limits = PairLimits.read(*random_pair)
    assert (limits.vocab_size, limits.block_size) == (97, 8)
    caps = reference_engine.capabilities()
    prompts = [[1, 2, 3, 4], [9, 8, 7, 6, 5, 4, 3], [11]]
    plain = reference_engine.generate(
        [Request(prompt_ids=p, max_new_tokens=12) for p in prompts], RunConfig(mode="plain")
    )
    requests = [Request(prompt_ids=p, max_new_tokens=n) for p in prompts for n in (1, 2, 3, 5, 12)]
    requests += [
        Request(prompt_ids=p, max_new_tokens=12, stop_token_ids=[r.output_ids[i]])
        for p, r in zip(prompts, plain)
        for i in (0, 1, 4, 9)
    ]
    checked = 0
    for mode, budget in (("plain", 1), ("dflash", 1), ("ddtree", 4), ("ddtree", 32)):
        config = RunConfig(mode=mode, budget=budget, trace=True)
        for request, result in zip(requests, reference_engine.generate(requests, config)):
            assert result_problem(result, request, config, limits, caps) is None, (mode, request, result)
            checked += 1
    assert checked == 4 * len(requests)


def test_rules_name_the_field_for_results_no_engine_should_send(random_pair):
    from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
    from ddtree_conformance.integrity import PairLimits, validate_results

    limits = PairLimits.read(*random_pair)
    request = Request(prompt_ids=[1, 2], max_new_tokens=4, stop_token_ids=[7])
    config = RunConfig(mode="ddtree", budget=4)
    cases = {
        "field output_ids: empty": RequestResult(output_ids=[], finish_reason="stop"),
        "field output_ids: True at index 0 is not a token id": RequestResult.model_construct(
            output_ids=[True], finish_reason="length"
        ),
        "field finish_reason: 'length', but the output ends with the stop token 7": RequestResult(
            output_ids=[1, 2, 3, 7], finish_reason="length"
        ),
        "field finish_reason: 'length', but the output holds 2 tokens, not max_new_tokens 4": RequestResult(
            output_ids=[1, 2], finish_reason="length"
        ),
        "field rounds: 3, but acceptance_lengths has 2 entries": RequestResult.model_construct(
            output_ids=[1, 2, 3, 4], finish_reason="length", rounds=3, acceptance_lengths=[2, 1]
        ),
        "field acceptance_lengths: no rounds, but the output holds 4 tokens": RequestResult(
            output_ids=[1, 2, 3, 4], finish_reason="length", rounds=0, acceptance_lengths=[]
        ),
        "field mean_acceptance: 9.5 is outside [1, 8]": RequestResult(
            output_ids=[1, 2, 3, 4], finish_reason="length", mean_acceptance=9.5
        ),
        "field per_position_acceptance: depth 2: 1.5 is not a rate in [0, 1]": RequestResult(
            output_ids=[1, 2, 3, 4], finish_reason="length", per_position_acceptance=[0.5, 1.5]
        ),
        "field error: the result is marked failed (finish_reason 'error') without a message": RequestResult(
            output_ids=[], finish_reason="error"
        ),
    }
    got = validate_results([request] * len(cases), list(cases.values()), config, limits, labels=["prompt x"] * 9)
    for want, result in zip(cases, got):
        assert result.finish_reason == "error" and result.output_ids == []
        assert result.error.startswith("integrity: request ") and want in result.error, (want, result.error)
    assert validate_results([request], "nonsense", config, limits)[0].error == (
        "integrity: engine returned str, not a list of results"
    )


def test_drafter_logits_that_are_not_finite_fail_naming_the_field(reference_engine, random_pair):
    """A traced round whose drafter logits hold NaN or +inf, or a row that is -inf everywhere, is one clear
    integrity failure naming the trace and the row; -inf at some tokens (a padded vocabulary's mask) is not."""
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.integrity import PairLimits, result_problem

    limits = PairLimits.read(*random_pair)
    request = Request(prompt_ids=[1, 2, 3, 4], max_new_tokens=12)
    config = RunConfig(mode="ddtree", budget=4, trace=True, trace_draft_logits=True)
    (result,) = reference_engine.generate([request], config)
    caps = reference_engine.capabilities()

    def with_logits(change):
        rows = [list(row) for row in result.traces[0].draft_logits]
        change(rows)
        trace = result.traces[0].model_copy(update={"draft_logits": rows})
        return result.model_copy(update={"traces": [trace, *result.traces[1:]]})

    def set_value(value):
        def change(rows):
            rows[1][5] = value

        return change

    assert result_problem(with_logits(set_value(float("-inf"))), request, config, limits, caps) is None

    def huge(rows):  # finite, but their sum overflows to inf: the rule's quick path (one sum) must not decide
        rows[1][5] = rows[1][6] = 1.7e308

    assert result_problem(with_logits(huge), request, config, limits, caps) is None
    for value in (float("nan"), float("inf")):
        problem = result_problem(with_logits(set_value(value)), request, config, limits, caps)
        assert problem is not None and problem.field == "traces[0].draft_logits", problem
        assert "row 1 token 5" in str(problem), problem

    def all_masked(rows):
        rows[2] = [float("-inf")] * len(rows[2])

    problem = result_problem(with_logits(all_masked), request, config, limits, caps)
    assert problem is not None and "row 2 is -inf at every token" in str(problem), problem
    for value in ("x", None, 1j, 10**400):  # past pydantic; an int beyond a float's range overflowed the sum
        problem = result_problem(with_logits(set_value(value)), request, config, limits, caps)
        assert problem is not None and problem.field == "traces[0].draft_logits", (value, problem)
        assert "an entry is not a number in a float's range" in str(problem), (value, problem)

    def cancelling(rows):  # ints sum exactly, so two beyond a float's range could cancel in the quick path
        rows[1][5], rows[1][6] = 10**400, -(10**400)

    problem = result_problem(with_logits(cancelling), request, config, limits, caps)
    assert problem is not None and "an entry is not a number in a float's range" in str(problem), problem
    for mean in (10**400, float("nan")):  # beyond a float: one error naming the field, not an OverflowError
        broken = result.model_copy(update={"mean_acceptance": mean})
        assert result_problem(broken, request, config, limits, caps).field == "mean_acceptance", mean
