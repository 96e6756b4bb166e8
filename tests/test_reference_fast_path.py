"""The reference engine's fast path (static caches, CUDA graphs on CUDA) on CPU, where its buffers run
eagerly: the same outputs as the eager oracle, the spec's steps honoured, and the graph runner's rules.

tests/test_gpu.py checks the same equality on CUDA with the graphs captured and replayed.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.reference.clock import busy_seconds
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.graphs import GraphRunner, capacity_for
from ddtree_conformance.checks.cuda_graphs import check_cuda_graphs
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.prompts import load_prompts
from ddtree_conformance.session import SuiteSession
from ddtree_conformance.settings import build_settings
from ddtree_conformance.testing.graph_mutants import StalePositionsUnderGraphs
from ddtree_conformance.testing.mutants import (
    DrafterPositionsOffByOne,
    FirstRowsCompaction,
    FirstRowsFeedback,
    FlatPositions,
    SiblingMask,
)
from ddtree_conformance.testing.shaped_pair import build_shaped_pair, random_prompts

RUNS = [("plain", 1), ("dflash", 1), ("ddtree", 16)]


@pytest.fixture(scope="module")
def fixture_requests():
    return [Request(prompt_ids=p.prompt_ids, max_new_tokens=16) for p in load_prompts("fixture")[:2]]


@pytest.fixture(scope="module")
def fixture_engine():
    return ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))


def both(engine, requests, mode, budget, **config):
    return [
        engine.generate(requests, RunConfig(mode=mode, budget=budget, cuda_graphs=graphs, trace=True, **config))
        for graphs in (False, True)
    ]


@pytest.mark.parametrize("mode, budget", RUNS)
def test_fast_path_outputs_equal_the_eager_path(fixture_engine, fixture_requests, mode, budget):
    eager, fast = both(fixture_engine, fixture_requests, mode, budget)
    assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
    assert [r.acceptance_lengths for r in fast] == [r.acceptance_lengths for r in eager]
    if mode != "plain":  # the trees too: the drafter reads the same context
        assert [[t.tree_tokens for t in r.traces] for r in fast] == [[t.tree_tokens for t in r.traces] for r in eager]
    assert fast[0].engine_settings == {
        "cuda_graphs": False,
        "static_kv_cache": True,
        "fused_layers": True,
        "overlap_scheduling": False,
        "attention_backend": "sdpa",
    }
    assert eager[0].engine_settings["static_kv_cache"] is False


@pytest.mark.parametrize("fused", ["on", "off"])
def test_fused_and_transformers_layers_with_grouped_kv_heads(fused):
    """The tiny shaped pair has 4 query heads over 2 KV heads: the fused layers' grouped attention."""
    target_dir, drafter_dir, target, drafter = build_shaped_pair("tiny", torch.float32, "cpu", tempfile.mkdtemp())
    engine = ReferenceEngine(str(target_dir), str(drafter_dir), fused_layers=fused)
    engine.use_models(target, drafter, RunConfig(mode="ddtree"))
    requests = [Request(prompt_ids=p, max_new_tokens=10) for p in random_prompts(2, 12, 512)]
    for mode, budget in (("plain", 1), ("ddtree", 8)):
        eager, fast = both(engine, requests, mode, budget)
        assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
        assert [r.acceptance_lengths for r in fast] == [r.acceptance_lengths for r in eager]
        assert fast[0].engine_settings["fused_layers"] is (fused == "on")


def test_a_compaction_step_the_engine_replaces_runs_on_the_static_cache(fixture_requests):
    """Broken builds replace one spec step; the fast path must run theirs, not its own."""
    mutant = FirstRowsCompaction(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    eager, fast = both(mutant, fixture_requests, "ddtree", 16)
    assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
    good = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    right = good.generate(fixture_requests, RunConfig(mode="ddtree", budget=16, cuda_graphs=True))
    assert [r.output_ids for r in fast] != [r.output_ids for r in right]  # the mutant's bug survived


def test_a_greedy_ddtree_round_runs_after_its_draft_as_one_graph_with_the_host_path_s_outputs(fixture_requests):
    """The fast path's round on the device (tree, verify inputs, verify, walk: ``StaticDecoder.tree_round``)
    and the same round on the host (``device_tree=off``) give the eager oracle's outputs, acceptance and
    trees; the stages show which ran."""
    runs = {}
    for device_tree in ("on", "off"):
        engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree=device_tree)
        config = RunConfig(mode="ddtree", budget=16, cuda_graphs=True, trace=True, timing=True)
        runs[device_tree] = engine.generate(fixture_requests, config)
    eager = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)).generate(
        fixture_requests, RunConfig(mode="ddtree", budget=16, trace=True)
    )
    for fast in runs.values():
        assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
        assert [r.acceptance_lengths for r in fast] == [r.acceptance_lengths for r in eager]
        for field in ("tree_tokens", "parents", "depths", "positions", "accepted", "target_tokens", "bonus"):
            assert [[getattr(t, field) for t in r.traces] for r in fast] == [
                [getattr(t, field) for t in r.traces] for r in eager
            ], field
        assert [r.verified_trees for r in fast] == [r.verified_trees for r in eager]  # every field
    assert "tree_round" in runs["on"][0].timings.stages and "build" not in runs["on"][0].timings.stages
    assert "build" in runs["off"][0].timings.stages and "tree_round" not in runs["off"][0].timings.stages
    with pytest.raises(EngineError, match="device_tree must be 'auto', 'on' or 'off'"):
        ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="gpu")


def test_the_blas_library_is_set_for_the_verify_only_and_always_restored(monkeypatch):
    """``lean.blas_library``: on a CUDA device the preferred library is ``name`` inside and the one before after,
    an error included; with no name, or off CUDA, nothing is touched (a CPU-only PyTorch refuses cuBLASLt)."""
    from ddtree_conformance.adapters.reference import lean

    state, calls = ["cublas"], []

    def preferred(name=None):
        if name is not None:
            calls.append(name)
            state[0] = name
        return state[0]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred)
    with lean.blas_library("cublaslt", torch.device("cuda")):
        assert state[0] == "cublaslt"
    assert state[0] == "cublas"
    with pytest.raises(RuntimeError, match="inside"), lean.blas_library("cublaslt", torch.device("cuda")):
        raise RuntimeError("inside")
    assert state[0] == "cublas" and calls == ["cublaslt", "cublas", "cublaslt", "cublas"]
    with lean.blas_library(None, torch.device("cuda")), lean.blas_library("cublaslt", torch.device("cpu")):
        pass
    assert len(calls) == 4


@pytest.mark.parametrize(
    ("from_rows", "dtype", "library"),
    [
        (17, "bfloat16", "cublaslt"),
        (18, "bfloat16", None),
        (0, "bfloat16", None),
        (1, "float16", "cublaslt"),
        (17, "float32", None),
    ],
)
def test_cublaslt_reaches_the_rounds_verify_from_its_row_count(
    fixture_requests, monkeypatch, from_rows, dtype, library
):
    """``lean.VERIFY_CUBLASLT_FROM_ROWS``: the device round asks for cuBLASLt around the target's forward over the
    tree when the tree has at least that many rows (B = 16: 17 rows) in bf16 or fp16, never in fp32, never around
    the draft or a plain step, and never with 0; outputs stay the eager path's (a no-op on a CPU). Fails when the
    decoder ignores the threshold or the dtype, counts the rows otherwise (``>`` for ``>=``, the budget for the
    rows) or asks outside the verify."""
    from ddtree_conformance.adapters.reference import decoders, lean

    asked, blas = [], lean.blas_library

    def recording(name, device):
        asked.append(name)
        return blas(name, device)

    monkeypatch.setattr(decoders, "blas_library", recording)
    monkeypatch.setattr(lean, "VERIFY_CUBLASLT_FROM_ROWS", from_rows)
    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    fast = engine.generate(fixture_requests[:2], RunConfig(mode="ddtree", budget=16, dtype=dtype, cuda_graphs=True))
    eager = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)).generate(
        fixture_requests[:2], RunConfig(mode="ddtree", budget=16, dtype=dtype)
    )
    assert [r.output_ids for r in fast] == [r.output_ids for r in eager]
    rounds = sum(len(r.acceptance_lengths) for r in fast)
    assert rounds and asked == [library] * rounds  # one verify a round (eager on a CPU: no graph replays it)


def test_stale_positions_stay_broken_when_the_round_runs_as_one_graph(fixture_requests):
    """The round as one graph carries its start from round to round on the device; a build whose start
    never reaches the graph's buffer after the first round must still go wrong there."""
    config = RunConfig(mode="ddtree", budget=16, cuda_graphs=True, timing=True)
    good = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on").generate(
        fixture_requests, config
    )
    bad = StalePositionsUnderGraphs(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    broken = bad.generate(fixture_requests, config)
    assert "tree_round" in broken[0].timings.stages
    assert [r.output_ids for r in broken] != [r.output_ids for r in good]


@pytest.mark.parametrize(
    "mutant", [FlatPositions, SiblingMask, FirstRowsCompaction, FirstRowsFeedback, DrafterPositionsOffByOne]
)
def test_a_build_that_replaces_a_round_step_runs_its_round_on_the_host(fixture_requests, mutant):
    """With ``device_tree`` on, a broken build's own step (compile, mask, compaction, feedback, drafter
    positions) must run, not the device round's correct one: its bug survives on the fast path (the
    target's tokens at the tree's nodes part from the correct engine's)."""
    engine = mutant(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    config = RunConfig(mode="ddtree", budget=16, cuda_graphs=True, timing=True)
    broken = engine.generate(fixture_requests, config)
    assert "tree_round" not in broken[0].timings.stages
    right = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    correct = right.generate(fixture_requests, config)
    assert "tree_round" in correct[0].timings.stages
    seen = [[t.node_target_tokens for t in r.verified_trees] for r in broken]
    assert seen != [[t.node_target_tokens for t in r.verified_trees] for r in correct]


def test_cuda_graphs_default_and_options():
    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    assert engine.capabilities().cuda_graphs
    assert not engine.fast_path_on(RunConfig(device="cpu"))  # eager on CPU unless asked
    assert engine.fast_path_on(RunConfig(device="cuda"))  # graphs by default on CUDA
    assert not engine.fast_path_on(RunConfig(device="cuda", cuda_graphs=False))
    assert not engine.fast_path_on(RunConfig(device="cuda", tensor_parallel_size=2))  # TP runs eagerly
    off = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), cuda_graphs="off")
    assert not off.fast_path_on(RunConfig(device="cuda")) and off.fast_path_on(RunConfig(cuda_graphs=True))
    with pytest.raises(EngineError, match="cuda_graphs must be 'on' or 'off'"):
        ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), cuda_graphs="maybe")


def test_graph_runner_fills_buffers_in_place_per_key():
    runner = GraphRunner(torch.device("cpu"), capture=True, limit=2)
    assert not runner.capture  # no CUDA: never captures
    seen = []

    def double(static):
        seen.append(static["x"].data_ptr())
        return static["x"] * 2

    assert runner.run("a", double, {"x": torch.tensor([1.0])}).item() == 2
    assert runner.run("a", double, {"x": torch.tensor([5.0])}).item() == 10
    assert seen[0] == seen[1]  # the same buffer, written in place
    stale = runner.run("a", double, {"x": torch.tensor([7.0])}, fill=lambda static, name, value: None)
    assert stale.item() == 10  # a fill that skips the buffer leaves the old input: what a graph would read
    runner.run("b", double, {"x": torch.tensor([1.0])})
    runner.run("c", double, {"x": torch.tensor([1.0])})
    assert list(runner._entries) == ["b", "c"] and runner.eager_calls == 5  # least recently used dropped


def test_capacities_and_busy_time():
    assert [capacity_for(n) for n in (1, 256, 257, 1500)] == [256, 256, 512, 2048]
    assert busy_seconds([(0, 10), (5, 20), (30, 40)]) == pytest.approx(30e-9)  # overlaps counted once
    assert busy_seconds([]) == 0


def cuda_graphs_session(engine: str, **fields) -> SuiteSession:
    base = {"engine": engine, "budgets": [16], "modes": ["ddtree"], "max_new_tokens": 12, "limit": 2, "isolate": False}
    settings, _ = build_settings({**base, **fields})
    return SuiteSession(settings)


def test_cuda_graphs_check_passes_the_reference_and_fails_stale_positions():
    session = cuda_graphs_session("reference")
    try:
        result = check_cuda_graphs(session, "ddtree", 16)
    finally:
        session.close()
    assert result.status == "pass", result.message
    assert "per-round acceptance equals graphs off" in result.message
    session = cuda_graphs_session(f"{StalePositionsUnderGraphs.__module__}:StalePositionsUnderGraphs")
    try:
        result = check_cuda_graphs(session, "ddtree", 16)
    finally:
        session.close()
    assert result.status == "fail" and "output with CUDA graphs differs from graphs off" in result.message


def test_cuda_graphs_check_skips_an_engine_that_cannot_switch():
    session = cuda_graphs_session("ddtree_conformance.testing.recorded_timings:RecordedTimings")
    try:
        result = check_cuda_graphs(session, "ddtree", 16)
    finally:
        session.close()
    assert result.status == "skip" and "capabilities().cuda_graphs" in result.message


def test_in_bf16_the_graphs_on_run_is_judged_against_the_fp32_reference():
    """bf16: the graphs-on run's acceptance is judged as the acceptance check judges a run (round by round
    against the fp32 replay on its own outputs), not held to the graphs-off run's tau, which rounds differently."""
    session = cuda_graphs_session("reference", max_new_tokens=24, limit=4, dtype="bfloat16")
    try:
        result = check_cuda_graphs(session, "ddtree", 16)
    finally:
        session.close()
    assert result.status == "pass", result.message
    assert "per-round acceptance equals the reference" in result.message, result.message


def test_device_tree_auto_runs_the_round_as_one_graph_only_where_the_beams_take_one_launch(
    fixture_requests, monkeypatch
):
    """``device_tree=auto`` (the default) is the host path on a CPU, and the round as one graph where the
    tree's beams come from one launch (B * K <= 4096 on a GPU with Triton), the host path past it; ``on``
    and ``off`` are what they say. The decision is held on CPU by standing in for the GPU check."""
    from ddtree_conformance.adapters.reference import beam_kernel, device_tree

    def stages(engine, budget):
        config = RunConfig(mode="ddtree", budget=budget, cuda_graphs=True, timing=True)
        return engine.generate(fixture_requests[:1], config)[0].timings.stages

    default = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    assert default.device_tree == "auto"
    assert "build" in stages(default, 16) and "tree_round" not in stages(default, 16)  # a CPU: the host
    monkeypatch.setattr(device_tree, "_on_a_gpu", lambda device: True)
    monkeypatch.setattr(device_tree, "_launch", lambda *args: None)  # the kernels "fail": tensors serve
    monkeypatch.setattr(beam_kernel, "kernel_available", lambda device, budget, k: budget * k <= 4096)
    assert "tree_round" in stages(default, 16) and "build" not in stages(default, 16)
    assert "build" in stages(default, 65) and "tree_round" not in stages(default, 65)  # 65 * 65 > 4096
    off = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="off")
    assert "build" in stages(off, 16)
    on = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    assert "tree_round" in stages(on, 65)


def test_the_next_round_is_launched_before_this_one_is_recorded_and_records_never_read_its_buffers(
    fixture_requests, monkeypatch
):
    """On the device path the next round is queued as soon as this one's walk is read back and the request
    goes on; the round's records (its light trace) are written while it runs. Those records must then come
    from what was read back only: here every launch first spoils the last round's device tensors (as a
    replay overwrites a graph's buffers), and outputs, acceptance and light traces still equal the eager
    oracle's. With traces on, the records come first, as before, and equal the oracle's too."""
    from ddtree_conformance.adapters.reference import decoders

    events = []
    launch, finish, record = (
        decoders.StaticDecoder.launch_round,
        decoders.StaticDecoder.finish_round,
        decoders.TreeRound.verified_tree,
    )

    def spoiling_launch(self, *args):
        if self._queued is not None:
            tree, visibility, logits, features, drafted, _ = self._queued[2]
            for t in (tree.tokens, tree.parents, tree.depths, visibility, logits, features, drafted):
                t.fill_(True if t.dtype == torch.bool else float("nan") if t.is_floating_point() else 7)
        events.append("launch")
        return launch(self, *args)

    monkeypatch.setattr(decoders.StaticDecoder, "launch_round", spoiling_launch)
    monkeypatch.setattr(decoders.StaticDecoder, "finish_round", lambda self: events.append("finish") or finish(self))
    monkeypatch.setattr(decoders.TreeRound, "verified_tree", lambda self: events.append("record") or record(self))
    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), device_tree="on")
    eager = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)).generate(
        fixture_requests, RunConfig(mode="ddtree", budget=16, trace=True)
    )
    for trace in (False, True):
        events.clear()
        fast = engine.generate(fixture_requests[:1], RunConfig(mode="ddtree", budget=16, cuda_graphs=True, trace=trace))
        assert fast[0].output_ids == eager[0].output_ids
        assert fast[0].acceptance_lengths == eager[0].acceptance_lengths
        assert fast[0].verified_trees == eager[0].verified_trees
        if trace:
            assert [t.target_tokens for t in fast[0].traces] == [t.target_tokens for t in eager[0].traces]
        rounds = len(fast[0].acceptance_lengths)
        assert rounds > 2 and events.count("launch") == rounds  # no round launched past the request's end
        ahead = ["launch", "finish"] + ["launch", "record", "finish"] * (rounds - 1) + ["record"]
        behind = ["launch", "finish", "record"] * rounds
        assert events == (behind if trace else ahead), events


class _RoundAsOneGraphOnCpu(ReferenceEngine):
    """The reference on the path its default takes on a GPU at B <= 64 (the fast path, each greedy round
    as one graph), here on CPU, where the fast path runs eagerly on the same buffers: its drafter always
    reads L + 1 context rows, so in low precision it rounds otherwise than the host path."""

    name = "reference-round-as-one-graph"

    def __init__(self, model_dir, drafter_dir=None, **options):
        super().__init__(model_dir, drafter_dir, **{**options, "device_tree": "on"})

    def fast_path_on(self, config):
        return config.tensor_parallel_size == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_round_as_one_graph_passes_the_checks_it_could_trip_in_low_precision(dtype):
    """The GPU default's round as one graph, judged like any engine in bf16 and fp16 on the fixture pair:
    lossless, acceptance and tree structure pass (a full plan at 20 prompts: 56 passed, 0 failed in bf16;
    see docs/guides/gpu-tier.md)."""
    from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run

    settings = fixture_pair_settings(
        limit=3, max_new_tokens=24, budgets=[16], dtype=dtype, torch_threads=1, held_out_prompts=0
    )
    results = plan_and_run(
        settings, _RoundAsOneGraphOnCpu, ["lossless/ddtree", "acceptance/ddtree", "tree-structure/ddtree"]
    )
    assert len(results) >= 3
    bad = [(r.check, r.message) for r in results if r.status != "pass"]
    assert not bad, bad
