"""Run reports: JSON + Markdown + self-contained HTML, for bench and check runs."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from ddtree_conformance.cli import app
from ddtree_conformance.report import ReportError, load_report, render_html, render_markdown, write_report


def bench_report() -> dict:
    def run(mode, budget, tau, median):
        label = mode if budget is None else f"{mode}-B{budget}"
        return {
            "mode": mode,
            "budget": budget,
            "label": label,
            "tau": tau,
            "tau_per_response_mean": tau,
            "per_position": [0.9, 0.6, 0.3],
            "histogram": {"1": 3, "2": 4, "4": 2},
            "rounds": 9,
            "tokens": 30,
            "tokens_per_s": [10.0] * 5,
            "speedup": {
                "median": median,
                "ci_low": median - 0.1,
                "ci_high": median + 0.1,
                "confidence": 0.95,
                "resamples": 2000,
                "samples": [median] * 5,
                "cv": 0.03,
            },
        }

    return {
        "schema": "ddtree-conformance/run-report",
        "schema_version": 1,
        "kind": "bench",
        "created": "2026-01-01T00:00:00+00:00",
        "hardware_class": "cpu-test",
        "environment": {"torch": "x"},
        "settings": {
            "engine": "reference",
            "pair_name": "fixture",
            "dtype": "float32",
            "device": "cpu",
            "prompt_set": "fixture",
            "limit": 2,
            "max_new_tokens": 8,
        },
        "bench": {
            "repeats": 5,
            "interleaving": "rotated",
            "timing_basis": "prefill+decode",
            "ci": "95%",
            "tau_definition": "pooled",
        },
        "runs": [
            {
                "mode": "plain",
                "budget": None,
                "label": "plain",
                "tau": 1.0,
                "per_position": [],
                "histogram": {},
                "tokens_per_s": [5.0] * 5,
            },
            run("dflash", None, 2.5, 1.6),
            run("ddtree", 16, 3.1, 1.9),
            run("ddtree", 64, 3.6, 2.1),
        ],
    }


def assert_self_contained(text: str, plots: int = 4) -> None:
    if plots:
        assert '<img alt="tau vs budget" src="data:image/png;base64,' in text
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"', text)) == plots
    markup = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)
    assert not re.search(r"(https?:)?//|\burl\(", markup)
    assert "<link" not in text and "<script" not in text


def test_write_report_three_files(tmp_path):
    paths = write_report(bench_report(), tmp_path / "out" / "bench")
    assert [p.name for p in paths] == ["bench.json", "bench.md", "bench.html"]
    assert load_report(paths[0])["runs"][2]["budget"] == 16
    md = paths[1].read_text()
    assert "| ddtree-B64 | 3.600 |" in md and "2.100x [2.000, 2.200]" in md
    assert_self_contained(paths[2].read_text())
    assert oct(paths[2].stat().st_mode & 0o777) == "0o644"


def test_html_without_throughput_or_runs_has_no_placeholder_panels():
    report = bench_report()
    report["kind"] = "check"
    for run in report["runs"]:
        run.pop("speedup", None)
    assert "no throughput measured" not in render_markdown(report)
    page = render_html(report)
    assert_self_contained(page, plots=3)  # tau, per-position, histogram: no empty speedup panel
    assert "speedup vs budget" not in page and "no throughput" not in page
    report["runs"] = []
    page = render_html(report)
    assert_self_contained(page, plots=0)
    assert "<h2>Plots</h2>" not in page


def test_load_report_names_file_and_field(tmp_path):
    path = tmp_path / "r.json"
    report = bench_report()
    del report["runs"][1]["tau"]
    path.write_text(json.dumps(report))
    with pytest.raises(ReportError, match=r"r\.json: field 'runs\.1\.tau'"):
        load_report(path)
    report = bench_report()
    report["schema_version"] = 99
    path.write_text(json.dumps(report))
    with pytest.raises(ReportError, match="schema_version"):
        load_report(path)


def test_check_writes_three_files_with_acceptance_runs(tmp_path):
    from ddtree_conformance.testing.random_pair import write_random_pair

    target, drafter = write_random_pair(tmp_path / "pair")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "category": "math", "prompt_ids": [1, 2, 3, 4]}\n')
    out = tmp_path / "check.json"
    result = CliRunner().invoke(
        app,
        [
            str(a)
            for a in (
                "check",
                "--model",
                target,
                "--drafter",
                drafter,
                "--prompts",
                prompts,
                "--pair-name",
                "random",
                "--golden-dir",
                tmp_path / "golden",
                "--max-new-tokens",
                "6",
                "--budgets",
                "4",
                "--check",
                "lossless",
                "--no-isolate",
                "--out",
                out,
            )
        ],
    )
    assert result.exit_code == 0, result.output
    report = load_report(out)
    assert report["schema"] == "ddtree-conformance/check-report" and report["counts"]["pass"] == 2
    assert [r["label"] for r in report["runs"]] == ["dflash", "ddtree-B4"]
    assert out.with_suffix(".md").is_file()
    html = out.with_suffix(".html").read_text()
    assert "lossless/ddtree-B4" in html and 'src="data:image/png;base64,' in html


def test_html_for_an_engine_without_acceptance_data_renders():
    """Runs whose tau is None (no acceptance data reported) used to crash the plots (NoneType.__format__)."""
    report = bench_report()
    report["kind"] = "check"
    report["runs"] = [
        {
            "mode": m,
            "budget": b,
            "label": label,
            "tau": None,
            "tau_per_response_mean": None,
            "per_position": [],
            "histogram": {},
            "rounds": 0,
            "aggregate_only": True,
        }
        for m, b, label in (("dflash", None, "dflash"), ("ddtree", 16, "ddtree-B16"))
    ]
    text = render_html(report)
    assert_self_contained(text, plots=0)
    assert "<tr><td>ddtree-B16</td><td>-</td>" in text
    assert "| ddtree-B16 | - |" in render_markdown(report)
