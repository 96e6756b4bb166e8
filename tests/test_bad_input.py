"""Bad input is a usage error found before any engine work: exit 2, one line naming the file, line and
field; the engine never starts (conformance/input_validation.py). No input file crashes a check."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from ddtree_conformance.cli import app

# An engine that leaves a file behind the moment it is built: a test that finds no file proves that
# nothing started it.
MARKER_ENGINE = """
import os
from pathlib import Path
from ddtree_conformance.adapters.interface import Capabilities, Engine, RequestResult

class Marker(Engine):
    name = "marker"
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Path(os.environ["DDTC_MARKER"]).write_text("started")
    def capabilities(self):
        return Capabilities(name=self.name, modes=["plain", "dflash", "ddtree"], dtypes=["float32"],
                            devices=["cpu"], sampling=True, traces=False, per_round_acceptance=False)
    def generate(self, requests, config):
        return [RequestResult(output_ids=[1] * r.max_new_tokens, finish_reason="length") for r in requests]
"""

VOCAB, CONTEXT = 97, 256
GOOD = {"id": "a", "prompt_ids": [1, 2, 3]}


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A target dir holding only config.json (nothing reads the weights before validation), a drafter
    dir, the marker engine and its marker path."""
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    target.mkdir()
    drafter.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": VOCAB, "max_position_embeddings": CONTEXT}))
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))
    (tmp_path / "ddtc_marker_engine.py").write_text(textwrap.dedent(MARKER_ENGINE))
    monkeypatch.syspath_prepend(str(tmp_path))
    marker = tmp_path / "engine-started"
    monkeypatch.setenv("DDTC_MARKER", str(marker))
    return tmp_path, target, drafter, marker


def _check(tmp_path, target, drafter, prompts, *extra):
    args = [
        "check",
        "--engine",
        "ddtc_marker_engine:Marker",
        "--model",
        target,
        "--drafter",
        drafter,
        "--prompts",
        prompts,
        "--pair-name",
        "bad",
        "--golden-dir",
        tmp_path / "golden",
        "--no-isolate",
        "--max-new-tokens",
        "8",
        "--out",
        tmp_path / "r.json",
        *extra,
    ]
    return CliRunner().invoke(app, [str(a) for a in args])


def _lines(*objects) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


CASES = {
    "malformed JSON": (_lines(GOOD, '{"id": "b", "prompt_ids": [1, 2'), [":2:", "bad JSON"]),
    "nested 100,000 deep": (
        _lines('{"id": "a", "prompt_ids": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        [":1:", "nested too deep"],
    ),
    "a 5000-digit integer": (_lines('{"id": "a", "prompt_ids": [' + "7" * 5000 + "]}"), [":1:", "integer too long"]),
    "prompt_ids a string": (_lines({"id": "a", "prompt_ids": "1 2 3"}), [":1:", "field 'prompt_ids'"]),
    "id a list": (_lines({"id": ["a"], "prompt_ids": [1]}), [":1:", "field 'id'"]),
    "max_new_tokens a string": (
        _lines({"id": "a", "prompt_ids": [1], "max_new_tokens": "8"}),
        [":1:", "field 'max_new_tokens'"],
    ),
    "not a JSON object": (_lines(GOOD, "[1, 2, 3]"), [":2:", "expected a JSON object"]),
    "id outside the vocabulary": (
        _lines(GOOD, {"id": "b", "prompt_ids": [5, VOCAB]}),
        [":2:", "field 'prompt_ids'", f"token id {VOCAB}", f"vocab_size {VOCAB}"],
    ),
    "a 4000-digit id": (_lines({"id": "a", "prompt_ids": [int("9" * 4000)]}), [":1:", "outside the vocabulary"]),
    "prompt longer than the context": (
        _lines(GOOD, {"id": "long", "prompt_ids": [1] * (CONTEXT - 4)}),
        [":2:", "field 'prompt_ids'", f"{CONTEXT - 4} tokens + --max-new-tokens 8", f"context of {CONTEXT} tokens"],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_prompts_are_refused_before_the_engine_starts(setup, case):
    tmp_path, target, drafter, marker = setup
    text, fragments = CASES[case]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    result = _check(tmp_path, target, drafter, prompts)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[ddtree] ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) < 400, lines
    for fragment in [str(prompts), *fragments]:
        assert fragment in lines[0], lines[0]
    assert not marker.exists(), "the engine started"


def test_max_new_tokens_past_the_context_is_refused_before_the_engine_starts(setup):
    tmp_path, target, drafter, marker = setup
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_lines(GOOD))
    result = _check(tmp_path, target, drafter, prompts, "--max-new-tokens", str(CONTEXT))
    assert result.exit_code == 2, result.output
    assert f"--max-new-tokens {CONTEXT}: the target's context holds {CONTEXT} tokens" in result.stderr
    assert str(target / "config.json") in result.stderr
    assert not marker.exists()


def test_good_prompts_start_the_engine(setup):
    """The marker works: the same command on good input starts the engine."""
    tmp_path, target, drafter, marker = setup
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_lines(GOOD))
    _check(tmp_path, target, drafter, prompts, "--check", "lossless/dflash")
    assert marker.exists()


DEEP = "[" * 100_000 + "]" * 100_000
LONG_INT = "7" * 5000


@pytest.mark.parametrize("content", [DEEP, '{"a": ' + LONG_INT + "}"], ids=["deep", "long-int"])
@pytest.mark.parametrize(
    "where", ["pairs file", "calibration manifest", "golden file", "drafter config", "target config"]
)
def test_no_input_file_crashes_a_run(setup, where, content):
    """Every file a run reads, nested 100,000 deep or holding a 5000-digit integer: exit 2, one line
    naming the file, before any engine work."""
    tmp_path, target, drafter, marker = setup
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(_lines(GOOD))
    extra: list = []
    if where == "pairs file":
        path = tmp_path / "pairs.json"
        extra = ["--pairs-file", path, "--pair", "x"]
    elif where == "calibration manifest":
        path = tmp_path / "MANIFEST.json"  # beside the target dir: the pair's manifest
        extra = ["--dtype", "bfloat16"]
    elif where == "golden file":
        path = tmp_path / "golden" / "bad" / "prompts-float32.json"
        path.parent.mkdir(parents=True)
    else:
        path = (drafter if where == "drafter config" else target) / "config.json"
    path.write_text(content)
    result = _check(tmp_path, target, drafter, prompts, *extra)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("[ddtree] ")]
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in result.output, lines
    assert not marker.exists()
