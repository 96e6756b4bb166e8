"""Broken engines that exploit a fixed, known request stream (issue 20, "fresh, unordered requests").

Each passes a run whose prompts are all public and whose requests reach the engine once each, in
the checks' own order; held-out prompts (:mod:`ddtree_conformance.held_out`) and the request mixing
of the session (:mod:`ddtree_conformance.session.mixing`) make it fail (tests/test_request_stream.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine

__all__ = ["KnowsPublicPrompts", "RepeatedRequestBug", "public_prompts"]


def _nudged(result: RequestResult, vocab: int, start: int) -> RequestResult:
    """``result`` with every output token from ``start`` on moved to the next id (lengths unchanged, so
    the result stays well-formed)."""
    if result.error or len(result.output_ids) <= start:
        return result
    ids = list(result.output_ids[:start]) + [(t + 1) % vocab for t in result.output_ids[start:]]
    return result.model_copy(update={"output_ids": ids, "traces": None, "verified_trees": None})


_PUBLIC: set[tuple[int, ...]] = set()


def public_prompts(prompt_ids: Iterable[Iterable[int]]) -> None:
    """Tell :class:`KnowsPublicPrompts` which prompts are public (a published prompt set)."""
    _PUBLIC.clear()
    _PUBLIC.update(tuple(ids) for ids in prompt_ids)


class KnowsPublicPrompts(ReferenceEngine):
    """Correct on the prompts of a published set, wrong on every other prompt, in every mode alike (so
    it equals its own plain run), with the reference's acceptance lengths: only a prompt it cannot
    know, judged on its own, gives it away."""

    name = "adversary-knows-public-prompts"

    def capabilities(self):
        return (
            super()
            .capabilities()
            .model_copy(update={"traces": False, "draft_logits": False, "verified_tree_modes": []})
        )

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        results = super().generate_local(requests, config)
        vocab = self.info.vocab_size
        return [r if tuple(q.prompt_ids) in _PUBLIC else _nudged(r, vocab, 1) for q, r in zip(requests, results)]


class RepeatedRequestBug(ReferenceEngine):
    """A response cache whose hit path is off: an exact repeat of a request this engine already served
    (same prompt and settings, same mode, budget and tracing) gets a corrupted output (its last token
    moved). A suite that asks each request once per run never takes the hit path."""

    name = "adversary-repeated-request-bug"

    def capabilities(self):
        return (
            super()
            .capabilities()
            .model_copy(update={"traces": False, "draft_logits": False, "verified_tree_modes": []})
        )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._served: set[tuple] = set()

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        results = super().generate_local(requests, config)
        out = []
        for request, result in zip(requests, results):
            key = (config.mode, config.budget, config.trace, request.model_dump_json())
            hit = key in self._served
            self._served.add(key)
            out.append(_nudged(result, self.info.vocab_size, max(0, len(result.output_ids) - 1)) if hit else result)
        return out
