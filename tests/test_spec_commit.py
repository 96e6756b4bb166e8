"""Commit (ddtree_conformance.spec.commit): KV compaction on a real transformers Qwen3, feedback rows.

The compaction property: after a tree verify and any accepted path, the compacted cache gives the
same next-token logits as recomputing the committed sequence from scratch. A mutant that keeps
the first |acc| rows (bug class 3) must violate it.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from ddtree_conformance.spec.commit import compact_dynamic_cache, kept_rows, select_feedback_rows
from ddtree_conformance.spec.tree import build_tree
from ddtree_conformance.spec.verify import compile_tree

VOCAB = 61
TOL = 1e-5


@pytest.fixture(scope="module")
def tiny_qwen3():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as in real Qwen3
        head_dim=8,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = Qwen3ForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def _forward(model, ids, positions, cache=None, mask=None):
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(ids).view(1, -1),
            position_ids=torch.as_tensor(positions).view(1, -1),
            attention_mask=mask,
            past_key_values=cache,
            use_cache=cache is not None,
        )
    return out.logits[0]


def _path_to(tree, node: int) -> list[int]:
    path = []
    while node != 0:
        path.append(node)
        node = int(tree.parents[node])
    return path[::-1]


def mutant_first_rows(cache, prefix_len: int, accepted) -> None:
    """Bug class 3: keep the first |acc|+1 verify rows instead of the accepted path's rows."""
    new_length = prefix_len + 1 + len(accepted)
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :new_length]
        layer.values = layer.values[:, :, :new_length]


def run_case(model, seed: int, compact=compact_dynamic_cache):
    """One round: prefix, tree verify, commit a random path, decode one token.

    Returns ``(max |logits diff| vs recomputation, accepted path, tree verify vs scratch diff)``.
    """
    gen = torch.Generator().manual_seed(seed)
    prefix_len = int(torch.randint(1, 13, (1,), generator=gen))
    prefix = torch.randint(0, VOCAB, (prefix_len,), generator=gen)
    root = int(torch.randint(0, VOCAB, (1,), generator=gen))
    depth = int(torch.randint(1, 6, (1,), generator=gen))
    budget = int(torch.randint(2, 40, (1,), generator=gen))
    tree = build_tree(torch.randn(depth, VOCAB, generator=gen) * 2.0, budget)
    end = int(torch.randint(0, tree.num_nodes + 1, (1,), generator=gen))
    accepted = _path_to(tree, end)
    bonus = int(torch.randint(0, VOCAB, (1,), generator=gen))

    cache = DynamicCache(config=model.config)
    _forward(model, prefix, torch.arange(prefix_len), cache)
    verify = compile_tree(tree, root, prefix_len, dtype=torch.float32)
    tree_logits = _forward(model, verify.input_ids, verify.position_ids, cache, verify.attention_mask)
    assert cache.get_seq_length() == prefix_len + tree.num_nodes + 1
    compact(cache, prefix_len, accepted)
    assert cache.get_seq_length() == prefix_len + 1 + len(accepted)
    committed = prefix.tolist() + [root] + verify.input_ids[accepted].tolist()
    next_logits = _forward(model, [bonus], [len(committed)], cache)[-1]

    scratch = _forward(model, committed + [bonus], torch.arange(len(committed) + 1))
    diff = (next_logits - scratch[-1]).abs().max().item()
    # the kept verify rows are the committed sequence's own outputs (branch == chain)
    rows = kept_rows(accepted)
    tree_diff = (tree_logits[rows] - scratch[prefix_len : prefix_len + len(rows)]).abs().max().item()
    return diff, accepted, tree_diff


SEEDS = range(40)


def test_compaction_matches_recomputation(tiny_qwen3):
    worst, worst_tree, deep = 0.0, 0.0, 0
    for seed in SEEDS:
        diff, accepted, tree_diff = run_case(tiny_qwen3, seed)
        assert diff <= TOL, (seed, accepted, diff)
        assert tree_diff <= TOL, (seed, accepted, tree_diff)
        worst, worst_tree = max(worst, diff), max(worst_tree, tree_diff)
        deep += accepted != list(range(1, len(accepted) + 1))
    assert deep >= 10, "the cases must include paths that are not the first rows"
    print(f"compaction: max |diff| {worst:.3g}, tree-vs-scratch max |diff| {worst_tree:.3g}")


def test_mutant_first_rows_compaction_is_caught(tiny_qwen3):
    violated, not_first_rows = 0, 0
    for seed in SEEDS:
        diff, accepted, _ = run_case(tiny_qwen3, seed, compact=mutant_first_rows)
        if accepted == list(range(1, len(accepted) + 1)):
            assert diff <= TOL  # same rows: the mutant is harmless here
            continue
        not_first_rows += 1
        if diff > 1e-3:
            violated += 1
    assert not_first_rows > 0
    # every path that is not the first rows keeps a wrong token or a wrong position
    assert violated == not_first_rows, (violated, not_first_rows)


def test_compaction_keeps_prefix_rows_untouched(tiny_qwen3):
    model = tiny_qwen3
    cache = DynamicCache(config=model.config)
    prefix = torch.tensor([3, 14, 15, 9, 2])
    _forward(model, prefix, torch.arange(5), cache)
    before = [(layer.keys[:, :, :5].clone(), layer.values[:, :, :5].clone()) for layer in cache.layers]
    tree = build_tree(torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1)), 12)
    verify = compile_tree(tree, 7, 5)
    _forward(model, verify.input_ids, verify.position_ids, cache, verify.attention_mask)
    rows_before = [(layer.keys[:, :, 5:].clone(), layer.values[:, :, 5:].clone()) for layer in cache.layers]
    accepted = _path_to(tree, tree.num_nodes)  # the last node's path
    compact_dynamic_cache(cache, 5, accepted)
    index = torch.tensor(kept_rows(accepted))
    for layer, (k0, v0), (kv, vv) in zip(cache.layers, before, rows_before):
        assert torch.equal(layer.keys[:, :, :5], k0) and torch.equal(layer.values[:, :, :5], v0)
        assert torch.equal(layer.keys[:, :, 5:], kv.index_select(2, index))
        assert torch.equal(layer.values[:, :, 5:], vv.index_select(2, index))


def test_kept_rows_and_feedback_rows_by_node_index():
    assert kept_rows([]) == [0]
    assert kept_rows([2, 5, 9]) == [0, 2, 5, 9]
    hidden = torch.arange(2 * 10 * 3, dtype=torch.float32).view(2, 10, 3)
    picked = select_feedback_rows(hidden, [2, 5, 9])
    assert torch.equal(picked, hidden[:, [0, 2, 5, 9]])
    assert not torch.equal(picked, hidden[:, :4])  # bug class 4: not the first |acc|+1 rows
    flat = hidden[0]
    assert torch.equal(select_feedback_rows(flat, []), flat[:1])
    assert torch.equal(select_feedback_rows(flat, [1, 3]), flat[[0, 1, 3]])
