"""Held-out prompts: drawn at run time from the pair's own distribution, so no engine can know them.

A bundled prompt set is public and fixed: an engine could recognise its prompts and behave only on
them. Each run therefore adds prompts nobody has seen. Prompt ``i`` of a run starts with the first
few tokens of a bundled prompt (chosen by the run's seed, so it opens the way the pair's prompts
open: a chat turn, code, a record) and continues with tokens *sampled from the fp32 target itself*
at temperature 1, to a length drawn from the bundled prompts' own lengths. The target's samples are
the pair's own distribution whatever its training corpus was, and the same recipe works for every
pair, with a tokenizer or without one.

Everything is drawn from the run's seed (:func:`held_out_prompts`), which the report records with
the prompts, so a failing run can be repeated exactly (``--run-seed``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from .prompts import Prompt

__all__ = ["HELD_OUT_CATEGORY", "held_out_prompts"]

HELD_OUT_CATEGORY = "held-out"
OPENING_TOKENS = (1, 8)  # a held-out prompt opens with 1..8 tokens of a bundled prompt


def held_out_prompts(
    logits_fn, bundled: Sequence[Prompt], count: int, seed: int, max_length: int | None = None
) -> list[Prompt]:
    """``count`` prompts drawn from the target (``logits_fn``: token ids -> ``[T, V]`` logits) as the
    module doc says; ids ``held-out-<seed>-<i>``. ``max_length`` caps a prompt's length (the context
    left after the run's new tokens)."""
    if count <= 0 or not bundled:
        return []
    rng = random.Random(seed)
    lengths = sorted(len(p.prompt_ids) for p in bundled)
    out = []
    for i in range(count):
        source = rng.choice(list(bundled)).prompt_ids
        length = rng.choice(lengths)
        if max_length is not None:
            length = min(length, max_length)
        opening = min(rng.randint(*OPENING_TOKENS), len(source), length)
        ids = list(source[:opening])
        generator = torch.Generator().manual_seed(rng.getrandbits(63))
        while len(ids) < length:
            logits = logits_fn(ids)[-1].float().cpu()
            ids.append(int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)))
        out.append(
            Prompt(
                id=f"held-out-{seed}-{i}",
                category=HELD_OUT_CATEGORY,
                prompt_ids=ids,
                meta={"seed": seed, "opening": opening},
            )
        )
    return out
