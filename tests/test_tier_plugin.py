"""The engine tiers' pytest plugin (:mod:`ddtree_conformance.testing.tiers`), without any engine.

* summaries are written by the terminal-summary hook when the run ends, whatever the test order,
  merged when two tiers share a file, and not at all when their variable is unset;
* shared engines are created once per (engine, pair, options, threads, timeout, isolation), sessions
  only borrow them, and the fixture's teardown closes each once.
"""

from __future__ import annotations

import json

from ddtree_conformance.adapters.interface import Capabilities, Engine
from ddtree_conformance.session import SuiteSession, SuiteSettings
from ddtree_conformance.testing import tiers

pytest_plugins = ["pytester"]

TIER_MODULE = """
import pytest
from ddtree_conformance.testing.tiers import TierSummary

pytest_plugins = ["ddtree_conformance.testing.tiers"]
SUMMARY = TierSummary("DDTREE_TEST_SUMMARY", key={key!r})


@pytest.mark.parametrize("n", [3, 1, 2])
def test_measures(n):
    SUMMARY[f"n{{n}}"] = n * 10
"""


def test_summaries_written_at_the_end_in_any_order(pytester, monkeypatch, tmp_path):
    out = tmp_path / "summary.json"
    monkeypatch.setenv("DDTREE_TEST_SUMMARY", str(out))
    pytester.makepyfile(test_a=TIER_MODULE.format(key=None), test_b=TIER_MODULE.format(key="plugin"))
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider", "test_b.py", "test_a.py")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines([f"tier summary: {out}"])
    assert json.loads(out.read_text()) == {"n3": 30, "n1": 10, "n2": 20, "plugin": {"n3": 30, "n1": 10, "n2": 20}}


def test_no_file_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("DDTREE_TEST_SUMMARY_UNSET", raising=False)
    summary = tiers.TierSummary("DDTREE_TEST_SUMMARY_UNSET")
    summary["x"] = 1
    assert tiers.write_summaries([summary]) == []


class _Counting(Engine):
    OPTIONS = ("x",)
    closed = 0

    def capabilities(self) -> Capabilities:
        return Capabilities(
            name="counting",
            version="0",
            modes=["plain"],
            dtypes=["float32"],
            devices=["cpu"],
            sampling=False,
            traces=False,
            per_round_acceptance=False,
        )

    def generate(self, requests, config):
        return []

    def close(self) -> None:
        type(self).closed += 1


def test_shared_engines_are_borrowed(monkeypatch, random_pair):
    target, drafter = map(str, random_pair)
    created = []

    def create(settings, model_dir, drafter_dir):
        created.append((model_dir, drafter_dir))
        return _Counting(model_dir, drafter_dir, **settings.engine_options)

    monkeypatch.setattr(tiers.SharedEngines, "_create", staticmethod(create))
    shared = tiers.SharedEngines()
    base = dict(engine="reference", model_dir=target, drafter_dir=drafter, isolate=True)
    for dtype in ("float32", "bfloat16", "float32"):  # sessions differing in run settings share the engine
        settings = SuiteSettings(**base, dtype=dtype)
        session = SuiteSession(settings, engine_factory=shared.factory(settings))
        assert session.capabilities.name == "counting"
        session.close()
    assert created == [(target, drafter)] and _Counting.closed == 0
    other = SuiteSettings(**base, engine_options={"x": 1})  # other engine options: another engine (its handle
    # must not re-check the options against the handle's own class)
    SuiteSession(other, engine_factory=shared.factory(other)).engine.capabilities()
    assert len(created) == 2 and len(shared) == 2
    shared.close()
    assert _Counting.closed == 2 and len(shared) == 0
