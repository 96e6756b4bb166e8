"""Every vLLM name the adapter relies on, in one place: the released vLLM's and DDTree PR #42910's.

The contract tests (``tests/test_vllm_contract.py``, vLLM tier) import these and check that each one
exists in the installed vLLM, so a rename upstream fails there with the name, not deep in a run.
The PR cannot be installed here: :data:`PR_DDTREE` records its interface as read, and the default
tier checks the configs the adapter generates against that record (``tests/test_upstream_prs.py``,
:mod:`.pr_contract`). This module must not import vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    "attention_backend",  # EngineArgs field (AttentionConfig.backend; --attention-backend); in 0.32.0's arg_utils.py
)

#: The ``LLM`` keyword argument that picks the attention backend (a name of ``AttentionBackendEnum``).
ATTENTION_BACKEND_KWARG = "attention_backend"

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


@dataclass(frozen=True)
class DdtreePullRequest:
    """vLLM's DDTree pull request as read (open; its build cannot be installed here). Every name is
    what the PR's code uses; the comments say where and what it means."""

    repo: str = "vllm-project/vllm"
    number: int = 42910
    #: the commit read, and the files read at it
    commit: str = "0aa15d611bc3254861e0e9200834338501cc9722"
    files: tuple[str, ...] = ("vllm/v1/spec_decode/ddtree.py",)
    #: ``speculative_config.method`` selecting ``DDTreeProposer(DFlashProposer)`` (asserted in its __init__)
    method: str = "ddtree"
    #: the node budget B: ``DDTreeProposer._budget = num_speculative_tokens``
    budget_key: str = "num_speculative_tokens"
    #: ``_greedy_sample``: "DFlash depth == num_spec_tokens": the drafter drafts B positions, past its
    #: block's L = block_size - 1 when B > L (a tree may reach depth B)
    draft_depth_is_budget: bool = True
    #: ``speculative_config`` keys a DDTree run needs (the PR adds none: ``model`` is the DFlash drafter)
    spec_fields: tuple[str, ...] = ("method", "model", "num_speculative_tokens")
    #: the attention backend the target must use: ``_update_target_tree_attn_bias`` asserts a
    #: ``TreeAttentionMetadataBuilder`` at the first draft step ("Set attention_config.backend = 'TREE_ATTN'")
    attention_backend: str = "TREE_ATTN"
    #: how the adapter sets it: EngineArgs ``attention_backend`` (the PR's base has it, as 0.32 does)
    attention_backend_kwarg: str = ATTENTION_BACKEND_KWARG
    #: ``LLM`` keyword arguments the PR's base accepts that the adapter uses (the PR adds none)
    llm_kwargs: tuple[str, ...] = LLM_KWARGS
    #: ``ddtree_verify``: the target's argmax at every node, whatever the request's temperature (greedy
    #: verification at T > 0; the sampling checks name it "sampled requests were verified greedily")
    verification: str = "greedy"
    #: ``_greedy_sample``: a tree of fewer than B nodes is padded to B with token 0 at sequential depths,
    #: its padding rows masked out (not in the walk's child maps)
    short_tree_padding_token: int = 0
    #: acceptance counters: the released ones (per position up to num_speculative_tokens)
    metrics: tuple[str, ...] = SPEC_METRICS


#: vLLM PR #42910 (``method="ddtree"``) as read at 0aa15d61.
PR_DDTREE = DdtreePullRequest()
