"""What the SGLang adapter asks SGLang for, as plain data: the ``sgl.Engine`` keyword arguments
(ServerArgs fields) of a run, and the settings each result reports.

Nothing here imports SGLang, so the default test tier contract-tests these configs against the
recorded interfaces (:mod:`.upstream_api`: the released SGLang and DDTree PR #29907, whose build
cannot be installed there; :mod:`.pr_contract`). The adapter decides once, at construction, what
this SGLang offers (:class:`ServerSetup`), then builds each run's arguments from it.

Attention backend. PR #29907's DDTree (algorithm ``DDTREE``) refuses to start above B = L
(``block_size - 1``, its "full-tree mode") unless the prefill and decode attention backends are
triton. Where that DDTree is offered and no ``attention_backend`` option is given, every mode of the
run (plain, DFlash and DDTree) uses triton, so that losslessness compares like with like; each
result says so in ``engine_settings``. An ``attention_backend`` option applies to every mode; one
that PR #29907's DDTree cannot run above L is refused for such a budget, naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..interface import EngineError, RunConfig
from . import upstream_api as api

__all__ = ["ServerSetup"]


@dataclass(frozen=True)
class ServerSetup:
    """The adapter's decisions that shape every ``sgl.Engine`` it builds."""

    model_dir: str
    drafter_dir: str | None
    block_size: int | None
    seed: int = 0
    log_level: str = "error"
    context_length: int | None = None
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    attention_backend: str | None = None  # the user's choice for every mode; None: as DDTree needs
    deterministic: bool = False
    cuda_graph: bool = True
    dflash_why: str | None = None  # why DFLASH is unavailable (None: available)
    ddtree_why: str | None = "not probed"  # why DDTree is unavailable (None: available)
    ddtree_algorithm: str = api.DEFAULT_DDTREE_ALGORITHM
    ddtree_budget_arg: str = api.DEFAULT_DDTREE_BUDGET_ARG
    ddtree_overlap: bool = True  # False: the registered algorithm refuses overlap scheduling

    @property
    def horizon(self) -> int | None:
        return None if self.block_size is None else self.block_size - 1

    @property
    def pr_ddtree(self) -> bool:
        """DDTree offered under PR #29907's algorithm name (its full-tree mode needs triton)."""
        return self.ddtree_why is None and self.ddtree_algorithm.upper() == api.PR_DDTREE.algorithm

    def attention_backend_for(self, mode: str) -> str | None:
        """The backend every mode of the run uses (None: SGLang's own choice)."""
        if self.attention_backend:
            return self.attention_backend
        return api.PR_DDTREE.full_tree_attention_backend if self.pr_ddtree else None

    def server_args(self, config: RunConfig) -> dict:
        """The ``sgl.Engine`` keyword arguments for ``config`` (EngineError for a mode this SGLang or
        drafter cannot run, or a budget the chosen attention backend cannot). ``config.device``
        only sets ``base_gpu_id``."""
        kind, _, index = config.device.partition(":")
        kwargs = {
            "model_path": self.model_dir,
            "dtype": config.dtype,
            "tp_size": config.tensor_parallel_size,
            "random_seed": self.seed,
            "device": api.DEVICE,
            "base_gpu_id": int(index) if kind == api.DEVICE and index.isdigit() else 0,
            "skip_tokenizer_init": True,
            "log_level": self.log_level,
        }
        optional = {
            "context_length": self.context_length,
            "mem_fraction_static": self.mem_fraction_static,
            "max_running_requests": self.max_running_requests,
            "attention_backend": self.attention_backend_for(config.mode),
        }
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        if self.deterministic:
            kwargs["enable_deterministic_inference"] = True
        if not self.graphs(config.cuda_graphs):
            kwargs["disable_cuda_graph"] = True
        if config.mode == "plain":
            return kwargs
        if self.drafter_dir is None:
            raise EngineError(f"engine 'sglang': mode {config.mode} needs a drafter")
        if config.mode == "dflash":
            if self.dflash_why is not None:
                raise EngineError(f"engine 'sglang': mode dflash unavailable: {self.dflash_why}")
            algorithm = api.DFLASH_ALGORITHM
        else:
            if self.ddtree_why is not None:
                raise EngineError(f"engine 'sglang': mode ddtree unavailable: {self.ddtree_why}")
            algorithm = self.ddtree_algorithm
        # DFLASH: verify window = block_size; steps and topk must be 1 (speculative_hook.py:334-387).
        kwargs.update(
            speculative_algorithm=algorithm,
            speculative_draft_model_path=self.drafter_dir,
            speculative_num_draft_tokens=self.block_size,
            speculative_num_steps=1,
            speculative_eagle_topk=1,
        )
        if config.mode == "ddtree":
            kwargs[self.ddtree_budget_arg] = config.budget
            backend, needed = kwargs.get("attention_backend"), api.PR_DDTREE.full_tree_attention_backend
            if self.pr_ddtree and config.budget > (self.horizon or 0) and backend != needed:
                raise EngineError(
                    f"engine 'sglang': option attention_backend={backend}: SGLang PR #29907's DDTree "
                    f"runs budgets above L = {self.horizon} (B = {config.budget}) only with the "
                    f"{needed} attention backend"
                )
            if not self.ddtree_overlap:
                kwargs["disable_overlap_schedule"] = True  # else create_worker refuses (spec_registry.py:137)
        return kwargs

    def graphs(self, cuda_graphs: bool | None) -> bool:
        """Whether a run uses CUDA graphs: ``RunConfig.cuda_graphs`` when the run asks, else the
        ``cuda_graph`` option."""
        return self.cuda_graph if cuda_graphs is None else cuda_graphs

    def engine_settings(self, mode: str, cuda_graphs: bool | None = None) -> dict:
        """What each result of a run of ``mode`` reports under ``engine_settings`` (``cuda_graphs``: the
        run's ``RunConfig.cuda_graphs``)."""
        settings: dict = {
            "attention_backend": self.attention_backend_for(mode) or "sglang default",
            "cuda_graphs": self.graphs(cuda_graphs),
        }
        if mode == "ddtree" and self.pr_ddtree:
            settings["overlap_scheduling"] = False  # PR #29907's hook turns it off for DDTREE
        return settings

    def notes(self) -> list[str]:
        if self.attention_backend:
            return [f"attention backend {self.attention_backend} for every mode (option attention_backend)"]
        if self.pr_ddtree:
            return [
                (
                    f"attention backend {api.PR_DDTREE.full_tree_attention_backend} for every mode (plain, dflash, "
                    f"ddtree), as SGLang PR #29907's DDTree needs it above B = L = {self.horizon}: lossless compares "
                    "like with like (-O attention_backend=... overrides)"
                ),
                (
                    "ddtree: SGLang PR #29907 turns overlap scheduling off for DDTREE; plain and dflash keep SGLang's "
                    "default"
                ),
            ]
        return []
