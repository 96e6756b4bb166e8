"""One run's identity: what the engine is asked to do, as one frozen value.

A :class:`Run` is a decoding mode (plain, dflash, ddtree) with its budget, and how it runs (traced,
with drafter logits, tensor-parallel size, CUDA graphs on or off or the engine's default). It owns every name the
suite gives a run, so no module rebuilds them from strings:

* :attr:`Run.label`: ``plain``, ``dflash``, ``ddtree-B16`` (reports, bench rows, baselines, messages);
* :meth:`Run.check_id`: ``lossless/ddtree-B16`` (a planned check's id);
* :attr:`Run.golden_key`: ``dflash``, ``ddtree-16`` (acceptance traces in golden files);

The session turns a run into the :class:`~ddtree_conformance.adapters.interface.RunConfig` an engine receives,
adding its dtype and device (:meth:`~ddtree_conformance.session.SuiteSession.run_config`).

Two runs are the same run exactly when they are equal; the run store keys its results by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .adapters.interface import Mode

__all__ = ["Run"]

_LABEL = re.compile(r"(plain|dflash)|ddtree-B([1-9][0-9]*)")


@dataclass(frozen=True)
class Run:
    """A run's identity. ``budget`` belongs to ddtree alone (None otherwise); drafter logits only
    come with traces."""

    mode: Mode
    budget: int | None = None
    trace: bool = False
    draft_logits: bool = False
    tensor_parallel_size: int = 1
    cuda_graphs: bool | None = None  # None: the engine's default (RunConfig.cuda_graphs)

    def __post_init__(self) -> None:
        if self.mode not in ("plain", "dflash", "ddtree"):
            raise ValueError(f"unknown mode {self.mode!r}")
        if self.mode != "ddtree":
            object.__setattr__(self, "budget", None)
        elif self.budget is None or self.budget < 1:
            raise ValueError(f"a ddtree run needs a budget >= 1, got {self.budget!r}")
        if not self.trace:
            object.__setattr__(self, "draft_logits", False)

    @classmethod
    def of(cls, mode: Mode, budget: int | None = None, **how) -> Run:
        return cls(mode, budget, **how)

    @classmethod
    def from_label(cls, label: str) -> Run:
        """The run a label names (``dflash``, ``ddtree-B16``); a ValueError for anything else."""
        match = _LABEL.fullmatch(label)
        if match is None:
            raise ValueError(f"{label!r} is not a run label (plain, dflash, ddtree-B<budget>)")
        return cls("ddtree", int(match[2])) if match[2] else cls(match[1])

    @property
    def label(self) -> str:
        return self.mode if self.budget is None else f"{self.mode}-B{self.budget}"

    def check_id(self, family: str, *rest: str) -> str:
        """``family/label[/rest...]``: the id of a planned check on this run."""
        return "/".join((family, self.label, *rest))

    @property
    def golden_key(self) -> str:
        """The key of this run's acceptance lengths in a golden record."""
        return self.mode if self.budget is None else f"ddtree-{self.budget}"

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    def untraced(self) -> Run:
        """The same decoding without traces (what a check's main run is)."""
        return replace(self, trace=False, draft_logits=False)

    def traced(self, draft_logits: bool = False) -> Run:
        return replace(self, trace=True, draft_logits=draft_logits)

    def describe(self) -> str:
        """How progress lines name the run: ``ddtree, B=16``."""
        graphs = "" if self.cuda_graphs is None else f", CUDA graphs {'on' if self.cuda_graphs else 'off'}"
        return (self.mode if self.budget is None else f"{self.mode}, B={self.budget}") + graphs
