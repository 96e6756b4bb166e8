"""Node-level evidence: every node of every verified tree scored against the fp32 verify of that tree.

An engine that reports, per round, the tree it verified (tokens, parents) and the target's argmax
at every node (a light trace, :class:`~ddtree_conformance.adapters.interface.VerifiedTree`, or the
``node_target_tokens`` of a full trace) can be judged node by node, not only on the path it
accepted: about B times the evidence of its output. The fp32 reference target verifies the very
same trees on the engine's own committed context: the output teacher-forced causally once into a
KV cache, then each round's non-root nodes, seeing the committed prefix up to the round's root and
their own ancestors, at position ``root + depth`` (the spec's verify, :mod:`ddtree_conformance.spec`).

Each node is judged like an output position (:mod:`ddtree_conformance.token_scoring`): the engine's
node target must be the fp32 argmax there (float32), or within the calibrated near-tie bound of the
top-1 with the excused nodes under the ceiling at the nodes' own fp32 top-2 gaps (bfloat16/float16).
A tree-attention bug that touches only some sibling nodes shifts those nodes' targets far beyond
noise while moving any one output only slightly: node scoring sees it in every dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from .noise import NoiseModel, TokenCall
from .spec import ancestor_visibility
from .verified_trees import depths, walk

__all__ = ["TreeRound", "NodeFinding", "NodeScores", "rounds_of", "score_nodes"]


@dataclass(frozen=True)
class TreeRound:
    """One verified round: where its root sits in the output, its tree and the engine's node targets."""

    root_index: int  # output index of the root (the last committed token)
    tree_tokens: tuple[int, ...]
    parents: tuple[int, ...]
    node_targets: tuple[int, ...]


def rounds_of(result) -> list[TreeRound]:
    """The verified rounds of one result: its ``verified_trees`` (light traces), else its traces'
    ``node_target_tokens``; [] when it has neither. Round roots follow the acceptance lengths (or,
    for light traces without them, the walk of each tree by its node targets)."""
    trees = result.verified_trees
    if trees is None and result.traces is not None and all(t.node_target_tokens is not None for t in result.traces):
        trees = [(t.tree_tokens, t.parents, t.node_target_tokens, len(t.accepted) + 1) for t in result.traces]
    elif trees is not None:
        lengths = result.acceptance_lengths or [
            len(walk(t.tree_tokens, t.parents, t.node_target_tokens)) for t in trees
        ]
        trees = [(t.tree_tokens, t.parents, t.node_target_tokens, n) for t, n in zip(trees, lengths)]
    if not trees:
        return []
    rounds, root = [], 0
    for tokens, parents, targets, length in trees:
        if root >= len(result.output_ids):
            break
        rounds.append(TreeRound(root, tuple(tokens), tuple(parents), tuple(targets)))
        root += length
    return rounds


@torch.inference_mode()
def _tree_logits(
    model, device, prompt: list[int], output: Sequence[int], rounds: list[TreeRound]
) -> list[torch.Tensor]:
    """fp32 logits ``[nodes, V]`` of every round's tree (row 0: the root): the committed context run
    once causally into a KV cache, then each round's non-root nodes against the cache cut at its root."""
    from transformers import DynamicCache

    context = list(prompt) + list(output[: max(r.root_index for r in rounds) + 1])
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([context], device=device)
    prefix = (
        model(
            input_ids=ids,
            position_ids=torch.arange(len(context), device=device).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
        )
        .logits[0]
        .float()
    )
    full = [(layer.keys, layer.values) for layer in cache.layers]
    out = []
    for rnd in rounds:
        root_at = len(prompt) + rnd.root_index
        n = len(rnd.tree_tokens) - 1
        if n == 0:
            out.append(prefix[root_at : root_at + 1])
            continue
        for layer, (keys, values) in zip(cache.layers, full):  # views: the forward appends by concatenation
            layer.keys, layer.values = keys[:, :, : root_at + 1], values[:, :, : root_at + 1]
        node_depths = depths(rnd.parents)
        allowed = torch.zeros((n, root_at + 1 + n), dtype=torch.bool)
        allowed[:, : root_at + 1] = True
        allowed[:, root_at + 1 :] = ancestor_visibility(torch.tensor(rnd.parents))[1:, 1:]
        mask = torch.zeros(allowed.shape, dtype=torch.float32)
        mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
        logits = (
            model(
                input_ids=torch.tensor([rnd.tree_tokens[1:]], device=device),
                position_ids=torch.tensor([[root_at + d for d in node_depths[1:]]], device=device),
                attention_mask=mask.to(device).view(1, 1, n, -1),
                past_key_values=cache,
                use_cache=True,
            )
            .logits[0]
            .float()
        )
        out.append(torch.cat([prefix[root_at : root_at + 1], logits]))
    return out


@dataclass(frozen=True)
class NodeFinding:
    """A tree node whose engine target is not the fp32 verify's (excused within the bound, else outside)."""

    label: str
    round: int
    node: int
    depth: int
    token: int
    engine_target: int
    fp32_target: int
    gap: float


@dataclass
class NodeScores:
    """Every scored node of one check and the verdict on them (same rules as token scoring)."""

    rules: NoiseModel
    nodes: int = 0
    rounds: int = 0
    outputs: int = 0
    excused: list[NodeFinding] = field(default_factory=list)
    outside: list[NodeFinding] = field(default_factory=list)
    top2: list[float] = field(default_factory=list)

    def add(self, label: str, round_index: int, rnd: TreeRound, logits: torch.Tensor) -> None:
        top = torch.topk(logits, 2, dim=-1)
        targets = torch.tensor(rnd.node_targets, dtype=torch.long, device=logits.device).unsqueeze(1)
        gaps = (top.values[:, 0] - logits.gather(1, targets).squeeze(1)).clamp(min=0.0).tolist()
        argmax = logits.argmax(dim=-1).tolist()  # the lowest token id among exact ties, as engines choose
        self.top2 += (top.values[:, 0] - top.values[:, 1]).tolist()
        self.nodes += len(rnd.node_targets)
        self.rounds += 1
        node_depths = None
        for node, (got, best, gap) in enumerate(zip(rnd.node_targets, argmax, gaps)):
            call = TokenCall.MATCH if got == best else self.rules.token(gap)
            if call in (TokenCall.MATCH, TokenCall.FP32_TIE):
                continue
            node_depths = node_depths or depths(rnd.parents)
            entry = NodeFinding(
                label, round_index, node, node_depths[node], rnd.tree_tokens[node], got, best, round(gap, 6)
            )
            (self.excused if call is TokenCall.NEAR_TIE else self.outside).append(entry)

    def problem(self) -> str | None:
        if self.outside:
            first = self.outside[0]
            return (
                f"{len(self.outside)}/{self.nodes} tree nodes differ from the fp32 verify of the same tree on the "
                f"same context; first: {first.label} round {first.round} node {first.node} (depth "
                f"{first.depth}, token {first.token}): engine's target {first.engine_target}, fp32 "
                f"{first.fp32_target} ({first.gap:.3g} below the fp32 top-1, bound {self.rules.bound:.3g}); "
                "tree mask, node positions or KV wrong"
            )
        ceiling, mu = self.rules.ceiling(self.top2)
        if not self.rules.exact and len(self.excused) > ceiling:
            return (
                f"{len(self.excused)}/{self.nodes} tree nodes differ from the fp32 verify within the near-tie "
                f"bound, above the ceiling {ceiling} a correct engine reaches at these gaps (expected <= "
                f"{mu:.1f}); tree mask, node positions or KV wrong"
            )
        return None

    def summary(self) -> str:
        near = ""
        if self.excused:
            near = f", {len(self.excused)} within the near-tie bound (ceiling {self.rules.ceiling(self.top2)[0]})"
        return (
            f"{self.nodes} tree nodes of {self.rounds} rounds ({self.outputs} outputs) equal the fp32 verify of "
            f"the same trees{near}"
        )

    def details(self) -> dict:
        ceiling, mu = self.rules.ceiling(self.top2)
        return {
            "nodes": self.nodes,
            "rounds": self.rounds,
            "outputs": self.outputs,
            "excused_nodes": len(self.excused),
            "outside_nodes": len(self.outside),
            "node_ceiling": ceiling,
            "expected_excused_nodes": round(mu, 3),
            "first_excused_nodes": [asdict(e) for e in self.excused[:20]],
            "first_outside_nodes": [asdict(e) for e in self.outside[:20]],
        }


def score_nodes(scorer, items, rules: NoiseModel) -> NodeScores:
    """Score every node of ``items`` (``(label, prompt_ids, output_ids, rounds)``) with ``scorer``
    (a :class:`~ddtree_conformance.scorer.TargetScorer` in fp32)."""
    scores = NodeScores(rules)
    for label, prompt, output, rounds in items:
        if not rounds:
            continue
        scores.outputs += 1
        for index, (rnd, logits) in enumerate(
            zip(rounds, _tree_logits(scorer.model, scorer.device, list(prompt), output, rounds))
        ):
            scores.add(label, index, rnd, logits)
    return scores
