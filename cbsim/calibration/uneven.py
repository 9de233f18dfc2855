"""How far a one-wave decode launch moves from its mean context's time toward its longest's.

A decode launch of at most `decode_wave_programs` programs runs in one wave and ends with its
longest request, while kernel tables time even contexts. `hardware.gpu.decode_uneven_share` is
the share of the way from the mean context's price to the longest's that recorded uneven steps
take; it is measured here over recorded async runs, not fitted with the forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cbsim.calibration.recordings import Recorded
from cbsim.calibration.result import Calibration
from cbsim.calibration.steps import StepShape
from cbsim.config.hardware import HardwareConfig
from cbsim.costs.model import CostModel

# a step whose longest context is within this factor of the mean is even: it carries no signal
UNEVEN_FROM = 1.05


def uneven_terms(rec: Recorded, hw: HardwareConfig) -> tuple[float, float]:
    """(recorded - even, longest - even) summed over the run's uneven one-wave decode graph
    steps past its first tenth: the forward priced at its mean context and at its longest (the
    cost model with decode_uneven_share 0 and 1)."""
    models = []
    for share in (0.0, 1.0):
        gpu = dataclasses.replace(hw.gpu, decode_uneven_share=share)
        cfg = dataclasses.replace(rec.config, hardware=dataclasses.replace(hw, gpu=gpu))
        models.append(CostModel(cfg))
    fwd = rec.forward
    dec = fwd[(fwd.kind == "decode") & fwd.graph]
    num = den = 0.0
    for r in dec.iloc[len(dec) // 10 :].itertuples():
        lens = rec.batches.get(int(r.step))
        if lens is None or lens[1].max() <= UNEVEN_FROM * lens[1].mean():
            continue
        pad = models[0].graph_size(len(lens[0]))
        shape = StepShape(
            int(r.requests), int(r.query_tokens), int(r.kv_tokens), int(r.new_tokens), r.kind, lens
        )
        even, longest = (
            m.forward(shape, graph=True, carry_over=bool(r.carry), padded_requests=pad).total_us
            for m in models
        )
        if longest > even:  # a one-wave launch
            num, den = num + r.dur - even, den + longest - even
    return num, den


def measure_uneven_share(recs: Iterable[Recorded], hw: HardwareConfig) -> tuple[float, int]:
    """decode_uneven_share over the async runs of ``recs`` that have uneven one-wave steps, and
    how many runs entered; (nan, 0) when none has."""
    terms = [uneven_terms(r, hw) for r in recs if r.engine == "async"]
    terms = [t for t in terms if t[1] > 0]
    den = sum(t[1] for t in terms)
    return (sum(t[0] for t in terms) / den if den else float("nan")), len(terms)


def fit_uneven_share(recs: list[Recorded], cal: Calibration) -> None:
    """gpu.decode_uneven_share measured over ``recs`` with the profile as fitted so far (its
    forward terms), to three decimals; kept, and said so, when no run has uneven steps."""
    share, runs = measure_uneven_share(recs, cal.hardware)
    key = "gpu.decode_uneven_share"
    if not runs:
        cal.notes.append("decode_uneven_share kept: no async run has uneven one-wave decode steps")
        return
    cal.hardware.gpu.decode_uneven_share = min(max(round(share, 3), 0.0), 1.0)
    cal.provenance[key] = (
        f"measured: cbsim.calibration.uneven.measure_uneven_share over the uneven one-wave "
        f"decode graph steps of {runs} async run(s), with the fitted forward"
    )
