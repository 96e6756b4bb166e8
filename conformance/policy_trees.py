"""Draft trees under the policies integrations have shipped instead of the spec's, and the reference
engine run under one of them (what an engine that gives no traces is compared with).

:func:`build_policy_tree` is the spec's best-first heap (:func:`~ddtree_conformance.spec.build_tree`)
with the known deviations as switches; all off, it is the spec's tree. :data:`KNOWN_POLICIES` holds
the ones read in vLLM PR #42910 and SGLang PR #29907 (:mod:`ddtree_conformance.tree_policy` names
them); :func:`replay_known_policies` runs the reference under each and says which one an engine's
acceptance equals. The vLLM PR's depth (B positions drafted) needs no replay: acceptance shows it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ddtree_conformance.adapters.interface import Request, RequestResult, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.adapters.reference.replay import replay_result
from ddtree_conformance.spec import DraftTree, build_chain, per_depth_topk

from .noise import NoiseModel

__all__ = [
    "KNOWN_POLICIES",
    "KNOWN_POLICY_KINDS",
    "KNOWN_POLICY_TEXT",
    "MAX_FIT_ROUNDS",
    "PolicyFit",
    "PolicyMatch",
    "PolicyReference",
    "build_policy_tree",
    "distinct_policies",
    "fit_policy",
    "match_on_rounds",
    "node_paths",
    "policy_heap",
    "renumber_breadth_first",
    "replay_known_policies",
    "sglang_width",
]

POOLED_TAU_REL_TOL = 0.02  # aggregate engines: pooled tau within 2 % of a policy's (the acceptance check's rule)
MATCHING_PROMPTS = 0.9  # per-round engines: this share of prompts with lengths equal to a policy's
NAMING_ALPHA = 0.01  # a diagnosis of a failing verdict, not a verdict: the sign test's level for naming a policy
BELOW_CHAIN = 0.05  # an engine this far below the chain policy's tau matches no known policy
BONUS_GRID = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
MARGIN_GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
MAX_FIT_ROUNDS = 64  # differing rounds a rebuild fit looks at (they agree on a policy within a few)


def sglang_width(budget: int, depth: int) -> int:
    """SGLang PR #29907's children per node above L: ``min(max(B // L + 1, 2), 6)`` (6 is the default of
    its ``SGLANG_DDTREE_MAX_TOPK``)."""
    return min(max(budget // max(depth, 1) + 1, 2), 6)


def node_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """Every node's token path from the root (the root's is ``()``); nodes may be numbered in any order
    (a parent after its child included: a freedom), the arrays already checked to form a tree."""
    paths: list[tuple[int, ...] | None] = [()] + [None] * (len(tokens) - 1)

    def path(i: int) -> tuple[int, ...]:
        chain = []
        while paths[i] is None:
            chain.append(i)
            i = parents[i]
        for node in reversed(chain):
            paths[node] = paths[parents[node]] + (int(tokens[node]),)
        return paths[i] if not chain else paths[chain[0]]

    return [path(i) for i in range(len(tokens))]


def build_policy_tree(
    draft_logits: torch.Tensor,
    budget: int,
    *,
    max_children: int | None = None,
    depth_bonus: float = 0.0,
    early_stop_margin: float | None = None,
    keep_spine: bool = False,
    chain: bool = False,
    order: str = "pop",
) -> DraftTree:
    """The spec's best-first heap with one or more of the known deviations switched on.

    ``max_children``: only the top ``k`` tokens per depth are candidates (at most ``k`` children per
    node); ``depth_bonus``: added to a candidate's heap key per level below depth 1;
    ``early_stop_margin``: candidates whose key is below ``lp_1 - log B - margin`` (``lp_1`` the best
    depth-1 log-prob) are skipped, except the rank-0 chain when ``keep_spine``; ``chain``: the first
    ``min(B, L)`` argmax tokens as a chain; ``order``: "pop" (the spec's numbering) or
    "breadth-first". All off: exactly :func:`~ddtree_conformance.spec.build_tree`. Scores in the
    returned tree are the plain cumulative log-probs (no bonus)."""
    if chain:
        return build_chain(draft_logits[: min(budget, draft_logits.shape[0])])
    vocab = draft_logits.shape[1]
    top_lp, top_ids = per_depth_topk(draft_logits, min(budget, vocab, max_children or budget))
    tokens, depths, parents, ranks, scores = policy_heap(
        top_lp.tolist(),
        top_ids.tolist(),
        budget,
        max_children=max_children,
        depth_bonus=depth_bonus,
        early_stop_margin=early_stop_margin,
        keep_spine=keep_spine,
    )
    tree = DraftTree(
        tokens=torch.tensor([-1] + tokens, dtype=torch.long),
        depths=torch.tensor([0] + depths, dtype=torch.long),
        parents=torch.tensor([-1] + parents, dtype=torch.long),
        ranks=torch.tensor([-1] + ranks, dtype=torch.long),
        scores=torch.tensor([0.0] + scores, dtype=torch.float64),
    ).to(draft_logits.device)
    return renumber_breadth_first(tree) if order == "breadth-first" else tree


def policy_heap(
    lp: list[list[float]],
    ids: list[list[int]],
    budget: int,
    *,
    max_children: int | None = None,
    depth_bonus: float = 0.0,
    early_stop_margin: float | None = None,
    keep_spine: bool = False,
) -> tuple[list, list, list, list, list]:
    """:func:`build_policy_tree`'s heap on per-depth top-k log-probs and ids (rank order, as
    :func:`~ddtree_conformance.spec.per_depth_topk` gives them; only the first ``max_children``
    ranks are used): ``(tokens, depths, parents, ranks, scores)`` of the nodes in pop order."""
    depth_limit = len(lp)
    k = min(budget, len(lp[0]), max_children or budget)
    threshold = -math.inf if early_stop_margin is None else lp[0][0] - math.log(max(budget, 1)) - early_stop_margin
    # Heap entry: (-key, rank tuple, parent index, depth, rank, parent score, parent key)
    heap = [(-lp[0][0], (0,), 0, 1, 0, 0.0, 0.0)]
    tokens, depths, parents, ranks, scores = [], [], [], [], []
    while heap and len(tokens) < budget:
        neg_key, rank_path, parent, depth, rank, parent_score, parent_key = heapq.heappop(heap)
        key, score = -neg_key, parent_score + lp[depth - 1][rank]
        if key < threshold and not (keep_spine and not any(rank_path)):
            continue
        node = len(tokens) + 1
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        ranks.append(rank)
        scores.append(score)
        if rank + 1 < k:
            sibling = parent_key + lp[depth - 1][rank + 1] + (depth_bonus if depth > 1 else 0.0)
            heapq.heappush(
                heap, (-sibling, rank_path[:-1] + (rank + 1,), parent, depth, rank + 1, parent_score, parent_key)
            )
        if depth < depth_limit:
            child = key + lp[depth][0] + depth_bonus
            heapq.heappush(heap, (-child, rank_path + (0,), node, depth + 1, 0, score, key))
    return tokens, depths, parents, ranks, scores


def renumber_breadth_first(tree: DraftTree) -> DraftTree:
    """The same tree numbered level by level, each level's nodes grouped by their parent's new index
    (in the old order within a group): the order SGLang PR #29907 gives its verify batch."""
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    new = {0: 0}
    order = [0]
    for depth in range(1, max(depths) + 1 if len(depths) > 1 else 1):
        level = [i for i in range(1, len(depths)) if depths[i] == depth]
        level.sort(key=lambda i: (new[parents[i]], i))
        for i in level:
            new[i] = len(order)
            order.append(i)
    index = torch.tensor(order, dtype=torch.long, device=tree.tokens.device)
    remapped = torch.tensor([-1] + [new[parents[i]] for i in order[1:]], dtype=torch.long, device=index.device)
    return DraftTree(
        tokens=tree.tokens[index],
        depths=tree.depths[index],
        parents=remapped,
        ranks=tree.ranks[index],
        scores=tree.scores[index],
    )


def _sglang_policy(budget: int, depth: int) -> dict:
    if budget <= depth:
        return {"chain": True}
    return {
        "max_children": sglang_width(budget, depth),
        "depth_bonus": 0.2,
        "early_stop_margin": 1.0,
        "keep_spine": True,
        "order": "breadth-first",
    }


#: Policies integrations have shipped, as :func:`build_policy_tree` arguments for (B, L): what an
#: engine that gives no traces is compared with (:func:`replay_known_policies`).
KNOWN_POLICIES: dict[str, Callable[[int, int], dict]] = {
    "chain": lambda budget, depth: {"chain": True},
    "width-cap": lambda budget, depth: {"max_children": sglang_width(budget, depth)},
    "depth-bonus": lambda budget, depth: {"depth_bonus": 0.2},
    "early-stop": lambda budget, depth: {"early_stop_margin": 1.0, "keep_spine": True},
    "sglang-pr-29907": _sglang_policy,
}


def distinct_policies(budget: int, depth: int) -> list[str]:
    """The known policies that differ at (B, L): at B <= L SGLang PR #29907's is the chain."""
    return [n for n in KNOWN_POLICIES if not (n == "sglang-pr-29907" and budget <= depth)]


#: The finding kinds (:data:`ddtree_conformance.tree_policy.FINDINGS`) each known policy stands for, for (B, L).
KNOWN_POLICY_KINDS: dict[str, Callable[[int, int], tuple[str, ...]]] = {
    "chain": lambda budget, depth: ("chain",),
    "width-cap": lambda budget, depth: ("width-cap",),
    "depth-bonus": lambda budget, depth: ("depth-bonus",),
    "early-stop": lambda budget, depth: ("early-stop",),
    "sglang-pr-29907": lambda budget, depth: (
        ("chain",) if budget <= depth else ("width-cap", "depth-bonus", "early-stop")
    ),
}
KNOWN_POLICY_TEXT = {
    "chain": "a chain of the first min(B, L) argmax tokens (SGLang PR #29907 at B <= L)",
    "width-cap": "children per node capped at min(max(B // L + 1, 2), 6) (SGLang PR #29907)",
    "depth-bonus": "scores raised by 0.2 per level (SGLang PR #29907)",
    "early-stop": "branch candidates below best - log B - 1 skipped (SGLang PR #29907)",
    "sglang-pr-29907": "SGLang PR #29907's trees (chain at B <= L; above L width cap, depth bonus 0.2, early stop)",
}


@dataclass
class PolicyFit:
    """The rebuild policy that reproduces the most differing rounds' node sets."""

    cap: int | None = None
    bonus: float = 0.0
    stop: tuple[float, bool] | None = None  # (margin, rank-0 chain kept)
    hits: int = 0
    sample: int = 0

    def describe(self) -> str:
        parts = [f"width cap {self.cap}"] if self.cap else []
        parts += [f"depth bonus {self.bonus:g}"] if self.bonus else []
        if self.stop is not None:
            parts.append(
                f"early stop at best - log B - {self.stop[0]:g}" + (" (rank-0 chain kept)" if self.stop[1] else "")
            )
        return ", ".join(parts) or "the spec's heap"

    def kwargs(self) -> dict:
        out = {"max_children": self.cap, "depth_bonus": self.bonus}
        if self.stop is not None:
            out.update(early_stop_margin=self.stop[0], keep_spine=self.stop[1])
        return out


def fit_policy(rounds: Sequence[tuple[torch.Tensor, set]], budget: int, cap: int | None) -> PolicyFit:
    """The rebuild policy reproducing the most of ``rounds`` (drafter logits [L, V] and the engine's
    node set as token paths): coordinate descent over (width cap, depth bonus, early stop) from the
    best of a few seeds (the spec's heap, and the known policies' settings). Each step keeps the value
    that reproduces more rounds exactly or, as many, misses fewer nodes; at the end every component
    the rounds do not need is switched off again."""
    sample = rounds[:MAX_FIT_ROUNDS]
    prepared = []
    for logits, paths in sample:
        lp, ids = per_depth_topk(logits, min(budget, logits.shape[1]))
        prepared.append((lp.tolist(), ids.tolist(), paths))

    def measure(fit: PolicyFit) -> tuple[int, int]:
        hits = missed = 0
        for lp, ids, target in prepared:
            tokens, _, parents, _, _ = policy_heap(lp, ids, budget, **fit.kwargs())
            got = set(node_paths([-1, *tokens], [-1, *parents]))
            hits += got == target
            missed += len(got ^ target)
        return hits, -missed

    dims = {
        "cap": [None, cap] if cap else [None],
        "bonus": [0.0, *BONUS_GRID],
        "stop": [None, *((m, s) for m in MARGIN_GRID for s in (False, True))],
    }
    # start from the best of the known policies' settings (one component, or SGLang PR #29907's three):
    # from the spec's heap alone, a descent can stop where no single component helps yet
    seeds = [
        PolicyFit(),
        PolicyFit(cap=cap),
        PolicyFit(bonus=0.2),
        PolicyFit(stop=(1.0, True)),
        PolicyFit(cap=cap, bonus=0.2, stop=(1.0, True)),
    ]
    best, value = max(((s, measure(s)) for s in seeds), key=lambda sv: sv[1])
    for _ in range(4):
        improved = False
        for dim, values in dims.items():
            for v in values:
                trial = PolicyFit(**{**best.__dict__, dim: v})
                got = measure(trial)
                if got > value:
                    best, value, improved = trial, got, True
        if not improved or value[0] == len(sample):
            break
    for dim, off in (("cap", None), ("bonus", 0.0), ("stop", None)):  # drop what the rounds do not need
        trial = PolicyFit(**{**best.__dict__, dim: off})
        got = measure(trial)
        if got[0] >= value[0]:
            best, value = trial, got
    best.hits, best.sample = value[0], len(sample)
    return best


class PolicyReference(ReferenceEngine):
    """The reference engine building its trees under :attr:`policy` (:func:`build_policy_tree`
    arguments; empty: the spec's tree). One instance serves every policy in turn."""

    name = "reference (policy replay)"

    def __init__(self, model_dir: str, drafter_dir: str | None = None, **options) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.policy: dict = {}
        self._build = lambda logits, budget: build_policy_tree(logits, budget, **self.policy)


@dataclass
class PolicyMatch:
    """Which known policies an engine's acceptance equals, with every policy's tau."""

    matches: list[str] = field(default_factory=list)
    taus: dict[str, float] = field(default_factory=dict)
    how: str = ""

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
    for name in names or distinct_policies(budget, horizon):
        engine.policy = KNOWN_POLICIES[name](budget, horizon)
        try:
            untraced = config.model_copy(update={"trace": False, "trace_draft_logits": False})
            replayed = engine.generate(requests, untraced)
        finally:
            engine.policy = {}
        match.taus[name] = _pooled_tau(replayed)
        equal[name] = sum(_same(kind, a, b) for a, b in zip(mine, replayed)) if mine else 0
        if match.taus[name]:
            distance[name] = abs(match.taus[name] - tau) / match.taus[name]
        if name == "chain" and tau < (1 - BELOW_CHAIN) * match.taus[name] and not equal[name]:
            match.how = f"pooled tau {tau:.3f} is below the chain's {match.taus[name]:.3f}; the other policies not run"
            return match  # the known policies accept about as much as the chain or more: none matches this
    best = max(equal.values(), default=0)
    if mine and best >= MATCHING_PROMPTS * len(results):
        match.matches = [n for n, e in equal.items() if e == best]
        match.how = (
            f"{'per-round lengths' if kind == 'rounds' else 'per-request acceptance'} equal on {best}/"
            f"{len(results)} prompts"
        )
        return match
    close = {n: d for n, d in distance.items() if d <= POOLED_TAU_REL_TOL}
    if close:
        best = min(close.values())
        match.matches = [n for n, d in close.items() if d == best]
        match.how = f"pooled tau {tau:.3f}, within {POOLED_TAU_REL_TOL:.0%} (the closest)"
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
