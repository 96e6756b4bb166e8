"""Progress lines for logs that are not terminals (CI, ``| tee``): ``[ddtree] ...`` on stderr.

:func:`progress_printer` returns the printer a command uses (None on a terminal, where rich's
progress bars show the same). :class:`Heartbeat` prints a line every ``interval_s`` seconds while
an engine call runs, so a long run shows where its time goes::

    [ddtree] waiting for engine 'vllm': generate 80 requests, 60 s
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["PREFIX", "HEARTBEAT_S", "Printer", "progress_printer", "heartbeat_interval", "Heartbeat"]

PREFIX = "[ddtree] "
HEARTBEAT_S = 30.0  # default seconds between heartbeat lines; $DDTREE_HEARTBEAT_S overrides


def heartbeat_interval() -> float:
    """Seconds between heartbeat lines: ``$DDTREE_HEARTBEAT_S`` when it is a positive number, else 30."""
    try:
        value = float(os.environ.get("DDTREE_HEARTBEAT_S", HEARTBEAT_S))
    except ValueError:
        return HEARTBEAT_S
    return value if value > 0 else HEARTBEAT_S


Printer = Callable[[str], None]


def _print(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


def progress_printer(force: bool | None = None) -> Printer | None:
    """Print ``[ddtree] <text>`` lines on stderr when it is not a terminal (or when ``force``)."""
    show = (not sys.stderr.isatty()) if force is None else force
    return _print if show else None


class Heartbeat:
    """While the ``with`` block runs, call ``emit`` every ``interval_s`` s with what is awaited."""

    def __init__(self, emit: Printer | None, engine: str, what: str, interval_s: float | None = None) -> None:
        self.emit, self.engine, self.what = emit, engine, what
        self.interval_s = heartbeat_interval() if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.interval_s):
            self.emit(f"waiting for engine {self.engine!r}: {self.what}, {time.monotonic() - started:.0f} s")

    def __enter__(self) -> Heartbeat:
        if self.emit is not None and self.interval_s > 0:
            self._thread = threading.Thread(target=self._beat, name="ddtree-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
