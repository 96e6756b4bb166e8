"""Where the suite's files live.

The package is installed editable, so everything is resolved from this file: the repository root
is the parent of the ``conformance`` package, and ``golden/`` sits at that root.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT", "GOLDEN_DIR", "PROMPTS_DIR", "FIXTURE_DIR", "FIXTURE_TARGET", "FIXTURE_DRAFTER", "REPORTS_DIR"]

REPO_ROOT: Path = Path(__file__).resolve().parent.parent
GOLDEN_DIR: Path = REPO_ROOT / "golden"
PROMPTS_DIR: Path = GOLDEN_DIR / "prompts"
FIXTURE_DIR: Path = GOLDEN_DIR / "fixture"
FIXTURE_TARGET: Path = FIXTURE_DIR / "target"
FIXTURE_DRAFTER: Path = FIXTURE_DIR / "drafter"
# Default output folder of the CLI; relative, so reports land where the command is run.
REPORTS_DIR: Path = Path("reports")
