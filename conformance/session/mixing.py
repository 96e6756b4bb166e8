"""How a check's requests reach the engine: shuffled, and mixed with other checks' requests.

An engine must not be able to tell which check a request belongs to, by position, count or
company. So every engine call a check asks for (unless the check needs that exact batch: busy-batch
and prompt-shapes' "in the batch vs alone") is sent

* in a seeded random order (results are put back in the check's order before anything reads them);
* with one to :data:`MAX_COMPANIONS` *companions* (when there are any): greedy requests that other checks already
asked of
  the same engine in the same run (same mode, budget and tracing), drawn at random. A companion's
  new output is compared with its first one: in float32 a correct engine gives the same greedy
  output whatever else is in the batch, so a difference fails the check in whose call it showed,
  naming both runs. In low precision batch composition may move logits, so companions are sent
  but not compared.

The seed is the run's ``run_seed`` (the report records it), so a run repeats exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..adapters.interface import Request, RequestResult

__all__ = ["MAX_COMPANIONS", "Arrangement", "RequestMixer", "changed_companions", "placed_back"]

MAX_COMPANIONS = 2


@dataclass(frozen=True)
class Arrangement:
    """One engine call: ``order[k]`` is the index (into own requests, then companions) of ``sent[k]``,
    the request sent k-th."""

    companions: list[tuple[Request, RequestResult]]
    order: list[int]
    sent: list[Request]

    def split(self, results: Sequence[RequestResult], n_own: int) -> tuple[list[RequestResult], list[RequestResult]]:
        """The engine's results (in sent order) back in the caller's order: (own, companions)."""
        placed: list[RequestResult | None] = [None] * len(self.order)
        for position, index in enumerate(self.order):
            placed[index] = results[position]
        return placed[:n_own], placed[n_own:]  # type: ignore[return-value]


class RequestMixer:
    """Arranges engine calls from one seeded stream (module doc)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def arrange(self, own: Sequence[Request], pool: Sequence[tuple[Request, RequestResult]]) -> Arrangement:
        """The call that sends ``own`` with companions drawn from ``pool`` (answered greedy requests)."""
        most = min(MAX_COMPANIONS, len(pool))
        count = self._rng.randint(min(1, most), most)
        companions = self._rng.sample(list(pool), count)
        order = list(range(len(own) + count))
        self._rng.shuffle(order)
        everything = list(own) + [request for request, _ in companions]
        return Arrangement(companions, order, [everything[i] for i in order])


def placed_back(
    arrangement: Arrangement | None,
    requests: list[Request],
    results,
    validate: Callable[..., list[RequestResult]],
    labels: Sequence[str],
    companion_labels: Sequence[str],
) -> tuple[list[RequestResult], list[RequestResult]]:
    """One call's ``(own, companion)`` results in the caller's order, each list passed through ``validate``
    (requests, results, ``labels=`` their labels); results that cannot be put back (not one per request
    sent) all fail."""
    if arrangement is None:
        return validate(requests, results, labels=labels), []
    sent = arrangement.sent
    if not isinstance(results, (list, tuple)) or len(results) != len(sent):  # cannot be put back: all fail
        errors = validate(sent, results, labels=None)
        return errors[: len(requests)], errors[len(requests) :]
    own, others = arrangement.split(results, len(requests))
    companions = [request for request, _ in arrangement.companions]
    return validate(requests, own, labels=labels), validate(companions, others, labels=companion_labels)


def changed_companions(
    arrangement: Arrangement, again: Sequence[RequestResult], labels: Sequence[str], run_label: str
) -> list[tuple[str, str]]:
    """``(label, message)`` of every companion whose greedy result changed with its company (module doc)."""
    changed = []
    for (_, first), second, label in zip(arrangement.companions, again, labels):
        problem = second.error or (
            None if second.output_ids == first.output_ids else f"output {_first_difference(first, second)}"
        )
        if problem:
            message = (
                f"{label} of the {run_label} run, asked again in a batch with other checks' requests, "
                f"gave another result: {problem} (greedy float32 outputs must not depend on the batch)"
            )
            changed.append((label, message))
    return changed


def _first_difference(first: RequestResult, second: RequestResult) -> str:
    for i, (a, b) in enumerate(zip(first.output_ids, second.output_ids)):
        if a != b:
            return f"first differs at output position {i}: {a} then {b}"
    return f"{len(first.output_ids)} tokens then {len(second.output_ids)}"
