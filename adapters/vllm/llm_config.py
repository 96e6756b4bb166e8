"""What the vLLM adapter asks vLLM for, as plain data: a run's ``LLM`` keyword arguments, its
speculative config, its attention backend and the depth the drafter drafts.

Nothing here imports vLLM, so the default test tier contract-tests these configs against the
recorded interfaces (:mod:`.upstream_api`: the released vLLM and DDTree PR #42910, whose build
cannot be installed there; :mod:`.pr_contract`).

DDTree comes one of three ways (:attr:`LlmSetup.ddtree`): ``"native"``, a vLLM whose
``SpeculativeConfig`` accepts the DDTree method (PR #42910's interface: ``method="ddtree"``, the
budget in ``num_speculative_tokens``, the TREE_ATTN attention backend, which its proposer asserts
at the first draft step); ``"plugin"`` (the suite's out-of-tree plugin: DFlash plus
``additional_config``); ``"none"``. PR #42910 ties the draft depth to the budget: the DFlash
drafter drafts ``num_speculative_tokens`` = B positions, past its block's L = block_size - 1 when
B > L. :meth:`LlmSetup.draft_depth` says so per run, and the adapter reports it with every result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..interface import RunConfig
from . import upstream_api as api

__all__ = ["LlmSetup"]


@dataclass(frozen=True)
class LlmSetup:
    """The adapter's decisions that shape every ``LLM`` it builds."""

    model_dir: str
    drafter_dir: str | None
    block_size: int | None
    seed: int = 0
    max_model_len: int = 4096
    enforce_eager: bool = True
    max_num_seqs: int | None = None
    ddtree: str = "none"  # native | plugin | none
    ddtree_method: str = api.DEFAULT_DDTREE_METHOD
    ddtree_budget_key: str = api.DEFAULT_DDTREE_BUDGET_KEY
    attention_backend: str | None = None  # the user's choice for every mode; None: as each mode needs
    cuda: bool = False  # a CUDA build: RunConfig.cuda_graphs switches enforce_eager per run (CPU: always eager)

    @property
    def horizon(self) -> int | None:
        """L: the positions the drafter's block drafts past the root."""
        return None if self.block_size is None else self.block_size - 1

    def attention_backend_for(self, mode: str) -> str | None:
        """The attention backend a run of ``mode`` asks for (None: vLLM's own choice)."""
        if self.attention_backend:
            return self.attention_backend
        if mode == "ddtree" and self.ddtree == "native":
            return api.PR_DDTREE.attention_backend
        return None

    def eager(self, cuda_graphs: bool | None) -> bool:
        """``enforce_eager`` of a run: on a CUDA build, ``RunConfig.cuda_graphs`` when the run asks (True:
        vLLM's CUDA graphs, False: eager), else the adapter's option; vLLM's CPU backend has no graphs."""
        if self.cuda and cuda_graphs is not None:
            return not cuda_graphs
        return self.enforce_eager

    def draft_depth(self, mode: str, llm_budget: int) -> int | None:
        """Positions past the root the drafter drafts in a run of ``mode`` (the per-depth acceptance the
        adapter reports has this many entries): L for DFlash and the plugin; for native DDTree the
        speculative token count when the budget key is it (the PR's coupling: depth = B)."""
        if mode == "plain":
            return None
        if mode == "ddtree" and self.ddtree == "native" and self.ddtree_budget_key == "num_speculative_tokens":
            return llm_budget
        return self.horizon

    def speculative_config(self, mode: str, llm_budget: int) -> dict | None:
        """``speculative_config`` of a run (None for plain); ``llm_budget``: the budget the ``LLM`` is
        started with (the run's, or the plugin's shared one)."""
        if mode == "plain":
            return None
        if mode == "dflash" or self.ddtree == "plugin":
            tokens = self.horizon if mode == "dflash" else llm_budget
            return {"method": api.DFLASH_METHOD, "model": self.drafter_dir, "num_speculative_tokens": tokens}
        spec = {"method": self.ddtree_method, "model": self.drafter_dir, self.ddtree_budget_key: llm_budget}
        if self.ddtree_budget_key != "num_speculative_tokens":
            spec.setdefault("num_speculative_tokens", self.horizon)
        return spec

    def llm_kwargs(self, config: RunConfig, llm_budget: int, plugin_options: dict | None = None) -> dict:
        """Keyword arguments of the ``vllm.LLM`` that runs ``config`` (every one in
        :data:`.upstream_api.LLM_KWARGS`)."""
        kwargs = {
            "model": self.model_dir,
            "dtype": config.dtype,
            "seed": self.seed,
            "max_model_len": self.max_model_len,
            "enforce_eager": self.eager(config.cuda_graphs),
            "disable_log_stats": False,
            "generation_config": "vllm",
        }
        spec = self.speculative_config(config.mode, llm_budget)
        if spec is not None:
            kwargs["speculative_config"] = spec
        backend = self.attention_backend_for(config.mode)
        if backend:
            kwargs[api.ATTENTION_BACKEND_KWARG] = backend
        if plugin_options is not None and config.mode == "ddtree" and self.ddtree == "plugin":
            kwargs["additional_config"] = {api.DDTREE_REQUEST_KEY: plugin_options}
        if self.max_num_seqs is not None:
            kwargs["max_num_seqs"] = self.max_num_seqs
        if config.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = config.tensor_parallel_size
        return kwargs

    def engine_settings(self, mode: str, llm_budget: int, cuda_graphs: bool | None = None) -> dict:
        """What each result of a run reports under ``engine_settings`` (``cuda_graphs``: the run's
        ``RunConfig.cuda_graphs``)."""
        eager = self.eager(cuda_graphs)
        settings: dict = {
            "attention_backend": self.attention_backend_for(mode) or "vllm default",
            "enforce_eager": eager,
        }
        if self.cuda:  # what the CUDA-graphs check asks of a graphs-on run: did it run under graphs
            settings["cuda_graphs"] = not eager
        if mode != "plain":
            settings["draft_depth"] = self.draft_depth(mode, llm_budget)
        return settings

    def notes(self) -> list[str]:
        """What the capabilities say of these decisions."""
        out = []
        if self.attention_backend:
            out.append(f"attention backend {self.attention_backend} for every mode (option attention_backend)")
        if self.ddtree == "native":
            backend = self.attention_backend_for("ddtree")
            out.append(
                f"ddtree: vLLM's own method {self.ddtree_method!r} (DDTree PR #42910's interface), attention "
                f"backend {backend}"
                + ("" if self.attention_backend else " for ddtree only (-O attention_backend=... overrides)")
            )
            if self.ddtree_budget_key == "num_speculative_tokens":
                out.append(
                    f"ddtree: num_speculative_tokens is both the node budget B and the DFlash draft depth, so "
                    f"the drafter drafts B positions past the root where its block gives L = {self.horizon}; "
                    "each result's engine_settings.draft_depth and per-depth acceptance say how deep"
                )
        return out
