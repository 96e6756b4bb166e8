"""The reference engine on the random pair: lossless, branch == chain, sampling, stops, traces.

Everything runs in fp32 on CPU, where DDTree, DFlash and plain decoding must agree token for token.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from ddtree_conformance.adapters.interface import EngineError, Request, RunConfig
from ddtree_conformance.adapters.reference.engine import ReferenceEngine

VOCAB = 97  # write_random_pair default
NEW_TOKENS = 32
BUDGETS = [1, 4, 16, 64, 256]
TOL = 1e-5


def _prompts(n: int = 20, seed: int = 2024) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, 40] + torch.randint(1, 41, (n - 2,), generator=gen).tolist()
    return [torch.randint(0, VOCAB, (length,), generator=gen).tolist() for length in lengths]


PROMPTS = _prompts()


def _requests(**kwargs) -> list[Request]:
    return [Request(prompt_ids=p, max_new_tokens=NEW_TOKENS, **kwargs) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain_results(reference_engine):
    return reference_engine.generate(_requests(), RunConfig(mode="plain"))


@pytest.fixture(scope="module")
def traced_results(reference_engine):
    """mode/budget -> results with traces, for every prompt."""
    runs = {("dflash", 0): reference_engine.generate(_requests(), RunConfig(mode="dflash", trace=True))}
    for budget in BUDGETS:
        runs[("ddtree", budget)] = reference_engine.generate(
            _requests(), RunConfig(mode="ddtree", budget=budget, trace=True)
        )
    return runs


@pytest.fixture(scope="module")
def target_model(random_pair):
    model = AutoModelForCausalLM.from_pretrained(str(random_pair[0]), dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


# ---------------------------------------------------------------------------------------------
# Lossless


def test_plain_runs_are_full_length(plain_results):
    for result in plain_results:
        assert result.finish_reason == "length"
        assert len(result.output_ids) == NEW_TOKENS
        assert result.rounds == NEW_TOKENS - 1 and result.tau == 1.0


@pytest.mark.parametrize("key", [("dflash", 0)] + [("ddtree", b) for b in BUDGETS], ids=lambda k: f"{k[0]}-{k[1]}")
def test_lossless_greedy_fp32(traced_results, plain_results, key):
    results = traced_results[key]
    assert len(results) == len(PROMPTS) >= 20
    for index, (got, want) in enumerate(zip(results, plain_results)):
        assert got.output_ids == want.output_ids, f"prompt {index} ({len(PROMPTS[index])} tokens)"
        assert got.finish_reason == "length"


def test_removed_vectorized_builder_is_refused(random_pair):
    with pytest.raises(EngineError, match="cuda_graphs must be 'on' or 'off'"):
        ReferenceEngine(str(random_pair[0]), str(random_pair[1]), cuda_graphs="maybe")


def test_budgets_accept_more(traced_results):
    """Not a conformance rule, a sanity check that the trees do something on this pair."""
    taus = {b: sum(r.tau for r in traced_results[("ddtree", b)]) / len(PROMPTS) for b in BUDGETS}
    assert taus[256] > taus[1]
    assert taus[256] > 1.2, taus


# ---------------------------------------------------------------------------------------------
# Traces


def _check_traces(prompt: list[int], result) -> None:
    traces = result.traces
    assert traces is not None and len(traces) == result.rounds == len(result.acceptance_lengths)
    full = prompt + result.output_ids
    rebuilt = [result.output_ids[0]]
    start = len(prompt)
    for r, trace in enumerate(traces):
        n = len(trace.tree_tokens)
        assert trace.start == start
        assert trace.tree_tokens[0] == trace.root_token == full[start]
        assert trace.parents[0] == -1 and trace.depths[0] == 0
        assert len(trace.parents) == len(trace.depths) == len(trace.positions) == n
        for node in range(1, n):
            assert 0 <= trace.parents[node] < node
            assert trace.depths[node] == trace.depths[trace.parents[node]] + 1
        assert trace.positions == [trace.start + d for d in trace.depths]
        previous = 0
        for node in trace.accepted:  # a path from the root
            assert trace.parents[node] == previous
            previous = node
        path = [0, *trace.accepted]
        assert len(trace.target_tokens) == len(trace.top2_margins) == len(path)
        for j, node in enumerate(trace.accepted):  # each step follows the target's token
            assert trace.tree_tokens[node] == trace.target_tokens[j]
        assert trace.bonus == trace.target_tokens[-1]
        children_tokens = {trace.tree_tokens[c] for c in range(1, n) if trace.parents[c] == path[-1]}
        assert trace.bonus not in children_tokens, "the walk stopped although a child matched"
        assert all(m >= 0 for m in trace.top2_margins)
        assert result.acceptance_lengths[r] == trace.acceptance_length == len(trace.accepted) + 1
        rebuilt += [trace.tree_tokens[node] for node in trace.accepted] + [trace.bonus]
        start += len(trace.accepted) + 1
        if r + 1 < len(traces):
            assert traces[r + 1].root_token == trace.bonus
    assert rebuilt[: len(result.output_ids)] == result.output_ids
    assert len(rebuilt) >= len(result.output_ids)
    assert 1 + sum(result.acceptance_lengths) == len(rebuilt)
    assert result.tau == pytest.approx(sum(result.acceptance_lengths) / result.rounds)


def test_traces_are_self_consistent(traced_results):
    for (mode, budget), results in traced_results.items():
        for prompt, result in zip(PROMPTS, results):
            _check_traces(prompt, result)
            for trace in result.traces:
                n = len(trace.tree_tokens) - 1
                if mode == "dflash":
                    assert trace.parents == [-1, *range(n)] and n == 7  # block size 8 -> L = 7
                else:
                    assert n == min(budget, sum(VOCAB**d for d in range(1, 8)))


# ---------------------------------------------------------------------------------------------
# Branch vs chain


def _forward(model, ids, positions, cache=None, mask=None):
    with torch.inference_mode():
        out = model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True)
    return out.logits


def _expanded_cache(model, kv, batch: int) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    for layer, (k, v) in enumerate(kv):
        cache.update(k.expand(batch, -1, -1, -1).contiguous(), v.expand(batch, -1, -1, -1).contiguous(), layer)
    return cache


def _branch_vs_chain(model, prompt, result) -> tuple[int, int, float]:
    """Check every node of every round of ``result``; returns (trees, nodes, max |diff|)."""
    full = prompt + result.output_ids
    trees = nodes = 0
    worst = 0.0
    for trace in result.traces:
        start, n = trace.start, len(trace.tree_tokens)
        prefix_cache = DynamicCache(config=model.config)
        _forward(model, torch.tensor([full[:start]]), torch.arange(start).unsqueeze(0), prefix_cache)
        kv = [(layer.keys.clone(), layer.values.clone()) for layer in prefix_cache.layers]
        # the tree verify, rebuilt from the trace with a brute-force ancestor mask
        paths = [[0]]
        for node in range(1, n):
            paths.append(paths[trace.parents[node]] + [node])
        allowed = torch.zeros(n, start + n, dtype=torch.bool)
        allowed[:, :start] = True
        for node, path in enumerate(paths):
            allowed[node, [start + j for j in path]] = True
        mask = torch.zeros(1, 1, n, start + n).masked_fill(~allowed, torch.finfo(torch.float32).min)
        tree_logits = _forward(
            model,
            torch.tensor([trace.tree_tokens]),
            torch.tensor([trace.positions]),
            _expanded_cache(model, kv, 1),
            mask,
        )[0]
        # it is the engine's own verify: same target tokens and margins along the walked path
        walked = [0, *trace.accepted]
        assert torch.argmax(tree_logits[walked], dim=-1).tolist() == trace.target_tokens
        top2 = torch.topk(tree_logits[walked], 2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).tolist() == pytest.approx(trace.top2_margins, abs=TOL)
        # every node: its ancestor path run as a plain causal chain on the same prefix cache
        by_depth: dict[int, list[int]] = {}
        for node in range(n):
            by_depth.setdefault(len(paths[node]), []).append(node)
        for length, group in by_depth.items():
            ids = torch.tensor([[trace.tree_tokens[j] for j in paths[node]] for node in group])
            positions = torch.arange(start, start + length).expand(len(group), -1)
            chain = _forward(model, ids, positions, _expanded_cache(model, kv, len(group)))[:, -1]
            diff = (chain - tree_logits[group]).abs().max().item()
            assert diff <= TOL, (trace.start, group, diff)
            worst = max(worst, diff)
        trees += 1
        nodes += n
    return trees, nodes, worst


def test_branch_outputs_equal_chain_outputs(traced_results, target_model, record_property):
    trees = nodes = 0
    worst = 0.0
    plan = [(("ddtree", 64), range(0, 4)), (("ddtree", 256), range(4, 6)), (("ddtree", 16), range(6, 8))]
    for key, indices in plan:
        for i in indices:
            t, m, w = _branch_vs_chain(target_model, PROMPTS[i], traced_results[key][i])
            trees, nodes, worst = trees + t, nodes + m, max(worst, w)
    assert trees >= 50
    record_property("branch_vs_chain", {"trees": trees, "nodes": nodes, "max_abs_diff": worst})
    print(f"branch vs chain: {trees} trees, {nodes} nodes, max |diff| {worst:.3g}")


# ---------------------------------------------------------------------------------------------
# Sampling


SAMPLING = [  # (request sampling fields, ddtree budget)
    (dict(temperature=1.0), 64),
    (dict(temperature=1.0, top_k=5), 16),
    (dict(temperature=1.0, top_p=0.8), 64),
    (dict(temperature=1.0, top_k=20, top_p=0.9), 256),
]


@pytest.mark.parametrize(
    "sampling, budget",
    SAMPLING,
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) if isinstance(s, dict) else f"B{s}",
)
def test_sampling_matches_plain_with_same_seed(reference_engine, sampling, budget):
    """The walk draws one sample per committed token from the request's generator, in order, so
    with fp32 logits that agree the tree run reproduces the plain run's samples exactly."""
    requests = [
        Request(prompt_ids=p, max_new_tokens=NEW_TOKENS, seed=1000 + i, **sampling) for i, p in enumerate(PROMPTS[:6])
    ]
    plain = reference_engine.generate(requests, RunConfig(mode="plain"))
    assert len({tuple(r.output_ids) for r in plain}) > 1
    tree = reference_engine.generate(requests, RunConfig(mode="ddtree", budget=budget))
    for i, (got, want) in enumerate(zip(tree, plain)):
        assert got.output_ids == want.output_ids, (budget, i)
    assert sum(r.tau for r in tree) / len(tree) > 1.0  # some rounds did accept sampled drafts


def test_sampling_depends_on_the_seed(reference_engine):
    requests = [Request(prompt_ids=p, max_new_tokens=16, temperature=1.0, seed=7) for p in PROMPTS[:4]]
    first = reference_engine.generate(requests, RunConfig(mode="ddtree", budget=16))
    again = reference_engine.generate(requests, RunConfig(mode="ddtree", budget=16))
    other = reference_engine.generate(
        [r.model_copy(update={"seed": 8}) for r in requests], RunConfig(mode="ddtree", budget=16)
    )
    assert [r.output_ids for r in first] == [r.output_ids for r in again]
    assert [r.output_ids for r in other] != [r.output_ids for r in first]


# ---------------------------------------------------------------------------------------------
# Stops, limits, batches


def _mid_path_positions(prompt, result):
    """(output index, round) of tokens accepted strictly inside a round's path (not its last token)."""
    found = []
    for r, trace in enumerate(result.traces):
        base = trace.start - len(prompt) + 1  # output index of the first accepted token
        for j in range(len(trace.accepted)):  # accepted[j] is followed by more tokens in this round
            found.append((base + j, r))
    return found


def test_stop_token_mid_path_truncates_right_after_it(reference_engine, traced_results, plain_results):
    cases = 0
    for i, (prompt, result) in enumerate(zip(PROMPTS, traced_results[("ddtree", 256)])):
        output = result.output_ids
        for index, r in _mid_path_positions(prompt, result):
            token = output[index]
            if token in output[:index]:
                continue  # need the token's first occurrence
            request = Request(prompt_ids=prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=[token])
            got = reference_engine.generate([request], RunConfig(mode="ddtree", budget=256, trace=True))[0]
            assert got.finish_reason == "stop"
            assert got.output_ids == plain_results[i].output_ids[: index + 1]
            assert got.rounds == r + 1
            assert sum(got.acceptance_lengths) + 1 > len(got.output_ids), "the round went past the stop"
            plain = reference_engine.generate([request], RunConfig(mode="plain"))[0]
            assert plain.output_ids == got.output_ids and plain.finish_reason == "stop"
            cases += 1
            break
        if cases >= 3:
            break
    assert cases >= 1, "no accepted path long enough to hold a stop token mid-path"


def test_stop_token_as_first_token_and_as_bonus(reference_engine, plain_results):
    prompt, output = PROMPTS[2], plain_results[2].output_ids
    for stop in (output[0], output[5]):
        request = Request(prompt_ids=prompt, max_new_tokens=NEW_TOKENS, stop_token_ids=[stop])
        got = reference_engine.generate([request], RunConfig(mode="ddtree", budget=16))[0]
        assert got.finish_reason == "stop"
        assert got.output_ids == output[: output.index(stop) + 1]


def test_max_new_tokens_reached_mid_round(reference_engine, traced_results, plain_results):
    cases = 0
    for i, (prompt, result) in enumerate(zip(PROMPTS, traced_results[("ddtree", 256)])):
        positions = _mid_path_positions(prompt, result)
        if not positions:
            continue
        index, r = positions[0]
        request = Request(prompt_ids=prompt, max_new_tokens=index + 1)
        got = reference_engine.generate([request], RunConfig(mode="ddtree", budget=256))[0]
        assert got.finish_reason == "length"
        assert got.output_ids == plain_results[i].output_ids[: index + 1]
        assert got.rounds == r + 1
        assert sum(got.acceptance_lengths) + 1 > len(got.output_ids)
        cases += 1
        if cases >= 3:
            break
    assert cases >= 1


@pytest.mark.parametrize("mode, budget", [("plain", 1), ("dflash", 1), ("ddtree", 1), ("ddtree", 64)])
def test_single_token_prompt_and_single_new_token(reference_engine, mode, budget):
    one = reference_engine.generate(
        [Request(prompt_ids=[5], max_new_tokens=NEW_TOKENS)], RunConfig(mode=mode, budget=budget)
    )[0]
    plain = reference_engine.generate([Request(prompt_ids=[5], max_new_tokens=NEW_TOKENS)], RunConfig(mode="plain"))[0]
    assert one.output_ids == plain.output_ids and len(one.output_ids) == NEW_TOKENS
    first = reference_engine.generate([Request(prompt_ids=[5], max_new_tokens=1)], RunConfig(mode=mode, budget=budget))[
        0
    ]
    assert first.output_ids == plain.output_ids[:1] and first.finish_reason == "length"
    assert first.rounds == 0


def test_batch_of_mixed_lengths_returns_results_in_order(reference_engine):
    requests = [
        Request(prompt_ids=PROMPTS[i], max_new_tokens=n)
        for i, n in zip((3, 0, 7, 1, 12), (9, 1, 32, 17, 4))  # lengths vary, so do limits
    ]
    config = RunConfig(mode="ddtree", budget=16)
    batch = reference_engine.generate(requests, config)
    single = [reference_engine.generate([r], config)[0] for r in requests]
    assert [r.output_ids for r in batch] == [r.output_ids for r in single]
    assert [len(r.output_ids) for r in batch] == [9, 1, 32, 17, 4]
    reversed_batch = reference_engine.generate(requests[::-1], config)
    assert [r.output_ids for r in reversed_batch] == [r.output_ids for r in single][::-1]
    # an invalid request gets an error result in its own slot, the others still run
    bad = Request(prompt_ids=[VOCAB + 3], max_new_tokens=4)
    mixed = reference_engine.generate([requests[0], bad, requests[1]], config)
    assert mixed[1].finish_reason == "error" and mixed[1].output_ids == []
    assert mixed[0].output_ids == single[0].output_ids and mixed[2].output_ids == single[1].output_ids
