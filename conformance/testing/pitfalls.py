"""Broken reference engines, one per pitfall class the DDTree integration threads name (vLLM PR #42910
and the independent vLLM port linked from it, SGLang PR #29907), modelled on CPU. Each replaces
one step of :class:`~ddtree_conformance.adapters.reference.engine.ReferenceEngine` through the same
hooks as :mod:`.mutants`; tests/test_pitfalls.py shows the check that fails each, and the message.

* :class:`StaleVerifyPositions`: positions ignored under CUDA graphs. The graph reads a static
  position buffer that the engine fills once, at capture, and then replaces instead of writing in
  place: every later round of that tree size runs with the capture round's positions. Its traces
  show the positions it meant to use.
* :class:`MasksMixedAcrossRequests`: per-request masks mapped wrong once tree sizes differ within a
  batch. A scheduler sharing one token budget gives each request of a batch a smaller tree than the
  one before it, and request i's tree gets request i - 1's mask rows of the same step (requests run
  one after the other here; a request alone is never affected).
* :class:`StateAtFlatIndex`: recurrent/KV state committed for ``num_accepted - 1`` instead of the
  accepted node: the last accepted node's row is taken from flat index ``len(accepted)``.
* :class:`TokenZeroPadding`: short trees (cut to the output's room) padded to B nodes with token 0,
  hung as a chain under the last node at the next flat depths, each padding row seeing only itself;
  the walk treats the padding as real.
* :class:`DroppedTreeWalkedAsChain`: a tree cut because the context has no room left is verified
  with the tree mask but walked as a chain over its flat order.
* :class:`EmitsPastStop`: finishing inside an accepted path: a stop token is honoured only as the
  round's last token, so the rest of the accepted path follows it.
* :class:`IgnoresRoomMidRound`: max_new_tokens landing mid-path: the whole round is emitted.

TP shard-local token ids (:class:`ShardLocalTokenIds`) live beside the other tensor-parallel
mutants' base, :class:`~ddtree_conformance.testing.tp_engines.ShardedReference`.
"""

from __future__ import annotations

import dataclasses

import torch

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.spec import (
    DraftTree,
    WalkResult,
    choose_token,
    compact_dynamic_cache,
    compile_tree,
    emit_tokens,
    select_feedback_rows,
    walk_tree,
)

from .tp_engines import ShardedReference

__all__ = [
    "PITFALLS",
    "DroppedTreeWalkedAsChain",
    "EmitsPastStop",
    "IgnoresRoomMidRound",
    "MasksMixedAcrossRequests",
    "ShardLocalTokenIds",
    "StaleVerifyPositions",
    "StateAtFlatIndex",
    "TokenZeroPadding",
]


def _subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes ``keep`` (root first, parents before children) of ``tree``, renumbered in that order."""
    index = {old: new for new, old in enumerate(keep)}
    parents = [-1] + [index[int(tree.parents[i])] for i in keep[1:]]
    pick = torch.tensor(keep, dtype=torch.long, device=tree.tokens.device)
    return DraftTree(
        tree.tokens[pick],
        tree.depths[pick],
        torch.tensor(parents, dtype=torch.long, device=tree.tokens.device),
        tree.ranks[pick],
        tree.scores[pick],
    )


def _with_block(verify, visibility: torch.Tensor):
    """``verify`` with its tree block's mask rows from ``visibility``."""
    n = verify.input_ids.shape[0]
    mask = verify.attention_mask.clone()
    block = mask[0, 0, :, -n:]
    block.zero_()
    block.masked_fill_(~visibility.to(block.device), torch.finfo(mask.dtype).min)
    return dataclasses.replace(verify, attention_mask=mask, visibility=visibility)


class _RoomTracking(ReferenceEngine):
    """Knows, while building a round's tree, how many tokens the request's output still has room for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        build = self._build

        def tracked_emit(tokens, stops, room):
            emitted, reason = emit_tokens(tokens, stops, room)
            self.room = room - len(emitted)
            return emitted, reason

        self.emit_step = tracked_emit
        self._build = lambda logits, budget: self.shape_tree(build(logits, budget), budget)

    def _speculative(self, pair, request, config):
        self.room = request.max_new_tokens - 1  # the prefill emitted one token
        self.round = 0
        return super()._speculative(pair, request, config)

    def shape_tree(self, tree: DraftTree, budget: int) -> DraftTree:
        return tree

    def cut_to_room(self, tree: DraftTree) -> DraftTree:
        """The spec's tree restricted to depths the output still has room for (prefix-closed)."""
        depths = tree.depths.tolist()
        if max(depths) <= self.room:
            return tree
        return _subtree(tree, [i for i, d in enumerate(depths) if d <= max(self.room, 1)])


class StaleVerifyPositions(ReferenceEngine):
    """Positions ignored under CUDA graphs: each tree size's positions are the capture round's."""

    name = "pitfall-stale-verify-positions"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        captured: dict[int, torch.Tensor] = {}

        def replayed(tree, root, start, prefix_len=None, dtype=torch.float32):
            verify = compile_tree(tree, root, start, prefix_len, dtype)
            buffer = captured.setdefault(verify.position_ids.shape[0], verify.position_ids.clone())
            return dataclasses.replace(verify, position_ids=buffer)

        self.compile_step = replayed

    @staticmethod
    def _trace(tree, verify, walk, logits, start, root, draft_logits, config):
        meant = dataclasses.replace(verify, position_ids=start + tree.depths.to(verify.position_ids.device))
        return ReferenceEngine._trace(tree, meant, walk, logits, start, root, draft_logits, config)


class MasksMixedAcrossRequests(ReferenceEngine):
    """Per-request masks mapped wrong once tree sizes differ within a batch (see the module doc)."""

    name = "pitfall-masks-mixed-across-requests"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        build = self._build
        self._build = lambda logits, budget: build(logits, max(1, budget - self.request))

        def compile_in_batch(tree, root, start, prefix_len=None, dtype=torch.float32):
            verify = compile_tree(tree, root, start, prefix_len, dtype)
            n, step = verify.input_ids.shape[0], self.round
            self.masks.setdefault(self.request, {})[step] = verify.visibility
            self.round += 1
            other = self.masks.get(self.request - 1, {}).get(step)
            if other is None or other.shape[0] == n:
                return verify
            k = min(n, other.shape[0])
            visibility = torch.eye(n, dtype=torch.bool, device=other.device)
            visibility[:k, :k] = other[:k, :k]
            visibility[:, 0] = True
            return _with_block(verify, visibility)

        self.compile_step = compile_in_batch

    def generate_local(self, requests, config):
        """Each request of a batch gets a tree smaller by its place in the batch (a scheduler sharing one
        token budget), so sizes differ in every step; request i is given request i - 1's mask rows."""
        self.masks: dict[int, dict[int, torch.Tensor]] = {}
        results = []
        for index, request in enumerate(requests):
            self.request = index if len(requests) > 1 else 0
            results += super().generate_local([request], config)
        return results

    def _speculative(self, pair, request, config):
        self.round = 0
        return super()._speculative(pair, request, config)


def _flat_index_commit(cache, start, accepted):
    compact_dynamic_cache(cache, start, [*accepted[:-1], len(accepted)] if accepted else accepted)


class StateAtFlatIndex(ReferenceEngine):
    """State committed for ``num_accepted - 1`` (the flat index) instead of the last accepted node."""

    name = "pitfall-state-at-flat-index"
    compact_step = staticmethod(_flat_index_commit)
    feedback_step = staticmethod(
        lambda hidden, accepted: select_feedback_rows(hidden, [*accepted[:-1], len(accepted)] if accepted else accepted)
    )


class TokenZeroPadding(_RoomTracking):
    """Short trees padded to B with token 0 that the verify and the walk treat as real nodes."""

    name = "pitfall-token-zero-padding"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)

        def compile_padded(tree, root, start, prefix_len=None, dtype=torch.float32):
            verify = compile_tree(tree, root, start, prefix_len, dtype)
            real = self.real_nodes
            if real >= verify.input_ids.shape[0]:
                return verify
            visibility = verify.visibility.clone()
            visibility[real:, :] = False
            visibility[real:, real:] = torch.eye(visibility.shape[0] - real, dtype=torch.bool, device=visibility.device)
            return _with_block(verify, visibility)

        self.compile_step = compile_padded

    def shape_tree(self, tree, budget):
        cut = self.cut_to_room(tree)
        self.real_nodes = cut.num_nodes + 1
        missing = budget - cut.num_nodes
        if missing <= 0:
            return cut
        n = cut.num_nodes
        device = cut.tokens.device

        def extend(values, more, dtype):
            return torch.cat([values, torch.tensor(more, dtype=dtype, device=device)])

        return DraftTree(
            extend(cut.tokens, [0] * missing, torch.long),
            extend(cut.depths, list(range(n + 1, n + 1 + missing)), torch.long),
            extend(cut.parents, list(range(n, n + missing)), torch.long),
            extend(cut.ranks, [0] * missing, torch.long),
            extend(cut.scores, [0.0] * missing, torch.float64),
        )


def _chain_walk(tree, logits, params, generator) -> WalkResult:
    """The flat order walked as a chain: node i + 1 taken as node i's child."""
    accepted, targets, node = [], {}, 0
    while True:
        token = choose_token(logits[node], params, generator)
        targets[node] = token
        nxt = node + 1
        if nxt > tree.num_nodes or int(tree.tokens[nxt]) != token:
            return WalkResult(accepted=accepted, bonus=token, target_tokens=targets)
        accepted.append(nxt)
        node = nxt


class DroppedTreeWalkedAsChain(ReferenceEngine):
    """A tree cut for lack of context room, verified with the tree mask but walked as a chain."""

    name = "pitfall-dropped-tree-walked-as-chain"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        build, limit = self._build, self.info.max_position_embeddings

        def cut_build(logits, budget):
            tree = build(logits, budget)
            room = (limit - self.start - 1) if limit else budget
            self.cut = room < tree.num_nodes
            return _subtree(tree, list(range(max(room, 1) + 1))) if self.cut else tree

        self._build = cut_build
        self.walk_step = lambda tree, logits, params, generator: (_chain_walk if self.cut else walk_tree)(
            tree, logits, params, generator
        )

    def _speculative(self, pair, request, config):
        original = pair.draft_logits

        def draft(root, start, *args, **kwargs):
            self.start = start
            return original(root, start, *args, **kwargs)

        pair.draft_logits = draft
        try:
            return super()._speculative(pair, request, config)
        finally:
            del pair.draft_logits


def _stop_at_round_end(tokens, stops, room):
    emitted, reason = emit_tokens(tokens, [], room)  # the whole path, whatever it holds
    if reason is None and any(t in set(stops) for t in emitted):
        reason = "stop"
    return emitted, reason


class EmitsPastStop(ReferenceEngine):
    """A stop token inside an accepted path ends the request only after the whole round is emitted."""

    name = "pitfall-emits-past-stop"
    emit_step = staticmethod(_stop_at_round_end)


def _whole_round(tokens, stops, room):
    emitted, reason = emit_tokens(tokens, stops, len(tokens) + 1)  # no length limit inside the round
    if reason is None and len(emitted) >= room:
        reason = "length"
    return emitted, reason


class IgnoresRoomMidRound(ReferenceEngine):
    """max_new_tokens landing mid-path: the whole round is emitted, then the request ends."""

    name = "pitfall-ignores-room-mid-round"
    emit_step = staticmethod(_whole_round)


class ShardLocalTokenIds(ShardedReference):
    """TP shard-local indices used as token ids: at TP > 1, each drafted token's id is its index within
    its vocabulary shard (the target's top-k taken per shard, the shard offset never added)."""

    name = "pitfall-tp-shard-local-token-ids"

    def generate(self, requests, config):
        tp = config.tensor_parallel_size
        if tp <= 1 or config.mode == "plain":
            return super().generate(requests, config)
        build, shard = self._build, -(-self.info.vocab_size // tp)

        def local(logits, budget):
            tree = build(logits, budget)
            tokens = tree.tokens.clone()
            tokens[1:] = tokens[1:] % shard
            keep, seen = [0], set()  # siblings that now share a token: the first one stays
            kept = {0}
            for node in range(1, tree.num_nodes + 1):
                parent, key = int(tree.parents[node]), (int(tree.parents[node]), int(tokens[node]))
                if parent in kept and key not in seen:
                    seen.add(key)
                    kept.add(node)
                    keep.append(node)
            return _subtree(dataclasses.replace(tree, tokens=tokens), keep)

        self._build = local
        try:
            return super().generate(requests, config)
        finally:
            self._build = build


#: pitfall class -> (broken engine, the check that catches it, the pair it shows on: "random" (the tiny
#: random pair), "fixture" (a drafter that drafts well) or "random-tp2" (the random pair at TP=2))
PITFALLS = {
    "positions ignored under CUDA graphs": (StaleVerifyPositions, "lossless/ddtree", "random"),
    "per-request masks mapped wrong when tree sizes differ": (MasksMixedAcrossRequests, "busy-batch/ddtree", "fixture"),
    "state committed for num_accepted - 1": (StateAtFlatIndex, "lossless/ddtree", "random"),
    "token 0 as padding in short trees": (TokenZeroPadding, "tree-structure/ddtree", "random"),
    "dropped trees walked as chains": (DroppedTreeWalkedAsChain, "context-range/ddtree", "fixture"),
    "finishing inside an accepted path": (EmitsPastStop, "stop-token/ddtree", "fixture"),
    "max_new_tokens landing mid-path": (IgnoresRoomMidRound, "max-new-tokens/ddtree", "random"),
    "TP shard-local indices as token ids": (ShardLocalTokenIds, "tensor-parallel/ddtree", "random-tp2"),
}
