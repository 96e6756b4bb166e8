"""Shared fixtures for the project's own tests.

* ``random_pair``: a tiny random-weight Qwen3 target + DFlash drafter written once per session.
* ``reference_engine``: the reference engine on that pair (CPU, loaded lazily per dtype/device).
* torch runs single-threaded for the session: the models here are tiny, and intra-op threading
  on small CPU boxes made the engine tests an order of magnitude slower (OpenMP spin/contention)
  without changing any result.
* GPU tier options (``--gpu-engines``, ``--gpu-limit``, ``--gpu-sampling-requests``,
  ``--gpus-per-worker``) and, with
  pytest-xdist, one worker per GPU (:mod:`conformance.testing.xdist_gpus`): ``pytest -m gpu -n auto``
  starts a worker per visible GPU and sets each worker's ``CUDA_VISIBLE_DEVICES`` before CUDA starts.
"""

from __future__ import annotations

import pytest
import torch

from adapters.reference.engine import ReferenceEngine
from conformance.testing.random_pair import write_random_pair
from conformance.testing.xdist_gpus import GPUS_PER_WORKER_ENV, XdistGpuPlugin


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("ddtree-gpu-tier", "GPU tier (pytest -m gpu)")
    group.addoption("--gpu-engines", default=None,
                    help="comma-separated engines the GPU tier runs the conformance plan on "
                         "(default $DDTREE_GPU_ENGINES, else every registered engine)")
    group.addoption("--gpu-limit", type=int, default=None,
                    help="prompts per engine conformance run in the GPU tier (default 20; 0: the pair's whole set)")
    group.addoption("--gpu-sampling-requests", type=int, default=None,
                    help="seeded requests per sampling variant in the GPU tier (default 40)")
    group.addoption("--gpus-per-worker", type=int, default=None,
                    help=f"GPUs per pytest-xdist worker (default ${GPUS_PER_WORKER_ENV}, else 1); "
                         "-n auto in the GPU tier starts GPUs // this many workers")
    # Registered here, before xdist sizes `-n auto` and before any worker touches CUDA.
    pluginmanager.register(XdistGpuPlugin(), "ddtree-xdist-gpus")


@pytest.fixture(scope="session", autouse=True)
def _single_threaded_torch():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory):
    """``(target_dir, drafter_dir)`` of the random test pair (vocab 97, block size 8)."""
    target, drafter = write_random_pair(tmp_path_factory.mktemp("random_pair"))
    return target, drafter


@pytest.fixture(scope="session")
def reference_engine(random_pair):
    target, drafter = random_pair
    engine = ReferenceEngine(str(target), str(drafter))
    yield engine
    engine.close()
