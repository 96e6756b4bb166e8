"""Which context lengths a run decodes at: drawn per run across the target's whole window.

Kernels switch code paths with the context (KV) length: split-KV and paged attention at powers of
two and at page multiples (16, 32, 64, 128, 256 tokens), cache blocks, RoPE tables. A fault that
shows only in one band of lengths passes any run that never decodes there, so the context-range
check (:mod:`ddtree_conformance.checks.context_range`) decodes at every length it can afford.

A *segment* is one request: a prompt of ``prompt_length`` tokens and ``new_tokens`` output tokens.
Its output token ``i`` is produced attending to ``prompt_length + i`` tokens, so the segment decodes
at the context lengths ``prompt_length .. prompt_length + new_tokens - 1``.

:func:`context_plan` draws the segments from the run seed:

* a window the budget covers (``window - 1 <= budget``, the fixture pair's 1024 with the default
  budget): segments of drawn lengths tile ``1 .. window - 1``, every context length decoded once, and
  no segment ends at ``s - 1`` or ``s`` of a switching point ``s``, so each one is crossed inside one
  decode (the request decodes at ``s - 1``, ``s`` and ``s + 1``);
* a larger window: a segment ending at the window's end (the longest contexts), then segments
  straddling the switching points, powers of two first, then multiples of larger pages before smaller
  ones, each group in drawn order, until the budget is spent.

:func:`coverage` says what a run decoded (from its outputs): the lengths as ranges, a histogram,
the switching points crossed and missed. Nothing here runs a model.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "PAGE_SIZES",
    "DECODE_BUDGET",
    "SEGMENT_TOKENS",
    "Segment",
    "ContextPlan",
    "switching_points",
    "context_plan",
    "coverage",
    "describe",
    "report_line",
]

PAGE_SIZES = (16, 32, 64, 128, 256)  # paged-KV block sizes engines use; their multiples are switching points
DECODE_BUDGET = 1024  # output tokens per mode a plan spends by default (the fixture pair's window, tiled once)
SEGMENT_TOKENS = (24, 96)  # a segment's output tokens are drawn in this range
HISTOGRAM_BINS = 8


@dataclass(frozen=True)
class Segment:
    """One request of the plan: ``prompt_length`` prompt tokens, then ``new_tokens`` output tokens."""

    prompt_length: int
    new_tokens: int

    @property
    def first(self) -> int:
        """The context length its first output token is produced at."""
        return self.prompt_length

    @property
    def last(self) -> int:
        """The context length its last output token is produced at."""
        return self.prompt_length + self.new_tokens - 1


@dataclass(frozen=True)
class ContextPlan:
    """The segments of one run, drawn for a window (the longest context a request may reach)."""

    window: int
    seed: int
    segments: tuple[Segment, ...]
    points: tuple[int, ...]  # the window's switching points, ascending
    tiled: bool  # every context length 1 .. window - 1 is decoded

    def __len__(self) -> int:
        return len(self.segments)


def switching_points(window: int) -> list[int]:
    """Context lengths where kernels switch paths, below ``window - 1`` (so ``s + 1`` fits): powers of
    two from 2, and multiples of every page size in :data:`PAGE_SIZES`."""
    top = window - 1
    points = {1 << k for k in range(1, top.bit_length()) if 1 << k < top}
    for page in PAGE_SIZES:
        points.update(range(page, top, page))
    return sorted(points)


def _priority(points: Sequence[int], rng: random.Random) -> list[int]:
    """Powers of two first, then multiples of larger pages before smaller ones, each group shuffled."""
    groups: dict[int, list[int]] = {}
    for s in points:
        rank = 0 if s & (s - 1) == 0 else next(i + 1 for i, p in enumerate(reversed(PAGE_SIZES)) if s % p == 0)
        groups.setdefault(rank, []).append(s)
    out: list[int] = []
    for rank in sorted(groups):
        group = groups[rank]
        rng.shuffle(group)
        out += group
    return out


def context_plan(
    window: int, seed: int, *, budget: int = DECODE_BUDGET, segment_tokens: tuple[int, int] = SEGMENT_TOKENS
) -> ContextPlan:
    """The segments for a window of ``window`` tokens, drawn from ``seed`` (module doc). ``budget``:
    output tokens the plan may spend. A window below 3 tokens has no plan (no segment)."""
    if window < 3:
        return ContextPlan(window, seed, (), (), False)
    rng = random.Random(f"context-plan:{seed}:{window}")
    points = switching_points(window)
    lo, hi = segment_tokens
    if window - 1 <= budget:
        bad_ends = {s - 1 for s in points} | set(points)
        segments, start = [], 1
        while start <= window - 1:
            end = min(start + rng.randint(lo, hi) - 1, window - 1)
            while end < window - 1 and end in bad_ends:
                end += 1
            segments.append(Segment(start, end - start + 1))
            start = end + 1
        return ContextPlan(window, seed, tuple(segments), tuple(points), True)
    n = min(rng.randint(lo, hi), budget, window - 1)  # the window's end first: the longest contexts
    segments, covered = [Segment(window - n, n)], set()
    spent = n
    order = _priority(points, rng)
    while spent < budget:
        open_points = [s for s in order if s not in covered and not any(g.first < s < g.last for g in segments)]
        s = open_points[0] if open_points else rng.randint(2, window - 2)
        n = max(3, min(rng.randint(lo, hi), budget - spent, window - 1))
        segment = Segment(max(1, min(s - rng.randint(1, n - 2), window - n)), n)
        segments.append(segment)
        covered.update(p for p in points if segment.first < p < segment.last)
        spent += n
    segments.sort(key=lambda g: g.first)
    return ContextPlan(window, seed, tuple(segments), tuple(points), False)


def _ranges(lengths: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for n in sorted(set(lengths)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def coverage(window: int, decoded: Iterable[tuple[int, int]], points: Sequence[int] | None = None) -> dict:
    """What a run decoded: ``decoded`` holds ``(prompt_length, output_length)`` per request. Returns the
    lengths as merged ``ranges`` (``[first, last]``), their ``count``, a ``histogram`` over the window
    (``[lo, hi, lengths decoded in [lo, hi)]``), the switching points ``crossed`` inside one request
    (``s - 1``, ``s`` and ``s + 1`` decoded by it) and ``missed``, and the ``prompt_lengths``."""
    points = list(switching_points(window) if points is None else points)
    lengths: set[int] = set()
    crossed: set[int] = set()
    prompts = []
    for prompt_length, output_length in decoded:
        prompts.append(prompt_length)
        if output_length <= 0:
            continue
        first, last = prompt_length, prompt_length + output_length - 1
        lengths.update(range(first, last + 1))
        crossed.update(s for s in points if first <= s - 1 and s + 1 <= last)
    width = max(1, -(-window // HISTOGRAM_BINS))
    histogram = [
        [lo, min(lo + width, window), sum(1 for n in lengths if lo <= n < lo + width)] for lo in range(0, window, width)
    ]
    return {
        "window": window,
        "count": len(lengths),
        "ranges": _ranges(lengths),
        "histogram": histogram,
        "crossed": sorted(crossed),
        "missed": [s for s in points if s not in crossed],
        "prompt_lengths": sorted(prompts),
    }


def describe(cover: dict) -> str:
    """One line: ``1023 of 1023 context lengths 1..1023 decoded (ranges ...); 66/66 switching points crossed``."""
    ranges = cover["ranges"]
    shown = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in ranges[:6]) + (", ..." if len(ranges) > 6 else "")
    top = cover["window"] - 1
    points = len(cover["crossed"]) + len(cover["missed"])
    missed = f" (missed: {', '.join(map(str, cover['missed'][:8]))}{', ...' if len(cover['missed']) > 8 else ''})"
    return (
        f"{cover['count']} of {top} context lengths decoded ({shown}); "
        f"{len(cover['crossed'])}/{points} switching points crossed inside one request"
        + (missed if cover["missed"] else "")
    )


def report_line(results: Iterable[dict], key: str = "context_lengths") -> str | None:
    """The report's line on context coverage, from check results (dicts) whose details hold ``key``:
    the lengths every run decoded together, and each run's count; None when no result holds one."""
    covers = [
        (r.get("check", "?").split("/", 1)[-1], (r.get("details") or {}).get(key))
        for r in results
        if isinstance((r.get("details") or {}).get(key), dict)
    ]
    if not covers:
        return None
    window = max(c["window"] for _, c in covers)
    lengths = {n for _, c in covers for a, b in c["ranges"] for n in range(a, b + 1)}
    crossed = {s for _, c in covers for s in c["crossed"]}
    points = crossed | {s for _, c in covers for s in c["missed"]}
    ranges = _ranges(lengths)
    shown = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in ranges[:4]) + (", ..." if len(ranges) > 4 else "")
    runs = ", ".join(f"{run} {c['count']}" for run, c in covers)
    return (
        f"context lengths decoded: {len(lengths)} of {window - 1} ({shown}; per run: {runs}); "
        f"{len(crossed)}/{len(points)} switching points crossed inside one request"
    )
