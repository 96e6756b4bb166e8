"""Tables a check puts in its result for the HTML report (the tree-policy table, for one).

A check result may carry ``details["tables"]``: a list of ``{"title", "columns", "rows", "notes"}``
(rows: lists of strings, one per column). The report shows each under its check, in the order the
results come; nothing here knows what a table means.
"""

from __future__ import annotations

import html

__all__ = ["detail_tables_html"]


def detail_tables_html(results: list[dict]) -> str:
    """One section with every check's tables; empty when no result carries one."""
    esc = html.escape
    parts = []
    for result in results:
        for table in (result.get("details") or {}).get("tables") or []:
            columns, rows = list(table.get("columns") or []), list(table.get("rows") or [])
            if not columns or not rows:
                continue
            parts.append(
                f"<h3>{esc(str(table.get('title', 'Table')))}: {esc(str(result.get('check', '?')))} "
                f"({esc(str(result.get('status', '?')))})</h3>"
            )
            parts.append("<table><tr>" + "".join(f"<th>{esc(str(c))}</th>" for c in columns) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows]
            parts.append("</table>")
            notes = table.get("notes") or []
            if notes:
                parts.append('<ul class="meta">' + "".join(f"<li>{esc(str(n))}</li>" for n in notes) + "</ul>")
    return "<h2>Tables from the checks</h2>\n" + "\n".join(parts) if parts else ""
