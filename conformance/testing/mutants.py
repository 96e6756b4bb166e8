"""Deliberately broken reference engines: one per bug class of algorithm doc §6, and one per
low-precision, envelope and batch failure (issue 13).

Each replaces exactly one spec step of :class:`ddtree_conformance.adapters.reference.engine.ReferenceEngine`. The
suite must fail every one of them with a message naming the symptom (tests/test_mutants.py).
They are engines like any other: ``--engine ddtree_conformance.testing.mutants:FlatPositions``.
"""

from __future__ import annotations

import dataclasses

import torch

from ddtree_conformance.adapters.reference.dflash import DFlashConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.calibration import load_calibration
from ddtree_conformance.spec import (
    SamplingParams,
    choose_token,
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
    mask = verify.attention_mask.clone()
    causal = torch.tril(torch.ones((n, n), dtype=torch.bool, device=mask.device))
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


class GreedyVerifyAtT(ReferenceEngine):
    """Bug 7 as vLLM PR #42910 ships it: tree nodes verified by the target's argmax whatever the request's
    temperature (the prefill's token is still sampled)."""

    name = "mutant-greedy-verify-at-t"
    walk_step = staticmethod(
        lambda tree, logits, params, generator: walk_tree(tree, logits, SamplingParams(), generator)
    )


class TemperatureIgnored(ReferenceEngine):
    """The request's temperature not applied at tree nodes (sampled at T=1; top-k/top-p kept)."""

    name = "mutant-temperature-ignored"
    walk_step = staticmethod(
        lambda tree, logits, params, generator: walk_tree(
            tree,
            logits,
            SamplingParams(temperature=1.0 if params.temperature > 0 else 0.0, top_k=params.top_k, top_p=params.top_p),
            generator,
        )
    )


class DrafterPositionsOffByOne(ReferenceEngine):
    """Drafter block positions one past where the context puts them: lossless, acceptance collapses."""

    name = "mutant-drafter-positions-off-by-one"
    block_position_offset = 1


def _bf16_bound(model_dir: str) -> float:
    return load_calibration(model_dir, "bfloat16").bound


def runner_up_lifted(logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """``logits`` (rows of next-token logits) with the runner-up lifted above the top-1 in every row
    whose top-2 gap is below ``threshold``."""
    logits = logits.float().clone()
    rows2d = logits if logits.dim() == 2 else logits.unsqueeze(0)
    top = torch.topk(rows2d, 2, dim=-1)
    rows = torch.nonzero((top.values[:, 0] - top.values[:, 1]) < threshold).flatten()
    rows2d[rows, top.indices[rows, 1]] = top.values[rows, 0] + 1.0  # the runner-up now leads
    return logits


def _runner_up_walk(threshold: float):
    """The spec's walk, fed target logits whose runner-up is lifted above the top-1 wherever their gap
    is below ``threshold``: a greedy walk that takes the runner-up there."""

    def walk(tree, logits, params, generator):
        if params.greedy:
            logits = runner_up_lifted(logits, threshold)
        return walk_tree(tree, logits, params, generator)

    return walk


def runner_up_choice(threshold: float):
    """The spec's token choice (after the prefill, and each plain step) taking the runner-up at greedy
    near ties below ``threshold``."""

    def choose(logits, params, generator):
        return choose_token(runner_up_lifted(logits, threshold) if params.greedy else logits, params, generator)

    return choose


class RunnerUpBelowTwiceBound(ReferenceEngine):
    """Takes the target's runner-up wherever its top-2 gap is below twice the pair's bf16 near-tie
    bound (a fixed threshold, so it is wrong in every dtype)."""

    name = "mutant-runner-up-below-twice-bound"
    factor = 2.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.walk_step = _runner_up_walk(self.factor * _bf16_bound(self.model_dir))


class RunnerUpWithinBound(RunnerUpBelowTwiceBound):
    """Takes the runner-up wherever the top-2 gap is within the bf16 bound: every token it emits is
    within the bound, so in bf16 only the excused-position ceiling can catch it."""

    name = "mutant-runner-up-within-bound"
    factor = 1.0


class AcceptanceOverReported(ReferenceEngine):
    """Reports every round's acceptance length one higher than achieved."""

    name = "mutant-acceptance-over-reported"

    def _speculative(self, pair, request, config):
        result = super()._speculative(pair, request, config)
        return result.model_copy(update={"acceptance_lengths": [n + 1 for n in result.acceptance_lengths]})


class BudgetCappedAbove128(ReferenceEngine):
    """Trees of budgets above 128 keep only 128 nodes (a fixed-size node buffer): lossless, slower."""

    name = "mutant-budget-capped-above-128"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        build = self._build
        self._build = lambda logits, budget: build(logits, min(budget, 128))


class CompactionPast512(ReferenceEngine):
    """KV compaction keeps the first rows instead of the accepted path's once the context passes 512."""

    name = "mutant-compaction-past-512"
    compact_step = staticmethod(
        lambda cache, prefix_len, accepted: compact_dynamic_cache(
            cache, prefix_len, accepted if prefix_len <= 512 else list(range(1, len(accepted) + 1))
        )
    )


class BatchSettingsMixedUp(ReferenceEngine):
    """Each request of a batch runs with the next request's sampling parameters (a per-request
    sampling table read one slot off); batches of alike requests hide it. Lengths and stop tokens stay
    right, so the result is well-formed and only comparing each request with its solo run finds it."""

    name = "mutant-batch-settings-mixed-up"

    def generate_local(self, requests, config):
        settings = ("temperature", "top_p", "top_k", "seed")
        mixed = [
            r.model_copy(update={k: getattr(requests[(i + 1) % len(requests)], k) for k in settings})
            for i, r in enumerate(requests)
        ]
        return super().generate_local(mixed, config)


class SampledSettingsRotated(ReferenceEngine):
    """Each *sampled* request of a batch runs with the next sampled request's temperature, top-k and
    top-p (greedy requests untouched). Samples may depend on the batch in a correct engine too, so
    only the support of each request's own top-k/top-p gives this away."""

    name = "mutant-sampled-settings-rotated"

    def generate_local(self, requests, config):
        settings = ("temperature", "top_p", "top_k")
        sampled = [i for i, r in enumerate(requests) if r.temperature > 0]
        mixed = list(requests)
        for j, i in enumerate(sampled):
            source = requests[sampled[(j + 1) % len(sampled)]]
            mixed[i] = requests[i].model_copy(update={k: getattr(source, k) for k in settings})
        return super().generate_local(mixed, config)


MUTANTS = {
    "flat-positions (bug 1)": FlatPositions,
    "sibling-mask (bug 2)": SiblingMask,
    "first-rows-kv (bug 3)": FirstRowsCompaction,
    "first-rows-feedback (bug 4)": FirstRowsFeedback,
    "nonzero-tree-size (bug 5)": NonZeroTreeSize,
    "mask-id-dropped (bug 5)": MaskIdDropped,
    "top-k-top-p-ignored (bug 7)": TopKTopPIgnored,
    "greedy-verify-at-t (bug 7)": GreedyVerifyAtT,
    "temperature-ignored (bug 7)": TemperatureIgnored,
    "drafter-positions-off-by-one": DrafterPositionsOffByOne,
    "runner-up-below-twice-bound": RunnerUpBelowTwiceBound,
    "runner-up-within-bound": RunnerUpWithinBound,
    "acceptance-over-reported": AcceptanceOverReported,
    "budget-capped-above-128": BudgetCappedAbove128,
    "compaction-past-512": CompactionPast512,
    "batch-settings-mixed-up": BatchSettingsMixedUp,
    "sampled-settings-rotated": SampledSettingsRotated,
}
