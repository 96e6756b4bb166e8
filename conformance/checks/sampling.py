"""Check 6: sampling at T>0 is lossless in distribution.

The engine runs a synthetic bigram target (:mod:`ddtree_conformance.synthetic`) with a deliberately poor
random drafter, many seeded requests per variant. Every transition ``prev -> next`` in the
outputs must follow the request's processed target distribution (temperature, top-k, top-p
applied to the table row of ``prev``), which is known exactly. Test: Pearson chi-square over all
rows (cells with expected count < 5 pooled per row; a pooled cell still expecting fewer than 5 merged
into the row's smallest cell, and those thin tails tested together over every row by an exact Poisson
test, the two p-values Bonferroni-combined), false-alarm rate ``ALPHA`` per variant; a
token with zero probability under top-k/top-p fails at once.

Three variants are fixed points (:data:`VARIANTS`). The fourth, ``drawn``, covers the legal range:
each run draws, from its ``run_seed``, one setting in each stratum of :func:`drawn_settings`
(temperature near 0, top-p near 1, top-k large, top-k 1, and all three at once), sends their
requests to the engine in one mixed batch, and tests each stratum on its own share of the requests
(false-alarm rate ``ALPHA`` split over the strata). The settings drawn are in the message and the
report, so a failing run repeats with ``--run-seed``.

The evidence a verdict needs: each tested setting's requests (``sampling_requests`` per variant, split
over the strata of ``drawn``) of ``min(24, max_new_tokens)`` tokens must give at least
:data:`MIN_TRANSITIONS` transitions forming at least one chi-square cell pair; with 100, the test at
alpha 1e-3 detects a large effect (Cohen's w 0.5) with 95 % power on one degree of freedom. The
default run gives 4800 per fixed variant and 960 per stratum. A run bounded below that (``--limit``
under 20 prompts samples that share of the requests, ``--max-new-tokens`` under 24 shortens them)
still fails a token the settings forbid and a significant chi-square, but otherwise ends as a skip
(cause ``input``) saying "insufficient evidence" and the number needed, never as a silent pass.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import NamedTuple

import torch
from scipy.stats import binomtest, chi2

from ddtree_conformance.adapters.interface import Request, RequestResult
from ddtree_conformance.spec import SamplingParams, processed_probs

from ..option_names import option
from ..run import Run
from ..session import SuiteSession
from ..synthetic import sampling_table, write_bigram_pair
from .result import CheckResult

__all__ = [
    "ALPHA",
    "VARIANTS",
    "DRAWN",
    "drawn_settings",
    "transition_test",
    "chi_square",
    "silent_fallback",
    "check_sampling",
]

ALPHA = 1e-3  # false-alarm rate of one variant's test on a correct engine
VARIANTS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=1,top_k=3": SamplingParams(temperature=1.0, top_k=3),
    "T=0.8,top_p=0.7": SamplingParams(temperature=0.8, top_p=0.7),
}
DRAWN = "drawn"  # the variant whose settings each run draws (module doc)
NEW_TOKENS = 24  # tokens per sampled request, at most (a run's --max-new-tokens bounds it)
MIN_TRANSITIONS = 100  # sampled transitions per tested setting that a verdict needs (module doc)


def drawn_settings(seed: int, vocab: int) -> dict[str, SamplingParams]:
    """One setting per stratum of the legal range, drawn from ``seed`` (module doc)."""
    rng = random.Random(seed)

    def temperature(low: float, high: float) -> float:  # log-uniform: as many draws near 0 as near 1
        return round(math.exp(rng.uniform(math.log(low), math.log(high))), 4)

    return {
        "temperature near 0": SamplingParams(temperature=temperature(0.05, 0.5)),
        "top_p near 1": SamplingParams(temperature=temperature(0.7, 1.4), top_p=round(rng.uniform(0.9, 0.995), 4)),
        "top_k large": SamplingParams(
            temperature=temperature(0.7, 1.4), top_k=rng.randint(vocab - vocab // 4, vocab - 1)
        ),
        "top_k 1": SamplingParams(temperature=temperature(0.3, 2.0), top_k=1),
        "all three": SamplingParams(
            temperature=temperature(0.2, 2.0), top_k=rng.randint(2, vocab - 1), top_p=round(rng.uniform(0.3, 0.99), 4)
        ),
    }


def _describe(params: SamplingParams) -> str:
    parts = [f"T={params.temperature:g}"]
    parts += [f"top_k={params.top_k}"] if params.top_k > 0 else []
    parts += [f"top_p={params.top_p:g}"] if params.top_p < 1.0 else []
    return ",".join(parts)


TOO_FEW = "too few transitions for a test"  # every row so concentrated that no chi-square cell pair is left


def transition_test(table: torch.Tensor, params: SamplingParams, sequences: list[list[int]]) -> tuple[float, str]:
    """p-value of the transitions in ``sequences`` under ``table`` and ``params``, plus a note."""
    p_value, note, _, _ = chi_square(table, params, sequences)
    return p_value, note


def chi_square(table: torch.Tensor, params: SamplingParams, sequences: list[list[int]]) -> tuple[float, str, int, int]:
    """``(p-value, note, transitions, degrees of freedom)`` of :func:`transition_test`."""
    vocab = table.shape[0]
    counts = torch.zeros((vocab, vocab), dtype=torch.float64)
    for seq in sequences:
        for a, b in itertools.pairwise(seq):
            counts[a, b] += 1
    statistic, dof = 0.0, 0
    rare_seen, rare_expected = 0.0, 0.0  # tokens too unlikely for a cell of their own, over every row
    for prev in range(vocab):
        n = float(counts[prev].sum())
        if n == 0:
            continue
        probs = processed_probs(table[prev], params).double()
        impossible = (probs == 0) & (counts[prev] > 0)
        if bool(impossible.any()):
            token = int(torch.nonzero(impossible)[0])
            return (
                0.0,
                (
                    f"token {token} sampled after {prev} {int(counts[prev, token])} times but has probability 0 "
                    f"under the request's top-k/top-p (not applied at tree nodes?)"
                ),
                int(counts.sum()),
                dof,
            )
        expected = probs * n
        keep = expected >= 5
        obs = list(counts[prev][keep].tolist())
        exp = list(expected[keep].tolist())
        rest_seen, rest_expected = float(counts[prev][~keep].sum()), float(expected[~keep].sum())
        if rest_expected >= 5:
            obs, exp = obs + [rest_seen], exp + [rest_expected]
        elif exp:  # too thin for a cell of its own (one draw in a cell expecting 0.01 adds 98 to chi2)
            smallest = exp.index(min(exp))
            obs[smallest], exp[smallest] = obs[smallest] + rest_seen, exp[smallest] + rest_expected
            rare_seen, rare_expected = rare_seen + rest_seen, rare_expected + rest_expected
        cells = [(o, e) for o, e in zip(obs, exp) if e > 0]
        if len(cells) < 2:
            continue
        statistic += sum((o - e) ** 2 / e for o, e in cells)
        dof += len(cells) - 1
    if rare_seen > 0:  # the thin tails, every row together: an exact Poisson test (one-sided, too many)
        from scipy.stats import poisson

        p_rare = float(poisson.sf(rare_seen - 1, rare_expected))
        if dof == 0 or p_rare < float(chi2.sf(statistic, dof)):
            note = f"{int(rare_seen)} draws of tokens the rows expect {rare_expected:.2f} times (Poisson)"
            p_chi = float(chi2.sf(statistic, dof)) if dof else 1.0
            return min(1.0, 2 * min(p_rare, p_chi)), note, int(counts.sum()), dof
    if dof == 0:
        total = int(counts.sum())
        if total and all(
            int((processed_probs(table[prev], params) > 0).sum()) == 1
            for prev in range(vocab)
            if counts[prev].sum() > 0
        ):
            return 1.0, f"{total} transitions, each to the one token its row allows", total, 0
        return 1.0, TOO_FEW, total, 0
    p_chi = float(chi2.sf(statistic, dof))
    if rare_seen > 0:  # two tests: Bonferroni
        from scipy.stats import poisson

        p_chi = min(1.0, 2 * min(p_chi, float(poisson.sf(rare_seen - 1, rare_expected))))
    return p_chi, f"chi2 {statistic:.1f} on {dof} dof", int(counts.sum()), dof


GREEDY_SHARE = 0.95  # "verified greedily": at least this share of the transitions after the first are the argmax


def _argmax_share(table: torch.Tensor, params: SamplingParams, sequences: list[list[int]]) -> tuple[int, int, float]:
    """(argmax transitions, transitions, expected argmax transitions under ``params``), leaving out
    each sequence's first transition (the prefill's token, which an engine samples apart)."""
    hits = total = 0
    expected = 0.0
    for seq in sequences:
        for a, b in itertools.pairwise(seq[1:]):
            row = table[a]
            total += 1
            hits += b == int(torch.argmax(row))
            expected += float(processed_probs(row, params).max())
    return hits, total, expected


def silent_fallback(table: torch.Tensor, params: SamplingParams, sequences: list[list[int]]) -> str | None:
    """The sampling an engine fell back to without saying so, when the transitions follow it and not
    the request's: greedy verification, the temperature ignored (T = 1), top-k/top-p ignored, or
    both ignored. None when no such fallback explains them."""
    hits, total, expected = _argmax_share(table, params, sequences)
    if total and hits >= GREEDY_SHARE * total:
        share = expected / total
        if share < 1.0 and binomtest(hits, total, min(share, 1.0), alternative="greater").pvalue < ALPHA:
            return (
                f"sampled requests were verified greedily: {hits}/{total} transitions after the first token are "
                f"the target's argmax, where sampling at the request's settings gives about {share:.0%}"
            )
    filtered = params.top_k > 0 or params.top_p < 1.0
    alternatives = []
    if params.temperature != 1.0:
        alternatives.append(
            (
                "the temperature ignored (sampled at T=1)",
                SamplingParams(temperature=1.0, top_k=params.top_k, top_p=params.top_p),
            )
        )
    if filtered:
        alternatives.append(("top-k/top-p ignored", SamplingParams(temperature=params.temperature)))
    if filtered and params.temperature != 1.0:
        alternatives.append(("temperature and top-k/top-p ignored (sampled at T=1)", SamplingParams(temperature=1.0)))
    for what, alternative in alternatives:
        p_value, note = transition_test(table, alternative, sequences)
        if p_value >= ALPHA and note != TOO_FEW:
            return f"{what}: the transitions follow that distribution ({note}; p = {p_value:.3g})"
    return None


def _requests(params: SamplingParams, seeds: range, vocab: int, new_tokens: int = NEW_TOKENS) -> list[Request]:
    return [
        Request(
            prompt_ids=[seed % vocab],
            max_new_tokens=new_tokens,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=seed,
        )
        for seed in seeds
    ]


def check_sampling(session: SuiteSession, mode: str, budget: int | None, variant: str) -> CheckResult:
    name = Run(mode, budget).check_id("sampling", variant)
    caps = session.capabilities
    if not caps.sampling:
        return CheckResult.skipped(name, "engine does not support sampling")
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    table = sampling_table()
    vocab = table.shape[0]
    pair_dir = session.scratch / "bigram-sampling"
    if not (pair_dir / "PAIR.json").exists():
        write_bigram_pair(pair_dir, table, drafter="random")
    engine = session.engine_for(str(pair_dir / "target"), str(pair_dir / "drafter"))
    total = session.settings.sampling_requests
    if variant == DRAWN:
        strata = drawn_settings(session.settings.run_seed or 0, vocab)
        share = max(1, total // len(strata))
    else:
        strata, share = {variant: VARIANTS[variant]}, total
    seeds = {label: range(k * share, (k + 1) * share) for k, label in enumerate(strata)}
    new_tokens = min(NEW_TOKENS, session.settings.max_new_tokens)
    requests = [r for label, params in strata.items() for r in _requests(params, seeds[label], vocab, new_tokens)]
    results = session.run(mode, budget, requests=requests, engine=engine)
    errors = [r.error for r in results if r.error]
    if errors:
        return CheckResult.failed(name, f"engine error: {errors[0].splitlines()[0]}")
    alpha = ALPHA / len(strata)
    settings = {k: _describe(v) for k, v in strata.items()}
    notes, p_values, evidence, short = [], {}, None, []
    for k, (label, params) in enumerate(strata.items()):
        part = slice(k * share, (k + 1) * share)
        where = "" if variant != DRAWN else f"{label} ({_describe(params)}): "
        judged = _judge_stratum(name, table, params, requests[part], results[part], alpha, where, settings)
        if judged.dof and (evidence is None or judged.transitions < evidence["transitions"]):  # the weakest's
            evidence = {"transitions": judged.transitions, "dof": judged.dof, "alpha": alpha}
        if judged.failure is not None:
            return judged.failure
        if judged.short:
            short.append((label, judged.transitions))
        p_values[label] = judged.p_value
        notes.append(judged.note)
    rounds = sum(r.rounds or 0 for r in results)
    if len(short) == len(strata):  # no setting gave a chi-square verdict: a run too small for one
        return CheckResult.skipped(
            name,
            f"insufficient evidence: {min(n for _, n in short)} sampled transitions per setting "
            f"({share} requests of {new_tokens} tokens); a sampling verdict needs at least {MIN_TRANSITIONS} "
            f"per setting and found no fault in the support ({'; '.join(notes)}). Raise {option('limit')} "
            f"(the sampling checks sample in full from 20 prompts) or {option('max_new_tokens')} (up to {NEW_TOKENS})",
            cause="input",
        )
    if variant != DRAWN:
        [only] = notes
        head = only.split(";", 1)
        return CheckResult.passed(
            name, f"{head[0]}, {rounds} rounds;{head[1]}", p_value=p_values[variant], **(evidence or {})
        )
    return CheckResult.passed(
        name,
        f"settings drawn with run seed {session.settings.run_seed}, {rounds} rounds: " + "; ".join(notes),
        p_values=p_values,
        settings=settings,
        **(evidence or {}),
    )


class _Stratum(NamedTuple):
    """One sampling setting's test: its failure (None: none), the note the verdict lists, its p-value, the
    transitions and degrees of freedom it had, and whether it was too small for a chi-square verdict."""

    failure: CheckResult | None
    note: str
    p_value: float
    transitions: int
    dof: int
    short: bool


def _judge_stratum(
    name: str,
    table: torch.Tensor,
    params: SamplingParams,
    requests: list[Request],
    results: list[RequestResult],
    alpha: float,
    where: str,
    settings: dict[str, str],
) -> _Stratum:
    """The chi-square test of one setting's sampled transitions against the target distribution."""
    sequences = [r.prompt_ids + o.output_ids for r, o in zip(requests, results)]
    p_value, note, transitions, dof = chi_square(table, params, sequences)
    tokens = sum(len(o.output_ids) for o in results)
    if tokens == 0:
        failure = CheckResult.failed(
            name,
            f"{where}{len(requests)} sampled requests gave {tokens} tokens: nothing to test "
            f"against the target distribution",
        )
        return _Stratum(failure, "", p_value, transitions, dof, False)
    short = p_value >= alpha and (note == TOO_FEW or transitions < MIN_TRANSITIONS)
    if short:
        # rows too concentrated for a chi-square (settings drawn this narrow), or a run too small for a
        # verdict: what the sample still tests is the support (a token the settings forbid failed above,
        # p = 0); never the engine's fault, so never its failure, and never a pass on its own
        why = "" if note == TOO_FEW else f" (a verdict needs {MIN_TRANSITIONS})"
        note = f"{transitions} transitions, each within the support its settings allow (a support test only{why})"
    detail = f"{len(requests)} requests, {tokens} tokens; {note}; p = {p_value:.3g}"
    if p_value < alpha:
        fallback = silent_fallback(table, params, sequences)
        named = f"{fallback}; " if fallback else ""
        failure = CheckResult.failed(
            name,
            f"{where}{named}sampled outputs do not follow the target distribution: {detail} (< alpha {alpha:.3g})",
            p_value=p_value,
            fallback=fallback,
            settings=settings,
        )
        return _Stratum(failure, "", p_value, transitions, dof, short)
    return _Stratum(None, f"{where}{detail}", p_value, transitions, dof, short)
