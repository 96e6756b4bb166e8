"""Engines that return odd but valid results: what the property test feeds every check.

An :class:`OddEngine` answers each request from the reference engine's result, reshaped by one
:class:`Oddity`: outputs of one repeated token, token 0 or the mask id, a stop token first, a
divergence at one position, random tokens; acceptance lengths absent, all 1, all at the block size
(the last round cut), or a random partition; rounds, mean acceptance and per-position rates absent or
at their limits; rounds whose trees are chains of the committed tokens; some requests failed by the
engine itself; CUDA graphs reported off; results that change between runs of another configuration
(graphs on and off, TP 1 and N), or not. Every result
passes the integrity rules (:mod:`ddtree_conformance.integrity`), and the capabilities promise only
what the results hold, so each check sees data it must judge, not reject: it may pass or fail, but it
must never crash, and a failure must say what failed (``tests/test_no_check_crashes.py``).

The reference's results are memoised per (request, configuration) for the whole process
(:class:`MemoisedReference`; :func:`memoised_references` puts it in place of the session's oracle and of
the reference the misbehaving engines wrap): an example costs the checks' own work, not the engine's.
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from unittest import mock

from ddtree_conformance.adapters.interface import (
    Capabilities,
    Engine,
    Request,
    RequestResult,
    RoundTrace,
    RunConfig,
    VerifiedTree,
)
from ddtree_conformance.adapters.reference import engine as reference_engine
from ddtree_conformance.session import engines as session_engines

__all__ = [
    "Oddity",
    "OddEngine",
    "MemoisedReference",
    "memoised_references",
    "odd_engine",
    "OUTPUTS",
    "LENGTHS",
    "PER_POSITION",
    "MEANS",
    "TREES",
]

_REFERENCE = reference_engine.ReferenceEngine  # the real one, whatever memoised_references() puts in its place
OUTPUTS = ("reference", "constant", "token 0", "mask id", "first stop", "shifted", "diverge", "random")
LENGTHS = ("reference", "none", "ones", "block", "random")
MEANS = ("none", "lengths", "one", "block")
PER_POSITION = ("none", "empty", "zeros", "ones", "random")
TREES = ("reference", "chain", "none")


@dataclass(frozen=True)
class Oddity:
    """How an :class:`OddEngine` reshapes the reference's results (module doc). The defaults change nothing."""

    seed: int = 0
    outputs: Literal[OUTPUTS] = "reference"
    token: int = 1  # the repeated token of "constant"
    diverge_at: int = 0  # the position "diverge" changes (modulo the output's length)
    lengths: Literal[LENGTHS] = "reference"
    rounds: bool = True  # report the round count beside the acceptance lengths
    mean: Literal[MEANS] = "none"
    per_position: Literal[PER_POSITION] = "none"
    errors: Literal["none", "first", "all"] = "none"  # requests of a batch the engine fails itself
    plain_too: bool = False  # reshape plain results too (else plain stays the reference's)
    varies_with_run: bool = False  # random choices also depend on the run (mode, budget, graphs, TP, traces)
    # the rounds' trees: "reference" keeps the reference's traces and verified trees where the results are
    # unchanged (none elsewhere); "chain" gives every round a chain tree of its own output tokens; "none"
    trees: Literal[TREES] = "reference"
    cuda_graphs: bool = True  # capabilities().cuda_graphs
    eager_under_graphs: bool = False  # report engine_settings["cuda_graphs"] False when asked for graphs
    sampling: bool = True
    modes: tuple[str, ...] = ("plain", "dflash", "ddtree")
    max_context: int | None = None  # None: the reference's

    @property
    def unchanged(self) -> bool:
        """Whether speculative results keep the reference's tokens and rounds (so traces stay true)."""
        return self.outputs == "reference" and self.lengths == "reference" and self.errors == "none"

    @property
    def traced(self) -> bool:
        """Whether results carry traces and verified trees (capabilities promise them)."""
        return self.trees == "chain" or (self.trees == "reference" and self.unchanged)


class MemoisedReference(Engine):
    """The reference engine on a pair, its results memoised per (request, configuration) in this process.

    Results do not depend on a request's batch (the suite's own rule for greedy fp32 outputs; sampled
    requests draw from their own seed), so a batch is answered request by request from the memo and the
    misses are generated together. Results are known by the pair's files' content, not its folder: the
    synthetic pairs checks write into each session's scratch folder are the same pairs. ``close`` leaves
    the shared engine open."""

    OPTIONS = None
    _engines: dict[tuple, Engine] = {}
    _memo: dict[tuple, RequestResult] = {}

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.pair = _digest(model_dir, drafter_dir)  # the memo's key: a pair rewritten elsewhere is the same pair
        folders = (str(model_dir), None if drafter_dir is None else str(drafter_dir))
        if folders not in self._engines:  # an engine per folder: it loads each dtype lazily, from there
            MemoisedReference._engines[folders] = _REFERENCE(*folders)
        self.reference = self._engines[folders]
        self.name = self.reference.name
        self._caps = self.reference.capabilities()

    def __getattr__(self, name: str):  # the oracle's other parts (its loaded pair, its replay) are the reference's
        return getattr(self.__dict__["reference"], name)

    def capabilities(self) -> Capabilities:
        return self._caps

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        base = (self.pair, config.model_dump_json())
        keys = [(*base, r.model_dump_json()) for r in requests]
        missing = {k: r for k, r in zip(keys, requests) if k not in self._memo}
        if missing:
            results = self.reference.generate(list(missing.values()), config)
            MemoisedReference._memo.update(zip(missing, results))
        return [self._memo[k].model_copy(deep=True) for k in keys]

    def close(self) -> None:  # shared: the process keeps it
        pass


def _digest(*folders: str | None) -> str:
    """The content of a pair's folders (every file, in order of name)."""
    digest = hashlib.sha256()
    for folder in folders:
        if folder is None:
            digest.update(b"none")
            continue
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _block_size(drafter_dir: str | None) -> int | None:
    if drafter_dir is None:
        return None
    try:
        return json.loads((Path(drafter_dir) / "config.json").read_text())["block_size"]
    except (OSError, ValueError, KeyError):
        return None


class OddEngine(Engine):
    """The reference's results reshaped by an :class:`Oddity` (module doc); build with :func:`odd_engine`."""

    OPTIONS = None
    oddity: Oddity = Oddity()

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.reference = MemoisedReference(model_dir, drafter_dir)
        caps = self.reference.capabilities()
        self.vocab_size = self.reference.reference.info.vocab_size
        self.block = _block_size(drafter_dir) or 1
        self.name = f"odd-{self.oddity.outputs}-{self.oddity.lengths}"
        odd = self.oddity
        kept = odd.trees == "reference" and odd.unchanged
        self._caps = caps.model_copy(
            update={
                "name": self.name,
                "modes": [m for m in caps.modes if m in odd.modes],
                "sampling": odd.sampling,
                "traces": odd.traced,
                "draft_logits": kept,
                "verified_tree_modes": caps.verified_tree_modes if odd.traced else [],
                "per_round_acceptance": odd.lengths != "none",
                "cuda_graphs": odd.cuda_graphs,
                "max_context": odd.max_context or caps.max_context,
                "max_tensor_parallel": 2,  # it answers any TP size with the one-rank reference's results
            }
        )

    def capabilities(self) -> Capabilities:
        return self._caps

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        asked = config.model_copy(update={"tensor_parallel_size": 1, "cuda_graphs": None, "timing": False})
        results = self.reference.generate(requests, asked)
        if config.mode == "plain" and not self.oddity.plain_too:
            return results
        return [self._reshape(i, r, ref, config) for i, (r, ref) in enumerate(zip(requests, results))]

    # -- one result ---------------------------------------------------------------------------------
    def _rng(self, request: Request, config: RunConfig) -> random.Random:
        parts = [self.oddity.seed, request.prompt_ids, request.max_new_tokens, request.temperature]
        parts += [request.top_k, request.top_p, request.seed, request.stop_token_ids]
        if self.oddity.varies_with_run:
            parts += [config.mode, config.budget, config.cuda_graphs, config.tensor_parallel_size, config.trace]
        return random.Random(zlib.crc32(repr(parts).encode()))

    def _reshape(self, index: int, request: Request, ref: RequestResult, config: RunConfig) -> RequestResult:
        odd = self.oddity
        if ref.finish_reason == "error":
            return ref
        if odd.errors == "all" or (odd.errors == "first" and index == 0):
            return RequestResult(output_ids=[], finish_reason="error", error="odd engine: simulated failure")
        rng = self._rng(request, config)
        tokens, reason = self._tokens(request, ref, rng)
        top = 1 if config.mode == "plain" else self.block
        same = tokens == ref.output_ids
        lengths = self._lengths(len(tokens), top, ref if same else None, rng)
        traces, trees = None, None
        if odd.trees == "chain" and config.mode != "plain":
            traces, trees = _chains(request, tokens, lengths or self._lengths(len(tokens), top, None, rng, "random"))
            traces = traces if config.trace else None
        elif odd.trees == "reference" and odd.unchanged and same and lengths == ref.acceptance_lengths:
            traces, trees = ref.traces, ref.verified_trees
        settings = dict(ref.engine_settings)
        if config.cuda_graphs is not None:
            settings["cuda_graphs"] = False if odd.eager_under_graphs else config.cuda_graphs
        return RequestResult(
            output_ids=tokens,
            finish_reason=reason,
            acceptance_lengths=lengths,
            rounds=len(lengths) if lengths is not None and odd.rounds else None,
            mean_acceptance=self._mean(lengths, top),
            per_position_acceptance=self._per_position(top, rng),
            traces=traces,
            verified_trees=trees,
            engine_settings=settings,
        )

    def _tokens(self, request: Request, ref: RequestResult, rng: random.Random) -> tuple[list[int], str]:
        odd, n, vocab = self.oddity, request.max_new_tokens, self.vocab_size
        stops = set(request.stop_token_ids)
        base = list(ref.output_ids)
        if odd.outputs == "reference":
            return base, ref.finish_reason
        if odd.outputs == "constant":
            tokens = [odd.token % vocab] * n
        elif odd.outputs == "token 0":
            tokens = [0] * n
        elif odd.outputs == "mask id":
            tokens = [vocab - 1] * n
        elif odd.outputs == "first stop":
            tokens = [min(stops)] if stops else base
        elif odd.outputs == "shifted":
            tokens = [(t + 1) % vocab for t in base]
        elif odd.outputs == "diverge":
            k = odd.diverge_at % len(base)
            tokens = base[:k] + [(base[k] + 1) % vocab] + base[k + 1 :]
        else:
            tokens = [rng.randrange(vocab) for _ in range(n)]
        return _finished(tokens, n, stops, vocab, rng)

    def _lengths(
        self, produced: int, top: int, ref: RequestResult | None, rng: random.Random, kind: str | None = None
    ) -> list[int] | None:
        """Acceptance lengths that add up to ``produced`` tokens (the prefill's one comes without a round)."""
        kind = kind or self.oddity.lengths
        if kind == "none":
            return None
        if kind == "reference" and ref is not None and ref.acceptance_lengths is not None:
            return list(ref.acceptance_lengths)
        left = produced - 1
        if kind == "ones" or top == 1:
            return [1] * left
        if kind == "block":  # every round at the block size, the last cut short by the output's end
            return [top] * -(-left // top)
        lengths = []
        while left > 0:
            lengths.append(rng.randint(1, min(top, left)))
            left -= lengths[-1]
        return lengths

    def _mean(self, lengths: list[int] | None, top: int) -> float | None:
        kind = self.oddity.mean
        if kind == "none":
            return None
        if kind == "one" or top == 1:
            return 1.0
        if kind == "block":
            return float(top)
        return sum(lengths) / len(lengths) if lengths else 1.0

    def _per_position(self, top: int, rng: random.Random) -> list[float] | None:
        kind, depth = self.oddity.per_position, max(1, top - 1)
        if kind == "none":
            return None
        if kind == "empty":
            return []
        if kind in ("zeros", "ones"):
            return [float(kind == "ones")] * depth
        rates = sorted((rng.random() for _ in range(depth)), reverse=True)
        return [round(r, 3) for r in rates]


def _chains(request: Request, output: list[int], lengths: list[int]) -> tuple[list[RoundTrace], list[VerifiedTree]]:
    """Each round's tree as a chain of the tokens it committed: the root, its accepted tokens, then the
    bonus (the target's choice after the last accepted one; token 0 past the output's end)."""
    traces, trees, committed, start = [], [], 0, len(request.prompt_ids)
    for length in lengths:
        path = [output[i] if i < len(output) else 0 for i in range(committed, committed + length + 1)]
        nodes, targets, n = path[:length], path[1:], length  # root + accepted; the target's token at each
        parents = [-1, *range(n - 1)]
        traces.append(
            RoundTrace(
                start=start + committed,
                root_token=nodes[0],
                tree_tokens=nodes,
                parents=parents,
                depths=list(range(n)),
                positions=[start + committed + d for d in range(n)],
                accepted=list(range(1, n)),
                target_tokens=targets,
                bonus=targets[-1],
                top2_margins=[1.0] * n,
                node_target_tokens=targets,
            )
        )
        trees.append(VerifiedTree(tree_tokens=nodes, parents=parents, node_target_tokens=targets))
        committed += length
    return traces, trees


def _finished(tokens: list[int], n: int, stops: set[int], vocab: int, rng: random.Random) -> tuple[list[int], str]:
    """``tokens`` as a valid output: cut after its first stop token ("stop"), else filled to ``n`` tokens
    with tokens that are not stops ("length")."""
    out = list(tokens[:n])
    others = [t for t in range(vocab) if t not in stops] or [0]
    while len(out) < n:
        out.append(rng.choice(others))
    for i, token in enumerate(out):
        if token in stops:
            return out[: i + 1], "stop"
    return out, "length"


@contextmanager
def memoised_references() -> Iterator[None]:
    """Inside the block, the session's oracle and the reference engine the misbehaving engines wrap
    (:mod:`ddtree_conformance.testing.misbehaving`) are :class:`MemoisedReference`."""
    with ExitStack() as stack:
        for module in (session_engines, reference_engine):
            stack.enter_context(mock.patch.object(module, "ReferenceEngine", MemoisedReference))
        yield


_CLASSES: dict[Oddity, type[OddEngine]] = {}


def odd_engine(oddity: Oddity) -> type[OddEngine]:
    """An engine class answering with ``oddity`` (a factory for :class:`~ddtree_conformance.session.SuiteSession`)."""
    if oddity not in _CLASSES:
        _CLASSES[oddity] = type("OddEngine", (OddEngine,), {"oddity": oddity})
    return _CLASSES[oddity]
