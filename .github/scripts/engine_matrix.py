#!/usr/bin/env python3
"""The engines this repository's GPU workflows run, and the versions pinned for them.

    python .github/scripts/engine_matrix.py >> "$GITHUB_OUTPUT"
    # engines=["reference","vllm","sglang"]
    # versions={"reference":"","vllm":"0.32.0","sglang":"0.5.23"}

The versions come from ``conformance/pins.py`` (the ``vllm`` and ``sglang`` extras of pyproject.toml),
the one place engine versions are pinned. ``gpu.yml`` (the gate) and ``regenerate.yml`` (the baselines
it reads) both take their matrix from here, so they cover the same engines at the same versions.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# engine -> (extra of pyproject.toml, distribution pinned there); the reference engine ships with the suite
ENGINES: dict[str, tuple[str, str] | None] = {
    "reference": None,
    "vllm": ("vllm", "vllm"),
    "sglang": ("sglang", "sglang"),
}


def _pins():
    spec = importlib.util.spec_from_file_location("pins", ROOT / "conformance" / "pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def versions() -> dict[str, str]:
    pins = _pins()
    return {engine: pins.pinned_version(*pinned) if pinned else "" for engine, pinned in ENGINES.items()}


def main() -> int:
    found = versions()
    compact = {"separators": (",", ":")}
    print(f"engines={json.dumps(list(found), **compact)}")
    print(f"versions={json.dumps(found, **compact)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
