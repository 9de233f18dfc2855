"""Kernels for the runtime (no cbsim imports: loadable by file path on the GPU machine)."""
