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
    walk_tree,
)

from ..interface import (
    Capabilities,
    Engine,
    EngineError,
    Request,
    RequestResult,
    RoundTrace,
    RunConfig,
    Timings,
    VerifiedTree,
)
from ..options import cuda_device_count
from .clock import DecodeClock as _Clock
from .clock import busy_probe
from .decoders import EagerDecoder, StaticDecoder, collector_paused
from .device_tree import beams_in_one_launch_serve
from .graphs import fill_in_place
from .pair import TORCH_DTYPES, LoadedPair, TargetInfo, read_drafter_config, read_target_info, validate_pair
from .round_records import round_trace, verified_tree
from .tensor_parallel import RankGroup, local_device, shardable_sizes

__all__ = ["ReferenceEngine", "MAX_BUDGET", "LoadedPair"]

# The verify batch is B + 1 tokens with a (B + 1) x (context + B + 1) mask, so memory grows with B^2;
# the paper sweeps B up to 1024. Larger budgets are refused up front rather than by the allocator.
MAX_BUDGET = 4096


def _suite_version() -> str:
    try:
        return distribution_version("ddtree-conformance")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return ""


AUTO = "auto"  # the device_tree option's default: the round as one graph where the tree's beams take one launch


class ReferenceEngine(Engine):
    """PyTorch + transformers reference; CPU and CUDA; fp32, bf16, fp16; greedy and sampling.

    Options: ``cuda_graphs`` = ``"on"`` (default) or ``"off"``: the default of ``RunConfig.cuda_graphs``
    on CUDA.

    The fast path (:mod:`.decoders`, :mod:`.graphs`): with ``RunConfig.cuda_graphs`` (default on CUDA)
    every decode step and verify round runs on fixed-capacity caches, replayed as CUDA graphs on CUDA
    and run eagerly on the same buffers elsewhere (``cuda_graphs=True`` on CPU tests that logic). With
    ``cuda_graphs=False`` (default on CPU) every forward is transformers' eager one: the oracle. The
    loop, and so every spec step, is the same on both. Tensor parallelism runs eagerly. Option
    ``fused_layers`` = ``"on"`` (default) or ``"off"``: on the fast path, a Qwen3 target and the DFlash
    drafter run their layers in fewer kernels (:mod:`.lean`) or as their modules. Option ``device_tree`` =
    ``"auto"`` (default), ``"on"`` or ``"off"``: on the fast path, a greedy DDTree round runs whole (tree,
    verify, walk, commit and the next draft) as one graph with one read back (:meth:`.StaticDecoder.launch_round`),
    or builds, compiles and walks its tree on the host between the draft's and the verify's graphs. ``auto``
    takes the graph where the tree's beams come from one launch (a CUDA device with Triton, B * K <= 4096, so
    B <= 64: :func:`.device_tree.beams_in_one_launch_serve`) and the host elsewhere. There the graph was
    0.7-1.0 ms a round faster at B = 16, 32 and 64 on an H200 and 1.0-2.2 ms at B = 32 and 64 on an H100,
    and slower at B = 128 and 256 (scripts/measurements/2026-12-06d-issue29). On that path the next round is
    queued as soon as this one's walk is read back and the request goes on, and this round's records are
    written while it runs, where they need nothing but what was read back (no traces requested).

    ``tensor_parallel_size`` > 1 shards the target over that many ranks (:mod:`.tensor_parallel`):
    GPUs on CUDA, gloo processes on CPU. Every rank runs the same loop below.
    """

    name = "reference"
    OPTIONS = ("cuda_graphs", "fused_layers", "device_tree")

    # The spec steps this engine composes, one attribute each, so that a test-only mutant can
    # replace exactly one step (ddtree_conformance.testing.mutants).
    choose_step = staticmethod(choose_token)  # the token after the prefill and each plain decoding step
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
        self._build = build_tree
        graphs = str(options.get("cuda_graphs", "on")).lower()
        if graphs not in ("on", "off", "true", "false", "1", "0"):
            raise EngineError(f"reference engine: cuda_graphs must be 'on' or 'off', got {options['cuda_graphs']!r}")
        self.cuda_graphs_default = graphs in ("on", "true", "1")
        fused = str(options.get("fused_layers", "on")).lower()
        if fused not in ("on", "off", "true", "false", "1", "0"):
            raise EngineError(f"reference engine: fused_layers must be 'on' or 'off', got {options['fused_layers']!r}")
        self.fused_layers = fused in ("on", "true", "1")
        on_device = str(options.get("device_tree", AUTO)).lower()
        if on_device not in (AUTO, "on", "off", "true", "false", "1", "0"):
            raise EngineError(
                f"reference engine: device_tree must be 'auto', 'on' or 'off', got {options['device_tree']!r}"
            )
        # True, False or AUTO (benchmarks set True or False directly)
        self.device_tree: bool | str = AUTO if on_device == AUTO else on_device in ("on", "true", "1")
        self._loaded: dict[tuple[str, str, int], LoadedPair] = {}
        self._ranks: RankGroup | None = None

    def use_models(self, target, drafter, config: RunConfig) -> None:
        """Run ``config``'s (dtype, device) with models already in memory (benchmarks)."""
        info = TargetInfo(
            path=self.info.path,
            vocab_size=target.config.vocab_size,
            hidden_size=target.config.hidden_size,
            num_layers=target.config.num_hidden_layers,
            max_position_embeddings=target.config.max_position_embeddings,
        )
        self.info = info
        self._loaded[(config.dtype, config.device, 1)] = LoadedPair(
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
            verified_tree_modes=[m for m in modes if m != "plain"],
            stage_timings=True,
            cuda_graphs=True,
            max_context=self.info.max_position_embeddings,
            max_tensor_parallel=self.max_tensor_parallel(),
            max_budget=MAX_BUDGET,
        )

    def _split_sizes(self, limit: int) -> list[int]:
        info = self.info
        return shardable_sizes(
            info.num_attention_heads, info.num_key_value_heads, info.intermediate_size, info.vocab_size, limit
        )

    def max_tensor_parallel(self) -> int:
        """The largest TP size here: GPUs visible (or CPU cores without CUDA) that split the target evenly."""
        return max(self._split_sizes(cuda_device_count() or os.cpu_count() or 1))

    def _pair(self, config: RunConfig) -> LoadedPair:
        tp = config.tensor_parallel_size
        key = (config.dtype, config.device, tp)
        if key not in self._loaded:
            if config.device.startswith("cuda") and not torch.cuda.is_available():
                raise EngineError(f"reference engine: device {config.device} requested but CUDA is not available")
            needs_drafter = config.mode != "plain"
            if needs_drafter and self.drafter_dir is None:
                raise EngineError(f"reference engine: mode {config.mode} needs a drafter dir")
            self._loaded[key] = LoadedPair.load(
                self.model_dir, self.drafter_dir, TORCH_DTYPES[config.dtype], local_device(config.device, tp), tp
            )
        pair = self._loaded[key]
        if config.mode != "plain" and pair.drafter is None:
            raise EngineError(f"reference engine: mode {config.mode} needs a drafter dir")
        return pair

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if config.mode == "ddtree" and config.budget > MAX_BUDGET:  # refused here, never by the allocator
            raise EngineError(
                f"reference engine: budget {config.budget} is above the largest it accepts, {MAX_BUDGET} "
                "(capabilities().max_budget)"
            )
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
            raise EngineError(
                f"reference engine, tensor_parallel_size={tp}: the rank group failed "
                f"({type(exc).__name__}: {exc}); it restarts on the next call"
            ) from exc

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
                raise EngineError(
                    f"reference engine: tensor_parallel_size={tp} on CUDA needs {tp} visible GPUs, "
                    f"{visible} visible (CUDA_VISIBLE_DEVICES)"
                )

    def generate_local(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """This rank's run of ``requests`` (the whole run when ``tensor_parallel_size`` is 1)."""
        pair = self._pair(config)
        results = []
        with collector_paused():
            for index, request in enumerate(requests):
                results.append(self._one(pair, index, request, config))
        return results

    def _one(self, pair: LoadedPair, index: int, request: Request, config: RunConfig) -> RequestResult:
        problem = self._request_problem(request)
        if problem:
            return RequestResult(output_ids=[], finish_reason="error", error=f"request {index}: {problem}")
        with torch.inference_mode():
            if config.mode == "plain":
                return self._plain(pair, request, config)
            return self._speculative(pair, request, config)

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
    def _generator(pair: LoadedPair, request: Request) -> torch.Generator:
        return torch.Generator(device=pair.device).manual_seed(request.seed)

    def fast_path_on(self, config: RunConfig) -> bool:
        """Whether ``config`` runs on the fast path (class doc): ``cuda_graphs`` asked for, or left to the
        default on CUDA; one rank only."""
        wanted = config.cuda_graphs
        if wanted is None:
            wanted = self.cuda_graphs_default and config.device.startswith("cuda")
        return bool(wanted) and config.tensor_parallel_size == 1

    # How the fast path puts a new input into its static buffer (in place); broken builds override it.
    fill_static = staticmethod(fill_in_place)

    def _decoder(self, pair: LoadedPair, request: Request, config: RunConfig) -> EagerDecoder:
        if not self.fast_path_on(config):
            return EagerDecoder(pair)
        rows = config.budget + 1 if config.mode == "ddtree" else 1
        return StaticDecoder(
            pair,
            pair.fast_path(),
            len(request.prompt_ids),
            request.max_new_tokens,
            rows,
            fill=self.fill_static,
            fused=self.fused_layers,
        )

    def _verify(self, decoder: EagerDecoder, verify):
        """The target forward over one compiled tree (or chain): logits and drafter features."""
        return decoder.verify(verify)

    def _plain(self, pair: LoadedPair, request: Request, config: RunConfig) -> RequestResult:
        params, generator = self._sampling(request), self._generator(pair, request)
        clock = _Clock(config.timing, pair.device)
        decoder = self._decoder(pair, request, config)
        t0 = time.perf_counter()
        last_logits, _ = decoder.prefill(request.prompt_ids)
        token = self.choose_step(last_logits, params, generator)
        t_prefill = time.perf_counter() - t0
        output, reason = emit_tokens([token], request.stop_token_ids, request.max_new_tokens)
        position, rounds = len(request.prompt_ids), 0
        with busy_probe(config.profile, pair.device) as busy:
            clock.start()
            while reason is None:
                with clock.stage("verify"):
                    logits = decoder.step(token, position)
                token = self.choose_step(logits, params, generator)
                position, rounds = position + 1, rounds + 1
                emitted, reason = emit_tokens([token], request.stop_token_ids, request.max_new_tokens - len(output))
                output += emitted
            stages = clock.finish()
        return RequestResult(
            output_ids=output,
            finish_reason=reason,
            rounds=rounds,
            acceptance_lengths=[1] * rounds,
            timings=Timings(prefill=t_prefill, decode=time.perf_counter() - t0 - t_prefill, stages={**stages, **busy}),
            engine_settings=decoder.settings(),
        )

    def _speculative(self, pair: LoadedPair, request: Request, config: RunConfig) -> RequestResult:
        params, generator = self._sampling(request), self._generator(pair, request)
        clock = _Clock(config.timing, pair.device)
        decoder = self._decoder(pair, request, config)
        t0 = time.perf_counter()
        last_logits, features = decoder.prefill(request.prompt_ids)
        root = self.choose_step(last_logits, params, generator)
        t_prefill = time.perf_counter() - t0
        output, reason = emit_tokens([root], request.stop_token_ids, request.max_new_tokens)
        context, context_start = features, 0
        start = len(request.prompt_ids)  # position of the root; also the committed cache length
        lengths: list[int] = []
        traces: list[RoundTrace] | None = [] if config.trace else None
        trees: list[VerifiedTree] | None = None if config.profile else []  # a timed bench run skips them
        tree_device = decoder.tree_device()
        on_device = self._round_on_device(decoder, config, params)
        # on the device, the next round is launched before this one's records are written, where those
        # records need nothing but what the round read back (no traces; the light trace its own)
        ahead = on_device and traces is None and (trees is None or self._verified_tree is verified_tree)
        launched = False
        with busy_probe(config.profile, pair.device) as busy:
            clock.start()
            while reason is None:
                if not on_device or not lengths:  # on the device, each round drafts the next
                    with clock.stage("draft" if lengths else "first_draft"):  # the first reads the prompt
                        draft_logits = decoder.draft(root, start, context, context_start, self.block_position_offset)
                if on_device:
                    with clock.stage("tree_round"):
                        if not launched:
                            first = (draft_logits, root) if not lengths else ()
                            decoder.launch_round(config.budget, start, *first)
                        done = decoder.finish_round()
                    launched = False
                    tree, verify, logits, features, walk = done.parts()
                    draft_logits = done.draft_logits
                else:
                    with clock.stage("build"):
                        tree = (
                            build_chain(draft_logits)
                            if config.mode == "dflash"
                            else self._build(draft_logits, config.budget)
                        )
                        if tree.tokens.device != tree_device:
                            tree = tree.to(tree_device)
                    with clock.stage("compile"):
                        verify = self.compile_step(tree, root, start, dtype=pair.dtype)
                    with clock.stage("verify"):
                        logits, features = self._verify(decoder, verify)
                    with clock.stage("walk"):
                        walk = self.walk_step(tree, logits, params, generator)
                    with clock.stage("commit"):
                        decoder.compact(self.compact_step, start, walk.accepted)
                        context, context_start = self.feedback_step(features, walk.accepted), start
                new_tokens = [int(t) for t in verify.input_ids[walk.accepted].tolist()] + [walk.bonus]
                lengths.append(len(walk.accepted) + 1)
                emitted, reason = self.emit_step(
                    new_tokens, request.stop_token_ids, request.max_new_tokens - len(output)
                )
                if ahead and reason is None:  # the next round runs while this one is recorded
                    with clock.stage("tree_round"):
                        decoder.launch_round(config.budget, start + len(walk.accepted) + 1)
                    launched = True
                if trees is not None:  # the device round's light trace comes with its one read back
                    own = on_device and self._verified_tree is verified_tree
                    trees.append(
                        done.verified_tree() if own else self._verified_tree(tree, verify, walk, logits, params)
                    )
                if traces is not None:
                    traces.append(self._trace(tree, verify, walk, logits, start, root, draft_logits, config))
                output += emitted
                start += len(walk.accepted) + 1
                root = walk.bonus
            stages = clock.finish()
        return RequestResult(
            output_ids=output,
            finish_reason=reason,
            rounds=len(lengths),
            acceptance_lengths=lengths,
            timings=Timings(prefill=t_prefill, decode=time.perf_counter() - t0 - t_prefill, stages={**stages, **busy}),
            traces=traces,
            verified_trees=trees,
            engine_settings=decoder.settings(),
        )

    def _round_on_device(self, decoder: EagerDecoder, config: RunConfig, params: SamplingParams) -> bool:
        """Whether each round runs as one graph (:meth:`.StaticDecoder.launch_round`): the fast path with
        ``device_tree`` on (or ``auto`` where the beams come from one launch), a greedy DDTree request, and
        the spec's own build, compile, verify, walk, compaction and feedback steps with the drafter's own
        positions. A build that replaces any of them
        (a mutant, a pitfall engine) runs them on the host, so what it changed is what runs."""
        own_steps = (
            self._build is build_tree
            and self.compile_step is compile_tree
            and self.walk_step is walk_tree
            and self.compact_step is compact_dynamic_cache
            and self.feedback_step is select_feedback_rows
            and self.block_position_offset == 0
            and getattr(type(self), "_verify", None) is _OWN_VERIFY
        )
        wanted = self.device_tree
        if wanted == AUTO:
            wanted = beams_in_one_launch_serve(decoder.pair.device, config.budget, self.info.vocab_size)
        return bool(decoder.fast and wanted and config.mode == "ddtree" and params.greedy and own_steps)

    # one round's records (:mod:`.round_records`); pitfall engines override them
    _verified_tree = staticmethod(verified_tree)
    _trace = staticmethod(round_trace)

    def fast_path_stats(self) -> dict:
        """The fast path's graph counts over every loaded pair: captures, replays, eager calls, and the
        first capture failure (None when every capture worked)."""
        runners = [pair.fast_path().runner for pair in self._loaded.values() if pair.fast_path_started]
        return {
            "captures": sum(r.captures for r in runners),
            "replays": sum(r.replays for r in runners),
            "eager_calls": sum(r.eager_calls for r in runners),
            "failure": next((r.failure for r in runners if r.failure), None),
        }

    def _close_ranks(self) -> None:
        ranks, self._ranks = self._ranks, None
        for key in [k for k in self._loaded if k[2] > 1]:  # shards live in the group being closed
            del self._loaded[key]
        if ranks is not None:
            ranks.close()

    def close(self) -> None:
        self._close_ranks()
        self._loaded.clear()


_OWN_VERIFY = ReferenceEngine._verify  # taken at import: tests may rebind the module's ReferenceEngine name
