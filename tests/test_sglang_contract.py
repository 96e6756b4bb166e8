"""Contract tests: the SGLang adapter against the real installed SGLang (``sglang==0.5.23``), on CPU.

Every name in :mod:`ddtree_conformance.adapters.sglang.upstream_api` must exist in the installed package:
ServerArgs fields
(with the types and choices of the values the adapter passes), algorithm names, the plugin
registry API, the offline engine's methods, sampling keys, and the meta_info keys and finish types
where SGLang produces them. Each check is a function in :mod:`ddtree_conformance.adapters.sglang.engine`; every test
that calls one with the adapter's names also calls it with a wrong name and sees it fail.

Skipped when SGLang is not installed (the main CI venv has none); run with
``pytest -m sglang tests/test_sglang_contract.py`` in a venv with SGLang (tox -e sglang,
.ci/sglang-tier). SGLang itself runs on CUDA only: the GPU tier is tests/test_sglang_tier.py.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import warnings

import pytest

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.sglang import upstream_api as api
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

pytestmark = pytest.mark.sglang

sglang = pytest.importorskip("sglang", reason="SGLang is not installed here (bash .ci/sglang-tier or tox -e sglang)")

from ddtree_conformance.adapters.sglang import contract  # noqa: E402
from ddtree_conformance.adapters.sglang import engine as sg  # noqa: E402

TARGET, DRAFTER = str(FIXTURE_TARGET), str(FIXTURE_DRAFTER)
BUILTINS_0_5_23 = {"DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "NGRAM", "STANDALONE", "UNO"}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _engine(**options) -> sg.SglangEngine:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sg.SglangEngine(TARGET, DRAFTER, **options)


@pytest.fixture
def register_algorithm():
    """Register algorithms in-process through the real ``SpeculativeAlgorithm.register``; removed afterwards."""
    from sglang.srt.speculative import spec_registry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    added = []

    def register(name: str, supports_overlap: bool = False):
        @getattr(SpeculativeAlgorithm, api.REGISTER)(name, supports_overlap=supports_overlap)
        def _factory(server_args):  # the worker class would come from here; never called on CPU
            raise AssertionError("not on CPU")

        added.append(name.upper())
        return _factory

    yield register
    for name in added:
        spec_registry._REGISTRY.pop(name, None)  # test cleanup only: the adapter never touches it


@pytest.fixture
def pr29907_budget_field(monkeypatch):
    """The ServerArgs of a SGLang with PR #29907: the real fields plus ``speculative_ddtree_budget``."""
    real = contract.server_args_fields

    def fields():
        return {**real(), api.DEFAULT_DDTREE_BUDGET_ARG: int | None}

    monkeypatch.setattr(contract, "server_args_fields", fields)  # where probe_ddtree and check_server_args read it


# -- version ---------------------------------------------------------------------------------------
def test_version_in_tested_range():
    assert sg.version_tested(sglang.__version__), (
        f"SGLang {sglang.__version__} is outside the adapter's tested range {api.TESTED_VERSIONS}: "
        "run this tier and update adapters/sglang/upstream_api.py:TESTED_VERSIONS"
    )
    assert not sg.version_tested("0.50.1") and not sg.version_tested("1.0")


def test_version_guard_warns_outside_range(monkeypatch):
    monkeypatch.setattr(sg.sglang, "__version__", "9.99.0")
    with pytest.warns(UserWarning, match=r"SGLang 9\.99\.0 is outside"):
        engine = sg.SglangEngine(TARGET, DRAFTER)
    assert any("9.99.0" in note for note in engine.capabilities().notes)


# -- ServerArgs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", api.SERVER_ARGS_FIELDS)
def test_server_args_field(field):
    assert field in sg.server_args_fields(), f"ServerArgs has no field {field!r} (the adapter sets it)"


def test_server_args_check_catches_wrong_names_types_and_choices():
    assert sg.check_server_args({"speculative_num_draft_tokens": 16}) == []
    assert sg.check_server_args({"speculative_num_draft_token": 16}) == [
        "ServerArgs has no field 'speculative_num_draft_token'"
    ]
    (wrong_type,) = sg.check_server_args({"tp_size": "2"})
    assert "ServerArgs.tp_size = '2'" in wrong_type
    (wrong_choice,) = sg.check_server_args({"dtype": "fp32"})
    assert "ServerArgs.dtype = 'fp32' is not one of" in wrong_choice and "'float32'" in wrong_choice


CONFIGS = [
    RunConfig(mode="plain", dtype="float32", device="cuda"),
    RunConfig(mode="plain", dtype="bfloat16", device="cuda:1", tensor_parallel_size=2),
    RunConfig(mode="dflash", dtype="float32", device="cuda"),
    RunConfig(mode="dflash", dtype="float16", device="cuda", tensor_parallel_size=4),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.mode}-{c.dtype}-tp{c.tensor_parallel_size}")
def test_engine_kwargs_build_a_real_server_args(config):
    from sglang.srt.server_args import ServerArgs

    engine = _engine(
        context_length=512,
        mem_fraction_static=0.5,
        max_running_requests=8,
        attention_backend="triton",
        deterministic=True,
        cuda_graph=False,
        seed=3,
    )
    kwargs = engine.server_args(config)
    assert set(kwargs) <= set(api.SERVER_ARGS_FIELDS), set(kwargs) - set(api.SERVER_ARGS_FIELDS)
    assert sg.check_server_args(kwargs) == []
    args = ServerArgs(**kwargs)  # construction only: resolution (model loading, device checks) is the GPU tier's
    for key, value in kwargs.items():
        assert getattr(args, key) == value, key
    assert args.tp_size == config.tensor_parallel_size and args.dtype == config.dtype
    assert args.base_gpu_id == (1 if config.device == "cuda:1" else 0)
    if config.mode == "dflash":
        assert args.speculative_algorithm == api.DFLASH_ALGORITHM
        assert args.speculative_draft_model_path == DRAFTER
        assert args.speculative_num_draft_tokens == 16  # the fixture drafter's block_size
        assert (args.speculative_num_steps, args.speculative_eagle_topk) == (1, 1)
    else:
        assert args.speculative_algorithm is None
    with pytest.raises(TypeError):
        ServerArgs(**kwargs, speculative_ddtree_budget=16)  # 0.5.23 has no such field: the Struct rejects it


def test_dflash_num_draft_tokens_is_the_field_sglang_resolves_block_size_into():
    # speculative_hook.py sets speculative_num_draft_tokens from speculative_dflash_block_size when
    # only the latter is given; both names must exist for that contract to hold.
    fields = sg.server_args_fields()
    assert "speculative_dflash_block_size" in fields and "speculative_num_draft_tokens" in fields


# -- algorithms and the plugin registry -----------------------------------------------------------
def test_builtin_algorithms():
    found = set(sg.builtin_algorithms())
    assert api.DFLASH_ALGORITHM in found
    assert found == BUILTINS_0_5_23, found ^ BUILTINS_0_5_23
    assert sg.probe_algorithm(api.DFLASH_ALGORITHM) == (True, "")
    assert sg.probe_algorithm("dflash") == (True, "")  # from_string upper-cases
    assert sg.probe_algorithm("NEXTN")[0]  # alias of EAGLE
    ok, why = sg.probe_algorithm("NO_SUCH_ALGO")
    assert not ok and "'NO_SUCH_ALGO'" in why and "DFLASH" in why
    assert not sg.probe_algorithm(api.NO_ALGORITHM)[0], "NONE is no algorithm"


def test_register_api(monkeypatch):
    assert sg.check_register_api() == []
    monkeypatch.setattr(api, "REGISTER_PARAMS", api.REGISTER_PARAMS + ("priority",))
    assert sg.check_register_api() == ["SpeculativeAlgorithm.register has no parameter 'priority'"]
    monkeypatch.setattr(api, "REGISTER", "register_algorithm")
    assert sg.check_register_api() == ["SpeculativeAlgorithm.register_algorithm is missing"]


def test_ddtree_absent_from_0_5_23():
    ok, why = sg.probe_ddtree(api.DEFAULT_DDTREE_ALGORITHM, api.DEFAULT_DDTREE_BUDGET_ARG)
    assert not ok
    assert "no algorithm 'DDTREE'" in why and "no budget field 'speculative_ddtree_budget'" in why
    caps = _engine().capabilities()
    assert "ddtree" not in caps.modes
    assert any(note.startswith("no ddtree in this SGLang: ") and why in note for note in caps.notes), caps.notes
    with pytest.raises(EngineError, match="mode ddtree unavailable: .*DDTREE"):
        _engine().server_args(RunConfig(mode="ddtree", budget=32, device="cuda"))


def test_ddtree_needs_both_algorithm_and_budget_field(register_algorithm, pr29907_budget_field, monkeypatch):
    ok, why = sg.probe_ddtree(api.DEFAULT_DDTREE_ALGORITHM, api.DEFAULT_DDTREE_BUDGET_ARG)
    assert not ok and "no algorithm 'DDTREE'" in why and "budget field" not in why
    register_algorithm(api.DEFAULT_DDTREE_ALGORITHM)
    assert sg.probe_ddtree(api.DEFAULT_DDTREE_ALGORITHM, api.DEFAULT_DDTREE_BUDGET_ARG) == (True, "")
    ok, why = sg.probe_ddtree(api.DEFAULT_DDTREE_ALGORITHM, "speculative_tree_budget")
    assert not ok and why == "ServerArgs has no budget field 'speculative_tree_budget'"


def test_ddtree_detected_when_registered_in_process(register_algorithm, pr29907_budget_field):
    """PR #29907's names (DDTREE, speculative_ddtree_budget), the algorithm registered through the real API."""
    assert "ddtree" not in _engine().capabilities().modes
    register_algorithm(api.DEFAULT_DDTREE_ALGORITHM, supports_overlap=False)
    engine = _engine()
    assert engine.capabilities().modes == ["plain", "dflash", "ddtree"]
    kwargs = engine.server_args(RunConfig(mode="ddtree", budget=64, device="cuda"))
    assert kwargs["speculative_algorithm"] == api.DEFAULT_DDTREE_ALGORITHM
    assert kwargs[api.DEFAULT_DDTREE_BUDGET_ARG] == 64
    assert kwargs["speculative_num_draft_tokens"] == 16 and kwargs["speculative_draft_model_path"] == DRAFTER
    assert kwargs["disable_overlap_schedule"] is True  # registered without overlap support
    real = {k: v for k, v in kwargs.items() if k != api.DEFAULT_DDTREE_BUDGET_ARG}
    assert sg.check_server_args(real) == []


def test_pr29907_ddtree_runs_every_mode_on_triton(register_algorithm, pr29907_budget_field):
    """Where PR #29907's DDTREE is offered, plain and DFlash run on the triton backend it needs above L
    (like with like), and those arguments build a real ServerArgs."""
    from sglang.srt.server_args import ServerArgs

    register_algorithm(api.DEFAULT_DDTREE_ALGORITHM, supports_overlap=False)
    engine = _engine()
    for mode in ("plain", "dflash"):
        kwargs = engine.server_args(RunConfig(mode=mode, device="cuda"))
        assert kwargs["attention_backend"] == api.PR_DDTREE.full_tree_attention_backend == "triton"
        assert sg.check_server_args(kwargs) == []
        assert ServerArgs(**kwargs).attention_backend == "triton"
    assert engine.server_args(RunConfig(mode="ddtree", budget=64, device="cuda"))["attention_backend"] == "triton"
    with pytest.raises(EngineError, match="option attention_backend=flashinfer"):
        _engine(attention_backend="flashinfer").server_args(RunConfig(mode="ddtree", budget=64, device="cuda"))


def test_ddtree_under_configured_names(register_algorithm):
    """A plugin's own algorithm name and an existing budget field, given as engine options (no patching)."""
    from sglang.srt.server_args import ServerArgs

    options = {"ddtree_algorithm": "conformance_tree", "ddtree_budget_arg": "speculative_num_draft_tokens"}
    assert "ddtree" not in _engine(**options).capabilities().modes
    register_algorithm("CONFORMANCE_TREE", supports_overlap=True)
    engine = _engine(**options)
    assert "ddtree" in engine.capabilities().modes
    kwargs = engine.server_args(RunConfig(mode="ddtree", budget=48, device="cuda"))
    assert kwargs["speculative_algorithm"] == "conformance_tree" and kwargs["speculative_num_draft_tokens"] == 48
    assert "disable_overlap_schedule" not in kwargs
    assert sg.check_server_args(kwargs) == []
    assert ServerArgs(**kwargs).speculative_algorithm == "conformance_tree"


class _EntryPoint:
    """An installed plugin as ``importlib.metadata`` would list it (group sglang.srt.plugins)."""

    def __init__(self, name, func):
        self.name, self.value, self.dist, self._func = name, f"conformance_test:{name}", None, func

    def load(self):
        return self._func


def test_ddtree_detected_from_an_entry_point_plugin(monkeypatch, register_algorithm, pr29907_budget_field):
    from sglang.srt import plugins

    calls = []

    def plugin():
        calls.append(1)
        register_algorithm(api.DEFAULT_DDTREE_ALGORITHM, supports_overlap=True)

    def entry_points(group):
        return [_EntryPoint("ddtree", plugin)] if group == api.PLUGINS_GROUP else []

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setattr(plugins, "entry_points", entry_points)
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert api.PLUGINS_GROUP == plugins.GENERAL_PLUGINS_GROUP
    assert not sg.probe_algorithm(api.DEFAULT_DDTREE_ALGORITHM)[0]
    engine = _engine()  # the adapter loads plugins itself, as sgl.Engine does
    assert calls == [1]
    assert "ddtree" in engine.capabilities().modes
    assert "disable_overlap_schedule" not in engine.server_args(RunConfig(mode="ddtree", device="cuda"))


# -- the offline engine, sampling, results -----------------------------------------------------------
def test_engine_api():
    assert sg.check_engine_api() == []
    assert sg.check_engine_api(generate_kwargs=("input_idz",)) == ["Engine.generate has no parameter 'input_idz'"]
    assert sg.check_engine_api(methods=("shutdown_now",)) == ["Engine.shutdown_now is missing"]
    assert sg.check_engine_api(path=api.ENGINE.replace(":Engine", ":Engin"))[0].endswith("no class Engin")
    assert sglang.Engine.class_name == api.ENGINE.partition(":")[2]  # sgl.Engine is a lazy alias of it
    assert sglang.Engine.module_name == api.ENGINE.partition(":")[0]


def test_sampling_keys_and_semantics():
    from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams

    assert sg.check_sampling_keys() == []
    assert sg.check_sampling_keys(("max_tokens",)) == ["SamplingParams has no field 'max_tokens'"]
    greedy = sg.SglangEngine.sampling_params(Request(prompt_ids=[1], max_new_tokens=5, stop_token_ids=[7]))
    assert set(greedy) <= set(api.SAMPLING_KEYS) and "sampling_seed" not in greedy
    p = SamplingParams(**greedy)
    assert p.verify(100) is None
    assert p.max_new_tokens == 5 and p.stop_token_ids == {7} and p.ignore_eos and p.top_k == 1  # T=0: greedy
    sampled = sg.SglangEngine.sampling_params(
        Request(prompt_ids=[1], max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=0, seed=11)
    )
    assert set(sampled) == set(api.SAMPLING_KEYS) and sampled["top_k"] == api.TOP_K_DISABLED
    p = SamplingParams(**sampled)
    assert p.verify(100) is None
    assert p.top_k == TOP_K_ALL and p.sampling_seed == 11 and p.temperature == 0.7 and p.top_p == 0.9
    topk = SamplingParams(
        **sg.SglangEngine.sampling_params(Request(prompt_ids=[1], max_new_tokens=5, temperature=1.0, top_k=5))
    )
    assert topk.top_k == 5


def test_meta_info_keys_are_produced():
    assert sg.check_meta_keys() == []
    (problem,) = sg.check_meta_keys(("spec_verify_count",))
    assert "never produces meta_info key 'spec_verify_count'" in problem


def test_finish_types():
    assert sg.finish_types() == {"stop", "length", "abort"}
    assert sg.check_finish_types() == []
    (problem,) = sg.check_finish_types({"eos": "stop"})
    assert problem.startswith("SGLang never reports finish type 'eos' "), problem
    assert problem.endswith("(it reports: abort, length, stop)"), problem


def _meta(rounds, correct, histogram, reason="length"):
    return {
        api.META_FINISH_REASON: {api.META_FINISH_TYPE: reason},
        api.META_COMPLETION_TOKENS: 9,
        api.META_VERIFY_CT: rounds,
        api.META_CORRECT_DRAFTS: correct,
        api.META_ACCEPT_HISTOGRAM: histogram,
    }


def test_aggregates_from_meta_info():
    # request a: 2 rounds accepting 3 and 0 drafts; request b: 1 round accepting 1; c: no round (no counters)
    metas = [_meta(2, 3, [1, 0, 0, 1]), _meta(1, 1, [0, 1]), {api.META_FINISH_REASON: {"type": "stop"}}]
    per_request = _engine(acceptance_scope="request")._aggregates(metas)
    assert per_request[0]["rounds"] == 2 and per_request[0]["mean_acceptance"] == 2.5
    assert per_request[0]["per_position_acceptance"][:4] == [0.5, 0.5, 0.5, 0.0]
    assert len(per_request[0]["per_position_acceptance"]) == 15  # block 16: depths 1..15, zero-padded
    assert per_request[1]["mean_acceptance"] == 2.0 and per_request[1]["per_position_acceptance"][:2] == [1.0, 0.0]
    assert per_request[2] == {"aggregate_only": True, "rounds": 0}
    pooled = _engine()._aggregates(metas)  # batch scope: 3 rounds, 4 drafts accepted, histogram [1, 1, 0, 1]
    assert [p["rounds"] for p in pooled] == [2, 1, 0]
    assert all(p["mean_acceptance"] == 1 + 4 / 3 for p in pooled)
    assert pooled[0]["per_position_acceptance"][:4] == [2 / 3, 1 / 3, 1 / 3, 0.0]
    assert all(p["aggregate_only"] for p in pooled)


def test_results_and_finish_reasons():
    result = sg.SglangEngine._result({api.OUTPUT_IDS: [5, 6], api.META_INFO: _meta(1, 0, [1], "stop")}, {"rounds": 1})
    assert result.output_ids == [5, 6] and result.finish_reason == "stop" and result.rounds == 1
    assert sg.SglangEngine._result({api.OUTPUT_IDS: [5], api.META_INFO: _meta(1, 0, [1])}, {}).finish_reason == "length"
    aborted = sg.SglangEngine._result({api.OUTPUT_IDS: [], api.META_INFO: _meta(0, 0, [], "abort")}, {})
    assert aborted.finish_reason == "error" and "abort" in aborted.error


# -- this machine ------------------------------------------------------------------------------------
@pytest.mark.skipif(_cuda(), reason="checks the CPU-only behaviour")
def test_capabilities_on_cpu():
    engine = _engine()
    caps = engine.capabilities()
    assert caps.name == "sglang" and caps.version == sglang.__version__
    assert caps.devices == [] and caps.max_tensor_parallel == 1
    assert caps.modes == ["plain", "dflash"] and caps.dtypes == ["float32", "bfloat16", "float16"]
    assert caps.sampling and not caps.traces and not caps.per_round_acceptance
    assert caps.max_context == 1024  # the fixture target's max_position_embeddings
    assert any("SGLang needs CUDA" in note for note in caps.notes)
    for device in ("cuda", "cpu"):
        with pytest.raises(EngineError, match="SGLang needs CUDA|CUDA only"):
            engine.generate([Request(prompt_ids=[1, 2], max_new_tokens=4)], RunConfig(device=device))
    assert engine.generate([], RunConfig(device="cuda")) == []


@pytest.mark.skipif(_cuda(), reason="checks the CPU-only behaviour")
def test_isolated_engine_on_cpu():
    """Through the suite's child process: capabilities come back, generate fails each request with the reason."""
    from ddtree_conformance.adapters.process import IsolatedEngine

    engine = IsolatedEngine("sglang", TARGET, DRAFTER, torch_threads=1)
    try:
        caps = engine.capabilities()
        assert caps.name == "sglang" and caps.devices == [] and "dflash" in caps.modes
        results = engine.generate(
            [Request(prompt_ids=[1, 2], max_new_tokens=4)] * 2, RunConfig(mode="dflash", device="cuda")
        )
        assert [r.finish_reason for r in results] == ["error", "error"]
        assert "SGLang needs CUDA" in results[0].error
    finally:
        engine.close()


def test_no_drafter_plain_only():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = sg.SglangEngine(TARGET)
    caps = engine.capabilities()
    assert caps.modes == ["plain"] and "no drafter given: plain only" in caps.notes
    with pytest.raises(EngineError, match="mode dflash needs a drafter"):
        engine.server_args(RunConfig(mode="dflash", device="cuda"))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"no_such_option": 1}, "unknown option.*no_such_option"),
        ({"acceptance_scope": "round"}, "option acceptance_scope must be 'batch' or 'request'"),
        ({"seed": "abc"}, "option seed must be int"),
        ({"context_length": 0}, "option context_length must be >= 1"),
        ({"mem_fraction_static": 1.5}, r"option mem_fraction_static must be in \[0.0, 1.0\]"),
        ({"max_running_requests": "x"}, "option max_running_requests must be int"),
        ({"deterministic": "maybe"}, "option deterministic must be true or false"),
        ({"cuda_graph": "2"}, "option cuda_graph must be true or false"),
        ({"attention_backend": "no_such_backend"}, "ServerArgs.attention_backend = 'no_such_backend' is not one of"),
        ({"ddtree_algorithm": " "}, "option ddtree_algorithm is empty"),
        ({"ddtree_budget_arg": ""}, "option ddtree_budget_arg is empty"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(EngineError, match=message):
        _engine(**options)


def test_string_options_parse():
    engine = _engine(
        seed="5", deterministic="true", cuda_graph="false", mem_fraction_static="0.4", acceptance_scope="request"
    )
    kwargs = engine.server_args(RunConfig(device="cuda"))
    assert kwargs["random_seed"] == 5 and kwargs["enable_deterministic_inference"] is True
    assert kwargs["disable_cuda_graph"] is True and kwargs["mem_fraction_static"] == 0.4
    assert sg.check_server_args(kwargs) == []


def test_registry_finds_the_adapter():
    from ddtree_conformance.adapters.registry import load_engine_class

    assert load_engine_class("sglang") is sg.SglangEngine


# -- processes ---------------------------------------------------------------------------------------
def _daemon_child(queue, allow):
    """Runs as a daemon (like IsolatedEngine's child) and starts a process, as sgl.Engine does."""
    if allow:
        sg.allow_children()
    try:
        proc = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
        proc.start()
        proc.join(120)
        queue.put(f"grandchild exit code {proc.exitcode}")
    except (AssertionError, OSError, RuntimeError) as exc:  # reported to the test
        queue.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.parametrize("allow", [True, False], ids=["allow_children", "without"])
def test_daemon_child_may_start_processes(allow):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_daemon_child, args=(queue, allow), daemon=True)
    proc.start()
    try:
        answer = queue.get(timeout=240)
    finally:
        proc.join(30)
    if allow:
        assert answer == "grandchild exit code 0"
    else:  # what sgl.Engine would hit inside IsolatedEngine's child without allow_children
        assert "daemonic processes are not allowed to have children" in answer
