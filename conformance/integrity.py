"""Result integrity: what an engine returns is validated against what it was asked, never trusted.

:func:`validate_results` runs on every batch at the session boundary (``SuiteSession.run``) and before ``generate``
writes a chunk. A batch must hold exactly one result per request, in order; a count mismatch makes every result of
the batch an error result saying so. Each result is then checked against its request, the
:class:`~ddtree_conformance.adapters.interface.RunConfig`, the engine's capabilities and the model pair
(:class:`PairLimits`). A result that breaks a rule becomes an error result whose message names the request and the
field::

    integrity: request 3 (prompt chat-03): field output_ids: token 5000 is outside the vocabulary (size 3072)

so every check that uses it fails with that message, and no check ever indexes into engine data
that is out of range. Results the engine itself marked as failed (``finish_reason`` "error" or an
``error`` message) are passed on as errors.

Rules:

* ``output_ids``: ints in ``[0, vocab_size)``; at most ``max_new_tokens`` of them.
* ``finish_reason``: "stop" only when the last output token is one of the request's stop tokens and no earlier one
  is; "length" only when the output holds exactly ``max_new_tokens`` tokens and no stop token. (A non-error result
  is never empty: the prefill emits one token.)
* Acceptance-length convention. The token chosen after the prefill is not a round. Round ``k`` (0-based) verifies
  from a root, the last token committed before it, and commits ``acceptance_lengths[k]`` tokens (its accepted
  nodes, then the bonus). Only the last round may be cut short by a stop token or the length limit, and it emits at
  least one token, so with ``R`` rounds: ``1 + sum(lengths[:-1]) < len(output_ids) <= 1 + sum(lengths)``; with no
  round the output holds at most one token. Each length is in ``1..block_size`` (a DFlash block of ``L`` positions
  drafts at most ``L - 1`` tokens, plus the bonus); in mode "plain" each is 1.
  ``rounds == len(acceptance_lengths)`` when both are given; ``mean_acceptance`` is in ``[1, block_size]``;
  per-position acceptance rates are in ``[0, 1]``.
* Traces: one per round. Round ``k``'s ``start`` (the root's position) is ``len(prompt_ids) + sum(lengths[:k])``;
  its ``root_token`` is ``output_ids[sum(lengths[:k])]``; its accepted nodes' tokens and its bonus are the output
  tokens that follow (as far as the output goes); ``len(accepted) + 1`` is that round's acceptance length. Arrays
  are consistent in length (one parent, depth and position per node; one target token and top-2 margin per path
  node), node indices and token ids are in range, drafter logits are rectangular ``[rows, vocab]``, finite or -inf,
  and no row is -inf everywhere.
* Verified trees (light traces, :mod:`ddtree_conformance.verified_trees`): one per round, rooted at
  the round's root; for a greedy request the walk by its own target tokens commits that round.
* Promises. In the speculative modes, an engine whose capabilities promise per-round acceptance
  (``per_round(mode)``) must return ``acceptance_lengths``; one that promises traces (``traced(mode)``) must return
  them when the run asks for traces, with drafter logits in every round when it also promises those
  (``draft_logits``) and the run asks; one that promises verified trees (``verified_trees(mode)``) must return them
  in every run of that mode.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import verified_trees
from .adapters.interface import Capabilities, Request, RequestResult, RunConfig

__all__ = [
    "PairLimits",
    "IntegrityError",
    "validate_results",
    "result_problem",
    "is_integrity_error",
    "IntegrityErrorResult",
    "error_result",
    "PREFIX",
]

PREFIX = "integrity: "
FINISH_REASONS = ("stop", "length", "error")


@dataclass(frozen=True)
class PairLimits:
    """What the model pair allows: the target's vocabulary and the drafter's block size (None: unknown)."""

    vocab_size: int | None = None
    block_size: int | None = None

    @classmethod
    def read(cls, model_dir: str | Path | None, drafter_dir: str | Path | None) -> PairLimits:
        """From ``<target>/config.json`` (``vocab_size``, or ``text_config.vocab_size``) and
        ``<drafter>/config.json`` (``block_size``); a value that cannot be read stays None."""
        target = _config(model_dir)
        vocab = target.get("vocab_size")
        if vocab is None and isinstance(target.get("text_config"), dict):
            vocab = target["text_config"].get("vocab_size")
        block = _config(drafter_dir).get("block_size")
        return cls(
            vocab_size=vocab if _is_int(vocab) and vocab > 0 else None,
            block_size=block if _is_int(block) and block >= 1 else None,
        )


class IntegrityError(ValueError):
    """One broken rule: ``field`` and ``problem`` (see module doc)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field}: {problem}")
        self.field, self.problem = field, problem


def _config(directory) -> dict:
    if directory is None:
        return {}
    try:
        data = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class IntegrityErrorResult(RequestResult):
    """The error result these rules put where an engine's result broke them: its kind is its type, so
    an engine's own error message that reads like one (``"integrity: ..."``) is never taken for one."""


def is_integrity_error(result) -> bool:
    return isinstance(result, IntegrityErrorResult)


def error_result(message: str) -> RequestResult:
    """An error result holding ``message`` (no output)."""
    return RequestResult(output_ids=[], finish_reason="error", error=message)


def _broken(message: str) -> IntegrityErrorResult:
    return IntegrityErrorResult(output_ids=[], finish_reason="error", error=message)


def _ids(field: str, values, vocab: int | None) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise IntegrityError(field, f"expected a list of token ids, got {type(values).__name__}")
    for index, token in enumerate(values):
        _token(f"{field}", token, vocab, index)
    return list(values)


def _token(field: str, token, vocab: int | None, index: int | None = None) -> int:
    where = "" if index is None else f" at index {index}"
    if not _is_int(token):
        raise IntegrityError(field, f"{token!r}{where} is not a token id")
    if token < 0 or (vocab is not None and token >= vocab):
        size = "" if vocab is None else f" (size {vocab})"
        raise IntegrityError(field, f"token {token}{where} is outside the vocabulary{size}")
    return token


def _ints(field: str, values, low: int, high: int | None = None) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise IntegrityError(field, f"expected a list of ints, got {type(values).__name__}")
    for index, value in enumerate(values):
        if not _is_int(value) or value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in {low}..{high}"
            raise IntegrityError(field, f"{value!r} at index {index} is not an int {bound}")
    return list(values)


def _outputs(result: RequestResult, request: Request, vocab: int | None) -> list[int]:
    output = _ids("output_ids", result.output_ids, vocab)
    if not output:
        raise IntegrityError("output_ids", "empty, but a result that is not an error holds the prefill's token")
    if len(output) > request.max_new_tokens:
        raise IntegrityError("output_ids", f"{len(output)} tokens, more than max_new_tokens {request.max_new_tokens}")
    stops = set(request.stop_token_ids)
    early = [i for i, t in enumerate(output[:-1]) if t in stops]
    if early:
        raise IntegrityError(
            "output_ids",
            f"stop token {output[early[0]]} at index {early[0]} is followed by "
            f"{len(output) - early[0] - 1} more token(s)",
        )
    reason = result.finish_reason
    if reason not in FINISH_REASONS:
        raise IntegrityError("finish_reason", f"{reason!r} is not one of {', '.join(FINISH_REASONS)}")
    last = output[-1] if output else None
    if reason == "stop" and last not in stops:
        raise IntegrityError(
            "finish_reason",
            f"'stop', but the last output token {last} is not a stop token of the request {sorted(stops)}",
        )
    if reason == "length":
        if last in stops:
            raise IntegrityError("finish_reason", f"'length', but the output ends with the stop token {last}")
        if len(output) != request.max_new_tokens:
            raise IntegrityError(
                "finish_reason",
                f"'length', but the output holds {len(output)} tokens, not max_new_tokens {request.max_new_tokens}",
            )
    return output


def _lengths(result: RequestResult, config: RunConfig, output: list[int], block: int | None) -> list[int] | None:
    top = 1 if config.mode == "plain" else block
    if result.rounds is not None and (not _is_int(result.rounds) or result.rounds < 0):
        raise IntegrityError("rounds", f"{result.rounds!r} is not an int >= 0")
    lengths = result.acceptance_lengths
    if lengths is None:
        return None
    what = "1" if top == 1 else f"in 1..{top} (the drafter's block size)" if top else ">= 1"
    if not isinstance(lengths, (list, tuple)):
        raise IntegrityError("acceptance_lengths", f"expected a list of ints, got {type(lengths).__name__}")
    for k, n in enumerate(lengths):
        if not _is_int(n) or n < 1 or (top is not None and n > top):
            raise IntegrityError(
                "acceptance_lengths",
                f"round {k} accepts {n!r} tokens; each round's acceptance length must be {what} in mode {config.mode}",
            )
    if result.rounds is not None and result.rounds != len(lengths):
        raise IntegrityError("rounds", f"{result.rounds}, but acceptance_lengths has {len(lengths)} entries")
    _convention("acceptance_lengths", list(lengths), len(output))
    return list(lengths)


def _convention(field: str, lengths: list[int], produced: int) -> None:
    """``1 + sum(lengths[:-1]) < produced <= 1 + sum(lengths)``; no rounds: at most one token."""
    if not lengths:
        if produced > 1:
            raise IntegrityError(
                field,
                f"no rounds, but the output holds {produced} tokens (only the prefill's token comes without a round)",
            )
        return
    before, total = 1 + sum(lengths[:-1]), 1 + sum(lengths)
    if not before < produced <= total:
        raise IntegrityError(
            field,
            f"{len(lengths)} rounds committing {sum(lengths)} tokens after the prefill's "
            f"one do not add up to the output's {produced} tokens (the last round may only be "
            f"cut short: expected {before} < {produced} <= {total})",
        )


def _aggregates(result: RequestResult, block: int | None) -> None:
    mean = result.mean_acceptance
    number = isinstance(mean, (int, float)) and not isinstance(mean, bool)
    top = block if block is not None else sys.float_info.max  # NaN fails every comparison; inf and huge ints, this
    if mean is not None and not (number and 1 <= mean <= top):
        bound = f"[1, {block}] (the drafter's block size)" if block else "[1, the largest float]"
        raise IntegrityError("mean_acceptance", f"{mean!r:.40} is outside {bound}")
    rates = result.per_position_acceptance
    if rates is not None:
        if not isinstance(rates, (list, tuple)):
            raise IntegrityError("per_position_acceptance", f"expected a list, got {type(rates).__name__}")
        for d, rate in enumerate(rates, start=1):
            if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 <= rate <= 1:
                raise IntegrityError("per_position_acceptance", f"depth {d}: {rate!r} is not a rate in [0, 1]")


def _trace_shape(field: str, trace, vocab: int | None) -> None:
    n = len(_ids(f"{field}.tree_tokens", trace.tree_tokens, vocab))
    if n < 1:
        raise IntegrityError(f"{field}.tree_tokens", "empty: the root is node 0")
    for name in ("parents", "depths", "positions"):
        values = getattr(trace, name)
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise IntegrityError(f"{field}.{name}", f"{got} entries for {n} nodes")
    _ints(f"{field}.parents", trace.parents, -1, n - 1)
    _ints(f"{field}.depths", trace.depths, 0)
    _ints(f"{field}.positions", trace.positions, 0)
    accepted = _ints(f"{field}.accepted", trace.accepted, 1, n - 1)
    path = len(accepted) + 1
    targets = _ids(f"{field}.target_tokens", trace.target_tokens, vocab)
    if len(targets) != path:
        raise IntegrityError(f"{field}.target_tokens", f"{len(targets)} entries, expected one per path node ({path})")
    margins = trace.top2_margins
    if not isinstance(margins, (list, tuple)) or len(margins) != path:
        got = len(margins) if isinstance(margins, (list, tuple)) else type(margins).__name__
        raise IntegrityError(f"{field}.top2_margins", f"{got} entries, expected one per path node ({path})")
    _token(f"{field}.root_token", trace.root_token, vocab)
    _token(f"{field}.bonus", trace.bonus, vocab)
    if not _is_int(trace.start) or trace.start < 0:
        raise IntegrityError(f"{field}.start", f"{trace.start!r} is not a position")
    if trace.node_target_tokens is not None:
        nodes = _ids(f"{field}.node_target_tokens", trace.node_target_tokens, vocab)
        if len(nodes) != n:
            raise IntegrityError(f"{field}.node_target_tokens", f"{len(nodes)} entries for {n} nodes")
    if (rows := trace.draft_logits) is not None:
        if not isinstance(rows, (list, tuple)) or not rows:
            raise IntegrityError(f"{field}.draft_logits", "expected a non-empty [rows, vocab] list of rows")
        width = vocab if vocab is not None else (len(rows[0]) if isinstance(rows[0], (list, tuple)) else -1)
        for r, row in enumerate(rows):
            if not isinstance(row, (list, tuple)) or len(row) != width:
                got = len(row) if isinstance(row, (list, tuple)) else type(row).__name__
                raise IntegrityError(f"{field}.draft_logits", f"row {r} has {got} entries, expected {width}")
        _finite_logits(f"{field}.draft_logits", rows)


def _finite_logits(field: str, rows) -> None:
    """Drafter logits finite or -inf (a padded vocabulary's masked tokens), no row -inf everywhere."""
    try:  # a NaN or an inf anywhere makes a float sum NaN or inf
        if isinstance(total := sum(map(sum, rows)), float) and math.isfinite(total):
            return  # every entry a finite number: the usual round, judged without building a tensor
    except (TypeError, OverflowError):
        pass  # not numbers, or ints beyond a float's range (a sum of ints is exact): the tensor decides
    import torch  # here, not at the top: the rules on results alone need no torch

    try:  # numbers beyond a float's range, complex numbers, None, strings: one error, not a crash
        logits = torch.tensor(rows, dtype=torch.float64)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        raise IntegrityError(field, "an entry is not a number in a float's range: logits must be floats") from None
    for r, t in (logits.isnan() | (logits == float("inf"))).nonzero().tolist()[:1]:
        raise IntegrityError(field, f"row {r} token {t} is {float(logits[r, t])}: logits must be finite or -inf")
    for r in logits.isneginf().all(dim=-1).nonzero().flatten().tolist()[:1]:
        raise IntegrityError(field, f"row {r} is -inf at every token: no token could be drafted")


def _traces(
    result: RequestResult, request: Request, output: list[int], lengths: list[int] | None, vocab: int | None
) -> None:
    traces = result.traces
    if not isinstance(traces, (list, tuple)):
        raise IntegrityError("traces", f"expected a list of round traces, got {type(traces).__name__}")
    for k, trace in enumerate(traces):
        if not hasattr(trace, "tree_tokens"):
            raise IntegrityError(f"traces[{k}]", f"not a round trace ({type(trace).__name__})")
        _trace_shape(f"traces[{k}]", trace, vocab)
    derived = [len(t.accepted) + 1 for t in traces]
    if lengths is None:
        _convention("traces", derived, len(output))
        lengths = derived
    if len(traces) != len(lengths):
        raise IntegrityError("traces", f"{len(traces)} traces for {len(lengths)} rounds (one per round)")
    committed = 0  # output tokens before this round's root
    for k, (trace, length) in enumerate(zip(traces, lengths)):
        field = f"traces[{k}]"
        if trace.start != len(request.prompt_ids) + committed:
            raise IntegrityError(
                f"{field}.start",
                f"{trace.start}, expected {len(request.prompt_ids) + committed} "
                f"(prompt of {len(request.prompt_ids)} tokens + {committed} "
                f"committed after the prefill's token)",
            )
        if len(trace.accepted) + 1 != length:
            raise IntegrityError(
                f"{field}.accepted",
                f"{len(trace.accepted)} accepted nodes + the bonus make "
                f"{len(trace.accepted) + 1}, but round {k}'s acceptance "
                f"length is {length}",
            )
        expected = [(f"{field}.root_token", trace.root_token, committed)]
        expected += [
            (f"{field}.accepted[{j}]", trace.tree_tokens[node], committed + 1 + j)
            for j, node in enumerate(trace.accepted)
        ]
        expected.append((f"{field}.bonus", trace.bonus, committed + len(trace.accepted) + 1))
        for name, token, index in expected:
            if index < len(output) and token != output[index]:
                raise IntegrityError(name, f"token {token}, but the output has {output[index]} at index {index}")
        committed += length


def _verified_trees(
    result: RequestResult, request: Request, output: list[int], lengths: list[int] | None, vocab: int | None
) -> None:
    trees = result.verified_trees
    if not isinstance(trees, (list, tuple)) or not all(hasattr(t, "tree_tokens") for t in trees):
        raise IntegrityError("verified_trees", "expected a list of verified trees (VerifiedTree)")
    greedy = request.temperature == 0
    bad = verified_trees.shape_problem(trees, vocab)
    if bad is None and lengths is None:  # light traces alone: a greedy round's length is its walk's
        if not greedy:
            return
        lengths = [len(verified_trees.walk(t.tree_tokens, t.parents, t.node_target_tokens)) for t in trees]
        _convention("verified_trees", lengths, len(output))
    bad = bad or verified_trees.round_problem(trees, output, lengths, greedy)
    if bad:
        raise IntegrityError(*bad)


def _promises(result: RequestResult, config: RunConfig, caps: Capabilities | None) -> None:
    if caps is None or config.mode == "plain":
        return
    if caps.per_round(config.mode) and result.acceptance_lengths is None:
        raise IntegrityError(
            "acceptance_lengths",
            f"missing, though the engine's capabilities promise per-round acceptance in mode {config.mode}",
        )
    if config.trace and caps.traced(config.mode) and result.traces is None:
        raise IntegrityError(
            "traces",
            f"missing, though traces were asked for and the engine's capabilities promise them in mode {config.mode}",
        )
    if config.trace and config.trace_draft_logits and caps.traced(config.mode) and caps.draft_logits:
        missing = [k for k, trace in enumerate(result.traces or []) if trace.draft_logits is None]
        if missing:
            raise IntegrityError(
                f"traces[{missing[0]}].draft_logits",
                f"missing in {len(missing)}/{len(result.traces)} rounds, though drafter logits were "
                "asked for and the engine's capabilities promise them (draft_logits)",
            )
    if caps.verified_trees(config.mode) and result.verified_trees is None:
        raise IntegrityError(
            "verified_trees",
            f"missing, though the engine's capabilities promise verified trees in "
            f"mode {config.mode} (verified_tree_modes)",
        )


def result_problem(
    result, request: Request, config: RunConfig, limits: PairLimits, caps: Capabilities | None = None
) -> IntegrityError | None:
    """The first rule ``result`` breaks (see module doc), or None. Never raises on engine data."""
    if not isinstance(result, RequestResult):
        return IntegrityError("result", f"not a RequestResult ({type(result).__name__})")
    try:
        output = _outputs(result, request, limits.vocab_size)
        lengths = _lengths(result, config, output, limits.block_size)
        _aggregates(result, 1 if config.mode == "plain" and limits.block_size else limits.block_size)
        if result.traces is not None:
            _traces(result, request, output, lengths, limits.vocab_size)
        _promises(result, config, caps)
        if result.verified_trees is not None:
            _verified_trees(result, request, output, lengths, limits.vocab_size)
    except IntegrityError as exc:
        return exc
    except Exception as exc:  # a field of a type no rule foresaw: still one message, never a crash
        return IntegrityError("result", f"malformed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
    return None


def _failed(result) -> str | None:
    """The engine's own failure message if ``result`` is a failure ("" when it gave none), else None."""
    if not isinstance(result, RequestResult):
        return None
    error = result.error
    if result.finish_reason == "error" or error:
        return error.strip() if isinstance(error, str) else ""
    return None


def validate_results(
    requests: Sequence[Request],
    results,
    config: RunConfig,
    limits: PairLimits,
    caps: Capabilities | None = None,
    labels: Sequence[str] | None = None,
    engine: str | None = None,
    first_index: int = 0,
) -> list[RequestResult]:
    """One valid result or one error result per request, in order (see module doc).

    ``labels`` name the requests in messages (``"prompt chat-03"``); ``engine`` names the engine in a
    count mismatch; ``first_index`` is the index of ``requests[0]`` in the whole run (for chunks)."""
    who = "engine" if engine is None else f"engine {engine!r}"
    if not isinstance(results, (list, tuple)):
        message = f"{PREFIX}{who} returned {type(results).__name__}, not a list of results"
        return [_broken(message) for _ in requests]
    if len(results) != len(requests):
        message = (
            f"{PREFIX}{who} returned {len(results)} result{'' if len(results) == 1 else 's'} for "
            f"{len(requests)} request{'' if len(requests) == 1 else 's'} (mode {config.mode}"
            f"{f', budget {config.budget}' if config.mode == 'ddtree' else ''})"
        )
        return [_broken(message) for _ in requests]
    checked = []
    for index, (request, result) in enumerate(zip(requests, results)):
        label = f" ({labels[index]})" if labels is not None and index < len(labels) else ""
        failure = _failed(result)
        if failure:  # the engine's own failure: passed on as an error (no output kept)
            checked.append(
                result
                if type(result) is RequestResult and result.output_ids == [] and result.finish_reason == "error"
                else error_result(failure)
            )
            continue
        if failure == "":
            problem = IntegrityError("error", "the result is marked failed (finish_reason 'error') without a message")
        else:
            problem = result_problem(result, request, config, limits, caps)
        if problem is None:
            checked.append(result)
        else:
            checked.append(_broken(f"{PREFIX}request {first_index + index}{label}: {problem}"))
    return checked
