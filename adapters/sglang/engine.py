"""The SGLang engine adapter.

:class:`SglangEngine` drives SGLang's offline engine (``sgl.Engine``) in the process that
constructs it. The suite wraps it in :class:`~ddtree_conformance.adapters.process.IsolatedEngine`, so each suite
engine is one child process; inside it the adapter keeps one ``sgl.Engine`` per (mode, budget,
dtype, tensor_parallel_size, GPU) and shuts it down before building the next.

``sgl.Engine`` starts its scheduler and detokenizer as child processes
(``srt/entrypoints/engine.py``, ``mp.Process``), and IsolatedEngine's child is a daemon, which
Python forbids to have children. The adapter clears that flag before building an engine
(:func:`allow_children`). Nothing leaks when the child is killed: SGLang's subprocesses ask the
kernel to SIGKILL them when their parent dies (``kill_itself_when_parent_died``,
``srt/utils/common.py:3432``, called at ``managers/scheduler.py:6269`` and
``managers/detokenizer_manager.py:550``).

SGLang runs on CUDA only here (its CPU backend needs a source build and rejects DFLASH:
``arg_groups/speculative_hook.py:294-301``). On a machine without CUDA the adapter still
constructs and reports :meth:`capabilities` (``devices == []``, with the reason in the notes), so
contract tests and ``ddtree-conformance engines`` work; :meth:`generate` raises one EngineError.

Acceptance. SGLang has no per-round traces, but every finished speculative request carries
``meta_info`` counters (``srt/managers/tokenizer_manager.py:3149-3201``): ``spec_verify_ct``
(verify rounds), ``spec_num_correct_drafts`` (accepted drafts, bonus excluded) and
``spec_correct_drafts_histogram`` (rounds per accepted-draft count). The adapter reports
``rounds = spec_verify_ct`` (``aggregate_only=True``), tau as doc §4 defines it, accepted plus
bonus per round: ``1 + spec_num_correct_drafts / spec_verify_ct``, and per-position acceptance
from the histogram. (SGLang's own ``spec_accept_length`` is ``completion_tokens /
spec_verify_ct``, tokenizer_manager.py:3166: it counts the token sampled at prefill, which no
round produced, and the tokens cut at ``max_new_tokens``; about 1/rounds off the reference's tau.)
With ``acceptance_scope="batch"`` (default) tau and per-position values are pooled over the batch
(all rounds of all requests, as the suite's reference side pools them) and every result carries
the pooled values; ``rounds`` stays each request's own count. ``"request"``: each result its own.

Options (``--engine-option KEY=VALUE`` or ``SuiteSettings.engine_options``): ``seed`` (0,
ServerArgs ``random_seed``), ``context_length`` (default: SGLang reads the target config),
``mem_fraction_static``, ``max_running_requests``, ``attention_backend``, ``deterministic``
(False; ``enable_deterministic_inference``: SGLang honours ``sampling_seed`` only then,
``srt/sampling/sampling_batch_info.py:157-170``), ``cuda_graph`` (True; False sets
``disable_cuda_graph``; a run's ``RunConfig.cuda_graphs``, when set, decides:
``capabilities().cuda_graphs``), ``log_level`` ("error"), ``acceptance_scope`` ("batch" | "request"),
``ddtree_algorithm`` ("DDTREE") and ``ddtree_budget_arg`` ("speculative_ddtree_budget"): the
algorithm name and ServerArgs budget field of a DDTree-capable SGLang (PR #29907's, or a plugin's).
"""

from __future__ import annotations

import gc
import logging
import warnings

import sglang  # a missing SGLang makes the registry say "engine 'sglang' is not available here"

from .. import options as opts
from ..interface import Capabilities, Engine, EngineError, Request, RequestResult, RunConfig
from ..process import allow_children
from . import upstream_api as api
from .contract import algorithm as contract_algorithm
from .contract import (
    builtin_algorithms,
    check_engine_api,
    check_finish_types,
    check_meta_keys,
    check_register_api,
    check_sampling_keys,
    check_server_args,
    finish_types,
    load_plugins,
    probe_algorithm,
    probe_ddtree,
    resolve,
    server_args_fields,
    version_tested,
)
from .server_config import ServerSetup
from .upstream_api import TESTED_VERSIONS

__all__ = [
    "TESTED_VERSIONS",
    "SglangEngine",
    "allow_children",
    "builtin_algorithms",
    "check_engine_api",
    "check_finish_types",
    "check_meta_keys",
    "check_register_api",
    "check_sampling_keys",
    "check_server_args",
    "finish_types",
    "load_plugins",
    "probe_algorithm",
    "probe_ddtree",
    "resolve",
    "server_args_fields",
    "version_tested",
]

logger = logging.getLogger(__name__)

_SCOPES = ("batch", "request")


class SglangEngine(Engine):
    """SGLang's offline engine behind the suite's :class:`Engine` interface (see module doc)."""

    name = "sglang"
    OPTIONS = (
        "seed",
        "context_length",
        "mem_fraction_static",
        "max_running_requests",
        "attention_backend",
        "deterministic",
        "cuda_graph",
        "log_level",
        "acceptance_scope",
        "ddtree_algorithm",
        "ddtree_budget_arg",
    )

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        opts.check_known(self.name, options, self.OPTIONS)
        self.version = getattr(sglang, "__version__", "unknown")
        if not version_tested(self.version):
            warnings.warn(
                f"SGLang {self.version} is outside the adapter's tested range "
                f"({', '.join(v + '.x' for v in TESTED_VERSIONS)})",
                stacklevel=2,
            )
        self.seed = opts.number(self.name, "seed", options.get("seed", 0), int)
        self.context_length = (
            opts.number(self.name, "context_length", options["context_length"], int, 1)
            if "context_length" in options
            else None
        )
        self.mem_fraction_static = (
            opts.number(self.name, "mem_fraction_static", options["mem_fraction_static"], float, 0.0, 1.0)
            if "mem_fraction_static" in options
            else None
        )
        self.max_running_requests = (
            opts.number(self.name, "max_running_requests", options["max_running_requests"], int, 1)
            if "max_running_requests" in options
            else None
        )
        self.attention_backend = str(options["attention_backend"]) if "attention_backend" in options else None
        self.deterministic = opts.flag(self.name, "deterministic", options.get("deterministic", False))
        self.cuda_graph = opts.flag(self.name, "cuda_graph", options.get("cuda_graph", True))
        self.log_level = str(options.get("log_level", "error"))
        self.scope = str(options.get("acceptance_scope", "batch"))
        if self.scope not in _SCOPES:
            raise EngineError(
                f"engine 'sglang': option acceptance_scope must be 'batch' or 'request', got {self.scope!r}"
            )
        self.ddtree_algorithm = str(options.get("ddtree_algorithm", api.DEFAULT_DDTREE_ALGORITHM)).strip()
        self.ddtree_budget_arg = str(options.get("ddtree_budget_arg", api.DEFAULT_DDTREE_BUDGET_ARG)).strip()
        if not self.ddtree_algorithm:
            raise EngineError("engine 'sglang': option ddtree_algorithm is empty")
        if not self.ddtree_budget_arg:
            raise EngineError("engine 'sglang': option ddtree_budget_arg is empty")
        # Settings SGLang itself would reject at ServerArgs resolution: report them now, naming the option.
        option_fields = {"attention_backend": self.attention_backend, "log_level": self.log_level}
        bad = check_server_args({k: v for k, v in option_fields.items() if v is not None})
        if bad:
            raise EngineError(f"engine 'sglang': bad option value: {'; '.join(bad)}")

        target = opts.read_config(self.name, model_dir, "target")
        self.max_context = self.context_length or int(target.get("max_position_embeddings") or 0) or None
        self.block_size = None if drafter_dir is None else opts.drafter_block_size(self.name, drafter_dir)
        load_plugins()  # sgl.Engine does this first too (engine.py:286); plugins may register DDTree
        self._dflash_ok, self._dflash_why = probe_algorithm(api.DFLASH_ALGORITHM)
        self.ddtree_ok, self.ddtree_why = probe_ddtree(self.ddtree_algorithm, self.ddtree_budget_arg)
        overlap = (
            getattr(contract_algorithm(self.ddtree_algorithm), api.SUPPORTS_OVERLAP, True) is not False
            if self.ddtree_ok
            else True
        )
        self.setup = ServerSetup(
            model_dir,
            drafter_dir,
            self.block_size,
            self.seed,
            self.log_level,
            self.context_length,
            self.mem_fraction_static,
            self.max_running_requests,
            self.attention_backend,
            self.deterministic,
            self.cuda_graph,
            None if self._dflash_ok else self._dflash_why,
            None if self.ddtree_ok else self.ddtree_why,
            self.ddtree_algorithm,
            self.ddtree_budget_arg,
            overlap,
        )
        self.gpus = opts.cuda_device_count()
        self._engine = None
        self._engine_key: tuple | None = None

    # -- Engine interface ------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        modes = ["plain"]
        notes = [
            (
                f"SGLang {self.version}; no per-round traces: acceptance from meta_info "
                f"{api.META_VERIFY_CT}/{api.META_CORRECT_DRAFTS}/{api.META_ACCEPT_HISTOGRAM} "
                f"({self.scope} scope)"
            )
        ]
        if not self.gpus:
            notes.append("SGLang needs CUDA: no CUDA device is visible here, so no device is offered")
        if self.drafter_dir is None:
            notes.append("no drafter given: plain only")
        else:
            if self._dflash_ok:
                modes.append("dflash")
            else:
                notes.append(f"no dflash: {self._dflash_why}")
            if self.ddtree_ok:
                modes.append("ddtree")
            else:
                notes.append(f"no ddtree in this SGLang: {self.ddtree_why}")
        notes += self.setup.notes()
        if not self.deterministic:
            notes.append(
                "sampling seeds are honoured only with option deterministic=true (enable_deterministic_inference)"
            )
        if not version_tested(self.version):
            notes.append(f"version {self.version} is outside the tested range {', '.join(TESTED_VERSIONS)}")
        return Capabilities(
            name=self.name,
            version=self.version,
            modes=modes,
            dtypes=["float32", "bfloat16", "float16"],
            devices=["cuda"] if self.gpus else [],
            sampling=True,
            traces=False,
            per_round_acceptance=False,
            max_context=self.max_context,
            max_tensor_parallel=max(1, self.gpus),
            cuda_graphs=bool(self.gpus),  # RunConfig.cuda_graphs -> disable_cuda_graph per run (ServerSetup.graphs)
            notes=notes,
        )

    def _gpu_index(self, device: str) -> int:
        kind, _, index = device.partition(":")
        if kind != api.DEVICE:
            raise EngineError(f"engine 'sglang': device {device} not supported: SGLang runs on CUDA only here")
        if not self.gpus:
            raise EngineError("engine 'sglang': SGLang needs CUDA, and no CUDA device is visible here")
        if not index:
            return 0
        if not index.isdigit() or int(index) >= self.gpus:
            raise EngineError(f"engine 'sglang': device {device}: {self.gpus} CUDA device(s) visible here")
        return int(index)

    def server_args(self, config: RunConfig) -> dict:
        """The ``sgl.Engine`` keyword arguments (ServerArgs fields) for ``config``
        (:meth:`.server_config.ServerSetup.server_args`; needs no GPU)."""
        return self.setup.server_args(config)

    def _shutdown_engine(self) -> None:
        engine, self._engine, self._engine_key = self._engine, None, None
        if engine is None:
            return
        try:
            engine.shutdown()  # blocks until the scheduler released the GPU (engine.py:1450)
        except Exception:  # best effort: the process may be on its way out anyway; the log says why
            logger.exception("engine 'sglang': sgl.Engine.shutdown failed")
        del engine
        gc.collect()

    def _get_engine(self, config: RunConfig):
        gpu = self._gpu_index(config.device)
        if config.tensor_parallel_size > self.gpus - gpu:
            raise EngineError(
                f"engine 'sglang': tensor_parallel_size {config.tensor_parallel_size} needs that many GPUs "
                f"from cuda:{gpu}; {self.gpus} visible"
            )
        key = (
            config.mode,
            config.budget if config.mode == "ddtree" else None,
            config.dtype,
            config.tensor_parallel_size,
            gpu,
            self.setup.graphs(config.cuda_graphs),
        )
        if self._engine is not None and self._engine_key == key:
            return self._engine
        self._shutdown_engine()
        kwargs = self.server_args(config)
        allow_children()
        try:
            self._engine = resolve(api.ENGINE)(**kwargs)
        except Exception as exc:
            raise EngineError(
                f"engine 'sglang': sgl.Engine({config.mode}, {config.dtype}, "
                f"tp={config.tensor_parallel_size}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        self._engine_key = key
        return self._engine

    @staticmethod
    def sampling_params(request: Request) -> dict:
        params = {
            "max_new_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k if request.top_k > 0 else api.TOP_K_DISABLED,
            "stop_token_ids": list(request.stop_token_ids),
            "ignore_eos": True,  # stop only on the request's own stop_token_ids
        }
        if request.temperature > 0:
            params["sampling_seed"] = request.seed
        return params

    def _depth(self) -> int:
        return (self.block_size or 1) - 1

    def _per_position(self, histogram: list[int], rounds: int) -> list[float]:
        depth = max(self._depth(), len(histogram) - 1)
        return [sum(histogram[d:]) / rounds for d in range(1, depth + 1)]

    def _aggregates(self, metas: list[dict]) -> list[dict]:
        """Per-result acceptance fields from each request's meta_info (see module doc)."""
        counts = []
        for meta in metas:
            rounds = int(meta.get(api.META_VERIFY_CT) or 0)
            correct = int(meta.get(api.META_CORRECT_DRAFTS) or 0)
            histogram = [int(n) for n in (meta.get(api.META_ACCEPT_HISTOGRAM) or [])]
            counts.append((rounds, correct, histogram))
        if self.scope == "batch":
            rounds = sum(c[0] for c in counts)
            correct = sum(c[1] for c in counts)
            width = max((len(c[2]) for c in counts), default=0)
            histogram = [sum(c[2][k] for c in counts if k < len(c[2])) for k in range(width)]
            pooled = (
                {
                    "mean_acceptance": 1.0 + correct / rounds,
                    "per_position_acceptance": self._per_position(histogram, rounds),
                }
                if rounds
                else {}
            )
            return [{"aggregate_only": True, "rounds": c[0], **pooled} for c in counts]
        out = []
        for rounds, correct, histogram in counts:
            extra = {"aggregate_only": True, "rounds": rounds}
            if rounds:
                extra.update(
                    mean_acceptance=1.0 + correct / rounds,
                    per_position_acceptance=self._per_position(histogram, rounds),
                )
            out.append(extra)
        return out

    @staticmethod
    def _result(output: dict, extra: dict) -> RequestResult:
        ids = [int(t) for t in output.get(api.OUTPUT_IDS) or []]
        finish = (output.get(api.META_INFO) or {}).get(api.META_FINISH_REASON)
        kind = finish.get(api.META_FINISH_TYPE) if isinstance(finish, dict) else finish
        reason = api.FINISH_TYPES.get(str(kind))
        if reason is None:
            return RequestResult(output_ids=ids, finish_reason="error", error=f"SGLang finish_reason {finish!r}")
        return RequestResult(output_ids=ids, finish_reason=reason, **extra)

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        if not requests:
            return []
        engine = self._get_engine(config)
        results: list[RequestResult | None] = [None] * len(requests)
        runnable = []
        for i, r in enumerate(requests):
            need = len(r.prompt_ids) + r.max_new_tokens
            if self.max_context is not None and need > self.max_context:
                results[i] = RequestResult(
                    output_ids=[],
                    finish_reason="error",
                    error=f"prompt + max_new_tokens = {need} exceeds the context length "
                    f"{self.max_context} (engine option context_length)",
                )
            else:
                runnable.append(i)
        if not runnable:
            return results  # type: ignore[return-value]
        try:
            outputs = engine.generate(
                input_ids=[list(requests[i].prompt_ids) for i in runnable],
                sampling_params=[self.sampling_params(requests[i]) for i in runnable],
            )
        except Exception as exc:
            raise EngineError(f"engine 'sglang': generate failed: {type(exc).__name__}: {exc}") from exc
        if isinstance(outputs, dict):
            outputs = [outputs]
        if len(outputs) != len(runnable):
            raise EngineError(f"engine 'sglang': generate returned {len(outputs)} outputs for {len(runnable)} requests")
        if config.mode == "plain":
            extras = [{} for _ in outputs]
        else:
            extras = self._aggregates([o.get(api.META_INFO) or {} for o in outputs])
        for i, output, extra in zip(runnable, outputs, extras):
            settings = self.setup.engine_settings(config.mode, config.cuda_graphs)
            results[i] = self._result(output, {**extra, "engine_settings": settings})
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self._shutdown_engine()
