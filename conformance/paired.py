"""Paired, interleaved repeats of engine arms, and when to stop them: the measurement under ``bench``.

An :class:`Arm` is an engine under one configuration (plain decoding, a method, another engine
build). :func:`measure` runs every request through every arm a running :class:`Stream` reads, one
request per ``generate`` call, in an interleaved order (:func:`anchored_rotation`), so that drift in
machine speed hits every arm of a pair alike; each repeat's :class:`CallTiming` per arm lands in a
:class:`Repeat`. A stream turns a repeat into one sample (a ratio) and stops sequentially against its
edge (:mod:`ddtree_conformance.sequential`). :func:`ddtree_conformance.bench.run_bench` is one such
measurement (plain against each method of one engine); an A/B bench of two engine builds is another
(``docs/reference/bench-and-gates.md``). Every call's engine settings are merged per arm
(:func:`run_settings`; a setting that changes becomes ``"mixed"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from ddtree_conformance.adapters.interface import Engine, Request, RequestResult, RunConfig

from .machine_state import Sampler
from .sequential import SequentialPlan, combined_interval, spread_decides_nothing, verdict
from .warmup import WarmupRule, warm_up

__all__ = [
    "MIXED",
    "WALL_SLACK",
    "Arm",
    "BenchError",
    "CallTiming",
    "Measured",
    "Repeat",
    "Stream",
    "WarmupRule",
    "anchored_rotation",
    "call_timing",
    "measure",
    "merge_settings",
    "run_settings",
]


class BenchError(RuntimeError):
    """A benchmark run failed (engine error, failed requests, no usable timings)."""


@dataclass
class CallTiming:
    """What one ``generate`` call contributes: decode seconds on ``clock``, the call's wall seconds,
    the rounds the engine reports (None when it reports none), and the decode tokens emitted."""

    seconds: float
    wall: float
    clock: str
    rounds: int | None
    tokens: int

    def __add__(self, other: CallTiming) -> CallTiming:
        rounds = None if self.rounds is None or other.rounds is None else self.rounds + other.rounds
        return CallTiming(
            self.seconds + other.seconds,
            self.wall + other.wall,
            self.clock if self.clock == other.clock else "mixed",
            rounds,
            self.tokens + other.tokens,
        )


# An engine's own decode time may exceed the wall time of the call around it only by clock noise.
WALL_SLACK = (1.02, 0.002)  # relative, absolute seconds


def call_timing(results: Sequence[RequestResult], wall_s: float) -> CallTiming:
    """Decode seconds of one call on the best clock every result offers, checked against the call's
    wall clock; the rounds the engine reports; the decode tokens emitted (validated by output length).

    Raises :class:`BenchError` when the engine reports more time than the call took.
    """
    stages = [r.timings.stages for r in results]
    if all("round_device" in s for s in stages):
        clock, seconds = "device", sum(s["round_device"] for s in stages)
    elif all("round_wall" in s for s in stages):
        clock, seconds = "engine", sum(s["round_wall"] for s in stages)
    elif all(r.timings.decode is not None for r in results):
        clock, seconds = "engine", sum(r.timings.decode for r in results)
    else:
        clock, seconds = "call", wall_s
    if not (seconds >= 0 and seconds <= wall_s * WALL_SLACK[0] + WALL_SLACK[1]):
        raise BenchError(
            f"the engine reports {seconds:.6f} s of decoding ({clock} clock) in a generate call that "
            f"took {wall_s:.6f} s: its timings cannot be right"
        )
    # decode tokens: the first output token comes from the prefill, except on the call clock
    first = 0 if clock == "call" else 1
    tokens = sum(max(0, len(r.output_ids) - first) for r in results)
    rounds = sum(r.rounds for r in results) if all(r.rounds is not None for r in results) else None
    return CallTiming(float(seconds), float(wall_s), clock, rounds, int(tokens))


@dataclass(frozen=True)
class Arm:
    """One side of a paired measurement: an engine under one configuration, named ``label``."""

    label: str
    engine: Engine
    config: RunConfig


@dataclass
class Repeat:
    """One repeat's totals per arm label (every request once through every arm that ran)."""

    totals: dict[str, CallTiming] = field(default_factory=dict)
    state: dict = field(default_factory=dict)  # the machine after the repeat (machine_state.Sampler.sample)

    def add(self, arm: str, timing: CallTiming) -> None:
        self.totals[arm] = self.totals[arm] + timing if arm in self.totals else timing

    def check(self) -> None:
        for arm, t in self.totals.items():
            if t.tokens == 0 or t.seconds <= 0 or t.rounds == 0:
                raise BenchError(
                    f"{arm}: a repeat timed no decode tokens (max_new_tokens too small, or "
                    "the engine reports zero decode time or rounds); nothing to measure"
                )

    def sample(self, arm: str, baseline: str = "plain") -> dict:
        """The cost-model sample of ``arm`` against ``baseline`` (plain decoding) in this repeat.

        ``step`` = plain decode seconds / plain decode tokens (one token per plain step); ``tau`` =
        decode tokens emitted / rounds; ``round`` = decode seconds / rounds. The rounds cancel in
        ``tau x step / round``, which is the decode tokens/s ratio: what an engine reports about
        its rounds or acceptance can shift the two factors, never the speedup.
        """
        plain, method = self.totals[baseline], self.totals[arm]
        rounds = method.rounds if method.rounds is not None else method.tokens
        step, rnd = plain.seconds / plain.tokens, method.seconds / rounds
        tau = method.tokens / rounds
        return {
            "step_s": step,
            "round_s": rnd,
            "tau": tau,
            "ratio": step / rnd,
            "speedup": tau * step / rnd,
            "rounds_reported": method.rounds is not None,
            "wall_ratio": (method.tokens / method.wall) / (plain.tokens / plain.wall),
        }


@dataclass(frozen=True)
class Stream:
    """A per-repeat sample (a ratio, > 0) computed from the arms it reads: what the interval is over.

    ``edge``: the lower edge it is judged against (sequential: repeats stop once the interval clears
    it); None: measured alongside. ``spread``: the between-run variance of the log sample its baseline
    recorded, with its degrees of freedom (:func:`ddtree_conformance.sequential.combined_interval`): the
    interval is widened by it, and a stream whose spread alone keeps the interval from ever clearing the
    edge stops inconclusive at its first look instead of spending the time budget."""

    label: str
    arms: tuple[str, ...]
    sample: Callable[[Repeat], float]
    edge: float | None = None
    spread: tuple[float, int] | None = None
    fails: bool = True  # False: an interval below the edge stops inconclusive (a baseline of one run)


@dataclass
class Measured:
    """What :func:`measure` returns: every repeat, the results of repeat 0 per arm, and per stream why
    it stopped (``decision``: pass, regression, inconclusive or fixed; ``reason``, ``repeats``,
    ``elapsed_s``)."""

    history: list[Repeat]
    first: dict[str, list[RequestResult]]
    stop: dict[str, dict]
    settings: dict[str, dict] = field(default_factory=dict)  # per arm: what every call ran under
    warmup: dict = field(default_factory=dict)  # rounds, seconds, steady, reason, per-round times and states
    plan: SequentialPlan | None = None  # the plan the streams stopped under (re-planned within the budget)


MIXED = "mixed"


def merge_settings(merged: dict, settings: dict) -> dict:
    """``merged`` with one call's settings folded in, as a new dict: a key whose value changes becomes ``"mixed"``."""
    out = dict(merged)
    for key, value in settings.items():
        if key not in out:
            out[key] = value
        elif out[key] != value:
            out[key] = MIXED
    return out


def run_settings(results: Sequence[RequestResult], config: RunConfig) -> dict:
    """The settings one call ran under that change speed: what the engine reports
    (``RequestResult.engine_settings``) and, from the config, the dtype and tensor-parallel size."""
    merged: dict = {}
    for result in results:
        merged = merge_settings(merged, result.engine_settings)
    return merge_settings(merged, {"dtype": config.dtype, "tensor_parallel_size": config.tensor_parallel_size})


def anchored_rotation(arms: list[str], r: int, i: int) -> list[str]:
    """Call order for request ``i`` of repeat ``r``: the first arm (the anchor, plain decoding) first
    when ``r + i`` is even and last when odd; the others rotated by the repeat."""
    anchor, others = arms[0], arms[1:]
    rotated = others[r % len(others) :] + others[: r % len(others)] if others else []
    return [anchor, *rotated] if (r + i) % 2 == 0 else [*rotated, anchor]


def measure(
    arms: Sequence[Arm],
    requests: list[Request],
    streams: Sequence[Stream],
    *,
    repeats: int = 5,
    plan: SequentialPlan | None = None,
    warmup: bool | WarmupRule = True,
    order: Callable[[list[str], int, int], list[str]] = anchored_rotation,
    on_step: Callable[[str], None] | None = None,
    now: Callable[[], float] = time.perf_counter,
    sampler: Sampler | None = None,
    prime: bool = True,
) -> Measured:
    """Paired, interleaved repeats of ``arms`` over ``requests``, one request per ``generate`` call.

    Every repeat runs each request through every arm a still-running stream reads, in ``order``
    (default :func:`anchored_rotation`; the first arm must be read by every stream), and then computes
    each stream's sample. Streams with an ``edge`` are sequential under ``plan``: at its planned looks
    a stream stops once its interval clears the edge, and stops undecided at the plan's time budget or
    repeat cap; streams without an edge stop when no sequential stream is left. Without any edge:
    ``repeats`` fixed repeats. Each arm's first request of a repeat may carry any engine and config,
    so two engine builds can be interleaved against each other (an A/B run) as plain is against a
    method here.

    ``warmup``: True is :meth:`WarmupRule.for_device` of the first arm's device (warm up until steady),
    False none, or a rule; ``prime``: with no warm-up, one untimed call per arm right before the first
    timed repeat (:func:`~ddtree_conformance.warmup.warm_up`).
    ``sampler`` (:class:`~ddtree_conformance.machine_state.Sampler`) samples the machine after every
    warm-up round and every repeat, outside the timed calls (``Repeat.state``).
    """
    if not requests:
        raise BenchError("no requests to measure")
    plan = plan or SequentialPlan()
    by_label = {arm.label: arm for arm in arms}
    if len(by_label) != len(arms):
        raise BenchError("arm labels must be distinct")
    sequential = any(s.edge is not None for s in streams)
    if not sequential and repeats < 2:
        raise BenchError(f"repeats must be >= 2 for an interval, got {repeats}")
    call = _Caller(now, on_step)
    device = arms[0].config.device if arms else "cpu"
    rule = WarmupRule.for_device(device) if warmup is True else warmup or None
    warm = warm_up(rule, arms, requests[:1], order, call, now, sampler, prime=prime)
    history: list[Repeat] = []
    first: dict[str, list[RequestResult]] = {arm.label: [] for arm in arms}
    settings: dict[str, dict] = {arm.label: {} for arm in arms}
    active = list(streams)
    stop: dict[str, dict] = {}
    started = now()
    while active:
        needed = {a for s in active for a in s.arms}
        running = [arm for arm in arms if arm.label in needed]
        ran = _run_repeat(running, requests, len(history), order, call)
        for label, merged in ran.settings.items():
            settings[label] = merge_settings(settings[label], merged)
        if not history:  # repeat 0 runs the requests in prompt order: the acceptance run
            first = {**first, **ran.results}
        repeat = ran.repeat
        repeat.check()
        if sampler is not None:
            repeat.state = sampler.sample()
        history.append(repeat)
        n = len(history)
        elapsed = now() - started
        if sequential and n == plan.min_repeats:  # before the first look: drop looks the budget cannot reach
            plan = plan.within_budget(n, elapsed)
        for stream in list(active):
            entry = _stream_stop(stream, history, elapsed, plan=plan, sequential=sequential, repeats=repeats)
            if entry is not None:
                stop[stream.label] = entry
                active.remove(stream)
        if sequential and active and all(s.edge is None for s in active):
            for stream in active:  # only unbanded streams left: they were measured alongside, stop them too
                stop[stream.label] = _stop_entry(
                    "fixed", f"measured alongside the banded runs ({n} repeats)", n, elapsed
                )
            active = []
    return Measured(history, first, stop, settings, warm, plan)


@dataclass(frozen=True)
class _Caller:
    """One ``generate`` call of an arm, timed on ``now`` and checked: every request must succeed."""

    now: Callable[[], float]
    on_step: Callable[[str], None] | None

    def __call__(self, arm: Arm, batch: list[Request]) -> tuple[list[RequestResult], CallTiming]:
        started = self.now()
        results = arm.engine.generate(batch, arm.config)
        wall = self.now() - started
        failed = [r for r in results if r.finish_reason == "error"]
        if failed or len(results) != len(batch):
            first = (failed[0].error or "").strip().splitlines() if failed else ["wrong number of results"]
            raise BenchError(
                f"{arm.label}: {len(failed)} of {len(batch)} requests failed ({first[-1] if first else 'no message'})"
            )
        if self.on_step:
            self.on_step(arm.label)
        return results, call_timing(results, wall)


class _RepeatRun(NamedTuple):
    """One repeat's calls: the repeat's totals, per arm the settings its calls ran under (merged) and
    its results in the order the requests ran."""

    repeat: Repeat
    settings: dict[str, dict]
    results: dict[str, list[RequestResult]]


def _run_repeat(
    running: Sequence[Arm],
    requests: list[Request],
    r: int,
    order: Callable[[list[str], int, int], list[str]],
    call: _Caller,
) -> _RepeatRun:
    """Repeat ``r``: every request (rotated by ``r``) once through every arm in ``running``, in ``order``."""
    by_label = {arm.label: arm for arm in running}
    labels = [arm.label for arm in running]
    repeat = Repeat()
    settings: dict[str, dict] = {label: {} for label in labels}
    results: dict[str, list[RequestResult]] = {label: [] for label in labels}
    for i in range(len(requests)):
        request = requests[(i + r) % len(requests)]
        for label in order(labels, r, i):
            got, timing = call(by_label[label], [request])
            settings[label] = merge_settings(settings[label], run_settings(got, by_label[label].config))
            repeat.add(label, timing)
            results[label].append(got[0])
    return _RepeatRun(repeat, settings, results)


def _stop_entry(decision: str, reason: str, repeats: int, elapsed: float) -> dict:
    """Why a stream stopped, as :attr:`Measured.stop` holds it."""
    return {"decision": decision, "reason": reason, "repeats": repeats, "elapsed_s": elapsed}


def _stream_stop(
    stream: Stream, history: list[Repeat], elapsed: float, *, plan: SequentialPlan, sequential: bool, repeats: int
) -> dict | None:
    """Whether ``stream`` stops after the repeats in ``history`` (its :func:`_stop_entry`), or None."""
    n = len(history)
    capped = elapsed >= plan.time_budget_s or n >= plan.max_repeats
    if sequential and stream.edge is not None and (plan.is_look(n) or (capped and n >= 2)):
        entry = _look(stream, history, elapsed, plan)
        if entry is not None:
            return entry
    if not sequential and n >= repeats:
        return _stop_entry("fixed", f"{repeats} fixed repeats", n, elapsed)
    if sequential and capped:
        if elapsed >= plan.time_budget_s:
            why = f"time budget {plan.time_budget_s:g} s spent"
        elif plan.budget_cap:
            why = f"time budget {plan.time_budget_s:g} s spent (the repeats it holds at this pace)"
        else:
            why = f"repeat cap {plan.max_repeats} reached"
        banded = stream.edge is not None
        return _stop_entry(
            "inconclusive" if banded else "fixed",
            f"{why} after {n} repeats" + (": the interval still straddles the edge" if banded else ""),
            n,
            elapsed,
        )
    return None


def _look(stream: Stream, history: list[Repeat], elapsed: float, plan: SequentialPlan) -> dict | None:
    """A sequential look at a banded stream: its stop once the interval clears the edge, or once the
    baseline's spread alone keeps it from ever clearing; else None."""
    n = len(history)
    samples = [stream.sample(h) for h in history if all(a in h.totals for a in stream.arms)]
    extra, extra_df = stream.spread or (0.0, 0)
    interval = combined_interval(samples, plan.look_alpha, extra, extra_df)
    found = verdict(interval, stream.edge)
    if found:
        where = "at or above" if found == "pass" else "below"
        spread = " (baseline's between-run spread included)" if stream.spread else ""
        if found == "regression" and not stream.fails:
            found, spread = (
                "inconclusive",
                (", but the baseline records one run, so its between-run spread is unknown: not a failure"),
            )
        return _stop_entry(found, f"interval {where} the edge {stream.edge:.4f} after {n} repeats{spread}", n, elapsed)
    if stream.spread and spread_decides_nothing(samples, plan.look_alpha, stream.spread, stream.edge):
        return _stop_entry(
            "inconclusive",
            f"the between-run spread alone keeps the interval across the edge "
            f"{stream.edge:.4f} after {n} repeats: more repeats cannot decide it",
            n,
            elapsed,
        )
    return None
