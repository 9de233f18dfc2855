"""The model error a profile carries (``hardware.model_error``), pooled over validations.

    python experiments/runtime/model_error.py RUN_DIR [RUN_DIR ...]

Each RUN_DIR is a `python -m cbsim +experiment=validate ... extra.bands=true` run directory
(its validation.json). Over all their held-out runs together: per run, the smallest error with
which the recorded total time and GPU idle lie inside the draws' own band, per workload the
same for the async speedup (cbsim.widening.needed_error), then the error that holds 90% of
them (cbsim.widening.covering_error): split conformal over the pooled runs. Prints the
values to put under model_error: in the profile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cbsim.validation.summary import BAND_COVERAGE
from cbsim.widening import covering_error, needed_error, run_needed


def needed(doc: dict) -> tuple[list[dict], list[dict]]:
    runs = [
        run_needed(r["real"], r["sim"], r["draw_band"])
        for r in doc["runs"]
        if r.get("held_out") and r.get("draw_band")
    ]
    pairs = [
        {"speedup": needed_error("speedup", p["recorded"], p["predicted"], *p["draw_band"])}
        for p in doc["speedups"]
        if p.get("held_out") and p.get("draw_band") and p.get("recorded") is not None
    ]
    return runs, pairs


def main(dirs: list[str]) -> None:
    runs, pairs = [], []
    for d in dirs:
        r, p = needed(json.loads((Path(d) / "validation.json").read_text()))
        runs += r
        pairs += p
    error = {**(covering_error(runs, BAND_COVERAGE) or {}), **(covering_error(pairs) or {})}
    print(f"{len(runs)} runs, {len(pairs)} workloads from {len(dirs)} validation(s)")
    for k, v in sorted(error.items()):
        print(f"  {k}: {v:.3g}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
