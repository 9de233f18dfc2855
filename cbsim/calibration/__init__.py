"""Calibration: recorded runs as data (their configs, per-step tables, manifests) and the fit of
the simulator's cost model to them, written out as a hardware profile."""
