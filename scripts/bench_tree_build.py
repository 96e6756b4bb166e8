#!/usr/bin/env python3
"""Issue 29, item 4: one round's tree build, the spec's heap (host, after the drafter's top-k is copied
back) against the fast path's tensor-only build (adapters/reference/device_tree.py), per budget.

    python scripts/bench_tree_build.py [--device cuda] [--vocab 151936] [--block 16] [--repeats 50]

Drafter-shaped logits (block - 1 positions over the vocabulary, bf16-rounded), each build timed end to
end (CUDA: synchronised, the heap including its copy to the host). Prints one row per budget: the
median milliseconds of each and whether the trees are equal. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddtree_conformance.adapters.reference.device_tree import build_tree_on_device
from ddtree_conformance.spec import build_tree


def _time(fn, device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(args.block - 1, args.vocab, generator=g) * 3).to(torch.bfloat16).to(args.device)
    print(f"device {args.device}, logits {tuple(logits.shape)} bf16, median of {args.repeats}")
    print("| B | heap ms (host) | tensor build ms | equal |")
    print("|---:|---:|---:|---|")
    for budget in (int(b) for b in args.budgets.split(",")):
        heap = _time(lambda: build_tree(logits, budget), args.device, args.repeats)
        dev = _time(lambda: build_tree_on_device(logits, budget), args.device, args.repeats)
        equal = build_tree(logits, budget).same_as(build_tree_on_device(logits, budget))
        print(f"| {budget} | {heap:.2f} | {dev:.2f} | {equal} |", flush=True)


if __name__ == "__main__":
    main()
