"""Writing and reading the suite's files safely.

:func:`atomic_write` never leaves a half-written file: the data goes to a temporary file beside
the target, is flushed to disk (fsync), renamed into place, and the folder is fsynced so the rename
survives a power cut. The temporary file is removed on any exception. Writers of one path take
turns: each holds a lock (``filelock``, in a per-user folder under the system's temporary folder,
named by the first byte of the path's hash: 256 lock files at most, however many paths are written;
two paths that share one only take turns) for its whole write, so concurrent writers never see, let
alone delete, each other's temporary files. A writer killed outright (``kill -9``) loses its lock with its process
but cannot clean up, so the next writer, holding the lock, removes the temporary files such a
writer left (``.<name>.XXXXXXXX.tmp``) and names each one through ``warn``.

:func:`read_json_object` turns every way a JSON file can be unreadable (missing, not a file,
unreadable, not UTF-8, not JSON, not an object) into one error naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

__all__ = ["atomic_write", "read_json_object", "parse_json_object", "stale_temp_files", "write_lock", "TEMP_SUFFIX"]

TEMP_SUFFIX = ".tmp"
LOCK_TIMEOUT_S = 600.0  # a writer holds the lock for one write; ten minutes means its holder is stuck
_RANDOM = r"[a-z0-9_]{8}"  # tempfile's random part


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def stale_temp_files(path: str | Path) -> list[Path]:
    """Temporary files a writer of ``path`` left behind (``.<name>.<8 chars>[.tmp]``)."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{_RANDOM}(?:{re.escape(TEMP_SUFFIX)})?")
    try:
        return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name) and p.is_file())
    except OSError:
        return []


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_lock(path: str | Path, timeout: float = LOCK_TIMEOUT_S) -> FileLock:
    """The lock every writer of ``path`` holds while it writes (module doc)."""
    folder = Path(tempfile.gettempdir()) / f"ddtree-conformance-locks-{os.getuid() if hasattr(os, 'getuid') else 0}"
    folder.mkdir(mode=0o700, exist_ok=True)
    # one lock per first byte of the path's hash: the folder stays bounded (a lock file is never removed:
    # removing one a writer still waits on would let two writers in)
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:2]
    return FileLock(folder / f"bucket-{key}.lock", timeout=timeout)


def atomic_write(path: str | Path, data: str | bytes, *, warn: Callable[[str], None] | None = None) -> Path:
    """Write ``data`` to ``path`` atomically and durably (mode 0644), one writer at a time; see the
    module doc."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with write_lock(path):
        _write_locked(path, data, warn)
    return path


def _write_locked(path: Path, data: str | bytes, warn: Callable[[str], None] | None) -> None:
    for stale in stale_temp_files(path):
        try:
            stale.unlink()
        except OSError:
            continue
        (warn or _warn)(f"removed {stale}: a temporary file left by an interrupted write of {path.name}")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary repository files
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_json_object(path: str | Path, error: type[Exception], what: str = "file") -> dict:
    """Parse ``path`` as a JSON object; any problem is one ``error`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise error(f"no {what} {path}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return parse_json_object(raw, path, error, what)


def parse_json_object(raw: bytes, path: str | Path, error: type[Exception], what: str = "file") -> dict:
    """``raw`` (the bytes of ``path``, read earlier) as a JSON object; any problem is one ``error``
    naming the file."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); is it a {what}?"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise error(f"{path}: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object at the top level")
    return data
