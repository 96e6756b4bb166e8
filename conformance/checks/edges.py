"""Check 7: stops and edges.

* a stop token inside an accepted path: nothing is emitted after it;
* max_new_tokens reached mid-round;
* prompts of length 1 and near the context limit; a batch of mixed lengths;
* a real token equal to the mask id, and token id 0 drafted (synthetic edge pair whose greedy
  output is 0, MASK, 0, MASK ... and whose drafter proposes exactly those).

Outputs are judged like the lossless check's (:func:`~.output_comparison.judge_greedy`): equal to
the plain output in float32, scored against the fp32 target in bfloat16/float16; the stop and
length rules hold exactly in every dtype. Small runs (one prompt, one new token) run what applies;
a case that needs more is left out and named, and a check left with nothing skips with the reason.
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Request

from ..model_limits import context_claim
from ..option_names import option
from ..run import Run
from ..session import SuiteSession
from ..synthetic import edge_table, write_bigram_pair
from ..token_scoring import rules_for, table_logits
from .acceptance_rounds import ReplayAgainst, RoundsUnderTest, judge_per_round
from .output_comparison import GreedyCase, judge_greedy, mismatch
from .result import CheckResult
from .stop_rules import stop_rule_problem

__all__ = ["check_stops", "check_lengths", "check_prompt_shapes", "check_special_tokens"]

LIMITS = [1, 2, 3, 5, 11]
STOP_INDEX = 5  # the stop token is the plain output's 6th token, so it lands mid-round


def _label(kind: str, mode: str, budget: int | None) -> str:
    return Run(mode, budget).check_id(kind)


def _offered(session: SuiteSession, name: str, mode: str) -> CheckResult | None:
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    return None


def check_stops(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """A stop token chosen from inside the plain output, so it lands mid-round for a good drafter."""
    name = _label("stop-token", mode, budget)
    if skip := _offered(session, name, mode):
        return skip
    cases = []
    for prompt, plain in list(zip(session.prompts, session.plain()))[:6]:
        if plain.error or len(plain.output_ids) < 2:
            continue
        stop = plain.output_ids[min(STOP_INDEX, len(plain.output_ids) - 1)]
        cut = plain.output_ids.index(stop) + 1
        cases.append((prompt, stop, plain.output_ids[:cut]))
    if not cases:
        return CheckResult.skipped(
            name,
            "no plain output has two tokens or more to place a stop token in "
            f"(max_new_tokens {session.settings.max_new_tokens})",
            cause="input",
        )
    n = session.settings.max_new_tokens
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=n, stop_token_ids=[stop]) for p, stop, _ in cases]
    results = session.run(mode, budget, requests=requests)
    greedy, reached = [], 0
    for (prompt, stop, expected), result in zip(cases, results):
        if result.error:
            return CheckResult.failed(name, f"engine error on {prompt.id}: {result.error.splitlines()[0]}")
        problem = stop_rule_problem(result.output_ids, result.finish_reason, [stop], n)
        if problem:
            return CheckResult.failed(
                name,
                f"{prompt.id}, stop token {stop}: output must end right after it: "
                f"{problem} ({mismatch(expected, result.output_ids, 'plain up to the stop')})",
            )
        reached += result.finish_reason == "stop"
        greedy.append(GreedyCase(f"{prompt.id} (stop {stop})", prompt.prompt_ids, result.output_ids, expected))
    verdict = judge_greedy(session, greedy, what="plain up to the stop")
    if verdict.problem:
        return CheckResult.failed(name, f"stop token: {verdict.problem}", **verdict.details)
    if not reached:
        return CheckResult.skipped(
            name,
            f"no output reached its stop token ({len(cases)} diverged from plain before "
            f"it): the stop rule was not exercised",
        )
    return CheckResult.passed(
        name, f"{reached}/{len(cases)} prompts stop right after the stop token; {verdict.summary}", **verdict.details
    )


def check_lengths(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """max_new_tokens that end mid-round: exactly that many tokens, finish 'length', the plain prefix."""
    name = _label("max-new-tokens", mode, budget)
    if skip := _offered(session, name, mode):
        return skip
    prompts = session.prompts[:3]
    plain = session.plain()[: len(prompts)]
    limits = [n for n in LIMITS if n <= session.settings.max_new_tokens]
    left_out = [n for n in LIMITS if n not in limits]
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=n) for p in prompts for n in limits]
    results = session.run(mode, budget, requests=requests)
    cases = []
    for i, result in enumerate(results):
        prompt, n = prompts[i // len(limits)], limits[i % len(limits)]
        source = plain[i // len(limits)]
        if result.error or source.error:
            return CheckResult.failed(
                name, f"engine error on {prompt.id}: {(result.error or source.error).splitlines()[0]}"
            )
        problem = stop_rule_problem(result.output_ids, result.finish_reason, [], n)
        expected = source.output_ids[:n]
        if problem:
            return CheckResult.failed(
                name,
                f"{prompt.id}, max_new_tokens {n}: {problem} ({mismatch(expected, result.output_ids, 'plain prefix')})",
            )
        cases.append(GreedyCase(f"{prompt.id} (max_new_tokens {n})", prompt.prompt_ids, result.output_ids, expected))
    verdict = judge_greedy(session, cases, what="the plain prefix")
    if verdict.problem:
        return CheckResult.failed(name, f"max_new_tokens: {verdict.problem}", **verdict.details)
    note = (
        f" (limits {left_out} exceed {option('max_new_tokens')} {session.settings.max_new_tokens})" if left_out else ""
    )
    return CheckResult.passed(
        name, f"limits {limits} on {len(prompts)} prompts: {verdict.summary}{note}", **verdict.details
    )


def check_prompt_shapes(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """Length-1 prompt, a prompt near the context limit, and a batch of mixed lengths."""
    name = _label("prompt-shapes", mode, budget)
    if skip := _offered(session, name, mode):
        return skip
    n_new = min(16, session.settings.max_new_tokens)
    base = [p.prompt_ids for p in session.prompts[:3]]
    pick = [base[i % len(base)] for i in range(3)]  # a one-prompt run reuses it, cut to other lengths
    cases = {
        "length-1 prompt": [pick[0][:1]],
        "mixed-length batch": [pick[0][:3], pick[1], pick[2][:7] if len(pick) > 2 else pick[2][:2]],
    }
    claim = context_claim(session)
    if claim.problem:
        return CheckResult.failed(name, claim.problem, **claim.details())
    limit = claim.limit
    notes = [claim.note()] if claim.untested else []
    if limit and limit > n_new + 1:
        long = (pick[0] * (limit // len(pick[0]) + 1))[: limit - n_new]
        cases["prompt near the context limit"] = [long]
    else:
        notes.append("context limit unknown, near-limit prompt not run")
    greedy = []
    for label, prompts in cases.items():
        requests = [Request(prompt_ids=ids, max_new_tokens=n_new) for ids in prompts]
        batch = label == "mixed-length batch"  # each request alone must give the same as in the batch
        plain = session.run("plain", requests=requests, together=batch)
        spec = session.run(mode, budget, requests=requests, together=batch)
        if batch:
            alone = [session.run(mode, budget, requests=[r], together=True)[0] for r in requests]
            for i, (a, b) in enumerate(zip(alone, spec)):
                greedy.append(
                    GreedyCase(
                        f"{label} request {i} (in the batch vs alone)",
                        requests[i].prompt_ids,
                        b.output_ids,
                        a.output_ids,
                        error=a.error or b.error,
                    )
                )
        for i, (p, s) in enumerate(zip(plain, spec)):
            greedy.append(
                GreedyCase(
                    f"{label} request {i}", requests[i].prompt_ids, s.output_ids, p.output_ids, error=p.error or s.error
                )
            )
            greedy.append(GreedyCase(f"{label} request {i} (plain)", requests[i].prompt_ids, p.output_ids))
    verdict = judge_greedy(session, greedy, what="plain")
    if verdict.problem:
        return CheckResult.failed(name, verdict.problem, **verdict.details, **claim.details())
    return CheckResult.passed(
        name,
        ", ".join(cases) + f": {verdict.summary}" + ("; " + "; ".join(notes) if notes else ""),
        **verdict.details,
        **claim.details(),
    )


def check_special_tokens(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """Token 0 drafted and real tokens equal to the mask id (synthetic edge pair)."""
    name = _label("token-0-and-mask-id", mode, budget)
    if skip := _offered(session, name, mode):
        return skip
    table = edge_table()
    mask = table.shape[0] - 1
    pair_dir = session.scratch / "bigram-edges"
    if not (pair_dir / "PAIR.json").exists():
        write_bigram_pair(pair_dir, table, drafter="echo")
    target, drafter = str(pair_dir / "target"), str(pair_dir / "drafter")
    engine = session.engine_for(target, drafter)
    requests = [Request(prompt_ids=[3, 5], max_new_tokens=24), Request(prompt_ids=[0], max_new_tokens=17)]
    expected = []
    for r in requests:  # the table's greedy chain, known without running anything
        seq = list(r.prompt_ids)
        for _ in range(r.max_new_tokens):
            seq.append(int(table[seq[-1]].argmax()))
        expected.append(seq[len(r.prompt_ids) :])
    results = session.run(mode, budget, requests=requests, engine=engine)
    rules = rules_for(session.settings)
    top2 = table.topk(2, dim=-1).values
    exact = bool(((top2[:, 0] - top2[:, 1]) > rules.bound).all())  # every table gap is beyond the bound
    cases = [
        GreedyCase(f"prompt {r.prompt_ids}", r.prompt_ids, got.output_ids, want, error=got.error)
        for r, want, got in zip(requests, expected, results)
    ]
    verdict = judge_greedy(
        session,
        cases,
        logits_fn=table_logits(table, "edges"),
        rules=rules,
        what="the table's greedy chain",
        compare_low_precision=exact,
    )
    if verdict.problem:
        dropped = any(got.output_ids.count(mask) < want.count(mask) for want, got in zip(expected, results))
        hint = " (mask-id tokens dropped from the output?)" if dropped else ""
        return CheckResult.failed(name, f"{verdict.problem}{hint}", **verdict.details)
    if not session.capabilities.per_round(mode):
        return CheckResult.passed(
            name, "outputs with token 0 and the mask id are right; engine reports no per-round acceptance to compare"
        )
    # Acceptance must match the reference: a tree that loses token-0 nodes stays lossless but slower.
    missing = [r.prompt_ids for r, got in zip(requests, results) if got.acceptance_lengths is None]
    if missing:
        return CheckResult.failed(
            name, f"engine promises per-round acceptance but returned none for prompt {missing[0]}"
        )
    rounds = RoundsUnderTest([f"prompt {r.prompt_ids}" for r in requests], requests, results)
    against = ReplayAgainst(target, drafter, table_logits(table, "edges"), use_golden=False)
    replay = judge_per_round(session, name, Run(mode, budget), rounds, against, engine=engine)
    if replay.status == "fail":
        return CheckResult.failed(
            name, f"{replay.message}: nodes with token 0 or the mask id lost from the tree?", **replay.details
        )
    return CheckResult.passed(name, f"outputs with token 0 and the mask id right; {replay.message}")
