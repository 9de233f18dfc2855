"""The simulator's cost model: every duration the SimPy model uses comes from here.

``model.py`` holds ``CostModel`` (the roofline, copies; ``host_phase_costs.py`` the host phases;
``buffer_bytes.py`` what a step stages and the runtime allocates; ``step_tables.py`` a step's
attention groups and decode launch, worked out once per batch; ``mixed_graphs.py`` steps with
prompt tokens replayed from piecewise graphs; a forward's cost is ``forward_cost.py``'s
``ForwardCost``); a hardware profile with ``kernel_table`` set
costs the forward's kernels from measured times instead (``kernel_table.py`` reads and
interpolates the table, ``kernels.py`` sums a step's kernels); ``clock.py`` stretches a
forward's compute-bound GEMM time at the clock the power cap settles at.
"""

from cbsim.costs.buffer_bytes import INT32, INT64, REQUEST_META_BYTES, SAMPLE_META_BYTES
from cbsim.costs.model import CostModel, ForwardCost, roofline_us

__all__ = [
    "INT32",
    "INT64",
    "REQUEST_META_BYTES",
    "SAMPLE_META_BYTES",
    "CostModel",
    "ForwardCost",
    "roofline_us",
]
