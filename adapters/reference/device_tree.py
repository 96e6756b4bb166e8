"""The spec's DDTree built with tensor operations only, for the fast path (issue 29, item 4).

:func:`ddtree_conformance.spec.build_tree` pops a heap in Python, one node at a time: on a GPU that
means copying the drafter's top-k to the host every round and building the tree there, between the
drafter's graph and the verify graph. :func:`build_tree_on_device` returns the same tree (every
field equal, ties included) from sorts, gathers and scatters on the logits' device, with no value read
back and a fixed number of kernels (about ten per depth), so that it can sit in a CUDA graph:

* **Beams.** The B most probable prefixes form a prefix-closed set (a child's score ``parent + lp`` is
  never above its parent's, and on a tie the parent comes first), and a prefix of depth d among them has
  fewer than B prefixes of depth d before it. So, depth by depth, the B best prefixes of depth d among the
  extensions of the B best of depth d - 1 (a beam of width B) hold every node of the tree at that depth:
  by induction from depth 1.
* **A beam is kept in lexicographic order** of its rank tuples. A child's index among its beam's
  extensions (parent's index times K plus the token's rank) is then its lexicographic key, so one stable
  sort by score (descending) puts the extensions in the spec's order (score, ties by the rank tuple),
  and a sort of the B kept indices puts the next beam in lexicographic order again
  (:func:`beams_with_tensors`). On a GPU with Triton, where B * K <= 4096, every depth's beam comes from
  one launch instead (:mod:`.beam_kernel`: the same beams, without the small kernels and the sorts), and
  where K <= 128 the per-depth top-K they start from comes from two launches (:mod:`.topk_kernel`: the
  spec's keys, without its 64-bit radix select).
* **The union in pop order.** The tree is the B best of all beams in the heap's pop order: score
  descending, ties by the rank tuple, a prefix before its extensions, i.e. ties by the prefixes'
  depth-first (pre-order) position in the trie the beams form. That position is counted, not sorted: a
  node at depth d and beam index i is preceded by its ancestors' beam indices plus one at every depth
  above it, the i nodes before it in its own beam, and every strict descendant of those i nodes. One
  stable sort by score over the nodes laid out in pre-order then gives the pop order. Where the beams came from one
  launch, ``ONE_LAUNCH_TREE`` takes the union, the numbering and the fields from one more (:mod:`.pop_order_kernel`:
  the same counts, a threshold instead of the sort).
* **Ancestors.** :func:`build_tree_with_ancestors` also returns each node's ancestors (node indices at
  depths 1..d, the node itself last), which the verify mask (:mod:`.device_verify`) and the greedy walk
  (:mod:`.device_walk`) read in a few kernels instead of following parent pointers one level at a time.
  :func:`ancestor_table` computes the same table from any tree's parent pointers.

``tests/test_device_tree.py`` holds it equal to the heap on drawn logits (many exact ties) on CPU; the
fast path uses it where the logits are on a GPU.
"""

from __future__ import annotations

import warnings

import torch

from ddtree_conformance.spec.tree import DraftTree, per_depth_topk

__all__ = ["ancestor_table", "beams_with_tensors", "build_tree_on_device", "build_tree_with_ancestors"]

# Whether a CUDA build takes its beams from one Triton launch (.beam_kernel) where it can (B * K <= 4096).
# Inside the round's graph on an H100 the launch builds the tree in 549 / 608 / 848 us at B = 16 / 32 / 64
# against 1181 / 1222 / 1392 us with tensors, and the round drops from 1.54 / 1.62 / 1.73 plain steps to
# 1.45 / 1.51 / 1.58 (scripts/bench_tree_graph.py, scripts/measurements/2026-12-06-issue29/).
ONE_LAUNCH_BEAMS = True
# Whether a CUDA build takes the per-depth top-K from two Triton launches (.topk_kernel) where K <= 128,
# instead of the spec's topk over int64 keys (the same result, bit for bit): 90 / 109 / 144 us against
# 254 / 274 / 282 at K = 16 / 32 / 64 in the graph, on a second H100; the tree build with both kernels 357 / 423 /
# 691 us (scripts/measurements/2026-12-06-issue29/README.md, "Second machine").
TWO_LAUNCH_TOPK = True
# Whether a CUDA build whose beams come from one launch also takes the union of the beams in pop order, the node
# numbers, fields and ancestors from one more (.pop_order_kernel) where L * B <= 4096 and B <= 128, instead of
# about fifty small kernels and a stable sort (the same tree bit for bit: tests/test_beam_kernel.py). On since
# timed (H100 4c817fff, 2026-12-06): with the split search 189 / 253 / 477 us a build against 365 / 427 / 695 at
# B = 16 / 32 / 64; with both switches on the round was faster in 8 of 9 alternating pairs (medians 0.28 / 0.17 /
# 0.12 ms at B = 16 / 32 / 64; one pair 0.01 ms slower; scripts/measurements/2026-12-06f-issue29/README.md);
# reproduced on a second newly started H100 (b5166029): 188 / 253 / 478 against 364 / 426 / 695 us (2026-12-06g).
ONE_LAUNCH_TREE = True


def build_tree_on_device(draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """:func:`~ddtree_conformance.spec.build_tree`'s tree (module doc), built on ``draft_logits``' device."""
    return build_tree_with_ancestors(draft_logits, budget)[0]


def build_tree_with_ancestors(draft_logits: torch.Tensor, budget: int) -> tuple[DraftTree, torch.Tensor]:
    """``(tree, ancestors)``: :func:`build_tree_on_device`'s tree and its :func:`ancestor_table` with one
    column per drafted position (module doc)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if draft_logits.dim() != 2 or draft_logits.shape[0] < 1 or draft_logits.shape[1] < 1:
        raise ValueError(f"draft_logits must be a non-empty [L, V] tensor, got {tuple(draft_logits.shape)}")
    depth_limit, vocab = draft_logits.shape
    k = min(budget, vocab)
    lp, ids = _top_k(draft_logits, k)  # float64 [L, k], int64 [L, k]
    made = _tree_in_two_launches(lp, ids, budget)
    if made is not None:
        (tokens, depths, parents, ranks, scores), ancestors = made
        return DraftTree(tokens=tokens, depths=depths, parents=parents, ranks=ranks, scores=scores), ancestors
    device = draft_logits.device
    long = torch.long

    # the beams, each in lexicographic order: scores, token ranks, and the beam indices of every
    # node's ancestors at depths 1..d (itself last), padded to depth_limit columns with -1
    beam_scores, beam_ranks, paths = _beams(lp, budget)

    # every beam node, depth by depth
    widths = [p.shape[0] for p in paths]
    total = sum(widths)
    padded = torch.cat(paths)
    all_scores, all_ranks = torch.cat(beam_scores), torch.cat(beam_ranks)
    valid = padded >= 0
    depths = valid.sum(dim=1)  # [total], 1-based
    columns = torch.arange(depth_limit, device=device)
    own = (depths - 1).unsqueeze(1)

    # the pre-order position of every node (module doc)
    wide = max(widths)
    strict = valid & (columns.unsqueeze(0) < own)  # the node's strict ancestors
    slot = torch.where(strict, columns.unsqueeze(0) * wide + padded, depth_limit * wide)
    descendants = torch.zeros(depth_limit * wide + 1, dtype=long, device=device)
    descendants.scatter_add_(0, slot.reshape(-1), strict.reshape(-1).to(long))
    descendants = descendants[:-1].view(depth_limit, wide)
    before_in_beam = torch.cumsum(descendants, dim=1) - descendants  # descendants of the nodes before each
    index_in_beam = padded.gather(1, own).squeeze(1)
    preorder = (padded + 1).sum(dim=1) - 1 + before_in_beam.view(-1)[(depths - 1) * wide + index_in_beam]
    by_preorder = torch.empty_like(preorder).scatter_(0, preorder, torch.arange(total, device=device))
    chosen = by_preorder[torch.argsort(all_scores[by_preorder], descending=True, stable=True)][:budget]
    count = chosen.shape[0]

    # the chosen nodes as a tree: node index of every beam node (0 where not chosen), their fields
    per_depth = torch.zeros(depth_limit, dtype=long, device=device).scatter_add_(0, depths - 1, torch.ones_like(depths))
    first = torch.cumsum(per_depth, dim=0) - per_depth  # global index of each depth's first node
    node_of = torch.zeros(total, dtype=long, device=device).scatter_(
        0, chosen, torch.arange(1, count + 1, device=device)
    )
    global_ids = torch.where(valid, padded + first.unsqueeze(0), 0)
    ancestors = torch.where(valid, node_of[global_ids], -1)[chosen]  # [count, depth_limit]
    node_depths = depths[chosen]
    node_ranks = all_ranks[chosen]
    parents = torch.where(
        node_depths > 1, ancestors.gather(1, (node_depths - 2).clamp(min=0).unsqueeze(1)).squeeze(1), 0
    )
    tree = DraftTree(
        tokens=torch.cat([torch.full((1,), -1, dtype=long, device=device), ids[node_depths - 1, node_ranks]]),
        depths=torch.cat([torch.zeros(1, dtype=long, device=device), node_depths]),
        parents=torch.cat([torch.full((1,), -1, dtype=long, device=device), parents]),
        ranks=torch.cat([torch.full((1,), -1, dtype=long, device=device), node_ranks]),
        scores=torch.cat([torch.zeros(1, dtype=torch.float64, device=device), all_scores[chosen]]),
    )
    root_row = torch.full((1, depth_limit), -1, dtype=long, device=device)
    return tree, torch.cat([root_row, ancestors])


def _top_k(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`per_depth_topk` from two launches where they serve (``TWO_LAUNCH_TOPK``, a CUDA device, Triton,
    K <= 128), else from the spec's own."""
    if TWO_LAUNCH_TOPK and _on_a_gpu(draft_logits.device):
        from . import topk_kernel  # Triton is imported only where it can serve

        if topk_kernel.kernel_available(draft_logits.device, k):
            served = _launch("TWO_LAUNCH_TOPK", "per-depth top-K", topk_kernel.topk_in_two_launches, draft_logits, k)
            if served is not None:
                return served
    return per_depth_topk(draft_logits, k)


def _tree_in_two_launches(lp: torch.Tensor, ids: torch.Tensor, budget: int):
    """The tree's fields and ancestors from the beams' launch and the pop order's (:mod:`.pop_order_kernel`) where
    both serve (``ONE_LAUNCH_BEAMS`` and ``ONE_LAUNCH_TREE``, a CUDA device, Triton, B * K <= 4096, L * B <= 4096),
    else None (the tensors take the union)."""
    if not (ONE_LAUNCH_TREE and ONE_LAUNCH_BEAMS and _on_a_gpu(lp.device)):
        return None
    from . import beam_kernel, pop_order_kernel  # Triton is imported only where it can serve

    depth_limit, k = lp.shape
    if not beam_kernel.kernel_available(lp.device, budget, k):
        return None
    if not pop_order_kernel.kernel_available(lp.device, depth_limit, budget):
        return None
    slots = _launch("ONE_LAUNCH_BEAMS", "one-launch beams", beam_kernel.beam_slots_in_one_launch, lp, budget)
    if slots is None:
        return None
    return _launch("ONE_LAUNCH_TREE", "one-launch pop order", pop_order_kernel.tree_in_one_launch, *slots, ids, budget)


def _beams(lp: torch.Tensor, budget: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The beams from one launch where it serves (``ONE_LAUNCH_BEAMS``, a CUDA device, Triton, B * K <= 4096),
    else with tensors."""
    if ONE_LAUNCH_BEAMS and _on_a_gpu(lp.device):
        from . import beam_kernel  # Triton is imported only where it can serve: the CPU's processes never pay it

        if beam_kernel.kernel_available(lp.device, budget, lp.shape[1]):
            served = _launch("ONE_LAUNCH_BEAMS", "one-launch beams", beam_kernel.beams_in_one_launch, lp, budget)
            if served is not None:
                return served
    return beams_with_tensors(lp, budget)


def _launch(switch: str, what: str, kernel, *args):
    """``kernel(*args)``, or None where it fails (a Triton that cannot compile for this GPU): the failure is said
    once, as a warning, and ``switch`` (this module's flag for the kernel) is turned off, so the tensor version
    serves the rest of the process."""
    try:
        return kernel(*args)
    except Exception as error:  # Triton's compile and launch errors have no common base class
        globals()[switch] = False
        warnings.warn(
            f"the tree's {what} failed ({type(error).__name__}: {str(error)[:200]}); "
            "the tensor version serves from now on",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _on_a_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def beams_in_one_launch_serve(device: torch.device, budget: int, vocab: int) -> bool:
    """Whether a build of ``budget`` nodes over ``vocab`` tokens on ``device`` takes its beams from one launch
    (``ONE_LAUNCH_BEAMS``, a CUDA device, Triton, B * K <= 4096): where the round as one graph is the
    faster path (the reference engine's ``device_tree=auto``)."""
    if not (ONE_LAUNCH_BEAMS and _on_a_gpu(torch.device(device))):
        return False
    from . import beam_kernel

    return beam_kernel.kernel_available(torch.device(device), budget, min(budget, vocab))


def beams_with_tensors(
    lp: torch.Tensor, budget: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """``(scores, ranks, paths)`` per depth: each depth's beam (module doc) from ``lp``, the per-depth top-K
    log-probs (float64 ``[L, K]``), in lexicographic order; ``paths[d]`` ``[width, L]`` the beam indices of
    every node's ancestors at depths 0..d (itself last), then -1. About ten kernels a depth;
    :func:`.beam_kernel.beams_in_one_launch` gives the same in one."""
    depth_limit, k = lp.shape
    device, long = lp.device, torch.long
    width = min(budget, k)
    counting = torch.arange(budget, device=device)
    scores = lp[0, :width]
    path = torch.full((width, depth_limit), -1, dtype=long, device=device)
    path[:, 0] = counting[:width]
    beam_scores, beam_ranks, paths = [scores], [counting[:width]], [path]
    for d in range(1, depth_limit):
        n = scores.shape[0]
        extensions = (scores.unsqueeze(1) + lp[d].unsqueeze(0)).reshape(-1)  # parent + lp, as the heap adds
        kept = min(budget, n * k)
        keep = torch.sort(torch.argsort(extensions, descending=True, stable=True)[:kept]).values
        scores = extensions[keep]
        path = path[torch.div(keep, k, rounding_mode="floor")]
        path[:, d] = counting[:kept]
        beam_scores.append(scores)
        beam_ranks.append(torch.remainder(keep, k))
        paths.append(path)
    return beam_scores, beam_ranks, paths


def ancestor_table(tree: DraftTree, columns: int) -> torch.Tensor:
    """``[N+1, columns]``: row i holds node i's ancestors at depths 1..depth(i), the node itself last,
    then -1 (the root's row is all -1); ``columns`` at least the tree's depth. ``columns`` parent steps,
    no value read back."""
    nodes = tree.tokens.shape[0]
    device = tree.tokens.device
    table = torch.full((nodes, columns + 1), -1, dtype=torch.long, device=device)
    current = torch.arange(nodes, device=device)
    for _ in range(columns):
        alive = current > 0
        safe = current.clamp(min=0)
        column = torch.where(alive, tree.depths[safe] - 1, columns)
        table.scatter_(1, column.unsqueeze(1), torch.where(alive, current, -1).unsqueeze(1))
        current = torch.where(alive, tree.parents[safe], current)
    return table[:, :columns]
