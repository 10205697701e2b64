"""Benchmark harness: `python -m benchmarks.run --help`; figures in RESULTS.md."""
