"""Process helpers for tests of engine isolation: is a pid still running?"""

from __future__ import annotations

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (Linux ``/proc``; a zombie waiting to be reaped counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
