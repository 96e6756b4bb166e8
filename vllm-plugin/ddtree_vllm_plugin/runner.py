"""The DDTree model runner: vLLM 0.32's CPU runner with the five DDTree steps added.

One verification round of a request, as the V1 runner runs it (doc §3 names in brackets):

1. ``propose`` (:class:`TreeDrafter`): the DFlash drafter gives per-depth logits [L, V] in one
   pass; :func:`~.tree.best_first_tree` keeps the B best prefixes [build]. The nodes, in build
   order, are the request's B "speculative tokens", so the scheduler schedules root + nodes with
   consecutive KV slots ``start .. start+B``; any prefix of that order is a valid tree.
2. ``_prepare_inputs``: after vLLM computed slots from consecutive positions, node ``i`` gets the
   RoPE position ``start + depth(i)`` [positions]; :meth:`node_positions`.
3. ``_build_attention_metadata``: the tree rows and the ancestor-or-self visibility ride on the
   target's attention metadata to :class:`~.attention.TreeAttentionImpl` [mask].
4. ``rejection_sampler`` (:class:`TreeSampler`): walk each tree from the root while the target's
   token (argmax, or a sample after temperature/top-k/top-p) is a child [walk]; emit
   ``[accepted..., bonus]`` padded with -1, the format vLLM's scheduler consumes; then move the
   accepted nodes' K/V from slots ``start + node`` to ``start + 1 + j`` [compact],
   :meth:`compact_kv`. Rejected slots are released as in linear speculation.
5. The drafter gets the root's and accepted nodes' target hidden states, selected by node index
   and given consecutive positions, with the rejected rows at the end as padding [feedback].

The steps a broken integration gets wrong (:meth:`node_positions`, :meth:`compact_kv`) are
methods, so the suite's deliberately broken builds override exactly one of them.

Budgets. The instance's ``num_speculative_tokens`` is the largest budget; each request builds its
trees at its own budget (:meth:`DDTreeCPUModelRunner.budget_of`, default the instance's), and
:meth:`DDTreeCPUModelRunner.take_draft_token_ids` hands the scheduler only the nodes built, so a
request at budget ``b`` is verified exactly as on an instance started with ``b``.
"""

from __future__ import annotations

import json
import threading

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.spec_decode.dflash import DFlashProposer
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from .attention import UNSUPPORTED_LAYER_FEATURES, TreeAttentionImpl, TreeRows
from .config import DDTreeConfigError, DDTreeOptions, request_options
from .tree import NodeSampler, Tree, best_first_tree, visibility, walk

__all__ = ["DDTreeCPUModelRunner", "TreeDrafter", "TreeSampler", "per_layer_context_k_norm", "logits_path"]

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID for padding sampled-token rows


def per_layer_context_k_norm(model):
    """A replacement for ``DFlashQwen3Model._normalize_context_k`` that applies each layer's own
    K-norm weight.

    vLLM 0.32 normalises the drafter's context keys of all layers in one ``ops.rms_norm`` call with
    the stacked ``[layers, head_dim]`` weight; the CPU op applies layer 0's weight to every layer
    (measured on the fixture drafter: emulating that reproduces vLLM's drafter logits to 7.8e-6,
    while the per-layer norm is 0.27 away). Draft quality only, so vLLM stays lossless, but its
    trees then differ from the reference's. The DDTree runner installs this on its own drafter
    instance; stock vLLM is untouched.
    """

    def normalize(all_k: torch.Tensor) -> torch.Tensor:  # [layers, ctx, kv_heads, head_dim]
        weights = model._k_norm_weights.to(torch.float32)
        x = all_k.to(torch.float32)
        normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + model._rms_norm_eps)
        return (normed * weights[:, None, None, :]).to(all_k.dtype)

    return normalize


class TreeDrafter(DFlashProposer):
    """The stock DFlash proposer, asked for L positions, returning best-first trees of B nodes.

    Installed by changing the class of the runner's proposer, so vLLM's ``isinstance`` checks
    still hold and no second set of buffers is allocated.
    """

    ddtree_runner: DDTreeCPUModelRunner

    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        self._ddtree_logits = self.model.compute_logits(hidden_states)
        return self._ddtree_logits.argmax(dim=-1), None

    def propose(
        self,
        num_speculative_tokens,
        target_token_ids,
        target_positions,
        target_hidden_states,
        next_token_ids,
        token_indices_to_sample,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu=None,
        slot_mappings=None,
    ):
        runner = self.ddtree_runner
        feedback = runner.take_feedback(int(target_hidden_states.shape[0]))
        if feedback is not None:
            order, positions = feedback
            target_hidden_states = target_hidden_states[order]
            target_token_ids = target_token_ids[order]
            target_positions = positions
        horizon = runner.horizon
        super().propose(
            horizon,
            target_token_ids,
            target_positions,
            target_hidden_states,
            next_token_ids,
            token_indices_to_sample,
            common_attn_metadata,
            sampling_metadata,
            mm_embed_inputs,
            num_rejected_tokens_gpu,
            slot_mappings,
        )
        batch = common_attn_metadata.num_reqs
        logits = self._ddtree_logits.view(batch, horizon, -1)
        width = max(int(num_speculative_tokens), 0)
        out = torch.zeros(batch, width, dtype=torch.int64)
        req_ids = runner.input_batch.req_ids[:batch]
        for i, req_id in enumerate(req_ids):
            tree = best_first_tree(logits[i], runner.budget_of(req_id))
            runner.trees[req_id] = tree
            if runner.traces_draft_logits(req_id):
                runner.draft_logits[req_id] = logits[i].float().clone()
            nodes = tree.tokens[1 : width + 1]
            out[i, : len(nodes)] = torch.tensor(nodes, dtype=torch.int64)
            runner.drafted[req_id] = len(nodes)
        self.num_speculative_tokens = runner.budget
        return out


class TreeSampler(torch.nn.Module):
    """Replaces the rejection sampler: walks each request's tree (same call signature)."""

    def __init__(self, runner: DDTreeCPUModelRunner) -> None:
        super().__init__()
        self.runner = runner

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        return self.runner.walk_trees(metadata, logits, sampling_metadata)


class DDTreeCPUModelRunner(CPUModelRunner):
    """See the module doc."""

    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        raw = (vllm_config.additional_config or {}).get("ddtree") or {}
        self.ddtree_options = DDTreeOptions(**raw)
        spec = vllm_config.speculative_config
        self.budget = int(spec.num_speculative_tokens)
        hf = spec.draft_model_config.hf_config
        block = getattr(hf, "block_size", None) or (getattr(hf, "dflash_config", None) or {}).get("block_size")
        self.horizon = int(block) - 1
        if not isinstance(self.drafter, DFlashProposer):
            raise DDTreeConfigError(f"DDTree: expected vLLM's DFlash proposer, found {type(self.drafter).__name__}")
        self.drafter.__class__ = TreeDrafter
        self.drafter.ddtree_runner = self
        self.rejection_sampler = TreeSampler(self)
        self.trees: dict[str, Tree] = {}  # req_id -> tree proposed for its next round
        self.drafted: dict[str, int] = {}  # req_id -> nodes drafted in this step (trims the scheduler's drafts)
        self.draft_logits: dict[str, torch.Tensor] = {}  # req_id -> its drafter logits (traces only)
        self._batch: list[TreeRows] = []  # trees verified in the current step
        self._sequential_positions: torch.Tensor | None = None
        self._feedback: tuple[torch.Tensor, torch.Tensor] | None = None
        self._target_layers: list[str] = []
        self._trace_lock = threading.Lock()

    # -- model --------------------------------------------------------------------------------
    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        from vllm.model_executor.layers.attention import Attention

        drafter_modules = {id(m) for m in self.drafter.model.modules()} if hasattr(self.drafter, "model") else set()
        for name, module in self.model.named_modules():
            if not isinstance(module, Attention) or id(module) in drafter_modules:
                continue
            impl = module.impl
            if type(impl).__name__ != "CPUAttentionBackendImpl" and not isinstance(impl, TreeAttentionImpl):
                raise DDTreeConfigError(
                    f"DDTree: target layer {name} uses {type(impl).__name__}; only vLLM's CPU "
                    f"attention backend is supported"
                )
            for feature, present in UNSUPPORTED_LAYER_FEATURES.items():
                if present(impl):
                    raise DDTreeConfigError(
                        f"DDTree: target layer {name} uses {feature}, which tree attention does not support"
                    )
            impl.__class__ = TreeAttentionImpl
            self._target_layers.append(module.layer_name)
        if not self._target_layers:
            raise DDTreeConfigError("DDTree: found no attention layers in the target model")
        inner = getattr(getattr(self.drafter, "model", None), "model", None)
        if inner is not None and hasattr(inner, "_normalize_context_k"):
            inner._normalize_context_k = per_layer_context_k_norm(inner)

    # -- per-request settings (SamplingParams.extra_args["ddtree"], checked when the request arrived) --
    def _request_options(self, req_id: str):
        state = self.requests.get(req_id)
        return request_options(getattr(state, "sampling_params", None))

    def budget_of(self, req_id: str) -> int:
        """The request's budget: its own (``extra_args``), else the instance's ``num_speculative_tokens``."""
        own = self._request_options(req_id).budget
        return self.budget if own is None else min(int(own), self.budget)

    def traces_draft_logits(self, req_id: str) -> bool:
        own = self._request_options(req_id).trace_draft_logits
        return self.ddtree_options.trace_draft_logits if own is None else bool(own)

    def take_draft_token_ids(self):
        """vLLM's drafts, each request's row cut to the nodes its tree has (the drafter's output is
        as wide as the instance's budget). Rows the drafter did not fill this step (it was skipped
        near max_model_len: all zeros) keep the request's budget, as on an instance started with it."""
        drafts = super().take_draft_token_ids()
        if drafts is None:
            return None
        drafts.draft_token_ids = [
            list(ids[: self.drafted[req_id] if req_id in self.drafted else self.budget_of(req_id)])
            for req_id, ids in zip(drafts.req_ids, drafts.draft_token_ids)
        ]
        return drafts

    def _update_states(self, scheduler_output):
        for req_id in getattr(scheduler_output, "finished_req_ids", ()) or ():
            self.trees.pop(req_id, None)
            self.draft_logits.pop(req_id, None)
        return super()._update_states(scheduler_output)

    # -- step 2: node positions --------------------------------------------------------------
    def node_positions(self, start: int, tree: Tree, n: int) -> list[int]:
        """RoPE positions of nodes 1..n: the root's position plus the node's depth."""
        return [start + tree.depths[i] for i in range(1, n + 1)]

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        logits_indices, spec_metadata, max_sampled = super()._prepare_inputs(scheduler_output, num_scheduled_tokens)
        self._batch = []
        self._feedback = None
        self.drafted = {}
        total = int(scheduler_output.total_num_scheduled_tokens)
        self._sequential_positions = self.positions[:total].clone()
        if spec_metadata is None:
            return logits_indices, spec_metadata, max_sampled
        starts = self.query_start_loc.np
        for i, n in enumerate(spec_metadata.num_draft_tokens):
            if n == 0:
                continue
            req_id = self.input_batch.req_ids[i]
            tree = self.trees.get(req_id)
            scheduled = list(scheduler_output.scheduled_spec_decode_tokens.get(req_id, []))
            if tree is None or tree.tokens[1 : n + 1] != scheduled:
                # vLLM schedules placeholder drafts (zeros) when the drafter was skipped, e.g. near
                # max_model_len (``GPUModelRunner.sample_tokens``): verify them as a chain.
                tree = Tree([-1, *scheduled], [-1, *range(n)], list(range(n + 1)))
                self.trees[req_id] = tree
            tree = tree.truncated(n)
            root_row = int(starts[i + 1]) - n - 1
            start = int(self.positions[root_row])
            rows = slice(root_row + 1, root_row + 1 + n)
            self.positions[rows] = torch.tensor(self.node_positions(start, tree, n), dtype=self.positions.dtype)
            self._batch.append(
                TreeRows(
                    req_index=i,
                    root_row=root_row,
                    start=start,
                    parents=tree.parents,
                    visible=visibility(start, tree.parents),
                )
            )
        return logits_indices, spec_metadata, max_sampled

    # -- step 3: the mask ----------------------------------------------------------------------
    def _build_attention_metadata(self, *args, **kwargs):
        attn_metadata, spec_common = super()._build_attention_metadata(*args, **kwargs)
        if isinstance(attn_metadata, list):
            raise DDTreeConfigError("DDTree: micro-batching (ubatches) is not supported")
        if self._batch and not kwargs.get("for_cudagraph_capture", False):
            seen: set[int] = set()
            for name in self._target_layers:
                metadata = attn_metadata.get(name)
                if metadata is not None and id(metadata) not in seen:
                    seen.add(id(metadata))
                    metadata.ddtree_batch = self._batch
                    for tree in self._batch:
                        tree.block_row = metadata.block_table[tree.req_index].clone()
        return attn_metadata, spec_common

    # -- step 4: walk, emit, compact -------------------------------------------------------------
    def _node_sampler(self, i: int, sampling_metadata) -> NodeSampler:
        batch = self.input_batch
        top_k = int(batch.top_k_cpu[i])
        return NodeSampler(
            float(batch.temperature_cpu[i]),
            0 if top_k >= batch.vocab_size else top_k,
            float(batch.top_p_cpu[i]),
            sampling_metadata.generators.get(i),
        )

    def walk_trees(self, metadata, logits, sampling_metadata) -> SamplerOutput:
        trees = {t.req_index: t for t in self._batch}
        num_reqs = len(metadata.num_draft_tokens)
        out = torch.full((num_reqs, metadata.max_spec_len + 1), PLACEHOLDER, dtype=torch.int32)
        order_rows, order_positions = [], []
        offset = 0
        query_starts = self.query_start_loc.np
        moves: list[tuple[int, list[int], list[int]]] = []
        traces = []
        for i, n in enumerate(metadata.num_draft_tokens):
            rows = logits[offset : offset + n + 1]
            offset += n + 1
            choose = self._node_sampler(i, sampling_metadata)
            seg_start, seg_end = int(query_starts[i]), int(query_starts[i + 1])
            order = list(range(seg_start, seg_end))
            positions = self._sequential_positions[seg_start:seg_end].tolist()
            if n == 0:
                token = choose(rows[0])
                out[i, 0] = token
            else:
                info = trees[i]
                tree = self.trees[self.input_batch.req_ids[i]].truncated(n)
                accepted, targets, bonus = walk(tree, rows, choose)
                tokens = [tree.tokens[a] for a in accepted] + [bonus]
                out[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
                root_row = info.root_row
                keep = [root_row + a for a in accepted]
                rest = [r for r in range(root_row + 1, seg_end) if r not in set(keep)]
                order = list(range(seg_start, root_row + 1)) + keep + rest
                moves.append(
                    (i, [info.start + a for a in accepted], [info.start + 1 + j for j in range(len(accepted))])
                )
                # A request prefilled in a step where others verify trees gets placeholder drafts
                # (-1) from vLLM; that step's root is the prompt's last token: it is the prefill,
                # whose token is not a round, so it gets no trace line.
                prefill = info.start < int(self.input_batch.num_prompt_tokens[i])
                if self.ddtree_options.trace_path and not prefill:
                    traces.append(self._trace(i, info, tree, rows, accepted, targets, bonus))
            order_rows += order
            order_positions += positions
        self._feedback = (torch.tensor(order_rows, dtype=torch.long), torch.tensor(order_positions, dtype=torch.int64))
        self.compact_kv(moves)
        if traces:
            self._write_traces(traces)
        return SamplerOutput(sampled_token_ids=out, logprobs_tensors=None)

    def compact_kv(self, moves: list[tuple[int, list[int], list[int]]]) -> None:
        """Copy each accepted node's K/V from sequence index ``src`` to ``dst`` (same request)."""
        context = self.compilation_config.static_forward_context
        rows_of = {t.req_index: t.block_row for t in self._batch}
        for req_index, src, dst in moves:
            pairs = [(s, d) for s, d in zip(src, dst) if s != d]
            if not pairs:
                continue
            for name in self._target_layers:
                layer = context[name]
                kv_cache = layer.kv_cache
                block_size = kv_cache.shape[2]
                table = rows_of[req_index]
                src_seq = torch.tensor([s for s, _ in pairs])
                dst_seq = torch.tensor([d for _, d in pairs])
                src_slots = table[src_seq // block_size].long() * block_size + src_seq % block_size
                dst_slots = table[dst_seq // block_size].long() * block_size + dst_seq % block_size
                shadow = layer.impl.shadow(kv_cache)
                rows = shadow[src_slots].clone()
                layer.impl.do_kv_cache_update(
                    layer, rows[:, 0].contiguous(), rows[:, 1].contiguous(), kv_cache, dst_slots
                )

    # -- step 5: drafter feedback ----------------------------------------------------------------
    def take_feedback(self, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        feedback, self._feedback = self._feedback, None
        if feedback is None:
            return None
        order, positions = feedback
        if order.numel() != rows:
            raise RuntimeError(f"DDTree: drafter got {rows} target rows, the walk ordered {order.numel()}")
        return order, positions

    # -- traces --------------------------------------------------------------------------------------
    def _trace(self, i, info: TreeRows, tree: Tree, rows, accepted, targets, bonus) -> dict:
        path = [0, *accepted]
        top2 = torch.topk(rows.float(), 2, dim=-1).values
        root_token = int(self.input_ids.cpu[info.root_row])
        return {
            "req_id": self.input_batch.req_ids[i],
            "start": info.start,
            "root_token": root_token,
            "tree_tokens": [root_token] + tree.tokens[1:],
            "parents": tree.parents,
            "depths": tree.depths,
            "positions": [info.start] + self.node_positions(info.start, tree, tree.size),
            "accepted": accepted,
            "target_tokens": targets,
            "bonus": bonus,
            "top2_margins": [float(top2[p, 0] - top2[p, 1]) for p in path],
            "node_target_tokens": rows.argmax(dim=-1).tolist(),
            "draft_logits": (
                self.draft_logits[self.input_batch.req_ids[i]]
                if self.traces_draft_logits(self.input_batch.req_ids[i])
                else None
            ),
        }

    def _write_traces(self, traces: list[dict]) -> None:
        """One JSON line per tree; drafter logits as float32 bytes in ``<trace_path>.logits``, the line
        giving where (``draft_logits_f32``: byte offset and shape): as JSON they cost ~20 bytes a
        value to write and parse, and a traced run carries tens of millions of them."""
        path = self.ddtree_options.trace_path
        with self._trace_lock, open(path, "a", encoding="utf-8") as fh, open(logits_path(path), "ab") as raw:
            for trace in traces:
                logits = trace.pop("draft_logits")
                trace["draft_logits"] = None
                if logits is not None:
                    data = logits.to(torch.float32).contiguous().numpy()
                    trace["draft_logits_f32"] = {"offset": raw.tell(), "shape": list(data.shape)}
                    raw.write(data.astype("<f4", copy=False).tobytes())
                fh.write(json.dumps(trace) + "\n")
            raw.flush()
            fh.flush()


def logits_path(trace_path: str) -> str:
    """Where the drafter logits of the traces in ``trace_path`` go (float32, little-endian)."""
    return trace_path + ".logits"
