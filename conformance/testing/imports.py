"""The project's imports of a source file, read with :mod:`ast` (nothing is imported): one resolver for the
layering tests (``tests/test_import_graph.py``) and the shape counts (``scripts/shape_counts.py``).

* :func:`module_name`: the dotted ``ddtree_conformance.*`` name of a file under ``conformance/`` or
  ``adapters/`` of a checkout;
* :func:`project_imports`: ``(line, module)`` for each import of this project in a file (function-local
  ones included), relative imports resolved; one that climbs out of the package is kept as written
  (``"..x"``), and the bare top-level names (``conformance``, ``adapters``) are kept too.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["PACKAGE", "SOURCES", "BARE", "module_name", "project_imports"]

PACKAGE = "ddtree_conformance"
#: source folder of a checkout -> the package it installs as
SOURCES = {"conformance": PACKAGE, "adapters": f"{PACKAGE}.adapters"}
BARE = tuple(SOURCES)  # installed names would collide with other distributions


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """(dotted module name, is a package's ``__init__``) of a source file of the checkout at ``root``."""
    rel = path.relative_to(root).with_suffix("")
    parts = [SOURCES[rel.parts[0]], *rel.parts[1:]]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def project_imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every import of this project (and of the bare names) in ``path``."""
    module, is_package = module_name(path, root)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.lineno, node.module or ""))
                continue
            base = package.split(".")
            if node.level - 1 >= len(base):
                found.append((node.lineno, "." * node.level + (node.module or "")))  # leaves the package
                continue
            base = base[: len(base) - (node.level - 1)]
            if node.module:
                found.append((node.lineno, ".".join([*base, node.module])))
            else:  # from . import a, b: each name may be a module
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in (PACKAGE, *BARE) or name.startswith(".")]
