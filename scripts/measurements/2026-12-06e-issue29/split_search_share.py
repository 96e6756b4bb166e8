"""How often the beams' split threshold search (adapters/reference/beam_kernel.py, SPLIT_SEARCH) needs its second
half: a replay in numpy of the kernel's decision at every depth of bf16-rounded drafter-shaped blocks (randn * 3,
15 x 151936), seeds 0-2, B = 16 / 32 / 64. The low halves are searched where the keys sharing the threshold's top
32 bits number more than are still wanted and are not all equal.

    python scripts/measurements/2026-12-06e-issue29/split_search_share.py
"""

import numpy as np
import torch

from ddtree_conformance.adapters.reference import device_tree
from ddtree_conformance.spec.tree import per_depth_topk


def keys(scores: torch.Tensor) -> np.ndarray:
    bits = scores.view(torch.int64).numpy()
    return np.where(bits >= 0, bits ^ np.int64(-(2**63)), ~bits).view(np.uint64)


depths = searched = 0
for seed in range(3):
    logits = (torch.randn(15, 151936, generator=torch.Generator().manual_seed(seed)) * 3).to(torch.bfloat16).float()
    for budget in (16, 32, 64):
        lp, _ = per_depth_topk(logits, budget)
        beam_scores, _, _ = device_tree.beams_with_tensors(lp, budget)
        for d in range(1, lp.shape[0]):
            key = keys((beam_scores[d - 1][:, None] + lp[d][None, :]).reshape(-1) + 0.0)
            kept = min(budget, key.size)
            threshold = np.sort(key)[::-1][kept - 1]
            high, top = key >> np.uint64(32), threshold >> np.uint64(32)
            same = high == top
            wanted = kept - int((high > top).sum())
            low = key[same] & np.uint64(0xFFFFFFFF)
            depths += 1
            searched += int(same.sum() > wanted and low.max() > low.min())
print(f"{searched} of {depths} depths search the low halves")
