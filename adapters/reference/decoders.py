"""One request's model state for the reference engine's loop: the eager oracle and the fast path.

The engine's loop (``engine.py``) composes the spec's steps; a decoder holds the target's and the
drafter's caches for one request and runs the forwards the loop asks for:

* :class:`EagerDecoder`: transformers' ``DynamicCache`` and the drafter's growing ``DraftCache``,
  every forward eager. This is the oracle.
* :class:`StaticDecoder`: the same forwards on fixed-capacity caches, each shape replayed as a CUDA
  graph on CUDA (:mod:`.graphs`). The prefill stays eager (then its K/V move into the static
  cache), as does the first draft after it (a shape seen once per request). The tree, the compiled
  verify inputs and the walk live on the host between the draft's and the verify's graphs; with the
  engine's ``device_tree`` on, a greedy DDTree round whose steps are the spec's own runs as one graph
  instead (:meth:`StaticDecoder.tree_round`): the tree built with tensors (:mod:`.device_tree`), its
  verify inputs (:mod:`.device_verify`), the target's forward, the greedy walk (:mod:`.device_walk`),
  the commit and the next round's draft, with one read back per round and nothing copied from the
  host between rounds (:meth:`StaticDecoder.launch_round` queues it, :meth:`StaticDecoder.finish_round`
  reads it back, so the engine may queue the next round before it records this one).

Both answer ``prefill``, ``step`` (one plain token), ``verify`` (the compiled tree), ``compact`` (the
engine's compaction step on this cache) and ``draft``.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ddtree_conformance.spec import DraftTree, VerifyInputs, WalkResult, compact_dynamic_cache

from ..interface import VerifiedTree
from . import lean as lean_module
from .device_tree import build_tree_with_ancestors
from .device_verify import verify_inputs_on_device
from .device_walk import greedy_walk_on_device
from .graphs import GraphRunner, StaticDraftCache, StaticTargetCache, capacity_for, fill_in_place
from .lean import LeanDFlash, LeanQwen3, blas_library, lean_drafter_problem, lean_problem

__all__ = ["EagerDecoder", "FastPathState", "StaticDecoder", "TreeRound", "collector_paused"]


@contextlib.contextmanager
def collector_paused():
    """Python's garbage collector off while a batch decodes: a full collection (tens of milliseconds with
    torch loaded) landing inside a timed decode loop is pure host noise. Reference cycles made meanwhile
    are collected once it is back on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class EagerDecoder:
    """The oracle path: ``DynamicCache`` for the target, ``DraftCache`` for the drafter."""

    fast = False

    def __init__(self, pair) -> None:
        self.pair = pair
        self.cache = None
        self.draft_cache = None

    def prefill(self, prompt_ids: list[int]):
        from transformers import DynamicCache

        pair = self.pair
        self.cache = DynamicCache(config=pair.target.config)
        prompt = torch.tensor(prompt_ids, dtype=torch.long, device=pair.device)
        logits, features = pair.forward(prompt, torch.arange(prompt.shape[0], device=pair.device), self.cache)
        if pair.drafter is not None:
            self.draft_cache = pair.drafter.new_cache()
        return logits[-1], features

    def step(self, token: int, position: int):
        ids = torch.tensor([token], dtype=torch.long, device=self.pair.device)
        logits, _ = self.pair.forward(ids, torch.tensor([position], device=self.pair.device), self.cache)
        return logits[-1]

    def tree_device(self) -> torch.device:
        return self.pair.device

    def verify(self, verify):
        return self.pair.forward(verify.input_ids, verify.position_ids, self.cache, verify.attention_mask)

    def compact(self, step, start: int, accepted: list[int]) -> None:
        step(self.cache, start, accepted)

    def draft(self, root: int, start: int, context: torch.Tensor, context_start: int, block_offset: int = 0):
        return self.pair.draft_logits(root, start, context, context_start, self.draft_cache, block_offset)

    def settings(self) -> dict:
        """What the request ran under that changes its speed (``RequestResult.engine_settings``)."""
        return {
            "cuda_graphs": False,
            "static_kv_cache": False,
            "fused_layers": False,
            "overlap_scheduling": False,
            "attention_backend": "sdpa",
        }


class FastPathState:
    """What one loaded pair keeps for the fast path: a graph runner and caches per capacity."""

    def __init__(self, pair, capture: bool) -> None:
        self.runner = GraphRunner(pair.device, capture)
        self.targets: dict[int, StaticTargetCache] = {}
        self.drafts: dict[int, StaticDraftCache] = {}
        self.lean_problem = lean_problem(pair.target)
        self.lean_drafter_problem = lean_drafter_problem(pair.drafter) if pair.drafter is not None else "no drafter"
        self._lean: LeanQwen3 | None = None
        self._lean_drafter: LeanDFlash | None = None
        self._pair = pair

    @property
    def lean(self) -> LeanQwen3 | None:
        """The target's fused forward (:mod:`.lean`), made on first use; None where the model has none."""
        if self._lean is None and self.lean_problem is None:
            drafter = self._pair.drafter
            self._lean = LeanQwen3(self._pair.target, drafter.config.target_layer_ids if drafter is not None else None)
        return self._lean

    @property
    def lean_drafter(self) -> LeanDFlash | None:
        """The drafter's fused forward (:class:`.LeanDFlash`), made on first use; None where it has none."""
        if self._lean_drafter is None and self.lean_drafter_problem is None:
            self._lean_drafter = LeanDFlash(self._pair.drafter)
        return self._lean_drafter

    def target_cache(self, capacity: int, like) -> StaticTargetCache:
        if capacity not in self.targets:
            keys = like.layers[0].keys
            self.targets[capacity] = StaticTargetCache(
                len(like.layers), keys.shape[1], keys.shape[3], capacity, keys.dtype, keys.device
            )
        return self.targets[capacity]

    def draft_cache(self, capacity: int, drafter, dtype, device) -> StaticDraftCache:
        if capacity not in self.drafts:
            attention = drafter.layers[0].self_attn
            self.drafts[capacity] = StaticDraftCache(
                len(drafter.layers),
                attention.num_kv_heads,
                attention.head_dim,
                capacity,
                dtype,
                device,
                tail=drafter.block_size,
            )
        return self.drafts[capacity]


@dataclass(frozen=True)
class TreeRound:
    """One greedy round as :meth:`StaticDecoder.launch_round` ran it on the device: the tree (device
    tensors), its verify inputs (ids and positions on the host, read back), the target's logits and
    features (device), the walk, and the drafter logits the round's tree was built from (device). Its
    device tensors are the graph's buffers: read them before the next round runs."""

    tree: DraftTree
    verify: VerifyInputs
    logits: torch.Tensor
    features: torch.Tensor
    walk: WalkResult
    draft_logits: torch.Tensor
    parents: list[int]  # read back with the walk: the tree's parents and the target's token at every node
    targets: list[int]

    def parts(self) -> tuple:
        """``(tree, verify, logits, features, walk)``, as the host steps give them."""
        return self.tree, self.verify, self.logits, self.features, self.walk

    def verified_tree(self) -> VerifiedTree:
        """The round's light trace (``round_records.verified_tree``'s) from what was read back: no second
        read of the device's buffers."""
        return VerifiedTree(
            tree_tokens=self.verify.input_ids.tolist(),
            parents=list(self.parents),
            node_target_tokens=list(self.targets),
        )


class StaticDecoder(EagerDecoder):
    """The fast path (module doc). ``rows``: the most rows one verify adds (tree nodes + root)."""

    fast = True

    def __init__(
        self,
        pair,
        state: FastPathState,
        prompt_len: int,
        max_new_tokens: int,
        rows: int,
        fill=fill_in_place,
        fused: bool = True,
    ) -> None:
        super().__init__(pair)
        self.state, self.fill = state, fill
        self.lean = state.lean if fused else None
        self.lean_drafter = state.lean_drafter if fused else None
        block = pair.drafter.block_size if pair.drafter is not None else 1
        low_precision = pair.dtype in (torch.bfloat16, torch.float16)  # timed there; fp32 keeps cuBLAS's bits
        self.cublaslt_from = lean_module.VERIFY_CUBLASLT_FROM_ROWS if self.lean is not None and low_precision else 0
        self.capacity = capacity_for(prompt_len + max_new_tokens + max(rows, block) + 1)
        self.static: StaticTargetCache | None = None
        self.draft_static: StaticDraftCache | None = None
        self.minimum = torch.finfo(pair.dtype).min
        self._carried: dict[str, torch.Tensor] = {}  # the next round's draft, root and start (launch_round)
        self._queued: tuple | None = None  # the launched round's start, depth limit and outputs (finish_round)

    # -- target ---------------------------------------------------------------------------
    def prefill(self, prompt_ids: list[int]):
        last, features = super().prefill(prompt_ids)  # eager, so the first token is the oracle's
        self.static = self.state.target_cache(self.capacity, self.cache)
        self.static.load(self.cache)
        self.cache = self.static
        if self.pair.drafter is not None:
            self.draft_static = self.state.draft_cache(
                self.capacity, self.pair.drafter, self.pair.dtype, self.pair.device
            )
        return last, features

    def _target(self, key, static_inputs: dict, mask_from_slots: bool):
        pair, cache, capacity, minimum, lean = self.pair, self.static, self.capacity, self.minimum, self.lean

        def forward(static):
            cache.slots = static["slots"]
            if mask_from_slots:  # one plain step: every slot up to its own is visible
                columns = torch.arange(capacity, device=pair.device)
                mask = torch.where(columns[None, :] <= static["slots"][:, None], 0.0, minimum).to(pair.dtype)
                mask = mask.view(1, 1, -1, capacity)
            else:
                mask = static["mask"]
            if lean is not None:
                return lean.forward(static["ids"], static["positions"], cache, mask)
            return pair.forward(
                static["ids"], static["positions"], cache, {"full_attention": mask, "sliding_attention": mask}
            )

        return self.state.runner.run((*key, lean is not None), forward, static_inputs, fill=self.fill)

    def step(self, token: int, position: int):
        inputs = {
            "ids": torch.tensor([token]),
            "positions": torch.tensor([position]),
            "slots": torch.tensor([position]),
        }
        logits, _ = self._target(("step", 1, self.capacity, id(self.static)), inputs, True)
        self.static.length = position + 1
        return logits[-1]

    def tree_device(self) -> torch.device:
        return torch.device("cpu")

    def verify(self, verify):
        rows = verify.input_ids.shape[0]
        start = self.static.length
        mask = verify.attention_mask
        mask = F.pad(mask, (0, self.capacity - mask.shape[-1]), value=self.minimum)
        inputs = {
            "ids": verify.input_ids,
            "positions": verify.position_ids,
            "slots": torch.arange(start, start + rows),
            "mask": mask,
        }
        out = self._target(("verify", rows, self.capacity, id(self.static)), inputs, False)
        self.static.length = start + rows
        return out

    def tree_round(
        self, budget: int, start: int, draft_logits: torch.Tensor | None = None, root: int | None = None
    ) -> TreeRound:
        """A greedy round as one graph (:meth:`launch_round`, then :meth:`finish_round`)."""
        self.launch_round(budget, start, draft_logits, root)
        return self.finish_round()

    def launch_round(
        self, budget: int, start: int, draft_logits: torch.Tensor | None = None, root: int | None = None
    ) -> None:
        """Queue a greedy round as one graph, from the drafter's logits to the next round's:

        1. the spec's tree of ``budget`` nodes (:func:`.build_tree_with_ancestors`, equal to the heap's), its
           verify inputs at ``start`` (the root's position) with the mask over the whole cache, the target's
           forward (writing the tree's K/V at ``start ..``) and the greedy walk;
        2. the commit: the root's and the accepted nodes' K/V moved to ``start ..`` (the spec's compaction),
           and their feature rows kept as the drafter's context;
        3. the next round's draft from the bonus token, at ``start + accepted + 1``.

        Nothing is read back here: on a GPU the call returns once the graph is queued, so the host may do
        the last round's bookkeeping while this one runs. :meth:`finish_round` reads it back. The request's
        first round takes ``draft_logits`` and ``root`` (its draft ran after the prefill); every later one
        takes the previous round's draft, bonus and start where they are, on the device, so nothing is
        copied from the host between rounds.

        The shapes are fixed: the commit always moves ``L + 1`` rows and the draft always reads ``L + 1``
        context rows (L the drafter's positions). Rows past the accepted ones carry the root's K/V and
        features; they sit at or beyond the next round's root position, where the masks hide them and the
        next round writes over them."""
        depth_limit = self.pair.drafter.block_size - 1

        def forward(static):
            tree, visibility, logits, features, path, accepted, bonus, packed = self._verified_round(static, budget)
            carried = self._commit_and_draft(static["start"], path, accepted, bonus, features)
            return tree, visibility, logits, features, static["draft"], packed, carried

        if draft_logits is not None:
            inputs = {"draft": draft_logits, "root": torch.tensor([root]), "start": torch.tensor([start])}
        else:
            inputs = self._carried
        lean_on = (self.lean is not None, self.lean_drafter is not None, self.cublaslt_from)
        key = ("round", budget, depth_limit, self.capacity, id(self.static), id(self.draft_static), lean_on)
        *outputs, self._carried = self.state.runner.run(key, forward, inputs, fill=self.fill)
        self._queued = (start, depth_limit, outputs)

    def finish_round(self) -> TreeRound:
        """The round :meth:`launch_round` queued, read back once: the walk, the tree's tokens and depths,
        the target's token at every node. Its device tensors are the graph's buffers, valid until the next
        round is launched."""
        start, depth_limit, (tree, visibility, logits, features, drafted, packed) = self._queued
        rows = tree.tokens.shape[0]
        values = packed.tolist()  # the round's one read back
        accepted, bonus = values[0], values[1]
        path = values[2 : 2 + accepted]
        ids, depths, chosen, parents = (
            values[2 + depth_limit + i * rows : 2 + depth_limit + (i + 1) * rows] for i in range(4)
        )
        self.static.length = start + accepted + 1
        verify = VerifyInputs(
            input_ids=torch.tensor(ids),
            position_ids=torch.tensor([start + d for d in depths]),
            visibility=visibility,
            attention_mask=torch.empty(0),  # the graph's mask spans the cache; nothing reads it after
        )
        walk = WalkResult(accepted=path, bonus=bonus, target_tokens={node: chosen[node] for node in (0, *path)})
        return TreeRound(tree, verify, logits, features, walk, drafted, parents, chosen)

    def _verified_round(self, static: dict, budget: int):
        """Step 1 of :meth:`launch_round`, on the device: the spec's tree of the carried draft, the target's
        verify of it at ``static["start"]`` with the mask over the whole cache, and the greedy walk; with
        the round's packed read back (accepted count, bonus, path, tree tokens, depths, targets, parents)."""
        pair, cache, capacity, minimum = self.pair, self.static, self.capacity, self.minimum
        depth_limit = pair.drafter.block_size - 1
        tree, ancestors = build_tree_with_ancestors(static["draft"], budget)
        rows = tree.tokens.shape[0]
        compiled = verify_inputs_on_device(
            tree, static["root"], 0, 0, dtype=pair.dtype, max_depth=depth_limit, ancestors=ancestors, with_mask=False
        )
        begin = static["start"]  # [1]: the root's position and cache slot
        device = begin.device
        positions = begin + tree.depths
        columns = torch.arange(capacity, device=device) - begin  # column - start
        in_tree = (columns >= 0) & (columns < rows)
        visible = (columns < 0) | (compiled.visibility[:, columns.clamp(0, rows - 1)] & in_tree)
        mask = torch.where(visible, 0.0, minimum).to(pair.dtype).view(1, 1, rows, capacity)
        cache.slots = begin + torch.arange(rows, device=device)
        if self.lean is not None:
            library = "cublaslt" if 0 < self.cublaslt_from <= rows else None  # lean.VERIFY_CUBLASLT_FROM_ROWS
            with blas_library(library, device):
                logits, features = self.lean.forward(compiled.input_ids, positions, cache, mask)
        else:
            logits, features = pair.forward(
                compiled.input_ids, positions, cache, {"full_attention": mask, "sliding_attention": mask}
            )
        chosen = torch.argmax(logits, dim=-1)  # once: the walk and the read back share it
        path, accepted, bonus = greedy_walk_on_device(tree, logits, depth_limit, ancestors, chosen)
        head = torch.stack([accepted, bonus]).long()
        packed = torch.cat([head, path, compiled.input_ids, tree.depths, chosen, tree.parents])
        return tree, compiled.visibility, logits, features, path, accepted, bonus, packed

    def _commit_and_draft(self, begin, path, accepted, bonus, features) -> dict:
        """Steps 2 and 3 of :meth:`launch_round`, on the device: the commit (rows ``begin + [0, *accepted]``
        move to ``begin + 0..``, padded with the root's row) and the next draft from the bonus, its context
        the kept rows' features; returns what the next round carries (draft, root, start)."""
        pair, cache, minimum, capacity = self.pair, self.static, self.minimum, self.capacity
        drafter, draft_cache = pair.drafter, self.draft_static
        size, mask_token = drafter.block_size, drafter.config.mask_token_id
        device = begin.device
        kept = torch.cat([torch.zeros(1, dtype=torch.long, device=device), path.clamp(min=0)])
        committed = begin + torch.arange(size, device=device)  # L + 1 rows
        cache.buffer.index_copy_(4, committed, cache.buffer.index_select(4, begin + kept))
        next_start = begin + accepted + 1
        masks = torch.full((size - 1,), mask_token, dtype=torch.long, device=device)
        block = torch.cat([bonus.view(1), masks]).view(1, size)
        draft_positions = torch.cat([committed, next_start + torch.arange(size, device=device)]).view(1, -1)
        draft_columns = torch.arange(capacity + size, device=device)
        draft_visible = (draft_columns < next_start) | (draft_columns >= capacity)
        draft_mask = torch.where(draft_visible, 0.0, minimum).to(pair.dtype).view(1, 1, 1, -1)
        draft_cache.slots = committed
        embeds = pair.target.get_input_embeddings()(block)
        context = features.index_select(0, kept)
        if self.lean_drafter is not None:
            hidden = self.lean_drafter.forward(embeds[0], context, draft_positions[0], draft_cache, draft_mask)
        else:
            hidden = drafter(embeds, context.unsqueeze(0), draft_positions, draft_cache, attention_mask=draft_mask)[0]
        next_draft = pair.target.get_output_embeddings()(hidden[1:])
        return {"draft": next_draft, "root": bonus.view(1), "start": next_start}

    def compact(self, step, start: int, accepted: list[int]) -> None:
        if step is compact_dynamic_cache:  # the spec's own step, done for every layer in one gather
            self.static.keep_rows(start, [0, *accepted])
            return
        self.static.show_rows()
        step(self.static, start, accepted)
        self.static.rows_shown()

    def settings(self) -> dict:
        runner = self.state.runner
        settings = {
            **super().settings(),
            "cuda_graphs": runner.capture,
            "static_kv_cache": True,
            "fused_layers": self.lean is not None,
        }
        if runner.failure:
            settings["cuda_graphs_failure"] = runner.failure
        return settings

    # -- drafter --------------------------------------------------------------------------
    def draft(self, root: int, start: int, context: torch.Tensor, context_start: int, block_offset: int = 0):
        pair, cache, lean_drafter = self.pair, self.draft_static, self.lean_drafter
        drafter, capacity = pair.drafter, self.capacity
        size = drafter.block_size
        block = torch.full((1, size), drafter.config.mask_token_id, dtype=torch.long)
        block[0, 0] = root
        positions = torch.arange(context_start, start + size)
        positions[start - context_start :] += block_offset
        rows = context.shape[0]
        inputs = {
            "block": block,
            "context": context.unsqueeze(0),
            "positions": positions.unsqueeze(0),
            "slots": torch.arange(context_start, start),
            "valid": torch.tensor([start]),
        }
        minimum = self.minimum

        def forward(static):
            cache.slots = static["slots"]
            columns = torch.arange(capacity + size, device=pair.device)
            visible = (columns < static["valid"]) | (columns >= capacity)
            mask = torch.where(visible, 0.0, minimum).to(pair.dtype).view(1, 1, 1, -1)
            embeds = pair.target.get_input_embeddings()(static["block"])
            if lean_drafter is not None:
                hidden = lean_drafter.forward(embeds[0], static["context"][0], static["positions"][0], cache, mask)
            else:
                hidden = drafter(embeds, static["context"], static["positions"], cache, attention_mask=mask)[0]
            return pair.target.get_output_embeddings()(hidden[1:])

        # the first draft of a request reads the whole prompt: a shape seen once, not worth a graph
        first = context_start == 0
        return self.state.runner.run(
            ("draft", rows, capacity, id(cache), lean_drafter is not None),
            forward,
            inputs,
            fill=self.fill,
            capture=not first,
        )
