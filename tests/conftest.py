"""Shared fixtures for the project's own tests.

* ``random_pair``: a tiny random-weight Qwen3 target + DFlash drafter written once per session.
* ``reference_engine``: the reference engine on that pair (CPU, loaded lazily per dtype/device).
* torch runs single-threaded for the session: the models here are tiny, and intra-op threading
  on small CPU boxes made the engine tests an order of magnitude slower (OpenMP spin/contention)
  without changing any result.
"""

from __future__ import annotations

import pytest
import torch

from adapters.reference.engine import ReferenceEngine
from conformance.testing.random_pair import write_random_pair


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
