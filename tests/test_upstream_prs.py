"""The configs the vLLM and SGLang adapters generate, contract-tested against the recorded interfaces of
the DDTree pull requests (vLLM #42910, SGLang #29907: ``upstream_api.PR_DDTREE``), which cannot be
installed here, and against the released packages' recorded names. Neither vLLM nor SGLang is
imported: the adapters' config builders (``llm_config``, ``server_config``) are plain data. Each
contract check is also shown failing when a recorded name changes.
"""

from __future__ import annotations

import dataclasses

import pytest

from ddtree_conformance.adapters.interface import EngineError, RunConfig
from ddtree_conformance.adapters.sglang import pr_contract as sg_contract
from ddtree_conformance.adapters.sglang import upstream_api as sg_api
from ddtree_conformance.adapters.sglang.server_config import ServerSetup
from ddtree_conformance.adapters.vllm import pr_contract as vl_contract
from ddtree_conformance.adapters.vllm import upstream_api as vl_api
from ddtree_conformance.adapters.vllm.llm_config import LlmSetup
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

TARGET, DRAFTER, BLOCK = str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), 16
BUDGETS = (8, 15, 16, 64)


def _vllm(**kw) -> LlmSetup:
    return LlmSetup(TARGET, DRAFTER, BLOCK, **{"ddtree": "native", **kw})


def _vllm_run(setup: LlmSetup, mode: str, budget: int = 1) -> tuple[dict, int | None]:
    config = RunConfig(mode=mode, budget=budget)
    return setup.llm_kwargs(config, budget), setup.draft_depth(mode, budget)


def _sglang(**kw) -> ServerSetup:
    return ServerSetup(TARGET, DRAFTER, BLOCK, **{"dflash_why": None, "ddtree_why": None, **kw})


def _sglang_run(setup: ServerSetup, mode: str, budget: int = 1) -> dict:
    return setup.server_args(RunConfig(mode=mode, budget=budget, device="cuda"))


# -- vLLM PR #42910 -------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", BUDGETS)
def test_vllm_native_ddtree_configs_hold_to_the_pr_record(budget):
    kwargs, depth = _vllm_run(_vllm(), "ddtree", budget)
    assert vl_contract.check_ddtree_pr_config(kwargs, budget, depth) == []
    assert kwargs["attention_backend"] == "TREE_ATTN"
    assert depth == budget  # the PR's coupling: num_speculative_tokens is the draft depth


def test_vllm_baselines_hold_to_the_released_names_and_keep_vllms_backend():
    setup = _vllm()
    for mode in ("plain", "dflash"):
        kwargs, depth = _vllm_run(setup, mode)
        assert vl_contract.check_release_config(kwargs) == []
        assert "attention_backend" not in kwargs  # TREE_ATTN is the DDTree PR's need only
    assert _vllm_run(setup, "dflash")[1] == BLOCK - 1
    plugin = LlmSetup(TARGET, DRAFTER, BLOCK, ddtree="plugin")
    kwargs, depth = _vllm_run(plugin, "ddtree", 64)
    assert depth == BLOCK - 1 and "attention_backend" not in kwargs  # the plugin drafts the block
    assert vl_contract.check_release_config({k: v for k, v in kwargs.items() if k != "additional_config"}) == []


@pytest.mark.parametrize(
    ("field", "value", "phrase"),
    [
        ("method", "dd_tree", "the PR selects DDTree with 'dd_tree'"),
        ("budget_key", "num_tree_nodes", "must be speculative_config.num_tree_nodes"),
        ("attention_backend", "TREE_ATTENTION", "asserts the TREE_ATTENTION backend"),
        ("attention_backend_kwarg", "attention_config", "attention_config is None"),
        (
            "spec_fields",
            ("method", "model"),
            "speculative_config has 'num_speculative_tokens', which the PR does not read",
        ),
        (
            "llm_kwargs",
            tuple(k for k in vl_api.LLM_KWARGS if k != "attention_backend"),
            "vllm.LLM has no keyword argument 'attention_backend'",
        ),
        ("draft_depth_is_budget", False, None),
    ],
)
def test_vllm_contract_fails_when_a_recorded_name_changes(field, value, phrase):
    kwargs, depth = _vllm_run(_vllm(), "ddtree", 64)
    changed = dataclasses.replace(vl_api.PR_DDTREE, **{field: value})
    problems = vl_contract.check_ddtree_pr_config(kwargs, 64, depth, changed)
    if phrase is None:  # a record that stops tying depth to the budget asks nothing of the reported depth
        assert problems == []
        return
    assert any(phrase in p for p in problems), problems
    assert all(p.startswith("vLLM PR #42910 at 0aa15d61: ") for p in problems)


def test_vllm_contract_fails_on_a_wrong_depth_or_an_overridden_backend():
    kwargs, depth = _vllm_run(_vllm(), "ddtree", 64)
    assert "reports a draft depth of 15" in vl_contract.check_ddtree_pr_config(kwargs, 64, 15)[0]
    kwargs, depth = _vllm_run(_vllm(attention_backend="FLASH_ATTN"), "ddtree", 64)
    (problem,) = vl_contract.check_ddtree_pr_config(kwargs, 64, depth)
    assert "attention_backend is 'FLASH_ATTN'" in problem and "asserts the TREE_ATTN backend" in problem, problem
    assert _vllm_run(_vllm(attention_backend="FLASH_ATTN"), "plain")[0]["attention_backend"] == "FLASH_ATTN"


def test_vllm_results_report_backend_and_depth():
    setup = _vllm()
    assert setup.engine_settings("ddtree", 64) == {
        "attention_backend": "TREE_ATTN",
        "enforce_eager": True,
        "draft_depth": 64,
    }
    assert setup.engine_settings("plain", 1)["attention_backend"] == "vllm default"
    (depth_note,) = [n for n in setup.notes() if "drafts B positions past the root" in n]
    assert "its block gives L = 15" in depth_note, depth_note


# -- SGLang PR #29907 -----------------------------------------------------------------------------
@pytest.mark.parametrize("budget", BUDGETS)
def test_sglang_ddtree_configs_hold_to_the_pr_record_and_baselines_match(budget):
    setup = _sglang()
    by_mode = {
        "plain": _sglang_run(setup, "plain"),
        "dflash": _sglang_run(setup, "dflash"),
        "ddtree": _sglang_run(setup, "ddtree", budget),
    }
    assert sg_contract.check_ddtree_pr_server_args(by_mode["ddtree"], budget, BLOCK) == []
    assert sg_contract.check_release_server_args(by_mode["plain"]) == []
    assert sg_contract.check_release_server_args(by_mode["dflash"]) == []
    assert sg_contract.check_like_with_like(by_mode) == []
    assert {k["attention_backend"] for k in by_mode.values()} == {"triton"}
    assert setup.engine_settings("plain")["attention_backend"] == "triton"


@pytest.mark.parametrize(
    ("field", "value", "phrase"),
    [
        ("algorithm", "DD_TREE", "the PR names DDTree 'DD_TREE'"),
        ("budget_field", "speculative_tree_budget", "must be speculative_tree_budget"),
        ("added_fields", (), "ServerArgs has no field 'speculative_ddtree_budget'"),
        ("draft_tokens_field", "speculative_dflash_block_size", "speculative_dflash_block_size must be the drafter's"),
        ("full_tree_attention_backend", "fa3", "refuses attention backend 'triton' (it needs 'fa3')"),
        ("page_size", 16, "page_size must be 16"),
    ],
)
def test_sglang_contract_fails_when_a_recorded_name_changes(field, value, phrase):
    kwargs = _sglang_run(_sglang(), "ddtree", 64)
    if field == "page_size":
        kwargs = dict(kwargs, page_size=1)
    changed = dataclasses.replace(sg_api.PR_DDTREE, **{field: value})
    problems = sg_contract.check_ddtree_pr_server_args(kwargs, 64, BLOCK, changed)
    assert any(phrase in p for p in problems), problems
    assert all(p.startswith("SGLang PR #29907 at 93e9850e: ") for p in problems)


def test_sglang_attention_backend_option_applies_to_every_mode_and_is_refused_above_l():
    setup = _sglang(attention_backend="flashinfer")
    assert {_sglang_run(setup, m)["attention_backend"] for m in ("plain", "dflash")} == {"flashinfer"}
    assert _sglang_run(setup, "ddtree", 15)["attention_backend"] == "flashinfer"  # spine mode takes any backend
    with pytest.raises(
        EngineError,
        match=r"option attention_backend=flashinfer: SGLang PR #29907's DDTree runs "
        r"budgets above L = 15 \(B = 16\) only with the triton attention backend",
    ):
        _sglang_run(setup, "ddtree", 16)
    assert (
        sg_contract.check_like_with_like(
            {"plain": {"attention_backend": "flashinfer"}, "ddtree": {"attention_backend": "triton"}}
        )
        != []
    )


def test_sglang_without_pr_ddtree_keeps_sglangs_backend():
    assert "attention_backend" not in _sglang_run(_sglang(ddtree_why="no DDTREE"), "plain")
    custom = _sglang(ddtree_algorithm="conformance_tree", ddtree_budget_arg="speculative_num_draft_tokens")
    assert "attention_backend" not in _sglang_run(custom, "ddtree", 48)  # another DDTree: no PR-specific default
    assert _sglang(ddtree_overlap=False).server_args(RunConfig(mode="ddtree", budget=32))["disable_overlap_schedule"]


def test_lossless_says_whether_plain_and_the_speculative_run_shared_their_settings():
    from ddtree_conformance.adapters.interface import RequestResult
    from ddtree_conformance.checks.lossless import settings_note

    def result(**settings):
        return RequestResult(output_ids=[1], finish_reason="length", engine_settings=settings)

    setup = _sglang()
    label = "ddtree-B64"
    same = settings_note([result(**setup.engine_settings("plain"))], [result(**setup.engine_settings("ddtree"))], label)
    assert same == f"; plain and {label} both ran with attention backend triton"
    differ = settings_note([result(attention_backend="flashinfer")], [result(attention_backend="triton")], label)
    head, _, rest = differ.partition(": ")  # the one setting that differs, each side's value
    assert (head, rest) == (
        "; engine settings differ from plain",
        f"attention_backend flashinfer (plain) vs triton ({label})",
    )
    assert settings_note([result()], [result()], "dflash") == ""


# -- CUDA graphs per run (issue 31: the real adapters declare capabilities().cuda_graphs) ----------------------
def test_vllm_switches_cuda_graphs_per_run_on_cuda_only():
    cuda = _vllm(cuda=True, enforce_eager=False)
    for asked, eager in ((True, False), (False, True), (None, False)):  # None: the adapter's enforce_eager
        kwargs = cuda.llm_kwargs(RunConfig(mode="ddtree", budget=16, device="cuda", cuda_graphs=asked), 16)
        assert kwargs["enforce_eager"] is eager
        settings = cuda.engine_settings("ddtree", 16, asked)
        assert settings["enforce_eager"] is eager and settings["cuda_graphs"] is (not eager)
    cpu = _vllm()  # vLLM's CPU backend runs eagerly whatever the run asks, and says nothing of graphs
    assert cpu.llm_kwargs(RunConfig(mode="plain", cuda_graphs=True), 1)["enforce_eager"] is True
    assert "cuda_graphs" not in cpu.engine_settings("plain", 1, True)


def test_sglang_switches_cuda_graphs_per_run():
    setup = _sglang()  # option cuda_graph: True
    off = setup.server_args(RunConfig(mode="plain", device="cuda", cuda_graphs=False))
    assert off["disable_cuda_graph"] is True and setup.engine_settings("plain", False)["cuda_graphs"] is False
    on = setup.server_args(RunConfig(mode="plain", device="cuda", cuda_graphs=True))
    assert "disable_cuda_graph" not in on and setup.engine_settings("plain", True)["cuda_graphs"] is True
    eager = _sglang(cuda_graph=False)  # the option decides where the run does not ask
    assert eager.server_args(RunConfig(mode="plain", device="cuda"))["disable_cuda_graph"] is True
    assert "disable_cuda_graph" not in eager.server_args(RunConfig(mode="plain", device="cuda", cuda_graphs=True))


def _adapter(monkeypatch, package: str, cls: str, **attributes):
    """The adapter class imported over a stand-in for its engine package (not installed here), as an
    instance with the attributes its ``capabilities()`` reads; nothing of the stand-in stays imported."""
    import importlib
    import sys
    import types

    stub = types.ModuleType(package)
    stub.__version__ = "0.0.test"
    monkeypatch.setitem(sys.modules, package, stub)
    name = f"ddtree_conformance.adapters.{package}.engine"
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)
    engine = object.__new__(getattr(module, cls))
    engine.__dict__.update(attributes)
    return engine


@pytest.mark.parametrize("cuda", [True, False])
def test_the_real_adapters_declare_cuda_graphs(monkeypatch, cuda):
    """Before: neither declared it, so their `ci` jobs on CUDA would end INCOMPLETE ("engine cannot switch CUDA
    graphs per run") on the engines this suite exists for. They switch per run where there are graphs."""
    vllm = _adapter(
        monkeypatch,
        "vllm",
        "VllmEngine",
        version="0.0.test",
        scope="batch",
        drafter_dir=DRAFTER,
        _dflash_ok=True,
        ddtree_ok=False,
        ddtree_why="no DDTree",
        plugin=False,
        shared_budget=None,
        setup=_vllm(ddtree="none", cuda=cuda),
        cuda=cuda,
        max_model_len=1024,
    )
    assert vllm.capabilities().cuda_graphs is cuda
    sglang = _adapter(
        monkeypatch,
        "sglang",
        "SglangEngine",
        version="0.0.test",
        scope="batch",
        gpus=2 if cuda else 0,
        drafter_dir=DRAFTER,
        _dflash_ok=True,
        ddtree_ok=False,
        ddtree_why="no DDTree",
        setup=_sglang(ddtree_why="no DDTree"),
        deterministic=False,
        max_context=1024,
    )
    assert sglang.capabilities().cuda_graphs is cuda
