"""GPU-bound async runs on shapes nothing was fitted on (h200_run13, recorded in three device calls
after the loop's cold start, hardware.host.loop_start_us, and their predictions were committed):
the recorded GPU idle, 0.05-0.2% and mostly the run's head, lies inside the predicted band; with
the simulator starting its first step 0.5 ms in, as it did without the term, most fall below."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import RECORDINGS, shipped_async_runs

SESSION = RECORDINGS / "h200_run13"
# the offline cases of calls 1 and 2 (heldout_h, heldout_i) and of call 3 (heldout_j)
OFFLINE_HI = ("8b_8x1024+1024", "3b_48x1536+384", "q7b_16x1024+512", "l13b_32x512+384")
OFFLINE_J = ("3b_8x256+1024", "8b_2x2048+512", "l13b_8x256+768", "q7b_48x256+512")


def _async_runs(out_dir, *overrides: str) -> list[dict]:
    parts = {f"h200_run13/heldout_{p}": OFFLINE_HI for p in "hi"}
    return shipped_async_runs(out_dir, {**parts, "h200_run13/heldout_j": OFFLINE_J}, *overrides)


def _log_ratios(runs: list[dict]) -> np.ndarray:
    """log(simulated / recorded GPU idle) per run."""
    return np.array(
        [np.log(r["sim"]["gpu_idle_fraction"] / r["real"]["gpu_idle_fraction"]) for r in runs]
    )


@pytest.mark.skipif(
    not (SESSION / "heldout_j").is_dir(), reason="h200_run13 is not committed under experiments/"
)
def test_gpu_bound_async_idle_lies_in_its_band_with_the_cold_start(tmp_path):
    """Measured at this commit (docs/validation.md): with the term all 12 inside their bands,
    simulated over recorded idle x0.84-x1.49 (mean abs log 0.13); without it x0.47-x1.14, below
    the recording in 11 of 12 (mean log -0.42)."""
    cold = _async_runs(tmp_path / "cold", "extra.bands=true")
    assert sum(r["in_band"]["gpu_idle_fraction"] for r in cold) >= 11
    assert np.mean(np.abs(_log_ratios(cold))) < 0.2, _log_ratios(cold)
    warm = _log_ratios(_async_runs(tmp_path / "warm", "hardware.host.loop_start_us=0"))
    assert np.mean(warm) < -0.3 and (warm < 0).sum() >= 10, warm
