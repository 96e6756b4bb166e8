"""Performance mutants: the reference engine made slower in one place, by an amount that scales.

The throughput gate must call every one of them a regression and the unchanged engine a pass;
``scripts/gate_decisiveness.py`` measures how often it does.

* :class:`SlowVerify` (``verify_slowdown``, default 0.05; :class:`SlowVerify10` 0.10): every tree
  verify costs that fraction of its own time more. The verify forward (eager, or a graph replay on
  the fast path) is timed (CUDA events read after one synchronize; ``perf_counter`` elsewhere), then
  the host busy-waits ``fraction x`` that time while the device has nothing queued, so the extra
  cost lands on the critical path and is proportional to the real verify time on any hardware. Plain decoding and
  the prefill are left
  alone: a target forward slower everywhere would slow plain decoding as much and leave the
  speedup unchanged, which no relative gate can see (or should).
* :class:`SlowBuild` (``build_extra_s``, default 0.002): every DDTree build costs 2 ms more (the
  device is synchronised, then the host busy-waits 2 ms). DFlash chains are left alone.

They slow a stage of the host path. On a GPU the reference engine's default (``device_tree=auto``) runs a
greedy round at B <= 64 as one graph, which has no such stage to slow, so these mutants always take the host
path there; compare them with a reference that does too (``device_tree=off``), as ``scripts/gate_decisiveness.py``
does, or the comparison measures the two paths, not the injected cost. On a CPU both run the host path.

They are engines like any other (``--engine ddtree_conformance.testing.slow_engines:SlowVerify``)
and keep the reference engine's outputs exactly: only time changes. Each counts the time it added
in ``injected_s`` (seconds, since construction), so a report can show the slowdown it inflicted.

:func:`share_loaded` makes one of them (or a reference engine with other options) reuse the models
another reference engine already holds: one copy of the weights and one set of feature hooks,
however many engines a benchmark compares.
"""

from __future__ import annotations

import time

import torch

from ddtree_conformance.adapters.interface import EngineError
from ddtree_conformance.adapters.reference.engine import ReferenceEngine

__all__ = ["SlowVerify", "SlowVerify10", "SlowBuild", "busy_wait", "share_loaded", "PERFORMANCE_MUTANTS"]


def busy_wait(seconds: float) -> None:
    """Spin the host for ``seconds`` (sleep is too coarse for fractions of a millisecond)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowVerify(ReferenceEngine):
    """The reference engine with every tree verify ``verify_slowdown`` (default 5 %) slower."""

    name = "slow-verify"
    OPTIONS = (*ReferenceEngine.OPTIONS, "verify_slowdown")
    default_slowdown = 0.05

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        fraction = float(options.pop("verify_slowdown", self.default_slowdown))
        super().__init__(model_dir, drafter_dir, **options)
        if not 0 <= fraction < 10:
            raise EngineError(f"{self.name}: verify_slowdown must be in [0, 10), got {fraction}")
        self.verify_slowdown = fraction
        self.injected_s = 0.0
        self.spin = busy_wait

    def _verify(self, decoder, verify):
        device = decoder.pair.device
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            out = super()._verify(decoder, verify)
            end.record(stream)
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1e3
        else:
            started = time.perf_counter()
            out = super()._verify(decoder, verify)
            seconds = time.perf_counter() - started
        extra = self.verify_slowdown * seconds
        self.spin(extra)
        self.injected_s += extra
        return out


class SlowVerify10(SlowVerify):
    """The reference engine with every tree verify 10 % slower."""

    name = "slow-verify-10"
    default_slowdown = 0.10


class SlowBuild(ReferenceEngine):
    """The reference engine with every DDTree build ``build_extra_s`` (default 2 ms) slower."""

    name = "slow-build"
    OPTIONS = (*ReferenceEngine.OPTIONS, "build_extra_s")

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        extra = float(options.pop("build_extra_s", 0.002))
        super().__init__(model_dir, drafter_dir, **options)
        if not 0 <= extra < 1:
            raise EngineError(f"{self.name}: build_extra_s must be in [0, 1) seconds, got {extra}")
        self.build_extra_s = extra
        self.injected_s = 0.0
        self.spin = busy_wait
        inner = self._build

        def slow_build(draft_logits: torch.Tensor, budget: int):
            tree = inner(draft_logits, budget)
            if draft_logits.device.type == "cuda":
                torch.cuda.synchronize(draft_logits.device)
            self.spin(self.build_extra_s)
            self.injected_s += self.build_extra_s
            return tree

        self._build = slow_build


PERFORMANCE_MUTANTS = {"slow-verify-5": SlowVerify, "slow-verify-10": SlowVerify10, "slow-build-2ms": SlowBuild}


def share_loaded(source: ReferenceEngine, cls: type[ReferenceEngine] = ReferenceEngine, **options) -> ReferenceEngine:
    """A ``cls`` engine on ``source``'s directories that reuses every pair ``source`` has loaded so far
    (weights and feature hooks included); it loads nothing itself for those configurations."""
    engine = cls(source.model_dir, source.drafter_dir, **options)
    engine.info = source.info
    engine._loaded = dict(source._loaded)  # same loaded pairs; closing one engine leaves the other's
    return engine
