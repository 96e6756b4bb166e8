"""The HTML report as a person sees it: headless Chromium renders the page, and the verdict banner is
the first thing on it, in its colour (PASS green, FAIL red, INCOMPLETE amber). Skipped, with the reason,
where no Chromium is installed (Debian: ``apt-get install -y chromium``; ``.ci/run`` installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_conformance.report import render_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium here (Debian: apt-get install -y chromium; .ci/run installs it)"
)
COLOURS = {"pass": (0x1A, 0x7F, 0x37), "fail": (0xCF, 0x22, 0x2E), "incomplete": (0x9A, 0x67, 0x00)}


def screenshot(html: Path, png: Path, profile: Path, size: str = "1000,420") -> Path:
    subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--hide-scrollbars",
            f"--window-size={size}",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return png


def report(status: str | None) -> dict:
    body = {
        "schema": "ddtree-conformance/check-report",
        "schema_version": 1,
        "kind": "check",
        "hardware_class": "cpu-test",
        "settings": {"engine": "my_engine:MyEngine", "pair_name": "fixture", "dtype": "float32", "device": "cpu"},
        "engine": {"spec": "my_engine:MyEngine", "name": "my-engine", "version": "1.4.0"},
        "runs": [],
        "results": [
            {
                "check": "acceptance/ddtree-B16",
                "status": "skip",
                "message": "no acceptance data",
                "cause": "engine",
                "details": {},
            }
        ],
    }
    if status:
        body["verdict"] = {"status": status, "reason": f"the {status} reason"}
    else:
        body["kind"] = "bench"  # no verdict of its own: the gate judges it
    return body


def banner_share(png: Path, colour: tuple[int, int, int]) -> float:
    """The share of the page's top band (y 30..90, x 20..300) in ``colour``: the banner's background."""
    import matplotlib.image

    image = matplotlib.image.imread(str(png))[30:90, 20:300, :3] * 255
    close = (abs(image - colour) <= 12).all(axis=-1)
    return float(close.mean())


@needs_browser
@pytest.mark.parametrize("status", ["pass", "fail", "incomplete"])
def test_the_verdict_banner_is_the_first_thing_on_the_page(status, tmp_path):
    html = tmp_path / "r.html"
    html.write_text(render_html(report(status)))
    png = screenshot(html, tmp_path / "r.png", tmp_path / "profile")
    assert banner_share(png, COLOURS[status]) > 0.6
    for other, colour in COLOURS.items():
        if other != status:
            assert banner_share(png, colour) < 0.01


@needs_browser
def test_a_report_without_a_verdict_has_no_banner(tmp_path):
    html = tmp_path / "r.html"
    html.write_text(render_html(report(None)))
    png = screenshot(html, tmp_path / "r.png", tmp_path / "profile")
    assert all(banner_share(png, colour) < 0.01 for colour in COLOURS.values())
