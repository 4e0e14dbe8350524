"""Benchmarks: each script prints its figures; results are recorded in BENCHMARKS.md."""
