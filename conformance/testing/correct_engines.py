"""Correct engines that use the spec's freedoms: each must pass every check (the catalogue of
docs/reference/freedoms.md; tests/test_correct_engines.py).

The mutants (:mod:`.mutants`) show that a broken engine fails; these show that a correct engine
doing something the spec allows, which the reference engine does not do, passes. Each one differs
from :class:`~ddtree_conformance.adapters.reference.engine.ReferenceEngine` in one freedom.

Most of them need control the reference's loop does not give, so :class:`.stepped.SteppedEngine` runs the
same spec steps with a request as a generator of engine steps (a prefill chunk or one round per
step), with one hook per freedom. Where a freedom comes from a real engine, its docstring names
the place (repository and path; read, never copied):

* vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``) caps a request's scheduled tokens at
  ``max_model_len - 1 - num_computed_tokens`` and keeps the first draft tokens that fit, preempts
  requests by freeing their KV cache and recomputing it later, and splits prefills into chunks;
  its DDTree proposer (``vllm/v1/spec_decode/ddtree.py``, PR #42910) pads every tree to the budget.
* SGLang's DDTree verify (``python/sglang/srt/speculative/ddtree_info.py``, PR #29907) appends
  accepted tokens one by one, stopping at a finished request, and counts every accepted draft;
  its KV compaction (``ddtree_utils.py``) copies rows one by one.
* z-lab's ``dflash_generate`` (``dflash/model.py``) runs the last drafter block cut to the room
  left, reports the tokens each round produced, and verifies DFlash at T > 0 by rejection
  sampling the drafter's sampled block.
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from dataclasses import replace

import torch

from ddtree_conformance.adapters.interface import Capabilities, Request, RequestResult
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.spec import build_chain, choose_token, processed_probs
from ddtree_conformance.spec.tree import DraftTree
from ddtree_conformance.spec.walk import WalkResult

from .stepped import SteppedEngine, first_nodes, renumbered, shallower

__all__ = ["CORRECT_ENGINES"]


# ---------------------------------------------------------------------------- the catalogue
class RoomLeftBlockEmitted(SteppedEngine):
    """Near the end of the output, the drafter runs a block cut to the room left (root + one mask per
    token the output can still take), and each round reports the tokens it emitted (z-lab's
    ``dflash_generate``: ``verify_size = min(block_size, max_length - start)``, ``produced``)."""

    name = "correct-room-left-block-emitted"
    report_emitted = True

    def drafted_rows(self, room: int, block: int) -> int:
        return min(block, room)


class RoomLeftBlockClaimed(RoomLeftBlockEmitted):
    """The same cut block, each round reporting the length its walk accepted, past the output's end
    too (SGLang's DDTree verify counts every accepted draft in ``num_correct_drafts``)."""

    name = "correct-room-left-block-claimed"
    report_emitted = False


class UnemittableNodesDropped(SteppedEngine):
    """The drafter runs its whole block; nodes the output has no room for (depth >= tokens left) are
    left out of the verify batch, down to a root-only round for the last token; emitted lengths."""

    name = "correct-unemittable-nodes-dropped"
    report_emitted = True

    def cut(self, tree, room, start, config):
        return shallower(tree, room - 1)


class DraftsDroppedInCompany(SteppedEngine):
    """In an engine call holding two requests or more, every third round verifies the root alone, its
    drafts dropped: a scheduler whose step's token budget runs out beside other requests' long prefills
    schedules the root without its draft tokens (vLLM on CPU does so in the context-range check's call:
    rounds of length 1, ``scripts/vllm_context_probe.py``). Alone it is the reference. Its outputs are
    the reference's; in company its rounds are shorter than the fp32 replay's, never longer."""

    name = "correct-drafts-dropped-in-company"
    every = 3

    def generate_local(self, requests, config):
        self._in_company, self._rounds = len(requests) > 1, 0
        try:
            return super().generate_local(requests, config)
        finally:
            self._in_company = False

    def cut(self, tree, room, start, config):
        if not getattr(self, "_in_company", False):
            return tree
        self._rounds += 1
        return first_nodes(tree, 0) if self._rounds % self.every == 0 else tree


class EmittableDepthBudgetSpent(SteppedEngine):
    """Near the output's end the tree is capped at the depth the output can still emit (``room - 1``) and
    its budget spent on the nodes it can emit: the B most probable prefixes no deeper than that, built
    from the drafter's first positions (a DDTree engine that knows its length limit wastes no node)."""

    name = "correct-emittable-depth-budget-spent"
    report_emitted = True

    def tree_depth(self, room: int, rows: int) -> int:
        return max(1, min(rows, room - 1))


class ContextFullTreeCut(SteppedEngine):
    """Near the context's end the verify batch must fit the KV slots left, counted flat (one slot per
    node): the tree keeps its first ``max_context - 2 - start`` nodes in pop order, none at the very
    end (rounds without a tree); vLLM's scheduler caps scheduled tokens at ``max_model_len - 1 -
    num_computed_tokens`` and keeps the first draft tokens."""

    name = "correct-context-full-tree-cut"

    def cut(self, tree, room, start, config):
        return first_nodes(tree, self.info.max_position_embeddings - 2 - start)


def _reversed_ties_topk(draft_logits: torch.Tensor, k: int) -> tuple[list, list]:
    """Per depth, the top ``k`` log-probs and tokens, equal log-probs ranked by the larger token id."""
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1) + 0.0
    vocab = log_probs.shape[1]
    # sort by (log-prob descending, token id descending): a stable sort on the ids reversed
    flipped = torch.flip(log_probs, dims=[1])
    order = torch.sort(flipped, dim=1, descending=True, stable=True).indices[:, :k]
    ids = (vocab - 1) - order
    return torch.gather(log_probs, 1, ids).double().tolist(), ids.tolist()


def reversed_ties_tree(draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """The B most probable prefixes (a DDTree), equal scores broken the other way: larger token ids
    first within a depth, and the lexicographically larger rank tuple first among prefixes."""
    depth_limit, vocab = draft_logits.shape
    k = min(budget, vocab)
    lp, ids = _reversed_ties_topk(draft_logits, k)
    heap = [(-lp[0][0], (0,), 0, 1, 0, 0.0)]  # rank tuples stored negated: larger first on equal scores
    nodes: list[tuple] = []
    while heap and len(nodes) < budget:
        neg_score, rank_key, parent, depth, rank, parent_score = heapq.heappop(heap)
        node = len(nodes) + 1
        nodes.append((ids[depth - 1][rank], depth, parent, rank, -neg_score))
        if rank + 1 < k:
            s = parent_score + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-s, rank_key[:-1] + (-(rank + 1),), parent, depth, rank + 1, parent_score))
        if depth < depth_limit:
            s = -neg_score + lp[depth][0]
            heapq.heappush(heap, (-s, rank_key + (0,), node, depth + 1, 0, -neg_score))
    tokens, depths, parents, ranks, scores = (list(column) for column in zip(*nodes)) if nodes else ([],) * 5
    device = draft_logits.device
    return DraftTree(
        tokens=torch.tensor([-1, *tokens], device=device),
        depths=torch.tensor([0, *depths], device=device),
        parents=torch.tensor([-1, *parents], device=device),
        ranks=torch.tensor([-1, *ranks], device=device),
        scores=torch.tensor([0.0, *scores], dtype=torch.float64, device=device),
    )


class TiesBrokenTheOtherWay(SteppedEngine):
    """Equal log-probs and equal prefix scores broken the other way in the builder (larger token id,
    larger rank tuple first), and the DFlash chain's argmax ties too; frequent in bf16/fp16."""

    name = "correct-ties-broken-the-other-way"

    def build(self, draft_logits, config, params, generator):
        if config.mode == "dflash":
            _, ids = _reversed_ties_topk(draft_logits, 1)
            return replace(
                build_chain(draft_logits),
                tokens=torch.tensor([-1] + [row[0] for row in ids], device=draft_logits.device),
            )
        return reversed_ties_tree(draft_logits, config.budget)


class NodesDeepestFirst(SteppedEngine):
    """The verify batch holds the root, then the nodes from the deepest to the shallowest (children
    before their parents); traces report that numbering."""

    name = "correct-nodes-deepest-first"

    def layout(self, tree):
        depths = tree.depths.tolist()
        order = sorted(range(1, len(depths)), key=lambda i: (-depths[i], i))
        return renumbered(tree, [0] + order)


class NodesBreadthFirst(SteppedEngine):
    """The verify batch holds the nodes level by level, each level by token id (parents first, but
    not in pop order); traces report that numbering."""

    name = "correct-nodes-breadth-first"

    def layout(self, tree):
        depths, tokens = tree.depths.tolist(), tree.tokens.tolist()
        return renumbered(tree, [0] + sorted(range(1, len(depths)), key=lambda i: (depths[i], tokens[i], i)))


class RejectionSampledChain(SteppedEngine):
    """DFlash at T > 0: the block's drafts are sampled from the drafter's processed distribution and
    verified by rejection sampling (accept a draft with probability min(1, p/q), else sample the
    residual max(p - q, 0)), as z-lab's ``dflash_generate`` does; lossless in distribution, not the
    reference's walk. DDTree and greedy requests run as the reference."""

    name = "correct-rejection-sampled-chain"

    def build(self, draft_logits, config, params, generator):
        if config.mode != "dflash" or params.greedy:
            return super().build(draft_logits, config, params, generator)
        probs = torch.stack([processed_probs(row, params) for row in draft_logits])
        tokens = [int(torch.multinomial(row, 1, generator=generator)) for row in probs]
        chain = build_chain(draft_logits)
        return replace(chain, tokens=torch.tensor([-1] + tokens, device=draft_logits.device))

    def walk(self, tree, logits, params, generator, draft):
        if tree.num_nodes == 0 or params.greedy or any(len(c) > 1 for c in tree.children):
            return super().walk(tree, logits, params, generator, draft)
        tokens = tree.tokens.tolist()
        accepted, chosen = [], {}
        for node in range(1, tree.num_nodes + 1):
            p = processed_probs(logits[node - 1], params)
            q = processed_probs(draft["logits"][node - 1], params)
            token = tokens[node]
            u = float(torch.rand((), generator=generator, device=p.device))
            if u * float(q[token]) < float(p[token]):
                chosen[node - 1] = token
                accepted.append(node)
                continue
            residual = (p - q).clamp_min(0.0)
            residual = residual / residual.sum() if float(residual.sum()) > 0 else p
            bonus = int(torch.multinomial(residual, 1, generator=generator))
            chosen[node - 1] = bonus
            return WalkResult(accepted, bonus, chosen)
        bonus = int(torch.multinomial(processed_probs(logits[tree.num_nodes], params), 1, generator=generator))
        chosen[tree.num_nodes] = bonus
        return WalkResult(accepted, bonus, chosen)


def _exponential_race(probs: torch.Tensor, generator) -> int:
    """One sample of ``probs`` as the first of independent exponential clocks (Gumbel-max in disguise)."""
    clocks = torch.empty_like(probs).exponential_(generator=generator)
    return int(torch.argmax(probs / clocks))


class OtherRandomStream(SteppedEngine):
    """Samples from another random stream: the generator seeded by a hash of the request's seed, and
    every sample drawn by an exponential race instead of ``torch.multinomial``."""

    name = "correct-other-random-stream"

    def rng(self, pair, request):
        seed = (request.seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) % (1 << 63)
        return torch.Generator(device=pair.device).manual_seed(seed)

    def choose(self, logits, params, generator):
        return (
            choose_token(logits, params)
            if params.greedy
            else _exponential_race(processed_probs(logits, params), generator)
        )

    def walk(self, tree, logits, params, generator, draft):
        if params.greedy:
            return super().walk(tree, logits, params, generator, draft)
        children, accepted, chosen, node = tree.children, [], {}, 0
        while True:
            token = self.choose(logits[node], params, generator)
            chosen[node] = token
            child = children[node].get(token)
            if child is None:
                return WalkResult(accepted, token, chosen)
            accepted.append(child)
            node = child


class ContinuousBatching(SteppedEngine):
    """Requests of one call advance one engine step at a time, at most two in flight, a new one
    admitted when one finishes; prompts are prefilled in chunks of 5 tokens between other requests'
    rounds (vLLM's scheduler: chunked prefill, ``max_num_seqs``)."""

    name = "correct-continuous-batching"
    prefill_chunk = 5
    max_running = 2

    def admission_order(self, requests: list[Request]) -> list[int]:
        return list(range(len(requests)))

    def generate_local(self, requests, config):
        if config.mode == "plain":
            return super().generate_local(requests, config)
        pair = self._pair(config)
        results: list[RequestResult | None] = [None] * len(requests)
        waiting = []
        for index in self.admission_order(requests):
            problem = self._request_problem(requests[index])
            if problem:
                results[index] = RequestResult(
                    output_ids=[], finish_reason="error", error=f"request {index}: {problem}"
                )
            else:
                waiting.append(index)
        running: list[tuple[int, Generator]] = []
        with torch.inference_mode():
            while waiting or running:
                while waiting and len(running) < self.max_running:
                    index = waiting.pop(0)
                    running.append((index, self.request_steps(pair, requests[index], config)))
                for index, steps in list(running):  # one engine step: one prefill chunk or round per request
                    try:
                        next(steps)
                    except StopIteration as done:
                        results[index] = done.value
                        running.remove((index, steps))
        return results


class BatchesByLength(ContinuousBatching):
    """Batches formed another way: requests admitted longest prompt first, three in flight, results
    returned in request order; whole prompts prefilled at once."""

    name = "correct-batches-by-length"
    prefill_chunk = None
    max_running = 3

    def admission_order(self, requests):
        return sorted(range(len(requests)), key=lambda i: (-len(requests[i].prompt_ids), i))


class PreemptedAndRecomputed(SteppedEngine):
    """Every third round the request is preempted: its target and drafter KV caches are freed and
    recomputed from the prompt and the output so far before the next round (vLLM's preemption keeps
    the output tokens and recomputes the KV cache)."""

    name = "correct-preempted-and-recomputed"
    preempt_every = 3


class StopCutEmitted(SteppedEngine):
    """A stop token inside an accepted path ends the output there, and the round reports the tokens it
    emitted up to the stop (z-lab cuts ``produced`` at the first stop token; SGLang checks each
    appended token); the reference reports the walked length."""

    name = "correct-stop-cut-emitted"
    report_emitted = True


def _copy_rows(cache, prefix_len: int, accepted) -> None:
    """KV compaction by copying each kept row to its slot, one row at a time (SGLang's row copies),
    instead of one ``index_select``; rows move only toward the prefix, so no row is overwritten
    before it is read."""
    rows = [0, *accepted]
    for layer in cache.layers:
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            for slot, row in enumerate(rows):
                if row != slot:
                    tensor[:, :, prefix_len + slot].copy_(tensor[:, :, prefix_len + row])
            setattr(layer, name, tensor[:, :, : prefix_len + len(rows)])


class KvCompactionByRowCopies(SteppedEngine):
    """KV compaction by copying rows one by one into place (see :func:`_copy_rows`)."""

    name = "correct-kv-compaction-by-row-copies"
    compact_step = staticmethod(_copy_rows)


class VerifyBatchPadded(SteppedEngine):
    """The verify batch is padded to a multiple of 8 rows (captured graph sizes; vLLM's DDTree
    proposer pads trees to the budget): pad rows carry token 0 at the root's position, see the prefix
    and themselves, and no tree row sees them; their outputs are dropped."""

    name = "correct-verify-batch-padded"
    multiple = 8

    def verify(self, pair, tree, root, start, cache):
        verify = self.compile_step(tree, root, start, dtype=pair.dtype)
        n = verify.input_ids.shape[0]
        pad = -n % self.multiple
        if pad == 0:
            return super().verify(pair, tree, root, start, cache)
        device, low = verify.input_ids.device, torch.finfo(pair.dtype).min
        ids = torch.cat([verify.input_ids, torch.zeros(pad, dtype=torch.long, device=device)])
        positions = torch.cat([verify.position_ids, torch.full((pad,), start, dtype=torch.long, device=device)])
        mask = verify.attention_mask[0, 0]
        prefix = mask.shape[1] - n
        full = torch.full((n + pad, prefix + n + pad), low, dtype=mask.dtype, device=device)
        full[:n, : prefix + n] = mask
        full[n:, :prefix] = 0
        full[n:, prefix + n :] = torch.where(torch.eye(pad, dtype=torch.bool, device=device), 0.0, low)
        logits, features = pair.forward(ids, positions, cache, full.view(1, 1, n + pad, -1))
        return verify, logits[:n], features[:n]


class OutputsOnly(ReferenceEngine):
    """An honest black box: outputs and finish reasons only; its capabilities promise no traces,
    no per-round acceptance and no timings, and its results carry none."""

    name = "correct-outputs-only"

    def capabilities(self) -> Capabilities:
        return (
            super()
            .capabilities()
            .model_copy(
                update={
                    "traces": False,
                    "per_round_acceptance": False,
                    "draft_logits": False,
                    "stage_timings": False,
                    "verified_tree_modes": [],
                }
            )
        )

    def generate(self, requests, config):
        results = super().generate(requests, config.model_copy(update={"trace": False, "timing": False}))
        return [
            r if r.error else RequestResult(output_ids=r.output_ids, finish_reason=r.finish_reason) for r in results
        ]


CORRECT_ENGINES: dict[str, type] = {
    "room-left block, emitted lengths": RoomLeftBlockEmitted,
    "room-left block, claimed lengths": RoomLeftBlockClaimed,
    "unemittable nodes dropped (root-only last round)": UnemittableNodesDropped,
    "tree capped at the emittable depth, budget spent there": EmittableDepthBudgetSpent,
    "tree cut to the context's KV slots (rounds without a tree)": ContextFullTreeCut,
    "drafts dropped in a busy call (root-only rounds)": DraftsDroppedInCompany,
    "ties broken the other way": TiesBrokenTheOtherWay,
    "nodes deepest first": NodesDeepestFirst,
    "nodes breadth first": NodesBreadthFirst,
    "rejection-sampled DFlash chain": RejectionSampledChain,
    "other random stream": OtherRandomStream,
    "continuous batching, chunked prefill": ContinuousBatching,
    "batches by prompt length": BatchesByLength,
    "preempted and recomputed": PreemptedAndRecomputed,
    "stop cut, emitted lengths": StopCutEmitted,
    "KV compaction by row copies": KvCompactionByRowCopies,
    "verify batch padded": VerifyBatchPadded,
    "outputs only": OutputsOnly,
}
