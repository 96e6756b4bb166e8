"""The vLLM engine adapter.

:class:`VllmEngine` drives vLLM's offline :class:`vllm.LLM` in the process that constructs it.
The suite wraps it in :class:`~ddtree_conformance.adapters.process.IsolatedEngine`, so each suite engine is one child
process; inside it the adapter keeps the ``LLM`` of the last (mode, budget, dtype) configuration
(option ``live_llms``: of the last few) and builds another only when the configuration changes.

By default vLLM's engine core runs in this same process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
uniprocess executor): IsolatedEngine's child is a daemon process, which may not start children,
and one process makes a crash or hang kill-clean. Option ``in_process=False`` leaves vLLM's
default (engine core and worker in their own processes) for callers that run it outside a daemon.

Acceptance. vLLM has no per-round traces. The adapter reads the speculative-decoding counters of
``LLM.get_metrics()`` before and after a batch and reports the deltas as aggregates
(``aggregate_only=True``): ``mean_acceptance = 1 + accepted / drafts`` and
``per_position_acceptance[d] = accepted_at_position_d / drafts``. With
``acceptance_scope="batch"`` (default) the whole batch runs as one ``generate`` call and every
result carries the same batch-pooled aggregates (``rounds`` is then None: vLLM does not say how
the drafts split between requests). Averaging them over the batch gives the pooled tau, which is
what the reference side of the acceptance check computes. With ``acceptance_scope="request"``
requests run one at a time and each result carries its own deltas, with ``rounds = drafts``.

DDTree. When the installed vLLM has no DDTree method of its own, mode ``ddtree`` runs through the
out-of-tree plugin :mod:`ddtree_vllm_plugin` (vLLM 0.32, CPU): DFlash with
``num_speculative_tokens = B`` plus ``additional_config={"ddtree": ...}``. The plugin writes one
JSON line per verified tree to a file this adapter gives it, so ddtree results carry exact
per-round acceptance lengths and, when asked, :class:`RoundTrace` objects (``traced_modes``).

Options (``--engine-option KEY=VALUE`` or ``SuiteSettings.engine_options``):
``max_model_len`` (default: the target's ``max_position_embeddings``, at most 4096),
``kv_cache_gib`` (whole GiB, as vLLM reads it: sets ``VLLM_CPU_KVCACHE_SPACE`` when unset; default 1),
``in_process`` (True),
``enforce_eager`` (default True on CPU, vLLM's default elsewhere; on CUDA a run's
``RunConfig.cuda_graphs``, when set, decides: ``capabilities().cuda_graphs``), ``max_num_seqs``, ``seed`` (0),
``live_llms`` (1: how many ``LLM`` s, one per configuration, stay alive at once; the least recently
used one is shut down to make room; 2 keeps plain and speculative both warm when checks alternate),
``acceptance_scope`` ("batch" | "request"), ``ddtree_method`` ("ddtree") and ``ddtree_budget_key``
("num_speculative_tokens"): the method name and budget key a DDTree-capable vLLM uses,
``ddtree_plugin`` ("auto": the plugin when vLLM has no DDTree; "on"; "off"),
``ddtree_runner_class`` ("module:Class", a runner subclass for the plugin: the suite's broken builds)
and ``ddtree_max_budget`` (plugin only; default: unset). Unset, each DDTree budget gets its own
``LLM`` started with ``num_speculative_tokens = B``, as an engine team deploys it. Set to M, one
``LLM`` started with ``num_speculative_tokens = M`` serves every budget B <= M: the adapter asks for
B < M per request (``SamplingParams.extra_args["ddtree"]["budget"]``), and the plugin then builds and
schedules exactly the trees of an ``LLM`` started with B (the vLLM plugin tier checks their per-round
acceptance against the reference at every budget). The drafter logits in traces are asked for per
request too, so traced and untraced runs share one ``LLM``.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import warnings
from collections import OrderedDict

import vllm  # noqa: F401  (a missing vLLM makes the registry say "engine 'vllm' is not available here")

from .. import options as opts
from ..interface import Capabilities, Engine, EngineError, Request, RequestResult, RunConfig
from . import plugin_traces
from . import upstream_api as api
from .llm_config import LlmSetup
from .probe import (
    method_names,
    metric_delta,
    metric_snapshot,
    plugin_choice,
    probe_method,
    spec_config_fields,
    version_tested,
)
from .upstream_api import TESTED_VERSIONS

__all__ = [
    "VllmEngine",
    "TESTED_VERSIONS",
    "method_names",
    "spec_config_fields",
    "probe_method",
    "version_tested",
    "metric_snapshot",
]


class VllmEngine(Engine):
    """vLLM's offline engine behind the suite's :class:`Engine` interface (see module doc)."""

    name = "vllm"
    OPTIONS = (
        "max_model_len",
        "kv_cache_gib",
        "in_process",
        "enforce_eager",
        "max_num_seqs",
        "seed",
        "acceptance_scope",
        "ddtree_method",
        "ddtree_budget_key",
        "ddtree_plugin",
        "ddtree_runner_class",
        "ddtree_max_budget",
        "live_llms",
        "attention_backend",
    )

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)  # refuses options other than OPTIONS
        self.version = getattr(vllm, "__version__", "unknown")
        if not version_tested(self.version):
            warnings.warn(
                f"vLLM {self.version} is outside the adapter's tested range "
                f"({', '.join(v + '.x' for v in TESTED_VERSIONS)})",
                stacklevel=2,
            )
        os.environ.setdefault(
            api.ENV_KVCACHE_SPACE, str(opts.number(self.name, "kv_cache_gib", options.get("kv_cache_gib", 1), int, 1))
        )
        self.in_process = opts.flag(self.name, "in_process", options.get("in_process", True))
        if self.in_process:
            os.environ.setdefault(api.ENV_V1_MULTIPROCESSING, "0")
        self.scope = opts.choice(
            self.name, "acceptance_scope", options.get("acceptance_scope", "batch"), ("batch", "request")
        )
        self.ddtree_method = str(options.get("ddtree_method", api.DEFAULT_DDTREE_METHOD))
        self.ddtree_budget_key = str(options.get("ddtree_budget_key", api.DEFAULT_DDTREE_BUDGET_KEY))
        self.seed = opts.number(self.name, "seed", options.get("seed", 0), int)
        target_config = opts.read_config(self.name, model_dir, "target")
        default_len = min(int(target_config.get("max_position_embeddings") or 4096), 4096)
        self.max_model_len = opts.number(self.name, "max_model_len", options.get("max_model_len", default_len), int, 1)
        self.max_num_seqs = (
            opts.number(self.name, "max_num_seqs", options["max_num_seqs"], int, 1)
            if "max_num_seqs" in options
            else None
        )
        self.cuda = self._has_cuda()
        eager = options.get("enforce_eager")
        self.enforce_eager = (not self.cuda) if eager is None else opts.flag(self.name, "enforce_eager", eager)
        self.block_size = None if drafter_dir is None else opts.drafter_block_size(self.name, drafter_dir)
        self.ddtree_ok, self.ddtree_why = probe_method(self.ddtree_method, self.ddtree_budget_key)
        plugin = opts.choice(self.name, "ddtree_plugin", options.get("ddtree_plugin", "auto"), ("auto", "on", "off"))
        self.runner_class = options.get("ddtree_runner_class")
        self.plugin, self.ddtree_ok, self.ddtree_why = plugin_choice(plugin, self.ddtree_ok, self.ddtree_why)
        self.shared_budget = self._shared_budget(options.get("ddtree_max_budget"))
        self._trace_dir = tempfile.mkdtemp(prefix="ddtree-vllm-traces-") if self.plugin else None
        self._dflash_ok, self._dflash_why = probe_method(api.DFLASH_METHOD)
        self.live_llms = opts.number(self.name, "live_llms", options.get("live_llms", 1), int, 1)
        self._llms: OrderedDict[tuple, object] = OrderedDict()  # key -> vllm.LLM, least recently used first
        self.setup = self._llm_setup(model_dir, drafter_dir, str(options.get("attention_backend", "auto")).strip())

    # -- helpers ---------------------------------------------------------------------------
    def _shared_budget(self, max_budget) -> int | None:
        """The ``ddtree_max_budget`` option (None: not set); it needs the plugin's per-request budgets."""
        shared_budget = (
            None
            if max_budget in (None, "", "none")
            else opts.number(self.name, "ddtree_max_budget", max_budget, int, 1)
        )
        if shared_budget is not None and not self.plugin:
            raise EngineError(
                f"engine 'vllm': ddtree_max_budget needs the DDTree plugin (per-request budgets); "
                f"ddtree here: {self.ddtree_why or 'native vLLM DDTree'}"
            )
        return shared_budget

    def _llm_setup(self, model_dir: str, drafter_dir: str | None, backend: str) -> LlmSetup:
        """How every ``vllm.LLM`` of this engine is built, from the options resolved in ``__init__``."""
        return LlmSetup(
            model_dir,
            drafter_dir,
            self.block_size,
            self.seed,
            self.max_model_len,
            self.enforce_eager,
            self.max_num_seqs,
            "plugin" if self.plugin else "native" if self.ddtree_ok else "none",
            self.ddtree_method,
            self.ddtree_budget_key,
            None if backend.lower() in ("", "auto") else backend,
            cuda=self.cuda,
        )

    @staticmethod
    def _has_cuda() -> bool:
        try:
            from vllm.platforms import current_platform

            return bool(current_platform.is_cuda())
        except Exception:
            return False

    # -- Engine interface ------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        modes = ["plain"]
        notes = [
            f"vLLM {self.version}; no per-round traces: acceptance is aggregated from "
            f"LLM.get_metrics() deltas ({self.scope} scope)"
        ]
        if self.drafter_dir is None:
            notes.append("no drafter given: plain only")
        else:
            if self._dflash_ok:
                modes.append("dflash")
            else:
                notes.append(f"no dflash: {self._dflash_why}")
            if self.ddtree_ok:
                modes.append("ddtree")
                if self.plugin:
                    notes.append(
                        "ddtree runs through the out-of-tree plugin ddtree_vllm_plugin (exact "
                        "per-round traces); dflash is stock vLLM"
                    )
                    if self.shared_budget is not None:
                        notes.append(
                            f"ddtree budgets up to {self.shared_budget} share one LLM "
                            f"(num_speculative_tokens={self.shared_budget}, budget per request); max_context "
                            f"{self._max_context()}: past it the shared LLM's {self.shared_budget + 1}-position "
                            "drafter block reaches max_model_len, where vLLM clamps positions"
                        )
            else:
                notes.append(f"no ddtree in this vLLM: {self.ddtree_why}")
        notes += self.setup.notes()
        if not version_tested(self.version):
            notes.append(f"version {self.version} is outside the tested range {', '.join(TESTED_VERSIONS)}")
        return Capabilities(
            name=self.name,
            version=self.version,
            modes=modes,
            dtypes=["float32", "bfloat16"] + (["float16"] if self.cuda else []),
            devices=["cuda"] if self.cuda else ["cpu"],  # a CUDA build of vLLM does not run on the CPU
            sampling=True,
            traces=self.plugin,
            per_round_acceptance=self.plugin,
            draft_logits=self.plugin,
            traced_modes=["ddtree"] if self.plugin else None,
            max_context=self._max_context(),
            max_budget=self._plugin_max_budget(),
            max_tensor_parallel=max(1, opts.cuda_device_count()) if self.cuda else 1,
            cuda_graphs=self.cuda,  # RunConfig.cuda_graphs -> enforce_eager per run (LlmSetup.eager)
            notes=notes,
        )

    def _max_context(self) -> int:
        """The context the engine decodes as an LLM started with each budget does. vLLM's DFlash drafter
        queries ``num_speculative_tokens + 1`` positions after a context that still holds the last
        step's ``b`` draft slots; a query position at or past ``max_model_len`` is clamped to 0 with a
        padding slot (``vllm/v1/spec_decode/utils.py``), and the drafter's block, which attends within
        itself, then drafts other tokens (measured: from root position 880 at b=16 and 832 at b=64 with
        ``num_speculative_tokens=128``, ``max_model_len=1024``). One LLM shared by budgets up to M drafts
        M + 1 positions for every budget, so its trees equal a B-started LLM's only while
        ``start + 2M + 1 <= max_model_len``; an LLM per budget claims the whole window (its own last
        ``2B + 1`` positions are the engine's to answer for)."""
        if self.shared_budget:
            return self.max_model_len - 2 * self.shared_budget - 1
        return self.max_model_len

    def _plugin_max_budget(self) -> int | None:
        """The largest budget the DDTree plugin verifies (it refuses larger ones at start-up)."""
        if not self.plugin:
            return None
        from ddtree_vllm_plugin.config import MAX_BUDGET

        return MAX_BUDGET

    def _check_mode(self, config: RunConfig) -> None:
        """Raise one EngineError when this vLLM or drafter cannot run ``config.mode``."""
        if config.mode != "plain" and self.drafter_dir is None:
            raise EngineError(f"engine 'vllm': mode {config.mode} needs a drafter")
        if config.mode == "dflash" and not self._dflash_ok:
            raise EngineError(f"engine 'vllm': {self._dflash_why}")
        if config.mode == "ddtree" and not self.ddtree_ok:
            raise EngineError(f"engine 'vllm': mode ddtree unavailable: {self.ddtree_why}")

    def _shutdown_llm(self, key: tuple | None = None) -> None:
        """Shut down the LLM under ``key`` (None: every live one)."""
        keys = list(self._llms) if key is None else [key]
        for k in keys:
            llm = self._llms.pop(k, None)
            if llm is None:
                continue
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # best effort: the process may be on its way out anyway
                pass
            del llm
        gc.collect()

    def _get_llm(self, config: RunConfig):
        caps = self.capabilities()
        if config.dtype not in caps.dtypes:
            raise EngineError(f"engine 'vllm': dtype {config.dtype} not supported here ({', '.join(caps.dtypes)})")
        device = config.device.split(":", 1)[0]
        if device not in caps.devices:
            raise EngineError(f"engine 'vllm': device {config.device} not supported here ({', '.join(caps.devices)})")
        caps_tp = self.capabilities().max_tensor_parallel
        if config.tensor_parallel_size > caps_tp:
            raise EngineError(
                f"engine 'vllm': tensor_parallel_size {config.tensor_parallel_size} exceeds the "
                f"{caps_tp} device(s) usable here"
            )
        # The plugin takes trace_draft_logits (and, when shared, the budget) per request: not in the key.
        key = (
            config.mode,
            self._llm_budget(config) if config.mode == "ddtree" else None,
            config.dtype,
            config.tensor_parallel_size,
            self.setup.eager(config.cuda_graphs),
        )
        if key in self._llms:
            self._llms.move_to_end(key)
            return self._llms[key]
        while len(self._llms) >= self.live_llms:  # the least recently used one makes room
            self._shutdown_llm(next(iter(self._llms)))
        self._check_mode(config)
        kwargs = self.setup.llm_kwargs(config, self._llm_budget(config), self._plugin_options(config))
        try:
            llm = vllm.LLM(**kwargs)
        except Exception as exc:
            raise EngineError(
                f"engine 'vllm': LLM({config.mode}, {config.dtype}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self._llms[key] = llm
        return llm

    def _plugin_mode(self, config: RunConfig) -> bool:
        return self.plugin and config.mode == "ddtree"

    def _shared(self, config: RunConfig) -> bool:
        """This ddtree run uses the LLM shared by budgets up to ``ddtree_max_budget``."""
        return self._plugin_mode(config) and self.shared_budget is not None and config.budget <= self.shared_budget

    def _llm_budget(self, config: RunConfig) -> int:
        """num_speculative_tokens of the LLM that runs ``config`` (mode ddtree)."""
        return self.shared_budget if self._shared(config) else config.budget

    @property
    def _trace_path(self) -> str:
        return os.path.join(self._trace_dir, "rounds.jsonl")

    def _plugin_options(self, config: RunConfig) -> dict:
        options = {"trace_path": self._trace_path}
        if self.runner_class:
            options["runner_class"] = str(self.runner_class)
        return options

    def _sampling_params(self, request: Request, config: RunConfig):
        sampled = request.temperature > 0
        extra = {}
        if self._plugin_mode(config):
            own = {"trace_draft_logits": bool(config.trace_draft_logits)}
            if self._llm_budget(config) != config.budget:  # the shared LLM, started for a larger budget
                own["budget"] = config.budget
            extra["extra_args"] = {api.DDTREE_REQUEST_KEY: own}
        return vllm.SamplingParams(
            n=1,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k if request.top_k > 0 else api.TOP_K_DISABLED,
            seed=request.seed if sampled else None,
            max_tokens=request.max_new_tokens,
            stop_token_ids=list(request.stop_token_ids),
            ignore_eos=True,  # stop only on the request's own stop_token_ids
            detokenize=False,
            **extra,
        )

    def _run(self, llm, requests: list[Request], config: RunConfig) -> tuple[list, dict]:
        spec = config.mode != "plain"
        if self._trace_dir is not None:
            plugin_traces.clear(self._trace_path)
        before = metric_snapshot(llm) if spec else {}
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        try:
            outputs = llm.generate(prompts, [self._sampling_params(r, config) for r in requests], use_tqdm=False)
        except Exception as exc:
            # An exception inside vLLM's engine loop can leave requests stuck in its scheduler: never
            # reuse that LLM (the next call builds a fresh one).
            for key in [k for k, v in self._llms.items() if v is llm]:
                self._shutdown_llm(key)
            raise EngineError(f"engine 'vllm': generate failed: {type(exc).__name__}: {exc}") from exc
        delta = metric_delta(before, metric_snapshot(llm)) if spec else {}
        return outputs, delta

    @staticmethod
    def _aggregates(delta: dict, positions: int | None = None) -> dict:
        """vLLM's counters as aggregates; ``positions`` cuts the per-position vector (as wide as the
        LLM's num_speculative_tokens) to the depth the run drafts (:meth:`LlmSetup.draft_depth`)."""
        drafts = int(delta.get(api.METRIC_DRAFTS, 0) or 0)
        if drafts <= 0:
            return {"aggregate_only": True, "rounds": 0}
        accepted = int(delta.get(api.METRIC_ACCEPTED, 0) or 0)
        per_pos = (delta.get(api.METRIC_ACCEPTED_PER_POS) or [])[:positions]
        return {
            "aggregate_only": True,
            "rounds": drafts,
            "mean_acceptance": 1.0 + accepted / drafts,
            "per_position_acceptance": [n / drafts for n in per_pos],
        }

    @staticmethod
    def _result(output, extra: dict) -> RequestResult:
        completion = output.outputs[0]
        reason = api.FINISH_REASONS.get(str(completion.finish_reason))
        if reason is None:
            return RequestResult(
                output_ids=list(completion.token_ids),
                finish_reason="error",
                error=f"vLLM finish_reason {completion.finish_reason!r} ({completion.stop_reason!r})",
            )
        return RequestResult(output_ids=list(completion.token_ids), finish_reason=reason, **extra)

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if not requests:
            return []
        llm = self._get_llm(config)
        spec = config.mode != "plain"
        results: list[RequestResult | None] = [None] * len(requests)
        runnable = []
        for i, r in enumerate(requests):
            need = len(r.prompt_ids) + r.max_new_tokens
            if need > self.max_model_len:
                results[i] = RequestResult(
                    output_ids=[],
                    finish_reason="error",
                    error=f"prompt + max_new_tokens = {need} exceeds max_model_len "
                    f"{self.max_model_len} (engine option max_model_len)",
                )
            else:
                runnable.append(i)
        if self.scope == "request" or not spec:
            groups = [[i] for i in runnable] if (self.scope == "request" and spec) else [runnable]
        else:
            groups = [runnable]
        for group in groups:
            if not group:
                continue
            outputs, delta = self._run(llm, [requests[i] for i in group], config)
            budget = self._llm_budget(config) if config.mode == "ddtree" else 1
            extra = self._aggregates(delta, self.setup.draft_depth(config.mode, budget)) if spec else {}
            extra["engine_settings"] = self.setup.engine_settings(config.mode, budget, config.cuda_graphs)
            if spec and self.scope == "batch":
                extra["rounds"] = None  # batch-pooled aggregates: per-request rounds unknown
            rounds = plugin_traces.read(self._trace_path) if self._plugin_mode(config) else None
            for i, output in zip(group, outputs):
                own = dict(extra)
                if rounds is not None:
                    rows = rounds.get(str(output.request_id), [])
                    # per-round lengths from the plugin's traces (tree-less steps as rounds of 1);
                    # mean_acceptance and per-position acceptance stay vLLM's own metrics
                    # (batch-pooled), so both can be compared
                    lengths, untraced = plugin_traces.acceptance_lengths(
                        rows, len(requests[i].prompt_ids), len(output.outputs[0].token_ids)
                    )
                    own.update(aggregate_only=False, rounds=len(lengths), acceptance_lengths=lengths)
                    if config.trace and untraced:
                        results[i] = RequestResult(
                            output_ids=list(output.outputs[0].token_ids),
                            finish_reason="error",
                            error=f"vLLM ran {untraced} decode step(s) without a draft tree (its scheduler left "
                            "no room for one); such steps have no trace",
                        )
                        continue
                    if config.trace:
                        own["traces"] = [plugin_traces.round_trace(r) for r in rows]
                results[i] = self._result(output, own)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self._shutdown_llm()
        if self._trace_dir is not None:
            shutil.rmtree(self._trace_dir, ignore_errors=True)
