"""The model-pair registry: built-in pairs, resolution (local, HF cache, offline skip), pairs files, prompts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ddtree_conformance import pairs as pairs_mod
from ddtree_conformance.pairs import (
    BUILTIN_PAIRS,
    ModelPair,
    PairSpecError,
    PairUnavailable,
    get_pair,
    load_pairs,
    load_pairs_file,
    resolve_pair,
)
from ddtree_conformance.paths import DATA_DIR, FIXTURE_DRAFTER, FIXTURE_TARGET
from ddtree_conformance.prompts import PromptError, format_prompts, load_prompts
from ddtree_conformance.session import SuiteSession, SuiteSettings

OFFLINE_8B = (
    "pair 'qwen3-8b': Qwen/Qwen3-8B is not in the local Hugging Face cache and the hub is unreachable "
    "(HF_HUB_OFFLINE / no network)"
)


@pytest.fixture
def no_env(monkeypatch):
    for name in ("DDTREE_PAIR", "DDTREE_PAIRS_FILE", "DDTREE_PAIR_DOWNLOAD", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)


def _hub_cache(root: Path, repo_id: str, files: dict[str, str]) -> Path:
    """A Hugging Face cache entry (refs/main -> snapshots/<commit>/files), as huggingface_hub lays it out."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 39 + "1"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


# -- built-in pairs ----------------------------------------------------------------------------
def test_builtin_pairs_hold_the_papers_pairs_and_the_fixture(no_env):
    assert set(BUILTIN_PAIRS) >= {"fixture", "qwen3-8b", "qwen3-4b"}
    for name, size in (("qwen3-8b", "8B"), ("qwen3-4b", "4B")):
        pair = BUILTIN_PAIRS[name]
        assert (pair.target, pair.drafter) == (f"Qwen/Qwen3-{size}", f"z-lab/Qwen3-{size}-DFlash-b16")
        assert (pair.block_size, pair.dtype, pair.prompt_format) == (16, "bfloat16", "chat")
        assert "z-lab/dflash" in pair.source
    assert get_pair().name == "fixture"  # the default


def test_fixture_resolves_to_the_bundled_dirs(no_env):
    resolved = resolve_pair("fixture")
    assert resolved.target_dir == FIXTURE_TARGET and resolved.drafter_dir == FIXTURE_DRAFTER
    settings = SuiteSettings(**resolved.suite_settings(device="cpu"))
    assert (settings.pair_name, settings.prompt_set, settings.prompt_format, settings.dtype) == (
        "fixture",
        "fixture",
        "ids",
        "float32",
    )
    assert settings.model_dir == str(FIXTURE_TARGET)


def test_env_names_the_pair(no_env, monkeypatch):
    monkeypatch.setenv("DDTREE_PAIR", "qwen3-4b")
    assert get_pair().name == "qwen3-4b"
    assert get_pair("qwen3-8b").name == "qwen3-8b"  # an explicit name wins


def test_unknown_pair_is_one_error_listing_the_known(no_env):
    with pytest.raises(PairSpecError, match=r"unknown pair 'qwen9'; known pairs: fixture, qwen3-4b, qwen3-8b"):
        get_pair("qwen9")


# -- hub resolution ----------------------------------------------------------------------------
def test_hub_pair_offline_without_cache_gives_one_skip_reason(no_env, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PairUnavailable) as info:
        resolve_pair("qwen3-8b", cache_dir=tmp_path)
    assert str(info.value) == OFFLINE_8B


def test_hub_pair_unreachable_hub_gives_the_same_reason(no_env, monkeypatch, tmp_path):
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        raise LocalEntryNotFoundError("cannot reach the hub")  # what huggingface_hub raises offline

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    with pytest.raises(PairUnavailable) as info:
        resolve_pair("qwen3-8b", cache_dir=tmp_path)
    assert str(info.value) == OFFLINE_8B
    assert calls == [True, False]  # the cache first, then the hub


def test_hub_pair_downloads_off(no_env, monkeypatch, tmp_path):
    monkeypatch.setenv("DDTREE_PAIR_DOWNLOAD", "0")
    with pytest.raises(PairUnavailable, match=r"not in the local Hugging Face cache and downloads are off"):
        resolve_pair("qwen3-4b", cache_dir=tmp_path)


def test_hub_pair_from_the_cache(no_env, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = _hub_cache(tmp_path, "Qwen/Qwen3-8B", {"config.json": "{}", "tokenizer.json": "{}"})
    drafter = _hub_cache(tmp_path, "z-lab/Qwen3-8B-DFlash-b16", {"config.json": json.dumps({"block_size": 16})})
    resolved = resolve_pair("qwen3-8b", cache_dir=tmp_path)
    assert (resolved.target_dir, resolved.drafter_dir) == (target, drafter)
    settings = resolved.suite_settings()
    assert settings["model_dir"] == str(target) and settings["dtype"] == "bfloat16"
    assert settings["prompt_format"] == "chat" and settings["limit"] == 20


def test_cached_drafter_with_another_block_size_is_an_error(no_env, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(tmp_path, "Qwen/Qwen3-4B", {"config.json": "{}"})
    _hub_cache(tmp_path, "z-lab/Qwen3-4B-DFlash-b16", {"config.json": json.dumps({"block_size": 8})})
    with pytest.raises(
        PairSpecError,
        match=r"pair 'qwen3-4b': field 'block_size': 16, but the drafter's .* says "
        r"block_size 8",
    ):
        resolve_pair("qwen3-4b", cache_dir=tmp_path)


def test_an_existing_local_dir_wins_over_the_hub(no_env, tmp_path):
    pair = ModelPair(
        name="local", target=str(FIXTURE_TARGET), drafter="fixture/drafter", block_size=16, dtype="float32"
    ).with_base_dir(DATA_DIR)
    resolved = resolve_pair(pair)
    assert resolved.target_dir == FIXTURE_TARGET and resolved.drafter_dir == DATA_DIR / "fixture/drafter"
    missing = ModelPair(name="gone", target=str(tmp_path / "nothing"), drafter=None, block_size=16, dtype="float32")
    with pytest.raises(PairUnavailable, match=r"pair 'gone': target .*nothing does not exist"):
        resolve_pair(missing)


# -- pairs files -------------------------------------------------------------------------------
def test_pairs_file_json_and_toml_add_and_replace_pairs(no_env, tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    shutil.copytree(FIXTURE_TARGET, tmp_path / "models" / "t")
    json_file = tmp_path / "pairs.json"
    json_file.write_text(
        json.dumps(
            {
                "pairs": {
                    "mine": {
                        "target": "models/t",
                        "drafter": None,
                        "block_size": 16,
                        "dtype": "bfloat16",
                        "max_new_tokens": 8,
                    }
                }
            }
        )
    )
    toml_file = tmp_path / "pairs.toml"
    toml_file.write_text(
        '[pairs.qwen3-8b]\ntarget = "/models/Qwen3-8B"\ndrafter = "/models/d"\nblock_size = 16\n'
        'dtype = "bfloat16"\nprompt_format = "chat"\ntensor_parallel_size = 2\n'
    )
    mine = load_pairs_file(json_file)["mine"]
    resolved = resolve_pair(mine)
    assert resolved.target_dir == tmp_path / "models" / "t"  # relative to the file's directory
    assert load_pairs_file(toml_file)["qwen3-8b"].tensor_parallel_size == 2
    monkeypatch.setenv("DDTREE_PAIRS_FILE", str(toml_file))
    assert load_pairs()["qwen3-8b"].target == "/models/Qwen3-8B"  # a file pair replaces the built-in
    assert get_pair("fixture").name == "fixture"


BAD_FILES = [
    (
        "bad.json",
        '{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": "x", "dtype": "bfloat16"}}}',
        r"pair 'p': field 'block_size': Input should be a valid integer",
    ),
    (
        "bad.json",
        '{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": 16, "dtype": "fp8"}}}',
        r"pair 'p': field 'dtype': Input should be 'float32', 'bfloat16' or 'float16'",
    ),
    (
        "bad.json",
        '{"pairs": {"p": {"drafter": "d", "block_size": 16, "dtype": "float32"}}}',
        r"pair 'p': field 'target': Field required",
    ),
    (
        "bad.json",
        '{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": 16, "dtype": "float32", "blocksize": 16}}}',
        r"pair 'p': field 'blocksize': unknown field \(known fields: target, drafter",
    ),
    (
        "bad.json",
        '{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": 16, "dtype": "float32", '
        '"prompt_format": "jinja"}}}',
        r"pair 'p': field 'prompt_format': Input should be 'ids', 'text' or",
    ),
    (
        "bad.json",
        '{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": 16, "dtype": "float32", '
        '"tensor_parallel_size": 0}}}',
        r"pair 'p': field 'tensor_parallel_size': Input should be greater",
    ),
    (
        "bad.json",
        '{"pairs": {"bad name": {"target": "t", "drafter": "d", "block_size": 16, "dtype": "float32"}}}',
        r"pair 'bad name': field 'name': Value error, 'bad name' is not a pair name",
    ),
    ("bad.json", '{"pairs": {"p": ["t", "d"]}}', r"pair 'p': expected a table of fields, got list"),
    ("bad.json", '{"pair": {}}', r"unknown top-level key 'pair' \(expected only 'pairs'\)"),
    ("bad.json", '{"pairs": {}}', r"field 'pairs': expected a non-empty table"),
    ("bad.json", '{"pairs": {"p": {"target": "t",}}}', r"not valid JSON \(line 1"),
    ("bad.toml", "[pairs.p]\ntarget = \n", r"not valid TOML"),
    ("bad.yaml", "pairs: {}", r"unknown format '.yaml'; use .json or .toml"),
]


@pytest.mark.parametrize("name,text,message", BAD_FILES, ids=[m[:40] for _, _, m in BAD_FILES])
def test_bad_pairs_file_is_one_error_naming_file_and_field(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PairSpecError) as info:
        load_pairs_file(path)
    assert str(info.value).startswith(f"pairs file {path}: ")
    assert "\n" not in str(info.value)
    import re

    assert re.search(message, str(info.value)), str(info.value)


def test_missing_pairs_file(tmp_path):
    with pytest.raises(PairSpecError, match=r"pairs file .*nope.json: no such file"):
        load_pairs_file(tmp_path / "nope.json")


def _pytest_inprocess(capsys, *args) -> tuple[int, str, str]:
    """``pytest args`` in this process (a subprocess would pay the torch import again)."""
    code = pytest.main(["-p", "no:cacheprovider", *args])
    out, err = capsys.readouterr()
    return int(code), out, err


def test_pytest_with_a_bad_pairs_file_stops_with_one_error(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "pairs.json"
    bad.write_text('{"pairs": {"p": {"target": "t", "drafter": "d", "block_size": -1, "dtype": "float32"}}}')
    monkeypatch.setenv("DDTREE_PAIRS_FILE", str(bad))
    code, out, err = _pytest_inprocess(capsys, "--ddtree-engine", "reference", "--co", "-q", str(tmp_path))
    assert code == pytest.ExitCode.USAGE_ERROR, out + err
    (line,) = [line for line in err.splitlines() if line.startswith("ERROR: ")]  # one error, the file named
    assert line.startswith(f"ERROR: ddtree-conformance: pairs file {bad}: pair 'p': "), line
    assert "field 'block_size': " in line and line.endswith("greater than or equal to 2"), line  # the bound: 2
    assert "Traceback" not in out + err


def test_engine_suite_on_an_unreachable_hub_pair_is_skipped_with_the_reason(tmp_path, monkeypatch, capsys, no_env):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))  # an empty cache
    code, out, err = _pytest_inprocess(
        capsys,
        "--ddtree-engine",
        "reference",
        "--ddtree-pair",
        "qwen3-8b",
        "--ddtree-check",
        "lossless",
        "-q",
        "-rs",
        "--ddtree-no-isolate",
        "--ddtree-report",
        str(tmp_path / "check.json"),  # never the user's reports/ (issue 31)
        "-p",
        "no:randomly",
    )
    assert code == pytest.ExitCode.OK, out + err
    assert OFFLINE_8B in out
    assert "4 skipped" in out  # lossless/dflash, /ddtree-B16, /ddtree-B64, /ddtree-B256


# -- prompts for a pair ------------------------------------------------------------------------
def test_text_format_reencodes_with_the_target_tokenizer():
    prompts = load_prompts("fixture", tokenizer_dir=FIXTURE_TARGET)[:6]
    assert [p.prompt_ids for p in format_prompts(prompts, FIXTURE_TARGET, "text")] == [p.prompt_ids for p in prompts]
    assert format_prompts(prompts, FIXTURE_TARGET, "ids") is prompts


def test_chat_format_applies_the_chat_template_without_thinking(tmp_path):
    tokenizer_dir = tmp_path / "tok"
    shutil.copytree(FIXTURE_TARGET, tokenizer_dir, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}U: {{ m['content'] }}\n{% endfor %}"
        "{% if enable_thinking is defined and not enable_thinking %}[no-think]{% endif %}A:"
    )
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    prompts = load_prompts("fixture", tokenizer_dir=FIXTURE_TARGET)[:2]
    chat = format_prompts(prompts, tokenizer_dir, "chat")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    assert tok.decode(chat[0].prompt_ids) == tok.decode(tok.encode(f"U: {prompts[0].text}\n[no-think]A:").ids)
    with pytest.raises(PromptError, match="has no chat template"):
        format_prompts(prompts, FIXTURE_TARGET, "chat")


def test_session_applies_the_pairs_prompt_format():
    settings = SuiteSettings(prompt_format="text", limit=3)
    session = SuiteSession(settings)
    try:
        assert [p.prompt_ids for p in session.inputs.bundled] == [
            p.prompt_ids for p in load_prompts("fixture", tokenizer_dir=FIXTURE_TARGET)[:3]
        ]
    finally:
        session.close()


def test_pairs_module_cites_the_z_lab_sources():
    doc = pairs_mod.__doc__
    assert "z-lab/dflash" in doc and "README.md" in doc and "dflash/benchmark.py" in doc
