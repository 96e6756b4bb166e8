"""What a check could have seen: the smallest systematic effect its evidence detects.

A pass says as much as the evidence behind it. Every check result gets ``details["detectable"]``:
one line naming what the check looked at and the smallest systematic fault it would have caught
with probability :data:`POWER`, from the counts in its own details:

* scored output positions (token scoring, every dtype): a fault that puts a token outside the
  near-tie bound at a fraction ``f`` of positions, independently, is missed by all ``N`` with
  probability ``(1 - f)^N``; the smallest ``f`` caught with probability ``POWER`` is
  ``1 - (1 - POWER)^(1/N)`` (about ``3/N``). In bf16/fp16 a bias that stays within the bound (the
  runner-up at near ties) shows only once the excused positions pass the ceiling: that needs about
  ``ceiling - expected`` extra excused positions;
* compared outputs (exact comparison, no scoring): the same rule over outputs;
* replayed rounds (acceptance): the same rule over rounds, for a wrong acceptance length;
* sampled transitions (sampling): the smallest effect size ``w`` (Cohen's, the distance between the
  engine's transition distribution and the request's) that the chi-square test rejects with
  probability ``POWER`` at its own ``alpha`` and degrees of freedom (:func:`chi2_detectable_w`);
* node checks (branch-vs-chain) and traced rounds (tree-structure): the rule over nodes or rounds.

These are statements about independent faults; a bug that shows only at a few contexts is caught
only if those contexts are in the run, which is what more prompts and tokens (``--profile
thorough``) buy.
"""

from __future__ import annotations

import math
from enum import StrEnum

from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

__all__ = ["POWER", "Evidence", "smallest_rate", "chi2_detectable_w", "detectable"]

POWER = 0.95


class Evidence(StrEnum):
    """What a check family counts (declared per family: :mod:`ddtree_conformance.checks.families`)."""

    OUTPUTS = "scored output positions or compared outputs"
    REPLAYED_ROUNDS = "replayed rounds"
    TRACED_ROUNDS = "traced rounds"
    NODES = "tree nodes"
    TRANSITIONS = "sampled transitions"


def smallest_rate(count: int, power: float = POWER) -> float:
    """The smallest independent per-item fault rate that ``count`` items catch with ``power``."""
    return 1.0 - (1.0 - power) ** (1.0 / count) if count > 0 else 1.0


def chi2_detectable_w(n: int, dof: int, alpha: float, power: float = POWER) -> float:
    """Cohen's ``w`` that a chi-square test of ``n`` observations and ``dof`` degrees of freedom at
    ``alpha`` rejects with probability ``power`` (noncentrality ``n * w^2``)."""
    if n <= 0 or dof <= 0:
        return math.inf
    critical = chi2.isf(alpha, dof)
    return brentq(lambda w: ncx2.sf(critical, dof, n * w * w) - power, 1e-6, 100.0)


def _rate(count: int, unit: str) -> str:
    rate = smallest_rate(count)
    return f"{count} {unit}: a fault in 1 of {1 / rate:,.0f} {unit} ({rate:.2%}) or more shows with {POWER:.0%}"


def detectable(evidence: Evidence, details: dict) -> str | None:
    """The line for ``details["detectable"]`` of a check counting ``evidence`` (module doc), or None when
    the details hold no count. Scored positions and compared outputs count for every family that has them."""
    scoring = details.get("scoring") or {}
    if evidence is Evidence.TRANSITIONS and details.get("transitions"):
        w = chi2_detectable_w(details["transitions"], details.get("dof", 0), details.get("alpha", 1e-3))
        return (
            f"{details['transitions']:,} sampled transitions: a transition distribution {w:.3g} (Cohen's w) or "
            f"more from the request's shows with {POWER:.0%}"
        )
    if evidence is Evidence.REPLAYED_ROUNDS and details.get("rounds"):
        return _rate(int(details["rounds"]), "replayed rounds") + " (a wrong acceptance length)"
    if evidence is Evidence.NODES and details.get("nodes"):
        return _rate(int(details["nodes"]), "tree nodes") + " (a node the target does not choose on its path)"
    if scoring.get("positions"):
        line = _rate(int(scoring["positions"]), "output positions") + " (a token outside the near-tie bound)"
        ceiling, expected = scoring.get("ceiling"), scoring.get("expected_excused")
        if ceiling and expected is not None:
            line += (
                f"; a bias within the bound shows once it adds about {max(1, round(ceiling - expected))} "
                f"excused positions (ceiling {ceiling})"
            )
        return line
    if details.get("compared"):
        return _rate(int(details["compared"]), "compared outputs") + " (an output that differs)"
    if evidence is Evidence.TRACED_ROUNDS and details.get("rounds"):
        return _rate(int(details["rounds"]), "traced rounds") + " (a malformed round)"
    return None
