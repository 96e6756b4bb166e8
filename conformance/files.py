"""Writing the suite's files: atomically, so a crash never leaves a half-written golden file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "read_json_object"]


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path`` (mode 0644), then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are ordinary repository files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_json_object(path: str | Path, error: type[Exception], what: str = "file") -> dict:
    """Parse ``path`` as a JSON object; any problem is one ``error`` naming the file."""
    import json

    path = Path(path)
    if not path.is_file():
        raise error(f"no {what} {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object at the top level")
    return data
