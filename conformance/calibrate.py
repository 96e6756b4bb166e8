"""Measuring a pair's low-precision calibration (the tooling behind ``scripts/calibrate_near_tie.py``).

:func:`calibrate` teacher-forces the target in fp32 and in each low dtype, runs the drafter in both,
and replays the reference's low-precision rounds in fp32; :func:`calibrate_engine` measures the same
for a correct engine that rounds differently (:mod:`ddtree_conformance.testing.rounding_engines`),
plus its tie counts against the reference. Both merge their raw measurements into the pair's
manifest atomically, under a file lock (several processes may measure at once).
:mod:`ddtree_conformance.calibration` derives every verdict number of the noise model from them;
verdict modules import that module, never this one.

Round measurements (:func:`measure_rounds`): the engine runs greedily in the low dtype, in DDTree at
each budget and in DFlash; every round is replayed in fp32 on the engine's context. A round whose
tokens agree with the replay's but whose length differs is a drafter-side flip, *longer* or
*shorter*; ``round_gain`` and ``round_gain_squares`` are the sum and sum of squares of the per-round
difference of emitted lengths (engine minus replay) over every round, ``drafter_gain`` and
``drafter_gain_squares`` the same over the rounds whose tokens agree (the tau test's rounds).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from filelock import FileLock

from .adapters.interface import RunConfig
from .adapters.reference.engine import LoadedPair, ReferenceEngine
from .adapters.reference.pair import TORCH_DTYPES
from .adapters.reference.replay import replay_result
from .calibration import KEY, manifest_path, shift_thresholds
from .files import atomic_write
from .metrics import emitted_lengths
from .noise import DRAFTER_TOP
from .replay import first_token_difference
from .scorer import TargetScorer

__all__ = [
    "measure_gap_shift",
    "measure_drafter_shift",
    "measure_rounds",
    "measure_engine_target",
    "calibrate",
    "calibrate_engine",
]


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
    model_dir: str,
    drafter_dir: str,
    dtype: str,
    sequences: list[list[int]],
    device: str = "cpu",
    stride: int = 8,
    low_pair=None,
) -> tuple[float, int]:
    """Largest ``|drafter logit low - fp32|`` over the top :data:`DRAFTER_TOP` tokens per depth of
    either side, at every ``stride``-th position of each sequence (module doc, 3); and the count of
    drafter blocks measured. ``low_pair``: the low-precision pair to measure (an engine's own; default
    the reference's)."""
    exact = LoadedPair.load(model_dir, drafter_dir, TORCH_DTYPES["float32"], device)
    pairs = [exact, low_pair or LoadedPair.load(model_dir, drafter_dir, TORCH_DTYPES[dtype], device)]
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
        entry = _shift_entry(measure_gap_shift(model_dir, dtype, sequences, device), len(sequences), device)
        if drafter_dir is not None:
            entry["drafter_max_shift"], entry["drafter_blocks"] = measure_drafter_shift(
                model_dir, drafter_dir, dtype, sequences, device
            )
            if requests:
                engine = ReferenceEngine(model_dir, drafter_dir)
                try:
                    entry.update(measure_rounds(engine, model_dir, drafter_dir, dtype, requests, device, budgets))
                finally:
                    engine.close()
        key = f"{dtype}@{torch.device(device).type}"
        _merge(path, key, lambda old: {**{k: v for k, v in old.items() if k.startswith(_KEPT)}, **entry})
    return json.loads(path.read_text())[KEY]


_KEPT = ("drafter_", "round_", "engines")  # kept from an earlier measurement when not measured again
METHOD = (
    "ddtree_conformance.calibration: bound = 2 * max |shift| of the fp32 top-2 gap; ceiling from the tail "
    "of gap shrinks (Clopper-Pearson, Poisson); drafter tolerance = 2 * max drafter logit shift; round caps "
    "per direction and the tau test's allowance from drafter-side flips and length differences of the "
    "reference and of correct engines that round differently, replayed in fp32; every value the largest "
    "over the engines and devices measured"
)


def _merge(path: Path, key: str, update) -> None:
    """``measured[key] = update(old entry)`` in the manifest at ``path``: read, changed and written
    atomically under a lock, so processes measuring at once do not lose each other's entries."""
    with FileLock(str(path) + ".lock"):
        data = json.loads(path.read_text()) if path.is_file() else {}
        section = data.setdefault(KEY, {})
        section.pop("bounds", None)
        measured = section.setdefault("measured", {})
        measured[key] = update(measured.get(key, {}))
        section["method"] = METHOD
        atomic_write(path, json.dumps(data, indent=2) + "\n")


def _count_below(sorted_values: list[float], threshold: float) -> int:
    return bisect.bisect_left(sorted_values, threshold)


def measure_rounds(
    engine,
    model_dir: str,
    drafter_dir: str,
    dtype: str,
    requests: list,
    device: str = "cpu",
    budgets: Sequence[int] = (16, 64, 256),
) -> dict:
    """``engine`` run greedily in ``dtype`` (DDTree at each budget, and DFlash), every round replayed in
    fp32 by the reference (module doc): rounds, drafter-side flips by direction, the length gain."""
    replayer = ReferenceEngine(model_dir, drafter_dir)
    rounds = longer = shorter = gain = squares = drafter_gain = drafter_squares = 0
    try:
        for mode, budget in [("ddtree", b) for b in budgets] + [("dflash", None)]:
            config = RunConfig(mode=mode, budget=budget or 16, dtype=dtype, device=device)  # (dflash: unused)
            for request, result in zip(requests, engine.generate(requests, config)):
                if result.error:
                    raise RuntimeError(f"{engine.name}: {result.error.splitlines()[0]}")
                lengths, output = result.acceptance_lengths or [], result.output_ids
                replayed = replay_result(
                    replayer, request, output, lengths, mode, budget or 1, device, keep_logits=lambda *_: False
                )
                mine = emitted_lengths(lengths[: len(replayed)], len(output))
                theirs = emitted_lengths([r.length for r in replayed], len(output))
                for rnd, a, b in zip(replayed, mine, theirs):
                    rounds += 1
                    gain, squares = gain + (a - b), squares + (a - b) ** 2
                    tokens = output[rnd.offset : rnd.offset + lengths[rnd.index]]
                    agree = first_token_difference(tokens, rnd.tokens) is None
                    drafter_gain, drafter_squares = (
                        drafter_gain + agree * (a - b),
                        drafter_squares + agree * (a - b) ** 2,
                    )
                    if lengths[rnd.index] != rnd.length and agree:
                        at_end = rnd.offset + lengths[rnd.index] >= len(output)
                        if at_end and a == b:
                            continue  # past the output's end neither side is observable
                        longer, shorter = longer + (a > b), shorter + (a < b)
    finally:
        replayer.close()
    return {
        "drafter_rounds": rounds,
        "drafter_flips": longer + shorter,
        "drafter_longer": longer,
        "drafter_shorter": shorter,
        "round_gain": gain,
        "round_gain_squares": squares,
        "drafter_gain": drafter_gain,
        "drafter_gain_squares": drafter_squares,
        "drafter_budgets": list(budgets),
        "round_modes": ["ddtree", "dflash"],
    }


def measure_engine_target(low_pair, model_dir: str, dtype: str, sequences: list[list[int]], device: str) -> dict:
    """An engine's own target (``low_pair``, its patched low-precision pair) teacher-forced over
    ``sequences``: the gap shifts against fp32 (as :func:`measure_gap_shift`), and the tie counts
    against the reference's same-dtype target (positions where exactly one leaves the fp32 argmax)."""
    exact, reference = TargetScorer(model_dir, "float32", device), TargetScorer(model_dir, dtype, device)
    signed, engine_only, reference_only = [], 0, 0
    with torch.inference_mode():
        for seq in sequences:
            ids = torch.tensor(seq, dtype=torch.long, device=device)
            ref, ours = exact.logits(seq), low_pair.forward(ids, torch.arange(len(seq), device=device), None)[0]
            ours = ours.float()
            top = torch.topk(ref, 2, dim=-1).indices
            gap_ref = ref.gather(1, top[:, :1]) - ref.gather(1, top[:, 1:])
            gap_low = ours.gather(1, top[:, :1]) - ours.gather(1, top[:, 1:])
            signed += (gap_ref - gap_low).squeeze(1).tolist()
            best, mine, theirs = top[:, 0], ours.argmax(-1), reference.logits(seq).argmax(-1)
            engine_only += int(((mine != best) & (theirs == best)).sum())
            reference_only += int(((mine == best) & (theirs != best)).sum())
    entry = _shift_entry(signed, len(sequences), device)
    entry.update(tie_engine_only=engine_only, tie_reference_only=reference_only)
    return entry


def _shift_entry(signed: list[float], sequences: int, device: str) -> dict:
    shifts, shrinks = sorted(abs(x) for x in signed), sorted(signed)
    n = len(shifts)
    return {
        "positions": n,
        "max_shift": shifts[-1],
        "p99_shift": shifts[int(0.99 * (n - 1))],
        "shift_tail": [[t, n - _count_below(shrinks, t)] for t in shift_thresholds()],
        "device": device,
        "torch": torch.__version__,
        "sequences": sequences,
    }


def calibrate_engine(
    engine_class,
    name: str,
    model_dir: str,
    drafter_dir: str,
    dtype: str,
    sequences: list[list[int]],
    requests: list,
    device: str = "cpu",
    manifest: str | Path | None = None,
    budgets: tuple[int, ...] = (16, 64, 256),
) -> dict:
    """Measure the correct engine ``engine_class`` (its target, its drafter, its rounds) in ``dtype``
    on ``device`` and merge it into the manifest as ``measured[dtype@device].engines[name]``."""
    path = Path(manifest) if manifest else manifest_path(model_dir)
    engine = engine_class(model_dir, drafter_dir)
    try:
        low_pair = engine._pair(RunConfig(mode="ddtree", budget=16, dtype=dtype, device=device))
        entry = measure_engine_target(low_pair, model_dir, dtype, sequences, device)
        entry["drafter_max_shift"], entry["drafter_blocks"] = measure_drafter_shift(
            model_dir, drafter_dir, dtype, sequences, device, low_pair=low_pair
        )
        entry.update(measure_rounds(engine, model_dir, drafter_dir, dtype, requests, device, budgets))
    finally:
        engine.close()
    key = f"{dtype}@{torch.device(device).type}"
    _merge(path, key, lambda old: {**old, "engines": {**old.get("engines", {}), name: entry}})
    return entry
