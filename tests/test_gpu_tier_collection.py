"""What the GPU tier (``tests/test_gpu.py``, ``-m gpu``) collects, checked on CPU: collection touches no model
and no GPU."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def test_the_gpu_tier_collects_sampling_in_float32_only_and_everything_else_in_both_dtypes():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-o", "addopts=",
         "-p", "no:cacheprovider", "--gpu-engines", "reference", str(TESTS / "test_gpu.py")],
        capture_output=True, text=True, timeout=300, cwd=TESTS.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    items = re.findall(r"test_conformance_on_cuda\[reference-(float32|bfloat16)\|([^\]]+)\]", done.stdout)
    by_dtype = {dtype: {check for d, check in items if d == dtype} for dtype in ("float32", "bfloat16")}
    sampling = {dtype: {c for c in checks if c.startswith("sampling/")} for dtype, checks in by_dtype.items()}
    assert sampling["float32"] and not sampling["bfloat16"]  # sampling once per engine, in float32; no item only skips
    assert by_dtype["bfloat16"] == by_dtype["float32"] - sampling["float32"]  # every other check in both dtypes
    assert len(items) == len(set(items))
