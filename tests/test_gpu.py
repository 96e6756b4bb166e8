"""GPU tier of the reference engine (``pytest -m gpu``); skipped where CUDA is absent.

* fp32 on CUDA: ddtree and dflash greedy outputs equal plain, exactly;
* bf16 on CUDA: equal up to a first divergence that is a near-tie (doc §7);
* the vectorized builder on CUDA returns the heap builder's tree;
* the conformance plan's core checks pass on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from adapters.interface import Request, RunConfig
from adapters.reference.engine import ReferenceEngine
from conformance.checks.lossless import compare_outputs
from conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET
from conformance.prompts import load_prompts
from conformance.spec import build_tree, build_tree_vectorized

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible"),
]


@pytest.fixture(scope="module")
def fixture_engine():
    if not (FIXTURE_TARGET / "config.json").is_file():
        pytest.skip("bundled fixture pair not present")
    engine = ReferenceEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def requests_():
    prompts = load_prompts("fixture", tokenizer_dir=FIXTURE_TARGET)
    return prompts, [Request(prompt_ids=p.prompt_ids, max_new_tokens=64) for p in prompts]


@pytest.fixture(scope="module")
def plain_runs(fixture_engine, requests_):
    """Plain outputs per dtype, computed once."""
    cache = {}

    def get(dtype):
        if dtype not in cache:
            cache[dtype] = fixture_engine.generate(requests_[1], RunConfig(mode="plain", dtype=dtype, device="cuda"))
        return cache[dtype]

    return get


@pytest.mark.parametrize("mode,budget", [("dflash", 1), ("ddtree", 16), ("ddtree", 64), ("ddtree", 256)])
def test_fp32_cuda_lossless(fixture_engine, requests_, plain_runs, mode, budget):
    prompts, requests = requests_
    plain = plain_runs("float32")
    spec = fixture_engine.generate(requests, RunConfig(mode=mode, budget=budget, device="cuda"))
    diverged = [p.id for p, a, b in zip(prompts, plain, spec) if a.output_ids != b.output_ids]
    assert not diverged, f"fp32 CUDA {mode} B={budget} differs from plain on {diverged}"


@pytest.mark.parametrize("mode,budget", [("dflash", 1), ("ddtree", 64)])
def test_bf16_cuda_near_tie_rule(fixture_engine, requests_, plain_runs, mode, budget):
    from conformance.calibration import near_tie_bound
    from conformance.scorer import TargetScorer

    prompts, requests = requests_
    plain = plain_runs("bfloat16")
    spec = fixture_engine.generate(requests, RunConfig(mode=mode, budget=budget, dtype="bfloat16", device="cuda"))
    scorer = TargetScorer(str(FIXTURE_TARGET), "float32", "cuda")
    bound = near_tie_bound(FIXTURE_TARGET, "bfloat16")
    verdicts = [
        compare_outputs(p.id, p.prompt_ids, a.output_ids, b.output_ids, exact=False, near_tie_bound=bound,
                        scorer=scorer)
        for p, a, b in zip(prompts, plain, spec)
    ]
    kinds = [v.kind for v in verdicts]
    print(f"bf16 {mode} B={budget}: {kinds.count('match')} match, {kinds.count('near-tie')} near-tie")
    real = [v for v in verdicts if v.kind == "divergence"]
    assert not real, [v.model_dump() for v in real]


@pytest.mark.parametrize("budget", [16, 64, 256, 1024])
def test_vectorized_builder_on_cuda_equals_heap(budget):
    g = torch.Generator().manual_seed(budget)
    for _ in range(5):
        logits = (torch.randn((15, 4096), generator=g) * 3).cuda()
        heap = build_tree(logits, budget)  # same device: CPU and CUDA log-softmax differ in low bits
        vec = build_tree_vectorized(logits, budget)
        assert heap.same_as(vec)
