"""Acceptance by replay (conformance/replay.py, adapters/reference/replay.py).

The replay of the reference's own run is that run, bit for bit; lengths that cannot describe the
output are named; a differing round is excused only by a near-tie that explains it, and never by
drafter logits that are equal, far apart, or that do not build the engine's tree.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ddtree_conformance.adapters.interface import Request, RoundTrace, RunConfig
from ddtree_conformance.adapters.reference.replay import ReplayRound, replay_result
from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.golden_files import golden_lengths
from ddtree_conformance.noise import NoiseModel
from ddtree_conformance.replay import ReplayRun, drafter_flips_within, judge_rounds
from ddtree_conformance.spec import build_tree

BF16 = NoiseModel("bfloat16", 0.3, 0.2, 0, (), "test", 0.01)


@pytest.mark.parametrize(
    "output, lengths, finish, problem",
    [
        ([1, 2, 3, 4], [2, 1], "length", None),
        ([1, 2, 3, 4], [2, 3], "length", None),  # last round cut by the length limit
        ([1, 2, 3], [2, 3], "length", "do not add up"),  # a last round that emits nothing
        ([1, 2, 3, 4], [3, 2], "length", "do not add up"),  # reported one too high
        ([1, 2, 3, 4, 5, 6], [2, 1], "length", "do not add up"),
        ([1, 2], [0, 1], "length", "round 0 accepts 0 tokens"),
        ([1, 2, 3], [2, 17], "length", "round 1 accepts 17 tokens"),
        ([1], [], "stop", None),
    ],
)
def test_acceptance_lengths_must_describe_the_output(output, lengths, finish, problem):
    """The acceptance convention the replay relies on is the integrity rule, checked once for every result."""
    from ddtree_conformance.adapters.interface import RequestResult
    from ddtree_conformance.integrity import PairLimits, result_problem

    request = Request(prompt_ids=[7], max_new_tokens=len(output), stop_token_ids=[1] if finish == "stop" else [])
    result = RequestResult(output_ids=output, finish_reason=finish, acceptance_lengths=lengths)
    found = result_problem(result, request, RunConfig(mode="ddtree", budget=16), PairLimits(block_size=16))
    assert (found is None) if problem is None else (problem in str(found)), found


def test_golden_lengths_are_the_prefix_run():
    assert golden_lengths([3, 4, 2, 5], 8) == [3, 4]  # 1 + 3 = 4 < 8, 1 + 3 + 4 = 8: stop
    assert golden_lengths([3, 4, 2, 5], 64) == [3, 4, 2, 5]


def test_replay_of_the_reference_run_is_that_run(reference_engine, random_pair):
    request = Request(prompt_ids=[5, 17, 33, 2, 9], max_new_tokens=40)
    for mode, budget in (("ddtree", 16), ("dflash", 1)):
        result = reference_engine.generate([request], RunConfig(mode=mode, budget=budget))[0]
        rounds = replay_result(reference_engine, request, result.output_ids, result.acceptance_lengths, mode, budget)
        assert [r.length for r in rounds] == result.acceptance_lengths
        assert all(r.draft_logits is None for r in rounds)  # logits are kept only for differing rounds


def test_replay_follows_the_engine_path_after_a_difference(reference_engine):
    request = Request(prompt_ids=[5, 17, 33, 2, 9], max_new_tokens=40)
    result = reference_engine.generate([request], RunConfig(mode="ddtree", budget=16))[0]
    lengths = list(result.acceptance_lengths)
    r = next(i for i, n in enumerate(lengths) if n >= 2)
    changed = lengths[:r] + [1, lengths[r] - 1] + lengths[r + 1 :]  # claim round r stopped one token early
    rounds = replay_result(reference_engine, request, result.output_ids, changed, "ddtree", 16)
    assert rounds[r].length == lengths[r] and rounds[r].draft_logits is not None
    offset = 1 + sum(lengths[:r])
    assert rounds[r + 1].offset == offset + 1 and rounds[r + 1].root == result.output_ids[offset]  # engine's context


def _round(tokens, length, draft_logits=None, gaps=None):
    return ReplayRound(
        index=0,
        offset=1,
        start=5,
        root=9,
        length=length,
        tokens=tokens,
        tree_tokens=[9],
        parents=[-1],
        accepted=[],
        path_gaps=gaps or [1.0] * length,
        draft_logits=draft_logits,
    )


def test_the_replay_run_keeps_its_pooled_taus_with_its_lengths():
    """``ReplayRun.tau`` and ``reference_tau`` are the pooled tau of the lengths judged so far, prompt after prompt."""
    from ddtree_conformance.metrics import mean_tau

    run = judge_rounds(ReplayRun(), "p", [2], [9, 4, 7], [_round([4, 7], 2)], BF16, "ddtree", 8, [0, 0, 0])
    second = dataclasses.replace(_round([6, 3], 2), index=1, offset=2)
    run = judge_rounds(run, "q", [1, 2], [9, 5, 6, 3], [_round([5], 1), second], BF16, "ddtree", 8, [0] * 4)
    assert run.engine_lengths == [[2], [1, 2]] and run.tau == mean_tau(run.engine_lengths) == 5 / 3
    assert run.reference_tau == mean_tau(run.reference_lengths) == 5 / 3


def test_target_near_tie_is_excused_only_within_the_bound():
    output = [9, 4, 8]  # the engine took 8 at output position 2 where the replay's walk took 7
    run = judge_rounds(
        ReplayRun(), "p", [2], output, [_round([4, 7], 2, gaps=[1.0, 0.1])], BF16, "ddtree", 8, [0, 0, 0.1]
    )
    assert [v.kind for v in run.target] == ["target-near-tie"] and not run.differs
    run = judge_rounds(
        ReplayRun(), "p", [2], output, [_round([4, 7], 2, gaps=[1.0, 0.1])], BF16, "ddtree", 8, [0, 0, 0.9]
    )
    assert run.differs and "commits 8 where the fp32 target chose 7" in run.differs[0].note
    exact = NoiseModel("float32", 0.0, 1e-3, 0, (), "exact", 0.0)
    run = judge_rounds(
        ReplayRun(), "p", [2], output, [_round([4, 7], 2, gaps=[1.0, 0.1])], exact, "ddtree", 8, [0, 0, 0.1]
    )
    assert run.differs  # float32 excuses no target difference ...
    run = judge_rounds(
        ReplayRun(), "p", [2], output, [_round([4, 7], 2, gaps=[1.0, 1e-6])], exact, "ddtree", 8, [0, 0, 1e-6]
    )
    assert not run.differs and [v.kind for v in run.fp32_ties] == ["fp32-tie"]  # ... but a tie (calibration.FP32_TIE)


def test_a_last_round_cut_by_the_output_end_is_compared_as_far_as_it_shows():
    output = [9, 4, 7]  # the output ends after two tokens of the last round
    for engine_length, replay_length, equal in ((4, 6, True), (5, 2, True), (5, 1, False)):
        run = judge_rounds(
            ReplayRun(),
            "p",
            [engine_length],
            output,
            [_round([4, 7, 5, 6, 1, 2][:replay_length], replay_length)],
            BF16,
            "ddtree",
            8,
            [0, 0, 0],
        )
        assert (not run.differs and not run.drafter) == equal, (engine_length, replay_length)


def _boundary_logits():
    """Depth 1: token 3 clearly first; depth 2: tokens 5 and 6 nearly tied for the last slot of B=2."""
    logits = torch.full((2, 12), -10.0)
    logits[0, 3] = 8.0
    logits[1, 5] = 4.0
    logits[1, 6] = 3.99
    return logits


def test_drafter_flip_needs_logits_within_the_tolerance():
    logits = _boundary_logits()
    tree = build_tree(logits, 2)
    assert tree.tokens.tolist() == [-1, 3, 5]
    assert drafter_flips_within(logits, "ddtree", 2, [3, 6], 0.01)  # 6 can take 5's place
    assert not drafter_flips_within(logits, "ddtree", 2, [3, 6], 1e-4)
    assert not drafter_flips_within(logits, "ddtree", 2, [3], 1.0)  # depth 1 is far from any boundary


def _traces(logits):
    trace = RoundTrace(
        start=5,
        root_token=9,
        tree_tokens=[9, 3, 6],
        parents=[-1, 0, 1],
        depths=[0, 1, 2],
        positions=[5, 6, 7],
        accepted=[1, 2],
        target_tokens=[3, 6, 1],
        bonus=1,
        top2_margins=[1, 1, 1],
        draft_logits=logits.tolist(),
    )
    return lambda: [trace]


def test_equal_drafter_scores_broken_the_other_way_are_excused():
    """Depth 2's tokens 5 and 6 tie exactly: the spec keeps the smaller id, the engine 6 (a freedom). Its
    longer round is excused on its own logits, also when they are the reference's, in a tree and a chain
    (before, the catalogue's "ties broken the other way" failed acceptance in bf16 on 5 of run seeds 1-79,
    4 dflash and 1 ddtree; first seen in `scripts/gpu_trials.sh catalogues`)."""
    logits = _boundary_logits()
    output, lengths = [9, 3, 6, 1], [3]
    tied = logits.clone()
    tied[1, 6] = 4.0
    for mode, budget in (("ddtree", 2), ("dflash", 2)):
        for name, engine in {"the reference's logits": tied, "logits 0.002 apart": tied + 0.002}.items():
            run = judge_rounds(
                ReplayRun(),
                "p",
                lengths,
                output,
                [_round([3, 6], 2, draft_logits=tied)],
                BF16,
                mode,
                budget,
                [0.0] * 4,
                _traces(engine),
            )
            assert [v.kind for v in run.drafter] == ["drafter-near-tie"] and not run.differs, (mode, name, run.differs)


def test_drafter_excuse_rules():
    logits = _boundary_logits()
    # The engine accepted [3, 6] plus a bonus (length 3); the replay's tree lacked 6 (length 2).
    output, lengths, replayed = [9, 3, 6, 1], [3], lambda: [_round([3, 6], 2, draft_logits=logits)]
    near = logits.clone()
    near[1, 6] = 4.005  # the engine's own logits put 6 first
    cases = {
        "excused": (_traces(near), "drafter-near-tie"),
        "no engine logits: longer, unconfirmed": (None, "longer-unconfirmed drafter logits within 0.2 could flip"),
        "identical logits": (_traces(logits), "no tree the spec allows for the engine's own drafter logits"),
        "far logits": (_traces(logits + torch.linspace(0, 3, 12)), "more than the tolerance"),
        "logits that do not build its tree": (_traces(logits - 0.001), "no tree the spec allows"),
    }
    for name, (engine_logits, expect) in cases.items():
        run = judge_rounds(ReplayRun(), "p", lengths, output, replayed(), BF16, "ddtree", 2, [0.0] * 4, engine_logits)
        verdicts = run.verdicts
        assert len(verdicts) == 1, name
        assert expect in (verdicts[0].kind + " " + verdicts[0].note), (name, verdicts[0].note)
    # The engine's tree lacked 6 where the replay's held it: shorter, unconfirmed without its drafter logits.
    near_replay = [_round([3, 6, 1], 3, draft_logits=near)]
    # (the output goes on past the round: at the output's end a shorter round is the output's cut, a freedom)
    run = judge_rounds(ReplayRun(), "p", [2], [9, 3, 6, 1], near_replay, BF16, "ddtree", 2, [0.0] * 4, None)
    assert [v.kind for v in run.unconfirmed] == ["shorter-unconfirmed"] and not run.differs, run.differs
    assert BF16.unconfirmed_round_cap(1000, longer=False) < BF16.confirmed_round_cap(1000)
    # a round the tolerance cannot explain (tau 66 style: every round far longer)
    run = judge_rounds(
        ReplayRun(),
        "p",
        lengths,
        output,
        [_round([3, 6], 2, draft_logits=logits)],
        NoiseModel("bfloat16", 0.3, 1e-5, 0, (), "test", 0.01),
        "ddtree",
        2,
        [0.0] * 4,
        None,
    )
    assert run.differs and "no drafter logits within the tolerance" in run.differs[0].note


def test_drafter_round_cap_grows_with_rounds_but_stays_small():
    rules = load_calibration("/nonexistent/target", "bfloat16")
    assert 0 < rules.confirmed_round_cap(100) < rules.confirmed_round_cap(1000) < 100
    exact = load_calibration("/nonexistent/target", "float32")
    assert exact.confirmed_round_cap(1000) <= 5


def test_a_length_claimed_past_the_output_end_does_not_inflate_tau():
    from ddtree_conformance.metrics import emitted_lengths

    # output of 8 tokens: prefill 1 + rounds of 2 and 3 + 2 tokens of a last round the length limit cut
    assert emitted_lengths([2, 3, 2], 8) == [2, 3, 2]
    assert emitted_lengths([2, 3, 8], 8) == emitted_lengths([2, 3, 3], 8) == [2, 3, 2]  # 8 claimed, 2 shown
    output = [9, 4, 7]
    run = judge_rounds(ReplayRun(), "p", [16], output, [_round([4, 7, 5], 3)], BF16, "ddtree", 8, [0, 0, 0])
    assert run.engine_lengths == [[2]] and run.reference_lengths == [[2]] and not run.differs
    # a second prompt joins a new run; the first prompt's run is left as it was
    both = judge_rounds(run, "q", [16], output, [_round([4, 7, 5], 3)], BF16, "ddtree", 8, [0, 0, 0])
    assert both.engine_lengths == [[2], [2]] and both.rounds == 2 and set(both.by_prompt) == {"p", "q"}
    assert run.engine_lengths == [[2]] and run.rounds == 1 and set(run.by_prompt) == {"p"}


@pytest.mark.slow
def test_every_drafter_near_tie_is_judged_on_the_engines_own_drafter_logits(monkeypatch):
    """bf16 reference, fixture pair, 24 prompts, B=16: the tree checks' traced run holds 2 of them here,
    and a prompt outside it with a round to explain is rerun alone with traces, so every drafter
    near-tie is excused on the engine's own drafter logits (their distance, and the tree they build),
    never on "some logits within the tolerance would flip it" alone (4 of the 6 rounds were, before)."""
    from ddtree_conformance.checks import traced_runs
    from ddtree_conformance.checks.acceptance import check_acceptance
    from ddtree_conformance.session import SuiteSession
    from ddtree_conformance.testing.runs import fixture_pair_settings

    monkeypatch.setattr(traced_runs, "TRACED_PROMPTS", 2)
    settings = fixture_pair_settings(
        dtype="bfloat16", limit=24, max_new_tokens=64, torch_threads=1, held_out_prompts=0
    )  # the same 24 prompts every run: the rounds counted below
    session = SuiteSession(settings)
    try:
        result = check_acceptance(session, "ddtree", 16)
    finally:
        session.close()
    assert result.status == "pass", result.message
    rounds = result.details["drafter_near_tie_rounds"]
    assert len(rounds) >= 3, rounds  # the test needs drafter near-ties outside the shared traced prompts
    assert all("apart flip the path" in r for r in rounds), rounds
