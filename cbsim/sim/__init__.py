"""The SimPy model of the host thread, three CUDA streams, events, IO slots, graphs and carry-over.

Entry point: ``run(config, engine) -> Trace`` with engine "sync" or "async". Never imports torch.
"""

from cbsim.sim.engine import SimResult, run, simulate

__all__ = ["SimResult", "run", "simulate"]
