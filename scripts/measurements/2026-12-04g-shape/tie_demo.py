"""summarise_rounds on a ReplayRun of 10 rounds, 8 of them excused as float32 ties (tolerance-rule-example.diff)."""

from ddtree_conformance.adapters.interface import RequestResult
from ddtree_conformance.checks.acceptance_rounds import JudgedRounds, summarise_rounds
from ddtree_conformance.noise import NoiseModel
from ddtree_conformance.replay import ReplayRun, RoundKind, RoundVerdict
from ddtree_conformance.run import Run

run = ReplayRun()
run.rounds = 10
run.engine_lengths = [[2] * 10]
run.reference_lengths = [[2] * 10]
run.tau = run.reference_tau = 2.0  # the pooled taus judge_rounds keeps with the lengths (since 58afe7d)
run.drafter_side = [0] * 10
for i in range(8):
    run.verdicts.append(RoundVerdict("prompt a", i, RoundKind.FP32_TIE, 2, 2, [1], [2], "an fp32 tie"))
exact = NoiseModel("float32", 0.0, 1e-3, 0, (), "exact")
result = RequestResult(output_ids=[1] * 20, acceptance_lengths=[2] * 10, finish_reason="length")
verdict = summarise_rounds("acceptance/ddtree-B16", Run("ddtree", 16), JudgedRounds(run=run), exact, [result])
print(verdict.status, verdict.message[:300])
