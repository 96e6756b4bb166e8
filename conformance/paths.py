"""Where the suite's shipped data lives, found through ``importlib.resources``.

The data package ``ddtree_conformance.golden`` (the repository's ``golden/`` folder) holds the
fixture pair, the prompt sets, the golden files, the calibration and the baselines. A source
checkout (editable install) and an installed wheel resolve it the same way, so nothing here
assumes a repository around the package.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "GOLDEN_DIR",
    "PROMPTS_DIR",
    "FIXTURE_DIR",
    "FIXTURE_TARGET",
    "FIXTURE_DRAFTER",
    "RECORDS_DIR",
    "BASELINES_DIR",
    "REPORTS_DIR",
]

# The data package is a plain folder on disk (never a zip): the models in it are opened by path.
DATA_DIR: Path = Path(str(files("ddtree_conformance.golden")))
GOLDEN_DIR: Path = DATA_DIR
PROMPTS_DIR: Path = DATA_DIR / "prompts"
FIXTURE_DIR: Path = DATA_DIR / "fixture"
FIXTURE_TARGET: Path = FIXTURE_DIR / "target"
FIXTURE_DRAFTER: Path = FIXTURE_DIR / "drafter"
RECORDS_DIR: Path = DATA_DIR / "records"
BASELINES_DIR: Path = DATA_DIR / "baselines"
# Default output folder of the CLI; relative, so reports land where the command is run.
REPORTS_DIR: Path = Path("reports")
