#!/usr/bin/env python3
"""Issue 29, item 4: the device tree build (adapters/reference/device_tree.py) as the round's graph runs
it, captured in a CUDA graph and replayed, with the beams built three ways: with tensors, a beam's
selection by a stable sort and a sort of the kept indices (as before 2026-12-06); with tensors, the
selection by a threshold (``keep_best``); and in one Triton launch (adapters/reference/beam_kernel.py).

    python scripts/bench_tree_graph.py [--vocab 151936] [--block 16] [--budgets 16,32,64] [--replays 300]

Drafter-shaped logits (block - 1 positions, bf16-rounded) on CUDA. Per budget and way: the median of five
timings of ``--replays`` back-to-back replays (CUDA events), in microseconds per build, and whether the two
ways give the same tree and ancestor table. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from ddtree_conformance.adapters.reference import device_tree


def by_sorting(values: torch.Tensor, kept: int) -> torch.Tensor:
    return torch.sort(torch.argsort(values, descending=True, stable=True)[:kept]).values


def _graph_time(draft: torch.Tensor, budget: int, replays: int) -> tuple[float, list[torch.Tensor]]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            device_tree.build_tree_with_ancestors(draft, budget)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = device_tree.build_tree_with_ancestors(draft, budget)
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    tree, table = out
    fields = [getattr(tree, n).clone() for n in ("tokens", "depths", "parents", "ranks", "scores")]
    return statistics.median(samples), [*fields, table.clone()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--budgets", default="16,32,64,128")
    p.add_argument("--replays", type=int, default=300)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    draft = (torch.randn(args.block - 1, args.vocab, generator=g) * 3).to(torch.bfloat16).cuda()
    threshold = device_tree.keep_best
    print(f"{torch.cuda.get_device_name(0)}, drafter logits {tuple(draft.shape)} bf16, graph replay, us per build")
    print("| B | stable sort + index sort | threshold (keep_best) | saved | same tree |")
    print("|---:|---:|---:|---:|---|")
    for budget in (int(b) for b in args.budgets.split(",")):
        device_tree.keep_best = by_sorting
        sorted_us, a = _graph_time(draft, budget, args.replays)
        device_tree.keep_best = threshold
        threshold_us, b = _graph_time(draft, budget, args.replays)
        same = all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        print(
            f"| {budget} | {sorted_us:.1f} | {threshold_us:.1f} | {sorted_us - threshold_us:.1f} | {same} |", flush=True
        )


if __name__ == "__main__":
    main()
