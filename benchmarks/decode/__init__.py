"""The sections of benchmarks/bench_kernels.py (the entry script: its docstring says what each
measures), one module each: env, check, kernel, gemm, model (+ model_checks, hf_static);
the runtime end to end is benchmarks/bench_decode.py.
common.py holds the shared state and tools, bench.py assembles them into ``Bench``. Imported as
``benchmarks.decode`` with the repo root on sys.path; needs torch, no cbsim."""
