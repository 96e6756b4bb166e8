"""The ``ddtree-conformance`` command line.

* :mod:`.base`: the application, exit statuses, one-line errors;
* :mod:`.options`: the shared options (validated by :mod:`ddtree_conformance.settings`) and their
  groups (:func:`.options.option_group`: one parameter of a command, several options on its command line);
* :mod:`.generate`: ``generate`` and ``engines`` (its own options: :mod:`.generate_options`);
* :mod:`.check`: ``check`` and ``record``;
* :mod:`.bench`: ``bench`` (``bench --against``: :mod:`.ab`);
* :mod:`.gates`: ``baseline`` and ``gate``;
* :mod:`.ci`: ``ci``, the whole CI job (GitHub Actions and Buildkite call it; its options: :mod:`.ci_options`).

A new command is a function decorated with :func:`.base.command` in the module of its group.
"""

from . import bench, check, ci, gates, generate  # noqa: F401  (each registers its commands on app)
from .base import EXIT_STATUSES, app

__all__ = ["app", "EXIT_STATUSES"]
