"""Every SGLang name the adapter relies on, in one place: the released SGLang's and DDTree PR #29907's.

The contract tests (``tests/test_sglang_contract.py``, SGLang tier) check each released name against
the installed SGLang (``sglang==0.5.23``), so a rename upstream fails there with the name, not deep
in a GPU run. The PR cannot be installed here: :data:`PR_DDTREE` records its interface as read, and
the default tier checks the configs the adapter generates against that record
(``tests/test_upstream_prs.py``, :mod:`.pr_contract`). This module must not import SGLang. Paths
below (``srt/...``) are relative to the installed ``sglang`` package, as read in 0.5.23.
"""

from __future__ import annotations

from dataclasses import dataclass

#: SGLang releases the adapter was tested with (``major.minor`` prefixes).
TESTED_VERSIONS = ("0.5",)

# -- modules and attributes ---------------------------------------------------------------------
#: ``ServerArgs``: a msgspec Struct assembled from the namespaces in ``srt/arg_groups/fields/``
#: (``srt/server_args.py:551``); ``sgl.Engine(**kwargs)`` builds one from its keyword arguments
#: (``srt/entrypoints/engine.py:278-297``).
SERVER_ARGS = "sglang.srt.server_args:ServerArgs"
#: The offline engine class (``sgl.Engine`` is a lazy alias of it, ``sglang/__init__.py``).
ENGINE = "sglang.srt.entrypoints.engine:Engine"
#: Methods of ``ENGINE`` the adapter calls (``generate`` at engine.py:433, ``shutdown`` at :1450).
ENGINE_METHODS = ("generate", "shutdown")
#: Keyword arguments of ``Engine.generate`` the adapter passes.
GENERATE_KWARGS = ("input_ids", "sampling_params")
#: Builtin algorithms, plus ``register``/``from_string`` for plugin ones (``srt/speculative/spec_info.py:32-90``).
SPEC_ALGORITHM = "sglang.srt.speculative.spec_info:SpeculativeAlgorithm"
#: ``SpeculativeAlgorithm.from_string(name)`` resolves builtins, the NEXTN alias and registered names.
FROM_STRING = "from_string"
#: ``SpeculativeAlgorithm.register(name, *, supports_overlap, validate_server_args, spec_class)``:
#: a decorator over the worker factory (``spec_info.py:68``, storage in ``spec_registry.py:234``).
REGISTER = "register"
REGISTER_PARAMS = ("name", "supports_overlap", "validate_server_args", "spec_class")
#: Attribute of a plugin-registered algorithm (``CustomSpecAlgo``, spec_registry.py:54): when False,
#: its ``create_worker`` refuses to run unless overlap scheduling is disabled (spec_registry.py:137).
SUPPORTS_OVERLAP = "supports_overlap"
#: The member that means "no speculation" (not an algorithm the adapter can use).
NO_ALGORITHM = "NONE"
#: General plugins: entry-point group and loader (``srt/plugins/__init__.py:29`` and ``:103``).
#: ``Engine.__init__`` calls the loader first (engine.py:286); the adapter does the same before
#: probing for a DDTree algorithm, so algorithms registered by installed plugins are seen.
PLUGINS_GROUP = "sglang.srt.plugins"
LOAD_PLUGINS = "sglang.srt.plugins:load_plugins"
#: ``SamplingParams`` (msgspec Struct, ``srt/sampling/sampling_params.py:140``).
SAMPLING_PARAMS = "sglang.srt.sampling.sampling_params:SamplingParams"
#: Where meta_info is assembled (checked by source text: the module needs GPU-only deps to import).
META_SOURCE_MODULE = "sglang.srt.managers.tokenizer_manager"

# -- ServerArgs fields ---------------------------------------------------------------------------
#: Every ServerArgs field the adapter may set (always, per mode, or from an engine option).
SERVER_ARGS_FIELDS = (
    "model_path",  # fields/model.py:51
    "dtype",  # fields/model.py:160, choices auto/half/float16/bfloat16/float/float32
    "tp_size",  # fields/parallel.py:45
    "random_seed",  # fields/device.py:47
    "device",  # fields/device.py:24
    "base_gpu_id",  # fields/device.py:28: first GPU of the engine (RunConfig.device "cuda:N")
    "skip_tokenizer_init",  # fields/serving.py:58: we send input_ids and read output_ids
    "log_level",  # fields/observability.py:31
    "context_length",  # fields/model.py:110
    "mem_fraction_static",  # fields/schedule.py:27
    "max_running_requests",  # fields/schedule.py:31
    "attention_backend",  # fields/exec_.py:207 (PR #29907's DDTree needs "triton")
    "enable_deterministic_inference",  # fields/exec_.py:1153
    "disable_cuda_graph",  # fields/exec_.py:670 (no CLI flag, still honoured: arg_groups/cuda_graph_hook.py:55)
    # fields/schedule.py:193: plugin algorithms without overlap need it (spec_registry.py:137)
    "disable_overlap_schedule",
    "speculative_algorithm",  # fields/spec.py:31
    "speculative_draft_model_path",  # fields/spec.py:36
    "speculative_num_steps",  # fields/spec.py:58
    "speculative_eagle_topk",  # fields/spec.py:62
    "speculative_num_draft_tokens",  # fields/spec.py:66
)

#: The device string SGLang needs for DFLASH here (``arg_groups/speculative_hook.py:294-296``:
#: CUDA, NPU or XPU; the CPU backend rejects it).
DEVICE = "cuda"

# -- algorithms ----------------------------------------------------------------------------------
#: Linear DFlash (``SpeculativeAlgorithm.DFLASH``, worker ``DFlashWorkerV2``). Its verify window
#: is ``speculative_num_draft_tokens`` = the drafter's ``block_size``; ``speculative_num_steps``
#: and ``speculative_eagle_topk`` must be 1 (speculative_hook.py:334-366 forces them).
DFLASH_ALGORITHM = "DFLASH"
#: DDTree is not in 0.5.23. PR #29907 (sgl-project/sglang, open) names its algorithm ``DDTREE``
#: and its tree budget ``--speculative-ddtree-budget`` (ServerArgs ``speculative_ddtree_budget``;
#: its worker falls back to ``block_size - 1`` when unset). Both are engine options.
DEFAULT_DDTREE_ALGORITHM = "DDTREE"
DEFAULT_DDTREE_BUDGET_ARG = "speculative_ddtree_budget"

# -- requests and results ------------------------------------------------------------------------
#: Sampling-parameter keys the adapter sends (dict form, one per request).
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos", "sampling_seed")
#: SGLang's "no top-k" value (sampling_params.py:249-250: -1 means the whole vocabulary).
TOP_K_DISABLED = -1

#: Keys of one ``Engine.generate`` result (tokenizer_manager.py:2706-2709 with skip_tokenizer_init).
OUTPUT_IDS = "output_ids"
META_INFO = "meta_info"
#: ``meta_info`` keys: the finish reason is a dict ``{"type": ...}`` (managers/schedule_batch.py:284-345;
#: set at tokenizer_manager.py:2509), ``completion_tokens`` at :2556; the speculative counters at
#: :3170-3172 (only when the request ran at least one verify round: :3149-3153).
META_FINISH_REASON = "finish_reason"
META_FINISH_TYPE = "type"
META_COMPLETION_TOKENS = "completion_tokens"
META_VERIFY_CT = "spec_verify_ct"  # verify rounds of this request
META_CORRECT_DRAFTS = "spec_num_correct_drafts"  # accepted draft tokens over all rounds, bonus excluded
META_ACCEPT_HISTOGRAM = "spec_correct_drafts_histogram"  # [k] = rounds that accepted exactly k drafts (:3199)
META_KEYS = (META_FINISH_REASON, META_COMPLETION_TOKENS, META_VERIFY_CT, META_CORRECT_DRAFTS, META_ACCEPT_HISTOGRAM)

#: Finish types that map onto the suite's reasons ("abort" and anything else become errors), and the
#: module whose ``BaseFinishReason`` subclasses produce them (``to_json()["type"]``, read by source).
FINISH_TYPES = {"stop": "stop", "length": "length"}
FINISH_SOURCE_MODULE = "sglang.srt.managers.schedule_batch"


@dataclass(frozen=True)
class DdtreePullRequest:
    """SGLang's DDTree pull request as read (open; its build cannot be installed here). Every name is
    what the PR's code uses; the comments say where (``srt/...`` in its tree) and what it means."""

    repo: str = "sgl-project/sglang"
    number: int = 29907
    #: the files read, each at its commit
    files: tuple[tuple[str, str], ...] = (
        ("python/sglang/srt/speculative/ddtree_worker.py", "93e9850e430035f8a363fd881a6a0c5436b95108"),
        ("python/sglang/srt/speculative/ddtree_info.py", "93e9850e430035f8a363fd881a6a0c5436b95108"),
        ("python/sglang/srt/arg_groups/speculative_hook.py", "93e9850e430035f8a363fd881a6a0c5436b95108"),
        ("python/sglang/srt/speculative/ddtree_utils.py", "6c52d319a429be6216fba93b8291b7aff79516bb"),
    )
    #: ``--speculative-algorithm DDTREE`` (``_handle_ddtree`` in speculative_hook.py)
    algorithm: str = "DDTREE"
    #: ``--speculative-ddtree-budget``: the node budget B; unset: ``speculative_num_draft_tokens - 1``; must be >= 1
    budget_field: str = "speculative_ddtree_budget"
    #: ServerArgs fields the PR adds to the released ones the adapter uses
    added_fields: tuple[str, ...] = ("speculative_ddtree_budget",)
    #: ``_handle_ddtree`` runs ``_handle_dflash`` first: the block size goes in this field
    draft_tokens_field: str = "speculative_num_draft_tokens"
    #: above L = block_size - 1 ("full-tree mode") prefill and decode attention backends must be this,
    #: else ``_handle_ddtree`` raises "DDTREE full-tree mode currently supports only the triton ..."
    full_tree_attention_backend: str = "triton"
    #: ``_handle_ddtree`` refuses any other page size
    page_size: int = 1
    #: ServerArgs switches ``_handle_ddtree`` refuses
    refused_fields: tuple[str, ...] = ("speculative_use_rejection_sampling",)
    #: ``_handle_ddtree`` sets ``disable_overlap_schedule = True`` (DDTree runs the non-overlap worker)
    overlap_scheduling: bool = False
    #: ddtree_worker.py: at B <= L a chain of the drafter's first B argmax tokens ("spine mode")
    chain_at_or_below_block: bool = True
    #: ddtree_utils.py, full-tree mode: per-depth candidates ``min(max(B // L + 1, 2), V, SGLANG_DDTREE_MAX_TOPK)``
    max_topk_env: str = "SGLANG_DDTREE_MAX_TOPK"
    max_topk_default: int = 6
    #: ddtree_utils.py: added to every child's heap key (``_DDTREE_DEPTH_BONUS``, env override)
    depth_bonus_env: str = "SGLANG_DDTREE_DEPTH_BONUS"
    depth_bonus_default: float = 0.2
    #: ddtree_utils.py: branch candidates below ``best - log B - margin`` skipped (``_DDTREE_EARLY_STOP_MARGIN``)
    early_stop_margin: float = 1.0
    #: ddtree_utils.py: nodes renumbered level by level, grouped by parent, before the verify batch
    numbering: str = "breadth-first"
    #: ddtree_info.py ``verify``: ``eagle_sample`` (greedy at T = 0, target-only tree sampling at T > 0)
    verification: str = "eagle_sample"
    #: a diagnostic switch (rank of the target's token in the drafter's top-32)
    rank_probe_env: str = "SGLANG_DDTREE_RANK_PROBE"


#: SGLang PR #29907 (``--speculative-algorithm DDTREE``) as read at 93e9850e / 6c52d319.
PR_DDTREE = DdtreePullRequest()
