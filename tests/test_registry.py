"""Engine registry: built-in names, entry points, module:Class, and the errors for each."""

from __future__ import annotations

import textwrap
from importlib.metadata import EntryPoint

import pytest

import ddtree_conformance.adapters.registry as registry
from ddtree_conformance.adapters.interface import Engine, EngineError
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.pair import PairError
from ddtree_conformance.adapters.registry import (
    BUILTIN_ENGINES,
    ENTRY_POINT_GROUP,
    available_engines,
    create_engine,
    list_engines,
    load_engine_class,
)

FAKE_MODULE = """
from ddtree_conformance.adapters.interface import Capabilities, Engine

class Good(Engine):
    name = "good"
    def capabilities(self):
        return Capabilities(name=self.name, modes=["plain"], dtypes=["float32"], devices=["cpu"],
                            sampling=False, traces=False, per_round_acceptance=False)
    def generate(self, requests, config):
        return []

class Abstract(Engine):
    pass

class NotAnEngine:
    pass
"""


@pytest.fixture(scope="session")
def pair(tmp_path_factory):
    from ddtree_conformance.testing.random_pair import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("registry-pair"))


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    (tmp_path / "ddtc_fake_engines.py").write_text(textwrap.dedent(FAKE_MODULE))
    (tmp_path / "ddtc_broken_engine.py").write_text("raise RuntimeError('no GPU driver found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _fake_entry_points(*specs):
    eps = [EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in specs]

    def entry_points(group=None):
        return [ep for ep in eps if ep.group == group]

    return entry_points


def test_builtins_and_installed_entry_point_are_listed():
    engines = available_engines()
    for name, target in BUILTIN_ENGINES.items():
        assert engines[name] == target
    assert engines["reference"] == f"{ReferenceEngine.__module__}:{ReferenceEngine.__qualname__}"
    # pyproject registers `reference` as an entry point too; it must not appear twice.
    assert [e.name for e in list_engines()].count("reference") == 1


def test_reference_by_name():
    assert load_engine_class("reference") is ReferenceEngine
    assert load_engine_class(" reference ") is ReferenceEngine


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_missing_builtin_adapters_give_clear_error(name):
    # The adapter module or its engine package may be what is missing, depending on the checkout.
    try:
        __import__(name)
        pytest.skip(f"{name} is installed here")
    except ImportError:
        pass
    pattern = rf"^engine '{name}' is not available here: No module named '(adapters\.)?{name}"
    with pytest.raises(EngineError, match=pattern):
        load_engine_class(name)


def test_unknown_name_lists_known_engines():
    with pytest.raises(EngineError) as info:
        load_engine_class("tensorrt")
    message = str(info.value)
    assert "unknown engine 'tensorrt'" in message
    for name in ("reference", "vllm", "sglang"):
        assert name in message
    assert "module:Class" in message


def test_module_class_spec(fake_modules):
    cls = load_engine_class("ddtc_fake_engines:Good")
    assert issubclass(cls, Engine) and cls.name == "good"


def test_module_class_not_an_engine(fake_modules):
    pattern = r"ddtc_fake_engines:NotAnEngine is not a subclass of ddtree_conformance\.adapters\.interface\.Engine"
    with pytest.raises(EngineError, match=pattern):
        load_engine_class("ddtc_fake_engines:NotAnEngine")
    with pytest.raises(EngineError, match="not a subclass"):
        load_engine_class("os:path")


def test_module_class_abstract(fake_modules):
    with pytest.raises(EngineError, match=r"is abstract \(does not implement capabilities, generate\)"):
        load_engine_class("ddtc_fake_engines:Abstract")


@pytest.mark.parametrize(
    "spec, pattern",
    [
        ("ddtc_fake_engines:Missing", r"module ddtc_fake_engines has no attribute 'Missing'"),
        ("ddtc_no_such_module:Engine", r"is not available here: No module named 'ddtc_no_such_module'"),
        ("ddtc_broken_engine:Engine", r"importing ddtc_broken_engine failed with RuntimeError: no GPU driver found"),
        ("ddtc_fake_engines:", r"is not of the form 'module:Class'"),
        (":Good", r"is not of the form 'module:Class'"),
    ],
)
def test_module_class_errors(fake_modules, spec, pattern):
    with pytest.raises(EngineError, match=pattern):
        load_engine_class(spec)


def test_entry_point_engines(fake_modules, monkeypatch):
    monkeypatch.setattr(
        registry,
        "entry_points",
        _fake_entry_points(
            ("good", "ddtc_fake_engines:Good"),
            ("reference", "ddtc_fake_engines:Good"),  # cannot shadow the built-in
            ("broken", "ddtc_broken_engine:Engine"),
        ),
    )
    entries = {e.name: e for e in list_engines()}
    assert entries["good"].source == "entry point" and entries["good"].target == "ddtc_fake_engines:Good"
    assert entries["reference"].source == "built-in"
    assert available_engines()["reference"] == BUILTIN_ENGINES["reference"]
    assert load_engine_class("good").name == "good"
    assert load_engine_class("reference") is ReferenceEngine
    with pytest.raises(EngineError, match="engine 'broken' is not available here"):
        load_engine_class("broken")
    with pytest.raises(EngineError, match="known engines: broken, good, reference, sglang, vllm"):
        load_engine_class("nope")


def test_class_passed_directly(fake_modules):
    assert load_engine_class(ReferenceEngine) is ReferenceEngine
    with pytest.raises(EngineError, match="not a subclass"):
        load_engine_class(dict)


def test_create_engine(pair):
    target, drafter = pair
    with create_engine("reference", target, drafter) as engine:
        assert isinstance(engine, ReferenceEngine)
        assert engine.model_dir == str(target) and engine.drafter_dir == str(drafter)
        assert engine.capabilities().modes == ["plain", "dflash", "ddtree"]
    plain_only = create_engine("reference", target)
    assert plain_only.drafter_dir is None and plain_only.capabilities().modes == ["plain"]
    with pytest.raises(EngineError, match="cuda_graphs must be"):
        create_engine("reference", target, drafter, cuda_graphs="bogus")


def test_create_engine_pair_error_propagates(pair, tmp_path):
    target, _ = pair
    with pytest.raises(PairError, match="target model dir not found"):
        create_engine("reference", tmp_path / "missing", None)


def test_every_engine_refuses_options_it_does_not_declare(pair, fake_modules):
    from ddtree_conformance.adapters.interface import EngineUsageError, UnknownOption
    from ddtree_conformance.adapters.registry import check_options, resolve_engine

    target, drafter = pair
    # the reference engine (it used to ignore a typo silently), before anything is built...
    with pytest.raises(
        UnknownOption,
        match=r"^engine 'reference': unknown option\(s\) bulider; known: "
        r"cuda_graphs, device_tree, fused_layers$",
    ):
        resolve_engine("reference", {"bulider": "vectorized"})
    # ... and when built directly
    with pytest.raises(UnknownOption, match="bulider"):
        ReferenceEngine(str(target), str(drafter), bulider="vectorized")
    assert resolve_engine("reference", {"cuda_graphs": "off"}) is ReferenceEngine
    # an engine that declares no options refuses any (Engine.OPTIONS defaults to none)
    good = load_engine_class("ddtc_fake_engines:Good")
    with pytest.raises(UnknownOption, match=r"engine 'good': unknown option\(s\) x; known: none"):
        check_options(good, {"x": 1}, "good")
    with pytest.raises(UnknownOption):
        good("m", None, x=1)
    assert issubclass(UnknownOption, EngineUsageError) and issubclass(registry.UnknownEngine, EngineUsageError)


def test_reference_refuses_a_budget_above_its_max_before_allocating(pair):
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.engine import MAX_BUDGET

    target, drafter = pair
    engine = ReferenceEngine(str(target), str(drafter))
    assert engine.capabilities().max_budget == MAX_BUDGET
    with pytest.raises(EngineError, match=f"budget {MAX_BUDGET + 1} is above the largest it accepts"):
        engine.generate([Request(prompt_ids=[1], max_new_tokens=2)], RunConfig(mode="ddtree", budget=MAX_BUDGET + 1))


def test_module_class_resolves_from_the_working_directory_as_python_m_does(tmp_path, monkeypatch):
    """`--engine my_engine:MyEngine` from the folder holding my_engine.py, with nothing on sys.path for it
    (it used to fail: "No module named 'my_engine'", exit 5; only PYTHONPATH=. helped)."""
    import sys

    (tmp_path / "ddtc_here_engine.py").write_text(
        textwrap.dedent("""
        from ddtree_conformance.adapters.reference.engine import ReferenceEngine

        class Mine(ReferenceEngine):
            name = "mine"
    """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "ddtc_here_engine", raising=False)
    assert load_engine_class("ddtc_here_engine:Mine").name == "mine"
    assert sys.path[0] == str(tmp_path)  # kept for an isolated engine's child
    with pytest.raises(EngineError, match="No module named 'ddtc_nowhere'"):
        load_engine_class("ddtc_nowhere:Mine")  # not in the working directory either: the same clear error
