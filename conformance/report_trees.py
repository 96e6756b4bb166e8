"""Drawing the first failing round's trees for the HTML report: the reference's and the engine's,
side by side, accepted paths highlighted. Inline SVG (templates ``tree.svg.j2`` and
``first_round.html.j2``), no external assets.

A check result carries the round in ``details["first_round"]`` (:class:`ddtree_conformance.replay.
RoundVerdict` fields): ``reference_tree`` and, when the engine traced the round, ``engine_tree``,
each ``{"tokens", "parents", "accepted"}`` with the root first. Nodes are laid out by depth (left
to right) in depth-first order (top to bottom); a node is labelled with its token.

The two templates get one frozen view each as ``view`` and read only its attributes, as the report
templates do (:mod:`ddtree_conformance.report_view`): ``tree.svg.j2`` a :class:`TreeDrawing`,
``first_round.html.j2`` a :class:`FirstRound`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from .rendering import Markup, render_html_template

__all__ = [
    "TreeEdge",
    "TreeNode",
    "TreeDrawing",
    "FirstRound",
    "tree_drawing",
    "first_round_view",
    "tree_svg",
    "trees_html",
]

_DX, _DY, _R = 64, 22, 9
_MAX_NODES = 1100


@dataclass(frozen=True)
class TreeEdge:
    """A line from a parent's centre (``x1``, ``y1``) to its child's (``x2``, ``y2``) in SVG pixels;
    ``accepted`` when both ends are on the accepted path."""

    x1: int
    y1: int
    x2: int
    y2: int
    accepted: bool


@dataclass(frozen=True)
class TreeNode:
    """A node's centre (``x``, ``y``) in SVG pixels, its token as shown, whether it is on the accepted path."""

    x: int
    y: int
    token: str
    accepted: bool


@dataclass(frozen=True)
class TreeDrawing:
    """One tree laid out: the SVG's ``title``, size in pixels, node ``radius``, edges and nodes."""

    title: str
    width: int
    height: int
    radius: int
    edges: tuple[TreeEdge, ...]
    nodes: tuple[TreeNode, ...]


@dataclass(frozen=True)
class FirstRound:
    """The first failing check's round: where it is and what it is, every value as shown, the
    reference's tree drawn (``reference``) and the engine's (``engine``), or, when the engine traced
    no tree for the round, ``engine`` None and the tokens it committed (``engine_tokens``)."""

    check: str
    prompt: str
    round: str
    engine_length: str
    reference_length: str
    note: str
    reference: Markup
    engine: Markup | None
    engine_tokens: str


def _layout(parents: list[int]) -> tuple[list[int], list[int]]:
    """(depth, row) per node: depth-first order gives rows, children in index order."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if parent >= 0:
            children.setdefault(parent, []).append(node)
    depth, row = [0] * len(parents), [0] * len(parents)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        for child in reversed(children.get(node, [])):
            depth[child] = depth[node] + 1
            stack.append(child)
    for r, node in enumerate(order):
        row[node] = r
    return depth, row


def _undrawable(tokens: list, parents: list) -> str:
    """Why ``tokens`` and ``parents`` cannot be drawn, "" when they can."""
    if not tokens or len(tokens) != len(parents) or len(tokens) > _MAX_NODES:
        return f"tree not drawable ({len(tokens)} nodes)"
    if any(not (p == -1 if i == 0 else 0 <= p < i) for i, p in enumerate(parents)):
        return "parents are not a tree"
    return ""


def tree_drawing(tokens: list, parents: list[int], accepted: list[int], title: str) -> TreeDrawing:
    """A drawable tree (root first, ``parents[0] == -1``, every other parent before its child) laid
    out; the root and the ``accepted`` nodes, and the edges between them, are highlighted."""
    path = {0, *[n for n in accepted if 0 <= n < len(tokens)]}
    depth, row = _layout(parents)
    x = [20 + _R + d * _DX for d in depth]
    y = [34 + r * _DY for r in row]
    return TreeDrawing(
        title=title,
        width=(max(depth) + 1) * _DX + 40,
        height=(max(row) + 1) * _DY + 40,
        radius=_R,
        edges=tuple(
            TreeEdge(x[parents[n]], y[parents[n]], x[n], y[n], accepted=n in path and parents[n] in path)
            for n in range(1, len(tokens))
        ),
        nodes=tuple(TreeNode(x[n], y[n], str(token), accepted=n in path) for n, token in enumerate(tokens)),
    )


def tree_svg(tree: dict, title: str) -> str:
    """One tree as an SVG element; accepted nodes and the edges between them are highlighted."""
    tokens, parents = list(tree.get("tokens") or []), list(tree.get("parents") or [])
    problem = _undrawable(tokens, parents)
    if problem:
        return f"<p>{html.escape(title)}: {problem}</p>"
    return render_html_template("tree.svg.j2", view=tree_drawing(tokens, parents, tree.get("accepted") or [], title))


def first_round_view(result: dict) -> FirstRound | None:
    """What the page shows of ``result``'s first round; None unless it failed and carries a reference tree."""
    first = (result.get("details") or {}).get("first_round")
    if result.get("status") != "fail" or not isinstance(first, dict) or not first.get("reference_tree"):
        return None
    engine = first.get("engine_tree")
    return FirstRound(
        check=str(result.get("check", "?")),
        prompt=str(first.get("prompt")),
        round=str(first.get("round")),
        engine_length=str(first.get("engine_length")),
        reference_length=str(first.get("reference_length")),
        note=str(first.get("note", "")),
        reference=Markup(tree_svg(first["reference_tree"], "reference (fp32 replay)")),
        engine=Markup(tree_svg(engine, "engine's tree")) if engine else None,
        engine_tokens=str(first.get("engine_tokens")),
    )


def trees_html(results: list[dict]) -> str:
    """A section drawing the first failing check's round, or "" when no failure carries one."""
    for result in results:
        view = first_round_view(result)
        if view is not None:
            return render_html_template("first_round.html.j2", view=view)
    return ""
