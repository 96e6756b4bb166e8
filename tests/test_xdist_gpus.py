"""One pytest-xdist worker per GPU: the worker -> GPU mapping (pure) and the hooks, end to end on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ddtree_conformance.xdist_gpus import (
    WORKERINPUT_KEY,
    auto_workers,
    parse_visible_devices,
    pin_worker,
    scope_of,
    selects_gpu_tier,
    visible_gpus,
    worker_devices,
    worker_index,
)


def test_worker_index():
    assert [worker_index(w) for w in ("gw0", "gw7", "gw12")] == [0, 7, 12]
    with pytest.raises(ValueError, match="not a pytest-xdist worker id: 'master'"):
        worker_index("master")


@pytest.mark.parametrize(
    "value,expected",
    [(None, None), ("", []), ("-1", []), ("0", ["0"]), ("2, 3", ["2", "3"]), ("GPU-a1,GPU-b2", ["GPU-a1", "GPU-b2"])],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    "devices,per_worker,expected",
    [
        (["0", "1"], 1, [["0"], ["1"], ["0"], ["1"]]),  # more workers than GPUs: round-robin
        (["0", "1", "2", "3"], 2, [["0", "1"], ["2", "3"], ["0", "1"], ["2", "3"]]),
        (["5", "7"], 1, [["5"], ["7"], ["5"], ["7"]]),  # CUDA_VISIBLE_DEVICES given: its entries
        (["0", "1", "2"], 2, [["0", "1"], ["0", "1"], ["0", "1"], ["0", "1"]]),  # a spare GPU stays unused
        (["0"], 2, [["0"], ["0"], ["0"], ["0"]]),  # fewer GPUs than asked: all of them
        ([], 1, [[], [], [], []]),
    ],
)
def test_worker_devices(devices, per_worker, expected):
    assert [worker_devices(i, devices, per_worker) for i in range(4)] == expected


def test_worker_devices_rejects_bad_input():
    with pytest.raises(ValueError, match="GPUs per worker must be >= 1"):
        worker_devices(0, ["0"], 0)
    with pytest.raises(ValueError, match="worker index must be >= 0"):
        worker_devices(-1, ["0"], 1)


def test_auto_workers():
    assert [auto_workers(n, 1) for n in (0, 1, 2, 8)] == [1, 1, 2, 8]
    assert [auto_workers(n, 2) for n in (1, 2, 4, 5)] == [1, 1, 2, 2]


@pytest.mark.parametrize(
    "expr,expected",
    [
        ("gpu", True),
        ("gpu and not slow", True),
        ("not gpu", False),
        ("", False),
        (None, False),
        ("slow", False),
        ("gpu or vllm", True),
    ],
)
def test_selects_gpu_tier(expr, expected):
    assert selects_gpu_tier(expr) is expected


def test_scope_of_groups_by_the_id_prefix():
    gpu = "tests/test_gpu.py::"  # the module; a group is "<engine>-<dtype>" before the "|" of the id
    assert scope_of(f"{gpu}test_c[reference-float32|lossless/dflash]") == f"{gpu}reference-float32"
    assert scope_of(f"{gpu}test_c[reference-float32|sampling/dflash/T=1]") == f"{gpu}reference-float32"
    assert scope_of(f"{gpu}test_b[16]") == f"{gpu}test_b[16]"  # no group: itself
    assert scope_of(f"{gpu}test_w") == f"{gpu}test_w"


def test_visible_gpus_prefers_cuda_visible_devices():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}, count=lambda: 8) == ["3", "1"]
    assert visible_gpus({}, count=lambda: 2) == ["0", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=lambda: 2) == []


def _config(workerinput=None, per_worker=None):
    config = SimpleNamespace(
        getoption=lambda name, default=None: per_worker if name == "--gpus-per-worker" else default
    )
    if workerinput is not None:
        config.workerinput = workerinput
    return config


def test_pin_worker_sets_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert pin_worker(_config()) is None  # not a worker: untouched
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"
    assert pin_worker(_config({"workerid": "gw1", WORKERINPUT_KEY: "1"})) == "1"  # the controller's choice
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert pin_worker(_config({"workerid": "gw1"})) == "6"  # derived from the inherited environment
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"


# An engine repository's own test tree: nothing of the suite in it; the pinning ships with the
# installed suite's pytest plugin.
PROJECT_CONFTEST = """
def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU")
"""

PROJECT_TEST = """
import os
from pathlib import Path

import pytest

@pytest.mark.gpu
@pytest.mark.parametrize("i", range(6), ids=[f"g{i % 2}|{i}" for i in range(6)])
def test_record(i):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    (Path(os.environ["RECORD_DIR"]) / f"{worker}-{i}").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
"""


def test_xdist_auto_starts_one_worker_per_gpu_slot_and_pins_it(tmp_path):
    """Four fake GPUs (a fake nvidia-smi), two per worker: `-n auto` starts 2 workers, on 0,1 and 2,3."""
    pytest.importorskip("xdist")
    project, bin_dir, records = tmp_path / "project", tmp_path / "bin", tmp_path / "records"
    for folder in (project, bin_dir, records):
        folder.mkdir()
    (project / "conftest.py").write_text(PROJECT_CONFTEST)
    (project / "test_record.py").write_text(PROJECT_TEST)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: Fake H200 (UUID: GPU-{i})'\n" for i in range(4)))
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTEST_XDIST_WORKER")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", RECORD_DIR=str(records))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-n",
            "auto",
            "-m",
            "gpu",
            "--ddtree-gpus-per-worker",
            "2",
            "-v",
            str(project),
        ],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = {path.name.split("-")[0]: path.read_text() for path in records.iterdir()}
    assert seen == {"gw0": "0,1", "gw1": "2,3"}
    workers_of = {
        g: {p.name.split("-")[0] for p in records.iterdir() if int(p.name.split("-")[1]) % 2 == g} for g in (0, 1)
    }
    assert all(len(w) == 1 for w in workers_of.values()), workers_of  # one group, one worker
    assert "GPU per xdist worker" in result.stdout
    assert "gw0: CUDA_VISIBLE_DEVICES=0,1 -> CUDA not used" in result.stdout
    assert "gw1: CUDA_VISIBLE_DEVICES=2,3 -> CUDA not used" in result.stdout
    # Not the GPU tier and no --ddtree-engine: another project's xdist run keeps its environment.
    for path in records.iterdir():
        path.unlink()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-n",
            "2",
            "-m",
            "not slow",
            "-q",
            str(project),
        ],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert {path.read_text() for path in records.iterdir()} == {"unset"}
