"""Deliberately broken reference engines, one per bug class of algorithm doc §6.

Each replaces exactly one spec step of :class:`ddtree_conformance.adapters.reference.engine.ReferenceEngine`. The
suite must fail every one of them with a message naming the symptom (tests/test_mutants.py).
They are engines like any other: ``--engine ddtree_conformance.testing.mutants:FlatPositions``.
"""

from __future__ import annotations

import dataclasses

import torch

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.spec import (
    SamplingParams,
    compact_dynamic_cache,
    compile_tree,
    emit_tokens,
    select_feedback_rows,
    walk_tree,
)
from ddtree_conformance.spec.tree import DraftTree

__all__ = ["MUTANTS"]


def _flat_positions(tree, root, start, prefix_len=None, dtype=torch.float32):
    verify = compile_tree(tree, root, start, prefix_len, dtype)
    flat = start + torch.arange(verify.input_ids.shape[0], device=verify.input_ids.device)
    return dataclasses.replace(verify, position_ids=flat)


class FlatPositions(ReferenceEngine):
    """Bug 1: node positions from the flattened index instead of start + depth."""

    name = "mutant-flat-positions"
    compile_step = staticmethod(_flat_positions)


def _causal_mask(tree, root, start, prefix_len=None, dtype=torch.float32):
    verify = compile_tree(tree, root, start, prefix_len, dtype)
    n = verify.input_ids.shape[0]
    causal = torch.tril(torch.ones((n, n), dtype=torch.bool))
    mask = verify.attention_mask.clone()
    block = mask[0, 0, :, -n:]
    block.zero_()
    block.masked_fill_(~causal, torch.finfo(dtype).min)
    return dataclasses.replace(verify, attention_mask=mask, visibility=causal)


class SiblingMask(ReferenceEngine):
    """Bug 2: a causal mask over the flattened tree, so siblings and cousins see each other."""

    name = "mutant-sibling-mask"
    compile_step = staticmethod(_causal_mask)


class FirstRowsCompaction(ReferenceEngine):
    """Bug 3: KV compaction keeps the first |acc| rows instead of the accepted path's rows."""

    name = "mutant-first-rows-kv"
    compact_step = staticmethod(
        lambda cache, prefix_len, accepted: compact_dynamic_cache(cache, prefix_len, list(range(1, len(accepted) + 1)))
    )


class FirstRowsFeedback(ReferenceEngine):
    """Bug 4: drafter feedback takes the first |acc| hidden-state rows, not the accepted nodes."""

    name = "mutant-first-rows-feedback"
    feedback_step = staticmethod(
        lambda hidden, accepted: select_feedback_rows(hidden, list(range(1, len(accepted) + 1)))
    )


class NonZeroTreeSize(ReferenceEngine):
    """Bug 5a: tree size inferred from "token id != 0", so trees lose nodes when token 0 is drafted."""

    name = "mutant-nonzero-tree-size"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        build = self._build

        def truncated(logits, budget):
            tree = build(logits, budget)
            size = int((tree.tokens[1:] != 0).sum()) + 1
            return DraftTree(*(getattr(tree, f)[:size] for f in ("tokens", "depths", "parents", "ranks", "scores")))

        self._build = truncated


class MaskIdDropped(ReferenceEngine):
    """Bug 5b: output filtered by "token != mask id"."""

    name = "mutant-mask-id-dropped"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from ddtree_conformance.adapters.reference.dflash import DFlashConfig

        mask_id = DFlashConfig.from_dir(self.drafter_dir).mask_token_id

        def emit(tokens, stops, room):
            return emit_tokens([t for t in tokens if t != mask_id], stops, room)

        self.emit_step = emit


class TopKTopPIgnored(ReferenceEngine):
    """Bug 7: the request's top-k/top-p not applied to the target logits at tree nodes."""

    name = "mutant-top-k-top-p-ignored"
    walk_step = staticmethod(
        lambda tree, logits, params, generator: walk_tree(
            tree, logits, SamplingParams(temperature=params.temperature), generator
        )
    )


MUTANTS = {
    "flat-positions (bug 1)": FlatPositions,
    "sibling-mask (bug 2)": SiblingMask,
    "first-rows-kv (bug 3)": FirstRowsCompaction,
    "first-rows-feedback (bug 4)": FirstRowsFeedback,
    "nonzero-tree-size (bug 5)": NonZeroTreeSize,
    "mask-id-dropped (bug 5)": MaskIdDropped,
    "top-k-top-p-ignored (bug 7)": TopKTopPIgnored,
}
