"""Bad input is a usage error, found before any engine work (exit status 2, one line).

:func:`validate_run_inputs` reads what a run will feed the engine and refuses it, naming the file,
line and field, before an engine starts:

* the prompts file (every line parses as a JSON object with the fields of :mod:`.prompts`; JSON
  nested too deep or holding an integer too long to read is refused there, not crashed on);
* each prompt used (the first ``--limit``) against the target's ``config.json``: every token id
  below ``vocab_size``, and the prompt plus ``--max-new-tokens`` within ``max_position_embeddings``;
* ``--max-new-tokens`` itself within the context;
* the target's and the drafter's ``config.json`` readable JSON objects (an engine parses them next).

The limits come from the pair's target ``config.json`` (:func:`pair_limits`); a config without them
checks what it can.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .files import read_json_object
from .option_names import option
from .prompts import Prompt, PromptError, format_prompts, load_prompts, resolve_prompt_set
from .settings import SettingsError, SuiteSettings

__all__ = ["ContextLimits", "pair_limits", "validate_prompts", "validate_run_inputs"]


@dataclass(frozen=True)
class ContextLimits:
    """The target's vocabulary and context window, from ``config.json`` (None: not stated)."""

    source: Path
    vocab_size: int | None
    max_position_embeddings: int | None


def _positive(raw: dict, key: str, source: Path) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SettingsError(f"{source}: field '{key}' must be a positive integer, got {str(value)[:40]!r}")
    return value


def pair_limits(model_dir: str | Path) -> ContextLimits:
    """The vocabulary size and context window of the target in ``model_dir`` (its ``config.json``)."""
    source = Path(model_dir) / "config.json"
    raw = read_json_object(source, SettingsError, "model config")
    text = raw.get("text_config")  # multimodal configs keep the language model's fields there
    fields = text if isinstance(text, dict) and "vocab_size" not in raw else raw
    return ContextLimits(
        source, _positive(fields, "vocab_size", source), _positive(fields, "max_position_embeddings", source)
    )


def _lines(path: Path) -> list[int]:
    """The file line of each prompt, in order (load_prompts skips blank lines)."""
    text = path.read_text(encoding="utf-8")
    return [number for number, raw in enumerate(text.splitlines(), start=1) if raw.strip()]


def validate_prompts(
    prompts: list[Prompt],
    path: Path | None,
    limits: ContextLimits,
    max_new_tokens: int | Callable[[Prompt], int],
    limit_option: str = "max_new_tokens",
    field: str = "prompt_ids",
) -> None:
    """Refuse (:class:`PromptError`, naming the file, line and ``field``) a prompt the target cannot take;
    ``max_new_tokens``: the run's limit, or each prompt's."""
    lines = _lines(path) if path is not None else []
    for index, prompt in enumerate(prompts):
        new_tokens = max_new_tokens(prompt) if callable(max_new_tokens) else max_new_tokens
        line = lines[index] if index < len(lines) else None
        vocab = limits.vocab_size
        if vocab is not None:
            for position, token in enumerate(prompt.prompt_ids):
                if token >= vocab:
                    raise PromptError(
                        f"prompt {prompt.id!r}: entry {position} is token id {str(token)[:40]}, outside "
                        f"the vocabulary of {limits.source} (vocab_size {vocab})",
                        path=path,
                        line=line,
                        field=field,
                    )
        context = limits.max_position_embeddings
        if context is not None and len(prompt.prompt_ids) + new_tokens > context:
            raise PromptError(
                f"prompt {prompt.id!r} of {len(prompt.prompt_ids)} tokens + {option(limit_option)} {new_tokens} "
                f"exceeds the target's context of {context} tokens (max_position_embeddings in "
                f"{limits.source})",
                path=path,
                line=line,
                field=field,
            )


def validate_run_inputs(settings: SuiteSettings) -> list[Prompt]:
    """The prompts a run will use, after every check of the module doc; raises :class:`SettingsError`
    or :class:`PromptError` (both usage errors) before any engine work."""
    limits = pair_limits(settings.model_dir)
    if settings.drafter_dir is not None:  # readable before an engine parses it
        read_json_object(Path(settings.drafter_dir) / "config.json", SettingsError, "drafter config")
    flag = option("max_new_tokens")
    context = limits.max_position_embeddings
    if context is not None and settings.max_new_tokens >= context:
        raise SettingsError(
            f"{flag} {settings.max_new_tokens}: the target's context holds {context} tokens "
            f"(max_position_embeddings in {limits.source}), prompt included"
        )
    path = resolve_prompt_set(settings.prompt_set)
    prompts = load_prompts(path, tokenizer_dir=settings.model_dir)
    prompts = format_prompts(prompts, settings.model_dir, settings.prompt_format)
    prompts = prompts[: settings.limit] if settings.limit else prompts
    field = "prompt_ids" if settings.prompt_format == "ids" else "text"
    validate_prompts(prompts, path, limits, settings.max_new_tokens, "max_new_tokens", field)
    return prompts
