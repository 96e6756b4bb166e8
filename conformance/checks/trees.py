"""Checks 4 and 5: tree structure on traces, spec-tree equality, and branch vs chain (node scoring).

branch-vs-chain judges every node of every verified tree against the fp32 verify of that tree
(:mod:`ddtree_conformance.node_scoring`): on every prompt of the main run when the engine gives
verified trees (light traces), else on the tree checks' shared traced run; a few root-to-leaf paths
per round are also run as plain chains, an oracle with no tree mask at all. An engine with neither
skips it, and the message says which bug classes are then out of reach in the run's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_conformance.adapters.interface import RoundTrace

from ..node_scoring import rounds_of, score_nodes
from ..noise import TokenCall
from ..run import Run
from ..scorer import shared_scorer
from ..session import SuiteSession
from ..token_scoring import rules_for
from ..tree_policy import policy_table
from .result import CheckResult
from .spec_rounds import SortedRounds, diagnose_sorted, sort_rounds
from .traced_runs import traced_run

__all__ = [
    "CHAIN_LEAVES",
    "trace_problems",
    "check_tree_structure",
    "node_evidence",
    "out_of_reach",
    "check_branch_vs_chain",
]

CHAIN_LEAVES = 4  # root-to-leaf paths per round run as chains beside node scoring (an oracle without a tree mask)


# Prompts of the traced runs: structural bugs show in every round, so ~20 prompts (some 250 rounds,
# spread over the prompt set's categories) have the power of 80, at a quarter of the cost of
# carrying every round's drafter logits back from the engine.
def trace_problems(trace: RoundTrace, budget: int | None, greedy: bool = True, output_end: bool = False) -> list[str]:
    """Every way one round's trace breaks the DDTree rules (doc §3); empty when it is fine.

    Nodes may be numbered in any order after the root (docs/reference/freedoms.md). ``output_end``: the
    output's last round, whose walk the output's end may cut (an engine reporting emitted lengths
    reports the walk as far as the output shows it)."""
    problems: list[str] = []
    n = len(trace.tree_tokens) - 1
    if not (len(trace.parents) == len(trace.depths) == len(trace.positions) == n + 1):
        return [
            (
                f"trace arrays differ in length ({len(trace.tree_tokens)}, {len(trace.parents)}, "
                f"{len(trace.depths)}, {len(trace.positions)})"
            )
        ]
    if budget is not None and n > budget:
        problems.append(f"tree has {n} nodes, more than the budget {budget}")
    if trace.parents[0] != -1 or trace.depths[0] != 0:
        problems.append("root must have parent -1 and depth 0")
    if trace.tree_tokens[0] != trace.root_token:
        problems.append(f"verify batch starts with {trace.tree_tokens[0]}, not the root token {trace.root_token}")
    seen: dict[tuple[int, int], int] = {}
    for i in range(1, n + 1):
        parent = trace.parents[i]
        if not 0 <= parent <= n or parent == i:
            problems.append(f"node {i} has parent {parent}: not a node of the tree")
            continue
        if trace.depths[i] != trace.depths[parent] + 1:
            problems.append(f"node {i} depth {trace.depths[i]} != parent depth + 1")
        key = (parent, trace.tree_tokens[i])
        if key in seen:
            problems.append(f"nodes {seen[key]} and {i} are siblings with the same token {key[1]}")
        seen[key] = i
    for i in range(n + 1):
        if trace.positions[i] != trace.start + trace.depths[i]:
            problems.append(
                f"node {i} has position {trace.positions[i]}, expected start + depth = "
                f"{trace.start + trace.depths[i]} (positions taken from the flat index?)"
            )
            break
    previous = 0
    for step, node in enumerate(trace.accepted):
        if not 0 < node <= n or trace.parents[node] != previous:
            problems.append(f"accepted nodes {trace.accepted} are not a root-to-node path")
            break
        if trace.tree_tokens[node] != trace.target_tokens[step]:
            problems.append(
                f"accepted node {node} has token {trace.tree_tokens[node]}, target chose {trace.target_tokens[step]}"
            )
            break
        previous = node
    if trace.target_tokens and trace.bonus != trace.target_tokens[-1]:
        problems.append(f"bonus {trace.bonus} is not the target's token {trace.target_tokens[-1]} at the last node")
    if greedy and not output_end:
        last = trace.accepted[-1] if trace.accepted else 0
        for i in range(1, n + 1):
            if trace.parents[i] == last and trace.tree_tokens[i] == trace.bonus:
                problems.append(f"walk stopped early: node {i} matches the bonus {trace.bonus}")
    return problems


def check_tree_structure(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """Every traced round keeps the rules; a tree the spec allows for its own drafter logits (up to the
    freedoms of :mod:`ddtree_conformance.spec.freedoms`) counts as the spec's; the others are diagnosed as
    a tree policy (:mod:`ddtree_conformance.tree_policy`)."""
    name = Run(mode, budget).check_id("tree-structure")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    if not caps.traced(mode):
        return CheckResult.skipped(name, f"engine gives no per-round traces in mode {mode}")
    limit = budget if mode == "ddtree" else None
    indices, results = traced_run(session, mode, budget)
    block = session.engines.info(session.engines.engine).limits.block_size  # the pair's, as integrity reads it
    found = SortedRounds()
    for prompt, result in zip([session.prompts[i] for i in indices], results):
        failure = _trace_failure(name, prompt, result, limit)
        if failure is not None:
            return failure
        found = found + sort_rounds(session, mode, budget, block, prompt, result)
    rounds, spec_rounds = found.rounds, found.spec_rounds
    if not rounds:
        if all(len(r.output_ids) <= 1 for r in results):
            return CheckResult.skipped(
                name, "every output is the prefill token alone: no round to trace", cause="input"
            )
        return CheckResult.failed(name, "engine claims traces but returned none")
    if caps.draft_logits and spec_rounds == 0:  # never claim agreement with nothing compared
        return CheckResult.failed(
            name,
            f"engine promises drafter logits (draft_logits) but no traced round of "
            f"{rounds} carries them: no tree could be compared with the spec's",
            rounds=rounds,
        )
    whole, diagnosis = diagnose_sorted(Run(mode, budget).label, found, mode, budget, block)
    details = {
        "tables": [policy_table([diagnosis])],
        "tree_policy": diagnosis.kinds,
        "off_path_rounds": found.off_path,
        "rounds": rounds,
        "spec_rounds": spec_rounds,
    }
    notes = "".join(f"; {n}" for n in whole.notes)
    if diagnosis.findings:
        first = f" (first differing: {diagnosis.first})" if diagnosis.first else ""
        return CheckResult.failed(
            name,
            f"trees are not the spec's trees ({diagnosis.source}): {diagnosis.message()}{first}",
            notes=diagnosis.notes,
            **details,
        )
    spec = (
        f"; {len(found.allowed)}/{spec_rounds} trees are the spec's tree for their drafter logits (up to its freedoms)"
        if spec_rounds
        else "; drafter logits not reported, spec-tree equality not checked"
    )
    return CheckResult.passed(
        name,
        f"{rounds} rounds well-formed{spec}; {found.off_path} rounds continued after "
        f"accepting a path off the first rows{notes}",
        **details,
    )


def _trace_failure(name: str, prompt, result, limit: int | None) -> CheckResult | None:
    """The failure of a prompt whose run errored or one of whose rounds breaks the rules, or None."""
    if result.error:
        return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
    traces = result.traces or []
    for r, trace in enumerate(traces):
        problems = trace_problems(trace, limit, output_end=r == len(traces) - 1)
        if problems:
            return CheckResult.failed(name, f"{prompt.id} round {r}: {problems[0]}", problems=problems)
    return None


def node_evidence(session: SuiteSession, budget: int) -> tuple[str, list] | None:
    """``(what, [(prompt, result), ...])``: the results whose trees the node check scores. Verified
    trees (light traces) come with every run, so every prompt of the main run; else the tree checks'
    shared traced run; None when the engine gives neither."""
    caps = session.capabilities
    if caps.verified_trees("ddtree"):
        return "verified trees of every prompt", list(zip(session.prompts, session.run("ddtree", budget)))
    if caps.traced("ddtree"):
        indices, results = traced_run(session, "ddtree", budget)
        return f"traces of {len(indices)} prompts", list(zip([session.prompts[i] for i in indices], results))
    return None


def out_of_reach(session: SuiteSession) -> tuple[str, list[str]]:
    """What a run without node-level evidence cannot see in its dtype, and the bug classes named."""
    rules = rules_for(session.settings)
    if rules.exact:
        return (
            "in float32 every output is judged exactly against the fp32 target, so a tree bug that changes an "
            "output still fails lossless; one that changes no output of this run is out of reach"
        ), ["tree-mask, node-position or KV bugs that change no output of this run"]
    classes = ["sub-noise tree-mask bugs (e.g. attention between some sibling nodes)", "sub-noise node-position bugs"]
    return (
        f"in {rules.dtype} a tree-mask or node-position bug that moves each output only within the near-tie bound "
        f"{rules.bound:.3g} (sub-noise: say, attention between some sibling nodes) passes output scoring at this "
        "evidence: emit verified trees (light traces, docs/guides/your-engine.md) for node-level evidence, or run "
        "the thorough profile (far more prompts and tokens)"
    ), classes


def check_branch_vs_chain(session: SuiteSession, budget: int) -> CheckResult:
    """Every node of every verified tree against the fp32 verify of that tree (node scoring), and a few
    root-to-leaf paths against their chain runs (an oracle with no tree mask at all)."""
    name = Run("ddtree", budget).check_id("branch-vs-chain")
    caps = session.capabilities
    if "ddtree" not in caps.modes:
        return CheckResult.skipped(name, "engine does not offer mode ddtree")
    evidence = node_evidence(session, budget)
    if evidence is None:
        why, classes = out_of_reach(session)
        return CheckResult(
            check=name,
            status="skip",
            details={"out_of_reach": classes},
            message=f"engine gives no verified trees or per-round traces in mode ddtree: no node-level evidence; {why}",
        )
    what, pairs = evidence
    s = session.settings
    for prompt, result in pairs:
        if result.error:
            return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
    items = [(prompt.id, prompt.prompt_ids, result.output_ids, rounds_of(result)) for prompt, result in pairs]
    if not any(rounds for *_, rounds in items):
        if all(len(r.output_ids) <= 1 for _, r in pairs):
            return CheckResult.skipped(name, "every output is the prefill token alone: no tree to check")
        if all(r.traces and r.verified_trees is None for _, r in pairs):
            return CheckResult.skipped(name, "traces carry no per-node target tokens")
        return CheckResult.failed(name, "engine promises per-round trees in mode ddtree but returned none to check")
    rules = rules_for(session.settings)
    scorer = shared_scorer(str(s.model_dir), "float32", s.device)
    scores = score_nodes(scorer, items, rules)
    details = {"node_evidence": what, **scores.details()}
    problem = scores.problem()
    if problem:
        return CheckResult.failed(name, problem, **details)
    chains = _chain_cross_check(session, scorer, rules, pairs)
    if chains.problem:
        return CheckResult.failed(name, chains.problem, **details)
    return CheckResult.passed(name, f"{scores.summary()} ({what}); {chains.summary}", **details)


@dataclass
class ChainVerdict:
    problem: str | None
    summary: str


def _chain_cross_check(session: SuiteSession, scorer, rules, pairs) -> ChainVerdict:
    """Up to :data:`CHAIN_LEAVES` root-to-leaf paths per round, for ``branch_rounds`` rounds of the first
    ``branch_prompts`` outputs: each node's target token against the target's choice after its
    ancestor path run as a plain causal chain (no tree mask involved)."""
    s = session.settings
    nodes = mismatches = 0
    first = None
    excused: list[float] = []
    top2_gaps: list[float] = []
    for prompt, result in pairs[: s.branch_prompts]:
        full = list(prompt.prompt_ids) + list(result.output_ids)
        for r, rnd in enumerate(rounds_of(result)[: s.branch_rounds]):
            committed = full[: len(prompt.prompt_ids) + rnd.root_index]
            children = set(rnd.parents[1:])
            leaves = [i for i in range(len(rnd.tree_tokens)) if i not in children]
            if len(leaves) > CHAIN_LEAVES:  # spread over the tree
                step = len(leaves) / CHAIN_LEAVES
                leaves = [leaves[int(k * step)] for k in range(CHAIN_LEAVES - 1)] + [leaves[-1]]
            for leaf in leaves:
                path, node = [], leaf
                while node != -1:
                    path.append(node)
                    node = rnd.parents[node]
                path.reverse()  # root .. leaf
                tail = scorer.logits(committed + [rnd.tree_tokens[i] for i in path])[len(committed) :]
                for offset, node in enumerate(path):
                    nodes += 1
                    row = tail[offset]
                    top = torch.topk(row, 2).values
                    top2_gaps.append(float(top[0] - top[1]))
                    chain_token, got = int(torch.argmax(row)), rnd.node_targets[node]
                    if chain_token == got:
                        continue
                    gap = float(top[0] - row[got]) if 0 <= got < row.shape[0] else float("inf")
                    call = rules.token(gap)
                    if call in (TokenCall.MATCH, TokenCall.FP32_TIE):
                        continue
                    if call is TokenCall.NEAR_TIE:
                        excused.append(gap)
                        continue
                    mismatches += 1
                    first = first or (prompt.id, r, node, got, chain_token, gap)
    if mismatches:
        pid, r, node, got, want, gap = first
        return ChainVerdict(
            f"{mismatches}/{nodes} node checks differ from the chain run of their ancestors; first: {pid} round {r} "
            f"node {node}: tree gives {got}, chain gives {want} ({gap:.3f} below the chain's top-1, bound "
            f"{rules.bound:.3g}); mask, positions or KV wrong",
            "",
        )
    ceiling, mu = rules.ceiling(top2_gaps)
    if len(excused) > ceiling:
        return ChainVerdict(
            f"{len(excused)}/{nodes} node checks differ from their chain runs within the near-tie "
            f"bound, above the ceiling {ceiling} (expected <= {mu:.1f}); mask, positions or KV wrong",
            "",
        )
    near = f", {len(excused)} within the near-tie bound (ceiling {ceiling})" if excused else ""
    return ChainVerdict(None, f"{nodes} node checks equal their chain runs{near}")
