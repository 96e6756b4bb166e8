"""A replay is kept per process (adapters/reference/replay.py, replay_result): asked again with the same
inputs it is handed out again, as copies; a pair rewritten in place, another result, or a caller that
keeps logits of its own choosing is replayed again."""

from __future__ import annotations

import os
import shutil

import pytest

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference import replay
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.prompts import load_prompts


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = replay._replayed

    def counting(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(replay, "_replayed", counting)
    return calls


def test_a_replay_is_kept_and_redone_when_its_inputs_change(tmp_path, counted):
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(FIXTURE_TARGET, target)
    shutil.copytree(FIXTURE_DRAFTER, drafter)
    engine = ReferenceEngine(str(target), str(drafter))
    request = Request(prompt_ids=load_prompts("fixture")[0].prompt_ids, max_new_tokens=12)
    result = engine.generate([request], RunConfig(mode="ddtree", budget=8))[0]
    output, lengths = list(result.output_ids), list(result.acceptance_lengths)

    def again(**kw):
        return replay.replay_result(engine, request, output, kw.get("lengths", lengths), "ddtree", 8, **kw.get("x", {}))

    first = again()
    second = again()
    assert len(counted) == 1, "the second call is the kept replay"
    assert [(r.offset, r.length, r.tokens) for r in second] == [(r.offset, r.length, r.tokens) for r in first]
    second[0].tokens.append(-1)
    assert -1 not in again()[0].tokens, "each caller gets its own lists"
    again(lengths=None)  # another result (paced): replayed
    again(x={"keep_logits": lambda *_: True})  # logits the caller chooses: never kept
    again(x={"keep_logits": lambda *_: True})
    assert len(counted) == 4
    weights = next(p for p in drafter.iterdir() if p.suffix == ".safetensors")
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # the pair rewritten in place
    again()
    assert len(counted) == 5
