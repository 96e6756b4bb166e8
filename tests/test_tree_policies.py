"""Named verdicts for tree policies (conformance/tree_policy.py, policy_trees.py, acceptance_policy.py).

Unit tests build rounds from peaked random drafter logits with the policy engines' own builders
(conformance/testing/tree_policies.py, written apart from the suite's) and check each finding; the
suite's builder must equal the spec's with every switch off, and the engines' builders. The engine
tests run each policy engine on the bundled fixture pair (few prompts): lossless passes, the
tree-structure check (traces) and the acceptance check (counters only, as the PRs report) fail
naming the policy; the spec's tree numbered breadth-first passes with a note.
"""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_conformance.acceptance_policy import acceptance_depth_findings
from ddtree_conformance.adapters.interface import RequestResult
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.policy_trees import build_policy_tree, node_paths, renumber_breadth_first
from ddtree_conformance.report import render_html
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.spec import build_tree
from ddtree_conformance.testing import tree_policies as tp
from ddtree_conformance.testing.runs import by_family, fixture_pair_settings, plan_and_run
from ddtree_conformance.tree_policy import RoundView, diagnose_traces

HORIZON, VOCAB = 7, 40


def _peaked(generator: torch.Generator, peak: float) -> torch.Tensor:
    """Drafter logits with one likely token per depth (``peak`` above the rest)."""
    logits = torch.randn(HORIZON, VOCAB, generator=generator)
    logits[torch.arange(HORIZON), torch.randint(0, VOCAB, (HORIZON,), generator=generator)] += peak
    return logits


def _views(builder, budget: int, rounds: int = 30, room: int | None = None, peak: float = 7.0) -> list[RoundView]:
    g = torch.Generator().manual_seed(0)
    views = []
    for r in range(rounds):
        logits = _peaked(g, peak)
        tree = builder(logits, budget)
        views.append(
            RoundView(
                f"p round {r}",
                10,
                [5, *tree.tokens[1:].tolist()],
                tree.parents.tolist(),
                tree.depths.tolist(),
                logits,
                room=room,
            )
        )
    return views


def _paths(tree):
    return node_paths(tree.tokens.tolist(), tree.parents.tolist())


def test_policy_builder_with_every_switch_off_is_the_spec_and_agrees_with_the_engines_builders():
    g = torch.Generator().manual_seed(3)
    for _ in range(60):
        depth, vocab = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(2, 40, (1,), generator=g))
        budget = int(torch.randint(1, 50, (1,), generator=g))
        logits = torch.randn(depth, vocab, generator=g) * 3
        assert build_policy_tree(logits, budget).same_as(build_tree(logits, budget))
        width = min(max(budget // depth + 1, 2), 6)
        for mine, theirs in [
            ({"max_children": width}, {"width": width}),
            ({"depth_bonus": 0.2}, {"bonus": 0.2}),
            ({"early_stop_margin": 1.0, "keep_spine": True}, {"margin": 1.0}),
        ]:
            ours, engines = build_policy_tree(logits, budget, **mine), tp.pr_heap_tree(logits, budget, **theirs)
            assert _paths(ours) == _paths(engines)
        spec = build_tree(logits, budget)
        assert _paths(renumber_breadth_first(spec)) == _paths(tp._breadth_first(spec))


@pytest.mark.parametrize(
    ("builder", "budget", "kinds"),
    [
        (build_tree, 16, []),
        (lambda logits, b: tp.spine(logits, b), 6, ["chain"]),
        (lambda logits, b: tp.pr_heap_tree(logits, b, width=3), 16, ["width-cap"]),
        (lambda logits, b: tp.pr_heap_tree(logits, b, bonus=0.2), 16, ["depth-bonus"]),
        (lambda logits, b: tp.pr_heap_tree(logits, b, margin=1.0), 16, ["early-stop"]),
        (
            lambda logits, b: tp._breadth_first(tp.pr_heap_tree(logits, b, width=3, bonus=0.2, margin=1.0)),
            32,
            ["width-cap", "depth-bonus", "early-stop"],
        ),
    ],
    ids=["spec", "chain", "width-cap", "depth-bonus", "early-stop", "sglang"],
)
def test_each_policy_is_named_from_traces(builder, budget, kinds):
    peak = 2.0 if kinds == ["chain"] else 7.0
    diagnosis = diagnose_traces("ddtree-B", _views(builder, budget, peak=peak), "ddtree", budget, HORIZON + 1)
    assert diagnosis.kinds == kinds, diagnosis.message()
    assert diagnosis.row["verdict"] == (", ".join(kinds) or "the spec's trees")


def test_bonus_and_width_are_measured_not_assumed():
    diagnosis = diagnose_traces(
        "x", _views(lambda lg, b: tp.pr_heap_tree(lg, b, width=4, bonus=0.5), 32), "ddtree", 32, HORIZON + 1
    )
    assert diagnosis.kinds == ["width-cap", "depth-bonus"]
    assert "at 4 " in diagnosis.findings[0].message and "about 0.5 per level" in diagnosis.findings[1].message


def test_depth_beyond_the_block_from_traces():
    def deep(logits, budget):  # the vLLM PR: the spec's heap over B drafted positions
        return build_tree(torch.cat([logits, logits[:1].roll(1, dims=-1)]), budget)

    diagnosis = diagnose_traces("x", _views(deep, 16), "ddtree", 16, HORIZON)  # a block of 7 gives L = 6
    assert diagnosis.kinds[0] == "depth-beyond-block"
    assert "L = 6" in diagnosis.message()


def test_freedoms_are_notes_never_findings():
    renumbered = diagnose_traces(
        "x", _views(lambda lg, b: tp._breadth_first(build_tree(lg, b)), 16), "ddtree", 16, HORIZON + 1
    )
    assert renumbered.kinds == [] and "numbered breadth-first" in " ".join(renumbered.notes)
    cut = diagnose_traces("x", _views(lambda lg, b: build_tree(lg, 10), 16, room=10), "ddtree", 16, HORIZON + 1)
    assert cut.kinds == [] and "cut to the room left" in " ".join(cut.notes)
    # the same cut with room for B nodes is not a freedom: ten nodes every round is no score threshold, so it
    # is a cut tree (the acceptance check fails it as one), not "stops early"
    stopped = diagnose_traces("x", _views(lambda lg, b: build_tree(lg, 10), 16, room=None), "ddtree", 16, HORIZON + 1)
    notes = " ".join(stopped.notes)
    assert stopped.kinds == [] and "cut to the room left" not in notes and "a cut tree" in notes, notes


def test_depth_from_acceptance_alone():
    per_round = RequestResult(output_ids=[1] * 20, finish_reason="length", rounds=2, acceptance_lengths=[10, 9])
    assert acceptance_depth_findings([per_round], 8, 16)[0].kind == "depth-beyond-block"
    counters = RequestResult(
        output_ids=[1] * 5,
        finish_reason="length",
        aggregate_only=True,
        mean_acceptance=2.0,
        per_position_acceptance=[0.5] * 16,
    )
    assert "reported at 16 depths" in acceptance_depth_findings([counters], 8, 16)[0].message
    fine = RequestResult(
        output_ids=[1] * 5,
        finish_reason="length",
        rounds=2,
        acceptance_lengths=[2, 2],
        per_position_acceptance=[0.5] * 16,
    )  # per-round lengths win over a long vector
    assert acceptance_depth_findings([fine], 8, 16) == []
    stated = RequestResult(
        output_ids=[1] * 5,
        finish_reason="length",
        aggregate_only=True,
        mean_acceptance=2.0,
        per_position_acceptance=[0.5] * 7,
        engine_settings={"draft_depth": 16},
    )
    assert "the engine reports a draft depth of 16" in acceptance_depth_findings([stated], 8, 16)[0].message


# ------------------------------------------------------------------------------------------------ engines


@pytest.fixture(scope="module")
def fixture_settings() -> SuiteSettings:
    return fixture_pair_settings(
        limit=2, max_new_tokens=24, budgets=[16], held_out_prompts=0, run_seed=1, golden_dir="/nonexistent"
    )


@pytest.mark.parametrize("label", list(tp.TREE_POLICY_ENGINES))
def test_policy_engine_is_lossless_but_fails_ddtree_naming_its_policy(fixture_settings, label):
    engine, kinds = tp.TREE_POLICY_ENGINES[label]
    budget = 8 if engine in (tp.ChainAtOrBelowBlock,) else 64 if engine is tp.SglangPr29907Trees else 16
    settings = fixture_settings.model_copy(update={"budgets": [budget]})
    results = by_family(plan_and_run(settings, engine, ["lossless/ddtree", "tree-structure/ddtree"]))
    assert results["lossless"].status == "pass", results["lossless"].message
    tree = results["tree-structure"]
    assert tree.status == "fail" and tree.details["tree_policy"] == list(kinds), tree.message
    page = render_html({"kind": "check", "settings": {}, "runs": [], "results": [tree.model_dump()]})
    assert "Tables from the checks" in page and "Tree policy" in page  # the report's own template renders it


def test_spec_tree_numbered_breadth_first_passes_with_a_note(fixture_settings):
    results = by_family(
        plan_and_run(
            fixture_settings,
            tp.BreadthFirstNumbering,
            ["lossless/ddtree", "tree-structure/ddtree", "acceptance/ddtree"],
        )
    )
    assert all(r.status == "pass" for r in results.values()), {k: r.message for k, r in results.items()}
    assert "numbered breadth-first (a freedom" in results["tree-structure"].message


def test_counters_only_engines_are_named_from_acceptance(fixture_settings):
    # aggregates need power: the per-prompt band over 5 prompts of 32 tokens (24 tokens hold 0 here)
    settings = fixture_settings.model_copy(update={"budgets": [32], "limit": 5, "max_new_tokens": 32})
    (result,) = plan_and_run(settings, tp.counters_only(tp.SglangPr29907Trees), ["acceptance/ddtree"])
    assert result.status == "fail", result.message
    assert result.details["tree_policy"] == ["width-cap", "depth-bonus", "early-stop"], result.message
    assert result.message.startswith("the engine's trees are not the spec's (aggregate "), result.message
    assert "equals the reference's under SGLang PR #29907's trees" in result.message  # the policy it matched


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "per-request"])
def test_depth_tied_to_the_budget_is_named_from_counters_whatever_the_tau(fixture_settings, pooled):
    # per request on 2 prompts the tau band cannot be judged (a skip before the depth was looked at)
    settings = fixture_settings.model_copy(update={"budgets": [64]})
    (result,) = plan_and_run(settings, tp.counters_only(tp.DepthTiedToBudget, pooled=pooled), ["acceptance/ddtree"])
    assert result.status == "fail" and "per-depth acceptance is reported at 64 depths" in result.message, result.message


def test_per_round_engine_is_matched_on_its_own_rounds(fixture_settings):
    """Named only with evidence: three prompts of 40 tokens give 30 whole rounds, 13 of which the chain
    explains and the spec does not (at two prompts of 24 tokens, six whole rounds name nothing)."""
    settings = fixture_settings.model_copy(update={"budgets": [8], "limit": 3, "max_new_tokens": 40})
    (result,) = plan_and_run(settings, tp.per_round_only(tp.SglangPr29907Trees), ["acceptance/ddtree"])
    assert result.status == "fail" and "a chain of the first min(B, L) argmax tokens" in result.message, result.message
    assert "rounds replayed on the engine's contexts" in result.message
    assert "chain explains 13 rounds the spec does not" in result.message  # the evidence: 13 rounds for it,
    assert "and the spec 0 it does not" in result.message  # none against it


def test_a_policy_is_named_only_when_the_evidence_prefers_it_to_the_spec():
    """The counts of a correct engine in bf16 (split-K partial sums, black box, 12 fixture prompts x 64
    tokens, B = 16: ``match_on_rounds`` measured early stop equal to its rounds in 151 of 159, the spec in
    153; early stop explains none the spec does not, the spec 2 it does not). The rule before named early
    stop (equal in more than 90 % of the rounds); now the spec's 6 misses are within the noise model's
    23 and the sign test does not prefer the policy: no name. A policy engine's counts (the chain at
    B = 8: 13 rounds it explains and the spec does not, none the reverse, 30 rounds) still name it."""
    from ddtree_conformance.calibration import load_calibration
    from ddtree_conformance.noise import NoiseModel
    from ddtree_conformance.policy_matching import MATCHING_PROMPTS, named_on_rounds

    rules = load_calibration(FIXTURE_TARGET, "bfloat16")
    equal = {"chain": 120, "width-cap": 140, "depth-bonus": 140, "early-stop": 151}
    only = {"chain": [0, 40], "width-cap": [0, 15], "depth-bonus": [1, 14], "early-stop": [0, 2]}
    assert equal["early-stop"] >= MATCHING_PROMPTS * 159  # what the old rule needed to name it
    matches, how = named_on_rounds(equal, only, 159, 153, rules)
    assert matches == [] and "the spec's tree misses 6 rounds, the noise model allows 23" in how, how
    exact = NoiseModel("float32", 0.0, 1e-3, 0, (), "exact")
    chain = {"chain": 30, "width-cap": 17, "depth-bonus": 17, "early-stop": 17}
    chain_only = {"chain": [13, 0], "width-cap": [0, 0], "depth-bonus": [0, 0], "early-stop": [0, 0]}
    assert named_on_rounds(chain, chain_only, 30, 17, exact)[0] == ["chain"]
    # more misses than the noise allows, but the policy explains no more of them than the spec: no name
    assert named_on_rounds(equal, {**only, "early-stop": [3, 3]}, 159, 120, rules)[0] == []


def test_a_correct_engine_that_rounds_differently_is_never_given_a_policy_name():
    """Split-K partial sums in bf16, outputs and lengths only: some rounds part from the spec's tree by
    noise, and some of those happen to equal a known policy's; the noise model explains them, so no
    policy is named (before, a correct engine that failed for another reason was told its trees were
    SGLang's early stop on 5-8 such rounds)."""
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine
    from ddtree_conformance.calibration import load_calibration
    from ddtree_conformance.policy_matching import match_on_rounds
    from ddtree_conformance.prompts import load_prompts
    from ddtree_conformance.testing.rounding_engines import SplitKReductionsBlackBox

    prompts = load_prompts("fixture", tokenizer_dir=str(FIXTURE_TARGET))[:4]
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=64) for p in prompts]
    config = RunConfig(mode="ddtree", budget=16, dtype="bfloat16")
    results = SplitKReductionsBlackBox(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)).generate(requests, config)
    reference = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    rules = load_calibration(FIXTURE_TARGET, "bfloat16")
    match = match_on_rounds(reference, requests, results, config, 16, rules=rules)
    assert match.matches == [] and "the noise model allows" in match.how, match.how
    misses = int(match.how.split("the spec's tree misses ")[1].split()[0])
    assert misses > 0, match.how  # the engine's rounds do part from the spec's


def test_counters_of_a_correct_engine_pass_saying_how_deep_it_drafts(fixture_settings):
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    settings = fixture_settings.model_copy(update={"limit": 5})
    (result,) = plan_and_run(settings, tp.counters_only(ReferenceEngine), ["acceptance/ddtree"])
    assert result.status == "pass", result.message
    assert result.message.endswith("the engine drafts 15 positions past the root (L = 15)"), result.message


def test_trees_cut_at_points_no_early_stop_margin_explains_are_not_named_a_policy():
    """vLLM's scheduler verifies the first nodes of a tree that fit its token budget (the plugin tier's
    B = 128 rounds): a prefix of the spec tree in pop order, cut wherever the batch ran out. An early
    stop cuts at one score threshold for every round. Two rounds of the same drafter logits cut after 3
    and after 6 nodes fit no single margin: a cut, named by the acceptance check, not "stops early"
    (which the diagnosis said before, turning the plugin tier's cut-tree verdict into a policy's)."""
    from ddtree_conformance.spec import build_tree
    from ddtree_conformance.tree_policy import RoundView, diagnose_traces

    logits = torch.randn(15, 64, generator=torch.Generator().manual_seed(3)) * 3

    def view(label, nodes, logits=logits):
        tree = build_tree(logits, nodes)
        tokens = [0] + tree.tokens.tolist()[1:]
        return RoundView(label, 10, tokens, tree.parents.tolist(), tree.depths.tolist(), logits)

    views = [view("p round 0", 8), view("p round 1", 3), view("p round 2", 6), view("p round 3", 8)]
    diagnosis = diagnose_traces("ddtree-B8", views, "ddtree", 8, 16)
    assert "early-stop" not in diagnosis.kinds, diagnosis.message()
    assert any("at cut points no single early-stop margin explains" in n for n in diagnosis.notes), diagnosis.notes
    # an early stop at margin 1 (SGLang PR #29907's) keeps the nodes scoring at least lp_1 - log B - 1: still named
    shallow = logits[:2]  # two drafted positions: a B = 64 tree must take unlikely tokens
    best = float(torch.log_softmax(shallow[0], dim=-1).max()) - math.log(64) - 1.0
    kept = sum(score >= best for score in build_tree(shallow, 64).scores[1:].tolist())
    assert 0 < kept < 64
    stopped = [view(f"p round {r}", kept, shallow) for r in range(3)]
    assert "early-stop" in diagnose_traces("ddtree-B64", stopped, "ddtree", 64, 3).kinds


def test_a_width_cap_scored_another_way_is_named_from_its_structure():
    """A lossless engine that keeps at most two children per node but ranks its candidates its own way
    (shallow first: a depth penalty of 2 a level, which no rebuild of the grid tries) gives trees no
    rebuild reproduces; no node of its trees has more than 2 children where the spec's trees of the same
    logits have many more. Before: "no known policy" (unexplained); now a width cap, named from the
    trees' structure."""
    from ddtree_conformance.tree_policy import RoundView, diagnose_traces

    views = []
    for r in range(6):
        logits = torch.randn(15, 64, generator=torch.Generator().manual_seed(100 + r)) * 2
        tree = build_policy_tree(logits, 16, max_children=2, depth_bonus=-2.0)
        views.append(
            RoundView(
                f"p round {r}", 10, [0] + tree.tokens.tolist()[1:], tree.parents.tolist(), tree.depths.tolist(), logits
            )
        )
    diagnosis = diagnose_traces("ddtree-B16", views, "ddtree", 16, 16)
    assert "width-cap" in diagnosis.kinds and "unexplained" not in diagnosis.kinds, diagnosis.message()
    assert "named from the trees' structure" in diagnosis.message()
