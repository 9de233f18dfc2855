"""Recorded runs against the predictions committed before their calls (predict_part.py's table
with --bands: the point prediction and the P5-P95 bands of the profile it names).

    python experiments/runtime/against_predicted.py SESSION [PREDICTED.md PART ...]

With the session alone (h200_run18), every part holding a predicted.md; with a table and parts
(h200_run21 predicted_final_c.md final_c final_c2), each part's cases found in that table.

Prints one markdown row per workload: recorded and predicted totals, speedups, the speedup band and
whether the recorded speedup lies inside it. GPU idle is judged by `+experiment=validate` only:
predicted.md's idle is the simulator's (an eager forward's wait for its kernel launches is idle),
the runtime's CUDA events count that wait busy, and validate re-times the simulated trace as the
events do (cbsim.calibration.simulated.event_timed); the totals and speedups need no such care.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def predictions(table: Path) -> dict[str, dict[str, float]]:
    out = {}
    for line in table.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 9 or cells[0] in ("case", "---"):
            continue
        lo, hi = (float(x) for x in re.findall(r"x([\d.]+)", cells[7])[:2])
        out[cells[0]] = {
            "sync": float(cells[1]),
            "async": float(cells[2]),
            "speedup": float(cells[3][1:]),
            "band": (lo, hi),
        }
    return out


def recorded(part: Path, case: str) -> dict[str, dict] | None:
    own = part / case / "results.json"  # one process per case; else one for the part
    results = json.loads((own if own.exists() else part / "results.json").read_text())
    return results[case]["runs"] if "runs" in results.get(case, {}) else None


def pairs(argv: list[str]) -> list[tuple[Path, Path]]:
    """(part directory, its predictions' table) for every part to compare."""
    session = HERE / argv[0]
    if len(argv) == 1:
        parts = sorted(p for p in session.iterdir() if (p / "predicted.md").exists())
        return [(p, p / "predicted.md") for p in parts]
    return [(session / part, session / argv[1]) for part in argv[2:]]


def main(argv: list[str]) -> None:
    print("| part | workload | recorded sync / async s | error sync / async | speedup recorded / "
          "predicted (band) | points | inside the band |")  # fmt: skip
    print("| --- " * 7 + "|")
    inside = within = n = 0
    for part, table in pairs(argv):
        for case, p in predictions(table).items():
            runs = recorded(part, case)
            if runs is None:
                continue
            s, a = (runs[e]["metrics"] for e in ("sync", "async"))
            rs, ra = s["total_time_s"], a["total_time_s"]
            speedup = rs / ra
            lo, hi = p["band"]
            ok = lo <= speedup <= hi
            points = 100 * (p["speedup"] - speedup)
            inside, n = inside + ok, n + 1
            within += abs(points) <= 1.0
            print(
                f"| {part.name} | {case} | {rs:.2f} / {ra:.2f} | "
                f"{100 * (p['sync'] / rs - 1):+.1f}% / {100 * (p['async'] / ra - 1):+.1f}% | "
                f"x{speedup:.3f} / x{p['speedup']:.3f} (x{lo:.3f}-x{hi:.3f}) | {points:+.1f} | "
                f"{'yes' if ok else 'no'} |"
            )
    print(f"\n{n} workloads: speedup within 1 point {within}, inside its band {inside}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["h200_run18"])
