"""Jinja2 environments for the reports: HTML (autoescaped) and Markdown, templates in ``templates/``.

Templates only lay out what they are handed: a report template one
:class:`ddtree_conformance.report_view.ReportView` (rows of strings, lines, plots as base64 PNGs),
whose attributes it reads; nothing in a template computes a verdict. Undefined is strict
(``StrictUndefined``): a template reading a name or field it was not given raises
``jinja2.UndefinedError`` instead of rendering it blank.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

__all__ = ["render_html_template", "render_markdown_template", "Markup", "TEMPLATES"]

TEMPLATES = Path(__file__).parent / "templates"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cell(text: Any) -> str:
    """A Markdown table cell: one line, no column breaks."""
    return _one_line(text).replace("|", "\\|")


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _rule(head: Sequence[Any]) -> str:
    return "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"


@cache
def _environment(markdown: bool) -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=not markdown,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    if markdown:
        env.filters.update(md=_one_line, cell=_cell, mdrow=_row, mdrule=_rule)
    return env


def render_html_template(name: str, **context: Any) -> str:
    return _environment(False).get_template(name).render(**context)


def render_markdown_template(name: str, **context: Any) -> str:
    return _environment(True).get_template(name).render(**context)
