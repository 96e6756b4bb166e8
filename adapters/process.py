"""Running any engine in its own process.

:class:`IsolatedEngine` wraps an engine spec (``reference``, ``vllm``, ``module:Class``...) and
drives it in a spawned child, which serves every configuration until it is closed or dies.

* Timeouts. Start-up (building the engine), ``capabilities()`` and each ``generate`` must answer
  within their timeout (the suite's ``--engine-timeout``). ``capabilities()`` is asked once and its
  answer (or its failure) kept.
* Death. A child that cannot start, crashes, hangs past its timeout or is killed (the
  out-of-memory killer sends SIGKILL) raises :class:`~ddtree_conformance.adapters.interface.EngineDied`
  carrying the tail of the child's log. The engine stays dead: every later call raises at once,
  naming the first cause; it is never restarted behind the caller's back. An exception raised *by*
  the engine's ``generate`` (it reports a failure and keeps running) still becomes one failed
  :class:`RequestResult` per request.
* The process tree. The child starts its own session, so it leads a process group that holds every
  process the engine starts (SGLang's scheduler, tensor-parallel ranks), and it carries a mark in
  its environment (``DDTREE_ENGINE_TREE``, one value per engine) that every process it starts
  inherits, detached ones included (a double fork, a new session, a parent that exited). When the
  engine is closed, hangs or dies, its whole tree ends: the group, the child's descendants and every
  process carrying the mark (found with ``psutil``). The suite's own multiprocessing resource tracker,
  which the first spawn would start, is started before the mark is set, so no engine's end takes it.
* Dying with the suite. On Linux the child asks the kernel for SIGKILL when its parent dies
  (``PR_SET_PDEATHSIG``, through ctypes: psutil has no equivalent), so it goes even when the suite is
  killed with ``kill -9``; a watchdog thread in the child also ends its tree when the parent is gone
  (``psutil``, safe against a reused pid) or a lifeline pipe from the parent closes. A process the
  engine starts outlives a ``kill -9`` of both the suite and the child only if it watches nothing:
  the reference engine's ranks and SGLang's scheduler watch their parent. PR_SET_PDEATHSIG follows
  the parent *thread*: start engines from a thread that outlives them.
* The child's log lives in a temporary folder, removed on :meth:`close` (or when the object is
  garbage-collected); failures carry the log's tail in their message.
* Another environment. ``python`` and ``sys_path`` start the child under another interpreter with
  that interpreter's import path (an A/B run's baseline build, installed apart from the candidate:
  :mod:`ddtree_conformance.ab`); the suite must be importable there.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
import uuid
import weakref
from multiprocessing import resource_tracker
from pathlib import Path

import psutil

from .interface import (
    Capabilities,
    Engine,
    EngineDied,
    EngineError,
    EngineUsageError,
    Request,
    RequestResult,
    RunConfig,
)
from .interpreter import spawning_under
from .process_tree import TREE_MARK, end_tree
from .registry import create_engine

__all__ = ["TREE_MARK", "IsolatedEngine", "allow_children", "end_tree", "log_tail"]

PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCHDOG_PERIOD_S = 1.0
CLOSE_GRACE_S = 10.0


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


# ---------------------------------------------------------------------------------- child side
def _end_own_tree() -> None:
    """End everything this child started (its group and every process carrying its mark), then exit."""
    mark = os.environ.get(TREE_MARK)
    if mark is not None:
        end_tree(None, mark)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def _die_with_parent(parent_pid: int, lifeline) -> None:
    """Make this child die when the suite does, whatever the signal (see module doc)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: the watchdog below still works
            pass
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:  # the parent died before this child started watching
        _end_own_tree()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        _end_own_tree()

    def watch() -> None:
        while True:
            try:
                if lifeline.poll(WATCHDOG_PERIOD_S):
                    lifeline.recv_bytes()  # the parent never writes: only EOF (it died) gets here
            except (EOFError, OSError):
                _end_own_tree()
            if not parent.is_running():  # gone, or its pid reused by another process
                _end_own_tree()

    threading.Thread(target=watch, name="ddtree-parent-watchdog", daemon=True).start()


def _serve(
    conn,
    lifeline,
    parent_pid: int,
    spec: str,
    model_dir: str,
    drafter_dir: str | None,
    options: dict,
    log_path: str,
    torch_threads: int | None = None,
    mark: str | None = None,
) -> None:
    """Child main: build the engine, then answer (command, payload) messages until 'close'."""
    try:
        os.setsid()  # lead a new session and process group: the parent kills the group on a hang
    except OSError:
        pass
    if mark is not None:
        os.environ[TREE_MARK] = mark  # inherited by every process the engine starts
    _die_with_parent(parent_pid, lifeline)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    if torch_threads:  # for torch, if the engine uses it (importing it here would slow every start)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(torch_threads)
    try:
        engine = create_engine(spec, model_dir, drafter_dir, **options)
    except EngineUsageError as exc:  # unknown option found by the engine itself: the caller's mistake
        conn.send(("usage", str(exc)))
        return
    except Exception as exc:  # reported to the parent as one line, with the log for details
        traceback.print_exc()
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    if torch_threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(torch_threads)
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
                caps = engine.capabilities()
                conn.send(("ok", caps.model_dump() if isinstance(caps, Capabilities) else caps))
            elif command == "generate":
                requests = [Request(**r) for r in payload["requests"]]
                results = engine.generate(requests, RunConfig(**payload["config"]))
                conn.send(("ok", [r.model_dump() if isinstance(r, RequestResult) else r for r in results]))
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:
            traceback.print_exc()
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------------- parent side
def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _kill_tree(process, mark: str | None) -> None:
    """End the child's whole tree (:func:`end_tree`), then reap the child itself."""
    if process is None:
        return
    end_tree(process.pid, mark)
    if process.is_alive():
        process.kill()
    process.join(5)


def _result(row):
    if not isinstance(row, dict):
        return row
    try:
        return RequestResult(**row)
    except Exception:  # invalid: kept as sent, for the integrity rules to name the field
        return RequestResult.model_construct(**{k: v for k, v in row.items() if k in RequestResult.model_fields})


class IsolatedEngine(Engine):
    """An engine driven in a spawned child process (see module doc)."""

    OPTIONS = None  # passed to the wrapped engine, which refuses the ones it does not know

    def __init__(
        self,
        spec: str,
        model_dir: str,
        drafter_dir: str | None = None,
        timeout_s: float = 900.0,
        start_timeout_s: float | None = None,
        torch_threads: int | None = None,
        timeout_option: str = "timeout_s",
        python: str | None = None,
        sys_path: list[str] | None = None,
        **options,
    ) -> None:
        super().__init__(model_dir, drafter_dir, **options)
        self.spec = spec
        self.python, self.sys_path = python, sys_path  # another environment (module doc); None: this one
        self.name = spec
        self.timeout_s = timeout_s
        self.start_timeout_s = timeout_s if start_timeout_s is None else start_timeout_s
        self.timeout_option = timeout_option  # what a hang's message names to raise the timeout
        self.torch_threads = torch_threads  # CPU threads of the child's torch (None: torch's default)
        self._process = None
        self._conn = None
        self._lifeline = None
        self._caps: Capabilities | None = None
        self._caps_error: EngineError | None = None
        self._dead: EngineDied | None = None
        self._usage: EngineUsageError | None = None
        self.tree_mark = uuid.uuid4().hex  # every process of this engine's tree carries it (module doc)
        self._log_dir = tempfile.mkdtemp(prefix="ddtree-engine-")
        self.log_path = os.path.join(self._log_dir, "engine.log")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._log_dir, True)

    @property
    def pid(self) -> int | None:
        """The child's pid (it also leads the child's process group), or None when none runs."""
        return None if self._process is None else self._process.pid

    @property
    def dead(self) -> EngineDied | None:
        """Why this engine died, or None while it can still be used."""
        return self._dead

    # -- child lifecycle -------------------------------------------------------------------
    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        life_read, life_write = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_serve,
            args=(
                child,
                life_read,
                os.getpid(),
                self.spec,
                self.model_dir,
                self.drafter_dir,
                self.options,
                self.log_path,
                self.torch_threads,
                self.tree_mark,
            ),
            daemon=True,
        )
        # Starting a spawned child starts this process's multiprocessing resource tracker if it is not
        # running yet. Started under the mark, the suite's own tracker would end with the engine's tree
        # (and the next start would warn that it died): start it first, unmarked.
        if os.name == "posix":
            resource_tracker.ensure_running()
        previous = os.environ.get(TREE_MARK)
        os.environ[TREE_MARK] = self.tree_mark  # in the child's own environment: forks without exec carry it too
        try:
            with spawning_under(self.python, self.sys_path):
                self._process.start()
        finally:
            if previous is None:
                os.environ.pop(TREE_MARK, None)
            else:
                os.environ[TREE_MARK] = previous
        child.close()
        life_read.close()
        self._conn, self._lifeline = parent, life_write
        status, payload = self._receive(self.start_timeout_s, "start")
        if status == "usage":
            self._kill()
            self._usage = EngineUsageError(payload)
            raise self._usage
        if status != "ready":
            self._die(f"engine {self.spec!r} failed to start: {payload}")

    def _kill(self) -> None:
        _kill_tree(self._process, self.tree_mark)
        for conn in (self._conn, self._lifeline):
            if conn is not None:
                conn.close()
        self._process, self._conn, self._lifeline = None, None, None

    def _die(self, message: str):
        """Record the death (with the log tail), end the child's group, raise :class:`EngineDied`."""
        self._kill()
        self._dead = EngineDied(message, log_tail(self.log_path))
        raise self._dead

    def _receive(self, timeout: float, what: str):
        try:
            ready = self._conn.poll(timeout)
        except (EOFError, OSError):
            ready = True  # the pipe broke: recv below reports how the child ended
        if not ready:
            self._die(
                f"engine {self.spec!r} hung: no answer to {what} within {timeout:g} s ({self.timeout_option}); "
                "its process group was killed"
            )
        try:
            return self._conn.recv()
        except (EOFError, ConnectionError, OSError):
            self._process.join(5)
            code = self._process.exitcode
            if code is not None and code < 0:
                how = f"killed by {_signal_name(code)}"
                if code == -signal.SIGKILL:
                    how += " (as the out-of-memory killer does: out of memory?)"
            else:
                how = f"exit code {code}"
            self._die(f"engine {self.spec!r} crashed during {what}: {how}")

    def _call(self, command: str, payload=None, timeout: float | None = None):
        if self._usage is not None:
            raise EngineUsageError(str(self._usage))
        if self._dead is not None:
            raise EngineDied(
                f"engine {self.spec!r} is not running: it failed earlier and is not restarted ({self._dead})",
                self._dead.log_tail,
            )
        if self._process is None:
            self._start()
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, OSError):
            self._die(f"engine {self.spec!r} is gone (its pipe closed) before {command}")
        status, result = self._receive(timeout or self.timeout_s, command)
        if status != "ok":
            raise EngineError(f"engine {self.spec!r}: {result}")
        return result

    # -- Engine interface ------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        """Asked of the child once; the answer, or the failure, is kept."""
        if self._caps is None and self._caps_error is None:
            try:
                answer = self._call("capabilities")
                self._caps = Capabilities(**answer) if isinstance(answer, dict) else Capabilities.model_validate(answer)
            except (EngineDied, EngineUsageError):
                raise
            except Exception as exc:  # the engine's own error, or an answer that is not Capabilities
                self._caps_error = EngineError(f"engine {self.spec!r}: capabilities() failed: {exc}")
        if self._caps_error is not None:
            raise self._caps_error
        return self._caps

    def generate(self, requests: list[Request], config: RunConfig) -> list[RequestResult]:
        """Results as the child sent them; an error the engine raised becomes one failed result per
        request. Raises :class:`EngineDied`. Nothing here is trusted: a row that is not a valid
        result is passed on unvalidated (``model_construct``), and so is an answer that is not a
        list, for the suite's integrity rules (:mod:`ddtree_conformance.integrity`) to name."""
        payload = {"requests": [r.model_dump() for r in requests], "config": config.model_dump()}
        try:
            answer = self._call("generate", payload)
        except EngineDied:
            raise
        except EngineError as exc:
            return [RequestResult(output_ids=[], finish_reason="error", error=str(exc)) for _ in requests]
        if not isinstance(answer, list):
            return answer
        return [_result(row) for row in answer]

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                self._conn.send(("close", None))
                self._conn.poll(CLOSE_GRACE_S)
            except (BrokenPipeError, OSError):
                pass
        self._kill()
        self._cleanup()
