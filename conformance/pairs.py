"""Named model pairs: a target, its DFlash drafter and how to run them (the GPU tier's ``--pair``).

A pair names the target and the drafter (each a local directory or a Hugging Face hub id), the
drafter's block size, the dtype the pair is meant to run in, the prompt set and how its prompts
become token ids, the tensor-parallel size and the generation length. Built in:

* ``fixture``: the bundled tiny Qwen3 target + trained DFlash drafter (``golden/fixture``), the
  bundled ``fixture`` prompts with their own token ids, float32 (its golden files' dtype).
* ``qwen3-8b`` / ``qwen3-4b``: ``Qwen/Qwen3-8B`` + ``z-lab/Qwen3-8B-DFlash-b16`` and
  ``Qwen/Qwen3-4B`` + ``z-lab/Qwen3-4B-DFlash-b16``, the pairs the DDTree paper used. Facts, from
  z-lab/dflash: README.md ("Supported Models": Qwen3-4B and Qwen3-8B (non-thinking) ->
  z-lab/Qwen3-{4B,8B}-DFlash-b16; the Transformers example loads both with ``dtype="auto"`` and
  prompts through the chat template with ``enable_thinking=False``) and dflash/benchmark.py
  (target and drafter in ``torch.bfloat16``; every prompt goes through
  ``tokenizer.apply_chat_template(..., add_generation_prompt=True, enable_thinking=...)``).
  Block size 16 is the checkpoints' ``-b16`` (their ``config.json`` ``block_size``; resolution
  checks it against the downloaded config).

Prompt formats (``prompt_format``): ``ids`` uses the set's ``prompt_ids`` (text-only lines are
encoded with the target's ``tokenizer.json``, as :func:`ddtree_conformance.prompts.load_prompts` does);
``text`` re-encodes every prompt's ``text`` with the target's ``tokenizer.json``; ``chat`` wraps
the text as one user message and applies the target's chat template with
``enable_thinking=False`` (z-lab's non-thinking b16 drafters were trained and benchmarked so).
The hub pairs reuse the bundled ``fixture`` prompts (plain English chat, code, math and records)
in ``chat`` format: its ``prompt_ids`` belong to the fixture's 3072-token vocabulary, its text
fits any tokenizer.

Resolution (:func:`resolve_pair`) of a hub id: an existing local directory of that name wins;
else the Hugging Face cache (``snapshot_download(local_files_only=True)``); else a download when
the hub is reachable and downloads are allowed (``DDTREE_PAIR_DOWNLOAD=0`` forbids them); else
:class:`PairUnavailable` with one reason, the GPU tier's skip message, e.g.
``pair 'qwen3-8b': Qwen/Qwen3-8B is not in the local Hugging Face cache and the hub is
unreachable (HF_HUB_OFFLINE / no network)``.

More pairs come from a JSON or TOML file (``DDTREE_PAIRS_FILE`` or ``--pairs-file``)::

    {"pairs": {"my-pair": {"target": "/models/t", "drafter": "/models/d", "block_size": 16,
                           "dtype": "bfloat16", "prompts": "fixture", "prompt_format": "chat"}}}

    [pairs.my-pair]
    target = "/models/t"
    ...

A file pair replaces a built-in pair of the same name; relative local paths are relative to the
file's directory. Every problem with the file is one :class:`PairSpecError` naming the file, the
pair and the field.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from ddtree_conformance.adapters.interface import DType

from .option_names import option
from .paths import DATA_DIR

__all__ = [
    "PromptFormat",
    "ModelPair",
    "ResolvedPair",
    "PairSpecError",
    "PairUnavailable",
    "BUILTIN_PAIRS",
    "DEFAULT_PAIR",
    "PAIR_ENV",
    "PAIRS_FILE_ENV",
    "DOWNLOAD_ENV",
    "load_pairs_file",
    "load_pairs",
    "get_pair",
    "resolve_pair",
]

PromptFormat = Literal["ids", "text", "chat"]

DEFAULT_PAIR = "fixture"
PAIR_ENV = "DDTREE_PAIR"
PAIRS_FILE_ENV = "DDTREE_PAIRS_FILE"
DOWNLOAD_ENV = "DDTREE_PAIR_DOWNLOAD"

# What a pair needs from a hub repository: configs, tokenizer files, weights, chat templates.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja", "*.model"]
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class PairSpecError(ValueError):
    """A pair definition or pairs file cannot be used; the message names the file, pair and field."""


class PairUnavailable(RuntimeError):
    """A valid pair whose models are not on this machine; the message is the skip reason."""


class ModelPair(BaseModel):
    """One named target + drafter pair and how the suite runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    target: str = Field(description="target: local directory or Hugging Face hub id")
    drafter: str | None = Field(description="DFlash drafter (z-lab format): local directory or hub id")
    block_size: int = Field(ge=2, description="drafter block size S (checked against its config.json)")
    dtype: DType = Field(description="the dtype the pair is meant to run in")
    prompts: str = Field(default="fixture", description="bundled prompt set name or JSONL path")
    prompt_format: PromptFormat = "ids"
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    limit: int | None = Field(default=None, ge=1, description="use only the first N prompts")
    source: str = Field(default="", description="where the pair's facts come from")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a pair name (letters, digits, '.', '_', '-')")
        return value

    @field_validator("target", "drafter")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a non-empty path or hub id")
        return value

    def with_base_dir(self, base_dir: Path) -> ModelPair:
        copy = self.model_copy()
        copy._base_dir = Path(base_dir)
        return copy

    @property
    def base_dir(self) -> Path:
        """Relative local paths of this pair are relative to this directory."""
        return self._base_dir


_ZLAB = (
    "z-lab/dflash README.md (Supported Models; Transformers example: dtype='auto', chat template with "
    "enable_thinking=False) and dflash/benchmark.py (torch.bfloat16, apply_chat_template)"
)

BUILTIN_PAIRS: dict[str, ModelPair] = {
    "fixture": ModelPair(
        name="fixture",
        target="fixture/target",
        drafter="fixture/drafter",
        block_size=16,
        dtype="float32",
        prompts="fixture",
        prompt_format="ids",
        max_new_tokens=64,
        source="bundled: scripts/build_fixture.py (golden/fixture/MANIFEST.json)",
    ).with_base_dir(DATA_DIR),
    "qwen3-8b": ModelPair(
        name="qwen3-8b",
        target="Qwen/Qwen3-8B",
        drafter="z-lab/Qwen3-8B-DFlash-b16",
        block_size=16,
        dtype="bfloat16",
        prompts="fixture",
        prompt_format="chat",
        max_new_tokens=64,
        limit=20,
        source=_ZLAB,
    ),
    "qwen3-4b": ModelPair(
        name="qwen3-4b",
        target="Qwen/Qwen3-4B",
        drafter="z-lab/Qwen3-4B-DFlash-b16",
        block_size=16,
        dtype="bfloat16",
        prompts="fixture",
        prompt_format="chat",
        max_new_tokens=64,
        limit=20,
        source=_ZLAB,
    ),
}


# -- pairs files -------------------------------------------------------------------------------
def _read_table(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise PairSpecError(
            f"pairs file {path}: no such file" if not path.exists() else f"pairs file {path}: not a file"
        )
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise PairSpecError(f"pairs file {path}: unknown format {suffix or '(no suffix)'!r}; use .json or .toml")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PairSpecError(f"pairs file {path}: cannot read: {exc}") from None
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PairSpecError(f"pairs file {path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # nested too deep, an integer too long to read
            raise PairSpecError(f"pairs file {path}: not readable JSON ({type(exc).__name__})") from None
    else:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise PairSpecError(
                    f"pairs file {path}: reading TOML needs Python 3.11+ or the tomli package"
                ) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PairSpecError(f"pairs file {path}: not valid TOML ({exc})") from None
        except (ValueError, RecursionError) as exc:  # nested too deep, an integer too long to read
            raise PairSpecError(f"pairs file {path}: not readable TOML ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise PairSpecError(f"pairs file {path}: expected an object with a 'pairs' table at the top level")
    return data


def _field_error(path: Path, name: str, exc: ValidationError) -> PairSpecError:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"]) or "(pair)"
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        known = ", ".join(f for f in ModelPair.model_fields if f != "name")
        message = f"unknown field (known fields: {known})"
    return PairSpecError(f"pairs file {path}: pair {name!r}: field '{field}': {message}")


def load_pairs_file(path: str | Path) -> dict[str, ModelPair]:
    """The pairs defined in a JSON/TOML file; any problem is one :class:`PairSpecError`."""
    path = Path(path).expanduser()
    data = _read_table(path)
    unknown = sorted(set(data) - {"pairs"})
    if unknown:
        raise PairSpecError(f"pairs file {path}: unknown top-level key {unknown[0]!r} (expected only 'pairs')")
    table = data.get("pairs")
    if not isinstance(table, dict) or not table:
        raise PairSpecError(f"pairs file {path}: field 'pairs': expected a non-empty table of named pairs")
    pairs: dict[str, ModelPair] = {}
    for name, fields in table.items():
        if not isinstance(fields, dict):
            raise PairSpecError(
                f"pairs file {path}: pair {name!r}: expected a table of fields, got {type(fields).__name__}"
            )
        if "name" in fields and fields["name"] != name:
            raise PairSpecError(
                f"pairs file {path}: pair {name!r}: field 'name': {fields['name']!r} differs from the pair's key"
            )
        try:
            pair = ModelPair(**{**fields, "name": name})
        except ValidationError as exc:
            raise _field_error(path, name, exc) from None
        pairs[name] = pair.with_base_dir(path.resolve().parent)
    return pairs


def load_pairs(pairs_file: str | Path | None = None) -> dict[str, ModelPair]:
    """Built-in pairs, then the file's (``pairs_file``, else ``$DDTREE_PAIRS_FILE``), which replace them."""
    pairs = dict(BUILTIN_PAIRS)
    pairs_file = pairs_file or os.environ.get(PAIRS_FILE_ENV) or None
    if pairs_file:
        pairs.update(load_pairs_file(pairs_file))
    return pairs


def get_pair(name: str | None = None, pairs_file: str | Path | None = None) -> ModelPair:
    """The pair ``name`` (else ``$DDTREE_PAIR``, else ``fixture``); unknown names are a PairSpecError."""
    name = name or os.environ.get(PAIR_ENV) or DEFAULT_PAIR
    pairs = load_pairs(pairs_file)
    if name not in pairs:
        hint = (
            f" (pairs file: {pairs_file or os.environ.get(PAIRS_FILE_ENV)})"
            if (pairs_file or os.environ.get(PAIRS_FILE_ENV))
            else f" (add pairs with ${PAIRS_FILE_ENV} or {option('pairs_file')})"
        )
        raise PairSpecError(f"unknown pair {name!r}; known pairs: {', '.join(sorted(pairs))}{hint}")
    return pairs[name]


# -- resolution --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedPair:
    """A pair whose target and drafter are directories on this machine."""

    pair: ModelPair
    target_dir: Path
    drafter_dir: Path | None

    @property
    def name(self) -> str:
        return self.pair.name

    def suite_settings(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for :class:`ddtree_conformance.session.SuiteSettings` running this pair."""
        pair = self.pair
        values: dict[str, Any] = {
            "model_dir": str(self.target_dir),
            "drafter_dir": None if self.drafter_dir is None else str(self.drafter_dir),
            "pair_name": pair.name,
            "dtype": pair.dtype,
            "prompt_set": _prompt_set(pair),
            "prompt_format": pair.prompt_format,
            "limit": pair.limit,
            "max_new_tokens": pair.max_new_tokens,
            "tensor_parallel_size": pair.tensor_parallel_size,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return values


def _prompt_set(pair: ModelPair) -> str:
    """A bundled set name stays a name; a relative path is relative to the pair's base dir."""
    value = pair.prompts
    if "/" not in value and "\\" not in value and not value.endswith((".jsonl", ".json")):
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else pair.base_dir / path)


def _offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _downloads_allowed() -> bool:
    return os.environ.get(DOWNLOAD_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _from_hub(pair: ModelPair, repo_id: str, cache_dir: str | Path | None, download: bool | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise PairUnavailable(
            f"pair {pair.name!r}: {repo_id} is a hub id, and huggingface_hub is not installed to find it"
        ) from None
    try:
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # older huggingface_hub
        from huggingface_hub.utils import LocalEntryNotFoundError

    unreachable = (
        f"pair {pair.name!r}: {repo_id} is not in the local Hugging Face cache and the hub is "
        "unreachable (HF_HUB_OFFLINE / no network)"
    )
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True, allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:
        pass
    except Exception as exc:  # a broken cache entry
        raise PairUnavailable(
            f"pair {pair.name!r}: reading {repo_id} from the Hugging Face cache failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None
    if _offline():
        raise PairUnavailable(unreachable)
    if not (_downloads_allowed() if download is None else download):
        raise PairUnavailable(
            f"pair {pair.name!r}: {repo_id} is not in the local Hugging Face cache and downloads "
            f"are off ({DOWNLOAD_ENV}=0)"
        )
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache_dir, allow_patterns=HUB_PATTERNS))
    except LocalEntryNotFoundError:  # huggingface_hub's answer when the hub cannot be reached
        raise PairUnavailable(unreachable) from None
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        if any(word in f"{type(exc).__name__} {text}".lower() for word in ("connect", "timeout", "resolve", "offline")):
            raise PairUnavailable(unreachable) from None
        raise PairUnavailable(
            f"pair {pair.name!r}: downloading {repo_id} from the hub failed: {type(exc).__name__}: {text}"
        ) from None


def _locate(pair: ModelPair, role: str, ref: str, cache_dir: str | Path | None, download: bool | None) -> Path:
    path = Path(ref).expanduser()
    local = path if path.is_absolute() else pair.base_dir / path
    if local.is_dir():
        return local
    if local.exists():
        raise PairUnavailable(f"pair {pair.name!r}: {role} {local} is not a directory")
    if path.is_absolute() or not _HUB_ID.fullmatch(ref):
        raise PairUnavailable(f"pair {pair.name!r}: {role} {local} does not exist (and {ref!r} is not a hub id)")
    return _from_hub(pair, ref, cache_dir, download)


def _check_block_size(pair: ModelPair, drafter_dir: Path) -> None:
    config = drafter_dir / "config.json"
    try:
        raw = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PairUnavailable(
            f"pair {pair.name!r}: drafter {drafter_dir} has no readable config.json ({exc})"
        ) from None
    found = raw.get("block_size")
    if found is not None and int(found) != pair.block_size:
        raise PairSpecError(
            f"pair {pair.name!r}: field 'block_size': {pair.block_size}, but the drafter's "
            f"{config} says block_size {found}"
        )


def resolve_pair(
    pair: ModelPair | str | None = None,
    *,
    pairs_file: str | Path | None = None,
    cache_dir: str | Path | None = None,
    download: bool | None = None,
) -> ResolvedPair:
    """Local directories for ``pair``'s target and drafter, or :class:`PairUnavailable` (see module doc)."""
    if not isinstance(pair, ModelPair):
        pair = get_pair(pair, pairs_file)
    target = _locate(pair, "target", pair.target, cache_dir, download)
    if not (target / "config.json").is_file():
        raise PairUnavailable(f"pair {pair.name!r}: target {target} has no config.json (incomplete download?)")
    drafter = None
    if pair.drafter is not None:
        drafter = _locate(pair, "drafter", pair.drafter, cache_dir, download)
        _check_block_size(pair, drafter)
    return ResolvedPair(pair=pair, target_dir=target, drafter_dir=drafter)
