"""Acceptance by replay: every round of an engine judged against the fp32 reference on the engine's own context
(:mod:`ddtree_conformance.adapters.reference.replay` runs the reference there).

A round whose acceptance length or tokens differ from the replay's is excused only when the replay shows, at that
round, a near-tie that explains the difference:

* target near-tie: the first token where the engine's round and the replay's walk part is the engine's token at a
  node of the replayed path, and its fp32 logit there is within the near-tie bound of the top-1 (the walk took the
  other side of a near-tie);
* drafter near-tie: the tokens agree and only the lengths differ, so one tree held the deciding path ``D`` (the
  common tokens, ``min`` of the two lengths deep) and the other did not. The replay's drafter logits, moved by at
  most the calibrated drafter tolerance toward the engine's side (``D``'s tokens up, every other token at those
  depths down, or the reverse), must flip ``D``'s membership of the rebuilt spec tree. The excuse is *confirmed*
  only by the engine's own drafter logits for the round (a traced rerun that reproduces the run): non-zero and at
  most the tolerance away from the replay's, with a spec tree that holds ``D`` exactly when the engine's round says
  so. Without them a round cannot be confirmed: it is *unconfirmed*, longer or shorter than the replay's, and each
  direction counts against its own cap (the noise model's measured rate over correct engines that round
  differently, :mod:`ddtree_conformance.noise`), and every round's length difference enters the one-sided tau test.

A shorter round whose traced tree holds fewer nodes than the budget, where the spec tree of that many nodes accepts
exactly the engine's length, is classed a cut round (a scheduler that cuts trees when its token budget runs out, as
vLLM's does, or a budget cap): not excused, since the engine then accepts less than DDTree at its budget, but named
for what it is in the failure.

The output's last round (it reaches the length limit or a stop token) is compared only as far as the output shows,
whatever length the engine reports for it (emitted or walked): past the end neither side's tokens are observable,
and an engine may leave out nodes it could never emit. For the same reason tau counts that round's emitted tokens
on both sides, so a length claimed past the end cannot inflate it. Two more freedoms of docs/reference/freedoms.md
are judged here: near the output's end the drafter's block may be cut to the room left (the round is then replayed
that way, ``ReplayRound.short_block``), and near the context's end an engine that counts KV slots flat may verify
only the spec tree of the slots left (``context_limit``); such rounds are listed as ``freedom`` rounds, never
excused as near ties.

Confirmed drafter rounds, unconfirmed rounds of each direction and the tau test are the noise model's
(:class:`~ddtree_conformance.noise.NoiseModel`); excused target rounds are excused positions of token scoring and
count against its ceiling. Near the output's end an engine may also cap its tree at the depth the output can still
emit and spend its budget on the nodes it can (``emittable-depth``, a freedom). Anything else is a failure, named
by prompt and round, with both sides shown; so is the token after the prefill, which no round verifies, unless it
is the fp32 argmax or a near tie (:func:`prefill_verdict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import torch

from .drafter_excuse import build_spec_tree, continuation_lean, drafter_excuse, drafter_flips_within, holds_path
from .metrics import emitted_lengths, mean_tau
from .noise import NoiseModel, TokenCall
from .spec import build_tree, least_budget
from .token_scoring import PositionScores, window

__all__ = ["RoundKind", "RoundVerdict", "ReplayRun", "drafter_flips_within", "judge_rounds", "prefill_verdict"]


class RoundKind(StrEnum):
    """How a replayed round that differs from the engine's was judged (module doc)."""

    TARGET_NEAR_TIE = "target-near-tie"  # excused: a low-precision near tie of the target
    FP32_TIE = "fp32-tie"  # float32: parted at a tie
    DRAFTER_NEAR_TIE = "drafter-near-tie"  # excused: confirmed by the engine's own drafter logits
    LONGER_UNCONFIRMED = "longer-unconfirmed"  # longer, a drafter flip could explain it, nothing confirms it
    SHORTER_UNCONFIRMED = "shorter-unconfirmed"  # shorter, likewise
    CUT_TREE = "cut-tree"  # shorter on a smaller traced tree that the spec of that size agrees with
    SHORT_BLOCK = "short-block"  # freedom: the drafter's block cut to the room left
    EMITTABLE_DEPTH = "emittable-depth"  # freedom: the tree cut to the depth the output can still emit
    CONTEXT_CUT = "context-cut"  # freedom: the tree cut to the KV slots left
    DIFFERS = "differs"  # a failure

    @property
    def freedom(self) -> bool:
        return self in (RoundKind.SHORT_BLOCK, RoundKind.EMITTABLE_DEPTH, RoundKind.CONTEXT_CUT)


@dataclass
class RoundVerdict:
    prompt: str
    round: int
    kind: RoundKind
    engine_length: int
    reference_length: int
    engine_tokens: list[int]
    reference_tokens: list[int]
    note: str = ""
    reference_tree: dict | None = None  # tokens, parents, accepted: for the report's drawing
    engine_tree: dict | None = None

    @property
    def shorter(self) -> bool:
        """The engine accepted fewer tokens than the replay on the tokens both committed (its tokens a
        prefix of the replay's): what a scheduler that drops drafts or cuts trees does."""
        agree = self.engine_tokens == self.reference_tokens[: len(self.engine_tokens)]
        return self.round >= 0 and self.engine_length < self.reference_length and agree

    def describe(self) -> str:
        if self.round < 0:
            return f"{self.prompt} prefill token: {self.note}"
        return (
            f"{self.prompt} round {self.round}: engine length {self.engine_length} tokens {self.engine_tokens}, "
            f"reference replay length {self.reference_length} tokens {self.reference_tokens}"
            + (f" ({self.note})" if self.note else "")
        )


@dataclass
class ReplayRun:
    """Round verdicts of one check's prompts (every round that differs, with its kind)."""

    rounds: int = 0
    engine_lengths: list[list[int]] = field(default_factory=list)
    reference_lengths: list[list[int]] = field(default_factory=list)
    tau: float = 0.0  # pooled over engine_lengths (metrics.mean_tau)
    reference_tau: float = 0.0  # pooled over reference_lengths
    verdicts: list[RoundVerdict] = field(default_factory=list)
    # per round whose tokens agree with the replay's (the drafter side decides its length: equal, drafter
    # near-tie and unconfirmed rounds), the engine's emitted length minus the replay's (the tau test's
    # differences); rounds where the target parted (a near tie, counted by token scoring) are left out:
    # their lengths follow another path, and their spread would hide a drafter-side gain
    drafter_side: list[int] = field(default_factory=list)
    by_prompt: dict = field(default_factory=dict)  # prompt -> (engine lengths, replay lengths)
    lean: list[tuple[int, int]] = field(default_factory=list)  # per round: drafter rows toward / away (_lean)

    def of(self, *kinds: RoundKind) -> list[RoundVerdict]:
        return [v for v in self.verdicts if v.kind in kinds]

    @property
    def target(self) -> list[RoundVerdict]:
        return self.of(RoundKind.TARGET_NEAR_TIE)

    @property
    def drafter(self) -> list[RoundVerdict]:  # confirmed by the engine's own drafter logits
        return self.of(RoundKind.DRAFTER_NEAR_TIE)

    @property
    def longer(self) -> list[RoundVerdict]:
        return self.of(RoundKind.LONGER_UNCONFIRMED)

    @property
    def shorter(self) -> list[RoundVerdict]:
        return self.of(RoundKind.SHORTER_UNCONFIRMED)

    @property
    def unconfirmed(self) -> list[RoundVerdict]:
        return self.of(RoundKind.LONGER_UNCONFIRMED, RoundKind.SHORTER_UNCONFIRMED)

    @property
    def fp32_ties(self) -> list[RoundVerdict]:
        return self.of(RoundKind.FP32_TIE)

    @property
    def cut(self) -> list[RoundVerdict]:
        return self.of(RoundKind.CUT_TREE)

    @property
    def freedom(self) -> list[RoundVerdict]:
        return [v for v in self.verdicts if v.kind.freedom]

    @property
    def differs(self) -> list[RoundVerdict]:
        return self.of(RoundKind.DIFFERS)

    def longer_side(self) -> ReplayRun:
        """This run with every :attr:`RoundVerdict.shorter` round set aside: what is left says whether
        the engine claims more than the replay, or commits other tokens."""
        return replace(self, verdicts=[v for v in self.verdicts if not v.shorter])

    def lengths_around(self, verdict: RoundVerdict) -> str:
        """Both sides' per-round lengths around ``verdict``'s round."""
        mine, theirs = self.by_prompt.get(verdict.prompt, ([], []))
        return f"lengths engine {window(mine, verdict.round)} | replay {window(theirs, verdict.round)}"


def _cut_length(draft_logits: torch.Tensor, mode: str, nodes: int, tokens: Sequence[int], most: int) -> int:
    """The acceptance length of a walk along ``tokens`` on the spec tree of ``nodes`` nodes (the chain's
    first ``nodes`` drafts in dflash mode); a root-only round accepts 1."""
    if nodes <= 0:
        return 1
    if mode == "dflash":
        return _accepted_length(build_spec_tree(draft_logits[:nodes], mode, nodes), tokens, most)
    return _accepted_length(build_spec_tree(draft_logits, mode, nodes), tokens, most)


def _accepted_length(tree, tokens: Sequence[int], most: int) -> int:
    """The acceptance length of a walk along ``tokens`` (the target's choices) on ``tree``, at most ``most``."""
    k = 0
    while k + 1 < most and holds_path(tree, tokens[: k + 1]):
        k += 1
    return k + 1


def first_token_difference(engine_tokens: Sequence[int], reference_tokens: Sequence[int]) -> int | None:
    for j, (a, b) in enumerate(zip(engine_tokens, reference_tokens)):
        if a != b:
            return j
    return None


def _tree_dict(tokens, parents, accepted) -> dict:
    return {"tokens": list(tokens), "parents": list(parents), "accepted": list(accepted)}


def prefill_verdict(
    label: str, output: Sequence[int], scores: PositionScores, rules: NoiseModel
) -> RoundVerdict | None:
    """The token chosen after the prefill (no round verifies it): None where it is the fp32 argmax (or an
    fp32 tie), else its verdict: in low precision a target near tie (counted with the target near-tie
    rounds), or a difference."""
    if not output or output[0] == scores.argmax[0]:
        return None
    gap = scores.gaps[0]
    call = rules.token(gap)
    if call in (TokenCall.MATCH, TokenCall.FP32_TIE):
        return None
    mine, theirs = [output[0]], [scores.argmax[0]]
    if call is TokenCall.NEAR_TIE:
        note = (
            f"fp32 target near-tie: the engine's token {output[0]} is {gap:.3g} below the top-1 "
            f"{scores.argmax[0]}, within the bound {rules.bound:.3g}"
        )
        return RoundVerdict(label, -1, RoundKind.TARGET_NEAR_TIE, 1, 1, mine, theirs, note)
    note = (
        f"the engine's token {output[0]} after the prefill is not the fp32 target's {scores.argmax[0]} "
        f"({gap:.3g} below the top-1, bound {rules.bound:.3g})"
    )
    return RoundVerdict(label, -1, RoundKind.DIFFERS, 1, 1, mine, theirs, note)


@dataclass(frozen=True)
class _Judging:
    """What every round of one prompt is judged with (:func:`judge_rounds`' arguments)."""

    prompt: str
    output: Sequence[int]
    rules: NoiseModel
    mode: str
    budget: int
    token_gaps: Sequence[float]
    engine_traces: object
    context_limit: int | None
    max_new_tokens: int | None


def judge_rounds(
    run: ReplayRun,
    prompt: str,
    engine_lengths: Sequence[int],
    output: Sequence[int],
    replayed,
    rules: NoiseModel,
    mode: str,
    budget: int,
    token_gaps: Sequence[float],
    engine_traces=None,
    context_limit: int | None = None,
    max_new_tokens: int | None = None,
) -> ReplayRun:
    """``run`` with every replayed round of one prompt classified into it (see the module doc): a new
    :class:`ReplayRun`, ``run`` left as it was.

    ``replayed``: :class:`~ddtree_conformance.adapters.reference.replay.ReplayRound` list;
    ``token_gaps``: token scoring's fp32 gap of each output token below the top-1;
    ``engine_traces``: a function giving the engine's per-round traces of this prompt from a rerun
    that reproduces it (or None); called for a round whose tokens agree but whose length differs
    (the drafter side: the engine's tree and drafter logits decide the excuse), and to draw a failing
    round, never for a target near tie. ``context_limit``: the engine's context window (max_context),
    for the context-cut freedom; None: no round is judged as cut by the context. ``max_new_tokens``:
    the request's length limit, for the emittable-depth freedom; None: not judged.
    """
    how = _Judging(prompt, output, rules, mode, budget, token_gaps, engine_traces, context_limit, max_new_tokens)
    verdicts = [v for rnd in replayed if (v := _round_verdict(rnd, engine_lengths[rnd.index], how)) is not None]
    # tau counts what the output shows (module doc): a last round cut by the output's end, its emitted tokens
    mine_emitted = emitted_lengths(engine_lengths, len(output))
    theirs_emitted = emitted_lengths([r.length for r in replayed], len(output))
    all_mine, all_theirs = [*run.engine_lengths, mine_emitted], [*run.reference_lengths, theirs_emitted]
    target_side = {v.round for v in verdicts if v.kind in _TARGET_SIDE}
    drafter_side = [a - b for rnd, a, b in zip(replayed, mine_emitted, theirs_emitted) if rnd.index not in target_side]
    lean = []
    if any(v.kind is RoundKind.DRAFTER_NEAR_TIE for v in verdicts):  # excuses from reported logits
        traces = engine_traces() if engine_traces is not None else None
        lean = _lean(replayed, {v.round for v in verdicts}, traces)
    return replace(
        run,
        rounds=run.rounds + len(replayed),
        engine_lengths=all_mine,
        reference_lengths=all_theirs,
        tau=mean_tau(all_mine),
        reference_tau=mean_tau(all_theirs),
        verdicts=[*run.verdicts, *verdicts],
        drafter_side=[*run.drafter_side, *drafter_side],
        by_prompt={**run.by_prompt, prompt: (list(engine_lengths), [r.length for r in replayed])},
        lean=[*run.lean, *lean],
    )


def _lean(replayed, judged: set[int], traces) -> list[tuple[int, int]]:
    """Whether the engine's reported drafter logits lean toward the target's continuation, over the rounds
    that agree with the replay (a round picked for differing would be picked for its lean): per round with
    a lean, its drafter rows toward and away (:func:`~ddtree_conformance.drafter_excuse.continuation_lean`)."""
    leans = []
    for rnd in replayed:
        trace = traces[rnd.index] if traces and rnd.index < len(traces) else None
        if rnd.index in judged or trace is None or trace.draft_logits is None or rnd.draft_top is None:
            continue
        # the round's own tokens: the fp32 target chose them (the round agrees with the replay). Later tokens
        # may be the engine's low-precision target near ties, which its drafter, fed the same rounded
        # features, honestly leans toward
        toward, away = continuation_lean(trace.draft_logits, rnd.draft_top, rnd.tokens)
        if toward or away:
            leans.append((toward, away))
    return leans


def _round_verdict(rnd, le: int, how: _Judging) -> RoundVerdict | None:
    """One replayed round against the engine's of length ``le``: None where they agree (as far as the
    output shows), else its verdict."""
    output = how.output
    mine = list(output[rnd.offset : rnd.offset + le])
    theirs = rnd.tokens
    if le == rnd.length and mine == theirs[: len(mine)]:
        return None
    at_end = rnd.offset + le >= len(output)  # the output's last round: it shows only what it emitted
    if at_end and rnd.length >= len(mine) and mine == theirs[: len(mine)]:
        return None
    verdict = RoundVerdict(
        how.prompt,
        rnd.index,
        RoundKind.DIFFERS,
        le,
        rnd.length,
        mine,
        theirs,
        reference_tree=_tree_dict(rnd.tree_tokens, rnd.parents, rnd.accepted),
    )
    if rnd.short_block is not None:
        short_length, short_tokens = rnd.short_block
        if mine == short_tokens[: len(mine)] and (le == short_length or (at_end and short_length >= len(mine))):
            note = "equal to the replay with the drafter's block cut to the room the output had left"
            return replace(verdict, kind=RoundKind.SHORT_BLOCK, note=note)

    def engine_trace():
        """The engine's trace of this round (drawn in the report, :func:`_drawn`), when a rerun reproduces it."""
        traces = how.engine_traces() if how.engine_traces is not None else None
        return traces[rnd.index] if traces and rnd.index < len(traces) else None

    j = first_token_difference(mine, theirs)
    if j is not None:  # the target side decides; the engine's trace is only drawn for a failure
        return _target_side(verdict, rnd, j, how, engine_trace)
    return _drafter_side(verdict, rnd, at_end, how, engine_trace)


def _drawn(verdict: RoundVerdict, trace) -> RoundVerdict:
    """``verdict`` with the engine's tree of the round, drawn in the report (as it was without a trace)."""
    if trace is None:
        return verdict
    return replace(verdict, engine_tree=_tree_dict(trace.tree_tokens, trace.parents, trace.accepted))


def _target_side(verdict: RoundVerdict, rnd, j: int, how: _Judging, engine_trace) -> RoundVerdict:
    """A round whose tokens part from the replay's at its ``j``-th: an fp32 tie, a target near tie, or a failure
    (``verdict`` judged: a new verdict)."""
    mine, theirs, rules = verdict.engine_tokens, verdict.reference_tokens, how.rules
    position = rnd.offset + j
    gap = how.token_gaps[position] if position < len(how.token_gaps) else float("inf")
    node_gap = rnd.path_gaps[j] if j < len(rnd.path_gaps) else float("inf")
    call = rules.token(gap, node_gap)
    if call is TokenCall.FP32_TIE:
        return replace(
            verdict,
            kind=RoundKind.FP32_TIE,
            note=f"fp32 tie at output position {position}: engine token {mine[j]} is {gap:.3g} below the top-1 "
            f"{theirs[j]}",
        )
    if call is TokenCall.NEAR_TIE:
        return replace(
            verdict,
            kind=RoundKind.TARGET_NEAR_TIE,
            note=f"fp32 target near-tie at output position {position}: engine token {mine[j]} is {gap:.3g} "
            f"below the top-1 {theirs[j]}, within the bound {rules.bound:.3g}",
        )
    return replace(
        _drawn(verdict, engine_trace()),
        note=f"at output position {position} the engine commits {mine[j]} where the fp32 target "
        f"chose {theirs[j]} ({gap:.3g} below the top-1, bound {rules.bound:.3g})",
    )


def _drafter_side(verdict: RoundVerdict, rnd, at_end: bool, how: _Judging, engine_trace) -> RoundVerdict:
    """A round whose tokens agree with the replay's and whose length does not: a freedom (emittable depth,
    context cut), a cut tree, a drafter near tie (confirmed or not), or a failure (``verdict`` judged: a new
    verdict)."""
    mine, theirs, le = verdict.engine_tokens, verdict.reference_tokens, verdict.engine_length
    mode, budget, limit = how.mode, how.budget, how.context_limit
    cap = _emittable_depth(rnd, mine, le, at_end, mode, budget, how.max_new_tokens)
    if cap is not None:
        return replace(
            verdict,
            kind=RoundKind.EMITTABLE_DEPTH,
            note=f"equal to the spec tree of B={budget} nodes no deeper than {cap}, the depth the output could "
            f"still emit ({how.max_new_tokens - rnd.offset} tokens left)",
        )
    fits = limit is not None and rnd.start - rnd.offset + 1 + len(how.output) <= limit
    if fits and le < rnd.length and rnd.draft_logits is not None:  # (an engine whose output passes its own
        full = budget if mode == "ddtree" else int(rnd.draft_logits.shape[0])  # limit states no limit)
        least = least_budget(full, limit - 2 - rnd.start)
        if least < full and _cut_length(rnd.draft_logits, mode, least, theirs, rnd.length) <= le:
            return replace(
                verdict,
                kind=RoundKind.CONTEXT_CUT,
                note=f"root at position {rnd.start} of a {limit}-token context: the KV slots left hold {least} nodes",
            )
    trace = engine_trace()  # the drafter side decides: the engine's own tree and drafter logits
    drawn = _drawn(verdict, trace)
    nodes = len(trace.tree_tokens) - 1 if trace is not None else budget
    if mode == "ddtree" and nodes < budget and le < rnd.length and rnd.draft_logits is not None:
        expected = _cut_length(rnd.draft_logits, mode, nodes, theirs, rnd.length)
        if expected == le:  # the engine verified a smaller tree (cut); at that size the spec agrees
            return replace(
                drawn,
                kind=RoundKind.CUT_TREE,
                note=f"the engine's trace holds {nodes} of B={budget} nodes (its scheduler cut the tree); the spec "
                f"tree of {nodes} nodes accepts exactly {le}",
            )
    engine_logits = None if trace is None else trace.draft_logits
    short = _short_view(rnd, mine, engine_logits)
    if short is not None:  # the engine may have drafted a block cut to the room left: judged on that block
        why = drafter_excuse(
            short, short.tokens[: min(le, short.length)], le > short.length, how.rules, mode, budget, engine_logits
        )
        if why.kind == "excused":
            return replace(drawn, kind=RoundKind.DRAFTER_NEAR_TIE, note=why.note + " (a cut block)")
    path = theirs[: min(le, rnd.length)]
    why = drafter_excuse(rnd, path, le > rnd.length, how.rules, mode, budget, engine_logits)
    return replace(drawn, kind=_drafter_kind(why.kind, le > rnd.length), note=why.note)


def _drafter_kind(excuse: str, longer: bool) -> RoundKind:
    """The kind of a drafter-side round by its excuse (:func:`~ddtree_conformance.drafter_excuse.drafter_excuse`)."""
    if excuse == "excused":
        return RoundKind.DRAFTER_NEAR_TIE
    if excuse == "unconfirmed":
        return RoundKind.LONGER_UNCONFIRMED if longer else RoundKind.SHORTER_UNCONFIRMED
    return RoundKind.DIFFERS


_TARGET_SIDE = (RoundKind.TARGET_NEAR_TIE, RoundKind.FP32_TIE, RoundKind.DIFFERS)


def _emittable_depth(rnd, mine, le: int, at_end: bool, mode: str, budget: int, max_new_tokens: int | None):
    """The depth cap, when the engine's round equals the spec tree of ``budget`` nodes no deeper than the
    output can still emit (``room - 1`` or ``room`` for ``room`` tokens left; a freedom,
    docs/reference/freedoms.md), else None. The target's choices along the engine's path are its own
    tokens (token scoring holds them to the fp32 target)."""
    if mode != "ddtree" or max_new_tokens is None or rnd.draft_logits is None:
        return None
    room = max_new_tokens - rnd.offset
    for cap in (room - 1, room):
        if not 0 < cap < rnd.draft_logits.shape[0]:
            continue
        length = _accepted_length(build_tree(rnd.draft_logits[:cap], budget), mine, len(mine) + 1)
        if length == le or (at_end and length >= len(mine)):
            return cap
    return None


def _short_view(rnd, mine: Sequence[int], engine_logits):
    """``rnd`` as replayed with the drafter's block cut to the room left, when that replay exists, agrees
    with the engine's tokens, and the engine's own logits (if reported) are of that block; else None."""
    if rnd.short_block is None or rnd.short_logits is None:
        return None
    length, tokens = rnd.short_block
    if first_token_difference(mine, tokens) is not None:
        return None
    if engine_logits is not None and len(engine_logits) != rnd.short_logits.shape[0]:
        return None
    return replace(
        rnd, length=length, tokens=tokens, draft_logits=rnd.short_logits, short_block=None, short_logits=None
    )
