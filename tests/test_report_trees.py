"""The HTML report draws the first failing round's trees side by side (conformance/report_trees.py)."""

from __future__ import annotations

import re

from ddtree_conformance.report import render_html
from ddtree_conformance.report_trees import tree_svg

REF = {"tokens": [9, 3, 5, 6, 8], "parents": [-1, 0, 1, 1, 2], "accepted": [1, 2]}
ENG = {"tokens": [9, 3, 6, 4], "parents": [-1, 0, 1, 0], "accepted": [1]}


def _report(first_round):
    return {
        "kind": "check",
        "settings": {},
        "runs": [],
        "results": [
            {"check": "lossless/dflash", "status": "pass", "message": "ok", "details": {}},
            {
                "check": "acceptance/ddtree-B16",
                "status": "fail",
                "message": "differs",
                "details": {"first_round": first_round},
            },
        ],
    }


def test_first_failing_round_is_drawn_side_by_side():
    page = render_html(
        _report(
            {
                "prompt": "p3",
                "round": 4,
                "engine_length": 2,
                "reference_length": 3,
                "note": "drafter",
                "reference_tree": REF,
                "engine_tree": ENG,
            }
        )
    )
    assert "<h2>First failing round</h2>" in page and "p3 round 4" in page
    assert page.count("<svg") == 2
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page


def test_accepted_path_is_highlighted():
    svg = tree_svg(REF, "reference")
    assert len(re.findall(r'stroke="#cf222e" stroke-width="3"', svg)) == 2  # root-3 and 3-5
    assert len(re.findall(r'fill="#ffebe9"', svg)) == 3  # root, 3, 5


def test_a_round_without_engine_trace_shows_the_committed_tokens():
    page = render_html(_report({"prompt": "p", "round": 0, "engine_tokens": [3, 7], "reference_tree": REF}))
    assert page.count("<svg") == 1 and "it committed [3, 7]" in page


def test_bad_trees_are_not_drawn():
    assert "not a tree" in tree_svg({"tokens": [1, 2], "parents": [-1, 5], "accepted": []}, "x")
    assert "not drawable" in tree_svg({"tokens": [], "parents": []}, "x")
