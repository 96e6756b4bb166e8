"""Calibration of the noise model (:class:`~ddtree_conformance.noise.NoiseModel`): where its values
come from and how each is derived.

Source. Calibration values come only from the pair's own manifest, ``<pair dir>/MANIFEST.json``
(the pair dir is the target dir's parent), key ``near_tie_calibration``; nothing else beside the
model is read. :mod:`ddtree_conformance.calibrate` (``scripts/calibrate_near_tie.py``) writes the raw
measurements
there, one entry per ``<dtype>@<device kind>``; every number used is derived from them here, at
load, and range-checked: a derived bound above :data:`MAX_BOUND` (or a drafter tolerance above
:data:`MAX_DRAFTER_TOLERANCE`) is refused with a :class:`CalibrationError` naming the file and
field. A pair without calibration uses the published choice :data:`DEFAULT_BOUND` with the
uniform noise model below, and says so in every verdict.

1. Near-tie bound (nats). Teacher-force the target over real sequences (prompts and their fp32
   greedy outputs) once in fp32 and once in the low dtype. At every position take the fp32 top-1
   and top-2 tokens and measure how far the low-precision gap between *those two tokens* moves:
   ``shift = |gap_low - gap_fp32|``. Two independent low-precision computations (the engine's
   and the reference's) can each move it, so ``bound = 2 * max(shift)`` over every device
   measured. An engine token whose fp32 logit is at least ``top-1 - bound`` may be an honest
   low-precision choice ("excused"); below that it is a wrong token.

2. Excused-position ceiling. A bound alone lets an engine pick the runner-up at *every* near-tie.
   A correct low-precision engine flips a position only where its own noise *shrinks* the fp32
   top-2 gap ``g`` there by more than ``g``. Measure that signed noise, ``shrink = gap_fp32 -
   gap_low`` (positive when low precision narrows the gap), and scale it by 2 (an engine up to
   twice as noisy as the reference, the same factor as the bound): the flip probability at a
   position is ``p(g) = P(2 * shrink >= g)``. The manifest keeps the tail counts ``k(t)`` of
   shrinks ``>= t`` on a fixed log grid of thresholds out of ``N`` positions. For one position,
   ``p_hi(g)`` is the one-sided Clopper-Pearson upper limit (confidence ``1 - ALPHA``) of
   ``k(t) / N`` at the largest grid threshold ``t <= g / 2`` (rounding down the threshold only
   raises the estimate). Over a run's scored positions with fp32 top-2 gaps ``g_j`` the number of
   flips of a correct engine is a sum of independent Bernoulli(``p_j``) draws; a Poisson law with
   mean ``mu = sum_j p_hi(g_j)`` has a heavier upper tail than that sum, so the ceiling is its
   ``1 - ALPHA`` quantile: ``ceiling = poisson.ppf(1 - ALPHA, mu)``. More excused positions than
   the ceiling fail the check. The ceiling follows the run's own gaps (a run full of near-ties
   gets a higher one), while an engine that takes the runner-up wherever the gap is within the
   bound flips every near-tie, far more than ``mu``. The false-alarm rate is at most about
   ``2 * ALPHA`` per check (calibration limit and run quantile).

3. Drafter tolerance (logits). The drafter is run over the same sequences at anchor positions,
   in fp32 and in the low dtype (each on its own dtype's target features, as in an engine). Over
   the tokens that can enter a tree (the top :data:`DRAFTER_TOP` per depth of either side),
   ``tolerance = 2 * max |logit_low - logit_fp32|``. A tree difference is a drafter near-tie only
   when logits within this tolerance explain it (:mod:`ddtree_conformance.replay`).

4. Round caps and the tau test. Every engine measured (the reference, and each correct engine
   that rounds differently, ``engines.<name>`` of an entry: :mod:`ddtree_conformance.testing.rounding_engines`)
   runs greedily in the low dtype over the calibration prompts (DDTree at budgets 16, 64 and 256, and
   DFlash), and every round is replayed in fp32 (:mod:`ddtree_conformance.replay`); of ``R`` rounds,
   ``L`` are longer and ``S`` shorter than the replay with the same tokens (a drafter-side flip).
   Confirmed rounds (the engine's own drafter logits show the flip) are capped at the binomial
   ``1 - ALPHA`` quantile of ``p = 2 * upper(L + S, R)``; unconfirmed longer and shorter rounds each at
   that of ``upper(L, R)`` and ``upper(S, R)``; the tau test allows a mean gain of ``drafter_gain /
   R`` a round (older entries: ``(L - S) / R``) and a share of longer rounds among the flips of
   ``max(1/2, upper(sum L, sum L + S))``, pooled over every engine. Each value is the largest over the
   engines and devices measured; the sources are kept in ``NoiseModel.calibrated_on``.

5. Tie share. Each engine's target is teacher-forced in the low dtype beside the reference's; among
   the positions where exactly one leaves the fp32 argmax, the engine's share (its upper limit, for
   engines with at least :data:`TIE_EVIDENCE` such positions) bounds the tie test's share.

Items 1-3 take every engine's measurements too (a noisier engine widens the bound, the ceiling's
tail and the tolerance).

In float32 everything is exact: bound 0, ceiling 0, drafter tolerance :data:`FP32_DRAFTER_TOLERANCE`
(two correct fp32 implementations, measured 7.6e-6 apart).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .noise import FP32_DRAFTER_TOLERANCE, NoiseModel, upper_limit

__all__ = [
    "DEFAULT_BOUND",
    "MAX_BOUND",
    "MAX_DRAFTER_TOLERANCE",
    "CalibrationError",
    "manifest_path",
    "load_calibration",
    "calibration_from_manifest",
    "near_tie_bound",
    "shift_thresholds",
]

DEFAULT_BOUND = 0.5  # nats; a published choice (doc §7), used when a pair has no calibration
MAX_BOUND = 2.0  # nats: a token e^2 (7.4x) less likely than the top-1 is no tie in any dtype
MAX_DRAFTER_TOLERANCE = 4.0  # logits: beyond this, "within tolerance" would excuse any tree
DEFAULT_DRAFTER_TOLERANCE = 0.5  # logits, for pairs without calibration
DEFAULT_DRAFTER_FLIP_RATE = 0.05  # share of rounds, for pairs without calibration
KEY = "near_tie_calibration"


class CalibrationError(ValueError):
    """A pair's calibration cannot be used; the message names the file and the field."""


def shift_thresholds() -> list[float]:
    """The fixed log grid (1e-4 .. 3.2 nats, four steps a decade) on which shift tail counts are kept."""
    return [float(f"{1e-4 * 10 ** (i / 4):.4g}") for i in range(0, 19)]


def manifest_path(model_dir: str | Path) -> Path:
    return Path(model_dir).resolve().parent / "MANIFEST.json"


def _check_weights(manifest: dict, pair_dir: Path, path: Path) -> None:
    """The manifest's calibration belongs to the weights it lists: the target weights must match."""
    entry = (manifest.get("files") or {}).get("target/model.safetensors")
    weights = pair_dir / "target" / "model.safetensors"
    if not entry or not weights.is_file():
        return
    if weights.stat().st_size != entry.get("bytes"):
        raise CalibrationError(
            f"{path}: files.target/model.safetensors lists {entry.get('bytes')} bytes, the target "
            f"weights have {weights.stat().st_size}: this calibration is for other weights"
        )
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != entry.get("sha256"):
        raise CalibrationError(
            f"{path}: files.target/model.safetensors sha256 differs from the target weights: "
            "this calibration is for other weights"
        )


def _number(value, path: Path, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationError(f"{path}: field {KEY}.{field} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise CalibrationError(f"{path}: field {KEY}.{field} = {value} is outside {low}..{high}")
    return float(value)


def load_calibration(model_dir: str | Path, dtype: str) -> NoiseModel:
    """The derived calibration of the pair of ``model_dir`` for ``dtype`` (see the module doc)."""
    path = manifest_path(model_dir)
    return calibration_from_manifest(path, path.read_bytes() if path.is_file() else None, dtype)


def calibration_from_manifest(path: Path, raw: bytes | None, dtype: str) -> NoiseModel:
    """The noise model for ``dtype`` in the manifest whose bytes ``raw`` were read from ``path``
    (None: there is no manifest); a copy held in memory is parsed the same way as the file."""
    if dtype == "float32":
        return NoiseModel("float32", 0.0, FP32_DRAFTER_TOLERANCE, 0, (), "exact", 0.0)
    default = NoiseModel(
        dtype,
        DEFAULT_BOUND,
        DEFAULT_DRAFTER_TOLERANCE,
        0,
        (),
        f"uncalibrated: no {KEY} for {dtype} in {path}; default bound",
        DEFAULT_DRAFTER_FLIP_RATE,
        DEFAULT_DRAFTER_FLIP_RATE / 4,
        longer_rate=DEFAULT_DRAFTER_FLIP_RATE / 4,
        shorter_rate=DEFAULT_DRAFTER_FLIP_RATE / 4,
    )
    if raw is None:
        return default
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep, an integer too long
        raise CalibrationError(
            f"{path}: not a readable JSON manifest ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
        ) from None
    data = manifest.get(KEY) if isinstance(manifest, dict) else None
    if data is None:
        return default
    measured = data.get("measured") if isinstance(data, dict) else None
    if not isinstance(measured, dict):
        raise CalibrationError(f"{path}: field {KEY}.measured must be an object")
    entries = {k: v for k, v in measured.items() if k.split("@")[0] == dtype}
    if not entries:
        return default
    _check_weights(manifest, path.parent, path)
    derived = _Derived()
    for key, entry in entries.items():
        if not isinstance(entry, dict):
            raise CalibrationError(f"{path}: field {KEY}.measured.{key} must be an object")
        device = key.split("@", 1)[-1]
        derived.add(_Reader(path, f"measured.{key}"), entry, f"reference@{device}")
        engines = entry.get("engines", {})
        if not isinstance(engines, dict):
            raise CalibrationError(f"{path}: field {KEY}.measured.{key}.engines must be an object")
        for name, measurement in engines.items():
            if not isinstance(measurement, dict):
                raise CalibrationError(f"{path}: field {KEY}.measured.{key}.engines.{name} must be an object")
            derived.add(_Reader(path, f"measured.{key}.engines.{name}"), measurement, f"{name}@{device}")
    return derived.model(dtype, f"calibrated on {', '.join(sorted(entries))}, {path.parent.name}/MANIFEST.json")


@dataclass
class _Reader:
    """Range-checked fields of one measurement (an entry, or one engine's part of it)."""

    path: Path
    where: str

    def number(self, entry: dict, field: str, low: float, high: float) -> float:
        return _number(entry.get(field), self.path, f"{self.where}.{field}", low, high)

    def tail(self, entry: dict, positions: int) -> list[tuple[float, int]]:
        tail = entry.get("shift_tail", [])
        if not isinstance(tail, list):
            raise CalibrationError(
                f"{self.path}: field {KEY}.{self.where}.shift_tail must be a list of [threshold, count]"
            )
        pairs = []
        for i, item in enumerate(tail):
            if not (isinstance(item, list) and len(item) == 2):
                raise CalibrationError(
                    f"{self.path}: field {KEY}.{self.where}.shift_tail.{i} must be [threshold, count]"
                )
            where = f"{self.where}.shift_tail.{i}"
            pairs.append(
                (_number(item[0], self.path, where, 0.0, 100.0), int(_number(item[1], self.path, where, 0, positions)))
            )
        return pairs


@dataclass
class _Derived:
    """The noise model's numbers, each the largest over every engine and device measured (module doc)."""

    bound: float = 0.0
    tolerance: float | None = None
    worst_rate: float = -1.0
    chosen: tuple | None = None
    flip_rate: float | None = None
    measured_rate: float | None = None
    longer: float | None = None
    shorter: float | None = None
    gain: float | None = None
    tie_share: float = 0.5
    pooled_longer: int = 0
    pooled_flips: int = 0
    sources: list = field(default_factory=list)

    def add(self, read: _Reader, entry: dict, source: str) -> None:
        if "max_shift" in entry:
            self.bound = max(self.bound, 2 * read.number(entry, "max_shift", 0.0, MAX_BOUND / 2))
            positions = int(read.number(entry, "positions", 1, 1e9))
            pairs = read.tail(entry, positions)
            rate = sum(k for _, k in pairs) / positions
            if pairs and rate > self.worst_rate:  # the noisiest engine's tail covers the others
                self.worst_rate, self.chosen = rate, (positions, tuple(sorted(pairs)))
        if "drafter_max_shift" in entry:
            drafter = read.number(entry, "drafter_max_shift", 0.0, MAX_DRAFTER_TOLERANCE / 2)
            self.tolerance = max(self.tolerance or 0.0, 2 * drafter)
        if "drafter_rounds" in entry:
            rounds = int(read.number(entry, "drafter_rounds", 1, 1e9))
            flips = int(read.number(entry, "drafter_flips", 0, rounds))
            self.flip_rate = max(self.flip_rate or 0.0, 2 * upper_limit(flips, rounds))
            self.measured_rate = max(self.measured_rate or 0.0, flips / rounds)
            if "drafter_longer" in entry:
                longer = int(read.number(entry, "drafter_longer", 0, flips))
                shorter = int(read.number(entry, "drafter_shorter", 0, flips - longer))
                self.longer = max(self.longer or 0.0, upper_limit(longer, rounds))
                self.pooled_longer, self.pooled_flips = (
                    self.pooled_longer + longer,
                    self.pooled_flips + longer + shorter,
                )
                self.shorter = max(self.shorter or 0.0, upper_limit(shorter, rounds))
                # the tau test's allowance: the largest measured mean gain a round over the rounds whose
                # tokens agree (its own statistic carries the run's noise); older entries: longer - shorter
                if "drafter_gain" in entry:
                    gain = read.number(entry, "drafter_gain", -1e9, 1e9) / rounds
                else:
                    gain = (longer - shorter) / rounds
                self.gain = gain if self.gain is None else max(self.gain, gain)
            self.sources.append(f"{source} ({rounds} rounds)")
        if "tie_engine_only" in entry:
            engine_only = int(read.number(entry, "tie_engine_only", 0, 1e9))
            reference_only = int(read.number(entry, "tie_reference_only", 0, 1e9))
            if engine_only + reference_only >= TIE_EVIDENCE:  # fewer bound nothing (an upper limit near 1)
                self.tie_share = max(self.tie_share, upper_limit(engine_only, engine_only + reference_only))

    def model(self, dtype: str, source: str) -> NoiseModel:
        positions, tail = self.chosen or (0, ())  # no tail measured: the uniform model of an uncalibrated pair
        flip_rate = DEFAULT_DRAFTER_FLIP_RATE if self.flip_rate is None else self.flip_rate
        measured_rate = DEFAULT_DRAFTER_FLIP_RATE / 4 if self.measured_rate is None else self.measured_rate
        # older entries measured both directions together: each direction gets the measured share of both
        return NoiseModel(
            dtype,
            round(self.bound, 6),
            round(DEFAULT_DRAFTER_TOLERANCE if self.tolerance is None else self.tolerance, 6),
            positions,
            tail,
            source,
            flip_rate,
            measured_rate,
            longer_rate=measured_rate if self.longer is None else self.longer,
            shorter_rate=measured_rate if self.shorter is None else self.shorter,
            gain_per_round=0.0 if self.gain is None else self.gain,
            tie_share=self.tie_share,
            # the longer share of every engine's flips together (each engine's alone is a few dozen rounds)
            longer_share=max(0.5, upper_limit(self.pooled_longer, self.pooled_flips)) if self.pooled_flips else 0.5,
            calibrated_on=tuple(self.sources),
        )


TIE_EVIDENCE = 30  # discordant positions an engine's tie counts need before they widen the tie share


def near_tie_bound(model_dir: str | Path, dtype: str) -> float:
    return load_calibration(model_dir, dtype).bound
