"""Measuring a pair's low-precision calibration (the tooling behind ``scripts/calibrate_near_tie.py``).

:func:`calibrate` teacher-forces the target in fp32 and in each low dtype, runs the drafter in both,
and replays the reference's low-precision rounds in fp32; it merges the raw measurements into the
pair's manifest atomically. :mod:`ddtree_conformance.calibration` derives every verdict number from
them; verdict modules import that module, never this one.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from .adapters.interface import RunConfig
from .adapters.reference.engine import LoadedPair, ReferenceEngine
from .adapters.reference.pair import TORCH_DTYPES
from .adapters.reference.replay import replay_result
from .calibration import DRAFTER_TOP, KEY, manifest_path, shift_thresholds
from .files import atomic_write
from .replay import first_token_difference
from .scorer import TargetScorer

__all__ = ["measure_gap_shift", "measure_drafter_shift", "measure_drafter_flips", "calibrate"]


def measure_gap_shift(model_dir: str, dtype: str, sequences: list[list[int]], device: str = "cpu") -> list[float]:
    """``gap_fp32 - gap_low`` (signed: positive when low precision narrows the fp32 top-2 gap) at
    every position of every sequence (module doc, 1 and 2)."""
    exact, low = TargetScorer(model_dir, "float32", device), TargetScorer(model_dir, dtype, device)
    shifts: list[float] = []
    for seq in sequences:
        ref, approx = exact.logits(seq), low.logits(seq)
        top = torch.topk(ref, 2, dim=-1).indices
        gap_ref = ref.gather(1, top[:, :1]) - ref.gather(1, top[:, 1:])
        gap_low = approx.gather(1, top[:, :1]) - approx.gather(1, top[:, 1:])
        shifts += (gap_ref - gap_low).squeeze(1).tolist()
    return shifts


def measure_drafter_shift(
    model_dir: str, drafter_dir: str, dtype: str, sequences: list[list[int]], device: str = "cpu", stride: int = 8
) -> tuple[float, int]:
    """Largest ``|drafter logit low - fp32|`` over the top :data:`DRAFTER_TOP` tokens per depth of
    either side, at every ``stride``-th position of each sequence (module doc, 3); and the count of
    drafter blocks measured."""
    pairs = [LoadedPair.load(model_dir, drafter_dir, TORCH_DTYPES[d], device) for d in ("float32", dtype)]
    worst, blocks = 0.0, 0
    with torch.inference_mode():
        for seq in sequences:
            ids = torch.tensor(seq, dtype=torch.long, device=device)
            positions = torch.arange(len(seq), device=device)
            features = [pair.forward(ids, positions, None)[1] for pair in pairs]
            for anchor in range(1, len(seq) - 1, stride):
                logits = [
                    pair.draft_logits(seq[anchor], anchor, feats[:anchor], 0, None).float()
                    for pair, feats in zip(pairs, features)
                ]
                top = torch.cat([torch.topk(x, DRAFTER_TOP, dim=-1).indices for x in logits], dim=-1)
                diff = (logits[1].gather(1, top) - logits[0].gather(1, top)).abs().max()
                worst, blocks = max(worst, float(diff)), blocks + 1
    return worst, blocks


def calibrate(
    model_dir: str,
    dtypes: list[str],
    sequences: list[list[int]],
    device: str = "cpu",
    drafter_dir: str | None = None,
    manifest: str | Path | None = None,
    requests: list | None = None,
    budgets: tuple[int, ...] = (16, 64, 256),
) -> dict:
    """Measure each dtype on ``device`` and merge the result into the pair's manifest atomically.

    ``sequences``: prompts followed by their fp32 greedy outputs (target shifts and, with
    ``drafter_dir``, drafter shifts); ``requests``: the greedy requests of those prompts, for the
    drafter round flip rate. Fields not measured this time keep their earlier values."""
    path = Path(manifest) if manifest else manifest_path(model_dir)
    for dtype in dtypes:
        signed = measure_gap_shift(model_dir, dtype, sequences, device)
        shifts, shrinks = sorted(abs(x) for x in signed), sorted(signed)
        n = len(shifts)
        tail = [[t, n - _count_below(shrinks, t)] for t in shift_thresholds()]
        entry = {
            "positions": n,
            "max_shift": shifts[-1],
            "p99_shift": shifts[int(0.99 * (n - 1))],
            "shift_tail": tail,
            "device": device,
            "torch": torch.__version__,
            "sequences": len(sequences),
        }
        if drafter_dir is not None:
            entry["drafter_max_shift"], entry["drafter_blocks"] = measure_drafter_shift(
                model_dir, drafter_dir, dtype, sequences, device
            )
            if requests:
                entry["drafter_rounds"], entry["drafter_flips"] = measure_drafter_flips(
                    model_dir, drafter_dir, dtype, requests, device, budgets
                )
                entry["drafter_budgets"] = list(budgets)
        data = json.loads(path.read_text()) if path.is_file() else {}  # re-read: others may have merged meanwhile
        section = data.setdefault(KEY, {})
        section.pop("bounds", None)
        key = f"{dtype}@{torch.device(device).type}"
        old = section.setdefault("measured", {}).get(key, {})
        section["measured"][key] = {**{k: v for k, v in old.items() if k.startswith("drafter_")}, **entry}
        section["method"] = (
            "ddtree_conformance.calibration: bound = 2 * max |shift| of the fp32 top-2 gap; ceiling "
            "from the tail of gap shrinks (Clopper-Pearson, Poisson); drafter tolerance = 2 * max "
            "drafter logit shift; drafter round cap from the drafter-side flip rate of the reference "
            "replayed in fp32"
        )
        atomic_write(path, json.dumps(data, indent=2) + "\n")
    return json.loads(path.read_text())[KEY]


def _count_below(sorted_values: list[float], threshold: float) -> int:
    return bisect.bisect_left(sorted_values, threshold)


def measure_drafter_flips(
    model_dir: str,
    drafter_dir: str,
    dtype: str,
    requests: list,
    device: str = "cpu",
    budgets: Sequence[int] = (16, 64, 256),
) -> tuple[int, int]:
    """``(rounds, drafter-side rounds)``: the reference engine run greedily in ``dtype`` at each budget,
    every round replayed in fp32, counting rounds whose tokens agree but whose lengths differ (the
    tree held or lacked the deciding path: a drafter-side flip). Feeds the drafter round cap."""
    engine = ReferenceEngine(model_dir, drafter_dir)
    rounds = flips = 0
    try:
        for budget in budgets:
            results = engine.generate(requests, RunConfig(mode="ddtree", budget=budget, dtype=dtype, device=device))
            for request, result in zip(requests, results):
                lengths = result.acceptance_lengths or []
                replayed = replay_result(
                    engine, request, result.output_ids, lengths, "ddtree", budget, device, keep_logits=lambda *_: False
                )
                for rnd in replayed:
                    rounds += 1
                    mine = result.output_ids[rnd.offset : rnd.offset + lengths[rnd.index]]
                    if lengths[rnd.index] != rnd.length and first_token_difference(mine, rnd.tokens) is None:
                        flips += 1
    finally:
        engine.close()
    return rounds, flips
