"""ddtree-conformance: the executable DDTree spec, the checks, golden files, gates and the CLI."""

__version__ = "0.1.0"
