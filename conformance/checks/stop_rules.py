"""The stop and length rules every output keeps, whatever its dtype (a judge below the families: the
stop-token and max-new-tokens checks and the busy-batch check ask it)."""

from __future__ import annotations

__all__ = ["stop_rule_problem"]


def stop_rule_problem(output: list[int], finish_reason: str, stops: list[int], max_new_tokens: int) -> str | None:
    """How ``output`` breaks the stop/length rules, or None (exact in every dtype)."""
    stops_at = [i for i, t in enumerate(output) if t in stops]
    if stops_at and stops_at[0] != len(output) - 1:
        return (
            f"stop token {output[stops_at[0]]} at output position {stops_at[0]}, but {len(output) - 1 - stops_at[0]} "
            f"tokens follow it"
        )
    if len(output) > max_new_tokens:
        return f"{len(output)} tokens, more than max_new_tokens {max_new_tokens}"
    if stops_at and finish_reason != "stop":
        return f"ends with stop token {output[-1]} but finish_reason is {finish_reason!r}"
    if not stops_at and len(output) < max_new_tokens:
        return f"{len(output)} tokens, no stop token, fewer than max_new_tokens {max_new_tokens}"
    if not stops_at and finish_reason != "length":
        return f"{len(output)} tokens without a stop token but finish_reason is {finish_reason!r}"
    return None
