"""Data shipped with the suite: the fixture pair, prompt sets, golden files and baselines.

Found at run time through ``importlib.resources`` (:mod:`ddtree_conformance.paths`), so an
installed wheel and a source checkout read the same files.
"""
