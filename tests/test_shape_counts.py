"""scripts/shape_counts.py's count of functions changing an argument in place, and the ``mutates: NAME (why)``
note that declares such a change: it excuses only the arguments it names, and only with a reason."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''
def fills(cache, rows):
    cache.update(rows)


# mutates: cache (the caller's KV cache takes the new rows, as a transformers cache does)
def declared(cache, rows):
    cache.update(rows)


def in_docstring(session):
    """Sets the exit status.

    mutates: session (pytest's hook API)"""
    session.exitstatus = 3


# mutates: cache
def no_reason(cache, rows):
    cache.update(rows)


# mutates: cache (the caller's KV cache)
def another_argument(cache, rows):
    cache.update(rows)
    rows.append(1)


# mutates: cache (the caller's KV cache)

def not_right_above(cache, rows):
    cache.update(rows)


def copies(rows):
    rows = list(rows)
    rows.append(1)
    return rows
'''


def _shape_counts():
    spec = importlib.util.spec_from_file_location("shape_counts", ROOT / "scripts" / "shape_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_declared_change_is_listed_apart_and_an_undeclared_one_still_counts(tmp_path):
    (tmp_path / "conformance").mkdir()
    (tmp_path / "adapters").mkdir()
    (tmp_path / "conformance" / "mod.py").write_text(SOURCE)
    shape = _shape_counts()
    counted = {item.split(" ", 1)[1] for item in shape.argument_mutations(tmp_path)}
    declared = {item.split(" ", 1)[1] for item in shape.declared_argument_mutations(tmp_path)}
    assert counted == {
        "fills(cache)",
        "no_reason(cache)",  # a note without a reason excuses nothing
        "another_argument(rows)",  # only the named argument is excused
        "not_right_above(cache)",  # the note must sit right above the def (or in its docstring)
    }
    assert declared == {"declared(cache)", "in_docstring(session)"}
