"""The reference engine's speculative loop with one request as a generator of engine steps, and one
hook per freedom (:class:`SteppedEngine`); with every hook at its default it decodes exactly as
:class:`~ddtree_conformance.adapters.reference.engine.ReferenceEngine` does. The correct engines of
:mod:`.correct_engines` each set one hook. Also the tree surgery they share.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from ddtree_conformance.adapters.interface import Request, RequestResult, RoundTrace, RunConfig, Timings, VerifiedTree
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.spec import SamplingParams, build_chain, choose_token, emit_tokens
from ddtree_conformance.spec.tree import DraftTree
from ddtree_conformance.spec.walk import WalkResult

__all__ = ["SteppedEngine", "first_nodes", "renumbered", "run_to_end", "shallower", "subtree"]

_FIELDS = ("tokens", "depths", "parents", "ranks", "scores")


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes ``keep`` of ``tree`` (root included, parents before children), renumbered in that order."""
    index = {old: new for new, old in enumerate(keep)}
    parents = [-1] + [index[int(tree.parents[old])] for old in keep[1:]]
    rows = torch.tensor(keep, dtype=torch.long, device=tree.tokens.device)
    fields = {name: getattr(tree, name).index_select(0, rows) for name in _FIELDS}
    fields["parents"] = torch.tensor(parents, dtype=torch.long, device=tree.tokens.device)
    return DraftTree(**fields)


def shallower(tree: DraftTree, depth: int) -> DraftTree:
    """``tree`` without its nodes deeper than ``depth``."""
    return subtree(tree, [i for i, d in enumerate(tree.depths.tolist()) if d <= depth])


def first_nodes(tree: DraftTree, count: int) -> DraftTree:
    """The root and the first ``count`` nodes in pop order (the spec tree of budget ``count``)."""
    return subtree(tree, list(range(min(tree.num_nodes, max(0, count)) + 1)))


def renumbered(tree: DraftTree, order: list[int]) -> DraftTree:
    """``tree`` with its nodes laid out in ``order`` (a permutation starting with the root 0)."""
    index = {old: new for new, old in enumerate(order)}
    rows = torch.tensor(order, dtype=torch.long, device=tree.tokens.device)
    fields = {name: getattr(tree, name).index_select(0, rows) for name in _FIELDS}
    parents = [-1 if i == 0 else index[int(tree.parents[old])] for i, old in enumerate(order)]
    fields["parents"] = torch.tensor(parents, dtype=torch.long, device=tree.tokens.device)
    return DraftTree(**fields)


class SteppedEngine(ReferenceEngine):
    """The reference's speculative loop, one request as a generator of engine steps, with a hook
    per freedom. With every hook at its default it decodes exactly as the reference engine does."""

    name = "correct-stepped"
    prefill_chunk: int | None = None  # prompt tokens per prefill step (None: the whole prompt at once)
    preempt_every: int | None = None  # rounds between preemptions (KV freed, then recomputed)
    report_emitted = False  # acceptance lengths as emitted (cut by the output's end) instead of as walked

    # -- hooks (defaults: the reference's steps) ----------------------------------------------
    def rng(self, pair, request: Request) -> torch.Generator:
        return self._generator(pair, request)

    def choose(self, logits: torch.Tensor, params: SamplingParams, generator) -> int:
        return choose_token(logits, params, generator)

    def drafted_rows(self, room: int, block: int) -> int:
        """Positions drafted this round; ``room``: tokens the output can still take; ``block`` = L."""
        return block

    def tree_depth(self, room: int, rows: int) -> int:
        """Depths the tree is built over (default: every drafted position)."""
        return rows

    def build(self, draft_logits: torch.Tensor, config: RunConfig, params: SamplingParams, generator) -> DraftTree:
        return build_chain(draft_logits) if config.mode == "dflash" else self._build(draft_logits, config.budget)

    def cut(self, tree: DraftTree, room: int, start: int, config: RunConfig) -> DraftTree:
        """The tree actually verified (default: all of it)."""
        return tree

    def layout(self, tree: DraftTree) -> DraftTree:
        """The order of the nodes in the verify batch (default: pop order)."""
        return tree

    def verify(self, pair, tree: DraftTree, root: int, start: int, cache):
        """Compile and run the verify forward; returns ``(verify inputs, logits, features)`` of the tree's rows."""
        verify = self.compile_step(tree, root, start, dtype=pair.dtype)
        logits, features = pair.forward(verify.input_ids, verify.position_ids, cache, verify.attention_mask)
        return verify, logits, features

    def walk(self, tree: DraftTree, logits: torch.Tensor, params: SamplingParams, generator, draft: dict) -> WalkResult:
        return self.walk_step(tree, logits, params, generator)

    # -- the loop -------------------------------------------------------------------------------
    def _prefill_steps(self, pair, ids: list[int]) -> Generator[None, None, tuple]:
        """Prefill ``ids`` from position 0, ``prefill_chunk`` tokens per step; returns ``(cache, last logits,
        features)``."""
        from transformers import DynamicCache

        cache = DynamicCache(config=pair.target.config)
        chunk = self.prefill_chunk or len(ids)
        features, logits = [], None
        for begin in range(0, len(ids), chunk):
            part = torch.tensor(ids[begin : begin + chunk], dtype=torch.long, device=pair.device)
            positions = torch.arange(begin, begin + part.shape[0], device=pair.device)
            logits, feats = pair.forward(part, positions, cache)
            features.append(feats)
            if begin + chunk < len(ids):
                yield
        return cache, logits[-1], torch.cat(features, dim=0)

    def _speculative(self, pair, request: Request, config: RunConfig) -> RequestResult:
        return run_to_end(self.request_steps(pair, request, config))

    def request_steps(self, pair, request: Request, config: RunConfig) -> Generator[None, None, RequestResult]:
        """One request, one engine step per ``yield`` (prefill chunks, then rounds); returns its result."""
        params, generator = self._sampling(request), self.rng(pair, request)
        stops, limit = request.stop_token_ids, request.max_new_tokens
        cache, last_logits, features = yield from self._prefill_steps(pair, request.prompt_ids)
        root = self.choose(last_logits, params, generator)
        output, reason = emit_tokens([root], stops, limit)
        draft_cache = pair.drafter.new_cache()
        context, context_start = features, 0
        start, block = len(request.prompt_ids), pair.drafter.block_size - 1
        lengths: list[int] = []
        traces: list[RoundTrace] | None = [] if config.trace else None
        trees: list[VerifiedTree] = []  # light traces, like the reference's
        while reason is None:
            yield
            if self.preempt_every and lengths and len(lengths) % self.preempt_every == 0:
                # preempted: both KV caches freed; recomputed from the committed tokens before the root
                cache, _, context = yield from self._prefill_steps(pair, request.prompt_ids + output[:-1])
                draft_cache, context_start = pair.drafter.new_cache(), 0
            room = limit - len(output)
            rows = self.drafted_rows(room, block)
            draft_logits = pair.draft_logits(root, start, context, context_start, draft_cache, rows=rows)
            draft = {"logits": draft_logits}
            depth = self.tree_depth(room, int(draft_logits.shape[0]))
            built = self.build(draft_logits[:depth], config, params, generator)
            tree = self.layout(self.cut(built, room, start, config))
            verify, logits, features = self.verify(pair, tree, root, start, cache)
            walk = self.walk(tree, logits, params, generator, draft)
            self.compact_step(cache, start, walk.accepted)
            context, context_start = self.feedback_step(features, walk.accepted), start
            new_tokens = [int(t) for t in verify.input_ids[walk.accepted].tolist()] + [walk.bonus]
            emitted, reason = emit_tokens(new_tokens, stops, room)
            output += emitted
            shown = walk
            if self.report_emitted and len(emitted) < len(new_tokens):  # the round as far as the output shows it
                shown = WalkResult(walk.accepted[: len(emitted) - 1], emitted[-1], walk.target_tokens)
            lengths.append(len(shown.accepted) + 1)
            trees.append(self._verified_tree(tree, verify, walk, logits, params))
            if traces is not None:
                traces.append(self._trace(tree, verify, shown, logits, start, root, draft_logits, config))
            start += len(walk.accepted) + 1
            root = walk.bonus
        return RequestResult(
            output_ids=output,
            finish_reason=reason,
            rounds=len(lengths),
            acceptance_lengths=lengths,
            timings=Timings(),
            traces=traces,
            verified_trees=trees,
        )


def run_to_end(steps: Generator) -> RequestResult:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
