"""Running any engine in its own process.

:class:`IsolatedEngine` wraps an engine spec (``reference``, ``vllm``, ``module:Class``...) and
drives it in a spawned child. A crash, a hang past ``timeout_s`` or an OOM kill becomes failed
:class:`RequestResult` entries carrying the tail of the child's log; the suite keeps running and
the next call starts a fresh child. One child serves every configuration until it dies.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import traceback
from pathlib import Path

from .interface import Capabilities, Engine, EngineError, Request, RequestResult, RunConfig

__all__ = ["IsolatedEngine", "allow_children", "log_tail"]


def allow_children() -> None:
    """Let this process start children even if it is a multiprocessing daemon.

    :class:`IsolatedEngine`'s child is a daemon (so it dies with the suite), and daemons may not
    start processes; engines that start their own (SGLang's scheduler, the reference engine's
    tensor-parallel ranks) call this first. They must make their children exit with them.
    """
    current = mp.current_process()
    if current.daemon:
        current.daemon = False


def log_tail(path: str | Path, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _serve(conn, spec: str, model_dir: str, drafter_dir: str | None, options: dict, log_path: str,
           torch_threads: int | None = None) -> None:
    """Child main: build the engine, then answer (command, payload) messages until 'close'."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    from .registry import create_engine

    try:
        engine = create_engine(spec, model_dir, drafter_dir, **options)
    except Exception as exc:  # reported to the parent as one line, with the log for details
        traceback.print_exc()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            command, payload = conn.recv()
        except EOFError:
            return
        try:
            if command == "close":
                engine.close()
                conn.send(("ok", None))
                return
            if command == "capabilities":
                conn.send(("ok", engine.capabilities().model_dump()))
            elif command == "generate":
                requests = [Request(**r) for r in payload["requests"]]
                results = engine.generate(requests, RunConfig(**payload["config"]))
                conn.send(("ok", [r.model_dump() for r in results]))
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:
            traceback.print_exc()
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class IsolatedEngine(Engine):
    """An engine driven in a spawned child process (see module doc)."""

    def __init__(
        self,
        spec: str,
        model_dir: str,
        drafter_dir: str | None = None,
        timeout_s: float = 600.0,
        start_timeout_s: float = 600.0,
        torch_threads: int | None = None,
        **options,
    ) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.spec = spec
        self.name = spec
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.torch_threads = torch_threads  # CPU threads of the child's torch (None: torch's default)
        self._process = None
        self._conn = None
        self._log_dir = tempfile.mkdtemp(prefix="ddtree-engine-")
        self.log_path = os.path.join(self._log_dir, "engine.log")

    # -- child lifecycle -------------------------------------------------------------------
    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_serve,
            args=(child, self.spec, self.model_dir, self.drafter_dir, self.options, self.log_path, self.torch_threads),
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        status, payload = self._receive(self.start_timeout_s, "start")
        if status != "ready":
            self._kill()
            raise EngineError(f"engine {self.spec!r} failed to start: {payload}\n{log_tail(self.log_path)}")

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._process, self._conn = None, None

    def _receive(self, timeout: float, what: str):
        if not self._conn.poll(timeout):
            self._kill()
            raise EngineError(f"engine {self.spec!r} hung: no answer to {what} within {timeout:.0f} s")
        try:
            return self._conn.recv()
        except (EOFError, ConnectionError, OSError):
            code = self._process.exitcode if self._process is not None else None
            if self._process is not None:
                self._process.join(5)
                code = self._process.exitcode
            self._kill()
            hint = " (killed by signal 9: out of memory?)" if code == -9 else ""
            raise EngineError(f"engine {self.spec!r} crashed during {what}: exit code {code}{hint}") from None

    def _call(self, command: str, payload=None, timeout: float | None = None):
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, OSError):
            self._kill()
            raise EngineError(f"engine {self.spec!r} is gone (pipe closed)") from None
        status, result = self._receive(timeout or self.timeout_s, command)
        if status != "ok":
            raise EngineError(f"engine {self.spec!r}: {result}")
        return result

    # -- Engine interface ------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        return Capabilities(**self._call("capabilities", timeout=self.start_timeout_s))

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        payload = {"requests": [r.model_dump() for r in requests], "config": config.model_dump()}
        try:
            return [RequestResult(**r) for r in self._call("generate", payload)]
        except EngineError as exc:
            message = f"{exc}\n--- engine log tail ---\n{log_tail(self.log_path)}"
            return [RequestResult(output_ids=[], finish_reason="error", error=message) for _ in requests]

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(("close", None))
                self._conn.poll(10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()
