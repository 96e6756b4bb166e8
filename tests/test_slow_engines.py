"""Performance mutants: same outputs as the reference engine, extra time where and as much as stated.

No timed assertions: the clock they read is replaced, and their busy-wait is recorded instead of run.
"""

from __future__ import annotations

import itertools

import pytest

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.testing import slow_engines
from ddtree_conformance.testing.slow_engines import SlowBuild, SlowVerify, SlowVerify10, share_loaded

REQUESTS = [Request(prompt_ids=[3, 5, 7, 11], max_new_tokens=10), Request(prompt_ids=[2, 4], max_new_tokens=8)]
CONFIGS = [RunConfig(mode="plain"), RunConfig(mode="dflash"), RunConfig(mode="ddtree", budget=8)]


@pytest.fixture(scope="module")
def reference(random_pair):
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    engine = ReferenceEngine(*map(str, random_pair))
    outputs = {c.mode: engine.generate(REQUESTS, c) for c in CONFIGS}
    yield engine, outputs
    engine.close()


def spying(engine):
    spins: list[float] = []
    engine.spin = spins.append
    return spins


def test_slow_verify_adds_its_fraction_of_every_verify(reference, monkeypatch):
    base, outputs = reference
    ticks = itertools.count()
    monkeypatch.setattr(slow_engines.time, "perf_counter", lambda: float(next(ticks)))  # every verify "takes" 1 s
    engine = share_loaded(base, SlowVerify)
    spins = spying(engine)
    plain = engine.generate(REQUESTS, CONFIGS[0])
    assert [r.output_ids for r in plain] == [r.output_ids for r in outputs["plain"]]
    assert spins == []  # plain decoding untouched
    for config in CONFIGS[1:]:
        spins.clear()
        results = engine.generate(REQUESTS, config)
        assert [r.output_ids for r in results] == [r.output_ids for r in outputs[config.mode]]
        assert spins == [pytest.approx(0.05)] * sum(r.rounds for r in results)  # one per verify, 5 % of 1 s
    assert engine.injected_s == pytest.approx(0.05 * sum(r.rounds for m in ("dflash", "ddtree") for r in outputs[m]))
    ten = share_loaded(base, SlowVerify10)
    ten_spins = spying(ten)
    ten.generate(REQUESTS[:1], CONFIGS[2])
    assert ten.verify_slowdown == 0.10 and ten_spins and all(s == pytest.approx(0.10) for s in ten_spins)


def test_slow_build_adds_two_ms_per_tree_build(reference):
    base, outputs = reference
    engine = share_loaded(base, SlowBuild)
    spins = spying(engine)
    assert [r.output_ids for r in engine.generate(REQUESTS, CONFIGS[1])] == [r.output_ids for r in outputs["dflash"]]
    assert spins == []  # chains are not built by the tree builder
    results = engine.generate(REQUESTS, CONFIGS[2])
    assert [r.output_ids for r in results] == [r.output_ids for r in outputs["ddtree"]]
    assert spins == [0.002] * sum(r.rounds for r in results)


def test_shared_engines_reuse_the_loaded_models(reference):
    base, _ = reference
    hooks = sum(len(layer._forward_hooks) for pair in base._loaded.values() for layer in pair.target.model.layers)
    engine = share_loaded(base, SlowVerify)
    engine.generate(REQUESTS[:1], CONFIGS[2])
    assert engine._loaded == base._loaded  # nothing loaded again
    assert (
        sum(len(layer._forward_hooks) for pair in base._loaded.values() for layer in pair.target.model.layers) == hooks
    )


@pytest.mark.parametrize("cls, option", [(SlowVerify, {"verify_slowdown": -1}), (SlowBuild, {"build_extra_s": 5})])
def test_bad_options_name_the_engine(random_pair, cls, option):
    with pytest.raises(EngineError, match=cls.name):
        cls(*map(str, random_pair), **option)
