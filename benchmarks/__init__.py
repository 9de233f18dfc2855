"""Benchmark scripts (run as files: python benchmarks/<name>.py); a package only so that
bench_decode.py's helpers import as benchmarks.decode."""
