"""Benchmarks: each module runs with `python -m bench.<name>` and compares against a named baseline."""
