"""Profiling a machine: one command measures the GPU and host it runs on into a profile directory
(``+experiment=profile_machine``, machine.py), and ``hardware=DIR`` / ``hardware=auto`` select
such directories (select.py)."""
