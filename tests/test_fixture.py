"""The bundled fixture pair: the build script works end to end, and the committed pair is sound."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
FIXTURE = GOLDEN / "fixture"
PROMPTS = GOLDEN / "prompts" / "fixture.jsonl"


def _build_module():
    name = "ddtree_fixture_build_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "build_fixture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _check_pair_loads(fixture: Path, prompt_ids: list[int]) -> None:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.dflash import load_drafter
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    target_dir, drafter_dir = fixture / "target", fixture / "drafter"
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(str(target_dir))
    config = json.loads((target_dir / "config.json").read_text())
    drafter_config = json.loads((drafter_dir / "config.json").read_text())
    mask_id = drafter_config["dflash_config"]["mask_token_id"]

    assert tok.token_to_id("<|MASK|>") == mask_id
    assert hf_tok.convert_tokens_to_ids("<|endoftext|>") == config["eos_token_id"] == tok.token_to_id("<|endoftext|>")
    assert hf_tok.eos_token_id == config["eos_token_id"]
    assert tok.get_vocab_size() == config["vocab_size"]
    assert config["head_dim"] >= 32 and config["head_dim"] in (32, 64, 80, 96, 112, 128)
    assert drafter_config["architectures"] == ["DFlashDraftModel"]
    assert drafter_config["block_size"] == 16
    assert drafter_config["hidden_size"] == config["hidden_size"]
    assert 1 <= drafter_config["num_hidden_layers"] <= 2
    layer_ids = drafter_config["dflash_config"]["target_layer_ids"]
    assert config["num_hidden_layers"] - 1 not in layer_ids
    assert all(0 <= i < config["num_hidden_layers"] - 1 for i in layer_ids)

    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    assert type(target).__name__ == "Qwen3ForCausalLM"
    drafter = load_drafter(drafter_dir)
    assert drafter.config.mask_token_id == mask_id

    engine = ReferenceEngine(str(target_dir), str(drafter_dir))
    request = Request(prompt_ids=prompt_ids, max_new_tokens=12)
    plain = engine.generate([request], RunConfig(mode="plain"))[0]
    dflash = engine.generate([request], RunConfig(mode="dflash", trace=True))[0]
    assert dflash.error is None and plain.error is None
    assert len(dflash.output_ids) == 12
    assert dflash.output_ids == plain.output_ids  # T=0, fp32: lossless
    assert dflash.traces and all(1 <= n <= 16 for n in dflash.acceptance_lengths)


def test_build_script_quick_slice(tmp_path):
    """A few steps on a small slice rebuild every artifact, and they load."""
    build = _build_module()
    t0 = time.time()
    manifest = build.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--seed", "7"])
    elapsed = time.time() - t0
    fixture = tmp_path / "fixture"
    target_files = (
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    )
    for name in target_files:
        assert (fixture / "target" / name).is_file(), name
    for name in ("config.json", "model.safetensors"):
        assert (fixture / "drafter" / name).is_file(), name
    on_disk = json.loads((fixture / "MANIFEST.json").read_text())
    assert on_disk["seed"] == 7 and on_disk["quick"] is True
    assert (
        on_disk["files"]["drafter/model.safetensors"]["sha256"]
        == hashlib.sha256((fixture / "drafter" / "model.safetensors").read_bytes()).hexdigest()
    )
    assert manifest["target"]["steps"] == on_disk["target"]["steps"]
    prompts = [json.loads(line) for line in (tmp_path / "prompts" / "fixture.jsonl").read_text().splitlines()]
    assert len({p["category"] for p in prompts}) >= 3
    _check_pair_loads(fixture, prompts[0]["prompt_ids"])
    assert elapsed < 60, f"quick build took {elapsed:.1f} s"


def test_quick_corpus_is_deterministic_and_prompts_held_out():
    build = _build_module()
    a, b = build.make_corpus(11, 5), build.make_corpus(11, 5)
    assert a == b and a != build.make_corpus(12, 5)
    assert {cat for cat, _ in a} == set(build.CATEGORIES)


@pytest.fixture(scope="module")
def golden_prompts() -> list[dict]:
    assert PROMPTS.is_file(), f"missing {PROMPTS}"
    return [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]


def test_golden_manifest_matches_files():
    manifest = json.loads((FIXTURE / "MANIFEST.json").read_text())
    assert manifest["files"], "MANIFEST lists no files"
    for rel, entry in manifest["files"].items():
        path = FIXTURE / rel
        assert path.is_file(), rel
        assert path.stat().st_size == entry["bytes"], rel
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], rel
    total = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    assert total <= 20 * 1024 * 1024, f"golden/ is {total / 1e6:.1f} MB"
    assert manifest["quick"] is False


def test_golden_pair_loads(golden_prompts):
    _check_pair_loads(FIXTURE, golden_prompts[0]["prompt_ids"])


def test_golden_prompts_shape_and_tokens(golden_prompts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(FIXTURE / "target" / "tokenizer.json"))
    counts = Counter(p["category"] for p in golden_prompts)
    assert len(counts) >= 3 and all(n >= 20 for n in counts.values()), counts
    assert len({p["id"] for p in golden_prompts}) == len(golden_prompts)
    assert len({p["text"] for p in golden_prompts}) == len(golden_prompts)
    for p in golden_prompts:
        assert set(p) == {"id", "category", "text", "prompt_ids"}, p["id"]
        assert p["id"].startswith(p["category"] + "-")
        assert tok.encode(p["text"]).ids == p["prompt_ids"], p["id"]
        assert 20 <= len(p["prompt_ids"]) <= 120, p["id"]


def test_golden_pair_is_trained(golden_prompts):
    """A trained pair: varied greedy output and real acceptance on a code prompt (not a random pair)."""
    from ddtree_conformance.adapters.interface import Request, RunConfig
    from ddtree_conformance.adapters.reference.engine import ReferenceEngine

    engine = ReferenceEngine(str(FIXTURE / "target"), str(FIXTURE / "drafter"))
    prompt = next(p for p in golden_prompts if p["category"] == "code")
    result = engine.generate([Request(prompt_ids=prompt["prompt_ids"], max_new_tokens=32)], RunConfig(mode="dflash"))[0]
    assert len(set(result.output_ids)) / len(result.output_ids) >= 0.3
    assert result.tau >= 2.0
