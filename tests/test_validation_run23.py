"""A fifth fresh machine (h200_run23), never fitted: its online runs' decode steps, priced with
the default profile, whose one-wave decode share (gpu.decode_uneven_share) was measured on
h200_run21/22 only."""

from __future__ import annotations

import pytest
from conftest import RECORDINGS, validate_recorded

RUN23 = RECORDINGS / "h200_run23"
ON_RUN23 = pytest.mark.skipif(
    not RUN23.is_dir(), reason="h200_run23 is not committed under experiments/"
)
POISSON = "h200_run23/default_a*/8b_poisson_16/trace_*.json.gz"


def decode_errors(tmp_path, *overrides: str) -> dict[str, float]:
    out = validate_recorded(tmp_path, POISSON, "extra.holdout=profile", *overrides)
    return {r["name"]: r["errors"]["decode_time_pct"] for r in out["runs"]}


@ON_RUN23
def test_uneven_one_wave_decode_steps_of_a_machine_never_fitted(tmp_path):
    """Measured at this commit (validate_default_a_uneven.txt): the 8B at 16 seats, its launches
    of 256 programs, decode time -1.0 to -2.4% in all four runs (two calls, both engines); priced
    at the batch's mean context, as before the share, -4.6 to -8.8%."""
    shared = decode_errors(tmp_path / "share", "hardware=h200")
    mean = decode_errors(tmp_path / "mean", "hardware=h200", "hardware.gpu.decode_uneven_share=0")
    assert len(shared) == 4 and shared.keys() == mean.keys()
    for name, err in shared.items():
        assert abs(err) <= 3.0, (name, err)
        assert mean[name] < -4.0, (name, mean[name])
