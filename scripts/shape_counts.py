"""Count the shape debts of issue 30, so each step of the refactor can show them before and after.

    python scripts/shape_counts.py [--list] [--json F] [--root DIR]

Every count is made by parsing the sources with :mod:`ast` (nothing is imported); ``--list`` prints
each counted item (``file:line what``) under its count. ``--root`` counts another checkout (a clean
clone of an older commit, for the "before"). The counts:

* ``long functions``: functions (and methods) in ``conformance/`` and ``adapters/`` over 80 lines,
  from ``def`` to their last line (decorators not counted).
* ``modules spelling flags``: modules of ``conformance/`` and ``adapters/`` outside the front ends
  (``cli/``, ``pytest_plugin.py`` and the xdist hooks it registers, ``xdist_gpus.py``, which moved out of
  ``testing/`` in this step) and outside the test doubles (``conformance/testing/``) that hold
  a string spelling a CLI flag (``--name``, docstrings not counted) or the name ``flag_prefix``;
  ``conformance/option_names.py``, where both front ends' options are declared and spelled, is not
  counted (the one place); nor are the flags of another program's command line (a list literal holding
  ``"-m"``, as ``[sys.executable, "-m", "pip", ...]``), nor ``conformance/pins.py``, a front end of its
  own (``python -m ddtree_conformance.pins --version NAME EXTRA``, for CI scripts and tox).
* ``message-text tests``: places in the same modules that read a failure's kind from message text:
  ``.startswith``/``.endswith`` on a message-like value (a name or attribute called ``message``,
  ``error``, ``problem``, ``check_message``, ``msg``, ``stderr``, or ending in ``_message``/``_error``) or
  with the integrity prefix (``PREFIX``, ``"integrity: "``) or an ``"engine...``/``"error...`` literal; and
  ``"literal" in X`` where X is message-like.
* ``run-helper copies``: functions in ``tests/`` and ``scripts/`` that build a ``SuiteSession`` and call
  ``run_plan`` themselves (helpers and tests alike), where the shared helper
  (:mod:`ddtree_conformance.testing.runs`) would do.
* ``long message literals asserted``: ``assert`` statements in ``tests/`` that hold a string literal of
  60 characters or more (implicit concatenations joined; f-strings counted by their literal parts).
* ``production imports of test doubles``: imports of ``ddtree_conformance.testing`` (relative ones
  resolved, function-local ones included) in modules of ``conformance/`` and ``adapters/`` outside
  ``conformance/testing/``; resolved by :mod:`ddtree_conformance.testing.imports`, as the layering tests
  resolve them (``tests/test_import_graph.py``).
* ``functions changing an argument in place``: functions of ``conformance/`` and ``adapters/`` (test
  doubles excluded) that assign to an item or attribute of a parameter or call a mutating method on it
  (:func:`argument_mutations`), unless the function declares that change: a line ``mutates: NAME (why)``
  (several names: ``mutates: a, b (why)``) in its docstring or in the comment lines right above its
  ``def`` (or its decorators), for a change the caller's API asks for (a model forward filling the KV
  cache its caller owns, a pytest hook setting the session's exit status). Only the named arguments
  are excused, and only with a reason; those are listed under ``declared in-place changes``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

from ddtree_conformance.testing.imports import PACKAGE, SOURCES, project_imports

ROOT = Path(__file__).resolve().parent.parent
LONG = 80
LONG_LITERAL = 60
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
MESSAGEY = {"message", "error", "problem", "check_message", "msg", "stderr"}
# the front ends: the CLI, the pytest plugin and the xdist hooks it registers (they read pytest's options)
FRONT_ENDS = ("conformance/cli/", "conformance/pytest_plugin.py", "conformance/xdist_gpus.py", "conformance/pins.py")
DECLARATIONS = ("conformance/option_names.py",)  # the options of both front ends, declared and spelled
SHARED_RUN_HELPER = "conformance/testing/runs.py"


def _files(root: Path, *folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (root / f).rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _production(rel: str) -> bool:
    return not rel.startswith("conformance/testing/")


def _front_end(rel: str) -> bool:
    return rel.startswith(FRONT_ENDS)


def long_functions(root: Path) -> list[str]:
    found = []
    for path in _files(root, *SOURCES):
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG:
                    found.append(f"{_rel(path, root)}:{node.lineno} {node.name} {n}")
    return found


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _other_programs(tree: ast.AST) -> set[int]:
    """ids of the string constants of another program's command line: list literals holding ``"-m"``."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and any(isinstance(e, ast.Constant) and e.value == "-m" for e in node.elts):
            ids.update(id(e) for e in node.elts if isinstance(e, ast.Constant))
    return ids


def flag_modules(root: Path) -> list[str]:
    found = []
    for path in _files(root, *SOURCES):
        rel = _rel(path, root)
        if not _production(rel) or _front_end(rel) or rel in DECLARATIONS:
            continue
        tree = _tree(path)
        skip = _docstrings(tree) | _other_programs(tree)
        flags, prefix = set(), False
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                flags.update(FLAG.findall(node.value))
            elif isinstance(node, ast.Name) and node.id == "flag_prefix":
                prefix = True
            elif isinstance(node, ast.arg) and node.arg == "flag_prefix":
                prefix = True
            elif isinstance(node, ast.Attribute) and node.attr == "flag_prefix":
                prefix = True
            elif isinstance(node, ast.keyword) and node.arg == "flag_prefix":
                prefix = True
        if flags or prefix:
            what = sorted(flags)[:6] + (["flag_prefix"] if prefix else [])
            found.append(f"{rel} {' '.join(what)}")
    return found


def _tail(node: ast.AST) -> str | None:
    """The last identifier of a name, attribute or call (``r.message`` -> message, ``one_line(x)`` -> one_line)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _tail(node.func)
    if isinstance(node, ast.Subscript):
        return _tail(node.value)
    return None


def _messagey(node: ast.AST) -> bool:
    return (_tail(node) or "") in MESSAGEY or (_tail(node) or "").endswith(("_message", "_error"))


def _prefix_arg(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(("engine", "integrity", "error"))
    if isinstance(node, ast.Tuple):
        return any(_prefix_arg(e) for e in node.elts)
    return _tail(node) == "PREFIX"


def message_tests(root: Path) -> list[str]:
    found = []
    for path in _files(root, *SOURCES):
        rel = _rel(path, root)
        if not _production(rel):
            continue
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(_tree(path)):
            hit = False
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("startswith", "endswith") and node.args:
                    hit = _messagey(node.func.value) or _prefix_arg(node.args[0])
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                left_literal = isinstance(node.left, (ast.Constant, ast.JoinedStr)) and not isinstance(
                    getattr(node.left, "value", ""), (int, float)
                )
                hit = left_literal and any(_messagey(c) for c in node.comparators)
            if hit:
                text = " ".join((ast.get_source_segment(source, node) or "").split())[:90]
                found.append(f"{rel}:{node.lineno} {text}")
    return found


def _calls(node: ast.AST) -> set[str]:
    return {_tail(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)} - {None}


def run_helper_copies(root: Path) -> list[str]:
    found = []
    for path in _files(root, "tests", "scripts"):
        rel = _rel(path, root)
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                calls = _calls(node)
                inner = [n for n in ast.walk(node) if n is not node and isinstance(n, ast.FunctionDef)]
                if inner and any({"SuiteSession", "run_plan"} <= _calls(n) for n in inner):
                    continue  # counted at the inner function
                if {"SuiteSession", "run_plan"} <= calls:
                    found.append(f"{rel}:{node.lineno} {node.name}")
    return found


def _literal_length(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return len(node.value)
    if isinstance(node, ast.JoinedStr):
        return sum(len(v.value) for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return 0


def long_literal_asserts(root: Path) -> list[str]:
    found = []
    for path in _files(root, "tests"):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Assert):
                longest = max((_literal_length(n) for n in ast.walk(node.test)), default=0)
                if longest >= LONG_LITERAL:
                    found.append(f"{_rel(path, root)}:{node.lineno} {longest} characters")
    return found


def testing_imports(root: Path) -> list[str]:
    testing = f"{PACKAGE}.testing"
    found = []
    for path in _files(root, *SOURCES):
        rel = _rel(path, root)
        if not _production(rel):
            continue
        for line, target in project_imports(path, root):
            if target == testing or target.startswith(testing + "."):
                found.append(f"{rel}:{line} {target}")
    return found


# ``mutates: NAME[, NAME] (why)``: a function's declaration that it changes those arguments in place
MUTATES = re.compile(r"\bmutates:\s*(?P<names>\w+(?:\s*,\s*\w+)*)\s*\(\s*[^\s)]")

MUTATORS = {
    "append",
    "extend",
    "insert",
    "update",
    "pop",
    "popitem",
    "clear",
    "remove",
    "setdefault",
    "sort",
    "add",
    "discard",
}


def declared_mutations(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> set[str]:
    """The arguments ``fn`` declares it changes in place: the names of every ``mutates: NAME (why)`` line
    (:data:`MUTATES`) in its docstring or in the comment lines right above it (above its decorators)."""
    texts = [ast.get_docstring(fn) or ""]
    above = min([fn.lineno, *(d.lineno for d in fn.decorator_list)]) - 2  # the line above, 0-based
    while above >= 0 and lines[above].lstrip().startswith("#"):
        texts.append(lines[above])
        above -= 1
    return {n.strip() for text in texts for m in MUTATES.finditer(text) for n in m.group("names").split(",")}


def _mutations(root: Path) -> tuple[list[str], list[str]]:
    """Functions changing an argument in place (:func:`argument_mutations`): those whose changed arguments
    are not all declared (``mutates:``), and those that declare every one."""
    found, declared = [], []
    for path in _files(root, *SOURCES):
        rel = _rel(path, root)
        if not _production(rel):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(_tree(path)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = fn.args
            params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self", "cls"}
            rebound = {  # a parameter bound anew in the body (a copy) is the function's own
                t.id
                for node in ast.walk(fn)
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            }
            params -= rebound
            hits = set()
            for node in ast.walk(fn):
                targets = []
                if isinstance(node, ast.Assign | ast.AugAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Name):
                        if t.value.id in params:
                            hits.add(t.value.id)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = node.func.value
                    if isinstance(owner, ast.Name) and owner.id in params and node.func.attr in MUTATORS:
                        hits.add(owner.id)
            undeclared = hits - declared_mutations(fn, lines)
            if undeclared:
                found.append(f"{rel}:{fn.lineno} {fn.name}({', '.join(sorted(undeclared))})")
            elif hits:
                declared.append(f"{rel}:{fn.lineno} {fn.name}({', '.join(sorted(hits))})")
    return found, declared


def argument_mutations(root: Path) -> list[str]:
    """Functions of ``conformance/`` and ``adapters/`` (test doubles excluded) that change an argument in
    place: assign to an item or attribute of a parameter, or call a mutating method on it (``append``,
    ``update``, ``pop``, ...). ``self`` and ``cls`` are not arguments here, nor is a parameter the body
    binds anew (``lengths = list(lengths)``: a copy), nor one the function declares it changes
    (:func:`declared_mutations`)."""
    return _mutations(root)[0]


def declared_argument_mutations(root: Path) -> list[str]:
    """The functions :func:`argument_mutations` leaves out because they declare (``mutates: NAME (why)``)
    every argument they change in place."""
    return _mutations(root)[1]


COUNTS = {
    "long functions (> 80 lines, conformance/ adapters/)": long_functions,
    "modules spelling flags (outside cli/, pytest_plugin.py, xdist_gpus.py, testing/)": flag_modules,
    "message-text tests (conformance/ adapters/, outside testing/)": message_tests,
    "run-helper copies (tests/ scripts/: SuiteSession + run_plan in one function)": run_helper_copies,
    "long message literals asserted (tests/)": long_literal_asserts,
    "production imports of test doubles": testing_imports,
    "functions changing an argument in place (conformance/ adapters/, outside testing/)": argument_mutations,
    "declared in-place changes (a `mutates: NAME (why)` note; not counted above)": declared_argument_mutations,
}


def counts(root: Path = ROOT) -> dict[str, list[str]]:
    return {name: fn(root) for name, fn in COUNTS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each counted item")
    parser.add_argument("--json", default=None, help="also write the counts and items as JSON")
    parser.add_argument("--root", default=str(ROOT), help="the checkout to count (default: this one)")
    args = parser.parse_args(argv)
    found = counts(Path(args.root).resolve())
    for name, items in found.items():
        print(f"{len(items):4d}  {name}")
        if args.list:
            for item in items:
                print(f"        {item}")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
