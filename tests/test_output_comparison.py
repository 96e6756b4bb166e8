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
