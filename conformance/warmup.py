"""The warm-up before a measurement's timed repeats (``docs/reference/bench-and-gates.md``).

:func:`warm_up` runs untimed rounds of every arm until the machine is steady under a
:class:`WarmupRule` (:func:`ddtree_conformance.machine_state.steady`), or, with no rule, one priming
call per arm right before the first timed repeat. The first call after a pause runs slow: on issue 29's
H200 trials, run without a warm-up per trial and with the host's cores busy, the first repeat's ratio
was the run's smallest in 11 of 12 rows (10-17 % low), and still in 7 of 8 with the load started 5 s
before; repeat 0 calls the candidate first, so an unprimed pause would count against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ddtree_conformance.adapters.interface import Request

from .machine_state import Sampler, steady

__all__ = ["WarmupRule", "warm_up"]


@dataclass(frozen=True)
class WarmupRule:
    """Warm up until steady (:func:`ddtree_conformance.machine_state.steady`): untimed rounds, each every
    arm once on the first request, until the last ``window + 1`` rounds agree within ``tolerance`` per arm
    (and the GPU's SM clock within 1 % and its temperature within 2 deg C, where sampled), at least
    ``min_rounds``; stop regardless after ``max_rounds`` rounds or ``max_seconds``."""

    min_rounds: int = 3
    max_rounds: int = 8
    max_seconds: float = 60.0
    window: int = 2
    tolerance: float = 0.03

    @classmethod
    def for_device(cls, device: str) -> WarmupRule:
        """The default rule for a device: on a GPU, up to 8 rounds or 60 s (clocks and temperature settle
        over seconds); on a CPU, whose first call (allocations, caches) is the warm-up that matters and
        whose per-call noise rarely lets three rounds agree, 2 or 3 rounds (the last two within 3 %)."""
        if device.startswith("cpu"):
            return cls(min_rounds=2, max_rounds=3, max_seconds=30.0, window=1)
        return cls()

    def describe(self) -> str:
        return (
            f"untimed rounds (every configuration once on the first request) until the last {self.window + 1} "
            f"agree within {self.tolerance:.0%} (and the GPU's SM clock within 1 %, temperature within 2 C, "
            f"where sampled); {self.min_rounds} to {self.max_rounds} rounds, at most {self.max_seconds:g} s"
        )


def _no_warm_up() -> dict:
    """The report of no warm-up rounds (what a warm-up starts from)."""
    return {"rounds": 0, "seconds": 0.0, "steady": None, "reason": "no warm-up", "times": [], "states": []}


def warm_up(
    rule: WarmupRule | None,
    arms: Sequence,
    batch: list[Request],
    order: Callable[[list[str], int, int], list[str]],
    call: Callable,
    now: Callable[[], float],
    sampler: Sampler | None,
    *,
    prime: bool = True,
) -> dict:
    """What :attr:`~ddtree_conformance.paired.Measured.warmup` reports: the rounds under ``rule`` until
    steady or capped; with no rule, one untimed call per arm (``prime``) or nothing. ``call(arm, batch)``
    makes one checked, timed call and returns ``(results, timing)``."""
    if rule is not None:
        return _until_steady(rule, arms, batch, order, call, now, sampler)
    warm = _no_warm_up()
    return {**warm, **_prime(arms, batch, order, call, now)} if prime else warm


def _until_steady(
    rule: WarmupRule,
    arms: Sequence,
    batch: list[Request],
    order: Callable[[list[str], int, int], list[str]],
    call: Callable,
    now: Callable[[], float],
    sampler: Sampler | None,
) -> dict:
    """Untimed rounds of every arm on ``batch`` until steady or capped (of the machine states only the
    last is kept)."""
    warm = _no_warm_up()
    by_label = {arm.label: arm for arm in arms}
    labels = [arm.label for arm in arms]
    began = now()
    while True:
        # every arm once, in the timed repeats' order for this round (so no arm is always warmed first)
        done = {label: call(by_label[label], batch)[1].seconds for label in order(labels, len(warm["times"]), 0)}
        row = [done.get(arm.label, 0.0) for arm in arms]
        warm["times"].append([round(t, 9) for t in row])
        if sampler is not None:
            warm["states"].append(sampler.sample())
        n, spent = len(warm["times"]), now() - began
        if n >= rule.min_rounds and steady(warm["times"], warm["states"], window=rule.window, tolerance=rule.tolerance):
            warm.update(steady=True, reason=f"steady after {n} rounds")
            break
        if n >= rule.max_rounds or spent >= rule.max_seconds:
            cap = f"{rule.max_rounds} rounds" if n >= rule.max_rounds else f"{rule.max_seconds:g} s"
            warm.update(steady=False, reason=f"not steady after {n} rounds: stopped at the cap ({cap})")
            break
    warm.update(rounds=len(warm["times"]), seconds=round(now() - began, 3), rule=rule.describe())
    warm["states"] = warm["states"][-1:]  # the last is enough for the report; the rule saw them all
    return warm


def _prime(
    arms: Sequence,
    batch: list[Request],
    order: Callable[[list[str], int, int], list[str]],
    call: Callable,
    now: Callable[[], float],
) -> dict:
    """One untimed call per arm on ``batch``, in repeat 0's order, right before the timed repeats (what
    :attr:`~ddtree_conformance.paired.Measured.warmup` reports when there is no warm-up)."""
    by_label = {arm.label: arm for arm in arms}
    began = now()
    for label in dict.fromkeys(order([arm.label for arm in arms], 0, 0)):
        call(by_label[label], batch)
    return {
        "primed": True,
        "seconds": round(now() - began, 3),
        "reason": "no warm-up; one untimed call per configuration right before the timed repeats",
    }
