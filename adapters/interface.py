"""The one interface every DDTree engine implements.

The suite talks to engines only through :class:`Engine`: it sends a batch of
:class:`Request` under one :class:`RunConfig` and reads back one :class:`RequestResult` per
request. What a check may ask for is decided from :meth:`Engine.capabilities`, never from the
engine's name. Everything here is plain data (pydantic), so results cross process boundaries as
JSON.
"""

from __future__ import annotations

import abc
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "Mode",
    "DType",
    "Request",
    "RunConfig",
    "RoundTrace",
    "VerifiedTree",
    "Timings",
    "RequestResult",
    "Capabilities",
    "Engine",
    "EngineError",
    "EngineUsageError",
    "UnknownOption",
    "EngineDied",
]

Mode = Literal["plain", "dflash", "ddtree"]
DType = Literal["float32", "bfloat16", "float16"]
FinishReason = Literal["stop", "length", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Request(_Model):
    """One generation request."""

    prompt_ids: list[int] = Field(description="prompt token ids")
    max_new_tokens: int = Field(ge=1)
    stop_token_ids: list[int] = Field(default_factory=list)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k")
    seed: int = 0

    @field_validator("prompt_ids")
    @classmethod
    def _non_empty(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("prompt_ids is empty: a request needs at least one prompt token")
        if min(value) < 0:
            raise ValueError("prompt_ids holds a negative token id")
        return value


class RunConfig(_Model):
    """How an engine runs a batch: the decoding mode and its knobs."""

    mode: Mode = "plain"
    budget: int = Field(default=32, description="DDTree node budget B (non-root nodes)")
    dtype: DType = "float32"
    device: str = "cpu"
    trace: bool = Field(default=False, description="record per-round traces where supported")
    trace_draft_logits: bool = Field(default=False, description="also keep the drafter logits of each round")
    timing: bool = Field(default=False, description="per-stage timings (may synchronise the device)")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs the engine shards the target over")
    cuda_graphs: bool | None = Field(
        default=None,
        description="run the decode loop under CUDA graphs (True) or "
        "eagerly (False); None: the engine's default. Only "
        "engines with capabilities().cuda_graphs switch",
    )
    profile: bool = Field(
        default=False,
        description="measure how long the device is busy during the decode loop "
        "(timings.stages['gpu_busy']; slower: a profiler runs)",
    )

    @field_validator("budget")
    @classmethod
    def _budget(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"budget must be >= 1, got {value}")
        return value


class RoundTrace(_Model):
    """One verification round, exactly as the engine ran it."""

    start: int = Field(description="position of the root token")
    root_token: int
    tree_tokens: list[int] = Field(description="node tokens, root first (index 0)")
    parents: list[int] = Field(description="parent index per node, root -1")
    depths: list[int] = Field(description="depth per node, root 0")
    positions: list[int] = Field(description="position ids fed to the target per node")
    accepted: list[int] = Field(description="accepted node indices along the path, root excluded")
    target_tokens: list[int] = Field(description="target token at the root and each accepted node")
    bonus: int
    top2_margins: list[float] = Field(description="target top-1 minus top-2 logit at root and accepted nodes")
    node_target_tokens: list[int] | None = Field(
        default=None, description="target argmax at every node of the verify batch (root first)"
    )
    draft_logits: list[list[float]] | None = Field(default=None, description="[L, V] drafter logits, if asked")

    @property
    def acceptance_length(self) -> int:
        return len(self.accepted) + 1


class VerifiedTree(_Model):
    """One round's verified tree, as light as an engine can give it (a light trace): no drafter logits,
    no positions or margins, only what the target verified and what it chose at every node."""

    tree_tokens: list[int] = Field(
        description="node tokens, root first (index 0; the root is the last committed token)"
    )
    parents: list[int] = Field(description="parent index per node, root -1; parents precede their children")
    node_target_tokens: list[int] = Field(
        description="the target's argmax at every node of the verify batch (root first)"
    )


class Timings(_Model):
    """Seconds. Stages are summed over rounds; absent when the engine does not know them."""

    prefill: float | None = None
    decode: float | None = None
    stages: dict[str, float] = Field(default_factory=dict)


class RequestResult(_Model):
    """What an engine returns for one request."""

    output_ids: list[int]
    finish_reason: FinishReason
    rounds: int | None = Field(default=None, description="verification rounds (decode steps for plain)")
    acceptance_lengths: list[int] | None = Field(
        default=None, description="per-round acceptance length (accepted + bonus)"
    )
    aggregate_only: bool = Field(
        default=False, description="True when only aggregates (mean tau, per-position) are known"
    )
    mean_acceptance: float | None = None
    per_position_acceptance: list[float] | None = None
    timings: Timings = Field(default_factory=Timings)
    traces: list[RoundTrace] | None = None
    verified_trees: list[VerifiedTree] | None = Field(
        default=None,
        description="one VerifiedTree per round (light traces), in every run of a mode the capabilities' "
        "verified_tree_modes name",
    )
    error: str | None = None
    engine_settings: dict[str, bool | int | float | str | None] = Field(
        default_factory=dict,
        description="the settings this request ran under that change its speed, as the "
        "engine knows them: cuda_graphs, overlap_scheduling, attention_backend, "
        "... (the bench records them and the gate refuses to compare across a "
        "change)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RequestResult:
        if self.acceptance_lengths is not None and self.rounds is not None:
            if len(self.acceptance_lengths) != self.rounds:
                raise ValueError("acceptance_lengths must have one entry per round")
        return self

    @property
    def tau(self) -> float | None:
        """Mean acceptance length: generated tokens / rounds (bonus included), doc §4."""
        if self.acceptance_lengths:
            return sum(self.acceptance_lengths) / len(self.acceptance_lengths)
        return self.mean_acceptance


class Capabilities(_Model):
    """What an engine can do on this machine; checks select themselves from this."""

    name: str
    version: str = ""
    modes: list[Mode]
    dtypes: list[DType]
    devices: list[str]
    sampling: bool = Field(description="temperature/top-k/top-p honoured")
    traces: bool = Field(description="exact per-round traces (trees, accepted indices)")
    per_round_acceptance: bool = Field(description="per-round acceptance lengths")
    draft_logits: bool = Field(default=False, description="traces can carry drafter logits")
    traced_modes: list[Mode] | None = Field(
        default=None, description="modes whose results carry the traces and per-round acceptance; None: all modes"
    )
    verified_tree_modes: list[Mode] = Field(
        default_factory=list,
        description="speculative modes whose every result carries verified_trees (light "
        "traces: each round's tree and the target's argmax at every node), "
        "asked for or not; independent of traces",
    )
    stage_timings: bool = False
    cuda_graphs: bool = Field(
        default=False,
        description="RunConfig.cuda_graphs switches the decode loop between CUDA graphs and eager execution",
    )
    max_context: int | None = None
    max_tensor_parallel: int = Field(default=1, ge=1, description="largest tensor_parallel_size accepted here")
    max_budget: int | None = Field(
        default=None, ge=1, description="largest DDTree budget accepted here (None: not stated)"
    )
    notes: list[str] = Field(default_factory=list)

    def traced(self, mode: str) -> bool:
        """Whether results of ``mode`` carry exact per-round traces."""
        return self.traces and (self.traced_modes is None or mode in self.traced_modes)

    def verified_trees(self, mode: str) -> bool:
        """Whether every result of ``mode`` carries its rounds' verified trees (light traces)."""
        return mode in self.verified_tree_modes

    def per_round(self, mode: str) -> bool:
        """Whether results of ``mode`` carry per-round acceptance lengths."""
        return self.per_round_acceptance and (self.traced_modes is None or mode in self.traced_modes)


class EngineError(RuntimeError):
    """An engine could not be created or could not run; the message names the engine and cause."""


class EngineUsageError(EngineError):
    """The engine was named or configured wrongly (unknown engine, unknown option): a usage error,
    found before any model work."""


class UnknownOption(EngineUsageError):
    """An option the engine does not declare; the message names the engine and the option."""


class EngineDied(EngineError):
    """The engine could not start, crashed, hung past its timeout or was killed (out of memory).

    Unlike an :class:`EngineError` raised by ``generate`` (the engine reports a failure and keeps
    running), the engine is gone: nothing more can be asked of it. ``str(exc)`` is one line;
    ``log_tail`` holds the last lines of the engine's log, when there is one.
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class Engine(abc.ABC):
    """A DDTree-capable inference engine, driven by the suite.

    ``model_dir`` holds the target; ``drafter_dir`` the DFlash drafter in z-lab format (may be
    None for plain-only runs). Implementations must accept batches of any size.
    """

    name: str = "engine"
    #: The options (``--engine-option KEY=VALUE``) this engine accepts. The registry refuses any other
    #: before the engine is built (a usage error naming the engine and the option), and so does this
    #: constructor. ``None``: the engine takes arbitrary options and checks them itself.
    OPTIONS: ClassVar[tuple[str, ...] | None] = ()

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        if type(self).OPTIONS is not None:
            refuse_unknown_options(self.name, options, type(self).OPTIONS)
        self.model_dir = model_dir
        self.drafter_dir = drafter_dir
        self.options = options

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """Modes, dtypes, devices, sampling and traces this engine supports here."""

    @abc.abstractmethod
    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """Run a batch; one result per request, in order."""

    def close(self) -> None:
        """Release the engine's resources (processes, devices)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def refuse_unknown_options(engine: str, options: dict, known) -> None:
    """Refuse options the engine does not know (:class:`UnknownOption`), listing the ones it does."""
    known = set(known)
    unknown = sorted(set(options) - known)
    if unknown:
        listed = ", ".join(sorted(known)) if known else "none (this engine takes no options)"
        raise UnknownOption(f"engine '{engine}': unknown option(s) {', '.join(unknown)}; known: {listed}")
