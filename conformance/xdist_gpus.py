"""One pytest-xdist worker per GPU: which GPUs each worker gets, and the hooks that pin them.

``pytest -m gpu -n auto`` starts one worker per visible GPU (``--ddtree-gpus-per-worker N``, or
``$DDTREE_GPUS_PER_WORKER``, gives each worker N GPUs and starts ``GPUs // N`` workers, for
tensor-parallel runs). Before a worker configures anything, its ``CUDA_VISIBLE_DEVICES`` is set to
its own GPUs, so CUDA (in the worker and in the engine processes it spawns) sees only those.

The controller decides the mapping (:func:`worker_devices`, a pure function of the worker index,
the visible GPUs and the GPUs per worker) and sends it to each worker in ``workerinput``; a worker
started without it (another controller) derives the same mapping from its environment. More
workers than GPU slots share GPUs round-robin. Workers report what they saw back to the controller,
which prints one line per worker at the end of the run. In the GPU tier, tests whose id reads
``GROUP|rest`` run on one worker per GROUP (:func:`scope_of`), so an engine session is built once.

:class:`XdistGpuPlugin` holds the xdist hooks; the suite's pytest plugin registers it. It acts only
in GPU runs (``-m gpu``) or conformance runs (``--ddtree-engine``): other projects' xdist runs in an
environment where the suite is installed are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

__all__ = [
    "GPUS_PER_WORKER_ENV",
    "worker_index",
    "parse_visible_devices",
    "worker_devices",
    "auto_workers",
    "selects_gpu_tier",
    "scope_of",
    "GROUP_SEPARATOR",
    "visible_gpus",
    "XdistGpuPlugin",
    "pin_worker",
    "report_worker",
]

GPUS_PER_WORKER_ENV = "DDTREE_GPUS_PER_WORKER"
WORKERINPUT_KEY = "ddtree_cuda_visible_devices"
WORKEROUTPUT_KEY = "ddtree_gpu_report"
GROUP_SEPARATOR = "|"


def worker_index(worker_id: str) -> int:
    """``"gw3"`` -> 3 (pytest-xdist's worker ids)."""
    match = re.fullmatch(r"gw(\d+)", worker_id.strip())
    if not match:
        raise ValueError(f"not a pytest-xdist worker id: {worker_id!r} (expected gw<N>)")
    return int(match.group(1))


def parse_visible_devices(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list; None when unset (all GPUs), [] when set empty or -1."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",") if item.strip()]
    if items and items[0] == "-1":
        return []
    return items


def worker_devices(index: int, devices: list[str], per_worker: int = 1) -> list[str]:
    """The GPUs of worker ``index``: slot ``index mod (len(devices) // per_worker)`` of ``per_worker`` GPUs."""
    if index < 0:
        raise ValueError(f"worker index must be >= 0, got {index}")
    if per_worker < 1:
        raise ValueError(f"GPUs per worker must be >= 1, got {per_worker}")
    if not devices:
        return []
    slots = max(1, len(devices) // per_worker)
    slot = index % slots
    return list(devices[slot * per_worker : (slot + 1) * per_worker])


def auto_workers(n_devices: int, per_worker: int = 1) -> int:
    """Workers for ``-n auto`` in the GPU tier: one per slot of ``per_worker`` GPUs (at least 1)."""
    return max(1, n_devices // max(1, per_worker))


def selects_gpu_tier(markexpr: str | None) -> bool:
    """Whether ``-m markexpr`` selects tests marked only ``gpu`` (``-m gpu``, ``-m "gpu and not slow"``)."""
    if not markexpr or not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression

        return bool(Expression.compile(markexpr).evaluate(lambda name, **kwargs: name == "gpu"))
    except Exception:  # pytest internals moved, or an expression pytest itself will reject
        return re.search(r"(?<!not )\bgpu\b", markexpr) is not None


def scope_of(nodeid: str) -> str:
    """The unit a GPU-tier worker takes whole: ``GROUP`` of a test id ``name[GROUP|rest]``, else the test.

    Tests of one group share an engine session (the pair loaded on the GPU, memoised runs), so the
    GPU tier keeps a group on one worker: ``tests/test_gpu.py::test_x[reference-float32|lossless/dflash]``
    -> ``tests/test_gpu.py::reference-float32``. (xdist's ``--dist loadgroup`` would do this with marks,
    but it renames node ids in a way pytest 9.2 no longer honours.)
    """
    head, bracket, params = nodeid.partition("[")
    if bracket and GROUP_SEPARATOR in params:
        return f"{head.split('::', 1)[0]}::{params.split(GROUP_SEPARATOR, 1)[0]}"
    return nodeid


def _count_gpus() -> int:
    """GPUs on this machine without initialising CUDA in this process (nvidia-smi, else NVML via torch)."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def visible_gpus(environ: dict | None = None, count=_count_gpus) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries."""
    environ = os.environ if environ is None else environ
    listed = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    if listed is not None:
        return listed
    return [str(i) for i in range(count())]


def _per_worker(config: pytest.Config) -> int:
    value = config.getoption("ddtree_gpus_per_worker", None) or os.environ.get(GPUS_PER_WORKER_ENV) or 1
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"--ddtree-gpus-per-worker / ${GPUS_PER_WORKER_ENV} must be an integer, got {value!r}")
    if value < 1:
        raise pytest.UsageError(f"--ddtree-gpus-per-worker / ${GPUS_PER_WORKER_ENV} must be >= 1, got {value}")
    return value


def _selects_unmarked(markexpr: str | None) -> bool:
    if not markexpr or not markexpr.strip():
        return True
    try:
        from _pytest.mark.expression import Expression

        return bool(Expression.compile(markexpr).evaluate(lambda name, **kwargs: False))
    except Exception:
        return True


def _applies(config: pytest.Config) -> bool:
    """Pin GPUs only in the GPU tier (``-m gpu``: gpu tests, not unmarked ones) or a conformance run
    (``--ddtree-engine``)."""
    markexpr = config.getoption("markexpr", "")
    gpu_tier = selects_gpu_tier(markexpr) and not _selects_unmarked(markexpr)
    return gpu_tier or bool(config.getoption("ddtree_engine", None))


class XdistGpuPlugin:
    """The hooks: pin each xdist worker's GPUs, size ``-n auto`` in the GPU tier, report per worker.

    The xdist hooks are optional, so the plugin registers with or without pytest-xdist installed.
    """

    def __init__(self) -> None:
        self._devices: list[str] | None = None
        self.pinned: str | None = None
        self.reports: dict[str, dict] = {}

    def _controller_devices(self) -> list[str]:
        if self._devices is None:
            self._devices = visible_gpus()
        return self._devices

    # -- both sides --------------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        if _applies(config):
            self.pinned = pin_worker(config)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.pinned is not None:
            report_worker(session.config)

    # -- controller --------------------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_auto_num_workers(self, config: pytest.Config):
        if not selects_gpu_tier(config.getoption("markexpr", "")):
            return None  # not the GPU tier: xdist's default (one worker per CPU)
        devices = self._controller_devices()
        return auto_workers(len(devices), _per_worker(config)) if devices else None

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        """GPU tier with plain ``-n N``: whole groups (:func:`scope_of`) per worker."""
        if not selects_gpu_tier(config.getoption("markexpr", "")) or config.getoption("dist", "no") != "load":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class GroupScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return scope_of(nodeid)

        return GroupScheduling(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if not _applies(node.config):
            return
        devices = self._controller_devices()
        if not devices:
            return
        index = worker_index(node.workerinput["workerid"])
        node.workerinput[WORKERINPUT_KEY] = ",".join(worker_devices(index, devices, _per_worker(node.config)))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        report = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_KEY)
        if report:
            self.reports[node.workerinput["workerid"]] = report

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.reports:
            return
        terminalreporter.section("GPU per xdist worker")
        for worker in sorted(self.reports, key=worker_index):
            r = self.reports[worker]
            seen = "CUDA not used" if r["device_count"] is None else f"{r['device_count']} device(s) {r['names']}"
            terminalreporter.line(f"{worker}: CUDA_VISIBLE_DEVICES={r['CUDA_VISIBLE_DEVICES']} -> {seen}")


def pin_worker(config: pytest.Config) -> str | None:
    """In an xdist worker, set ``CUDA_VISIBLE_DEVICES`` to its GPUs; returns what was set (None: nothing)."""
    workerinput = getattr(config, "workerinput", None)
    worker = (workerinput or {}).get("workerid") or os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    if workerinput is not None and WORKERINPUT_KEY in workerinput:
        value = workerinput[WORKERINPUT_KEY]
    else:
        devices = visible_gpus()
        if not devices:
            return None
        value = ",".join(worker_devices(worker_index(worker), devices, _per_worker(config)))
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    return value


def report_worker(config: pytest.Config) -> None:
    """In a pinned xdist worker, send the controller what CUDA saw there."""
    output = getattr(config, "workeroutput", None)
    if output is None:
        return
    count, names = None, []
    torch = sys.modules.get("torch")  # only report what CUDA saw when the tests used it
    try:
        if torch is not None and torch.cuda.is_available():
            count = torch.cuda.device_count()
            names = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception:
        pass
    output[WORKEROUTPUT_KEY] = {
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "device_count": count,
        "names": names,
    }
