"""Section 5 of this README: run18 probe_c's two call-4 shapes with the async forward's excess
over the sync one set to call 4's (an estimate of this build's speedup, not a recording).

    python experiments/runtime/h200_run20/estimate_run18.py      (repo root)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "experiments" / "runtime"))
from diag_engine_factors import forward_figures  # noqa: E402

from cbsim.metrics import compute_metrics  # noqa: E402
from cbsim.trace import read_trace  # noqa: E402

# case -> call 4's async forward minus sync forward, us (README section 4)
CALL4_EXCESS_US = {"1b_32x512+1536": 44.0, "8b_24x1024+1024": 92.0}


def main() -> None:
    for case, excess in CALL4_EXCESS_US.items():
        d = ROOT / "experiments/runtime/h200_run18/probe_c" / case
        runs = {e: read_trace(d / f"trace_{e}.json.gz") for e in ("sync", "async")}
        fwd = {e: forward_figures(t)["fwd_us"] for e, t in runs.items()}
        total = {e: compute_metrics(t)["total_time_s"] for e, t in runs.items()}
        steps = runs["async"].other_data["counters"]["steps"]
        saved = (fwd["async"] - fwd["sync"] - excess) * steps / 1e6
        print(
            f"{case}: forward sync {fwd['sync']:.0f} async {fwd['async']:.0f} us, {steps} steps; "
            f"speedup recorded x{total['sync'] / total['async']:.3f}, with +{excess:.0f} us "
            f"x{total['sync'] / (total['async'] - saved):.3f} (async {saved:.3f} s shorter)"
        )


if __name__ == "__main__":
    main()
