"""Walking a verified tree (algorithm doc §3, "Walk") and the target's token choice.

At every node the target chooses a token: its argmax at temperature 0, otherwise a sample from
the request's processed distribution (temperature, then top-k, then top-p; bug class 7 is
forgetting these at tree nodes). From the root, the walk moves to the child whose drafted token
equals the current node's target token and stops when none does; that target token is the bonus.

Sampling draws one value per *visited* node, in path order, from the request's generator. Plain
decoding draws one value per token from the same generator, so with bit-identical logits a
lossless tree run reproduces the plain run's sample sequence exactly, not only in distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree

__all__ = ["SamplingParams", "WalkResult", "processed_probs", "choose_token", "walk_tree", "top2_margin"]


@dataclass(frozen=True)
class SamplingParams:
    """The request's sampling parameters. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 or negative: disabled
    top_p: float = 1.0  # 1.0: disabled

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class WalkResult:
    accepted: list[int]  # accepted node indices along the path, root excluded
    bonus: int  # the target's token after the last accepted node
    target_tokens: dict[int, int]  # node index -> target token, for every visited node


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target distribution the request samples from, for one row of logits ``[V]``.

    float32 softmax of ``logits / temperature`` restricted to the top-k logits (ties at the k-th
    value kept) and then to the smallest top-p nucleus (the most probable token always kept).
    """
    scaled = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """The target's token for one row of logits: argmax (lowest id on ties) or one sample."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = processed_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def walk_tree(
    tree: DraftTree,
    target_logits: torch.Tensor,
    params: SamplingParams = SamplingParams(),
    generator: torch.Generator | None = None,
) -> WalkResult:
    """Longest path of drafted tokens that the target agrees with (doc §3, "Walk").

    ``target_logits``: ``[N+1, V]``, row i is the target's next-token logits at node i.
    """
    if target_logits.shape[0] != tree.num_nodes + 1:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, tree has {tree.num_nodes + 1} nodes")
    children = tree.children
    accepted: list[int] = []
    chosen: dict[int, int] = {}
    node = 0
    while True:
        token = choose_token(target_logits[node], params, generator)
        chosen[node] = token
        child = children[node].get(token)
        if child is None:
            return WalkResult(accepted=accepted, bonus=token, target_tokens=chosen)
        accepted.append(child)
        node = child


def top2_margin(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit along the last axis (the near-tie measure of doc §7)."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return top[..., 0] - top[..., 1]
