"""How the reference engine times its decode loop and its stages (see :class:`DecodeClock`), and how
long the device is busy inside it (:func:`busy_probe`); and how the benches time a piece captured in a CUDA graph
(:func:`graph_replay_us`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["DecodeClock", "busy_probe", "busy_seconds", "graph_replay_us"]


@dataclass
class DecodeClock:
    """Decode-loop time, and per-stage time when ``enabled``, with no host sync per round.

    CUDA: events on the device's current stream, read once in :meth:`finish` (one synchronize per
    request), so times are the device's own timeline, host stalls included. Elsewhere:
    ``perf_counter``. :meth:`start`/:meth:`finish` bracket the decode loop, whose span becomes
    ``stages["round_device"]`` (CUDA events) or ``stages["round_wall"]``: what ``bench`` divides by
    the rounds (plain: steps).
    """

    enabled: bool
    device: torch.device
    stages: dict[str, float] = field(default_factory=dict)
    _marks: list = field(default_factory=list)  # (stage, begin, end): events or floats
    _span: list = field(default_factory=list)

    def _now(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def start(self) -> None:
        self._span = [self._now()]

    @contextmanager
    def stage(self, name: str):
        if not self.enabled:
            yield
            return
        begin = self._now()
        yield
        self._marks.append((name, begin, self._now()))

    def finish(self) -> dict[str, float]:
        """Resolve every mark (one device sync on CUDA); the stage totals in seconds."""
        cuda = self.device.type == "cuda"
        if self._span:
            self._span.append(self._now())
        last = self._span[-1] if self._span else self._marks[-1][2] if self._marks else None
        if cuda and last is not None:
            last.synchronize()
        seconds = (lambda a, b: a.elapsed_time(b) / 1e3) if cuda else (lambda a, b: b - a)
        for name, begin, end in self._marks:
            self.stages[name] = self.stages.get(name, 0.0) + seconds(begin, end)
        if len(self._span) == 2:
            self.stages["round_device" if cuda else "round_wall"] = seconds(*self._span)
        self._marks, self._span = [], []
        return self.stages


def busy_seconds(intervals: Iterable[tuple[int, int]]) -> float:
    """Seconds covered by the union of ``(start_ns, end_ns)`` intervals (overlaps counted once)."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total / 1e9


@contextmanager
def busy_probe(enabled: bool, device: torch.device) -> Iterator[dict[str, float]]:
    """Time the device is busy inside the block: ``{"gpu_busy": seconds}`` once it exits (CUDA and
    ``enabled`` only; else ``{}``). A profiler records every kernel, copy and fill the device runs,
    graph replays included; their union is the busy time. It slows the block a little: a probe, not
    a timed run."""
    found: dict[str, float] = {}
    if not enabled or device.type != "cuda":
        yield found
        return
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        yield found
        torch.cuda.synchronize(device)
    events = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA]
    found["gpu_busy"] = busy_seconds((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events)
    found["gpu_busy_events"] = float(len(events))


def graph_replay_us(work: Callable[[], object], replays: int, timings: int = 5) -> tuple[float, object]:
    """``(microseconds per replay, work's output)`` for ``work`` captured in one CUDA graph: three warm-up calls on a
    side stream, the capture, then ``timings`` timings of ``replays`` back-to-back replays (CUDA events); the median.
    The output is the captured call's (its tensors hold the last replay's values). For the benches that time a piece
    of the round as its graph runs it (scripts/bench_tree_graph.py, scripts/bench_elementwise.py)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            work()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = work()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(timings):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    return statistics.median(samples), out
