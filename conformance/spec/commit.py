"""Committing a walked tree (algorithm doc §3, "Commit").

* The target KV rows of the root and the accepted path move to contiguous positions
  ``prefix_len .. prefix_len + |acc|``; everything else from the verify pass is dropped, the bonus
  is not cached (bug class 3).
* The drafter's next context is the root's and accepted nodes' hidden states, selected by node
  index, not the first |acc| rows (bug class 4).
* Emitted tokens stop after the first stop token and at the length limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["kept_rows", "compact_dynamic_cache", "select_feedback_rows", "emit_tokens"]


def kept_rows(accepted: Sequence[int]) -> list[int]:
    """Rows of the verify batch that stay: the root (0) and the accepted nodes, in path order."""
    return [0, *accepted]


def compact_dynamic_cache(cache, prefix_len: int, accepted: Sequence[int]) -> None:
    """Compact a transformers ``DynamicCache`` in place after a tree verify.

    Before: ``prefix_len`` committed rows followed by the N+1 verify rows. After: the committed
    rows, then the root's and accepted nodes' rows, contiguous; the cache is cropped there.
    """
    rows = torch.tensor(kept_rows(accepted), dtype=torch.long)
    new_length = prefix_len + rows.numel()
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            index = (prefix_len + rows).to(tensor.device)
            tensor[:, :, prefix_len:new_length] = tensor.index_select(2, index)
            # Slicing, not ``cache.crop``: crop's argument changed meaning across transformers 5.x.
            setattr(layer, name, tensor[:, :, :new_length])
    if cache.get_seq_length() != new_length:
        raise RuntimeError(f"cache compaction left {cache.get_seq_length()} rows, expected {new_length}")


def select_feedback_rows(hidden: torch.Tensor, accepted: Sequence[int]) -> torch.Tensor:
    """Drafter feedback: rows of ``hidden [..., N+1, D]`` for the root and accepted nodes."""
    index = torch.tensor(kept_rows(accepted), dtype=torch.long, device=hidden.device)
    return hidden.index_select(-2, index)


def emit_tokens(new_tokens: Sequence[int], stop_token_ids: Sequence[int], room: int) -> tuple[list[int], str | None]:
    """Tokens a round may emit and the finish reason they cause.

    ``new_tokens``: accepted tokens then the bonus. ``room``: tokens still allowed by
    max_new_tokens. Returns the emitted tokens and ``"stop"``, ``"length"`` or ``None``.
    """
    stops = set(stop_token_ids)
    emitted: list[int] = []
    for token in new_tokens:
        if len(emitted) == room:
            return emitted, "length"
        emitted.append(token)
        if token in stops:
            return emitted, "stop"
    return emitted, ("length" if len(emitted) == room else None)
