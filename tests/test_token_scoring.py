"""Token scoring (conformance/token_scoring.py) on a known logit table: every position judged on
the output's own path, excused positions counted, the first bad one named with both sides."""

from __future__ import annotations

import torch

from ddtree_conformance.calibration import shift_thresholds
from ddtree_conformance.noise import NoiseModel
from ddtree_conformance.token_scoring import ScoredRun, table_logits, window

# After token t the table prefers t + 1; after 4 the runner-up 7 is 0.05 below 5 (a near-tie);
# after 7 the runner-up 0 is 3.0 below 8.
TABLE = torch.full((10, 10), -5.0)
for t in range(10):
    TABLE[t, (t + 1) % 10] = 2.0
TABLE[4, 7] = 1.95
TABLE[7, 0] = -1.0
FN = table_logits(TABLE, "test")


def _rules(bound=0.2, tail_counts=0):
    tail = tuple((t, tail_counts) for t in shift_thresholds())
    return NoiseModel("bfloat16", bound, 0.1, 100000, tail, "test", 0.01)


def test_exact_path_has_nothing_to_excuse():
    run = ScoredRun(_rules())
    run.add("p", [0], [1, 2, 3, 4, 5, 6], FN)
    assert run.positions == 6 and not run.excused and not run.outside and run.problem() is None


def test_near_tie_is_excused_and_scoring_follows_the_engine_path():
    run = ScoredRun(_rules())
    run.add("p", [2], [3, 4, 7, 8, 9], FN)  # 7 instead of 5 after 4; then 8, 9 follow 7 correctly
    assert [e.position for e in run.excused] == [2] and run.excused[0].gap == 0.05
    assert not run.outside
    assert "1 excused (largest gap 0.05" in run.summary()


def test_a_token_outside_the_bound_fails_with_both_sides_shown():
    run = ScoredRun(_rules())
    run.add("p", [5], [6, 7, 0, 1, 2], FN)  # 0 after 7 is 3.0 below the top-1 8
    (first,) = run.outside
    assert (run.positions, first.label, first.position, first.got, first.argmax, first.gap) == (5, "p", 2, 0, 8, 3.0)
    problem = run.problem()  # the one test of its wording
    assert problem.startswith("1/5 output positions outside the near-tie bound 0.2; "), problem
    assert "first: p output position 2: engine token 0 " in problem and " is 3 below the fp32 top-1 8 " in problem
    assert "(engine 6 7 [0] 1 2 | fp32 argmax" in problem and "the engine's path 6 7 [8] 1 2)" in problem


def test_too_many_excused_positions_break_the_ceiling():
    run = ScoredRun(_rules(bound=0.2))
    for i in range(40):
        run.add(f"p{i}", [3], [4, 7, 8], FN)  # the runner-up at every near-tie
    ceiling, mu = run.ceiling
    assert len(run.excused) == 40 > ceiling
    assert "40/120 positions excused as near-ties, above the ceiling" in run.problem()


def test_exact_rules_excuse_nothing():
    run = ScoredRun(NoiseModel("float32", 0.0, 1e-3, 0, (), "exact", 0.0))
    run.add("p", [2], [3, 4, 7], FN)
    assert run.outside and not run.excused


def test_window_brackets_the_position():
    assert window(list(range(10)), 5) == "... 2 3 4 [5] 6 7 8 ..."
    assert window([1, 2], 0) == "[1] 2"
