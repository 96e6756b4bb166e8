#!/usr/bin/env python3
"""Issue 29, item 4: the device tree build (adapters/reference/device_tree.py) as the round's graph runs
it, captured in a CUDA graph and replayed, with the beams built two ways: with tensors (a beam's selection
by a stable sort and a sort of the kept indices, about ten kernels a depth) and in one Triton launch
(adapters/reference/beam_kernel.py); and the per-depth top-K over the vocabulary that both start from.
(2026-12-06 it also timed a third way, the selection with tensors by a threshold instead of the sorts:
slower than the sorts at every budget, 1267 / 1600 / 2054 us at B = 16 / 32 / 64, and removed.)

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
from ddtree_conformance.spec.tree import per_depth_topk


def _build(draft: torch.Tensor, budget: int):
    return device_tree.build_tree_with_ancestors(draft, budget)


def _graph_time(draft: torch.Tensor, budget: int, replays: int, fn=_build) -> tuple[float, list[torch.Tensor]]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(draft, budget)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(draft, budget)
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
    if fn is not _build:
        return statistics.median(samples), []
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
    if not torch.cuda.is_available():
        raise SystemExit("bench_tree_graph: needs a CUDA device (none found): it times CUDA graph replays")
    g = torch.Generator().manual_seed(0)
    draft = (torch.randn(args.block - 1, args.vocab, generator=g) * 3).to(torch.bfloat16).cuda()
    ways = {"tensors (sorts)": False, "one Triton launch": True}  # whether the beams come from one launch
    print(f"{torch.cuda.get_device_name(0)}, drafter logits {tuple(draft.shape)} bf16, graph replay, us per build")
    print("| B | per-depth top-K alone | " + " | ".join(ways) + " | same tree |")
    print("|---:|---:|" + "---:|" * len(ways) + "---|")
    for budget in (int(b) for b in args.budgets.split(",")):
        topk_us, _ = _graph_time(draft, budget, args.replays, lambda d, b: per_depth_topk(d, min(b, d.shape[1])))
        times, outputs = [], []
        for kernel in ways.values():
            device_tree.ONE_LAUNCH_BEAMS = kernel
            try:
                us, out = _graph_time(draft, budget, args.replays)
                if kernel and not device_tree.ONE_LAUNCH_BEAMS:  # the launch failed and the tensors stood in
                    raise RuntimeError("the one-launch beams failed (see the warning above)")
            except Exception as error:  # a way that fails is a row's finding, not the end of the table
                print(f"B={budget}: {type(error).__name__}: {str(error)[:300]}", flush=True)
                us, out = float("nan"), None
            times.append(us)
            outputs.append(out)
        same = all(
            o is not None and all(torch.equal(x, y) for x, y in zip(outputs[0], o, strict=True)) for o in outputs[1:]
        )
        print(f"| {budget} | {topk_us:.1f} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |", flush=True)


if __name__ == "__main__":
    main()
