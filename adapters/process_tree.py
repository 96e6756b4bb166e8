"""Ending an engine's whole process tree (:mod:`.process` runs engines in their own process).

An engine's child process leads its own process group, and every process of the engine's tree
carries a mark in its environment (:data:`TREE_MARK`, one value per engine), inherited by whatever
it starts, detached processes included: a double fork, a new session, a parent that exited. Such a
process is in no group and below no process of the tree, so only the mark finds it.
"""

from __future__ import annotations

import os
import signal

import psutil

__all__ = ["TREE_MARK", "end_tree"]

TREE_MARK = "DDTREE_ENGINE_TREE"  # environment variable every process of one engine's tree carries


def _marked(mark: str) -> list[psutil.Process]:
    """Every process whose environment carries ``TREE_MARK=mark``, this one and its ancestors excluded."""
    spared = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info.get("environ") or {}
        if environ.get(TREE_MARK) == mark and proc.pid not in spared:
            found.append(proc)
    return found


def end_tree(root_pid: int | None, mark: str | None) -> None:
    """SIGKILL an engine's whole tree: the process group ``root_pid`` leads, its descendants and every
    process carrying ``mark`` (detached ones included), then reap what can be reaped."""
    victims: dict[int, psutil.Process] = {}
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            victims.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.Error:
            pass
        try:
            os.killpg(root_pid, signal.SIGKILL)  # a group led by the child: never the suite's own group
        except (ProcessLookupError, PermissionError):
            pass  # the child has not called setsid yet, or the group is already gone
    if mark is not None:
        victims.update({p.pid: p for p in _marked(mark)})
    victims.pop(os.getpid(), None)
    for proc in victims.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(victims.values()), timeout=5)
