"""The worker DDTree runs in: vLLM's CPU worker, building :class:`~.runner.DDTreeCPUModelRunner`.

``CPUWorker.init_device`` constructs ``CPUModelRunner`` inline (vLLM 0.32,
``v1/worker/cpu_worker.py``), so the runner class is swapped in that module for the duration of
that one call. The class can be replaced by ``additional_config["ddtree"]["runner_class"]``
("module:Class", a subclass), which is how the suite builds deliberately broken variants.
"""

from __future__ import annotations

import importlib

import vllm.v1.worker.cpu_worker as cpu_worker_module
from vllm.v1.worker.cpu_worker import CPUWorker

from .config import DDTreeConfigError, options_of
from .runner import DDTreeCPUModelRunner

__all__ = ["DDTreeCPUWorker", "runner_class"]


def runner_class(spec: str | None) -> type:
    if not spec:
        return DDTreeCPUModelRunner
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise DDTreeConfigError(f"DDTree: runner_class {spec!r} cannot be loaded: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, DDTreeCPUModelRunner)):
        raise DDTreeConfigError(f"DDTree: runner_class {spec!r} is not a subclass of DDTreeCPUModelRunner")
    return cls


class DDTreeCPUWorker(CPUWorker):
    def init_device(self):
        cls = runner_class(options_of(self.vllm_config).runner_class)
        stock = cpu_worker_module.CPUModelRunner
        cpu_worker_module.CPUModelRunner = cls
        try:
            super().init_device()
        finally:
            cpu_worker_module.CPUModelRunner = stock
