"""Check of the operating envelope: busy batches (context lengths are :mod:`.context_range`'s).

* busy-batch: one generate call mixing greedy and sampled requests with different lengths, stop
  tokens and limits, each compared with the same request run alone: greedy requests like the
  lossless check's (equal in float32, scored in bfloat16/float16), sampled requests equal when the
  engine's batch and solo runs agree; an engine whose sampled results depend on the batch is
  judged for them by the sampling check's distribution test, and this check says so. A sampled
  request that differs from its solo run must keep every token in the support of its own request's
  processed target distribution (its top-k and top-p, on the fp32 target along the output's own
  path, within the near-tie bound): a request sampled with another request's top-k or top-p fails
  here. The budget is one per generate call in the engine interface, so a batch cannot mix budgets.
"""

from __future__ import annotations

from ddtree_conformance.adapters.interface import Request
from ddtree_conformance.spec import SamplingParams, processed_probs

from ..run import Run
from ..session import SuiteSession
from ..token_scoring import rules_for, target_logits
from .output_comparison import GreedyCase, judge_greedy
from .result import CheckResult
from .stop_rules import stop_rule_problem

__all__ = ["busy_batch_requests", "outside_support", "check_busy_batch"]


def _label(kind: str, mode: str, budget: int | None) -> str:
    return Run(mode, budget).check_id(kind)


def busy_batch_requests(session: SuiteSession) -> tuple[list[Request], list[str]]:
    """Greedy requests of different limits (one with a stop token) interleaved with sampled ones."""
    n = min(24, session.settings.max_new_tokens)
    prompts = [p.prompt_ids for p in session.prompts[:3]]
    prompts = [prompts[i % len(prompts)] for i in range(3)]
    plain = session.plain()
    stop = plain[0].output_ids[min(3, len(plain[0].output_ids) - 1)] if plain[0].output_ids else None
    greedy = [
        Request(prompt_ids=prompts[0], max_new_tokens=n),
        Request(prompt_ids=prompts[1], max_new_tokens=max(1, n // 2 + 1)),
        Request(prompt_ids=prompts[2][: max(1, len(prompts[2]) // 2)], max_new_tokens=max(1, n // 3)),
    ]
    labels = [f"greedy request {i} (max_new_tokens {r.max_new_tokens})" for i, r in enumerate(greedy)]
    if stop is not None:
        greedy.append(Request(prompt_ids=prompts[0], max_new_tokens=n, stop_token_ids=[stop]))
        labels.append(f"greedy request 3 (stop token {stop})")
    sampled = []
    if session.capabilities.sampling:
        sampled = [
            Request(prompt_ids=prompts[1], max_new_tokens=n, temperature=1.0, seed=11),
            Request(prompt_ids=prompts[2], max_new_tokens=max(1, n // 2), temperature=0.8, top_k=5, seed=12),
            Request(prompt_ids=prompts[0], max_new_tokens=n, temperature=1.0, top_p=0.7, seed=13),
        ]
    requests, names = [], []
    for i in range(max(len(greedy), len(sampled))):  # greedy, sampled, greedy, ... so neighbours differ
        for group, group_names in ((greedy, labels), (sampled, [f"sampled request {j}" for j in range(len(sampled))])):
            if i < len(group):
                requests.append(group[i])
                names.append(group_names[i])
    return requests, names


TOP_P_SLACK = 1e-3  # nucleus computed at top_p + this: engines sum probabilities in their own order


def outside_support(session: SuiteSession, request: Request, output: list[int]) -> str | None:
    """The first sampled token of ``output`` outside its request's top-k/top-p support, or None.

    The support is that of the processed fp32 target distribution at each position of the output's
    own path (:func:`ddtree_conformance.spec.processed_probs`); a token is in it when its fp32 logit
    is at least the smallest logit of the support minus the near-tie bound (0 in float32)."""
    if request.top_k <= 0 and request.top_p >= 1.0 or not output:
        return None  # temperature alone keeps every token possible
    rules = rules_for(session.settings)
    logits_fn = target_logits(session.settings.model_dir, session.settings.device).fn
    prompt = list(request.prompt_ids)
    logits = logits_fn(prompt + list(output[:-1]))[len(prompt) - 1 :].float().cpu()
    params = SamplingParams(
        temperature=request.temperature, top_k=request.top_k, top_p=min(1.0, request.top_p + TOP_P_SLACK)
    )
    for position, (row, token) in enumerate(zip(logits, output)):
        support = processed_probs(row, params) > 0
        edge = float(row[support].min())
        if float(row[token]) < edge - rules.bound:
            rank = int((row > row[token]).sum()) + 1
            return (
                f"sampled token {token} at output position {position} is rank {rank} of the fp32 target there, "
                f"outside the request's support (top_k {request.top_k}, top_p {request.top_p}: "
                f"{int(support.sum())} tokens; {edge - float(row[token]):.3g} below its weakest, bound "
                f"{rules.bound:.3g})"
            )
    return None


def check_busy_batch(session: SuiteSession, mode: str, budget: int | None) -> CheckResult:
    name = _label("busy-batch", mode, budget)
    caps = session.capabilities
    if mode not in caps.modes:
        return CheckResult.skipped(name, f"engine does not offer mode {mode}")
    requests, labels = busy_batch_requests(session)
    batch = session.run(mode, budget, requests=requests, together=True)
    alone = [session.run(mode, budget, requests=[r], together=True)[0] for r in requests]
    greedy, sampled_equal, sampled_total = [], 0, 0
    for label, request, b, a in zip(labels, requests, batch, alone):
        if a.error or b.error:
            return CheckResult.failed(
                name,
                f"in a batch of {len(requests)} mixed requests: {label}: engine error: "
                f"{(b.error or a.error).splitlines()[0]}",
            )
        problem = stop_rule_problem(b.output_ids, b.finish_reason, request.stop_token_ids, request.max_new_tokens)
        if problem:
            return CheckResult.failed(
                name, f"in a batch of {len(requests)} mixed requests: {label}: {problem} (another request's settings?)"
            )
        if request.temperature > 0:  # equal to its solo run (own settings, same seed): nothing to doubt
            problem = None if b.output_ids == a.output_ids else outside_support(session, request, b.output_ids)
            if problem:
                return CheckResult.failed(
                    name,
                    f"in a batch of {len(requests)} mixed requests: {label}: {problem} "
                    "(another request's sampling settings?)",
                )
            sampled_total += 1
            sampled_equal += b.output_ids == a.output_ids
            continue
        greedy.append(GreedyCase(f"{label} (in the batch vs alone)", request.prompt_ids, b.output_ids, a.output_ids))
        greedy.append(GreedyCase(f"{label} (alone)", request.prompt_ids, a.output_ids))
    verdict = judge_greedy(session, greedy, what="the request alone")
    if verdict.problem:
        return CheckResult.failed(
            name, f"in a batch of {len(requests)} mixed requests: {verdict.problem}", **verdict.details
        )
    sampled = ""
    if sampled_total:
        sampled = f"; {sampled_equal}/{sampled_total} sampled requests equal alone" + (
            ""
            if sampled_equal == sampled_total
            else " (the others differ, within their own top-k/top-p support: this engine's samples depend on "
            "the batch, so they are judged by the sampling check's distribution test)"
        )
    return CheckResult.passed(
        name, f"{len(requests)} requests in one batch: greedy {verdict.summary}{sampled}", **verdict.details
    )
