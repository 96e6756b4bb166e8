"""The session's inputs (:class:`ddtree_conformance.session.inputs.SuiteInputs`): the default requests are
built once in the run's setup, each caller gets its own list, and the label index falls back to ids (and
is not cached) while the prompt set cannot be read."""

from __future__ import annotations

from pathlib import Path

from ddtree_conformance.adapters.interface import Request
from ddtree_conformance.session.inputs import SuiteInputs


def test_default_requests_are_built_once_and_each_caller_gets_its_own_list(random_pair_settings):
    inputs = SuiteInputs(random_pair_settings([3, 5], seed=1, prefix="in", held_out_prompts=1))
    inputs.prepare()
    first, second = inputs.requests(), inputs.requests()
    assert first == second and first is not second
    assert [r.prompt_ids for r in first] == [p.prompt_ids for p in inputs.prompts]
    assert first[0] is second[0]  # built once (requests are frozen)
    first.append(Request(prompt_ids=[1], max_new_tokens=1))
    assert len(inputs.requests()) == len(inputs.prompts)  # a caller's list is its own
    shorter = inputs.requests(max_new_tokens=3)
    assert [r.max_new_tokens for r in shorter] == [3] * len(inputs.prompts)
    assert {r.max_new_tokens for r in inputs.requests()} == {inputs.settings.max_new_tokens}


def test_labels_name_prompts_of_the_set_and_others_by_their_ids(random_pair_settings):
    inputs = SuiteInputs(random_pair_settings([3, 5], seed=2, prefix="lb", held_out_prompts=1))
    requests = inputs.requests()
    other = Request(prompt_ids=[11, 12, 13, 14, 15, 16, 17], max_new_tokens=2)
    labels = inputs.labels([*requests[:2], other])
    assert labels[:2] == ["prompt lb0", "prompt lb1"]
    assert labels[2] == "prompt ids [11, 12, 13, 14, 15, 16, ...]"


def test_an_unreadable_prompt_set_is_named_by_ids_and_not_cached(random_pair_settings, tmp_path):
    settings = random_pair_settings([3], seed=3, prefix="un", held_out_prompts=1)
    prompts = Path(settings.prompt_set)
    text = prompts.read_text()
    prompts.write_text("{not json\n")
    inputs = SuiteInputs(settings)
    inputs.prepare()  # the checks report the error; the setup swallows it and caches nothing
    request = Request(prompt_ids=[4, 5, 6], max_new_tokens=2)
    assert inputs.labels([request]) == ["prompt ids [4, 5, 6]"]
    prompts.write_text(text)  # readable again: the index is built now, not stuck empty
    readable = inputs.requests()[0]
    assert inputs.labels([readable]) == ["prompt un0"]
