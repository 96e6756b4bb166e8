"""Every pitfall class of the DDTree integration threads is caught (conformance/testing/pitfalls.py):
each broken engine fails the check that covers its class with the message given here, and the
correct engine passes the same checks. The CUDA-graph classes that need a GPU (graphs on by default,
bucketing that omits DDTree) and eager-mode benchmarks belong to the GPU tier and the bench.

The random pair suffices where a class breaks every round; classes that need a drafter that
drafts well (a stop token inside an accepted path, masks of a busy batch) run on the fixture pair.
"""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing import pitfalls as pf
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run
from ddtree_conformance.testing.tp_engines import ShardedReference

# pitfall -> phrase of the failing message (engine, check and pair: pitfalls.PITFALLS)
PHRASES = {
    "positions ignored under CUDA graphs": "not lossless",
    "per-request masks mapped wrong when tree sizes differ": "in a batch of 7 mixed requests",
    "state committed for num_accepted - 1": "not lossless",
    "token 0 as padding in short trees": "!= parent depth + 1",
    # its verified trees show the target accepting more than the chain walk committed (integrity)
    "dropped trees walked as chains": "walking the tree by its target tokens commits",
    "finishing inside an accepted path": "is followed by",
    "max_new_tokens landing mid-path": "more than max_new_tokens",
    "TP shard-local indices as token ids": "token ids local to a vocabulary shard",
}


@pytest.fixture(scope="module")
def pairs(random_pair_settings) -> dict[str, SuiteSettings]:
    random = random_pair_settings(
        [3, 9, 17, 30],
        seed=5,
        prefix="m",
        budgets=[16],
        max_new_tokens=24,
        held_out_prompts=0,
        run_seed=1,
        branch_prompts=2,
        branch_rounds=2,
        context_tokens=96,  # context-range: the window's end only (tests/test_input_adversaries.py: every length)
    )
    return {
        "random": random,
        "random-tp2": random.model_copy(update={"tensor_parallel_size": 2}),
        "fixture": fixture_pair_settings(
            limit=3,
            budgets=[16],
            max_new_tokens=24,
            held_out_prompts=0,
            run_seed=1,
            golden_dir="/nonexistent",
            context_tokens=96,  # the window's end: a cut tree whose second child is accepted (run seed 1)
        ),
    }


def test_every_pitfall_has_a_phrase():
    assert set(PHRASES) == set(pf.PITFALLS)


@pytest.mark.parametrize("pitfall", list(pf.PITFALLS))
def test_pitfall_is_caught_naming_the_symptom(pairs, pitfall):
    engine, check, pair = pf.PITFALLS[pitfall]
    (result,) = plan_and_run(pairs[pair], engine, [check])
    assert result.status == "fail" and PHRASES[pitfall] in result.message, result.message


# the reference's lossless and tree-structure on the random pair: tests/test_mutants.py
ALREADY_JUDGED = {("random", "lossless/ddtree"), ("random", "tree-structure/ddtree")}


@pytest.mark.parametrize("pair", ["random", "random-tp2", "fixture"])
def test_correct_engine_passes_the_same_checks(pairs, pair):
    names = sorted({check for _, check, p in pf.PITFALLS.values() if p == pair and (p, check) not in ALREADY_JUDGED})
    engine = ShardedReference if pair == "random-tp2" else ReferenceEngine
    results = plan_and_run(pairs[pair], engine, names)
    assert len(results) == len(names)
    bad = [(r.check, r.message) for r in results if r.status != "pass"]
    assert not bad, bad
