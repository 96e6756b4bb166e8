"""Sequential confidence intervals for a throughput ratio: when to stop repeating, and the verdict.

One sample per repeat: the repeat's speedup ``x_i > 0`` (see :mod:`ddtree_conformance.bench`).
Model: ``log x_i`` independent and normal with unknown mean ``mu`` and standard deviation; the
estimate is the geometric mean ``exp(mean log x)``.

**Planned looks.** The bench looks at the data only at planned repeat counts: a geometric schedule
from ``min_repeats`` to ``max_repeats`` (each look about ``growth`` times the previous one; e.g.
3, 5, 8, 12, 18, 27, 41, 60 for 3..60 at 1.5), ``K`` looks in all. Every look uses the two-sided
Student-t interval for ``mu`` at level ``1 - alpha / K`` (Bonferroni over the planned looks). When
the time budget runs out between two looks, one final look is taken at the repeats done; it stands
in for the planned looks that will never happen, so at most ``K`` looks are ever taken. By the union
bound the chance that *any* look's interval misses ``mu`` is at most ``alpha``, whatever the
stopping rule; each wrong verdict (a pass below the edge, a regression at or above it) has
probability at most ``alpha / 2``. A run with a fixed number of repeats makes one look at ``alpha``.

Why planned looks rather than a look after every repeat: the per-look level only shrinks with the
number of looks, and a geometric schedule keeps that number logarithmic in the repeats. With looks
at every repeat and ``alpha_k = alpha / (k (k + 1))`` (this module's first method) the 40th look ran
at ``alpha / 1640``; measured on one H200 (8B-shaped pair, +5 % verify mutant), that left the
mutant inconclusive at the 60 s per-verdict budget, where planned looks decide it.

**Looks the time budget cannot reach are dropped.** After ``min_repeats`` repeats, before their look,
the run re-plans once (:meth:`SequentialPlan.within_budget`): the repeat cap falls to the repeats the time
budget holds at the pace so far, and ``K`` counts only the looks up to it. At the pace of issue 29's H200
trials (8B-shaped pair, about 3.2 s a repeat, 54 s a verdict) that is looks 3, 5, 8, 12, 16 instead of
3 .. 60, so every look runs at alpha / 5 instead of alpha / 8. A slower stretch later only ends the run at
the budget before the last planned look; the union bound still holds (at most ``K`` looks).

**Verdict against an edge L** (the baseline's ``value - band``): ``pass`` when the whole interval
is at or above L, ``regression`` when it is entirely below L, otherwise undecided (``None``): go on
repeating, or, once the time budget is spent, ``inconclusive``.

tests/test_sequential.py checks the error rates and the power on synthetic samples with known
truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from scipy import stats

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_POWER",
    "Interval",
    "SequentialPlan",
    "planned_looks",
    "look_alpha",
    "ratio_interval",
    "combined_interval",
    "repeats_to_decide",
    "spread_decides_nothing",
    "verdict",
    "cv",
    "detectable_drop",
]

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
SPENDING = "planned geometric looks, each at alpha / K (Bonferroni over the K planned looks)"
METHOD = "Student-t interval on log(speedup) per repeat, geometric mean"


@dataclass(frozen=True)
class SequentialPlan:
    """How long a sequential run may go: looks start at ``min_repeats``; it stops undecided after
    ``max_repeats`` repeats or once ``time_budget_s`` seconds of timed repeats are spent."""

    alpha: float = DEFAULT_ALPHA
    min_repeats: int = 3
    max_repeats: int = 60
    time_budget_s: float = 600.0
    growth: float = 1.5
    budget_cap: bool = False  # max_repeats is what the time budget holds at the run's pace (within_budget)

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if self.min_repeats < 2:
            raise ValueError(f"min_repeats must be >= 2 (an interval needs two samples), got {self.min_repeats}")
        if self.max_repeats < self.min_repeats:
            raise ValueError(f"max_repeats ({self.max_repeats}) must be >= min_repeats ({self.min_repeats})")
        if self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s}")
        if not self.growth > 1:
            raise ValueError(f"growth must be > 1, got {self.growth}")

    def within_budget(self, repeats_done: int, elapsed_s: float) -> SequentialPlan:
        """This plan with its repeat cap lowered to what the time budget holds at the pace of the first
        ``repeats_done`` repeats (never below them or ``min_repeats``): planned looks the budget cannot
        reach would each still take a share of alpha, so dropping them before the first look narrows
        every interval the run will see. :func:`~ddtree_conformance.paired.measure` re-plans once, after
        ``min_repeats`` repeats and before their look; the pace is timing alone, not the ratios looked at."""
        if repeats_done < 1 or elapsed_s <= 0:
            return self
        reachable = int(self.time_budget_s * repeats_done / elapsed_s)
        cap = max(self.min_repeats, repeats_done, min(self.max_repeats, reachable))
        return self if cap >= self.max_repeats else replace(self, max_repeats=cap, budget_cap=True)

    def looks(self) -> tuple[int, ...]:
        """The planned look points (repeat counts), ``min_repeats`` .. ``max_repeats``."""
        return planned_looks(self.min_repeats, self.max_repeats, self.growth)

    def is_look(self, repeats: int) -> bool:
        return repeats in self.looks()

    @property
    def look_alpha(self) -> float:
        """The two-sided level of every look: ``alpha / K``."""
        return self.alpha / len(self.looks())

    def as_report(self) -> dict:
        """The report's ``plan``: the sequential plan a run stopped under."""
        return {
            "alpha": self.alpha,
            "min_repeats": self.min_repeats,
            "max_repeats": self.max_repeats,
            "time_budget_s": self.time_budget_s,
            "growth": self.growth,
            "looks": list(self.looks()),
            "max_repeats_from_budget": self.budget_cap,
        }


@lru_cache(maxsize=256)
def planned_looks(min_repeats: int, max_repeats: int, growth: float) -> tuple[int, ...]:
    points, n = [], min_repeats
    while n < max_repeats:
        points.append(n)
        n = max(n + 1, math.ceil(n * growth))
    points.append(max_repeats)
    return tuple(points)


def look_alpha(alpha: float, looks_planned: int, sequential: bool = True) -> float:
    """The two-sided level of each look of a sequential run with ``looks_planned`` planned looks;
    a fixed-size run makes one look at alpha."""
    if looks_planned < 1:
        raise ValueError(f"looks_planned must be >= 1, got {looks_planned}")
    return alpha / looks_planned if sequential else alpha


@dataclass(frozen=True)
class Interval:
    estimate: float  # geometric mean of the samples
    low: float
    high: float
    level: float  # confidence level 1 - alpha_k of this interval
    n: int

    def as_dict(self) -> dict:
        return {
            "estimate": self.estimate,
            "ci_low": self.low,
            "ci_high": self.high,
            "confidence": self.level,
            "n": self.n,
        }


@lru_cache(maxsize=4096)
def _t_quantile(alpha_k: float, df: int) -> float:
    return float(stats.t.ppf(1 - alpha_k / 2, df=df))


def ratio_interval(samples: Sequence[float], alpha_k: float) -> Interval:
    """Geometric mean of ``samples`` and the t interval of level ``1 - alpha_k`` around it."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        raise ValueError(f"an interval needs at least 2 samples, got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"samples must be finite and > 0, got {x.tolist()}")
    y = np.log(x)
    mean = float(y.mean())
    se = float(y.std(ddof=1)) / math.sqrt(y.size)
    half = _t_quantile(float(alpha_k), int(y.size - 1)) * se
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), 1 - alpha_k, int(y.size))


def combined_interval(samples: Sequence[float], alpha_k: float, extra_var: float = 0.0, extra_df: int = 0) -> Interval:
    """:func:`ratio_interval` widened by a between-run variance of the mean log sample (``extra_var``,
    estimated with ``extra_df`` degrees of freedom): the interval of today's mean log sample *minus* a
    baseline's mean, when the baseline's value moves from run to run (machine, day) by that much.

    Variance ``se^2 + extra_var``; its t quantile at the Welch-Satterthwaite degrees of freedom
    ``(se^2 + extra_var)^2 / (se^4 / (n - 1) + extra_var^2 / extra_df)``. ``extra_var`` 0: exactly
    :func:`ratio_interval`."""
    if not extra_var:
        return ratio_interval(samples, alpha_k)
    if extra_var < 0 or extra_df < 1:
        raise ValueError(f"extra_var must be >= 0 with extra_df >= 1, got {extra_var}, {extra_df}")
    x = np.asarray(samples, dtype=float)
    if x.size < 2:
        raise ValueError(f"an interval needs at least 2 samples, got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"samples must be finite and > 0, got {x.tolist()}")
    y = np.log(x)
    mean = float(y.mean())
    own = float(y.var(ddof=1)) / y.size
    total = own + extra_var
    df = total**2 / (own**2 / (y.size - 1) + extra_var**2 / extra_df)
    half = float(stats.t.ppf(1 - alpha_k / 2, df=df)) * math.sqrt(total)
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), 1 - alpha_k, int(y.size))


def repeats_to_decide(
    samples: Sequence[float], alpha_k: float, edge: float, extra_var: float = 0.0, extra_df: int = 0
) -> int | None:
    """About how many repeats, at this run's mean and per-repeat noise, would bring the interval clear of
    ``edge``; None when no number would (the between-run spread alone spans the edge, or the mean sits on
    it). A rough guide for the message of an inconclusive verdict, not a promise."""
    x = np.log(np.asarray(samples, dtype=float))
    if x.size < 2:
        return None
    gap = abs(float(x.mean()) - math.log(edge))
    sd = float(x.std(ddof=1))
    for n in (*range(x.size + 1, 200), *range(200, 2001, 50)):
        own = sd**2 / n
        total = own + extra_var
        df = n - 1 if not extra_var else total**2 / (own**2 / (n - 1) + extra_var**2 / max(extra_df, 1))
        if float(stats.t.ppf(1 - alpha_k / 2, df=df)) * math.sqrt(total) < gap:
            return n
    return None


def spread_decides_nothing(samples: Sequence[float], alpha_k: float, spread: tuple[float, int], edge: float) -> bool:
    """Whether the between-run spread (variance, df) alone, with the run's own noise gone (infinitely many
    repeats at today's mean), still leaves ``edge`` inside the interval: then no number of repeats decides."""
    mean = float(np.mean(np.log(np.asarray(samples, dtype=float))))
    floor = combined_interval([math.exp(mean)] * 2, alpha_k, spread[0], spread[1])
    return floor.low < edge <= floor.high


def verdict(interval: Interval, edge: float) -> str | None:
    """``pass`` (whole interval >= edge), ``regression`` (whole interval < edge), or None."""
    if interval.low >= edge:
        return "pass"
    if interval.high < edge:
        return "regression"
    return None


def cv(samples: Sequence[float]) -> float | None:
    """Coefficient of variation (sample sd / mean); None below two samples."""
    x = np.asarray(samples, dtype=float)
    return float(x.std(ddof=1) / x.mean()) if x.size > 1 else None


def detectable_drop(
    samples: Sequence[float], alpha_k: float, band: float = 0.0, power: float = DEFAULT_POWER
) -> float | None:
    """The minimum detectable effect of a run with these samples' noise and count: the smallest
    relative drop below a baseline that its interval (level ``1 - alpha_k``) would call a regression
    with probability ``power``, for a band of ``band`` (a fraction of the baseline).

    A regression is called when the interval's upper end ``exp(mean + t se)`` is below the edge
    ``value (1 - band)``; that happens with probability ``power`` once the true value is
    ``z_power se`` further down: ``1 - (1 - band) exp(-(t + z_power) se)``, with ``se`` the standard
    error of the mean log sample. With ``band`` 0 it is the run's own resolution. None below two
    samples."""
    x = np.asarray(samples, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        return None
    se = float(np.log(x).std(ddof=1)) / math.sqrt(x.size)
    spread = (_t_quantile(float(alpha_k), int(x.size - 1)) + float(stats.norm.ppf(power))) * se
    return 1 - (1 - band) * math.exp(-spread)
