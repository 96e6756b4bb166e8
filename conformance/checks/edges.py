"""Check 7: stops and edges.

* a stop token inside an accepted path: nothing is emitted after it;
* max_new_tokens reached mid-round;
* prompts of length 1 and near the context limit; a batch of mixed lengths;
* a real token equal to the mask id, and token id 0 drafted (synthetic edge pair whose greedy
  output is 0, MASK, 0, MASK ... and whose drafter proposes exactly those).
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Request

from ..session import SuiteSession
from ..synthetic import edge_table, write_bigram_pair
from .output_comparison import first_divergence
from .result import CheckResult

__all__ = ["check_stops", "check_lengths", "check_prompt_shapes", "check_special_tokens"]


def _label(kind: str, mode: str, budget: int | None) -> str:
    return f"{kind}[{mode}{'' if budget is None else f',B={budget}'}]"


def _mismatch(expected: list[int], got: list[int]) -> str:
    pos = first_divergence(expected, got)
    return f"at output token {pos}: expected {expected[pos:pos + 4]}, got {got[pos:pos + 4]}"


def _preconditions(session: SuiteSession, name: str, mode: str) -> CheckResult | None:
    if mode not in session.capabilities.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    if not session.exact:
        return CheckResult.skipped(name, "edge cases are compared exactly, in float32 only")
    return None


def check_stops(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """A stop token chosen from inside the plain output, so it lands mid-round for a good drafter."""
    name = _label("stop-token", mode, budget)
    if skip := _preconditions(session, name, mode):
        return skip
    cases = []
    for prompt, plain in list(zip(session.prompts, session.plain()))[:6]:
        if len(plain.output_ids) < 8:
            continue
        stop = plain.output_ids[5]
        cut = plain.output_ids.index(stop) + 1
        cases.append((prompt, stop, plain.output_ids[:cut]))
    if not cases:
        return CheckResult.skipped(name, "no plain output is long enough to place a stop token")
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=session.settings.max_new_tokens,
                        stop_token_ids=[stop]) for p, stop, _ in cases]
    results = session.run(mode, budget, requests=requests)
    for (prompt, stop, expected), result in zip(cases, results):
        if result.output_ids != expected or result.finish_reason != "stop":
            return CheckResult.failed(
                name, f"{prompt.id}, stop token {stop}: output must end right after it, "
                      f"{_mismatch(expected, result.output_ids)}, finish_reason {result.finish_reason}")
    return CheckResult.passed(name, f"{len(cases)} prompts stop right after the stop token")


def check_lengths(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """max_new_tokens that end mid-round: output is the plain output's prefix, finish 'length'."""
    name = _label("max-new-tokens", mode, budget)
    if skip := _preconditions(session, name, mode):
        return skip
    prompts = session.prompts[:3]
    limits = [1, 2, 3, 5, 11]
    plain = session.plain()[: len(prompts)]
    requests = [Request(prompt_ids=p.prompt_ids, max_new_tokens=n) for p in prompts for n in limits]
    results = session.run(mode, budget, requests=requests)
    for i, result in enumerate(results):
        prompt, n = prompts[i // len(limits)], limits[i % len(limits)]
        expected = plain[i // len(limits)].output_ids[:n]
        if result.output_ids != expected or (len(expected) == n and result.finish_reason != "length"):
            return CheckResult.failed(name, f"{prompt.id}, max_new_tokens {n}: {_mismatch(expected, result.output_ids)}"
                                            f", finish_reason {result.finish_reason}")
    return CheckResult.passed(name, f"limits {limits} on {len(prompts)} prompts give the plain prefix")


def check_prompt_shapes(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """Length-1 prompt, a prompt near the context limit, and a batch of mixed lengths."""
    name = _label("prompt-shapes", mode, budget)
    if skip := _preconditions(session, name, mode):
        return skip
    n_new = 16
    base = [p.prompt_ids for p in session.prompts[:3]]
    cases = {"length-1 prompt": [base[0][:1]], "mixed-length batch": [base[0][:3], base[1], base[2][:7]]}
    limit = session.capabilities.max_context
    notes = []
    if limit:
        long = (base[0] * (limit // len(base[0]) + 1))[: limit - n_new]
        cases["prompt near the context limit"] = [long]
    else:
        notes.append("context limit unknown, near-limit prompt not run")
    for label, prompts in cases.items():
        requests = [Request(prompt_ids=ids, max_new_tokens=n_new) for ids in prompts]
        plain = session.run("plain", requests=requests)
        spec = session.run(mode, budget, requests=requests)
        if label == "mixed-length batch":  # each request alone must give the same as in the batch
            alone = [session.run(mode, budget, requests=[r])[0] for r in requests]
            for i, (a, b) in enumerate(zip(alone, spec)):
                if a.output_ids != b.output_ids:
                    return CheckResult.failed(name, f"{label}: request {i} differs alone vs in the batch, "
                                                    f"{_mismatch(a.output_ids, b.output_ids)}")
        for i, (p, s) in enumerate(zip(plain, spec)):
            if p.error or s.error:
                return CheckResult.failed(name, f"{label}: engine error: {(p.error or s.error).splitlines()[0]}")
            if p.output_ids != s.output_ids:
                return CheckResult.failed(name, f"{label}: request {i} differs from plain, "
                                                f"{_mismatch(p.output_ids, s.output_ids)}")
    return CheckResult.passed(name, ", ".join(cases) + " match plain" + ("; " + "; ".join(notes) if notes else ""))


def check_special_tokens(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    """Token 0 drafted and real tokens equal to the mask id (synthetic edge pair)."""
    name = _label("token-0-and-mask-id", mode, budget)
    if skip := _preconditions(session, name, mode):
        return skip
    table = edge_table()
    mask = table.shape[0] - 1
    pair_dir = session.scratch / "bigram-edges"
    if not (pair_dir / "PAIR.json").exists():
        write_bigram_pair(pair_dir, table, drafter="echo")
    engine = session.engine_for(str(pair_dir / "target"), str(pair_dir / "drafter"))
    requests = [Request(prompt_ids=[3, 5], max_new_tokens=24), Request(prompt_ids=[0], max_new_tokens=17)]
    expected = []
    for r in requests:  # the table's greedy chain, known without running anything
        seq = list(r.prompt_ids)
        for _ in range(r.max_new_tokens):
            seq.append(int(table[seq[-1]].argmax()))
        expected.append(seq[len(r.prompt_ids):])
    results = session.run(mode, budget, requests=requests, engine=engine)
    for r, want, got in zip(requests, expected, results):
        if got.error:
            return CheckResult.failed(name, f"engine error: {got.error.splitlines()[0]}")
        if got.output_ids != want:
            dropped = got.output_ids.count(mask) < want.count(mask)
            hint = " (mask-id tokens dropped from the output?)" if dropped else ""
            return CheckResult.failed(name, f"prompt {r.prompt_ids}: {_mismatch(want, got.output_ids)}{hint}")
    if mode == "plain":
        return CheckResult.passed(name, "outputs with token 0 and the mask id are exact")
    # Acceptance must match the reference: a tree that loses token-0 nodes stays lossless but slower.
    reference = session.reference_for(str(pair_dir / "target"), str(pair_dir / "drafter"))
    ref = session.run(mode, budget, requests=requests, engine=reference)
    if session.capabilities.per_round_acceptance:
        for r, a, b in zip(requests, results, ref):
            if a.acceptance_lengths != b.acceptance_lengths:
                return CheckResult.failed(
                    name, f"prompt {r.prompt_ids}: acceptance {a.acceptance_lengths[:6]} vs reference "
                          f"{b.acceptance_lengths[:6]}: nodes with token 0 or the mask id lost from the tree?")
    return CheckResult.passed(name, "outputs with token 0 and the mask id exact; acceptance equals the reference")
