"""Shared fixtures for the project's own tests.

* ``random_pair``: a tiny random-weight Qwen3 target + DFlash drafter written once per session.
* ``random_pair_settings``: settings for that pair on a fresh random prompt set
  (:func:`ddtree_conformance.testing.runs.random_pair_settings`; run a plan with ``runs.plan_and_run``).
* ``reference_engine``: the reference engine on that pair (CPU, loaded lazily per dtype/device).
* torch runs single-threaded for the session: the models here are tiny, and intra-op threading
  on small CPU boxes made the engine tests an order of magnitude slower (OpenMP spin/contention)
  without changing any result.
* GPU tier options (``--gpu-engines``, ``--gpu-limit``, ``--gpu-sampling-requests``); the suite's
  own ``--ddtree-*`` options (pair, modes, budgets, GPUs per xdist worker) come from its pytest plugin.
* bytecode cached once per run (``pytest_configure``, in the controller): where the environment sets
  ``PYTHONDONTWRITEBYTECODE`` (as CI machines like this project's do), every process the tests start
  (isolated engines, tensor-parallel ranks, CLI and pytest subprocesses) would compile the suite's
  modules from source again, seconds of CPU each; Python still reads bytecode it does not write.
* the user's reports are not the tests' (``_reports_untouched``): a test that writes into the repository's
  ``reports/`` (or the ``reports/`` of the folder pytest started in) fails, naming the files; tests write
  their reports under ``tmp_path`` (``--out``, ``--ddtree-report``, ``--reports``).
* one hypothesis profile (``ddtree``): no deadline (the first example of a test pays torch's warm-up),
  derandomized so a run is repeatable; ``HYPOTHESIS_PROFILE=dev`` explores with fresh seeds.
"""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from ddtree_conformance.adapters.reference.engine import ReferenceEngine
from ddtree_conformance.session import SuiteSettings
from ddtree_conformance.testing import runs
from ddtree_conformance.testing.random_pair import write_random_pair

settings.register_profile(
    "ddtree", deadline=None, derandomize=True, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", deadline=None, derandomize=False, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ddtree"))


def pytest_configure(config: pytest.Config) -> None:
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):  # once, before xdist starts workers
        root = Path(__file__).resolve().parent.parent
        for folder in ("conformance", "adapters", "tests"):
            compileall.compile_dir(root / folder, quiet=2)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("ddtree-gpu-tier", "GPU tier (pytest -m gpu)")
    group.addoption(
        "--gpu-engines",
        default=None,
        help="comma-separated engines the GPU tier runs the conformance plan on "
        "(default $DDTREE_GPU_ENGINES, else every registered engine)",
    )
    group.addoption(
        "--gpu-limit",
        type=int,
        default=None,
        help="prompts per engine conformance run in the GPU tier (default 20; 0: the pair's whole set)",
    )
    group.addoption(
        "--gpu-sampling-requests",
        type=int,
        default=None,
        help="seeded requests per sampling variant in the GPU tier (default 40)",
    )


REPORT_FOLDERS = sorted({Path(__file__).resolve().parent.parent / "reports", Path.cwd().resolve() / "reports"})


def _reports_state() -> dict[str, tuple[int, int] | None]:
    """Every file (size, modification time) and folder (None) under the guarded ``reports/`` folders."""
    state: dict[str, tuple[int, int] | None] = {}
    for folder in REPORT_FOLDERS:
        if not folder.exists():
            continue
        state[str(folder)] = None
        for path in folder.rglob("*"):
            try:
                st = path.stat()
            except OSError:  # removed while we looked
                continue
            state[str(path)] = None if path.is_dir() else (st.st_size, st.st_mtime_ns)
    return state


@pytest.fixture(autouse=True)
def _reports_untouched():
    """Fail a test that wrote into the user's ``reports/`` (the README's `check` writes its report there;
    a test that overwrote it turned a 20-minute PASS report into "FAIL: 2 of 2 checks failed")."""
    before = _reports_state()
    yield
    after = _reports_state()
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k, "absent") != after.get(k, "absent"))
    if changed:
        pytest.fail(
            f"this test wrote into the user's reports folder ({', '.join(map(str, REPORT_FOLDERS))}): "
            f"{', '.join(changed[:10])}; write under tmp_path instead (--out, --ddtree-report, --reports)",
            pytrace=False,
        )


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
def random_pair_settings(random_pair, tmp_path_factory):
    """``make(lengths, seed=, prefix=, **fields) -> SuiteSettings``: the random pair on random prompts of
    ``lengths`` tokens (ids ``<prefix>0``, ...), run in-process; ``fields`` set any other setting."""

    def make(lengths: list[int], *, seed: int, prefix: str, **fields) -> SuiteSettings:
        path = tmp_path_factory.mktemp(f"prompts-{prefix}") / f"{prefix}.jsonl"
        return runs.random_pair_settings(random_pair, path, lengths, seed=seed, prefix=prefix, **fields)

    return make


@pytest.fixture(scope="session")
def reference_engine(random_pair):
    target, drafter = random_pair
    engine = ReferenceEngine(str(target), str(drafter))
    yield engine
    engine.close()
