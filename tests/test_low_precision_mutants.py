"""Every mutant fails in bfloat16 (and the issue-13 mutants in float32 too), naming the symptom; the
correct reference passes the very same checks in both dtypes.

Most rows run on a tiny random pair calibrated here (its MANIFEST.json is written by
:func:`ddtree_conformance.calibrate.calibrate`), with a context window of 640 so a long prompt
reaches past position 512. Mutants that only slow acceptance need a drafter that drafts well: those
rows run on the trained fixture pair, on three prompts.
"""

from __future__ import annotations

import pytest

from ddtree_conformance.adapters.interface import Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.calibrate import calibrate
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing import mutants
from ddtree_conformance.testing.random_pair import write_random_pair, write_random_prompts
from ddtree_conformance.testing.runs import plan_and_run

pytestmark = pytest.mark.slow

# mutant -> (pair, budgets, check-id substrings, {dtype: phrase of the failing message})
ROWS = {
    mutants.FlatPositions: ("random", [16], ["tree-structure/ddtree"], {"bfloat16": "flat index"}),
    mutants.SiblingMask: ("random", [16], ["lossless/ddtree"], {"bfloat16": "outside the near-tie bound"}),
    mutants.FirstRowsCompaction: ("random", [16], ["lossless/ddtree"], {"bfloat16": "outside the near-tie bound"}),
    mutants.FirstRowsFeedback: ("fixture", [16], ["acceptance/ddtree"], {"bfloat16": "lossless but slower"}),
    mutants.NonZeroTreeSize: ("random", [16], ["token-0-and-mask-id/ddtree"], {"bfloat16": "token 0"}),
    mutants.MaskIdDropped: (
        "random",
        [16],
        ["token-0-and-mask-id/dflash"],  # caught by integrity: lengths vs output
        {"bfloat16": "field acceptance_lengths"},
    ),
    mutants.TopKTopPIgnored: ("random", [16], ["sampling/ddtree-B16/T=1,top_k=3"], {"bfloat16": "probability 0"}),
    mutants.DrafterPositionsOffByOne: (
        "fixture",
        [16],
        ["acceptance/ddtree"],
        {"bfloat16": "lossless but slower", "float32": "lossless but slower"},
    ),
    mutants.RunnerUpBelowTwiceBound: (
        "random",
        [16],
        ["lossless/ddtree"],
        {"bfloat16": "outside the near-tie bound", "float32": "not lossless"},
    ),
    mutants.RunnerUpWithinBound: (
        "fixture",
        [16],
        ["lossless/ddtree"],
        {"bfloat16": "above the ceiling", "float32": "not lossless"},
    ),
    mutants.AcceptanceOverReported: (
        "random",
        [16],
        ["acceptance/ddtree"],
        {"bfloat16": "do not add up", "float32": "do not add up"},
    ),
    mutants.BudgetCappedAbove128: (
        "fixture",
        [256],
        ["acceptance/ddtree-B256"],  # named a cut tree where the
        # spec tree of the capped size explains the round, else a slower round
        {
            "bfloat16": ("smaller trees than B=256", "lossless but slower"),
            "float32": ("smaller trees than B=256", "lossless but slower"),
        },
    ),
    mutants.CompactionPast512: (
        "fixture",
        [16],
        ["context-range/ddtree"],
        {"bfloat16": "not lossless across", "float32": "not lossless across"},
    ),
    mutants.BatchSettingsMixedUp: (
        "random",
        [16],
        ["busy-batch/ddtree"],  # or its verified trees give it away
        {
            "bfloat16": ("in a batch of", "walking the tree by its target tokens"),
            "float32": ("in a batch of", "walking the tree by its target tokens"),
        },
    ),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Settings per pair name: the calibrated random pair and the fixture (3 prompts)."""
    root = tmp_path_factory.mktemp("lp-pair")
    target, drafter = write_random_pair(root, seed=3, max_position_embeddings=640)
    path = root / "prompts.jsonl"
    prompts = write_random_prompts(path, [5, 11, 19, 26], seed=7, prefix="lp")
    engine = ReferenceEngine(str(target))
    requests = [Request(prompt_ids=ids, max_new_tokens=48) for ids in prompts]
    outputs = engine.generate(requests, RunConfig(mode="plain"))
    calibrate(
        str(target),
        ["bfloat16"],
        [r.prompt_ids + o.output_ids for r, o in zip(requests, outputs)],
        drafter_dir=str(drafter),
    )
    common = dict(
        isolate=False,
        sampling_requests=60,
        branch_prompts=2,
        branch_rounds=2,
        torch_threads=1,
        context_tokens=96,  # context-range: the window's end only (tests/test_input_adversaries.py: every length)
    )
    return {
        "random": SuiteSettings(
            model_dir=str(target),
            drafter_dir=str(drafter),
            pair_name="lp-random",
            prompt_set=str(path),
            max_new_tokens=24,
            golden_dir=str(root / "golden"),
            **common,
        ),
        # run seed pinned: with 96 context tokens the plan decodes about 40 tokens past 512, and
        # CompactionPast512 damages only rounds whose accepted path leaves the first rows, so on a rare
        # drawn plan its bf16 outputs stayed within the noise (seen once on 2026-12-02; seeds 0-24 all
        # fail it). The default plan decodes the whole window (tests/test_input_adversaries.py).
        "fixture": SuiteSettings(
            model_dir=str(FIXTURE_TARGET),
            drafter_dir=str(FIXTURE_DRAFTER),
            limit=3,
            max_new_tokens=32,
            run_seed=1,
            **common,
        ),
    }


CASES = [(m, dtype) for m, row in ROWS.items() for dtype in row[3]]


@pytest.mark.parametrize("mutant, dtype", CASES, ids=[f"{m.__name__}-{d}" for m, d in CASES])
def test_mutant_fails_naming_the_symptom(pairs, mutant, dtype):
    pair, budgets, names, symptoms = ROWS[mutant]
    settings = pairs[pair].model_copy(update={"dtype": dtype, "budgets": budgets})
    results = plan_and_run(settings, mutant, names)
    failed = [r for r in results if r.status == "fail"]
    assert failed, f"{mutant.__name__} passed in {dtype}: {[(r.check, r.status, r.message) for r in results]}"
    phrases = symptoms[dtype] if isinstance(symptoms[dtype], tuple) else (symptoms[dtype],)
    assert any(p in r.message for r in failed for p in phrases), [r.message for r in failed]


GROUPS = sorted({(row[0], tuple(row[1]), dtype) for row in ROWS.values() for dtype in row[3]})


@pytest.mark.parametrize(
    "pair, budgets, dtype", GROUPS, ids=[f"{p}-B{'-'.join(map(str, b))}-{d}" for p, b, d in GROUPS]
)
def test_reference_passes_every_check_that_catches_a_mutant(pairs, pair, budgets, dtype):
    names = sorted(
        {n for row in ROWS.values() if (row[0], tuple(row[1])) == (pair, budgets) and dtype in row[3] for n in row[2]}
    )
    settings = pairs[pair].model_copy(update={"dtype": dtype, "budgets": list(budgets)})
    results = plan_and_run(settings, ReferenceEngine, names)
    bad = [(r.check, r.status, r.message) for r in results if r.status != "pass"]
    assert not bad, bad
