"""Benchmarks of the real stack (issue 6): ``python -m benchmarks``."""
