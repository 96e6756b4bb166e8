"""Starting an engine's child process under another Python interpreter (an A/B run's baseline build,
installed apart from the candidate: :mod:`ddtree_conformance.ab`)."""

from __future__ import annotations

import contextlib
import sys
import threading
from multiprocessing import spawn

__all__ = ["spawning_under"]

_LOCK = threading.Lock()


@contextlib.contextmanager
def spawning_under(python: str | None, sys_path: list[str] | None):
    """While a child is spawned: multiprocessing's interpreter and the import path it hands the child
    (both process-wide, so held under a lock and restored)."""
    if python is None:
        yield
        return
    with _LOCK:
        executable, path = spawn.get_executable(), list(sys.path)
        spawn.set_executable(python)
        if sys_path is not None:
            sys.path[:] = sys_path
        try:
            yield
        finally:
            spawn.set_executable(executable)
            sys.path[:] = path
