"""Replaying an engine's rounds with the reference: the reference's drafter, tree and walk run on
exactly the contexts that the engine's output and per-round acceptance lengths fix.

Round ``r`` of an engine's result starts after ``c_r = 1 + sum(lengths[:r])`` output tokens (the
first output token comes from the prefill): its context is ``prompt + output[:c_r]``, its root the
last committed token ``output[c_r - 1]`` at position ``len(prompt) + c_r - 1``. The replay drafts,
builds the spec tree, verifies it with the ancestor mask and walks it greedily there, exactly as
:class:`~ddtree_conformance.adapters.reference.engine.ReferenceEngine` does, then commits *the
engine's* round (its accepted tokens, its bonus as the next root), so every later round is judged
in the engine's own context:

* when the engine's accepted path is a path of the replay's tree, its verify rows are kept, as the
  reference's own commit would (so a replay of the reference's own run is bit for bit that run);
* otherwise the tree rows are dropped and the engine's accepted tokens run as a causal chain after
  the root, giving the cache rows and drafter feedback of exactly that context.

Near the output's end, where the room left is smaller than the drafter's block, an engine may run
the drafter on a block cut to that room (z-lab's ``dflash_generate`` does): a round that differs
from the replay there is also replayed that way (:attr:`ReplayRound.short_block`).

Only greedy (temperature 0) results are replayed.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from ddtree_conformance.spec import (
    DraftTree,
    VerifyInputs,
    WalkResult,
    build_chain,
    build_tree,
    compact_dynamic_cache,
    compile_tree,
    select_feedback_rows,
    top2_margin,
    walk_tree,
)

from ..interface import Request, RunConfig
from .decoders import EagerDecoder

__all__ = ["EndFreedoms", "ReplayRound", "followed_length", "paced_lengths", "replay_result"]


class EndFreedoms(NamedTuple):
    """How a paced replay drafts and builds its trees near the output's end, where the spec lets an engine
    do either (docs/reference/freedoms.md): the rounds that start with fewer tokens left than the drafter
    has positions. Everywhere else the replay is the spec's.

    ``short_block``: the drafter runs a block cut to the room left (z-lab's ``dflash_generate``);
    ``depth_below_room``: the tree is built over at most ``room - depth_below_room`` positions (1: the
    depth whose bonus the output can still emit, 0: a path emitted without its bonus), its budget spent
    there; None: over every drafted position (the spec tree, whose unemittable nodes change nothing the
    output shows)."""

    short_block: bool = False
    depth_below_room: int | None = None

    def describe(self) -> str:
        parts = ["the drafter's block cut to the room left"] if self.short_block else []
        if self.depth_below_room is not None:
            cap = "room left" if self.depth_below_room == 0 else f"room left - {self.depth_below_room}"
            parts.append(f"the tree capped at depth {cap}, its budget spent there")
        return ", ".join(parts) or "the spec's block and tree"


@dataclass
class ReplayRound:
    """One replayed round: the reference's choices on the engine's context."""

    index: int
    offset: int  # c_r: output index of the first token this round emits
    start: int  # position of the root
    root: int
    length: int  # the reference's acceptance length here
    tokens: list[int]  # the reference's accepted tokens, then its bonus
    tree_tokens: list[int]  # root first
    parents: list[int]
    accepted: list[int]  # accepted node indices
    path_gaps: list[float]  # fp32 target top-1/top-2 gap at the root and each accepted node
    draft_logits: torch.Tensor | None  # [L, V] float32 on CPU, kept for rounds that differ
    short_block: tuple[int, list[int]] | None = None  # (length, tokens) drafted from a block cut to the room left
    short_logits: torch.Tensor | None = None  # [room, V] float32 on CPU: that block's drafter logits
    draft_top: tuple[torch.Tensor, torch.Tensor] | None = None  # every round: the top-k tokens per row, their logits


def _tree(draft_logits: torch.Tensor, mode: str, budget: int):
    return build_chain(draft_logits) if mode == "dflash" else build_tree(draft_logits, budget)


def _path_nodes(tree, tokens: list[int]) -> list[int] | None:
    """Node indices of ``tokens`` as a path from the root of ``tree``, or None when it is not one."""
    children, node, nodes = tree.children, 0, []
    for token in tokens:
        node = children[node].get(token)
        if node is None:
            return None
        nodes.append(node)
    return nodes


def _short_block_round(
    pair, root: int, start: int, context_width: torch.Tensor, draft_cache, cache, mode: str, budget: int, room: int
) -> tuple[int, list[int], torch.Tensor]:
    """(length, tokens, drafter logits) of the round with the drafter's block cut to ``room`` positions.
    The round's context is already in the drafter's cache; the target's cache comes back as it was."""
    logits = pair.draft_logits(root, start, context_width[:0], start, draft_cache, rows=room)
    tree = _tree(logits, mode, budget)
    verify = compile_tree(tree, root, start, dtype=pair.dtype)
    saved = [(layer.keys, layer.values) for layer in cache.layers]
    for layer, (keys, values) in zip(cache.layers, saved):  # the committed rows only (cache updates copy)
        layer.keys, layer.values = keys[:, :, :start], values[:, :, :start]
    try:
        target, _ = pair.forward(verify.input_ids, verify.position_ids, cache, verify.attention_mask)
    finally:
        for layer, (keys, values) in zip(cache.layers, saved):
            layer.keys, layer.values = keys, values
    walk = walk_tree(tree, target)
    tokens = [int(t) for t in verify.input_ids[walk.accepted].tolist()] + [walk.bonus]
    return len(walk.accepted) + 1, tokens, logits.float().cpu()


def followed_length(tree, tokens: list[int]) -> int:
    """How many of ``tokens`` a path of ``tree`` holds from the root, plus one: the acceptance length of a
    round whose target chooses ``tokens`` (its last choice, the bonus, need not be in the tree)."""
    children, node, held = tree.children, 0, 0
    for token in tokens:
        node = children[node].get(token)
        if node is None:
            break
        held += 1
    return held + 1


#: Replays kept per process (:func:`replay_result`): sessions of one process (a test run, the pytest route)
#: replay the same outputs on the same pair; at most this many bytes of kept drafter logits are held.
REPLAY_MEMO_BYTES = 256 * 2**20
_memo: OrderedDict[tuple, tuple[list[ReplayRound], int]] = OrderedDict()
_memo_bytes = 0


def _files_of(folder) -> tuple:
    """What identifies a model folder's contents here: every file's relative path, size and change time."""
    if not folder:
        return ()
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            stat = os.stat(path)
            found.append((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(found))


def _tensor_bytes(rounds: list[ReplayRound]) -> int:
    tensors = [t for r in rounds for t in (r.draft_logits, r.short_logits, *(r.draft_top or ())) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def _copies(rounds: list[ReplayRound]) -> list[ReplayRound]:
    """The rounds with their own lists (the tensors are shared: nothing writes into them)."""
    return [
        replace(
            r,
            tokens=list(r.tokens),
            tree_tokens=list(r.tree_tokens),
            parents=list(r.parents),
            accepted=list(r.accepted),
            path_gaps=list(r.path_gaps),
        )
        for r in rounds
    ]


def replay_result(
    engine,
    request: Request,
    output: list[int],
    lengths: list[int] | None,
    mode: str,
    budget: int,
    device: str = "cpu",
    keep_logits=None,
    keep_top: int = 0,
    end: EndFreedoms = EndFreedoms(),
) -> list[ReplayRound]:
    """Replay the rounds of one greedy ``output`` with per-round ``lengths`` (see the module doc).

    ``engine`` is a :class:`ReferenceEngine`; it runs in float32 on ``device``. ``keep_logits(r,
    engine_tokens, reference_tokens)`` says whether to keep round ``r``'s drafter logits (default:
    when the round differs from the engine's). ``keep_top``: keep every round's top ``keep_top`` drafter
    tokens per row and their logits (``draft_top``; 0: none). Rounds stop where the lengths run past the output.

    ``lengths`` None (an engine that reports no per-round lengths): the reference paces the rounds itself,
    each as long as its tree holds the output's next tokens (:func:`followed_length`), the target's choices
    being the output's; the last round, which reaches the output's end, is as long as the reference's own
    walk there (what the reference would report for it). :func:`paced_lengths` gives those lengths.
    ``end``: how a paced replay drafts and builds its trees near the output's end (:class:`EndFreedoms`;
    default the spec's).

    A replay is a function of the reference's code and pair, the request and the engine's result; without
    ``keep_logits`` it is kept per process (up to :data:`REPLAY_MEMO_BYTES` of drafter logits, least
    recently used first out) and handed out again as copies. Its key: the engine's class and options, the
    pair's folders and files (paths, sizes, change times: a pair rewritten in place is replayed again), the
    request's prompt and token limit, the output, the lengths and the arguments.
    """
    global _memo_bytes
    if keep_logits is not None:
        return _replayed(engine, request, output, lengths, mode, budget, device, keep_logits, keep_top, end)
    key = (
        type(engine).__module__,
        type(engine).__qualname__,
        tuple(sorted((str(k), str(v)) for k, v in (getattr(engine, "options", None) or {}).items())),
        str(getattr(engine, "model_dir", None)),
        str(getattr(engine, "drafter_dir", None)),
        _files_of(getattr(engine, "model_dir", None)),
        _files_of(getattr(engine, "drafter_dir", None)),
        tuple(request.prompt_ids),
        request.max_new_tokens,
        tuple(output),
        None if lengths is None else tuple(lengths),
        mode,
        budget,
        device,
        keep_top,
        end,
    )
    if key in _memo:
        _memo.move_to_end(key)
        return _copies(_memo[key][0])
    rounds = _replayed(engine, request, output, lengths, mode, budget, device, None, keep_top, end)
    size = _tensor_bytes(rounds)
    if size <= REPLAY_MEMO_BYTES:
        _memo[key] = (_copies(rounds), size)
        _memo_bytes += size
        while _memo_bytes > REPLAY_MEMO_BYTES:
            _, (_, dropped) = _memo.popitem(last=False)
            _memo_bytes -= dropped
    return rounds


def _replayed(engine, request, output, lengths, mode, budget, device, keep_logits, keep_top, end) -> list[ReplayRound]:
    """:func:`replay_result`'s replay itself."""
    if lengths is not None and end != EndFreedoms():
        raise ValueError("end freedoms apply to a paced replay (lengths None) only")
    config = RunConfig(mode=mode, budget=budget, dtype="float32", device=device)
    pair = engine._pair(config)
    rounds: list[ReplayRound] = []
    if not output:
        return rounds
    with torch.inference_mode():
        decoder = EagerDecoder(pair)  # the oracle's forwards, whatever the engine's fast path
        _, features = decoder.prefill(request.prompt_ids)
        cache, draft_cache = decoder.cache, decoder.draft_cache
        context, context_start = features, 0
        start, offset = len(request.prompt_ids), 1
        root = output[0]
        index = -1
        while lengths is None or index + 1 < len(lengths):
            index += 1
            if offset >= len(output):
                break  # lengths that run past the output (the acceptance check reports the sum)
            room = request.max_new_tokens - offset
            rows = _end_rows(end, room, pair.drafter.block_size - 1)
            draft_logits = pair.draft_logits(root, start, context, context_start, draft_cache, rows=rows)
            tree = _tree(draft_logits[: _end_depth(end, room, draft_logits.shape[0])], mode, budget)
            verify = compile_tree(tree, root, start, dtype=pair.dtype)
            logits, feats = pair.forward(verify.input_ids, verify.position_ids, cache, verify.attention_mask)
            walk = walk_tree(tree, logits)
            tokens = [int(t) for t in verify.input_ids[walk.accepted].tolist()] + [walk.bonus]
            if lengths is None:
                length = followed_length(tree, output[offset:])
                last = offset + length >= len(output)  # it reaches the output's end
            else:
                length = lengths[index]
                last = index == len(lengths) - 1
            engine_tokens = output[offset : offset + length]
            differs = engine_tokens != tokens[: len(engine_tokens)] or length != len(tokens)
            keep = keep_logits(index, engine_tokens, tokens) if keep_logits is not None else differs
            short = (None, None, None)
            if room < draft_logits.shape[0] and differs:
                short = _short_block_round(pair, root, start, feats, draft_cache, cache, mode, budget, room)
            verified = _Verified(draft_logits, tree, verify, logits, walk, tokens)
            rounds.append(_replay_round(verified, index, offset, start, root, keep, short, keep_top))
            if offset + length > len(output) or last:
                break  # the last round: nothing to commit
            context = _commit_engine_round(pair, tree, feats, cache, start, output[offset : offset + length - 1])
            context_start = start
            start += length
            offset += length
            root = output[offset - 1]
    return rounds


def _commit_engine_round(
    pair, tree, feats: torch.Tensor, cache, start: int, accepted_tokens: list[int]
) -> torch.Tensor:
    """Commit the engine's accepted tokens after the root at ``start`` (module doc): the tree's rows where
    they are a path of it, else a causal chain of them. ``cache`` is compacted in place (mutates: cache, the
    replay's own); returns the drafter's feedback rows for the next round."""
    nodes = _path_nodes(tree, accepted_tokens)
    if nodes is not None:
        compact_dynamic_cache(cache, start, nodes)
        return select_feedback_rows(feats, nodes)
    compact_dynamic_cache(cache, start, [])
    root_row = select_feedback_rows(feats, [])
    if not accepted_tokens:
        return root_row
    ids = torch.tensor(accepted_tokens, dtype=torch.long, device=pair.device)
    positions = torch.arange(start + 1, start + 1 + len(accepted_tokens), device=pair.device)
    _, chain = pair.forward(ids, positions, cache)
    return torch.cat([root_row, chain], dim=0)


def _end_rows(end: EndFreedoms, room: int, rows: int) -> int | None:
    """Drafter positions of a paced round with ``room`` tokens left (None: the whole block)."""
    return min(rows, room) if end.short_block and room < rows else None


def _end_depth(end: EndFreedoms, room: int, rows: int) -> int:
    """Positions the paced round's tree is built over, of the ``rows`` drafted."""
    if end.depth_below_room is None:
        return rows
    return max(1, min(rows, room - end.depth_below_room))


def paced_lengths(rounds: list[ReplayRound], output: list[int], walked: bool = True) -> list[int]:
    """The per-round lengths of a paced replay (``replay_result`` with ``lengths`` None): each round's
    output tokens; the last one's as its walk reports it (``walked``: the reference's own count, past
    the output's end) or as far as the output shows it (the tokens it emitted; docs/reference/freedoms.md:
    both are the spec's)."""
    ends = [r.offset for r in rounds[1:]] + [len(output)]
    lengths = [end - r.offset for r, end in zip(rounds, ends)]
    if rounds and walked:
        lengths[-1] = rounds[-1].length
    return lengths


class _Verified(NamedTuple):
    """One replayed round's drafting and verification: the drafter's logits, the tree built from them, its
    compiled verify batch, the target's logits over it, the walk and the tokens it commits."""

    draft_logits: torch.Tensor
    tree: DraftTree
    verify: VerifyInputs
    logits: torch.Tensor
    walk: WalkResult
    tokens: list[int]


def _top(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` drafter tokens per row and their logits (float32, on CPU)."""
    top = torch.topk(draft_logits.float(), min(k, draft_logits.shape[-1]), dim=-1)
    return top.indices.cpu(), top.values.cpu()


def _replay_round(
    verified: _Verified, index: int, offset: int, start: int, root: int, keep: bool, short: tuple, keep_top: int = 0
) -> ReplayRound:
    """The record of one replayed round (``short``: :func:`_short_block_round`'s, or three Nones)."""
    walk = verified.walk
    return ReplayRound(
        index=index,
        offset=offset,
        start=start,
        root=root,
        length=len(walk.accepted) + 1,
        tokens=verified.tokens,
        tree_tokens=verified.verify.input_ids.tolist(),
        parents=verified.tree.parents.tolist(),
        accepted=list(walk.accepted),
        path_gaps=top2_margin(verified.logits[[0, *walk.accepted]]).tolist(),
        draft_logits=verified.draft_logits.float().cpu() if keep else None,
        short_block=None if short[0] is None else short[:2],
        short_logits=short[2],
        draft_top=_top(verified.draft_logits, keep_top) if keep_top else None,
    )
