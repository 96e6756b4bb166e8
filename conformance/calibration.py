"""The near-tie bound for low-precision comparisons (doc §7), and how it is derived.

Derivation. Two greedy runs in bf16 can pick different tokens at a position only if low-precision
noise moves the target's top-1/top-2 logit gap across zero. Teacher-force the target over real
outputs once in fp32 and once in the low dtype; at every position take the fp32 top-1 and top-2
tokens and measure how far the low-precision gap between *those two tokens* moves:
``delta = |gap_low - gap_fp32|``. Two independent low-precision computations (engine and
reference) can each move it, so the bound is ``2 * max(delta)``: a first divergence whose fp32 gap
is at or below it is explained by numerics; above it, it is a real divergence.

The bound is stored per pair in ``<pair dir>/calibration.json`` (the pair dir is the target dir's
parent) by :func:`calibrate` (``scripts/calibrate_near_tie.py``), the maximum over every
device calibrated; without that file the published choice of 0.5 is used.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .files import atomic_write

__all__ = ["DEFAULT_BOUND", "calibration_path", "near_tie_bound", "measure_gap_shift", "calibrate"]

DEFAULT_BOUND = 0.5  # nats; a published choice (doc §7), used when a pair has no calibration


def calibration_path(model_dir: str | Path) -> Path:
    return Path(model_dir).resolve().parent / "calibration.json"


def near_tie_bound(model_dir: str | Path, dtype: str) -> float:
    if dtype == "float32":
        return 0.0
    path = calibration_path(model_dir)
    if path.is_file():
        data = json.loads(path.read_text())
        if dtype in data.get("bounds", {}):
            return float(data["bounds"][dtype])
    return DEFAULT_BOUND


def measure_gap_shift(model_dir: str, dtype: str, sequences: list[list[int]], device: str = "cpu") -> list[float]:
    """``|gap_low - gap_fp32|`` at every position of every sequence (see module doc)."""
    from .scorer import TargetScorer

    exact, low = TargetScorer(model_dir, "float32", device), TargetScorer(model_dir, dtype, device)
    shifts: list[float] = []
    for seq in sequences:
        ref, approx = exact.logits(seq), low.logits(seq)
        top = torch.topk(ref, 2, dim=-1).indices
        gap_ref = ref.gather(1, top[:, :1]) - ref.gather(1, top[:, 1:])
        gap_low = approx.gather(1, top[:, :1]) - approx.gather(1, top[:, 1:])
        shifts += (gap_low - gap_ref).abs().squeeze(1).tolist()
    return shifts


def calibrate(model_dir: str, dtypes: list[str], sequences: list[list[int]], device: str = "cpu") -> dict:
    """Measure the bound for each dtype and write ``calibration.json`` atomically."""
    path = calibration_path(model_dir)
    data = json.loads(path.read_text()) if path.is_file() else {"bounds": {}, "measured": {}}
    for dtype in dtypes:
        shifts = sorted(measure_gap_shift(model_dir, dtype, sequences, device))
        # Several devices may be calibrated in turn; the bound covers all of them.
        data["bounds"][dtype] = max(round(2 * shifts[-1], 4), data["bounds"].get(dtype, 0.0))
        data["measured"][f"{dtype}@{torch.device(device).type}"] = {
            "positions": len(shifts),
            "max_shift": shifts[-1],
            "p99_shift": shifts[int(0.99 * (len(shifts) - 1))],
            "device": device,
            "torch": torch.__version__,
        }
    data["method"] = "bound = 2 * max |gap_low - gap_fp32| over teacher-forced positions (ddtree_conformance.calibration)"
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
