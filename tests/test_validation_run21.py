"""The profile fitted on the final runtime's recordings judged on a machine it never saw
(h200_run21: fitted on final_a and final_b, two fresh machines; final_c, a third, with shapes no
fitted run has, predicted with its bands before the call)."""

from __future__ import annotations

import pytest
from conftest import RECORDINGS, recorded, validate_recorded

RUN21 = RECORDINGS / "h200_run21"
ON_RUN21 = pytest.mark.skipif(
    not RUN21.is_dir(), reason="h200_run21 is not committed under experiments/"
)
# four of final_c's workloads, four model shapes (the shortest to simulate)
FINAL_C = ",".join(
    f"h200_run21/final_c/{case}/trace_*.json.gz"
    for case in ("8b_48x512+768", "l13b_48x256+384", "q7b_96x256+384", "1b_8x4096+1024")
)


@ON_RUN21
def test_the_final_runtimes_profile_predicts_a_machine_and_shapes_it_never_saw(tmp_path):
    """Measured at this commit (h200_run21/README.md, all 24 runs of final_c): 4 of 12 speedups
    within 1 point, 75% of runs inside P5-P95; these four workloads: speedups +0.1, -0.9, -0.1,
    -2.6 points, each inside its band."""
    out = validate_recorded(
        tmp_path,
        FINAL_C,
        "hardware=h200_run21_spread",
        "extra.holdout=profile",
        "extra.bands=true",
    )
    pairs = {p["workload"].split("/")[-1]: p for p in out["speedups"]}
    assert len(out["runs"]) == 8 and len(pairs) == 4
    assert all(p["in_band"] for p in pairs.values()), pairs
    for case in ("8b_48x512+768", "l13b_48x256+384", "q7b_96x256+384"):
        assert abs(pairs[case]["error_points"]) <= 1.0, pairs[case]
    # the 1B at 8 requests: its async replays run long at short contexts (README, section 3)
    assert pairs["1b_8x4096+1024"]["error_points"] < 0, pairs["1b_8x4096+1024"]


@ON_RUN21
def test_a_recording_before_the_padding_ran_its_eager_steps_unpadded():
    """engine.eager_token_multiple came after h200_run21: its traces do not carry it, so the
    simulator replays their eager steps over their own token counts."""
    old = recorded("h200_run21/final_c2/1b_poisson_96/trace_sync.json.gz")
    assert "eager_token_multiple" not in old.trace.other_data
    assert old.config.engine.eager_token_multiple == 1
