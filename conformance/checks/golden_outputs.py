"""Check 2: outputs agree with the golden file for (model pair, prompt set, dtype[, device]).

float32: equal token for token. bfloat16/float16: the golden file of that dtype (the device's own
``<prompt set>-<dtype>-<device kind>.json`` when recorded, else ``<prompt set>-<dtype>.json``)
must exist and hold the prompts; the outputs are scored against the fp32 target like the lossless
check's, and how many equal the golden output is reported.
"""

from __future__ import annotations

from pathlib import Path

from ..golden_files import GoldenFile, golden_path, load_golden
from ..oracle import oracle_for
from ..run import Run
from ..session import SuiteSession
from .output_comparison import GreedyCase, judge_greedy
from .result import CheckResult

__all__ = ["check_golden", "device_golden_path", "load_device_golden", "held_device_golden"]


def device_golden_path(golden_dir, pair: str, prompt_set: str, dtype: str, device: str) -> Path:
    """``<pair>/<prompt set>-<dtype>-<device kind>.json``: low-precision goldens differ by device."""
    return golden_path(golden_dir, pair, prompt_set, f"{dtype}-{device.split(':', 1)[0]}")


def load_device_golden(settings) -> tuple[GoldenFile | None, Path]:
    """The golden file for the settings' dtype and device (float32: one for every device)."""
    s = settings
    if s.dtype != "float32":
        keyed = f"{s.dtype}-{s.device.split(':', 1)[0]}"
        if golden_path(s.golden_dir, s.pair_name, s.prompt_set, keyed).is_file():
            return (
                load_golden(s.golden_dir, s.pair_name, s.prompt_set, keyed),
                golden_path(s.golden_dir, s.pair_name, s.prompt_set, keyed),
            )
    return (
        load_golden(s.golden_dir, s.pair_name, s.prompt_set, s.dtype),
        golden_path(s.golden_dir, s.pair_name, s.prompt_set, s.dtype),
    )


def held_device_golden(session: SuiteSession) -> tuple[GoldenFile | None, Path]:
    """:func:`load_device_golden` from the copy held before the engine started (:mod:`ddtree_conformance.oracle`)."""
    s, copy = session.settings, oracle_for(session)
    if s.dtype != "float32":
        keyed = f"{s.dtype}-{s.device.split(':', 1)[0]}"
        golden = copy.golden(keyed)
        if golden is not None:
            return golden, copy.golden_file(keyed)
    return copy.golden(s.dtype), copy.golden_file(s.dtype)


def check_golden(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    s = session.settings
    name = Run(mode, budget).check_id("golden")
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    golden, path = held_device_golden(session)
    if golden is None:
        return CheckResult.skipped(
            name, f"no golden file {path} (record one with `ddtree-conformance record`)", cause="input"
        )
    length = min(golden.max_new_tokens, s.max_new_tokens)  # greedy outputs of a longer run extend shorter ones
    cut = (
        "" if length == s.max_new_tokens else f"; first {length} of {s.max_new_tokens} tokens: the file holds {length}"
    )
    missing = [p.id for p in session.inputs.bundled if p.id not in golden.records]
    if missing:
        return CheckResult.failed(name, f"prompts {missing[:3]} are not in the golden file {path}")
    cases = []
    for prompt, result in zip(session.inputs.bundled, session.run(mode, budget)):  # held-out prompts come last
        record = golden.records[prompt.id]
        if record.prompt_ids != prompt.prompt_ids:
            return CheckResult.failed(name, f"{prompt.id}: prompt ids differ from the golden file {path}")
        cases.append(
            GreedyCase(
                prompt.id, prompt.prompt_ids, result.output_ids[:length], record.output_ids[:length], error=result.error
            )
        )
    verdict = judge_greedy(session, cases, what=f"golden ({path.name})")
    if verdict.problem:
        return CheckResult.failed(name, f"differs from the golden file: {verdict.problem}", **verdict.details)
    return CheckResult.passed(name, f"{verdict.summary} ({path.name}{cut})", **verdict.details)
