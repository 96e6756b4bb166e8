"""The executable DDTree specification: one function per step of the paper.

Read in order: :mod:`.tree` (construction), :mod:`.verify` (compile the verify batch),
:mod:`.walk` (accept), :mod:`.commit` (KV compaction, drafter feedback, emission); then
:mod:`.freedoms` (which other trees an engine may verify: numbering, ties, the output's and the
context's end).
"""

from .commit import compact_dynamic_cache, emit_tokens, kept_rows, select_feedback_rows
from .freedoms import kept_depth, least_budget, may_hold, tree_problem
from .tree import DraftTree, build_chain, build_tree, per_depth_topk
from .verify import VerifyInputs, ancestor_visibility, compile_tree
from .walk import SamplingParams, WalkResult, choose_token, processed_probs, top2_margin, walk_tree

__all__ = [
    "DraftTree",
    "SamplingParams",
    "VerifyInputs",
    "WalkResult",
    "ancestor_visibility",
    "build_chain",
    "build_tree",
    "choose_token",
    "compact_dynamic_cache",
    "compile_tree",
    "emit_tokens",
    "kept_depth",
    "least_budget",
    "may_hold",
    "kept_rows",
    "per_depth_topk",
    "processed_probs",
    "select_feedback_rows",
    "top2_margin",
    "tree_problem",
    "walk_tree",
]
