"""Broken engines that try to earn the noise model's excuses instead of failing (issue: excuses that
cannot be fabricated). Each is lossless, so lossless checks pass; each accepts more than DDTree at its
budget does and wants its extra acceptance read as low-precision noise.

* :class:`PeekingDrafter`: knows the target's greedy continuation (it decodes the request plainly
  first) and moves its drafter logits toward it, each by less than half the pair's calibrated drafter
  tolerance, so its trees hold paths the fp32 spec tree lacks. Everything it reports is real and
  consistent: its traces hold the spec tree of the logits it reports, verified and walked, and those
  logits lie within the tolerance of the fp32 reference's. Its longer rounds are therefore *confirmed*
  drafter near ties, one by one. What catches it is the aggregate: the tau test over every round whose
  tokens agree with the fp32 replay (:meth:`~ddtree_conformance.noise.NoiseModel.tau_test`) and the
  cap on confirmed rounds. :class:`PeekingDrafterBlackBox` reports outputs and lengths only: its
  rounds are unconfirmed, each direction against its cap.
"""

from __future__ import annotations

import torch

from ddtree_conformance.adapters.interface import RunConfig
from ddtree_conformance.calibration import load_calibration

from .rounding_engines import black_box
from .stepped import SteppedEngine

__all__ = ["EXCUSE_ADVERSARIES", "PeekingDrafter", "PeekingDrafterBlackBox", "PeekingWhereItGains"]


class PeekingDrafter(SteppedEngine):
    """Drafter logits moved toward the target's own continuation, within the tolerance (module doc)."""

    name = "adversary-peeking-drafter"
    nudge_share = 0.45  # of the calibrated drafter tolerance: with the engine's own low-precision shift, within it

    def _speculative(self, pair, request, config: RunConfig):
        plain = self._plain(pair, request, config.model_copy(update={"mode": "plain", "trace": False}))
        self._future = list(request.prompt_ids) + list(plain.output_ids)  # token at each position
        self._nudge = self.nudge_share * load_calibration(self.model_dir, config.dtype).drafter_tolerance
        return super()._speculative(pair, request, config)

    def build(self, draft_logits, config, params, generator):
        self._drafted = draft_logits
        return super().build(draft_logits, config, params, generator)

    def cut(self, tree, room, start, config):
        """The tree of the moved logits (the root sits at ``start``; the continuation follows it)."""
        path = self._future[start + 1 : start + 1 + self._drafted.shape[0]]
        moved = self._drafted.clone()
        if path:
            rows = torch.arange(len(path), device=moved.device)
            moved[rows, torch.tensor(path, device=moved.device)] += self._nudge
        self._moved = moved
        return super().build(moved, config, None, None)

    def _trace(self, tree, verify, walk, logits, start, root, draft_logits, config):
        return super()._trace(tree, verify, walk, logits, start, root, self._moved, config)


def _reach(tree, path) -> int:
    """How many tokens of ``path`` the tree holds as a path from its root."""
    node, depth = 0, 0
    for token in path:
        node = tree.children[node].get(int(token))
        if node is None:
            break
        depth += 1
    return depth


class PeekingWhereItGains(PeekingDrafter):
    """:class:`PeekingDrafter` that moves its logits only in the rounds where the move makes the tree hold
    more of the target's continuation, and reports its own logits unmoved everywhere else: the rounds the
    drafter-lean test reads are honest, so what bounds it is the confirmed-round cap and the tau test
    (docs/reference/low-precision.md: what a fabricating engine can still do)."""

    name = "adversary-peeking-where-it-gains"

    def cut(self, tree, room, start, config):
        moved = super().cut(tree, room, start, config)
        path = self._future[start + 1 : start + 1 + self._drafted.shape[0]]
        if _reach(moved, path) > _reach(tree, path):
            return moved
        self._moved = self._drafted
        return tree


PeekingDrafterBlackBox = black_box(PeekingDrafter)
PeekingDrafterBlackBox.__name__ = PeekingDrafterBlackBox.__qualname__ = "PeekingDrafterBlackBox"
PeekingDrafterBlackBox.__module__ = __name__

EXCUSE_ADVERSARIES = {
    "drafter logits moved toward the target's continuation, reported": PeekingDrafter,
    "drafter logits moved toward the target's continuation, black box": PeekingDrafterBlackBox,
}
