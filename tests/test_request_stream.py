"""Fresh, unordered requests (issue 20, item 3): held-out prompts drawn per run, requests shuffled and
mixed with other checks' requests; each shown failing an engine that exploits a fixed, public stream."""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.held_out import HELD_OUT_CATEGORY, TargetSource, held_out_prompts, prompt_source
from ddtree_conformance.prompts import load_prompts
from ddtree_conformance.session import SuiteSession, SuiteSettings, mixing
from ddtree_conformance.session.inputs import SuiteInputs
from ddtree_conformance.testing.runs import by_id, plan_and_run
from ddtree_conformance.testing.stream_adversaries import KnowsPublicPrompts, RepeatedRequestBug, public_prompts


@pytest.fixture(scope="module")
def settings(random_pair_settings, tmp_path_factory) -> SuiteSettings:
    golden = tmp_path_factory.mktemp("golden")
    return random_pair_settings(
        [5, 9, 14],
        seed=3,
        prefix="s",
        golden_dir=str(golden),
        modes=["ddtree"],
        budgets=[4],
        max_new_tokens=12,
        torch_threads=1,
        run_seed=5,
    )


def _verdicts(settings: SuiteSettings, engine_class, families: list[str], **updates) -> dict:
    return by_id(plan_and_run(settings.model_copy(update=updates), engine_class, families))


def test_held_out_prompts_follow_the_seed_and_share_nothing_with_the_set(settings):
    """A user's own set (target samples): drawn per seed, lengths near the set's but not taken from it,
    no bundled opening (the old recipe's tell: 1-8 opening tokens of a bundled prompt, a bundled length)."""
    bundled = load_prompts(settings.prompt_set)
    source = prompt_source(settings, bundled)
    assert isinstance(source, TargetSource)
    first, again, other = (held_out_prompts(source, 12, seed) for seed in (5, 5, 6))
    assert [p.prompt_ids for p in first] == [p.prompt_ids for p in again]
    assert [p.prompt_ids for p in first] != [p.prompt_ids for p in other]
    lengths = sorted(len(p.prompt_ids) for p in bundled)
    for prompt in first:
        assert prompt.category == HELD_OUT_CATEGORY and prompt.meta == {"seed": 5, "source": "target samples"}
        assert 0.75 * lengths[0] - 1 <= len(prompt.prompt_ids) <= 1.25 * lengths[-1] + 1
    assert {len(p.prompt_ids) for p in first} - set(lengths), "lengths only from the set's"
    openings = {tuple(p.prompt_ids[:k]) for p in bundled for k in (4, 8)}
    assert not any(tuple(p.prompt_ids[:k]) in openings for p in first for k in (4, 8))


def test_a_draw_is_sampled_once_per_process_and_handed_out_as_copies(settings):
    """Sessions of one process (a test run, a pytest route) draw the same held-out text: the target samples
    it once; each caller gets its own lists."""
    from ddtree_conformance.held_out import _target_samples

    source = prompt_source(settings, load_prompts(settings.prompt_set))
    before = _target_samples.cache_info()
    first = source.long_ids([7, 11], seed=123)
    first[0].append(-1)  # a caller's change stays its own
    again = source.long_ids([7, 11], seed=123)
    after = _target_samples.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    assert [len(ids) for ids in again] == [7, 11] and -1 not in again[0]


def test_a_run_adds_held_out_prompts_after_the_set(settings):
    session = SuiteSession(settings)
    try:
        assert [p.id for p in session.prompts[:3]] == ["s0", "s1", "s2"]
        assert [p.id for p in session.inputs.held_out] == ["held-out-5-0"]  # one per 20 prompts, at least one
        assert len(session.requests()) == 4
    finally:
        session.close()


def test_an_engine_that_knows_the_public_prompts_fails_on_a_held_out_one(settings):
    public_prompts(p.prompt_ids for p in load_prompts(settings.prompt_set))
    families = ["lossless", "acceptance"]
    before = _verdicts(settings, KnowsPublicPrompts, families, held_out_prompts=0)
    assert [r.status for r in before.values()] == ["pass", "pass"], before  # the hole: the public set alone
    after = _verdicts(settings, KnowsPublicPrompts, families)
    result = after["acceptance/ddtree-B4"]
    assert result.status == "fail", result.message
    assert "held-out-5-0 round" in result.message and "per-round acceptance differs" in result.message


class Spy(ReferenceEngine):
    """The reference engine, noting every batch it is given."""

    batches: list[tuple[str, list[tuple[int, ...]]]] = []

    def generate_local(self, requests: list[Request], config: RunConfig):
        Spy.batches.append((config.mode, [tuple(r.prompt_ids) for r in requests]))
        return super().generate_local(requests, config)


def test_requests_reach_the_engine_shuffled_and_mixed_but_batch_checks_get_their_batch(settings):
    Spy.batches = []
    results = _verdicts(settings, Spy, ["lossless", "stop-token", "busy-batch"])
    assert all(r.status == "pass" for r in results.values()), results
    default = [tuple(r.prompt_ids) for r in SuiteInputs(settings).requests()]
    ddtree = [batch for mode, batch in Spy.batches if mode == "ddtree"]
    assert sorted(ddtree[0]) == sorted(default) and ddtree[0] != default  # the seed-5 run shuffles the first call
    stop_call = ddtree[1]  # stop-token's call: its requests and other checks' answered ones beside them
    assert len(stop_call) > min(3, len(default)) and set(stop_call) & set(default)
    from ddtree_conformance.checks.envelope import busy_batch_requests

    # busy-batch's batch arrives as built, alone and in order (it is about batching)
    with_session = SuiteSession(settings)
    try:
        with_session.engines._engines[(settings.model_dir, settings.drafter_dir)] = ReferenceEngine(
            settings.model_dir, settings.drafter_dir
        )
        expected = [tuple(r.prompt_ids) for r in busy_batch_requests(with_session)[0]]
    finally:
        with_session.close()
    assert expected in ddtree


def test_a_response_cache_bug_fails_once_requests_are_asked_again(settings, monkeypatch):
    families = ["lossless", "stop-token", "max-new-tokens"]
    monkeypatch.setattr(mixing, "MAX_COMPANIONS", 0)
    before = _verdicts(settings, RepeatedRequestBug, families)
    assert [r.status for r in before.values()] == ["pass"] * 3, before  # each request asked once: never a hit
    monkeypatch.undo()
    after = _verdicts(settings, RepeatedRequestBug, families)
    failed = [r for r in after.values() if r.status == "fail"]
    assert failed, after
    assert "asked again in a batch with other checks' requests" in failed[0].message, failed[0].message
    assert "(greedy float32 outputs must not depend on the batch)" in failed[0].message
