"""The tensor-parallel check (TP=1 vs TP=N) on CPU: a correct sharded engine passes, TP mutants fail.

The engines are the reference engine with TP simulated (:mod:`ddtree_conformance.testing.tp_engines`): TP=N
runs unsharded, so a correct engine is exactly equal; each mutant breaks one thing at TP>1 only.
"""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.checks import plan
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing.runs import by_id, plan_and_run
from ddtree_conformance.testing.tp_engines import ShardedReference, TpAcceptanceDrift, TpOutputDrift


@pytest.fixture(scope="module")
def settings(random_pair_settings) -> SuiteSettings:
    return random_pair_settings(
        [4, 11, 19, 27],
        seed=11,
        prefix="tp",
        budgets=[16],
        max_new_tokens=24,
        tensor_parallel_size=2,
        held_out_prompts=0,
    )  # the counts below are of these four prompts


DDTREE = "tensor-parallel/ddtree"  # the DDTree run's TP check only: for tests that read no other


def _tp_results(settings: SuiteSettings, engine_class, family: str = "tensor-parallel", **updates):
    return by_id(plan_and_run(settings.model_copy(update=updates), engine_class, [family]))


def test_plan_registers_one_tp_check_per_speculative_run(settings):
    ids = [c.id for c in plan(settings) if c.id.startswith("tensor-parallel")]
    assert ids == ["tensor-parallel/dflash", "tensor-parallel/ddtree-B16"]


def test_correct_sharded_engine_passes(settings):
    results = _tp_results(settings, ShardedReference)
    assert [r.status for r in results.values()] == ["pass", "pass"], [r.message for r in results.values()]
    assert "TP=2 (tensor_parallel_size 2 (settings))" in results["tensor-parallel/ddtree-B16"].message
    assert "per-round acceptance equals TP=1" in results["tensor-parallel/ddtree-B16"].message


def test_tp_output_mutant_fails_naming_the_divergence(settings):
    results = _tp_results(settings, TpOutputDrift)
    for result in results.values():
        assert result.status == "fail", result.message
        # which prompt comes first depends on the order the requests reach the engine (shuffled per run)
        assert (result.details["tp"], len(result.details["differing"])) == (2, 2), result.message
        assert "diverges at output token 12" in result.message


def test_tp_acceptance_mutant_fails_on_acceptance_not_outputs(settings):
    result = _tp_results(settings, TpAcceptanceDrift, DDTREE)["tensor-parallel/ddtree-B16"]
    assert result.status == "fail"
    assert "TP=2 per-round acceptance differs from TP=1" in result.message
    assert "outputs equal" in result.message


def test_unshardable_reference_engine_skips_with_the_reason(settings):
    results = _tp_results(settings, ReferenceEngine)
    for result in results.values():
        assert result.status == "skip" and result.cause == "engine"  # TP asked: the engine's gap
        assert result.message.startswith("engine reports max_tensor_parallel=1")


def test_one_visible_device_is_not_applicable(settings):
    results = _tp_results(settings, ShardedReference, tensor_parallel_size=1)
    for result in results.values():
        assert result.status == "skip" and result.cause == "not-applicable"  # never incomplete (issue 31)
        assert "1 cpu device(s) visible" in result.message


def test_tp_above_the_engines_maximum_skips(settings):
    result = _tp_results(settings, ShardedReference, tensor_parallel_size=4)["tensor-parallel/dflash"]
    assert (result.status, result.cause) == ("skip", "engine"), result.message
    assert "tensor_parallel_size 4 asked" in result.message and "max_tensor_parallel=2" in result.message


def test_reference_engine_refuses_a_tp_size_that_does_not_split_the_target(random_pair):
    target, drafter = random_pair  # vocabulary 97: no TP size above 1 splits it evenly
    engine = ReferenceEngine(str(target), str(drafter))
    assert engine.capabilities().max_tensor_parallel == 1
    with pytest.raises(
        EngineError,
        match=r"reference engine: tensor_parallel_size=2 does not split target .* evenly "
        r"\(num_attention_heads 2, num_key_value_heads 2, .*vocab_size 97\)",
    ):
        engine.generate([Request(prompt_ids=[1, 2], max_new_tokens=2)], RunConfig(tensor_parallel_size=2))


@pytest.fixture(scope="module")
def bf16_settings() -> SuiteSettings:
    from ddtree_conformance.testing.runs import fixture_pair_settings

    return fixture_pair_settings(
        limit=10, max_new_tokens=32, budgets=[16], dtype="bfloat16", tensor_parallel_size=2, run_seed=3
    )


def test_in_bf16_a_tp_run_that_rounds_differently_is_judged_against_the_fp32_reference_and_passes(bf16_settings):
    """TP=2 rounds differently from TP=1 (keys and values in float32): its outputs and tau part from TP=1's at
    near ties. Its acceptance is judged as the acceptance check judges a run, against the fp32 reference on its
    own outputs, not against TP=1's tau (measured on other texts: a wide band)."""
    from ddtree_conformance.testing.tp_engines import ShardedRoundsDifferently

    result = _tp_results(bf16_settings, ShardedRoundsDifferently, DDTREE)["tensor-parallel/ddtree-B16"]
    assert result.status == "pass", result.message
    assert "TP=2" in result.message and "per-round acceptance equals the reference" in result.message
    assert result.details["tp"] == 2


def test_in_bf16_a_tp_run_that_accepts_less_fails_round_by_round(bf16_settings):
    result = _tp_results(bf16_settings, TpAcceptanceDrift, DDTREE)["tensor-parallel/ddtree-B16"]
    assert result.status == "fail", result.message
    assert result.message.startswith("TP=2: ") and "differs from the fp32 reference" in result.message
