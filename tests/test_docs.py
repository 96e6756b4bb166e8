"""The documentation matches the code and the tree: links resolve, every option, exit status and
check family is documented, the README's layout table names what is there, the example reports
load, and docs/ holds user documentation only (no working notes or raw logs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_docs_hold_user_documentation_only():
    top = sorted(p.name for p in DOCS.iterdir() if p.is_file() or any(p.iterdir()))  # git keeps no empty folder
    assert top == ["README.md", "algorithm.md", "examples", "guides", "reference"], top
    notes = [p for p in DOCS.rglob("*") if re.search(r"session-note|\.log$|run\d|h200-", p.name)]
    assert not notes, f"working notes and raw logs belong in issue notes: {notes}"


def test_relative_links_resolve():
    broken = []
    for md in markdown_files():
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (md.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", resolved.read_text(), flags=re.M)}
                if anchor not in anchors:
                    broken.append(f"{md.relative_to(ROOT)}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def test_every_option_is_documented_with_both_spellings():
    from ddtree_conformance.option_names import OPTION_FLAGS, pytest_flag
    from ddtree_conformance.settings import SuiteSettings

    text = (DOCS / "reference" / "options.md").read_text()
    missing = []
    for field, flag in OPTION_FLAGS.items():
        if f"`{flag}" not in text:
            missing.append(flag)
        if field in SuiteSettings.model_fields and f"`{pytest_flag(field)}" not in text:
            missing.append(pytest_flag(field))
    assert not missing, f"docs/reference/options.md lacks {missing}"


def test_every_exit_status_is_documented():
    from ddtree_conformance.cli.base import EXIT_STATUSES

    text = (DOCS / "reference" / "exit-statuses.md").read_text()
    rows = {int(m) for m in re.findall(r"^\| (\d) \|", text, flags=re.M)}
    assert rows == set(EXIT_STATUSES)


def test_every_check_family_is_documented():
    """Each declared family has its row in the checks reference, and each row is a declared family."""
    from ddtree_conformance.checks.families import DECLARED

    text = (DOCS / "reference" / "checks.md").read_text()
    table = text[: text.index("## Tree policies")]
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines() if line.startswith("| `")}
    assert rows == {f.doc_id for f in DECLARED}


def test_readme_layout_table_names_what_is_there():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Layout") : readme.index("## Using it")]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = set()
    for row in rows:
        cell = row.split("|")[1]
        entries = re.findall(r"`([^`]+)`", cell)
        folder = ""
        for entry in entries:  # `conformance/bench.py`, `baselines.py`: later names share the first one's folder
            path = entry if "/" in entry.rstrip("/") or not folder else folder + entry
            folder = path.rsplit("/", 1)[0] + "/" if "/" in path.rstrip("/") else folder
            assert (ROOT / path).exists(), f"README layout names {path}, which does not exist"
            named.add(path.rstrip("/"))
    expected = {
        f"conformance/{p.name}"
        for p in (ROOT / "conformance").iterdir()
        if p.suffix == ".py" and p.name != "__init__.py" or (p.is_dir() and (p / "__init__.py").exists())
    }
    expected |= {
        f"adapters/{p.name}"
        for p in (ROOT / "adapters").iterdir()
        if p.suffix == ".py" and p.name != "__init__.py" or (p.is_dir() and (p / "__init__.py").exists())
    }
    expected |= {"vllm-plugin", "golden", "docs", "tests", "scripts", ".github", ".ci"}
    assert not expected - named, f"the README layout table does not name {sorted(expected - named)}"


@pytest.mark.parametrize("name", ["check-reference.json", "bench-reference.json"])
def test_example_reports_load(name):
    from ddtree_conformance.report import load_report

    report = load_report(DOCS / "examples" / name)
    assert report["kind"] in ("check", "bench")
    for suffix in (".md", ".html"):
        assert (DOCS / "examples" / name).with_suffix(suffix).is_file()


def test_the_adapter_at_the_top_of_the_engine_guide_runs_through_the_suite(tmp_path, monkeypatch, request):
    """docs/guides/your-engine.md opens with a complete ~30-line engine and a filled-in Capabilities(...);
    it runs as written, from the folder holding it, and the report names it by its own name and version."""
    import json

    from typer.testing import CliRunner

    from ddtree_conformance.cli import app

    guide = (DOCS / "guides" / "your-engine.md").read_text()
    code = re.search(r"```python\n(.*?)```", guide, flags=re.S).group(1)
    assert "Capabilities(" in code and "class MyEngine(Engine)" in code
    assert len(code.strip().splitlines()) <= 35, "the guide's first engine is meant to be read at a glance"
    (tmp_path / "my_engine.py").write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(__import__("sys").modules, "my_engine", raising=False)
    request.addfinalizer(lambda: __import__("sys").modules.pop("my_engine", None))  # not another test's module
    result = CliRunner().invoke(
        app,
        [
            "check",
            "--engine",
            "my_engine:MyEngine",
            "--limit",
            "1",
            "--budgets",
            "16",
            "--max-new-tokens",
            "8",
            "--modes",
            "ddtree",
            "--check",
            "lossless",
            "--check",
            "tree-structure",
            "--no-isolate",
            "--out",
            "r.json",
        ],
    )
    assert result.exit_code == 0, (result.output, result.exception)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["engine"] == {"spec": "my_engine:MyEngine", "name": "my-engine", "version": "1.4.0"}
    assert report["verdict"]["status"] == "pass"


def test_option_defaults_in_the_docs_are_the_settings_models():
    """docs/reference/options.md shows the defaults help text shows: the settings model's (budgets used to
    read 16,64 in the help and the docs while a run used 16,64,256)."""
    from ddtree_conformance.option_names import OPTION_FLAGS
    from ddtree_conformance.settings import SuiteSettings, shown_default

    rows = {}
    for line in (DOCS / "reference" / "options.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1].startswith("`--"):
            rows[re.findall(r"`(--[\w-]+)", cells[1])[0]] = cells[4]
    wrong = {}
    for field, flag in OPTION_FLAGS.items():
        default = shown_default(field) if field in SuiteSettings.model_fields else None
        if default is not None and flag in rows and default not in rows[flag].replace("`", ""):
            wrong[flag] = (default, rows[flag])
    assert not wrong, wrong


def test_help_shows_the_settings_models_defaults():
    from typer.testing import CliRunner

    from ddtree_conformance.cli import app
    from ddtree_conformance.pytest_plugin import _OPTIONS, _help
    from ddtree_conformance.settings import shown_default

    text = " ".join(CliRunner().invoke(app, ["check", "--help"], env={"COLUMNS": "240"}).output.split())
    assert f"[default: ({shown_default('budgets')})]" in text and shown_default("budgets") == "16,64,256"
    plugin = {field: _help(field, help_text) for field, _, help_text in _OPTIONS}
    assert "(default 16,64,256)" in plugin["budgets"] and "(default 1)" in plugin["torch_threads"]


def test_the_readme_figures_come_from_the_figures_script():
    """Every figure README.md marks equals what scripts/readme_figures.py recorded in
    scripts/measurements/readme-figures.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    figures = __import__("json").loads((ROOT / "scripts" / "measurements" / "readme-figures.json").read_text())
    assert len(module.MARKER.findall(readme)) >= 5
    assert module.differences(readme, figures) == []
    assert module.pytest_counts("..\n580 passed, 4 skipped in 231.20s (0:03:51)\n") == (
        "580 passed, 4 skipped",
        "231 s",
    )
