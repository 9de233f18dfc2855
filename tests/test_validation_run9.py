"""The final runtime's recordings (h200_run9: one device call per model shape) predict a model
shape and device calls the fit never saw: the 3B shape's offline runs, in the 3b and long calls,
from a profile fitted on the 8b and 1b calls alone (the kernel tables allowed)."""

from __future__ import annotations

import pytest
from conftest import RECORDINGS, validate_recorded

SESSION = RECORDINGS / "h200_run9"
HELD = ("3b/3b_4x256+1024", "3b/3b_1x2048+2048", "3b/3b_64x512+512", "long/3b_32x128+4096")
FIT_ON = ("8b/*", "1b/*")


@pytest.mark.skipif(
    not (SESSION / "3b").is_dir(), reason="h200_run9 is not committed under experiments/runtime/"
)
def test_an_unseen_model_in_unseen_calls_meets_the_run_targets(tmp_path):
    """Batch 1 to 64 of the 3B shape, both engines: total time 3% on all runs but one (the
    one-request sync run, +3.1% with the v2 kernel tables, timed on another machine) and 3.5%
    on every run, step p50 5% on every run, GPU idle 1 pp on all but one; the async speedup within 1 point on 3 of the 4 workloads and
    within 2.0 on all (+2.0 for the one-request run). The miss is the host's level mix: the 3b call ran at the fast level nearly
    throughout (3b_1x2048+2048 sync: 0.2 s slow of 7.3 s) while the fit's calls were mostly slow,
    so the point prediction at their expected factor over-predicts its sync idle (+1.3 pp) and
    speedup (+1.2 points). docs/validation.md has the whole matrix, misses included."""
    trace = ",".join(f"h200_run9/{h}/trace_*.json.gz" for h in HELD)
    fit_on = ",".join(f"h200_run9/{f}/trace_*.json.gz" for f in FIT_ON)
    out = validate_recorded(
        tmp_path,
        trace,
        "hardware=h200_kernels",
        "extra.holdout=fit_on",
        f"extra.fit_on=[{fit_on}]",
        "extra.forward_samples=60",
        "extra.bands=false",
    )
    assert len(out["runs"]) == 2 * len(HELD)
    for r in out["runs"]:
        assert r["held_out"] and r["across_calls"] and r["model"] == "llama3_3b"
        assert not any("3b" in name.split("/")[-2] for name in r["fit_on"])
        met = r["within_target"]
        assert abs(r["errors"]["total_time_pct"]) <= 3.5 and met["step_p50_pct"], r["errors"]
    total_misses = [r["name"] for r in out["runs"] if not r["within_target"]["total_time_pct"]]
    assert len(total_misses) <= 1, total_misses
    idle_misses = [r["name"] for r in out["runs"] if not r["within_target"]["gpu_idle_pp"]]
    assert len(idle_misses) <= 1, idle_misses
    assert len(out["speedups"]) == len(HELD)
    assert sum(p["within_target"] for p in out["speedups"]) >= 3, out["speedups"]
    assert all(abs(p["error_points"]) <= 2.0 for p in out["speedups"]), out["speedups"]
