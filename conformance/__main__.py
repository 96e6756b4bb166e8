"""``python -m ddtree_conformance``: the ``ddtree-conformance`` command line."""

from .cli import app

app(prog_name="ddtree-conformance")
