"""Capabilities checked against the model: the context limit an engine claims.

``capabilities().max_context`` decides how long the context-range and prompt-shapes checks make their
prompts, so a claim is held to the target's own config (``max_position_embeddings``):

* larger than the target's window: an error naming the engine and the config field; the checks that
  read the claim fail with it (an engine cannot serve positions its model has no weights for);
* smaller: the checks run at the claim, and their details name the positions left untested
  (:data:`UNTESTED_KEY`): a bug past the claimed limit is out of this run's reach, and the report
  says so rather than passing in silence;
* not stated: the checks that need a limit skip, and their details name the untested range too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["UNTESTED_KEY", "ContextClaim", "model_context", "context_claim"]

UNTESTED_KEY = "untested_context"  # check details: the context range this run did not reach


def model_context(model_dir: str | Path) -> tuple[int | None, str]:
    """The target's context window from ``<model_dir>/config.json`` (``max_position_embeddings``, or
    ``text_config.max_position_embeddings``) and where it was read; None when it is not stated."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, str(path)
    if not isinstance(config, dict):
        return None, str(path)
    for where, section in (("", config), ("text_config.", config.get("text_config"))):
        value = section.get("max_position_embeddings") if isinstance(section, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"{path}: {where}max_position_embeddings"
    return None, str(path)


@dataclass(frozen=True)
class ContextClaim:
    """The engine's claimed context limit held to the model's: the limit checks may use (None: none
    usable), the error when the claim exceeds the model, and the range left untested."""

    limit: int | None
    model_limit: int | None
    problem: str | None = None
    untested: dict | None = None

    def details(self) -> dict:
        return {UNTESTED_KEY: self.untested} if self.untested else {}

    def note(self) -> str:
        """A clause for a check's message naming the untested range, or ""."""
        u = self.untested
        if not u:
            return ""
        span = f"positions {u['from']}..{u['to']}" if u["from"] is not None else f"long contexts (up to {u['to']})"
        return f"{span} untested: {u['why']}"


def context_claim(session) -> ContextClaim:
    """``session``'s engine's ``max_context`` held to its target's config (module doc)."""
    caps = session.capabilities
    claimed = caps.max_context
    model, where = model_context(session.settings.model_dir)
    if claimed is not None and model is not None and claimed > model:
        return ContextClaim(
            None,
            model,
            problem=(
                f"engine {session.settings.engine!r} claims capabilities().max_context {claimed}, larger than the "
                f"target's context window ({where} = {model}): it cannot serve positions its model has no weights for"
            ),
        )
    if claimed is None:
        untested = None
        if model is not None:
            untested = {
                "from": None,
                "to": model,
                "engine_max_context": None,
                "model_max_context": model,
                "why": f"the engine states no context limit (capabilities().max_context); the target's "
                f"window is {model} ({where})",
            }
        return ContextClaim(None, model, untested=untested)
    untested = None
    if model is not None and claimed < model:
        untested = {
            "from": claimed + 1,
            "to": model,
            "engine_max_context": claimed,
            "model_max_context": model,
            "why": f"the engine claims max_context {claimed}, below the target's window {model} ({where}); "
            "a bug past the claimed limit is out of this run's reach",
        }
    return ContextClaim(claimed, model, untested=untested)
