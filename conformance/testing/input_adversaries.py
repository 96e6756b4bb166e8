"""Broken engines that exploit what a run sends them (issue 32): the context lengths it reaches and
the prompts it uses.

* :class:`ContextBandFault`: a decode-attention fault of one band of context (KV) lengths, as a
  split-KV or paged kernel that switches code paths with the length has; right everywhere else. It
  passed every check of the default plan while the runs decoded only the bundled prompts' short
  contexts and contexts near the window's end; the context-range check decodes every length.
* :class:`ContextBandFaultInCompany`: the same fault in an engine call holding two requests or more
  only; alone it is right at every length. It passed the default plan while the context-range check
  ran every request alone (and the busy-batch check's batch held short contexts only); that check now
  decodes its requests in one call.
* :class:`LongerRoundsInCompany`: right outputs, but in a call of two requests or more adjacent rounds
  reported as one (longer rounds than verified); alone the reference.
* :class:`LongerRoundsAfterAFlipInCompany`: the same claim, after a near tie flipped in company, so
  that its outputs alone and in company part before any inflated round.
* :class:`RecognisesSuitePrompts`: correct on every prompt its detector calls the suite's, broken on
  every other (the runner-up at every position), in every mode alike, reporting everything the
  reference does. Its detector is what an engine team can build from this
  repository: the bundled prompt set (the prompts, their prefixes and anything that starts with one)
  and the recipe held-out prompts used to follow (1-8 opening tokens of a bundled prompt, a bundled
  prompt's length). It passed every check while held-out prompts followed that recipe; drawn as the
  pair's users write prompts (:mod:`ddtree_conformance.held_out`) they are out of its reach.

Each is the reference engine underneath, so everything not named is right.
``tests/test_input_adversaries.py`` shows both failing the default plan and the small plan of the
README, and the detector no better than chance on held-out prompts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import EngineError, Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.testing.rounding_engines import black_box

__all__ = [
    "ContextBandFault",
    "ContextBandFaultInCompany",
    "LongerRoundsInCompany",
    "LongerRoundsAfterAFlipInCompany",
    "RecognisesSuitePrompts",
    "SuiteDetector",
    "INPUT_ADVERSARIES",
]


def _runner_up_rows(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[T, V]`` with the top two logits of each row in ``rows`` (a bool mask) swapped."""
    if not bool(rows.any()):
        return logits
    logits = logits.clone()
    top = torch.topk(logits[rows].float(), 2, dim=-1)
    picked = torch.nonzero(rows).flatten()
    logits[picked, top.indices[:, 0]] = top.values[:, 1].to(logits.dtype)
    logits[picked, top.indices[:, 1]] = top.values[:, 0].to(logits.dtype)
    return logits


class ContextBandFault(ReferenceEngine):
    """Wrong only where the context length is in ``[lo, hi)`` (engine option ``band=LO:HI``, or several:
    ``LO:HI,LO:HI``): a target logits row that produces a token attending to that many tokens (position
    + 1) gives the runner-up instead of the top-1, as a decode-attention kernel of that KV-length band
    would. In every mode (plain included: it equals its own plain run), with the reference's traces and
    acceptance, on the eager path only (its CUDA-graph path would be right, and no engine is right on
    one path only)."""

    name = "adversary-context-band-fault"
    OPTIONS = (*ReferenceEngine.OPTIONS, "band")
    DEFAULT_BAND = "300:420"

    def __init__(self, model_dir, drafter_dir=None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        spec = str(options.get("band", self.DEFAULT_BAND))
        self.bands: list[tuple[int, int]] = []
        for band in spec.split(","):
            try:
                lo, hi = (int(x) for x in band.split(":"))
            except ValueError:
                raise EngineError(f"{self.name}: band must be LO:HI (context lengths), got {band!r}") from None
            if not 0 < lo < hi:
                raise EngineError(f"{self.name}: band {band!r} must have 0 < LO < HI")
            self.bands.append((lo, hi))

    def fast_path_on(self, config: RunConfig) -> bool:
        return False

    def _faulty_now(self) -> bool:
        return True

    def _pair(self, config):
        pair = super()._pair(config)
        if not getattr(pair, "_band_wrapped", False):
            forward, bands = pair.forward, self.bands

            def faulty(ids, positions, cache, mask=None):
                logits, features = forward(ids, positions, cache, mask)
                if not self._faulty_now():
                    return logits, features
                context = positions.to(logits.device) + 1  # the row's token attends to this many tokens
                hit = torch.zeros_like(context, dtype=torch.bool)
                for lo, hi in bands:
                    hit |= (context >= lo) & (context < hi)
                return _runner_up_rows(logits, hit), features

            pair.forward = faulty
            pair._band_wrapped = True
        return pair


class ContextBandFaultInCompany(ContextBandFault):
    """:class:`ContextBandFault` only in an engine call holding two requests or more: a kernel path a
    batch takes at long contexts (split-KV chosen by the batch's total tokens, a paged kernel for mixed
    lengths) and a lone request does not. Alone, at any length, it is the reference."""

    name = "adversary-context-band-fault-in-company"

    def __init__(self, model_dir, drafter_dir=None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self._company = False

    def _faulty_now(self) -> bool:
        return self._company

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        self._company = len(requests) > 1
        try:
            return super().generate_local(requests, config)
        finally:
            self._company = False


class LongerRoundsInCompany(black_box(ReferenceEngine)):
    """Right outputs everywhere, reporting outputs and lengths only (as vLLM and SGLang do); in an engine
    call holding two requests or more it reports each pair of
    adjacent rounds as one (lengths adding to at most 8), claiming longer rounds than it verified, so
    the lengths still add up to the output. Alone it is the reference. The context-range check replays
    the call's rounds, finds them longer than the fp32 replay, runs each request alone (right) and then
    holds the call's rounds against the alone ones: longer beyond the noise fails."""

    name = "adversary-longer-rounds-in-company"

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        results = super().generate_local(requests, config)
        if len(requests) < 2 or config.mode == "plain" or config.trace:
            return results
        return [
            r if not r.acceptance_lengths else r.model_copy(update={"acceptance_lengths": _pairs(r.acceptance_lengths)})
            for r in results
        ]


class LongerRoundsAfterAFlipInCompany(black_box(ReferenceEngine)):
    """Reporting outputs and lengths only; in an engine call holding two requests or more, each request's
    output takes the runner-up at its closest near tie of the fp32 target (a top-2 gap within half the
    noise model's bound, as a batch's own rounding may flip one), decodes on from there, and reports
    every round after the flip paired with the next (:class:`LongerRoundsInCompany`'s claim). Alone it
    is the reference; a request whose output holds no such near tie is left as the reference decodes it.

    It aims at a fallback that holds the call's rounds only against the alone rerun's: the two outputs
    part at the flip, and the inflated rounds all come after it. The context-range check judges the
    call's rounds against the fp32 replay on the call's own tokens, and only shorter rounds there send it
    to the alone reruns."""

    name = "adversary-longer-rounds-after-a-flip-in-company"

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        results = super().generate_local(requests, config)
        if len(requests) < 2 or config.mode == "plain" or config.trace:
            return results
        from types import SimpleNamespace

        from ddtree_conformance.token_scoring import rules_for, score_output, target_logits

        bound = rules_for(SimpleNamespace(model_dir=self.model_dir, dtype=config.dtype)).bound
        scorer = target_logits(self.model_dir, "cpu")
        return [self._flipped(q, r, config, bound, scorer, score_output) for q, r in zip(requests, results)]

    def _flipped(self, request, result, config, bound, scorer, score_output) -> RequestResult:
        output, lengths = result.output_ids, result.acceptance_lengths
        if result.error or not lengths or request.stop_token_ids or len(output) < 4:
            return result
        scores = score_output(scorer, request.prompt_ids, output)
        room = range(1, min(len(output), request.max_new_tokens - 1))
        p = min(room, key=lambda k: scores.top2[k], default=None)
        if p is None or not scores.top2[p] < bound / 2:
            return result
        logits = scorer.fn(list(request.prompt_ids) + list(output[:p]))[-1].float()
        runner_up = int(torch.topk(logits, 2).indices[1])
        head = [*output[:p], runner_up]
        tail_request = request.model_copy(
            update={"prompt_ids": [*request.prompt_ids, *head], "max_new_tokens": request.max_new_tokens - len(head)}
        )
        tail = super().generate_local([tail_request], config)[0]
        if tail.error or not tail.acceptance_lengths:
            return result
        before, done = [], 0  # the rounds up to the flip, the last one cut to end at it (its bonus token)
        for length in lengths:
            if done + length >= p:
                before.append(p - done)
                break
            before.append(length)
            done += length
        claimed = [*before, 1, *_pairs(tail.acceptance_lengths)]
        return result.model_copy(
            update={
                "output_ids": head + list(tail.output_ids),
                "acceptance_lengths": claimed,
                "rounds": len(claimed),
                "finish_reason": tail.finish_reason,
            }
        )


def _pairs(lengths: Sequence[int], most: int = 8) -> list[int]:
    """Adjacent rounds reported as one where their lengths add to at most ``most``."""
    out, k = [], 0
    while k < len(lengths):
        if k + 1 < len(lengths) and lengths[k] + lengths[k + 1] <= most:
            out.append(lengths[k] + lengths[k + 1])
            k += 2
        else:
            out.append(lengths[k])
            k += 1
    return out


class SuiteDetector:
    """Whether a prompt is the suite's, as an engine team that read this repository would decide it: a
    bundled prompt, a prefix of one, a prompt that starts with one (the joined long prompts), or one
    that opens like a bundled prompt (1-8 tokens) and has a bundled prompt's length (the old
    held-out recipe). ``bundled``: the bundled prompt set's ids."""

    def __init__(self, bundled: Iterable[Sequence[int]]) -> None:
        self.bundled = {tuple(ids) for ids in bundled}
        self.lengths = {len(ids) for ids in self.bundled}
        self.openings = {ids[:k] for ids in self.bundled for k in range(1, 9)}
        self.prefixes = {ids[:k] for ids in self.bundled for k in range(1, len(ids) + 1)}

    def __call__(self, prompt_ids: Sequence[int]) -> bool:
        ids = tuple(prompt_ids)
        if ids in self.prefixes:  # the set's prompts and their cuts
            return True
        if any(ids[: len(b)] == b for b in self.bundled if len(b) < len(ids)):  # joined prompts
            return True
        return len(ids) in self.lengths and any(ids[:k] in self.openings for k in range(1, 9))


class RecognisesSuitePrompts(ReferenceEngine):
    """Correct on prompts :class:`SuiteDetector` recognises; on every other prompt of the fixture pair
    (its target is the bundled fixture's) its target logits rows give the runner-up instead of the top-1
    at every position, in every mode alike, with traces and acceptance that agree with its own outputs:
    only a prompt it cannot recognise, judged against the fp32 target, gives it away. On any other pair
    (the synthetic ones of the sampling and edge checks) it is the reference. Eager path only."""

    name = "adversary-recognises-suite-prompts"
    _broken = False

    @cached_property
    def detector(self) -> SuiteDetector | None:
        from ddtree_conformance.paths import FIXTURE_TARGET
        from ddtree_conformance.prompts import load_prompts

        if Path(self.model_dir).resolve() != FIXTURE_TARGET.resolve():
            return None
        return SuiteDetector(p.prompt_ids for p in load_prompts("fixture"))

    def fast_path_on(self, config: RunConfig) -> bool:
        return False

    def _pair(self, config):
        pair = super()._pair(config)
        if not getattr(pair, "_recogniser_wrapped", False):
            forward = pair.forward

            def maybe_broken(ids, positions, cache, mask=None):
                logits, features = forward(ids, positions, cache, mask)
                if self._broken:
                    logits = _runner_up_rows(logits, torch.ones(len(logits), dtype=torch.bool, device=logits.device))
                return logits, features

            pair.forward = maybe_broken
            pair._recogniser_wrapped = True
        return pair

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        detector = self.detector
        if detector is None:
            return super().generate_local(requests, config)
        known = [detector(r.prompt_ids) for r in requests]
        results: list[RequestResult | None] = [None] * len(requests)
        for broken in (False, True):
            picked = [i for i, k in enumerate(known) if k != broken]
            if not picked:
                continue
            self._broken = broken
            try:
                for i, result in zip(picked, super().generate_local([requests[i] for i in picked], config)):
                    results[i] = result
            finally:
                self._broken = False
        return [r for r in results if r is not None]


INPUT_ADVERSARIES = {
    "wrong in one band of context lengths, every mode": ContextBandFault,
    "wrong in one band of context lengths in a batch only, every mode": ContextBandFaultInCompany,
    "rounds reported longer in a batch only": LongerRoundsInCompany,
    "rounds reported longer in a batch only, after a near-tie flip": LongerRoundsAfterAFlipInCompany,
    "right only on prompts it recognises as the suite's": RecognisesSuitePrompts,
}
