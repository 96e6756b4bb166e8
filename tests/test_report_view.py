"""The report templates read typed views (conformance/report_view.py), and nothing else.

* the example reports in docs/examples/ render to exactly the committed Markdown and HTML (the
  HTML's embedded PNGs aside: matplotlib's pixels are not the templates' business);
* a report that takes every branch of both templates renders; with any field of any view dataclass
  taken away, rendering fails (``StrictUndefined``): a template cannot read a field the view does
  not provide, and every field of the view is read by a template (``CheckRow.passed`` aside: it
  picks ``not_passed``);
* likewise the first failing round's templates (``tree.svg.j2``, ``first_round.html.j2``) and their
  views (conformance/report_trees.py): with any field taken away, one of them fails to render.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from jinja2 import UndefinedError

from ddtree_conformance import report_trees, report_view
from ddtree_conformance.rendering import Markup, render_html_template, render_markdown_template
from ddtree_conformance.report import load_report, render_html, render_markdown
from ddtree_conformance.report_trees import first_round_view, tree_drawing, tree_svg, trees_html
from ddtree_conformance.report_view import ReportView, build_html_view

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")
TREE = {"tokens": [9, 3, 5], "parents": [-1, 0, 1], "accepted": [1]}
VIEWS = [c for c in vars(report_view).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
TREE_VIEWS = [c for c in vars(report_trees).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
NOT_READ = {("CheckRow", "passed")}  # used to build not_passed, shown by no template


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_the_examples_render_to_their_committed_files(name):
    report = load_report(EXAMPLES / name)
    assert render_markdown(report) == (EXAMPLES / name).with_suffix(".md").read_text()
    html, committed = render_html(report), (EXAMPLES / name).with_suffix(".html").read_text()
    assert PNG.sub("PNG", html) == PNG.sub("PNG", committed)


def every_branch_report() -> dict:
    """A partial check report with a verdict, A/B rows, runs to plot, coverage with notes, a failing
    check with a drawn first round and a check that put a table in its details."""
    run = {"mode": "ddtree", "budget": 16, "label": "ddtree-B16", "tau": 2.5, "tau_per_response_mean": 2.4}
    run |= {"per_position": [0.9, 0.6], "histogram": {"1": 3, "2": 5}, "rounds": 8}
    first_round = {"prompt": "p1", "round": 2, "engine_length": 1, "reference_length": 2, "note": "n"}
    first_round |= {"reference_tree": TREE, "engine_tree": TREE}
    table = {"title": "Per budget", "columns": ["budget", "tau"], "rows": [[16, 2.5]], "notes": ["a note"]}
    family = {"family": "lossless", "status": "ran", "passed": 1, "failed": 1, "skipped": 0, "gaps": ["tp"]}
    return {
        "kind": "check",
        "hardware_class": "cpu-test",
        "settings": {"pair_name": "fixture", "run_seed": 7},
        "verdict": {"status": "fail", "reason": "1 check failed"},
        "partial": True,
        "counts": {"pass": 1, "fail": 1, "skip": 0, "not_run": 1},
        "runs": [run],
        "ab": {"runs": [{"label": "ddtree-B16", "estimate": 0.9, "decision": "fail"}], "order": "ABBA"},
        "coverage": {"families": [family], "reason": "tp did not run", "allow_skip_notes": ["none"]},
        "results": [
            {"check": "lossless/dflash", "status": "pass", "message": "ok", "details": {"tables": [table]}},
            {"check": "lossless/ddtree-B16", "status": "fail", "message": "x", "details": {"first_round": first_round}},
            {"check": "speed/ddtree-B16", "status": "skip", "message": "not run", "details": {"not_run": True}},
        ],
    }


@pytest.fixture(scope="module")
def full_view() -> ReportView:
    return build_html_view(every_branch_report())


def render_both(view) -> tuple[str, str]:
    return render_markdown_template("report.md.j2", view=view), render_html_template("report.html.j2", view=view)


def without(value, cls: type | None = None, name: str | None = None):
    """``value`` with every dataclass made a plain namespace, field ``name`` left out of each ``cls``."""
    if dataclasses.is_dataclass(value):
        kept = [f.name for f in dataclasses.fields(value) if not (type(value) is cls and f.name == name)]
        return SimpleNamespace(**{k: without(getattr(value, k), cls, name) for k in kept})
    if isinstance(value, tuple):
        return tuple(without(v, cls, name) for v in value)
    return value


def test_the_full_report_takes_every_branch(full_view):
    markdown, html = render_both(full_view)
    for shown in ("## FAIL", "Partial report", "**A/B throughput**", "**Coverage**", "did not pass** (2)"):
        assert shown in markdown
    for shown in ('id="verdict"', "Partial report", "<h2>A/B", "<h2>Summary", "<h2>Coverage", "tp did not run"):
        assert shown in html
    for shown in ("<h2>Plots", "First failing round", "Per budget: lossless/dflash (pass)", "a note", "<h2>Checks"):
        assert shown in html
    assert render_both(without(full_view)) == (markdown, html)  # the namespaces stand in for the views


@pytest.mark.parametrize(
    "cls, name",
    [(c, f.name) for c in VIEWS for f in dataclasses.fields(c) if (c.__name__, f.name) not in NOT_READ],
    ids=lambda x: x.__name__ if isinstance(x, type) else x,
)
def test_a_template_cannot_read_a_field_the_view_lacks(full_view, cls, name):
    missing = without(full_view, cls, name)
    failed = []
    for render, template in ((render_markdown_template, "report.md.j2"), (render_html_template, "report.html.j2")):
        try:
            render(template, view=missing)
        except UndefinedError as e:
            failed.append(str(e))
    assert failed, f"no template read {cls.__name__}.{name}: render without it went through"
    assert all(name in message for message in failed)


def test_views_are_frozen(full_view):
    assert all(c.__dataclass_params__.frozen for c in VIEWS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        full_view.title = "changed"  # type: ignore[misc]
    assert isinstance(full_view.first_round, Markup) and full_view.first_round


def tree_renders() -> list[tuple[str, object]]:
    """The tree templates with views that between them take every branch: a drawing with accepted and
    other nodes and edges, a first round with the engine's tree and one with only its tokens."""
    failing = every_branch_report()["results"][1]
    untraced = {**failing["details"]["first_round"], "engine_tree": None, "engine_tokens": [3, 7]}
    return [
        ("tree.svg.j2", tree_drawing(TREE["tokens"], TREE["parents"], TREE["accepted"], "a tree")),
        ("first_round.html.j2", first_round_view(failing)),
        ("first_round.html.j2", first_round_view({**failing, "details": {"first_round": untraced}})),
    ]


def test_the_tree_views_are_what_the_page_draws():
    (_, drawing), (_, traced), (_, untraced) = tree_renders()
    assert render_html_template("tree.svg.j2", view=drawing) == tree_svg(TREE, "a tree")
    assert render_html_template("first_round.html.j2", view=traced) == trees_html(every_branch_report()["results"])
    assert traced.engine and untraced.engine is None
    assert "it committed [3, 7]" in render_html_template("first_round.html.j2", view=untraced)
    assert {type(d.accepted) for d in (*drawing.nodes, *drawing.edges)} == {bool}
    assert {d.accepted for d in drawing.nodes} == {d.accepted for d in drawing.edges} == {True, False}
    for template, view in tree_renders():  # the namespaces stand in for the views
        assert render_html_template(template, view=without(view)) == render_html_template(template, view=view)
    assert all(c.__dataclass_params__.frozen for c in TREE_VIEWS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        drawing.width = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls, name",
    [(c, f.name) for c in TREE_VIEWS for f in dataclasses.fields(c)],
    ids=lambda x: x.__name__ if isinstance(x, type) else x,
)
def test_a_tree_template_cannot_read_a_field_the_view_lacks(cls, name):
    failed = []
    for template, view in tree_renders():
        try:
            render_html_template(template, view=without(view, cls, name))
        except UndefinedError as e:
            failed.append(str(e))
    assert failed, f"no tree template read {cls.__name__}.{name}: render without it went through"
    assert all(name in message for message in failed)
