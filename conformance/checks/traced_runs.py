"""The traced run the tree checks share, and the acceptance check reads to explain a differing round:
one per (mode, budget), on every k-th bundled prompt and every held-out one (a judge below the families)."""

from __future__ import annotations

from ..session import SuiteSession

__all__ = ["TRACED_PROMPTS", "traced_run"]

TRACED_PROMPTS = 20


def traced_run(session: SuiteSession, mode: str, budget: int | None):
    """``(prompt indices, results)`` of the one traced run per (mode, budget) that the tree checks
    share (and the acceptance check reads to explain a differing round): every k-th prompt."""
    caps = session.capabilities
    bundled = len(session.inputs.bundled)
    step = max(1, bundled // TRACED_PROMPTS)
    indices = list(range(0, bundled, step))[:TRACED_PROMPTS] + list(range(bundled, len(session.prompts)))
    requests = session.requests()
    results = session.run(
        mode, budget, trace=True, trace_draft_logits=caps.draft_logits, requests=[requests[i] for i in indices]
    )
    return indices, results
