"""Stress the tree's Triton kernels through Triton's interpreter on CPU for SECONDS: drawn blocks (bf16-rounded
randn logits at several scales, up to 15 x 60; or a few tied values, -inf and zeros), B up to 64, each built with
the whole and the split threshold search and, at random, the pop order in one launch; every tree and ancestor table
against the heap's. The CPU is taken for a GPU so the kernels serve; the top-K stays the spec's.

    TRITON_INTERPRET=1 python scripts/measurements/2026-12-06e-issue29/stress_tree_kernels.py SECONDS SEED
"""

import random
import sys
import time
import warnings

import torch

from ddtree_conformance.adapters.reference import beam_kernel, device_tree, pop_order_kernel
from ddtree_conformance.spec import build_tree

device_tree._on_a_gpu = lambda device: True
beam_kernel.kernel_available = lambda device, budget, k: budget * k <= 4096
pop_order_kernel.kernel_available = lambda device, depth, budget: depth * budget <= 4096 and budget <= 128
device_tree.TWO_LAUNCH_TOPK = False
rng = random.Random(int(sys.argv[2]))
bad = 0
n = 0
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    kind = rng.random()
    if kind < 0.5:
        depth, vocab, budget = rng.randint(1, 15), rng.randint(1, 60), rng.randint(1, 64)
        scale = rng.choice([0.5, 1, 3, 8])
        logits = (
            (torch.randn(depth, vocab, generator=torch.Generator().manual_seed(rng.randint(0, 10**6))) * scale)
            .to(torch.bfloat16)
            .float()
        )
    else:
        depth, vocab, budget = rng.randint(1, 8), rng.randint(1, 12), rng.randint(1, 64)
        pool = rng.choice(
            [[0.0, -1.0, 1.0, 0.5, 2.0, -3.0, float("-inf")], [0.0, 0.0, 1.0], [0.0, -30.0, float("-inf")]]
        )
        logits = torch.tensor([rng.choice(pool) for _ in range(depth * vocab)]).view(depth, vocab)
        if torch.isinf(logits).all(dim=1).any():
            continue
    if budget * min(budget, vocab) > 4096:
        continue
    want = build_tree(logits, budget)
    table_want = device_tree.ancestor_table(want, depth)
    for split in (False, True):
        beam_kernel.SPLIT_SEARCH = split
        device_tree.ONE_LAUNCH_TREE = rng.random() < 0.7
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got, table = device_tree.build_tree_with_ancestors(logits, budget)
        n += 1
        if not (want.same_as(got) and torch.equal(table_want, table)):
            bad += 1
            print("DIFF", split, device_tree.ONE_LAUNCH_TREE, depth, vocab, budget, logits.tolist())
            sys.exit(1)
print(n, "builds", bad, "differ")
