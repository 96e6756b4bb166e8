"""Re-scoring sequences with the target model (teacher forcing), independent of any engine.

Used by the near-tie rule (doc §7: re-score the shared prefix, measure the top-1/top-2 gap at
the first divergence) and by the branch-vs-chain check (a node's token must equal the target's
choice after its ancestor path run as a plain chain).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ddtree_conformance.spec import top2_margin

__all__ = ["TargetScorer"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TargetScorer:
    """A transformers target run causally on whole sequences."""

    def __init__(self, model_dir: str, dtype: str = "float32", device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = (
            AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=_DTYPES[dtype], attn_implementation="sdpa")
            .to(self.device)
            .eval()
        )

    @torch.inference_mode()
    def logits(self, sequence: list[int]) -> torch.Tensor:
        """Causal logits ``[T, V]`` (float32) for every position of ``sequence``."""
        ids = torch.tensor([sequence], dtype=torch.long, device=self.device)
        return self.model(input_ids=ids).logits[0].float()

    def greedy_choices(self, sequence: list[int]) -> list[int]:
        """The target's argmax after each prefix of ``sequence``."""
        return torch.argmax(self.logits(sequence), dim=-1).tolist()

    def gaps(self, prompt: list[int], output: list[int]) -> list[float]:
        """Top-1 minus top-2 logit at each output position, teacher-forced on ``prompt + output``.

        Entry i is the gap of the distribution that chose ``output[i]``.
        """
        if not output:
            return []
        logits = self.logits(list(prompt) + list(output[:-1]))
        return top2_margin(logits[len(prompt) - 1 :]).tolist()


@lru_cache(maxsize=4)
def shared_scorer(model_dir: str, dtype: str = "float32", device: str = "cpu") -> TargetScorer:
    """One scorer per (model, dtype, device) per process."""
    return TargetScorer(model_dir, dtype, device)
