"""The ``ddtree-conformance`` command line.

* :mod:`.base`: the application, exit statuses, one-line errors;
* :mod:`.options`: the shared options (validated by :mod:`ddtree_conformance.settings`);
* :mod:`.generate`: ``generate`` and ``engines``;
* :mod:`.check`: ``check`` and ``record``;
* :mod:`.bench`: ``bench``, ``baseline`` and ``gate`` (``bench --against``: :mod:`.ab`);
* :mod:`.ci`: ``ci``, the whole CI job (GitHub Actions and Buildkite call it).

A new command is a function decorated with :func:`.base.command` in the module of its group.
"""

from . import bench, check, ci, generate  # noqa: F401  (each registers its commands on app)
from .base import EXIT_STATUSES, app

__all__ = ["app", "EXIT_STATUSES"]
