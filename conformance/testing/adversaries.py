"""Adversarial engines: broken engines built to slip past the suite's verdicts, one per hole of issue 20.

:mod:`.mutants` breaks one spec step of the reference engine per bug class. The engines here add
what an engine team cutting corners might: they hide from the evidence (black-box capabilities, an
understated context limit, withheld drafter logits), touch the oracle's files, or forge what they
report (longer rounds, a forged tree node), so that a verdict that trusts them would pass a broken
engine. Each is a :class:`~ddtree_conformance.adapters.reference.engine.ReferenceEngine` underneath,
so everything not named is right. ``tests/test_adversaries.py`` shows each failing (or, where no
verdict can fail it, named in the report), and the reference passing the same checks;
``scripts/excuse_farming.py`` runs the bf16 ones on all 80 fixture prompts. They are engines like
any other: ``--engine ddtree_conformance.testing.adversaries:WrongPositionsBlackBox``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from ddtree_conformance.adapters.interface import Capabilities, RequestResult, RoundTrace, VerifiedTree
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.replay import drafter_flips_within
from ddtree_conformance.spec import compile_tree

from .mutants import _runner_up_walk, runner_up_choice, runner_up_lifted

__all__ = ["ADVERSARIES"]


# --------------------------------------------------------------------------------------- helpers
def black_box(caps: Capabilities) -> Capabilities:
    """Capabilities of an engine that shows nothing but its outputs (no traces, no acceptance data)."""
    return caps.model_copy(
        update={"traces": False, "per_round_acceptance": False, "draft_logits": False, "verified_tree_modes": []}
    )


def outputs_only(result: RequestResult) -> RequestResult:
    return result.model_copy(
        update={
            "acceptance_lengths": None,
            "rounds": None,
            "traces": None,
            "verified_trees": None,
            "mean_acceptance": None,
            "per_position_acceptance": None,
        }
    )


class _BlackBox(ReferenceEngine):
    """Returns outputs only, and says so in its capabilities (honest about what it shows)."""

    def capabilities(self) -> Capabilities:
        return black_box(super().capabilities())

    def generate(self, requests, config):
        return [outputs_only(r) for r in super().generate(requests, config.model_copy(update={"trace": False}))]


class _TargetPositions(ReferenceEngine):
    """The reference, with the target's position ids passed through :meth:`positions` in every mode
    (plain included): a RoPE fault of the target itself, so plain and speculative decoding agree."""

    def positions(self, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _pair(self, config):
        pair = super()._pair(config)
        if not getattr(pair, "_positions_wrapped", False):
            forward = pair.forward
            pair.forward = lambda ids, positions, cache, mask=None: forward(ids, self.positions(positions), cache, mask)
            pair._positions_wrapped = True
        return pair


# ------------------------------------------------------------------- item 2: an independent oracle
class WrongPositionsBlackBox(_TargetPositions, _BlackBox):
    """Target RoPE positions doubled (a wrong rope scaling factor) in plain and speculative decoding
    alike, outputs only: lossless against its own plain run, wrong from the first tokens. Passed every
    check on a prompt set without golden records before every output was scored against the fp32
    target."""

    name = "adversary-wrong-positions-black-box"

    def positions(self, positions):
        return positions * 2


class ShiftedPast512BlackBox(_TargetPositions, _BlackBox):
    """Target positions past 511 shifted by 32 (a cache block boundary fault) in every mode, outputs
    only: the long-context check (now context-range) and prompt-shapes compared it with its own plain
    run, which shares the fault."""

    name = "adversary-shifted-past-512-black-box"
    threshold, shift = 512, 32

    def positions(self, positions):
        return torch.where(positions >= self.threshold, positions + self.shift, positions)


class PrefillRunnerUp(ReferenceEngine):
    """Takes the target's runner-up as the token after the prefill (and only there), in every mode:
    no round verifies that token, so only the fp32 oracle sees it (lossless and, in the replay, the
    acceptance check)."""

    name = "adversary-prefill-runner-up"

    def _decoder(self, pair, request, config):
        decoder = super()._decoder(pair, request, config)
        prefill = decoder.prefill

        def lifted(prompt_ids):
            last_logits, features = prefill(prompt_ids)
            return runner_up_lifted(last_logits, float("inf")), features

        decoder.prefill = lifted
        return decoder


# ----------------------------------------------------------- item 5: capabilities against the model
class ContextUnderstated(_TargetPositions):
    """Claims max_context 300 while its target allows more, and shifts target positions past 399
    in every mode: context-range runs below the fault. No verdict can fail an engine for a limit it
    states; the report names the context range left untested."""

    name = "adversary-context-understated"
    claimed, threshold, shift = 300, 400, 32

    def positions(self, positions):
        return torch.where(positions >= self.threshold, positions + self.shift, positions)

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"max_context": self.claimed})


class ContextOverstated(ReferenceEngine):
    """Claims four times its target's context window."""

    name = "adversary-context-overstated"

    def capabilities(self) -> Capabilities:
        caps = super().capabilities()
        return caps.model_copy(update={"max_context": 4 * (caps.max_context or 256)})


class DrafterLogitsWithheld(ReferenceEngine):
    """Promises drafter logits in its traces and returns none: tree-structure used to say "trees equal
    the spec's" having compared no tree."""

    name = "adversary-drafter-logits-withheld"

    def generate(self, requests, config):
        results = super().generate(requests, config)
        return [
            r
            if r.traces is None
            else r.model_copy(update={"traces": [t.model_copy(update={"draft_logits": None}) for t in r.traces]})
            for r in results
        ]


# ------------------------------------------------------------------ item 6: the oracle out of reach
class GoldenRewriter(_TargetPositions):
    """Wrong in every mode (target positions doubled), and rewrites the float32 golden file (engine
    option ``golden_file``) with its own outputs and acceptance lengths as it runs: golden compared it
    with its own outputs, and acceptance took its lengths from the rewritten file instead of replaying."""

    name = "adversary-golden-rewriter"
    OPTIONS = ("builder", "golden_file")

    def positions(self, positions):
        return positions * 2

    def generate(self, requests, config):
        results = super().generate(requests, config)
        path = Path(self.options["golden_file"])
        data = json.loads(path.read_text())
        key = "dflash" if config.mode == "dflash" else f"ddtree-{config.budget}"
        by_prompt = {tuple(r.prompt_ids): res for r, res in zip(requests, results)}
        for record in data["records"].values():
            mine = by_prompt.get(tuple(record["prompt_ids"]))
            if mine is None or mine.error or len(mine.output_ids) < len(record["output_ids"]):
                continue
            if config.mode == "plain":
                record["output_ids"] = mine.output_ids
            elif mine.acceptance_lengths is not None:
                record["acceptance"][key] = mine.acceptance_lengths
        path.write_text(json.dumps(data))
        return results


# ------------------------------------------------------------------- item 7: excuses not farmed
def _forge_round(trace: RoundTrace, follower: RoundTrace) -> RoundTrace:
    """``trace`` claiming one more accepted node: the old bonus, forged in as a child of its last
    accepted node (one leaf off the path removed to keep the budget), the follower's bonus as bonus."""
    n = len(trace.tree_tokens)
    on_path = {0, *trace.accepted}
    has_children = set(trace.parents[1:])
    drop = next((i for i in range(n - 1, 0, -1) if i not in on_path and i not in has_children), None)
    keep = [i for i in range(n) if i != drop]
    index = {old: new for new, old in enumerate(keep)}
    last = trace.accepted[-1] if trace.accepted else 0
    tokens = [trace.tree_tokens[i] for i in keep] + [trace.bonus]
    parents = [-1 if trace.parents[i] < 0 else index[trace.parents[i]] for i in keep] + [index[last]]
    depths = [trace.depths[i] for i in keep] + [trace.depths[last] + 1]
    positions = [trace.positions[i] for i in keep] + [trace.start + trace.depths[last] + 1]
    forged = len(tokens) - 1
    targets = None
    if trace.node_target_tokens is not None:
        targets = [trace.node_target_tokens[i] for i in keep] + [follower.bonus]
    return trace.model_copy(
        update={
            "tree_tokens": tokens,
            "parents": parents,
            "depths": depths,
            "positions": positions,
            "accepted": [index[a] for a in trace.accepted] + [forged],
            "target_tokens": list(trace.target_tokens) + [follower.bonus],
            "bonus": follower.bonus,
            "top2_margins": list(trace.top2_margins) + [follower.top2_margins[0]],
            "node_target_tokens": targets,
            "draft_logits": None,
        }
    )


def _light(trace: RoundTrace) -> VerifiedTree:
    return VerifiedTree(
        tree_tokens=trace.tree_tokens, parents=trace.parents, node_target_tokens=trace.node_target_tokens
    )


class ForgedAcceptance(ReferenceEngine):
    """Reports a round one token longer where the next round committed its bonus alone and its own
    drafter logits, moved by the pair's calibrated drafter tolerance, would put that bonus into the
    tree (so a replay would see a plausible drafter near tie): the next round is dropped and its
    token forged into the round's tree as an accepted node (a leaf off the path removed, so the
    budget holds). Outputs are right; tau rises (27 rounds, +8.7 % on the fixture's 80 prompts in
    bf16 at B=16). It withholds drafter logits, so the forged trees cannot be rebuilt; its traces,
    verified trees and lengths are consistent with its outputs. Every forged round used to be excused
    as a drafter near tie, under the cap."""

    name = "adversary-forged-acceptance"

    def capabilities(self) -> Capabilities:
        return super().capabilities().model_copy(update={"draft_logits": False})

    def generate(self, requests, config):
        if config.mode == "plain":
            return super().generate(requests, config)
        results = super().generate(requests, config.model_copy(update={"trace": True, "trace_draft_logits": True}))
        return [self._forge(r, config) for r in results]

    def _forgeable(self, trace: RoundTrace, config) -> bool:
        """Whether the round's own drafter logits, moved by the calibrated tolerance, hold the bonus."""
        tolerance = load_calibration(self.model_dir, config.dtype).drafter_tolerance
        path = [trace.tree_tokens[a] for a in trace.accepted] + [trace.bonus]
        logits = torch.tensor(trace.draft_logits, dtype=torch.float32)
        return drafter_flips_within(logits, config.mode, config.budget, path, tolerance)

    def _forge(self, result: RequestResult, config) -> RequestResult:
        if result.error or not result.traces:
            return result
        block = self._pair(config).drafter.block_size
        traces, k = list(result.traces), 0
        while k + 1 < len(traces):
            if (
                len(traces[k + 1].accepted) == 0
                and len(traces[k].accepted) + 2 <= block
                and k + 2 < len(traces)
                and traces[k].draft_logits is not None
                and self._forgeable(traces[k], config)
            ):
                traces[k : k + 2] = [_forge_round(traces[k], traces[k + 1])]
            k += 1
        traces = [t.model_copy(update={"draft_logits": None}) for t in traces]
        lengths = [len(t.accepted) + 1 for t in traces]
        return result.model_copy(
            update={
                "acceptance_lengths": lengths,
                "rounds": len(lengths),
                "verified_trees": [_light(t) for t in traces],
                "traces": traces if config.trace else None,
            }
        )


class RunnerUpUnder005(ReferenceEngine):
    """Takes the target's runner-up wherever its own top-2 gap is below 0.05 nats, in every mode (its
    greedy sampler does it): every such token is well within the bf16 near-tie bound, and 0.05 nats is
    about the size of bf16 noise, so each one alone looks like a low-precision near tie. On the 80
    fixture prompts in bf16 it excused 126 positions in lossless against a ceiling of 323 (a correct
    engine: about 95)."""

    name = "adversary-runner-up-under-0.05"
    threshold = 0.05

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.walk_step = _runner_up_walk(self.threshold)
        self.choose_step = runner_up_choice(self.threshold)


# ---------------------------------------------------------------- item 8: node-level evidence
def _previous_sibling_visible(tree, root, start, prefix_len=None, dtype=torch.float32):
    """The spec's verify, except that every second child of a node (its 2nd, 4th, ... in pop order)
    also sees the sibling popped just before it (a tree-attention fault touching only some sibling
    nodes; first children, where the accepted path mostly runs, are untouched)."""
    verify = compile_tree(tree, root, start, prefix_len, dtype)
    parents = tree.parents.tolist()
    visibility = verify.visibility.clone()
    children: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        siblings = children.setdefault(parents[i], [])
        if len(siblings) % 2 == 1:
            visibility[i, siblings[-1]] = True
        siblings.append(i)
    mask = verify.attention_mask.clone()
    n = visibility.shape[0]
    block = mask[0, 0, :, -n:]
    block.zero_()
    block.masked_fill_(~visibility, torch.finfo(dtype).min)
    return dataclasses.replace(verify, attention_mask=mask, visibility=visibility)


class SiblingPeek(ReferenceEngine):
    """Every second child of a node also attends to the sibling before it; it reports traces and verified trees
    (light traces) like the reference, so node scoring sees every touched node."""

    name = "adversary-sibling-peek"
    compile_step = staticmethod(_previous_sibling_visible)


class SiblingPeekBlackBox(_BlackBox):
    """:class:`SiblingPeek` showing outputs only: in bf16 each output moves only within noise, so
    output scoring cannot see it at this evidence, and the report must say so."""

    name = "adversary-sibling-peek-black-box"
    compile_step = staticmethod(_previous_sibling_visible)


# hole of issue 20 -> the engine built for it
ADVERSARIES = {
    "wrong in plain and ddtree alike, custom prompts": WrongPositionsBlackBox,
    "wrong past 512 in every mode (context-range, prompt-shapes)": ShiftedPast512BlackBox,
    "wrong token after the prefill, every mode": PrefillRunnerUp,
    "max_context understated below a bug at 400": ContextUnderstated,
    "max_context overstated": ContextOverstated,
    "promised drafter logits missing": DrafterLogitsWithheld,
    "golden file rewritten mid-run": GoldenRewriter,
    "forged acceptance (longer rounds, forged node)": ForgedAcceptance,
    "runner-up under 0.05 nats": RunnerUpUnder005,
    "sibling-node attention bug with verified trees": SiblingPeek,
    "sibling-node attention bug, black box": SiblingPeekBlackBox,
}
