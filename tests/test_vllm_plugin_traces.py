"""Per-round acceptance from the vLLM plugin's trace rows (no vLLM needed): decode steps the
scheduler ran without a draft tree come back as rounds of length 1, where they happened."""

from __future__ import annotations

from ddtree_conformance.adapters.vllm.plugin_traces import acceptance_lengths
from ddtree_conformance.integrity import IntegrityError, _convention


def rows(*pairs):
    return [{"start": start, "accepted": list(range(1, n))} for start, n in pairs]


def test_rounds_without_gaps_are_kept():
    # prompt of 10: prefill token at 10; rounds of 3, 1, 2 commit up to position 16; output 7 tokens
    assert acceptance_lengths(rows((10, 3), (13, 1), (14, 2)), 10, 7) == ([3, 1, 2], 0)


def test_tree_less_steps_are_rounds_of_one_where_they_happened():
    # a tree-less step between the first and second rounds, two at the end (context limit)
    lengths, untraced = acceptance_lengths(rows((10, 3), (14, 2)), 10, 9)
    assert (lengths, untraced) == ([3, 1, 2, 1, 1], 3)
    _convention("acceptance_lengths", lengths, 9)  # the suite's convention holds


def test_rows_that_do_not_fit_are_left_for_integrity():
    lengths, untraced = acceptance_lengths(rows((10, 3), (12, 2)), 10, 4)  # second root inside the first round
    assert untraced == 0
    try:
        _convention("acceptance_lengths", lengths, 4)
    except IntegrityError:
        pass
    else:
        raise AssertionError("overlapping rounds must not add up")
