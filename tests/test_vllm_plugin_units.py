"""The vLLM DDTree plugin's vLLM-free parts, against the spec (default CPU tier, no vLLM needed).

The plugin (:mod:`ddtree_vllm_plugin`) carries its own tree builder, walk, node sampler and mask,
written independently of :mod:`ddtree_conformance.spec`; here they are compared with the spec on random
and tie-heavy inputs. Its start-up and per-request refusals are checked on stand-in configs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    import ddtree_vllm_plugin  # noqa: F401  (installed: pip install ./vllm-plugin)
except ImportError:  # the default tier does not install the plugin; its vLLM-free parts load from the repo
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm-plugin"))

from ddtree_vllm_plugin import config as plugin_config
from ddtree_vllm_plugin.tree import NodeSampler, best_first_tree, visibility, walk

from ddtree_conformance.spec import SamplingParams, build_tree, processed_probs, walk_tree
from ddtree_conformance.spec.verify import compile_tree


@settings(max_examples=300)
@given(
    seed=st.integers(0, 2**31 - 1),
    depth=st.integers(1, 6),
    vocab=st.integers(2, 40),
    budget=st.integers(1, 80),
    ties=st.booleans(),
)
def test_tree_equals_spec(seed, depth, vocab, budget, ties):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(depth, vocab, generator=g)
    if ties:  # repeated values and -inf: the tie-break rules decide
        logits = torch.round(logits * 2) / 2
        logits[:, 0] = float("-inf")
    mine = best_first_tree(logits, budget)
    spec = build_tree(logits, budget)
    assert mine.tokens[1:] == spec.tokens[1:].tolist()
    assert mine.parents == spec.parents.tolist()
    assert mine.depths == spec.depths.tolist()


def test_tree_truncation_is_a_tree():
    tree = best_first_tree(torch.randn(5, 30, generator=torch.Generator().manual_seed(1)), 40)
    for n in range(tree.size + 1):
        cut = tree.truncated(n)
        assert cut.size == n and all(p < i for i, p in enumerate(cut.parents) if i)


def test_greedy_walk_equals_spec():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        tree = best_first_tree(torch.randn(4, 12, generator=g), 20)
        node_logits = torch.randn(tree.size + 1, 12, generator=g)
        # make the target follow the tree for a while
        node = 0
        for _ in range(3):
            kids = list(tree.children[node].items())
            if not kids:
                break
            token, child = kids[0]
            node_logits[node, token] += 50
            node = child
        accepted, targets, bonus = walk(tree, node_logits, NodeSampler(0.0, 0, 1.0, None))
        spec = walk_tree(build_tree_from(tree), node_logits)
        assert accepted == list(spec.accepted) and bonus == spec.bonus


def build_tree_from(tree):
    from ddtree_conformance.spec.tree import DraftTree

    n = tree.size + 1
    return DraftTree(
        tokens=torch.tensor(tree.tokens),
        depths=torch.tensor(tree.depths),
        parents=torch.tensor(tree.parents),
        ranks=torch.zeros(n, dtype=torch.long),
        scores=torch.zeros(n, dtype=torch.float64),
    )


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (1.0, 3, 1.0), (0.8, 0, 0.7), (0.5, 5, 0.9)])
def test_node_distribution_equals_spec(temperature, top_k, top_p):
    logits = torch.randn(50, generator=torch.Generator().manual_seed(7)) * 3
    mine = NodeSampler(temperature, top_k, top_p, None).probabilities(logits)
    spec = processed_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.allclose(mine, spec.to(mine.dtype), atol=1e-6)


def test_visibility_equals_spec_mask():
    tree = best_first_tree(torch.randn(4, 9, generator=torch.Generator().manual_seed(5)), 15)
    start = 6
    mine = visibility(start, tree.parents)
    spec = compile_tree(build_tree_from(tree), 1, start, start)
    allowed = spec.attention_mask[0, 0] == 0  # additive mask: 0 where visible
    assert torch.equal(mine, allowed[1:])


# -- refusals -------------------------------------------------------------------------------------


def _vllm_config(**over):
    spec = SimpleNamespace(
        method="dflash",
        num_speculative_tokens=16,
        disable_padded_drafter_batch=False,
        draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(block_size=16)),
    )
    cfg = SimpleNamespace(
        additional_config={"ddtree": {}},
        speculative_config=spec,
        use_v2_model_runner=False,
        scheduler_config=SimpleNamespace(async_scheduling=False),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=1,
            tensor_parallel_size=1,
            data_parallel_size=1,
            worker_cls="vllm.v1.worker.cpu_worker.CPUWorker",
        ),
        cache_config=SimpleNamespace(cache_dtype="auto"),
        model_config=SimpleNamespace(is_hybrid=False, uses_mrope=False, model="target"),
        lora_config=None,
    )
    for path, value in over.items():
        obj = cfg
        *parents, leaf = path.split(".")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, value)
    return cfg


CPU = SimpleNamespace(is_cpu=lambda: True, device_type="cpu")


def test_supported_config_passes():
    options = plugin_config.validate(_vllm_config(), "0.32.0", CPU)
    assert options.trace_path is None


@pytest.mark.parametrize(
    "override,platform,version,needle",
    [
        ({}, CPU, "0.33.1", "vLLM 0.33.1 is outside the tested range 0.32.x"),
        ({}, SimpleNamespace(is_cpu=lambda: False, device_type="cuda"), "0.32.0", "CPU platform only"),
        ({"speculative_config.method": "eagle3"}, CPU, "0.32.0", "needs speculative_config method 'dflash'"),
        ({"speculative_config.num_speculative_tokens": 8}, CPU, "0.32.0", "below the drafter horizon L"),
        ({"speculative_config.num_speculative_tokens": 129}, CPU, "0.32.0", "at most 128"),
        ({"use_v2_model_runner": True}, CPU, "0.32.0", "VLLM_USE_V2_MODEL_RUNNER=0"),
        ({"scheduler_config.async_scheduling": True}, CPU, "0.32.0", "async scheduling"),
        ({"parallel_config.pipeline_parallel_size": 2}, CPU, "0.32.0", "pipeline parallelism"),
        ({"parallel_config.tensor_parallel_size": 2}, CPU, "0.32.0", "tensor parallelism"),
        ({"cache_config.cache_dtype": "fp8"}, CPU, "0.32.0", "kv_cache_dtype=fp8"),
        ({"model_config.is_hybrid": True}, CPU, "0.32.0", "hybrid"),
        ({"additional_config": {"ddtree": {"budget": 3}}}, CPU, "0.32.0", "additional_config['ddtree'].budget"),
    ],
)
def test_refusals_name_the_setting(override, platform, version, needle):
    with pytest.raises(plugin_config.DDTreeConfigError, match=None) as err:
        plugin_config.validate(_vllm_config(**override), version, platform)
    assert needle in str(err.value)
    assert not isinstance(err.value, ValueError)  # not buried in pydantic's VllmConfig report


def test_inert_without_the_switch():
    assert plugin_config.requested(_vllm_config())
    assert not plugin_config.requested(_vllm_config(additional_config={}))
    assert not plugin_config.requested(_vllm_config(additional_config=None))


@pytest.mark.parametrize(
    "field,value",
    [
        ("logprobs", 1),
        ("prompt_logprobs", 0),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.1),
        ("repetition_penalty", 1.2),
        ("min_p", 0.1),
        ("min_tokens", 3),
        ("logit_bias", {1: 2.0}),
        ("allowed_token_ids", [1, 2]),
        ("bad_words", ["x"]),
        ("structured_outputs", object()),
    ],
)
def test_request_refusals(field, value):
    params = SimpleNamespace(**{field: value})
    problem = plugin_config.request_problem(params)
    assert problem is not None and f"SamplingParams.{field}" in problem


def test_plain_request_accepted():
    assert plugin_config.request_problem(SimpleNamespace(temperature=1.0, top_k=5, top_p=0.9)) is None


@pytest.mark.parametrize(
    "extra,needle",
    [
        (
            {"ddtree": {"budget": 14}},
            "extra_args['ddtree'].budget is 14; this instance takes budgets from the drafter "
            "horizon L = 15 to its num_speculative_tokens = 64",
        ),
        ({"ddtree": {"budget": 65}}, "extra_args['ddtree'].budget is 65"),
        ({"ddtree": {"budget": "16"}}, "extra_args['ddtree'].budget: Input should be a valid integer"),
        ({"ddtree": {"budget": True}}, "extra_args['ddtree'].budget: Input should be a valid integer"),
        (
            {"ddtree": {"trace_draft_logits": "yes"}},
            "extra_args['ddtree'].trace_draft_logits: Input should be a valid boolean",
        ),
        ({"ddtree": {"nodes": 16}}, "extra_args['ddtree'].nodes: Extra inputs are not permitted"),
        ({"ddtree": [16]}, "extra_args['ddtree'] must be a dict, got list"),
    ],
)
def test_request_budget_refusals(extra, needle):
    problem = plugin_config.request_problem(SimpleNamespace(extra_args=extra), (15, 64))
    assert problem is not None and needle in problem, problem


@pytest.mark.parametrize(
    "extra",
    [
        None,
        {},
        {"other_plugin": 1},
        {"ddtree": {}},
        {"ddtree": None},
        {"ddtree": {"budget": 15}},
        {"ddtree": {"budget": 64, "trace_draft_logits": True}},
    ],
)
def test_request_budget_accepted(extra):
    assert plugin_config.request_problem(SimpleNamespace(extra_args=extra), (15, 64)) is None
    options = plugin_config.request_options(SimpleNamespace(extra_args=extra))
    assert options.budget in (None, 15, 64)


def test_budget_range_is_horizon_to_num_speculative_tokens():
    assert plugin_config.budget_range(_vllm_config()) == (15, 16)
    assert plugin_config.budget_range(_vllm_config(**{"speculative_config.num_speculative_tokens": 64})) == (15, 64)


def test_register_never_raises(monkeypatch, caplog):
    import ddtree_vllm_plugin as plugin
    from ddtree_vllm_plugin import hooks

    def broken():
        raise RuntimeError("simulated hook failure")

    monkeypatch.setattr(hooks, "install", broken)
    with caplog.at_level("WARNING"):
        assert plugin.register() is None
    assert "DDTree plugin not installed (vLLM left unchanged)" in caplog.text
    assert "simulated hook failure" in caplog.text
