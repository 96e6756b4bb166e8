"""Prompt sets: JSONL files of prompts, bundled under ``golden/prompts/<name>.jsonl``.

One JSON object per line::

    {"id": "math-001", "category": "math", "text": "What is 2+2?"}
    {"id": "raw-001", "category": "raw", "prompt_ids": [1, 2, 3], "max_new_tokens": 32}

``id`` is required and unique; ``category`` defaults to ``"default"``; at least one of ``text`` and
``prompt_ids`` is required. When ``prompt_ids`` is absent the text is encoded with the
``tokenizers`` library from ``<tokenizer_dir>/tokenizer.json`` (normally the target model dir).
Other keys are kept in :attr:`Prompt.meta`. Blank lines are skipped.

Every problem is one :class:`PromptError` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .paths import PROMPTS_DIR

__all__ = [
    "Prompt",
    "PromptError",
    "bundled_prompt_sets",
    "resolve_prompt_set",
    "load_prompts",
    "format_prompts",
    "DEFAULT_CATEGORY",
]

DEFAULT_CATEGORY = "default"
_KNOWN_FIELDS = ("id", "category", "text", "prompt_ids", "max_new_tokens")


class PromptError(ValueError):
    """A prompt set cannot be used; the message names the file, line and field."""

    def __init__(
        self, message: str, *, path: str | Path | None = None, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = None if path is None else Path(path)
        self.line = line
        self.field = field
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}{what}{message}")


class Prompt(BaseModel):
    """One prompt; ``prompt_ids`` is always filled once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    category: str = DEFAULT_CATEGORY
    text: str | None = None
    prompt_ids: list[int]
    max_new_tokens: int | None = Field(default=None, description="per-prompt length limit, if the set gives one")
    meta: dict[str, Any] = Field(default_factory=dict, description="other keys of the JSON object")


def bundled_prompt_sets() -> list[str]:
    """Names of the prompt sets under ``golden/prompts`` (file names without ``.jsonl``)."""
    if not PROMPTS_DIR.is_dir():
        return []
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl") if p.is_file())


def resolve_prompt_set(path_or_name: str | Path) -> Path:
    """An existing file path, or the bundled set of that name; else :class:`PromptError`."""
    path = Path(path_or_name)
    if path.is_file():
        return path
    bare = isinstance(path_or_name, str) and "/" not in path_or_name and "\\" not in path_or_name
    if bare:
        bundled = PROMPTS_DIR / f"{path_or_name}.jsonl"
        if bundled.is_file():
            return bundled
        if path.suffix not in (".jsonl", ".json"):
            sets = ", ".join(bundled_prompt_sets()) or "none"
            raise PromptError(
                f"prompt set {path_or_name!r} not found: no such file and no bundled set of that name "
                f"(bundled sets: {sets})"
            )
    if path.exists():
        raise PromptError("not a file", path=path)
    raise PromptError("prompts file not found", path=path)


class _Tokenizer:
    """Loads ``tokenizer.json`` on first use, so sets with ``prompt_ids`` need no tokenizer."""

    def __init__(self, tokenizer_dir: str | Path | None) -> None:
        self.dir = None if tokenizer_dir is None else Path(tokenizer_dir)
        self._tok = None

    def encode(self, text: str, path: Path, line: int, prompt_id: str) -> list[int]:
        if self._tok is None:
            if self.dir is None:
                raise PromptError(
                    f"prompt {prompt_id!r} has text but no prompt_ids, and no tokenizer dir was given to encode it",
                    path=path,
                    line=line,
                    field="prompt_ids",
                )
            file = self.dir / "tokenizer.json"
            if not file.is_file():
                raise PromptError(
                    f"prompt {prompt_id!r} has text but no prompt_ids, and {file} does not exist to encode it",
                    path=path,
                    line=line,
                    field="prompt_ids",
                )
            from tokenizers import Tokenizer

            try:
                self._tok = Tokenizer.from_file(str(file))
            except Exception as exc:  # tokenizers raises its own Exception type
                raise PromptError(f"cannot load tokenizer {file}: {exc}", path=path, line=line) from None
        return list(self._tok.encode(text).ids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_line(raw: str, path: Path, line: int, tokenizer: _Tokenizer) -> Prompt:
    def fail(message: str, field: str | None = None) -> PromptError:
        return PromptError(message, path=path, line=line, field=field)

    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise fail(f"bad JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise fail("bad JSON: nested too deep to read") from None
    except ValueError:  # an integer literal past Python's digit limit
        raise fail(f"bad JSON: an integer too long to read (more than {sys.get_int_max_str_digits()} digits)") from None
    if not isinstance(obj, dict):
        raise fail(f"expected a JSON object, got {type(obj).__name__}")

    if "id" not in obj:
        raise fail("missing", "id")
    prompt_id = obj["id"]
    if _is_int(prompt_id):
        prompt_id = str(prompt_id)
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        raise fail(f"must be a non-empty string, got {obj['id']!r}", "id")

    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise fail(f"must be a non-empty string, got {category!r}", "category")

    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        raise fail(f"must be a string, got {type(text).__name__}", "text")

    ids = obj.get("prompt_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise fail(f"must be a list of token ids, got {type(ids).__name__}", "prompt_ids")
        for i, token in enumerate(ids):
            if not _is_int(token):
                raise fail(f"entry {i} is {token!r}, not an integer token id", "prompt_ids")
            if token < 0:
                raise fail(f"entry {i} is a negative token id ({token})", "prompt_ids")
        if not ids:
            raise fail(f"prompt {prompt_id!r} is empty (prompt_ids is [])", "prompt_ids")
    else:
        if text is None:
            raise fail(f"prompt {prompt_id!r} has neither text nor prompt_ids", "text")
        if not text.strip():
            raise fail(f"prompt {prompt_id!r} is empty", "text")
        ids = tokenizer.encode(text, path, line, prompt_id)
        if not ids:
            raise fail(f"prompt {prompt_id!r} encodes to no tokens", "text")

    max_new = obj.get("max_new_tokens")
    if max_new is not None and (not _is_int(max_new) or max_new < 1):
        raise fail(f"must be an integer >= 1, got {max_new!r}", "max_new_tokens")

    meta = {k: v for k, v in obj.items() if k not in _KNOWN_FIELDS}
    return Prompt(id=prompt_id, category=category, text=text, prompt_ids=ids, max_new_tokens=max_new, meta=meta)


def load_prompts(path_or_name: str | Path, tokenizer_dir: str | Path | None = None) -> list[Prompt]:
    """Read a prompt set (a JSONL path or a bundled set name), in file order."""
    path = resolve_prompt_set(path_or_name)
    tokenizer = _Tokenizer(tokenizer_dir)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise PromptError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from None
    except OSError as exc:
        raise PromptError(f"cannot read: {exc.strerror or exc}", path=path) from None
    prompts: list[Prompt] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        prompt = _parse_line(raw, path, number, tokenizer)
        if prompt.id in first_line:
            raise PromptError(
                f"duplicate id {prompt.id!r} (first on line {first_line[prompt.id]})",
                path=path,
                line=number,
                field="id",
            )
        first_line[prompt.id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptError("holds no prompts", path=path)
    return prompts


def format_prompts(prompts: list, tokenizer_dir: str | Path, prompt_format: str) -> list:
    """``prompts`` with ``prompt_ids`` from ``prompt_format`` (a pair's ``ids``, ``text`` or ``chat``;
    :mod:`ddtree_conformance.pairs` says what each means)."""
    if prompt_format == "ids":
        return prompts
    missing = [p.id for p in prompts if not p.text]
    if missing:
        raise PromptError(
            f"prompt {missing[0]!r} has no text to encode as prompt_format {prompt_format!r}", field="text"
        )
    directory = Path(tokenizer_dir)
    if prompt_format == "text":
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise PromptError(f"prompt_format 'text' needs {file}")
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(file))

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text).ids)
    elif prompt_format == "chat":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        if not getattr(tokenizer, "chat_template", None):
            raise PromptError(f"prompt_format 'chat': the tokenizer in {directory} has no chat template")

        def encode(text: str) -> list[int]:
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
            return list(tokenizer.encode(rendered, add_special_tokens=False))
    else:
        raise PromptError(f"unknown prompt_format {prompt_format!r} (ids, text or chat)")
    out = []
    for prompt in prompts:
        ids = encode(prompt.text)
        if not ids:
            raise PromptError(f"prompt {prompt.id!r} encodes to no tokens ({prompt_format})", field="text")
        out.append(prompt.model_copy(update={"prompt_ids": ids}))
    return out
