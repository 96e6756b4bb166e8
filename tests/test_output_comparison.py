"""The greedy-output verdict says what kind of problem it found in a field, not only in its message."""

from __future__ import annotations

from ddtree_conformance.checks.output_comparison import GreedyCase, judge_greedy
from ddtree_conformance.noise import NoiseModel

FLOAT32 = NoiseModel(dtype="float32", bound=0.0, drafter_tolerance=0.0, positions=0, tail=(), source="test")


def _judge(cases):
    return judge_greedy(None, cases, rules=FLOAT32, what="plain")


def test_an_engine_error_is_flagged_as_one():
    verdict = _judge([GreedyCase("p0", [1, 2], [3, 4], [3, 4]), GreedyCase("p1", [1], [], [5], error="boom\nmore")])
    assert verdict.engine_error and verdict.problem == "engine error on p1: boom"


def test_differing_outputs_are_not_an_engine_error_even_when_their_label_reads_like_one():
    verdict = _judge([GreedyCase("engine error", [1, 2], [3, 4], [3, 5])])
    assert verdict.problem.startswith("1/1 outputs differ") and not verdict.engine_error


def test_an_engines_own_error_that_reads_like_an_integrity_error_is_the_engines():
    """The integrity rules mark the results they replace by type; an engine's message cannot forge it,
    and a result the rules did replace is one."""
    from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
    from ddtree_conformance.integrity import PairLimits, is_integrity_error, validate_results

    requests = [Request(prompt_ids=[1, 2], max_new_tokens=4)] * 3
    forged = RequestResult(output_ids=[], finish_reason="error", error="integrity: request 0: all fine")
    out_of_vocab = RequestResult(output_ids=[99999], finish_reason="length")
    engines_own = RequestResult(output_ids=[5], finish_reason="error", error="integrity: made up")
    checked = validate_results(
        requests, [forged, out_of_vocab, engines_own], RunConfig(mode="plain"), PairLimits(vocab_size=100)
    )
    assert [is_integrity_error(r) for r in checked] == [False, True, False]
    assert checked[1].error.startswith("integrity: request 1") and checked[2].error == "integrity: made up"
