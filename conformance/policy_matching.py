"""Which known tree policy an engine's acceptance equals, for engines that give no traces: the
reference run under each policy on the same prompts (:func:`replay_known_policies`), or each policy's
tree walked on the engine's own replayed rounds (:func:`match_on_rounds`), named only when the
evidence prefers it to the spec (:func:`named_on_rounds`). The trees themselves are
:mod:`ddtree_conformance.policy_trees`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.replay import replay_result

from .noise import NoiseModel
from .policy_trees import KNOWN_POLICIES, KNOWN_POLICY_TEXT, build_policy_tree, distinct_policies

SPEC = "spec"  # the reference's own tree, compared beside the known policies

__all__ = [
    "MATCHING_PROMPTS",
    "NAMING_ALPHA",
    "PolicyMatch",
    "PolicyReference",
    "match_on_rounds",
    "named_on_rounds",
    "replay_known_policies",
]

POOLED_TAU_REL_TOL = 0.02  # aggregate engines: pooled tau within 2 % of a policy's (the acceptance check's rule)
MATCHING_PROMPTS = 0.9  # per-round engines: this share of prompts with lengths equal to a policy's
NAMING_ALPHA = 0.01  # a diagnosis of a failing verdict, not a verdict: the sign test's level for naming a policy
BELOW_CHAIN = 0.05  # an engine this far below the chain policy's tau matches no known policy


class PolicyReference(ReferenceEngine):
    """The reference engine building its trees under :attr:`policy` (:func:`build_policy_tree`
    arguments; empty: the spec's tree). One instance serves every policy in turn."""

    name = "reference (policy replay)"

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.policy: dict = {}
        self._build = lambda logits, budget: build_policy_tree(logits, budget, **self.policy)

    def generate_under(self, policy: dict, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """``requests`` run with the trees built under ``policy`` (empty: the spec's); the engine builds the
        spec's trees again afterwards."""
        self.policy = policy
        try:
            return self.generate(requests, config)
        finally:
            self.policy = {}


@dataclass
class PolicyMatch:
    """Which known policies an engine's acceptance equals, with every policy's tau."""

    matches: list[str] = field(default_factory=list)
    taus: dict[str, float] = field(default_factory=dict)
    how: str = ""
    on_equal_prompts: bool = False  # matched by equal per-prompt acceptance, not by a close pooled tau

    def describe(self) -> str:
        shown = ", ".join(f"{n} {t:.3f}" for n, t in self.taus.items())
        if not self.matches:
            return f"acceptance matches none of the known tree policies (reference tau under each: {shown})"
        names = " or ".join(KNOWN_POLICY_TEXT[n] for n in self.matches)
        return f"acceptance equals the reference's under {names} ({self.how}; tau under each: {shown})"


def _pooled_tau(results: Sequence[RequestResult]) -> float:
    rounds = [n for r in results for n in (r.acceptance_lengths or [])]
    return sum(rounds) / len(rounds) if rounds else 0.0


def _engine_view(results: Sequence[RequestResult]) -> tuple[str, float, list]:
    """(kind, pooled tau, per-prompt values) of an engine's acceptance: "rounds" (per-round lengths),
    "per-request" (each request's mean and round count) or "pooled" (one value for the batch)."""
    if all(r.acceptance_lengths is not None for r in results):
        return "rounds", _pooled_tau(results), [list(r.acceptance_lengths or []) for r in results]
    means = [r.mean_acceptance if r.mean_acceptance is not None else r.tau for r in results]
    rounds = [r.rounds for r in results]
    if all(m is not None for m in means) and all(n is not None for n in rounds) and sum(rounds):
        pooled = sum(m * n for m, n in zip(means, rounds)) / sum(rounds)
        return "per-request", pooled, [(m, n) for m, n in zip(means, rounds)]
    known = [m for m in means if m is not None]
    return "pooled", (known[0] if known else 0.0), []


def _same(kind: str, mine, theirs: RequestResult) -> bool:
    lengths = list(theirs.acceptance_lengths or [])
    if kind == "rounds":
        return mine == lengths
    mean, rounds = mine
    return rounds == len(lengths) and bool(lengths) and abs(mean - sum(lengths) / len(lengths)) <= 1e-9


def replay_known_policies(
    engine: PolicyReference,
    requests: list[Request],
    config: RunConfig,
    results: Sequence[RequestResult],
    block: int,
    names: Sequence[str] | None = None,
) -> PolicyMatch:
    """Run ``engine`` under each known policy on ``requests`` and compare with the engine's ``results``:
    per prompt where the engine reports per-request acceptance (its lengths, or its mean and round
    count, equal to the policy's on at least :data:`MATCHING_PROMPTS` of the prompts), else the
    pooled tau (within :data:`POOLED_TAU_REL_TOL`, the closest policy)."""
    horizon, budget = block - 1, config.budget
    kind, tau, mine = _engine_view(results)
    match, distance, equal = PolicyMatch(), {}, {}
    for name in [*(names or distinct_policies(budget, horizon)), SPEC]:
        policy = {} if name == SPEC else KNOWN_POLICIES[name](budget, horizon)
        untraced = config.model_copy(update={"trace": False, "trace_draft_logits": False})
        replayed = engine.generate_under(policy, requests, untraced)
        match.taus[name] = _pooled_tau(replayed)
        equal[name] = sum(_same(kind, a, b) for a, b in zip(mine, replayed)) if mine else 0
        if match.taus[name]:
            distance[name] = abs(match.taus[name] - tau) / match.taus[name]
        if name == "chain" and tau < (1 - BELOW_CHAIN) * match.taus[name] and not equal[name]:
            match.how = f"pooled tau {tau:.3f} is below the chain's {match.taus[name]:.3f}; the other policies not run"
            return match  # the known policies accept about as much as the chain or more: none matches this
    spec_tau, spec_equal = match.taus.pop(SPEC), equal.pop(SPEC)
    spec_distance = distance.pop(SPEC, float("inf"))
    # a policy is named only where it explains the engine better than the spec tree does
    equal = {n: e for n, e in equal.items() if e > spec_equal}
    distance = {n: d for n, d in distance.items() if d < spec_distance}
    match.how = f"the spec tree's tau {spec_tau:.3f}"
    best = max(equal.values(), default=0)
    if mine and best >= MATCHING_PROMPTS * len(results):
        match.matches = [n for n, e in equal.items() if e == best]
        match.on_equal_prompts = True
        match.how = (
            f"{'per-round lengths' if kind == 'rounds' else 'per-request acceptance'} equal on {best}/"
            f"{len(results)} prompts"
        )
        return match
    close = {n: d for n, d in distance.items() if d <= POOLED_TAU_REL_TOL}
    if close:
        best = min(close.values())
        match.matches = [n for n, d in close.items() if d == best]
        match.how = f"pooled tau {tau:.3f}, within {POOLED_TAU_REL_TOL:.0%} (the closest, closer than the spec's)"
    return match


def match_on_rounds(
    reference: ReferenceEngine,
    requests: Sequence[Request],
    results: Sequence[RequestResult],
    config: RunConfig,
    block: int,
    names: Sequence[str] | None = None,
    rules: NoiseModel | None = None,
) -> PolicyMatch:
    """Per-round engines, without running the target once per policy: every round of the engine's
    greedy results is replayed once with the reference on the engine's own context
    (:func:`~ddtree_conformance.adapters.reference.replay.replay_result`), and each known policy's
    tree, built from that round's drafter logits, is walked along the output that follows (the
    target's greedy choices): a policy matches when its acceptance equals the engine's in at least
    :data:`MATCHING_PROMPTS` of the rounds the output shows whole, *and the evidence prefers it to the
    spec*: more rounds differ from the spec's tree than the noise model (``rules``; default float32)
    lets a correct engine show (its longer and shorter round caps together), and among the rounds
    exactly one of the two explains, the policy's share is significantly above one half (exact sign
    test, :data:`NAMING_ALPHA`). A correct engine whose rounds part from the spec's by noise is never
    given a policy's name."""
    horizon, budget = block - 1, config.budget
    names = list(names or distinct_policies(budget, horizon))
    equal = dict.fromkeys(names, 0)
    lengths_under: dict[str, list[int]] = {n: [] for n in names}
    only = {n: [0, 0] for n in names}  # rounds this policy explains and the spec does not, and the reverse
    rounds = spec_equal_rounds = 0
    for request, result in zip(requests, results):
        output, lengths = list(result.output_ids), list(result.acceptance_lengths or [])
        replayed = replay_result(
            reference, request, output, lengths, "ddtree", budget, config.device, keep_logits=lambda *_: True
        )
        for rnd in replayed:
            if rnd.offset + horizon >= len(output):
                break  # the output's end hides how far this round could have gone
            rounds += 1
            following = output[rnd.offset : rnd.offset + horizon]
            spec_equal = _walk_length(build_policy_tree(rnd.draft_logits, budget), following) == lengths[rnd.index]
            spec_equal_rounds += spec_equal
            for name in names:
                tree = build_policy_tree(rnd.draft_logits, budget, **KNOWN_POLICIES[name](budget, horizon))
                length = _walk_length(tree, following)
                lengths_under[name].append(length)
                equal[name] += length == lengths[rnd.index]
                only[name][0] += length == lengths[rnd.index] and not spec_equal
                only[name][1] += spec_equal and length != lengths[rnd.index]
    match = PolicyMatch(taus={n: (sum(v) / len(v) if v else 0.0) for n, v in lengths_under.items()})
    match.matches, match.how = named_on_rounds(equal, only, rounds, spec_equal_rounds, rules)
    return match


def named_on_rounds(
    equal: dict[str, int], only: dict[str, list[int]], rounds: int, spec_equal: int, rules: NoiseModel | None
) -> tuple[list[str], str]:
    """The policies a per-round engine's rounds name (:func:`match_on_rounds`' rule) and why: ``equal``
    per policy the rounds it explains, ``only`` per policy the rounds it explains and the spec does not
    and the reverse, ``spec_equal`` the rounds the spec explains, of ``rounds``."""
    names = list(equal)
    preferred = {n: _prefers(*only[n]) for n in names}
    rules = rules or NoiseModel("float32", 0.0, 0.0, 0, (), "exact")
    allowed = rules.unconfirmed_round_cap(rounds, True) + rules.unconfirmed_round_cap(rounds, False)
    spec_misses = rounds - spec_equal
    noise = spec_misses <= allowed  # the spec with the noise model explains the engine: no policy named
    candidates = [] if noise else [n for n in names if preferred[n] < NAMING_ALPHA]
    best = max((equal[n] for n in candidates), default=0)
    matches = [n for n in candidates if equal[n] == best] if rounds and best >= MATCHING_PROMPTS * rounds else []
    top = max(names, key=lambda n: equal[n], default=None)
    shown = best if matches or top is None else equal[top]
    how = f"per-round acceptance equal in {shown}/{rounds} rounds replayed on the engine's contexts"
    if top is not None:
        policy_only, spec_only = only[top]
        how += (
            f"; {top} explains {policy_only} rounds the spec does not and the spec {spec_only} it does not "
            f"(sign test p = {preferred[top]:.2g}, a policy is named below {NAMING_ALPHA:g}); the spec's tree "
            f"misses {spec_misses} rounds, the noise model allows {allowed}"
        )
    return matches, how


def _walk_length(tree, following: Sequence[int]) -> int:
    """The acceptance length of a greedy walk along ``following`` (the target's choices) on ``tree``."""
    children, node, k = tree.children, 0, 0
    while k < len(following) and following[k] in children[node]:
        node, k = children[node][following[k]], k + 1
    return k + 1


def _prefers(policy_only: int, spec_only: int) -> float:
    """One-sided sign test that a policy explains more rounds than the spec: among the rounds exactly one
    of them explains, the policy's share above one half (exact binomial). The spec's own rounds that
    differ from the engine's are the noise model's; a policy is named only when it explains
    significantly more of them than the spec does."""
    from scipy.stats import binomtest

    discordant = policy_only + spec_only
    return float(binomtest(policy_only, discordant, 0.5, alternative="greater").pvalue) if discordant else 1.0
