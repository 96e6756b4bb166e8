"""Evidence that scales (issue 20, item 9): the thorough profile gathers over ten times the default's
prompts x tokens; explicit options win over it, and it wins over a named pair's values."""

from __future__ import annotations

from ddtree_conformance.session import SuiteSession
from ddtree_conformance.settings import PROFILES, SuiteSettings, build_settings
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run


def test_the_thorough_profile_fills_what_was_not_given_and_explicit_options_win():
    thorough, _ = build_settings({"profile": "thorough"})
    assert (thorough.max_new_tokens, thorough.sampling_requests, thorough.held_out_per_prompt) == (256, 1000, 2.0)
    mine, _ = build_settings({"profile": "thorough", "max_new_tokens": 100})
    assert mine.max_new_tokens == 100 and mine.sampling_requests == 1000
    direct = SuiteSettings(profile="thorough", sampling_requests=300)
    assert (direct.max_new_tokens, direct.sampling_requests) == (256, 300)
    assert SuiteSettings().max_new_tokens == 64 and PROFILES["default"] == {}


def test_thorough_is_over_ten_times_the_default_evidence():
    bundled = 80  # the fixture's prompt set
    default, thorough = SuiteSettings(), SuiteSettings(profile="thorough")

    def evidence(s: SuiteSettings) -> int:
        held_out = max(1, round(bundled * s.held_out_per_prompt))
        return (bundled + held_out) * s.max_new_tokens

    assert evidence(thorough) >= 10 * evidence(default), (evidence(thorough), evidence(default))


def test_a_thorough_session_draws_two_held_out_prompts_per_prompt():
    session = SuiteSession(SuiteSettings(profile="thorough", limit=2, run_seed=1))
    try:
        assert len(session.inputs.held_out) == 4 and len(session.prompts) == 6
    finally:
        session.close()


def test_golden_compares_the_prefix_the_file_holds_when_the_run_is_longer():
    settings = fixture_pair_settings(
        limit=2, max_new_tokens=80, modes=["ddtree"], budgets=[16], torch_threads=1, held_out_prompts=0
    )  # the fixture's golden file holds 64 tokens
    [result] = plan_and_run(settings, None, ["golden/"])
    assert result.status == "pass", result.message
    assert "first 64 of 80 tokens: the file holds 64" in result.message
