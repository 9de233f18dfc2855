"""Calibration and validation: fit the simulator's cost model to runtime traces, measure how well
it predicts runs it has not seen, and import profiler (Kineto) traces into the shared format."""
