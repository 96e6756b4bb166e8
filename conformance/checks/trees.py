"""Checks 4 and 5: tree structure on traces, spec-tree equality, and branch vs chain."""

from __future__ import annotations

import torch

from ddtree_conformance.adapters.interface import RoundTrace
from ddtree_conformance.spec import build_chain, build_tree

from ..session import SuiteSession
from ..token_scoring import rules_for
from ..run import Run
from .result import CheckResult

__all__ = ["MAX_LEAVES", "TRACED_PROMPTS", "traced_run", "trace_problems", "check_tree_structure",
           "check_branch_vs_chain"]

MAX_LEAVES = 48  # root-to-leaf chains run per round (every leaf of trees up to about B=64)
# Prompts of the traced runs: structural bugs show in every round, so ~20 prompts (some 250 rounds,
# spread over the prompt set's categories) have the power of 80, at a quarter of the cost of
# carrying every round's drafter logits back from the engine.
TRACED_PROMPTS = 20


def traced_run(session: SuiteSession, mode: str, budget: int | None):
    """``(prompt indices, results)`` of the one traced run per (mode, budget) that the tree checks
    share (and the acceptance check reads to explain a differing round): every k-th prompt."""
    caps = session.capabilities
    bundled = len(session.inputs.bundled)
    step = max(1, bundled // TRACED_PROMPTS)
    indices = list(range(0, bundled, step))[:TRACED_PROMPTS] + list(range(bundled, len(session.prompts)))
    requests = session.requests()
    results = session.run(mode, budget, trace=True, trace_draft_logits=caps.draft_logits,
                          requests=[requests[i] for i in indices])
    return indices, results


def trace_problems(trace: RoundTrace, budget: int | None, greedy: bool = True) -> list[str]:
    """Every way one round's trace breaks the DDTree rules (doc §3); empty when it is fine."""
    problems: list[str] = []
    n = len(trace.tree_tokens) - 1
    if not (len(trace.parents) == len(trace.depths) == len(trace.positions) == n + 1):
        return [f"trace arrays differ in length ({len(trace.tree_tokens)}, {len(trace.parents)}, "
                f"{len(trace.depths)}, {len(trace.positions)})"]
    if budget is not None and n > budget:
        problems.append(f"tree has {n} nodes, more than the budget {budget}")
    if trace.parents[0] != -1 or trace.depths[0] != 0:
        problems.append("root must have parent -1 and depth 0")
    if trace.tree_tokens[0] != trace.root_token:
        problems.append(f"verify batch starts with {trace.tree_tokens[0]}, not the root token {trace.root_token}")
    seen: dict[tuple[int, int], int] = {}
    for i in range(1, n + 1):
        parent = trace.parents[i]
        if not 0 <= parent < i:
            problems.append(f"node {i} has parent {parent}: parents must precede children (prefix-closed)")
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
            problems.append(f"accepted node {node} has token {trace.tree_tokens[node]}, target chose "
                            f"{trace.target_tokens[step]}")
            break
        previous = node
    if trace.target_tokens and trace.bonus != trace.target_tokens[-1]:
        problems.append(f"bonus {trace.bonus} is not the target's token {trace.target_tokens[-1]} at the last node")
    if greedy:
        last = trace.accepted[-1] if trace.accepted else 0
        for i in range(1, n + 1):
            if trace.parents[i] == last and trace.tree_tokens[i] == trace.bonus:
                problems.append(f"walk stopped early: node {i} matches the bonus {trace.bonus}")
    return problems


def _spec_device(device: str) -> str:
    """Rebuild spec trees on the run's device kind: CPU and CUDA log-softmax differ in low bits, and
    bf16/fp16 drafter logits tie often, so a tie broken by one bit would otherwise differ."""
    if device.split(":", 1)[0] == "cuda" and torch.cuda.is_available():
        return device
    return "cpu"


def _spec_tree_problem(trace: RoundTrace, mode: str, budget: int | None, device: str = "cpu") -> str | None:
    logits = torch.tensor(trace.draft_logits, dtype=torch.float32, device=_spec_device(device))
    tree = build_chain(logits) if mode == "dflash" else build_tree(logits, budget)
    got = (trace.tree_tokens[1:], trace.parents, trace.depths)
    want = (tree.tokens[1:].tolist(), tree.parents.tolist(), tree.depths.tolist())
    if got != want:
        return (f"tree differs from the spec's tree for its own drafter logits "
                f"({len(got[0])} nodes vs spec {len(want[0])}; first tokens {got[0][:6]} vs {want[0][:6]})")
    return None


def check_tree_structure(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = Run(mode, budget).check_id("tree-structure")
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    if not caps.traced(mode):
        return CheckResult.skipped(name, f"engine gives no per-round traces in mode {mode}")
    limit = budget if mode == "ddtree" else None
    indices, results = traced_run(session, mode, budget)
    rounds = 0
    for prompt, result in zip([session.prompts[i] for i in indices], results):
        if result.error:
            return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
        for r, trace in enumerate(result.traces or []):
            rounds += 1
            problems = trace_problems(trace, limit)
            if trace.draft_logits is not None:
                problem = _spec_tree_problem(trace, mode, budget, session.settings.device)
                problems += [problem] if problem else []
            if problems:
                return CheckResult.failed(name, f"{prompt.id} round {r}: {problems[0]}", problems=problems)
    if rounds == 0:
        if all(len(r.output_ids) <= 1 for r in results):
            return CheckResult.skipped(name, "every output is the prefill token alone: no round to trace",
                                         cause="input")
        return CheckResult.failed(name, "engine claims traces but returned none")
    spec = "; trees equal the spec's" if caps.draft_logits else "; drafter logits not reported, spec-tree equality not checked"
    return CheckResult.passed(name, f"{rounds} rounds well-formed{spec}")


def check_branch_vs_chain(session: SuiteSession, budget: int) -> CheckResult:
    """Every node's target token equals the target's choice after its ancestor path as a chain."""
    name = Run("ddtree", budget).check_id("branch-vs-chain")
    caps = session.capabilities
    if "ddtree" not in caps.modes:
        return CheckResult.skipped(name, "engine does not offer mode ddtree")
    if not caps.traced("ddtree"):
        return CheckResult.skipped(name, "engine gives no per-round traces in mode ddtree")
    s = session.settings
    from ..scorer import shared_scorer

    scorer = shared_scorer(str(s.model_dir), "float32", s.device)
    rules = rules_for(session.settings)
    indices, results = traced_run(session, "ddtree", budget)
    nodes = mismatches = 0
    first = None
    excused: list[float] = []
    top2_gaps: list[float] = []
    for prompt, result in list(zip([session.prompts[i] for i in indices], results))[: s.branch_prompts]:
        if result.error:
            return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
        full = list(prompt.prompt_ids) + list(result.output_ids)
        for r, trace in enumerate((result.traces or [])[: s.branch_rounds]):
            if trace.node_target_tokens is None:
                return CheckResult.skipped(name, "traces carry no per-node target tokens")
            committed = full[: trace.start]
            children = {p for p in trace.parents[1:]}
            leaves = [i for i in range(len(trace.tree_tokens)) if i not in children]
            if len(leaves) > MAX_LEAVES:  # large budgets: leaves spread over the tree, each path a chain run
                step = len(leaves) / MAX_LEAVES
                leaves = [leaves[int(k * step)] for k in range(MAX_LEAVES - 1)] + [leaves[-1]]
            for leaf in leaves:
                path, node = [], leaf
                while node != -1:
                    path.append(node)
                    node = trace.parents[node]
                path.reverse()  # root .. leaf
                logits = scorer.logits(committed + [trace.tree_tokens[i] for i in path])
                tail = logits[len(committed) :]
                for offset, node in enumerate(path):
                    nodes += 1
                    row = tail[offset]
                    top = torch.topk(row, 2).values
                    top2_gaps.append(float(top[0] - top[1]))
                    chain_token, got = int(torch.argmax(row)), trace.node_target_tokens[node]
                    if chain_token == got:
                        continue
                    # the tree's token must itself be within the bound of the chain's top-1
                    gap = float(top[0] - row[got]) if 0 <= got < row.shape[0] else float("inf")
                    if not rules.exact and gap <= rules.bound:
                        excused.append(gap)
                        continue
                    mismatches += 1
                    first = first or (prompt.id, r, node, got, chain_token, gap)
    if nodes == 0:
        if all(len(r.output_ids) <= 1 for r in results[: s.branch_prompts]):
            return CheckResult.skipped(name, "every output is the prefill token alone: no tree to check",
                                         cause="input")
        return CheckResult.failed(name, "engine promises per-round traces in mode ddtree but returned none to check")
    if mismatches:
        pid, r, node, got, want, gap = first
        return CheckResult.failed(
            name,
            f"{mismatches}/{nodes} node checks differ from the chain run of their ancestors; first: {pid} round {r} "
            f"node {node}: tree gives {got}, chain gives {want} ({gap:.3f} below the chain's top-1, bound "
            f"{rules.bound:.3g}); mask, positions or KV wrong",
        )
    ceiling, mu = rules.ceiling(top2_gaps)
    if len(excused) > ceiling:
        return CheckResult.failed(name, f"{len(excused)}/{nodes} node checks differ from their chain runs within the "
                                        f"near-tie bound, above the ceiling {ceiling} (expected <= {mu:.1f}); mask, "
                                        "positions or KV wrong")
    near = f", {len(excused)} within the near-tie bound (ceiling {ceiling})" if excused else ""
    return CheckResult.passed(name, f"{nodes} node checks equal their chain runs{near}")
