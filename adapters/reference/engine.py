"""The reference engine: the spec functions driving a transformers target and the DFlash drafter.

It is the yardstick the other engines are measured against, so it does nothing clever: each
request runs on its own (batch size 1 inside, any batch size outside), every round calls the
spec's build -> compile -> verify -> walk -> commit in that order, and traces record exactly what
was run.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version

import torch

from ddtree_conformance.spec import (
    SamplingParams,
    build_chain,
    build_tree,
    choose_token,
    compact_dynamic_cache,
    compile_tree,
    emit_tokens,
    select_feedback_rows,
    top2_margin,
    walk_tree,
)

from ..interface import Capabilities, Engine, EngineError, Request, RequestResult, RoundTrace, RunConfig, Timings
from ..options import cuda_device_count
from .pair import (
    TORCH_DTYPES,
    load_drafter_checked,
    load_target,
    read_drafter_config,
    read_target_info,
    validate_pair,
)
from .clock import DecodeClock as _Clock
from .tensor_parallel import RankGroup, local_device, shardable_sizes

__all__ = ["ReferenceEngine", "MAX_BUDGET"]

# The verify batch is B + 1 tokens with a (B + 1) x (context + B + 1) mask, so memory grows with B^2;
# the paper sweeps B up to 1024. Larger budgets are refused up front rather than by the allocator.
MAX_BUDGET = 4096


class _LoadedPair:
    """Target (+ drafter) loaded for one (dtype, device), with hooks capturing drafter features."""

    def __init__(self, target, info, drafter, dtype: torch.dtype, device: str):
        self.device = torch.device(device)
        self.dtype = dtype
        self.target, self.info, self.drafter = target, info, drafter
        self._features: dict[int, torch.Tensor] = {}
        if drafter is not None:
            layers = self.target.model.layers
            for layer_id in drafter.config.target_layer_ids:
                layers[layer_id].register_forward_hook(self._capture(layer_id))

    @classmethod
    def load(cls, model_dir: str, drafter_dir: str | None, dtype: torch.dtype, device: str,
             tensor_parallel_size: int = 1) -> "_LoadedPair":
        target, info = load_target(model_dir, dtype, device, tensor_parallel_size)
        drafter = None if drafter_dir is None else load_drafter_checked(drafter_dir, info, dtype, device)
        return cls(target, info, drafter, dtype, device)

    def _capture(self, layer_id: int):
        def hook(_module, _inputs, output):
            self._features[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None = None):
        """Target forward of one sequence; returns logits ``[T, V]`` and features ``[T, k*H]``."""
        out = self.target(
            input_ids=ids.unsqueeze(0),
            position_ids=positions.unsqueeze(0),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=True,
        )
        features = None
        if self.drafter is not None:
            features = torch.cat([self._features[i][0] for i in self.drafter.config.target_layer_ids], dim=-1)
        return out.logits[0], features

    def draft_logits(self, root: int, start: int, context: torch.Tensor, context_start: int, cache,
                     block_offset: int = 0) -> torch.Tensor:
        """Drafter logits ``[S-1, V]`` for the positions after ``root`` (doc §1).

        ``block_offset`` moves the block's positions against the context's (0 is right; mutants only)."""
        drafter = self.drafter
        size = drafter.block_size
        block = torch.full((1, size), drafter.config.mask_token_id, dtype=torch.long, device=self.device)
        block[0, 0] = root
        embeds = self.target.get_input_embeddings()(block)
        positions = torch.arange(context_start, start + size, device=self.device)
        positions[start - context_start:] += block_offset
        positions = positions.unsqueeze(0)
        hidden = drafter(embeds, context.unsqueeze(0), positions, cache)
        return self.target.get_output_embeddings()(hidden[0, 1:])


def _suite_version() -> str:
    try:
        return distribution_version("ddtree-conformance")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return ""


class ReferenceEngine(Engine):
    """PyTorch + transformers reference; CPU and CUDA; fp32, bf16, fp16; greedy and sampling.

    Options: ``builder`` = ``"heap"`` (the only tree builder; the option stays so old settings fail
    clearly rather than silently).

    ``tensor_parallel_size`` > 1 shards the target over that many ranks (:mod:`.tensor_parallel`):
    GPUs on CUDA, gloo processes on CPU. Every rank runs the same loop below.
    """

    name = "reference"
    OPTIONS = ("builder",)

    # The spec steps this engine composes, one attribute each, so that a test-only mutant can
    # replace exactly one step (see tests/mutants.py).
    compile_step = staticmethod(compile_tree)
    walk_step = staticmethod(walk_tree)
    compact_step = staticmethod(compact_dynamic_cache)
    feedback_step = staticmethod(select_feedback_rows)
    emit_step = staticmethod(emit_tokens)
    block_position_offset = 0  # drafter block positions relative to the context's (mutants only)

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)  # refuses options other than OPTIONS
        self.info = read_target_info(model_dir)
        if drafter_dir is not None:  # fail at construction, naming the field, not mid-run
            validate_pair(self.info, read_drafter_config(drafter_dir), drafter_dir)
        builder = options.get("builder", "heap")
        if builder != "heap":
            raise EngineError(f"reference engine: builder must be 'heap' (the vectorized builder was removed), "
                              f"got {builder!r}")
        self._build = build_tree
        self._loaded: dict[tuple[str, str, int], _LoadedPair] = {}
        self._ranks: RankGroup | None = None

    def use_models(self, target, drafter, config: RunConfig) -> None:
        """Run ``config``'s (dtype, device) with models already in memory (benchmarks)."""
        from .pair import TargetInfo

        info = TargetInfo(path=self.info.path, vocab_size=target.config.vocab_size,
                          hidden_size=target.config.hidden_size, num_layers=target.config.num_hidden_layers,
                          max_position_embeddings=target.config.max_position_embeddings)
        self.info = info
        self._loaded[(config.dtype, config.device, 1)] = _LoadedPair(
            target, info, drafter, TORCH_DTYPES[config.dtype], config.device
        )

    def capabilities(self) -> Capabilities:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        modes = ["plain", "dflash", "ddtree"] if self.drafter_dir else ["plain"]
        return Capabilities(
            name=self.name,
            version=_suite_version(),  # the reference engine ships with the suite: its version is the suite's
            modes=modes,
            dtypes=["float32", "bfloat16", "float16"],
            devices=devices,
            sampling=True,
            traces=True,
            per_round_acceptance=True,
            draft_logits=True,
            stage_timings=True,
            max_context=self.info.max_position_embeddings,
            max_tensor_parallel=self.max_tensor_parallel(),
            max_budget=MAX_BUDGET,
        )

    def _split_sizes(self, limit: int) -> list[int]:
        info = self.info
        return shardable_sizes(info.num_attention_heads, info.num_key_value_heads, info.intermediate_size,
                               info.vocab_size, limit)

    def max_tensor_parallel(self) -> int:
        """The largest TP size here: GPUs visible (or CPU cores without CUDA) that split the target evenly."""
        return max(self._split_sizes(cuda_device_count() or os.cpu_count() or 1))

    def _pair(self, config: RunConfig) -> _LoadedPair:
        tp = config.tensor_parallel_size
        key = (config.dtype, config.device, tp)
        if key not in self._loaded:
            if config.device.startswith("cuda") and not torch.cuda.is_available():
                raise EngineError(f"reference engine: device {config.device} requested but CUDA is not available")
            needs_drafter = config.mode != "plain"
            if needs_drafter and self.drafter_dir is None:
                raise EngineError(f"reference engine: mode {config.mode} needs a drafter dir")
            self._loaded[key] = _LoadedPair.load(
                self.model_dir, self.drafter_dir, TORCH_DTYPES[config.dtype], local_device(config.device, tp), tp
            )
        pair = self._loaded[key]
        if config.mode != "plain" and pair.drafter is None:
            raise EngineError(f"reference engine: mode {config.mode} needs a drafter dir")
        return pair

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if config.mode == "ddtree" and config.budget > MAX_BUDGET:  # refused here, never by the allocator
            raise EngineError(f"reference engine: budget {config.budget} is above the largest it accepts, {MAX_BUDGET} "
                              "(capabilities().max_budget)")
        tp = config.tensor_parallel_size
        if tp == 1:
            return self.generate_local(requests, config)
        self.validate_tensor_parallel(tp, config.device)
        device_type = config.device.split(":", 1)[0]
        if self._ranks is not None and (self._ranks.size, self._ranks.device_type) != (tp, device_type):
            self._close_ranks()
        if self._ranks is None:
            self._ranks = RankGroup(self, tp, device_type)
        try:
            return self._ranks.generate(self, requests, config)
        except EngineError:
            raise
        except Exception as exc:  # a collective failed (a rank died): start a fresh group next time
            self._close_ranks()
            raise EngineError(f"reference engine, tensor_parallel_size={tp}: the rank group failed "
                              f"({type(exc).__name__}: {exc}); it restarts on the next call") from exc

    def validate_tensor_parallel(self, tp: int, device: str) -> None:
        """Raise one :class:`EngineError` naming the numbers if ``tp`` cannot run on ``device`` here."""
        info = self.info
        if self._split_sizes(tp)[-1] != tp:
            raise EngineError(
                f"reference engine: tensor_parallel_size={tp} does not split target {info.path} evenly "
                f"(num_attention_heads {info.num_attention_heads}, num_key_value_heads {info.num_key_value_heads}, "
                f"intermediate_size {info.intermediate_size}, vocab_size {info.vocab_size})"
            )
        if device.startswith("cuda"):
            visible = cuda_device_count()
            if visible < tp:
                raise EngineError(f"reference engine: tensor_parallel_size={tp} on CUDA needs {tp} visible GPUs, "
                                  f"{visible} visible (CUDA_VISIBLE_DEVICES)")

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """This rank's run of ``requests`` (the whole run when ``tensor_parallel_size`` is 1)."""
        pair = self._pair(config)
        results = []
        for index, request in enumerate(requests):
            problem = self._request_problem(request)
            if problem:
                results.append(RequestResult(output_ids=[], finish_reason="error", error=f"request {index}: {problem}"))
                continue
            with torch.inference_mode():
                if config.mode == "plain":
                    results.append(self._plain(pair, request, config))
                else:
                    results.append(self._speculative(pair, request, config))
        return results

    def _request_problem(self, request: Request) -> str | None:
        vocab = self.info.vocab_size
        if max(request.prompt_ids) >= vocab:
            return f"prompt token id {max(request.prompt_ids)} is outside the vocabulary (size {vocab})"
        limit = self.info.max_position_embeddings
        if limit is not None and len(request.prompt_ids) + request.max_new_tokens > limit:
            return (
                f"prompt of {len(request.prompt_ids)} tokens + max_new_tokens {request.max_new_tokens} "
                f"exceeds the target's context limit {limit}"
            )
        return None

    @staticmethod
    def _sampling(request: Request) -> SamplingParams:
        return SamplingParams(temperature=request.temperature, top_k=request.top_k, top_p=request.top_p)

    @staticmethod
    def _generator(pair: _LoadedPair, request: Request) -> torch.Generator:
        return torch.Generator(device=pair.device).manual_seed(request.seed)

    def _prefill(self, pair: _LoadedPair, request: Request):
        from transformers import DynamicCache

        cache = DynamicCache(config=pair.target.config)
        prompt = torch.tensor(request.prompt_ids, dtype=torch.long, device=pair.device)
        positions = torch.arange(prompt.shape[0], device=pair.device)
        logits, features = pair.forward(prompt, positions, cache)
        return cache, logits[-1], features

    def _plain(self, pair: _LoadedPair, request: Request, config: RunConfig) -> RequestResult:
        params, generator = self._sampling(request), self._generator(pair, request)
        clock = _Clock(config.timing, pair.device)
        t0 = time.perf_counter()
        cache, last_logits, _ = self._prefill(pair, request)
        token = choose_token(last_logits, params, generator)
        t_prefill = time.perf_counter() - t0
        output, reason = emit_tokens([token], request.stop_token_ids, request.max_new_tokens)
        position, rounds = len(request.prompt_ids), 0
        clock.start()
        while reason is None:
            with clock.stage("verify"):
                ids = torch.tensor([token], dtype=torch.long, device=pair.device)
                logits, _ = pair.forward(ids, torch.tensor([position], device=pair.device), cache)
            token = choose_token(logits[-1], params, generator)
            position, rounds = position + 1, rounds + 1
            emitted, reason = emit_tokens([token], request.stop_token_ids, request.max_new_tokens - len(output))
            output += emitted
        return RequestResult(
            output_ids=output,
            finish_reason=reason,
            rounds=rounds,
            acceptance_lengths=[1] * rounds,
            timings=Timings(prefill=t_prefill, decode=time.perf_counter() - t0 - t_prefill, stages=clock.finish()),
        )

    def _speculative(self, pair: _LoadedPair, request: Request, config: RunConfig) -> RequestResult:
        params, generator = self._sampling(request), self._generator(pair, request)
        clock = _Clock(config.timing, pair.device)
        t0 = time.perf_counter()
        cache, last_logits, features = self._prefill(pair, request)
        root = choose_token(last_logits, params, generator)
        t_prefill = time.perf_counter() - t0
        output, reason = emit_tokens([root], request.stop_token_ids, request.max_new_tokens)
        draft_cache = pair.drafter.new_cache()
        context, context_start = features, 0
        start = len(request.prompt_ids)  # position of the root; also the committed cache length
        lengths: list[int] = []
        traces: list[RoundTrace] | None = [] if config.trace else None
        clock.start()
        while reason is None:
            with clock.stage("draft"):
                draft_logits = pair.draft_logits(root, start, context, context_start, draft_cache,
                                                 self.block_position_offset)
            with clock.stage("build"):
                tree = build_chain(draft_logits) if config.mode == "dflash" else self._build(draft_logits, config.budget)
            with clock.stage("compile"):
                verify = self.compile_step(tree, root, start, dtype=pair.dtype)
            with clock.stage("verify"):
                logits, features = pair.forward(verify.input_ids, verify.position_ids, cache, verify.attention_mask)
            with clock.stage("walk"):
                walk = self.walk_step(tree, logits, params, generator)
            with clock.stage("commit"):
                self.compact_step(cache, start, walk.accepted)
                context, context_start = self.feedback_step(features, walk.accepted), start
                new_tokens = [int(t) for t in verify.input_ids[walk.accepted].tolist()] + [walk.bonus]
            lengths.append(len(walk.accepted) + 1)
            if traces is not None:
                traces.append(self._trace(tree, verify, walk, logits, start, root, draft_logits, config))
            emitted, reason = self.emit_step(new_tokens, request.stop_token_ids, request.max_new_tokens - len(output))
            output += emitted
            start += len(walk.accepted) + 1
            root = walk.bonus
        return RequestResult(
            output_ids=output,
            finish_reason=reason,
            rounds=len(lengths),
            acceptance_lengths=lengths,
            timings=Timings(prefill=t_prefill, decode=time.perf_counter() - t0 - t_prefill, stages=clock.finish()),
            traces=traces,
        )

    @staticmethod
    def _trace(tree, verify, walk, logits, start, root, draft_logits, config: RunConfig) -> RoundTrace:
        path = [0, *walk.accepted]
        return RoundTrace(
            start=start,
            root_token=root,
            tree_tokens=verify.input_ids.tolist(),
            parents=tree.parents.tolist(),
            depths=tree.depths.tolist(),
            positions=verify.position_ids.tolist(),
            accepted=list(walk.accepted),
            target_tokens=[walk.target_tokens[n] for n in path],
            bonus=walk.bonus,
            top2_margins=top2_margin(logits[path]).tolist(),
            node_target_tokens=torch.argmax(logits, dim=-1).tolist(),
            draft_logits=draft_logits.float().tolist() if config.trace_draft_logits else None,
        )

    def _close_ranks(self) -> None:
        ranks, self._ranks = self._ranks, None
        for key in [k for k in self._loaded if k[2] > 1]:  # shards live in the group being closed
            del self._loaded[key]
        if ranks is not None:
            ranks.close()

    def close(self) -> None:
        self._close_ranks()
        self._loaded.clear()

