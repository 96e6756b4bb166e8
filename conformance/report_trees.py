"""Drawing the first failing round's trees for the HTML report: the reference's and the engine's,
side by side, accepted paths highlighted. Inline SVG (templates ``tree.svg.j2`` and
``first_round.html.j2``), no external assets.

A check result carries the round in ``details["first_round"]`` (:class:`ddtree_conformance.replay.
RoundVerdict` fields): ``reference_tree`` and, when the engine traced the round, ``engine_tree``,
each ``{"tokens", "parents", "accepted"}`` with the root first. Nodes are laid out by depth (left
to right) in depth-first order (top to bottom); a node is labelled with its token.
"""

from __future__ import annotations

import html

from .rendering import Markup, render_html_template

__all__ = ["tree_svg", "trees_html"]

_DX, _DY, _R = 64, 22, 9
_MAX_NODES = 1100


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


def tree_svg(tree: dict, title: str) -> str:
    """One tree as an SVG element; accepted nodes and the edges between them are highlighted."""
    tokens, parents = list(tree.get("tokens") or []), list(tree.get("parents") or [])
    if not tokens or len(tokens) != len(parents) or len(tokens) > _MAX_NODES:
        return f"<p>{html.escape(title)}: tree not drawable ({len(tokens)} nodes)</p>"
    if any(not (p == -1 if i == 0 else 0 <= p < i) for i, p in enumerate(parents)):
        return f"<p>{html.escape(title)}: parents are not a tree</p>"
    path = {0, *[n for n in tree.get("accepted") or [] if 0 <= n < len(tokens)]}
    depth, row = _layout(parents)
    x = [20 + _R + d * _DX for d in depth]
    y = [34 + r * _DY for r in row]
    edges = [
        {"x1": x[parents[n]], "y1": y[parents[n]], "x2": x[n], "y2": y[n], "on": n in path and parents[n] in path}
        for n in range(1, len(tokens))
    ]
    nodes = [{"x": x[n], "y": y[n], "on": n in path, "token": token} for n, token in enumerate(tokens)]
    return render_html_template(
        "tree.svg.j2",
        title=title,
        width=(max(depth) + 1) * _DX + 40,
        height=(max(row) + 1) * _DY + 40,
        r=_R,
        edges=edges,
        nodes=nodes,
    )


def trees_html(results: list[dict]) -> str:
    """A section drawing the first failing check's round, or "" when no failure carries one."""
    for result in results:
        first = (result.get("details") or {}).get("first_round")
        if result.get("status") != "fail" or not isinstance(first, dict) or not first.get("reference_tree"):
            continue
        engine = first.get("engine_tree")
        return render_html_template(
            "first_round.html.j2",
            check=result.get("check", "?"),
            prompt=first.get("prompt"),
            round=first.get("round"),
            engine_length=first.get("engine_length"),
            reference_length=first.get("reference_length"),
            note=first.get("note", ""),
            reference=Markup(tree_svg(first["reference_tree"], "reference (fp32 replay)")),
            engine=Markup(tree_svg(engine, "engine's tree")) if engine else None,
            engine_tokens=first.get("engine_tokens"),
        )
    return ""
