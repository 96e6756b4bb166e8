"""Check 6: sampling at T>0 is lossless in distribution.

The engine runs a synthetic bigram target (:mod:`ddtree_conformance.synthetic`) with a deliberately poor
random drafter, many seeded requests per variant. Every transition ``prev -> next`` in the
outputs must follow the request's processed target distribution (temperature, top-k, top-p
applied to the table row of ``prev``), which is known exactly. Test: Pearson chi-square over all
rows (cells with expected count < 5 pooled per row), false-alarm rate ``ALPHA`` per variant; a
token with zero probability under top-k/top-p fails at once.
"""

from __future__ import annotations

import torch
from scipy.stats import chi2

from ddtree_conformance.adapters.interface import Request
from ddtree_conformance.spec import SamplingParams, processed_probs

from ..session import SuiteSession
from ..synthetic import sampling_table, write_bigram_pair
from ..run import Run
from .result import CheckResult

__all__ = ["ALPHA", "VARIANTS", "transition_test", "check_sampling"]

ALPHA = 1e-3  # false-alarm rate of one variant's test on a correct engine
VARIANTS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=1,top_k=3": SamplingParams(temperature=1.0, top_k=3),
    "T=0.8,top_p=0.7": SamplingParams(temperature=0.8, top_p=0.7),
}
NEW_TOKENS = 24


def transition_test(table: torch.Tensor, params: SamplingParams, sequences: list[list[int]]) -> tuple[float, str]:
    """p-value of the transitions in ``sequences`` under ``table`` and ``params``, plus a note."""
    vocab = table.shape[0]
    counts = torch.zeros((vocab, vocab), dtype=torch.float64)
    for seq in sequences:
        for a, b in zip(seq, seq[1:]):
            counts[a, b] += 1
    statistic, dof = 0.0, 0
    for prev in range(vocab):
        n = float(counts[prev].sum())
        if n == 0:
            continue
        probs = processed_probs(table[prev], params).double()
        impossible = (probs == 0) & (counts[prev] > 0)
        if bool(impossible.any()):
            token = int(torch.nonzero(impossible)[0])
            return 0.0, (f"token {token} sampled after {prev} {int(counts[prev, token])} times but has probability 0 "
                         f"under the request's top-k/top-p (not applied at tree nodes?)")
        expected = probs * n
        keep = expected >= 5
        obs = list(counts[prev][keep].tolist()) + [float(counts[prev][~keep].sum())]
        exp = list(expected[keep].tolist()) + [float(expected[~keep].sum())]
        cells = [(o, e) for o, e in zip(obs, exp) if e > 0]
        if len(cells) < 2:
            continue
        statistic += sum((o - e) ** 2 / e for o, e in cells)
        dof += len(cells) - 1
    if dof == 0:
        return 1.0, "too few transitions for a test"
    return float(chi2.sf(statistic, dof)), f"chi2 {statistic:.1f} on {dof} dof"


def check_sampling(session: SuiteSession, mode: str, budget: int | None, variant: str) -> CheckResult:
    name = Run(mode, budget).check_id("sampling", variant)
    caps = session.capabilities
    if not caps.sampling:
        return CheckResult.skipped(name, "engine does not support sampling")
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    table = sampling_table()
    pair_dir = session.scratch / "bigram-sampling"
    if not (pair_dir / "PAIR.json").exists():
        write_bigram_pair(pair_dir, table, drafter="random")
    engine = session.engine_for(str(pair_dir / "target"), str(pair_dir / "drafter"))
    params = VARIANTS[variant]
    requests = [
        Request(prompt_ids=[seed % table.shape[0]], max_new_tokens=NEW_TOKENS, temperature=params.temperature,
                top_k=params.top_k, top_p=params.top_p, seed=seed)
        for seed in range(session.settings.sampling_requests)
    ]
    results = session.run(mode, budget, requests=requests, engine=engine)
    errors = [r.error for r in results if r.error]
    if errors:
        return CheckResult.failed(name, f"engine error: {errors[0].splitlines()[0]}")
    sequences = [r.prompt_ids + o.output_ids for r, o in zip(requests, results)]
    p_value, note = transition_test(table, params, sequences)
    rounds = sum(r.rounds or 0 for r in results)
    tokens = sum(len(r.output_ids) for r in results)
    if tokens == 0 or note == "too few transitions for a test":
        return CheckResult.failed(name, f"{len(requests)} sampled requests gave {tokens} tokens: nothing to test "
                                        f"against the target distribution")
    detail = f"{len(requests)} requests, {tokens} tokens, {rounds} rounds; {note}; p = {p_value:.3g}"
    if p_value < ALPHA:
        return CheckResult.failed(name, f"sampled outputs do not follow the target distribution: {detail} "
                                        f"(< alpha {ALPHA})", p_value=p_value)
    return CheckResult.passed(name, detail, p_value=p_value)
