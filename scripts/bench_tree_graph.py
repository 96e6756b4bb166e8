#!/usr/bin/env python3
"""Issue 29, item 4: the device tree build (adapters/reference/device_tree.py) as the round's graph runs
it, captured in a CUDA graph and replayed, three ways: with tensors only (the spec's per-depth top-K over
int64 keys, then each beam's selection by a stable sort and a sort of the kept indices, about ten kernels a
depth); with the beams in one Triton launch (adapters/reference/beam_kernel.py); and with the top-K in two
Triton launches as well (adapters/reference/topk_kernel.py); and both kernels with the beams' threshold searched
over the keys' top halves first (``beam_kernel.SPLIT_SEARCH``); and with the union of the beams in pop order, the
nodes' fields and ancestors from one more launch (adapters/reference/pop_order_kernel.py,
``device_tree.ONE_LAUNCH_TREE``), with either search. The per-depth top-K is also timed alone, both ways
(the two launches at each ``--chunks`` size), and the one-launch beams at each ``--beam-warps``.
(2026-12-06 it also timed the selection with tensors by a threshold instead of the sorts: slower than the sorts
at every budget, 1267 / 1600 / 2054 us at B = 16 / 32 / 64, and removed.)

    python scripts/bench_tree_graph.py [--vocab 151936] [--block 16] [--budgets 16,32,64] [--replays 300]
                                       [--chunks 2048,4096,8192] [--beam-warps 4,8,16]

Drafter-shaped logits (block - 1 positions, bf16-rounded) on CUDA. Per budget and way: the median of five
timings of ``--replays`` back-to-back replays (CUDA events), in microseconds per build, and whether the ways
give the same tree and ancestor table (and the top-K ways the same top-K). A measurement, not a test.
"""

from __future__ import annotations

import argparse

import torch

from ddtree_conformance.adapters.reference import beam_kernel, device_tree, topk_kernel
from ddtree_conformance.adapters.reference.clock import graph_replay_us
from ddtree_conformance.spec.tree import per_depth_topk


def _build(draft: torch.Tensor, budget: int):
    return device_tree.build_tree_with_ancestors(draft, budget)


def _graph_time(draft: torch.Tensor, budget: int, replays: int, fn=_build) -> tuple[float, list[torch.Tensor]]:
    us, out = graph_replay_us(lambda: fn(draft, budget), replays)
    if fn is not _build:
        return us, []
    tree, table = out
    fields = [getattr(tree, n).clone() for n in ("tokens", "depths", "parents", "ranks", "scores")]
    return us, [*fields, table.clone()]


def _counts(text: str) -> list[int]:
    """A comma-separated list of positive integers (argparse's type: one clear error otherwise)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be 1 or more")
    return values


def _switches(beams: bool, topk: bool, split: bool = False, tree: bool = False) -> None:
    device_tree.ONE_LAUNCH_BEAMS, device_tree.TWO_LAUNCH_TOPK = beams, topk
    beam_kernel.SPLIT_SEARCH, device_tree.ONE_LAUNCH_TREE = split, tree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--budgets", type=_counts, default="16,32,64,128")
    p.add_argument("--replays", type=int, default=300)
    p.add_argument("--chunks", type=_counts, default=str(topk_kernel.CHUNK), help="the two-launch top-K's chunks")
    p.add_argument("--beam-warps", type=_counts, default="", help="the one-launch beams' warps (default: its rule)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_tree_graph: needs a CUDA device (none found): it times CUDA graph replays")
    g = torch.Generator().manual_seed(0)
    draft = (torch.randn(args.block - 1, args.vocab, generator=g) * 3).to(torch.bfloat16).cuda()
    chunks = args.chunks
    ways = {
        "tensors": (False, False, False, False),
        "beams in one launch": (True, False, False, False),
        "both kernels": (True, True, False, False),
        "both kernels, split search": (True, True, True, False),
        "pop order in one launch": (True, True, False, True),
        "pop order in one launch, split search": (True, True, True, True),
    }
    print(f"{torch.cuda.get_device_name(0)}, drafter logits {tuple(draft.shape)} bf16, graph replay, us per build")
    topk_heads = " | ".join(f"top-K: two launches, chunk {c}" for c in chunks)
    print(f"| B | top-K: spec | {topk_heads} | " + " | ".join(ways) + " | same tree | same top-K |")
    print("|---:|---:|" + "---:|" * (len(chunks) + len(ways)) + "---|---|")
    default_chunk, default_warps = topk_kernel.CHUNK, beam_kernel.warps
    for budget in args.budgets:
        k = min(budget, draft.shape[1])
        spec_us, _ = _graph_time(draft, budget, args.replays, lambda d, b: per_depth_topk(d, k))
        want, topk_us, same_topk = per_depth_topk(draft, k), [], True
        for chunk in chunks:
            topk_kernel.CHUNK = chunk
            try:
                two = lambda d, b: topk_kernel.topk_in_two_launches(d, k)  # noqa: E731
                topk_us.append(_graph_time(draft, budget, args.replays, two)[0])
                same_topk &= all(map(torch.equal, want, topk_kernel.topk_in_two_launches(draft, k)))
            except Exception as error:  # a way that fails is a row's finding, not the end of the table
                print(f"B={budget}, chunk {chunk}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                topk_us.append(float("nan"))
        topk_kernel.CHUNK = default_chunk
        times, outputs = [], []
        for switches in ways.values():
            _switches(*switches)
            try:
                us, out = _graph_time(draft, budget, args.replays)
                if switches[:2] + switches[3:] != (
                    device_tree.ONE_LAUNCH_BEAMS,
                    device_tree.TWO_LAUNCH_TOPK,
                    device_tree.ONE_LAUNCH_TREE,
                ):
                    raise RuntimeError("a kernel failed and the tensors stood in (see the warning above)")
            except Exception as error:
                print(f"B={budget}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                us, out = float("nan"), None
            times.append(us)
            outputs.append(out)
        same = all(
            o is not None and all(torch.equal(x, y) for x, y in zip(outputs[0], o, strict=True)) for o in outputs[1:]
        )
        cells = [spec_us, *topk_us, *times]
        print(f"| {budget} | " + " | ".join(f"{t:.1f}" for t in cells) + f" | {same} | {same_topk} |", flush=True)
        for warps in args.beam_warps:
            _switches(True, True)
            beam_kernel.warps = lambda block, w=warps: w
            try:
                us, out = _graph_time(draft, budget, args.replays)
                ok = all(torch.equal(x, y) for x, y in zip(outputs[0] or [], out, strict=True))
                print(f"B={budget}: both kernels, beams with {warps} warps: {us:.1f} us, same tree {ok}", flush=True)
            except Exception as error:
                print(f"B={budget}, {warps} warps: {type(error).__name__}: {str(error)[:300]}", flush=True)
            beam_kernel.warps = default_warps
    _switches(True, True)


if __name__ == "__main__":
    main()
