#!/usr/bin/env python3
"""Issue 29, item 4: a round's host-side pieces, as the fast path runs them now and with tensor
operations only, per budget: the tree build (the spec's heap after the drafter's top-k is read back,
against adapters/reference/device_tree.py), the verify inputs (compile_tree against device_verify.py,
root token on the device) and the greedy walk over the verify logits (walk_tree against device_walk.py).

    python scripts/bench_round_pieces.py [--device cuda] [--vocab 151936] [--block 16] [--repeats 50]

Drafter-shaped logits (block - 1 positions over the vocabulary, bf16-rounded) and target logits for the
tree's rows; each piece timed end to end, synchronised on CUDA (the host path with its reads back).
Prints one row per budget: median milliseconds of the host pieces and of the tensor-only pieces, and
whether the trees, inputs and walks are equal. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddtree_conformance.adapters.reference.device_tree import build_tree_on_device
from ddtree_conformance.adapters.reference.device_verify import verify_inputs_on_device
from ddtree_conformance.adapters.reference.device_walk import greedy_walk_on_device
from ddtree_conformance.spec import build_tree, compile_tree, walk_tree


def _time(fn, cuda: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
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
    cuda = args.device.startswith("cuda")
    g = torch.Generator().manual_seed(0)
    draft = (torch.randn(args.block - 1, args.vocab, generator=g) * 3).to(torch.bfloat16).to(args.device)
    depth, start, root = args.block - 1, 500, 7
    print(f"device {args.device}, drafter logits {tuple(draft.shape)} bf16, median of {args.repeats} (ms)")
    print("| B | build: heap | build: tensors | inputs: spec | inputs: tensors | walk: spec | walk: tensors | equal |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for budget in (int(b) for b in args.budgets.split(",")):
        tree = build_tree(draft, budget)
        target = torch.randn(tree.num_nodes + 1, args.vocab, generator=g).to(torch.bfloat16).to(args.device)
        for node, parent in enumerate(tree.parents.tolist()):  # the target follows the tree often
            if parent >= 0 and node % 3:
                target[parent, int(tree.tokens[node])] = 10.0
        on_device = build_tree_on_device(draft, budget)
        root_t = torch.tensor(root, device=args.device)
        want_in, got_in = (
            compile_tree(tree, root, start),
            verify_inputs_on_device(on_device, root_t, start, None, torch.float32, depth),
        )
        want_walk = walk_tree(tree, target)
        path, accepted, bonus = greedy_walk_on_device(on_device, target, depth)
        equal = (
            tree.same_as(on_device)
            and all(
                torch.equal(getattr(want_in, n).cpu(), getattr(got_in, n).cpu())
                for n in ("input_ids", "position_ids", "attention_mask")
            )
            and path.tolist()[: int(accepted)] == want_walk.accepted
            and int(bonus) == want_walk.bonus
        )
        cells = [
            _time(lambda: build_tree(draft, budget), cuda, args.repeats),
            _time(lambda: build_tree_on_device(draft, budget), cuda, args.repeats),
            _time(lambda: compile_tree(tree, root, start), cuda, args.repeats),
            _time(
                lambda: verify_inputs_on_device(on_device, root_t, start, None, torch.float32, depth),
                cuda,
                args.repeats,
            ),
            _time(lambda: walk_tree(tree, target), cuda, args.repeats),
            _time(lambda: greedy_walk_on_device(on_device, target, depth), cuda, args.repeats),
        ]
        print(f"| {budget} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {equal} |", flush=True)


if __name__ == "__main__":
    main()
