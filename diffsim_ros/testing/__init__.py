"""Fixtures for the tests and the benchmarks, kept apart from what the package does for its users.

:mod:`.recordings`: plant rollouts under exciting commands, recorded into bags in the layout
of doc/interfaces.md, and the standard perturbed recordings the analysis is checked on.
"""
