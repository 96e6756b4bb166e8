#!/usr/bin/env python3
"""The example reports in docs/examples/, and their screenshots in headless Chromium.

* ``check-reference.*``: written by ``scripts/readme_figures.py --only check`` (the same run the
  README quotes); left alone here unless ``--check`` asks for a run;
* every example's Markdown and HTML re-rendered from its stored JSON with today's templates
  (``bench-reference.*`` comes from an earlier bench of the reference engine);
* ``check-no-ddtree.*``: ``check`` of an engine whose capabilities drop DDTree, under ``--modes ddtree``
  (INCOMPLETE, exit 7);
* ``ab-slow-verify.*`` (``--ab``): ``bench --against reference`` of the slow mutant ``SlowVerify``
  (every tree verify ``verify_slowdown`` slower), judged by its throughput ratio;
* ``*-screenshot.png``: each HTML report as headless Chromium shows it (1200 x 1400).

    python scripts/example_reports.py            # re-render, the incomplete example, screenshots
    python scripts/example_reports.py --ab       # also the A/B example (a few minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ddtree_conformance.report import load_report, write_report

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SUITE = [sys.executable, "-m", "ddtree_conformance"]


def screenshot(html: Path, png: Path) -> None:
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print(f"no Chromium here: {png.name} not taken (Debian: apt-get install -y chromium)")
        return
    with tempfile.TemporaryDirectory(prefix="ddtree-chromium-") as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--hide-scrollbars",
                "--window-size=1200,1400",
                f"--screenshot={png}",
                html.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"wrote {png.relative_to(ROOT)}")


def run(args: list[str]) -> int:
    print("$ ddtree-conformance " + " ".join(args[3:]), flush=True)
    return subprocess.run(args, cwd=ROOT).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ab", action="store_true", help="also run the A/B example")
    parser.add_argument("--check", action="store_true", help="also run the full check example")
    args = parser.parse_args()
    for stored in sorted(EXAMPLES.glob("*.json")):
        write_report(load_report(stored), stored)
        print(f"re-rendered {stored.with_suffix('.md').name}, {stored.with_suffix('.html').name}")
    if args.check:
        run([*SUITE, "check", "--out", str(EXAMPLES / "check-reference.json")])
    code = run(
        [
            *SUITE,
            "check",
            "--engine",
            "ddtree_conformance.testing.coverage_engines:NoDDTree",
            "--modes",
            "ddtree",
            "--limit",
            "2",
            "--budgets",
            "16",
            "--max-new-tokens",
            "16",
            "--out",
            str(EXAMPLES / "check-no-ddtree.json"),
        ]
    )
    print(f"check-no-ddtree: exit {code}")
    if args.ab:
        code = run(
            [
                *SUITE,
                "bench",
                "--engine",
                "ddtree_conformance.testing.slow_engines:SlowVerify",
                "-O",
                "verify_slowdown=0.5",
                "--against",
                "reference",
                "--modes",
                "ddtree",
                "--budgets",
                "16",
                "--limit",
                "5",
                "--max-new-tokens",
                "32",
                "--max-repeats",
                "12",
                "--time-budget",
                "300",
                "--out",
                str(EXAMPLES / "ab-slow-verify.json"),
            ]
        )
        print(f"ab-slow-verify: exit {code}")
    for html, png in (
        ("check-reference.html", "check-report-screenshot.png"),
        ("bench-reference.html", "bench-report-screenshot.png"),
        ("check-no-ddtree.html", "check-no-ddtree-screenshot.png"),
        ("ab-slow-verify.html", "ab-report-screenshot.png"),
    ):
        if (EXAMPLES / html).is_file():
            screenshot(EXAMPLES / html, EXAMPLES / png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
