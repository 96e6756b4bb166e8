"""Engines that honour sampling settings only at the points a fixed plan tests (issue 20, item 4).

Each rewrites the settings of some requests before running them as the reference engine does, so
its samples follow another distribution than the request's. The fixed sampling variants (T=1,
top_k=3, top_p=0.7) never reach the rewritten range; the ``drawn`` variant, whose settings each run
draws across the legal range, does (tests/test_sampling_range.py).
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine

__all__ = ["IgnoresTopPAbove09", "IgnoresTopKAbove8", "IgnoresLowTemperature", "RANGE_ADVERSARIES"]


class _Rewrites(ReferenceEngine):
    def rewrite(self, request: Request) -> Request:
        raise NotImplementedError

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        return super().generate_local([self.rewrite(r) for r in requests], config)


class IgnoresTopPAbove09(_Rewrites):
    """top_p above 0.9 is treated as 1 (no nucleus)."""

    name = "adversary-ignores-top-p-above-0.9"

    def rewrite(self, request: Request) -> Request:
        return request.model_copy(update={"top_p": 1.0}) if request.top_p > 0.9 else request


class IgnoresTopKAbove8(_Rewrites):
    """top_k above 8 is treated as 0 (no top-k)."""

    name = "adversary-ignores-top-k-above-8"

    def rewrite(self, request: Request) -> Request:
        return request.model_copy(update={"top_k": 0}) if request.top_k > 8 else request


class IgnoresLowTemperature(_Rewrites):
    """A temperature in (0, 0.5) is run at 1."""

    name = "adversary-ignores-low-temperature"

    def rewrite(self, request: Request) -> Request:
        return request.model_copy(update={"temperature": 1.0}) if 0 < request.temperature < 0.5 else request


RANGE_ADVERSARIES = {
    "ignores top_p > 0.9": IgnoresTopPAbove09,
    "ignores top_k > 8": IgnoresTopKAbove8,
    "ignores 0 < T < 0.5": IgnoresLowTemperature,
}
