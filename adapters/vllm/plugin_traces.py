"""The trace files of the vLLM DDTree plugin (``ddtree_vllm_plugin``), read back into suite objects.

The plugin appends one JSON line per verified tree to the trace path the adapter gives it, and
the drafter logits of traced requests as float32 bytes to ``<trace path>.logits``; a line's
``draft_logits_f32`` holds their byte offset and shape (``ddtree_vllm_plugin.runner._write_traces``).
"""

from __future__ import annotations

import json

import numpy

from ..interface import RoundTrace

__all__ = ["logits_path", "clear", "read", "round_trace"]


def logits_path(trace_path: str) -> str:
    """Where the drafter logits of ``trace_path``'s rounds are (``ddtree_vllm_plugin.runner.logits_path``)."""
    return trace_path + ".logits"


def clear(trace_path: str) -> None:
    for path in (trace_path, logits_path(trace_path)):
        open(path, "w").close()


def read(trace_path: str) -> dict[str, list[dict]]:
    """The rounds since the files were last cleared, by external request id, in order; each row's
    ``draft_logits`` read back from the float32 file when the request traced them."""
    by_request: dict[str, list[dict]] = {}
    try:
        with open(trace_path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return by_request
    logits = None
    for line in lines:
        row = json.loads(line)
        where = row.pop("draft_logits_f32", None)
        if where is not None:
            if logits is None:
                logits = numpy.fromfile(logits_path(trace_path), dtype="<f4")
            start, (rows, cols) = where["offset"] // 4, where["shape"]
            row["draft_logits"] = logits[start: start + rows * cols].reshape(rows, cols).tolist()
        external = row["req_id"].rsplit("-", 1)[0]  # vLLM appends "-<8 random chars>" internally
        by_request.setdefault(external, []).append(row)
    return by_request


def round_trace(row: dict) -> RoundTrace:
    return RoundTrace(**{k: row[k] for k in RoundTrace.model_fields if k in row})
