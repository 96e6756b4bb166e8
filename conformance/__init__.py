"""ddtree-conformance: the executable DDTree spec, the checks, golden files, gates and the CLI."""

__version__ = "0.2.0"  # tests/test_packaging.py: equals the installed distribution's version
