"""Benchmark scripts (run as files: python benchmarks/<name>.py); a package only so that
bench_kernels.py's helpers import as benchmarks.decode."""
