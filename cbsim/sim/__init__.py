"""The SimPy model of the host thread, three CUDA streams, events, IO slots, graphs and carry-over.

Entry points: ``run(config, engine) -> Trace`` with engine "sync" or "async";
``simulate(config, engine, want_trace)`` (without a trace: the run folded for its metrics, in
memory that does not grow with its steps); ``simulate_many(configs, measure)`` for grids. Never imports torch.
"""

from cbsim.sim.engine import SimResult, run, simulate
from cbsim.sim.many import iter_many, simulate_many

__all__ = ["SimResult", "iter_many", "run", "simulate", "simulate_many"]
