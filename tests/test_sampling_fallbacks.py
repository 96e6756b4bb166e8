"""Named verdicts for silent sampling fallbacks (conformance/checks/sampling.py): greedy verification at
T > 0 (vLLM PR #42910 verifies by argmax whatever the temperature), the temperature ignored,
top-k/top-p ignored. Unit tests sample transitions straight from the bigram table under the fallback;
engine tests run the mutants (conformance/testing/mutants.py) on one variant each. The fallback is
only looked for once the chi-square test has failed, so it cannot fail a correct engine; the
reference passes these variants in tests/test_mutants.py and the main job."""

from __future__ import annotations

import pytest
import torch

from ddtree_conformance.checks.sampling import VARIANTS, silent_fallback, transition_test
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.spec import SamplingParams, choose_token
from ddtree_conformance.synthetic import sampling_table
from ddtree_conformance.testing import mutants
from ddtree_conformance.testing.runs import fixture_pair_settings, plan_and_run


def _sequences(params: SamplingParams, first: SamplingParams | None = None, n: int = 60, length: int = 24):
    """Seeded chains from the bigram table: the first token drawn with ``first`` (default ``params``)."""
    table, g = sampling_table(), torch.Generator().manual_seed(11)
    out = []
    for seed in range(n):
        seq = [seed % table.shape[0]]
        for i in range(length):
            seq.append(choose_token(table[seq[-1]], (first or params) if i == 0 else params, g))
        out.append(seq)
    return table, out


@pytest.mark.parametrize(
    ("variant", "actual", "phrase"),
    [
        ("T=1", SamplingParams(), "sampled requests were verified greedily"),
        ("T=0.8,top_p=0.7", SamplingParams(temperature=1.0, top_p=0.7), "the temperature ignored"),
        ("T=1,top_k=3", SamplingParams(temperature=1.0), "top-k/top-p ignored"),
        ("T=0.8,top_p=0.7", SamplingParams(temperature=1.0), "temperature and top-k/top-p ignored"),
    ],
)
def test_each_fallback_is_named(variant, actual, phrase):
    asked = VARIANTS[variant]
    table, sequences = _sequences(actual, first=asked)  # the prefill's token sampled as asked, as engines do
    assert transition_test(table, asked, sequences)[0] < 1e-3
    assert phrase in (silent_fallback(table, asked, sequences) or "")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_correct_sampling_names_no_fallback(variant):
    table, sequences = _sequences(VARIANTS[variant])
    assert transition_test(table, VARIANTS[variant], sequences)[0] >= 1e-3
    assert silent_fallback(table, VARIANTS[variant], sequences) is None


ENGINE_CASES = [
    (mutants.GreedyVerifyAtT, "sampling/ddtree-B16/T=1,top_k=3", "sampled requests were verified greedily"),
    (mutants.TemperatureIgnored, "sampling/ddtree-B16/T=0.8,top_p=0.7", "the temperature ignored"),
]  # TopKTopPIgnored: tests/test_mutants.py (its message now names "top-k/top-p ignored")


@pytest.fixture(scope="module")
def settings() -> SuiteSettings:
    return fixture_pair_settings(limit=1, budgets=[16], held_out_prompts=0, run_seed=1, sampling_requests=40)


@pytest.mark.parametrize(("mutant", "check", "phrase"), ENGINE_CASES, ids=lambda v: getattr(v, "__name__", None))
def test_mutant_fails_naming_its_fallback(settings, mutant, check, phrase):
    (result,) = plan_and_run(settings, mutant, [check])
    assert result.status == "fail" and phrase in result.message, result.message
