"""The SGLang GPU tier: real SGLang against the reference on the fixture pair (CUDA, all bundled prompts).

Runs through the suite itself (``SuiteSession`` + ``plan``/``run_plan``, engine ``sglang``
isolated in a child process, device ``cuda``). What is checked:

(a) capabilities on CUDA: device ``cuda``, DFLASH offered, aggregate-only acceptance;
(b) fp32: SGLang DFLASH greedy output equals SGLang plain on every prompt (the suite's lossless
    check, exact) and its tau is within 2 % of the reference's, per-position acceptance within 2
    points (the acceptance check, aggregate path, reference side from the golden traces);
(c) bf16: DFLASH equals plain up to a near-tie first divergence (the lossless check's bf16 rule);
(d) DDTree at B = 16 and 64, lossless and acceptance in fp32, where the installed SGLang offers it
    (PR #29907 or a plugin; see adapters/sglang/engine.py); skipped with the capabilities note
    otherwise.

SGLang runs on CUDA only: on a machine without a CUDA GPU every test skips with "SGLang needs a CUDA
GPU; this machine has none". Run: ``python -m pytest -m sglang tests/test_sglang_tier.py`` (tox -e
sglang, .ci/sglang-tier). Extra engine options as JSON in ``SGLANG_TIER_OPTIONS`` (for example
``{"attention_backend": "triton"}``); ``SGLANG_TIER_SUMMARY=<file>`` writes the measured numbers (when
the run ends, by the terminal-summary hook of :mod:`ddtree_conformance.testing.tiers`).
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

NO_GPU = "SGLang needs a CUDA GPU; this machine has none"
HAVE_CUDA = torch.cuda.is_available()

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason=NO_GPU)]
pytest_plugins = ["ddtree_conformance.testing.tiers"]

if HAVE_CUDA:
    pytest.importorskip("sglang", reason="SGLang is not installed here (bash .ci/sglang-tier or tox -e sglang)")

from ddtree_conformance.metrics import mean_tau  # noqa: E402
from ddtree_conformance.session import SuiteSession, SuiteSettings  # noqa: E402
from ddtree_conformance.testing.tiers import TierSummary, fixture_golden, run_checks  # noqa: E402

MAX_NEW_TOKENS = 64
BUDGETS = [16, 64]
SUMMARY = TierSummary("SGLANG_TIER_SUMMARY")


def _options() -> dict:
    raw = os.environ.get("SGLANG_TIER_OPTIONS", "").strip()
    return json.loads(raw) if raw else {}


def _settings(**overrides) -> SuiteSettings:
    base = {
        "engine": "sglang",
        "device": "cuda",
        "modes": ["dflash"],
        "budgets": BUDGETS,
        "dtype": "float32",
        "max_new_tokens": MAX_NEW_TOKENS,
        "isolate": True,
        "timeout_s": 900.0,
        "pair_name": "fixture",
        "prompt_set": "fixture",
        "engine_options": _options(),
    }
    base.update(overrides)
    return SuiteSettings(**base)


_run = run_checks


@pytest.fixture(scope="module")
def golden():
    return fixture_golden(_settings(), MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
def fp32():
    session = SuiteSession(_settings(modes=["dflash", "ddtree"]))
    try:
        start = time.time()
        plain = session.plain()
        out = {"session": session, "plain": plain, "plain_s": time.time() - start}
        out.update(_run(session, ["lossless/dflash", "acceptance/dflash"]))
        out["dflash"] = session.run("dflash")
        yield out
    finally:
        session.close()


@pytest.fixture(scope="module")
def bf16():
    session = SuiteSession(_settings(dtype="bfloat16"))
    try:
        yield _run(session, ["lossless/dflash"])
    finally:
        session.close()


def test_capabilities_on_cuda(fp32):
    caps = fp32["session"].capabilities
    SUMMARY["capabilities"] = caps.model_dump()
    assert caps.name == "sglang" and caps.version
    assert "cuda" in caps.devices and "dflash" in caps.modes
    assert caps.max_tensor_parallel == torch.cuda.device_count()
    assert not caps.traces and not caps.per_round_acceptance
    assert caps.cuda_graphs  # RunConfig.cuda_graphs switches disable_cuda_graph per run


def test_plain_runs_every_prompt(fp32, golden):
    prompts, plain = fp32["session"].prompts, fp32["plain"]
    assert len(prompts) == 80 == len(plain)
    errors = [r.error for r in plain if r.error]
    assert not errors, errors[0]
    expected = [golden.records[p.id].output_ids[:MAX_NEW_TOKENS] for p in prompts]
    SUMMARY["plain_equals_reference_golden"] = sum(r.output_ids == e for r, e in zip(plain, expected))
    SUMMARY["plain_seconds"] = fp32["plain_s"]
    assert all(0 < len(r.output_ids) <= MAX_NEW_TOKENS for r in plain)


def test_dflash_lossless_fp32(fp32):
    result = fp32["results"]["lossless/dflash"]
    SUMMARY["lossless_fp32"] = result.message
    assert result.status == "pass", result.message


def test_dflash_acceptance_fp32(fp32, golden):
    result = fp32["results"]["acceptance/dflash"]
    dflash = fp32["dflash"]
    assert all(r.aggregate_only and r.rounds and r.mean_acceptance for r in dflash)
    reference = [golden.records[p.id].acceptance["dflash"] for p in fp32["session"].prompts]
    SUMMARY["acceptance_fp32"] = {
        "check": result.message,
        "tau": dflash[0].mean_acceptance,
        "reference_tau": mean_tau(reference),
        "seconds": fp32["seconds"],
    }
    assert result.status == "pass", result.message


def test_dflash_lossless_bf16(bf16):
    result = bf16["results"]["lossless/dflash"]
    SUMMARY["lossless_bf16"] = result.message
    assert result.status == "pass", result.message


@pytest.mark.parametrize("budget", BUDGETS)
def test_ddtree_fp32(fp32, budget):
    session = fp32["session"]
    caps = session.capabilities
    if "ddtree" not in caps.modes:
        pytest.skip(next((n for n in caps.notes if "ddtree" in n), "this SGLang offers no DDTree"))
    out = _run(session, [f"lossless/ddtree-B{budget}", f"acceptance/ddtree-B{budget}"])
    SUMMARY[f"ddtree_B{budget}"] = {k: r.status + ": " + r.message for k, r in out["results"].items()}
    assert len(out["results"]) == 2
    for check_id, result in out["results"].items():
        assert result.status == "pass", f"{check_id}: {result.message}"
