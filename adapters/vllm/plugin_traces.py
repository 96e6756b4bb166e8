"""The trace files of the vLLM DDTree plugin (``ddtree_vllm_plugin``), read back into suite objects.

The plugin appends one JSON line per verified tree to the trace path the adapter gives it, and
the drafter logits of traced requests as float32 bytes to ``<trace path>.logits``; a line's
``draft_logits_f32`` holds their byte offset and shape (``ddtree_vllm_plugin.runner._write_traces``).

Steps without a tree. vLLM's scheduler drops a request's draft tokens when they do not fit (near
``max_model_len``, or when its token budget runs out); that step verifies only the root and commits
one token, and the plugin writes no line for it. In the suite's convention such a step is a round
of acceptance length 1; :func:`acceptance_lengths` puts it back where the rounds' root positions
(``start``) skip ahead. No trace exists for it, so a traced run that had one says so
(the adapter returns an error result naming the steps) instead of inventing a tree.
"""

from __future__ import annotations

import json

import numpy

from ..interface import RoundTrace

__all__ = ["logits_path", "clear", "read", "round_trace", "acceptance_lengths"]


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
            row["draft_logits"] = logits[start : start + rows * cols].reshape(rows, cols).tolist()
        external = row["req_id"].rsplit("-", 1)[0]  # vLLM appends "-<8 random chars>" internally
        by_request.setdefault(external, []).append(row)
    return by_request


def round_trace(row: dict) -> RoundTrace:
    return RoundTrace(**{k: row[k] for k in RoundTrace.model_fields if k in row})


def acceptance_lengths(rows: list[dict], prompt_len: int, output_len: int) -> tuple[list[int], int]:
    """Per-round acceptance lengths of one request from its trace rows, with every tree-less step
    (see the module doc) as a round of length 1; and how many such steps there were.

    The first round's root is the prefill's token, at position ``prompt_len``; each round's root
    follows the tokens the previous rounds committed, and the output ends with the last round's.
    Rows whose root lies behind the committed tokens (not a decode step of this request's output)
    are left as they are: the suite's integrity check names them.
    """
    lengths: list[int] = []
    plain = 0
    position = prompt_len  # position of the next round's root
    for row in rows:
        start = row.get("start")
        if isinstance(start, int) and start > position:
            gap = start - position
            lengths += [1] * gap
            plain += gap
            position = start
        lengths.append(len(row["accepted"]) + 1)
        position += lengths[-1]
    tail = prompt_len + output_len - 1 - position  # output tokens after the last round's
    if tail > 0:
        lengths += [1] * tail
        plain += tail
    return lengths, plain
