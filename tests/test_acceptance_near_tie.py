"""The acceptance check's drafter near-tie rule (conformance/checks/acceptance.py), on stand-in runs.

A per-round difference from the reference is excused only when the engine's traced rerun reproduces
it and, at that round, the contexts agree, the drafter logits are within DRAFT_LOGIT_TOL and the
trees differ. Every other case must stay a failure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddtree_conformance.adapters.interface import Request, RequestResult, RoundTrace
from ddtree_conformance.checks.acceptance import DRAFT_LOGIT_TOL, drafter_near_tie


def _trace(start=10, root=5, tokens=(5, 7, 8), parents=(-1, 0, 0), logits=((0.0, 1.0, 2.0),)):
    n = len(tokens)
    return RoundTrace(start=start, root_token=root, tree_tokens=list(tokens), parents=list(parents),
                      depths=[0] + [1] * (n - 1), positions=[start] + [start + 1] * (n - 1), accepted=[],
                      target_tokens=[9], bonus=9, top2_margins=[1.0], draft_logits=[list(r) for r in logits])


def _result(lengths, traces):
    return RequestResult(output_ids=[1], finish_reason="length", rounds=len(lengths), acceptance_lengths=lengths,
                         traces=traces)


class StandIn:
    """Just what drafter_near_tie reads from a SuiteSession."""

    def __init__(self, engine_result, reference_result):
        self.engine_result, self.reference_result = engine_result, reference_result
        self.settings = SimpleNamespace(model_dir="m", drafter_dir="d")
        self.reference = object()

    def requests(self):
        return [Request(prompt_ids=[1, 2], max_new_tokens=4)]

    def reference_for(self, model_dir, drafter_dir):
        return self.reference

    def run(self, mode, budget, *, trace=False, trace_draft_logits=False, requests=None, engine=None):
        assert trace and trace_draft_logits
        return [self.reference_result] if engine is self.reference else [self.engine_result]


REF = _result([2, 1], [_trace(), _trace(start=12)])


def test_tie_is_excused():
    mine = _result([1, 2], [_trace(tokens=(5, 8, 7), logits=((0.0, 1.0, 2.0 + 1e-5),)), _trace(start=11)])
    why = drafter_near_tie(StandIn(mine, REF), "ddtree", 2, 0, 0, [1, 2])
    assert why is not None and "flip the tree" in why


@pytest.mark.parametrize("case", ["far-logits", "not-reproduced", "same-tree", "other-context"])
def test_everything_else_stays_a_failure(case):
    logits = ((0.0, 1.0, 2.0 + 1e-5),)
    tokens, start, lengths = (5, 8, 7), 10, [1, 2]
    if case == "far-logits":
        logits = ((0.0, 1.0, 2.0 + 100 * DRAFT_LOGIT_TOL),)
    if case == "same-tree":
        tokens = (5, 7, 8)
    if case == "other-context":
        start = 11
    traced = _result([1, 3] if case == "not-reproduced" else lengths,
                     [_trace(start=start, tokens=tokens, logits=logits), _trace(start=11)])
    assert drafter_near_tie(StandIn(traced, REF), "ddtree", 2, 0, 0, lengths) is None
