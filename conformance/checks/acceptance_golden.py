"""The pair's float32 golden file as acceptance evidence: the reference's recorded rounds, read
instead of replaying or rerunning the reference where the golden file holds the run."""

from __future__ import annotations

from ddtree_conformance.adapters.interface import RequestResult

from ..golden_files import GoldenError, golden_path
from ..oracle import oracle_for
from ..replay import golden_lengths
from ..run import Run
from ..session import SuiteSession

__all__ = ["float32_golden", "golden_results", "golden_rounds"]


def float32_golden(session: SuiteSession):
    """The pair's float32 golden file (the copy held before the engine started) when it holds outputs
    at least as long as this run's, else None."""
    s = session.settings
    try:
        golden = oracle_for(session).golden("float32")
    except GoldenError:
        return None
    return None if golden is None or golden.max_new_tokens < s.max_new_tokens else golden


def golden_rounds(session: SuiteSession, run: Run) -> dict[tuple, list[int]] | None:
    """(prompt ids, output) -> golden float32 lengths of the reference for this run, when recorded."""
    s = session.settings
    golden = float32_golden(session)
    if golden is None:
        return None
    key = run.golden_key
    runs = {}
    for record in golden.records.values():
        if key in record.acceptance:
            lengths = golden_lengths(record.acceptance[key], s.max_new_tokens)
            runs[(tuple(record.prompt_ids), tuple(record.output_ids[: s.max_new_tokens]))] = lengths
    return runs


def golden_results(session: SuiteSession, run: Run) -> tuple[list[RequestResult], str] | None:
    """float32 runs of a pair with a golden file holding every prompt of the set: the golden acceptance,
    as results (the held-out prompts of the run, which no golden file holds, from the live reference).
    It is the reference run on the pair's own files, so a drafter that is not the pair's (wrong layer
    ids in its config, other weights) shows against it, where a live reference would share the fault."""
    s = session.settings
    golden = float32_golden(session) if s.dtype == "float32" else None
    if golden is None:
        return None
    key = run.golden_key
    out = []
    for prompt in session.inputs.bundled:
        record = golden.records.get(prompt.id)
        if record is None or record.prompt_ids != prompt.prompt_ids or key not in record.acceptance:
            return None
        out.append(
            RequestResult(
                output_ids=record.output_ids[: s.max_new_tokens],
                finish_reason="length",
                acceptance_lengths=golden_lengths(record.acceptance[key], s.max_new_tokens),
            )
        )
    if session.inputs.held_out:
        reference = session.reference_for(s.model_dir, s.drafter_dir)
        out += session.run(run.mode, run.budget, engine=reference, requests=session.requests()[len(out) :])
    path = golden_path(s.golden_dir, s.pair_name, s.prompt_set, "float32")
    held_out = f" and the live reference on {len(session.inputs.held_out)} held-out" if session.inputs.held_out else ""
    return out, f"golden ({path.name}{held_out})"
