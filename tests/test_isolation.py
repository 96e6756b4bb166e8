"""Engines in their own process: results cross the pipe; a crash or a hang fails that engine only."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest
import torch

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.process import IsolatedEngine

BAD_ENGINES = textwrap.dedent(
    """
    import os, time
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    class CrashingEngine(ReferenceEngine):
        def generate(self, requests, config):
            print("about to crash: simulated segfault")
            os._exit(139)

    class HangingEngine(ReferenceEngine):
        def generate(self, requests, config):
            time.sleep(600)

    class FailingInit(ReferenceEngine):
        def __init__(self, *a, **k):
            raise RuntimeError("no accelerator for this engine")
    """
)


@pytest.fixture(scope="module")
def bad_engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_engines")
    (root / "bad_engines_mod.py").write_text(BAD_ENGINES)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(root))
    yield "bad_engines_mod"
    sys.path.remove(str(root))


def test_isolated_reference_matches_in_process(random_pair, reference_engine):
    target, drafter = random_pair
    requests = [Request(prompt_ids=[1, 2, 3], max_new_tokens=12), Request(prompt_ids=[9], max_new_tokens=7)]
    config = RunConfig(mode="ddtree", budget=8, trace=True)
    # Same torch thread count on both sides: CPU matmul reductions, and so the traced top-2
    # margins' low bits, depend on it.
    with IsolatedEngine("reference", str(target), str(drafter), torch_threads=torch.get_num_threads()) as engine:
        assert engine.capabilities().traces
        remote = engine.generate(requests, config)
    local = reference_engine.generate(requests, config)
    assert [r.output_ids for r in remote] == [r.output_ids for r in local]
    assert remote[0].traces == local[0].traces


def test_crash_becomes_failed_results_with_log_tail(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:CrashingEngine", str(target), str(drafter))
    results = engine.generate([Request(prompt_ids=[1], max_new_tokens=4)] * 2, RunConfig(mode="plain"))
    assert [r.finish_reason for r in results] == ["error", "error"]
    assert "crashed" in results[0].error and "exit code 139" in results[0].error
    assert "simulated segfault" in results[0].error  # the log tail travels with the failure
    engine.close()


def test_hang_times_out_and_the_next_call_gets_a_fresh_child(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:HangingEngine", str(target), str(drafter), timeout_s=3)
    started = time.monotonic()
    results = engine.generate([Request(prompt_ids=[1], max_new_tokens=4)], RunConfig(mode="plain"))
    assert "hung" in results[0].error and time.monotonic() - started < 60
    assert engine.capabilities().name == "reference"  # a fresh child answers
    engine.close()


def test_failing_start_names_the_engine_and_cause(random_pair, bad_engines):
    target, drafter = random_pair
    engine = IsolatedEngine(f"{bad_engines}:FailingInit", str(target), str(drafter))
    with pytest.raises(EngineError, match="FailingInit.*failed to start.*no accelerator"):
        engine.capabilities()
