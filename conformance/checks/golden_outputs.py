"""Check 2: outputs equal the golden file for (model pair, prompt set, dtype)."""

from __future__ import annotations

from ..golden_files import golden_path, load_golden
from ..session import SuiteSession
from .output_comparison import compare_outputs
from .lossless import summarise_verdicts
from .result import CheckResult

__all__ = ["check_golden"]


def check_golden(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    s = session.settings
    name = f"golden[{mode}{'' if budget is None else f',B={budget}'}]"
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    golden = load_golden(s.golden_dir, s.pair_name, s.prompt_set, s.dtype)
    path = golden_path(s.golden_dir, s.pair_name, s.prompt_set, s.dtype)
    if golden is None:
        return CheckResult.skipped(name, f"no golden file {path} (record one with `ddtree-conformance record`)")
    if golden.max_new_tokens < s.max_new_tokens:
        return CheckResult.skipped(
            name, f"golden file holds {golden.max_new_tokens} new tokens, the run asks for {s.max_new_tokens}"
        )
    missing = [p.id for p in session.prompts if p.id not in golden.records]
    if missing:
        return CheckResult.failed(name, f"prompts {missing[:3]} are not in the golden file {path}")
    results = session.run(mode, budget)
    verdicts = []
    for prompt, result in zip(session.prompts, results):
        record = golden.records[prompt.id]
        if record.prompt_ids != prompt.prompt_ids:
            return CheckResult.failed(name, f"{prompt.id}: prompt ids differ from the golden file {path}")
        expected = record.output_ids[: s.max_new_tokens]
        verdicts.append(
            compare_outputs(
                prompt.id,
                prompt.prompt_ids,
                expected,
                result.output_ids,
                exact=session.exact,
                near_tie_bound=session.near_tie_bound,
                scorer=None if session.exact else session.scorer,
                got_error=result.error,
            )
        )
    return summarise_verdicts(name, verdicts, session)
