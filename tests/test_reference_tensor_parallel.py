"""The reference engine's real tensor parallelism, on CPU (gloo ranks), and its TP mutants.

TP=2 shards the fixture target over two processes with transformers' plan; reduction order
changes, so these tests also show that the fixture's outputs and per-round acceptance survive it
exactly in fp32 (the passing run, in the engine's own process as the CLI runs it, is
tests/test_cli.py::test_check_runs_the_tp_check_on_cpu_when_asked). The mutants break the sharded path
only: the TP check must catch them.
"""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.tensor_parallel import shardable_sizes
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.runs import by_id, plan_and_run
from ddtree_conformance.testing.tp_engines import DriverOnlyKvMove, RankDiesInRun, RankFailsToStart, RankLocalResult

SETTINGS = SuiteSettings(
    limit=4, budgets=[16], max_new_tokens=32, tensor_parallel_size=2, torch_threads=1, held_out_prompts=0
)  # "4 match": the four prompts of the set


def _tp_check(engine_class=None, **updates):
    return by_id(plan_and_run(SETTINGS.model_copy(update=updates), engine_class, ["tensor-parallel"]))


def test_driver_only_kv_move_fails_trees_not_chains():
    results = _tp_check(DriverOnlyKvMove, isolate=False)
    assert results["tensor-parallel/dflash"].status == "pass"  # a chain's accepted rows are its first rows
    tree = results["tensor-parallel/ddtree-B16"]
    assert tree.status == "fail"
    assert "TP=2 output differs from TP=1 on" in tree.message


def test_ranks_that_disagree_are_refused_naming_the_rank():
    engine = RankLocalResult(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    try:
        with pytest.raises(
            EngineError,
            match=r"tensor_parallel_size=2: rank 1 disagrees with rank 0 on request 0: output "
            r"token 3 is \d+ there, \d+ on rank 0",
        ):
            engine.generate(
                [Request(prompt_ids=[5, 6, 7], max_new_tokens=4)],
                RunConfig(mode="ddtree", budget=8, tensor_parallel_size=2),
            )
    finally:
        engine.close()


def test_a_rank_that_dies_while_starting_is_an_error_not_a_wait():
    engine = RankFailsToStart(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    try:
        with pytest.raises(EngineError, match=r"tensor-parallel rank 1 exited with code 1 before joining"):
            engine.generate([Request(prompt_ids=[5, 6, 7], max_new_tokens=4)], RunConfig(tensor_parallel_size=2))
    finally:
        engine.close()


# 15 s of a CI worker: nightly (thorough); a rank that dies while starting stays in CI (above)
@pytest.mark.thorough
def test_a_rank_that_dies_in_a_run_fails_that_call_and_the_next_call_restarts_the_ranks():
    engine = RankDiesInRun(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    config = RunConfig(mode="ddtree", budget=8, tensor_parallel_size=2)
    fine = [Request(prompt_ids=[5, 6, 7], max_new_tokens=4)]
    try:
        before = engine.generate(fine, config)
        with pytest.raises(
            EngineError,
            match=r"tensor_parallel_size=2: the rank group failed \(.*Connection closed "
            r".*\); it restarts on the next call",
        ):
            engine.generate([Request(prompt_ids=[RankDiesInRun.FATAL_TOKEN, 6], max_new_tokens=4)], config)
        after = engine.generate(fine, config)
        assert [(r.output_ids, r.acceptance_lengths) for r in after] == [
            (r.output_ids, r.acceptance_lengths) for r in before
        ]
    finally:
        engine.close()


def test_tp_size_must_split_heads_and_gpus_must_be_visible():
    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    request = [Request(prompt_ids=[5, 6, 7], max_new_tokens=4)]
    with pytest.raises(
        EngineError,
        match=r"tensor_parallel_size=4 does not split target .* evenly "
        r"\(num_attention_heads 6, num_key_value_heads 6",
    ):
        engine.generate(request, RunConfig(tensor_parallel_size=4))
    with pytest.raises(EngineError, match=r"tensor_parallel_size=2 on CUDA needs 2 visible GPUs, 0 visible"):
        engine.generate(request, RunConfig(tensor_parallel_size=2, device="cuda"))


def test_shardable_sizes():
    assert shardable_sizes(6, 6, 512, 3072, 8) == [1, 2]  # the fixture: 512 MLP columns do not split in 3
    assert shardable_sizes(32, 8, 12288, 151936, 8) == [1, 2, 4, 8]  # Qwen3-8B's shape
    assert shardable_sizes(2, 2, 48, 97, 8) == [1]
