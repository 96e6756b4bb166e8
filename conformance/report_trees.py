"""Drawing the first failing round's trees for the HTML report: the reference's and the engine's,
side by side, accepted paths highlighted. Inline SVG, no external assets.

A check result carries the round in ``details["first_round"]`` (:class:`ddtree_conformance.replay.
RoundVerdict` fields): ``reference_tree`` and, when the engine traced the round, ``engine_tree``,
each ``{"tokens", "parents", "accepted"}`` with the root first. Nodes are laid out by depth (left
to right) in depth-first order (top to bottom); a node is labelled with its token.
"""

from __future__ import annotations

import html

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
    width, height = (max(depth) + 1) * _DX + 40, (max(row) + 1) * _DY + 40
    x = [20 + _R + d * _DX for d in depth]
    y = [34 + r * _DY for r in row]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="4" y="14" font-size="12" font-weight="600">{html.escape(title)}</text>']
    for node in range(1, len(tokens)):
        p = parents[node]
        on = node in path and p in path
        parts.append(f'<line x1="{x[p]}" y1="{y[p]}" x2="{x[node]}" y2="{y[node]}" '
                     f'stroke="{"#cf222e" if on else "#bbb"}" stroke-width="{3 if on else 1}"/>')
    for node, token in enumerate(tokens):
        on = node in path
        parts.append(f'<circle cx="{x[node]}" cy="{y[node]}" r="{_R}" fill="{"#ffebe9" if on else "#fff"}" '
                     f'stroke="{"#cf222e" if on else "#888"}" stroke-width="{2 if on else 1}"/>'
                     f'<text x="{x[node] + _R + 2}" y="{y[node] + 4}" font-size="10">{html.escape(str(token))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def trees_html(results: list[dict]) -> str:
    """A section drawing the first failing check's round, or "" when no failure carries one."""
    for result in results:
        first = (result.get("details") or {}).get("first_round")
        if result.get("status") != "fail" or not isinstance(first, dict) or not first.get("reference_tree"):
            continue
        esc = html.escape
        engine = first.get("engine_tree")
        right = (tree_svg(engine, "engine's tree") if engine else
                 f"<p>the engine reported no trace of this round; it committed {esc(str(first.get('engine_tokens')))}"
                 "</p>")
        return (f"<h2>First failing round</h2><p>{esc(result.get('check', '?'))}: {esc(str(first.get('prompt')))} round "
                f"{esc(str(first.get('round')))}: engine length {esc(str(first.get('engine_length')))}, reference "
                f"length {esc(str(first.get('reference_length')))}. {esc(str(first.get('note', '')))}</p>"
                '<div class="grid" style="overflow-x:auto">'
                f'<figure>{tree_svg(first["reference_tree"], "reference (fp32 replay)")}</figure>'
                f"<figure>{right}</figure></div>")
    return ""
