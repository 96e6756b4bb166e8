"""Every vLLM name the adapter relies on, in one place.

The contract tests (``tests/test_vllm_contract.py``) import these and check that each one exists
in the installed vLLM, so a rename upstream fails there with the name, not deep in a run.
This module must not import vLLM.
"""

from __future__ import annotations

#: vLLM releases the adapter was tested with (``major.minor`` prefixes).
TESTED_VERSIONS = ("0.32",)

#: Keyword arguments the adapter passes to ``vllm.LLM`` (each is an LLM parameter or EngineArgs field).
LLM_KWARGS = (
    "model",
    "dtype",
    "seed",
    "max_model_len",
    "enforce_eager",
    "disable_log_stats",
    "speculative_config",
    "generation_config",
    "max_num_seqs",
    "tensor_parallel_size",
    "additional_config",
)

#: ``SpeculativeConfig`` fields the adapter sets.
SPEC_FIELDS = ("method", "model", "num_speculative_tokens")

#: Speculative method names: DFlash is required; DDTree is probed (configurable, see VllmEngine).
DFLASH_METHOD = "dflash"
DEFAULT_DDTREE_METHOD = "ddtree"
DEFAULT_DDTREE_BUDGET_KEY = "num_speculative_tokens"

#: ``SamplingParams`` keyword arguments the adapter passes.
SAMPLING_KWARGS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_tokens",
    "stop_token_ids",
    "ignore_eos",
    "detokenize",
    "extra_args",
)

#: The key of ``SamplingParams.extra_args`` the DDTree plugin reads a request's budget and trace
#: settings from (``ddtree_vllm_plugin.config.REQUEST_KEY``).
DDTREE_REQUEST_KEY = "ddtree"

#: vLLM's value of ``top_k`` meaning "no top-k" (0 and -1 both disable it in 0.32).
TOP_K_DISABLED = 0

#: Finish reasons vLLM reports on ``CompletionOutput.finish_reason`` that map onto the suite's.
FINISH_REASONS = {"stop": "stop", "length": "length"}

#: Prometheus metrics read through ``LLM.get_metrics()`` (cumulative per process: take deltas).
METRIC_DRAFTS = "vllm:spec_decode_num_drafts"
METRIC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
METRIC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
METRIC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SPEC_METRICS = (METRIC_DRAFTS, METRIC_DRAFT_TOKENS, METRIC_ACCEPTED, METRIC_ACCEPTED_PER_POS)

#: Environment variables the adapter sets (only when unset).
ENV_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"  # GiB of CPU KV cache
ENV_V1_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"  # "0": engine core in this process
