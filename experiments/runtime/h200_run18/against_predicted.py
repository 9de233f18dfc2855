"""h200_run18's recorded runs against the predictions committed before its calls (predicted.md:
the point prediction and the P5-P95 bands of hardware=h200_run15_spread).

    python experiments/runtime/h200_run18/against_predicted.py

Prints one markdown row per workload: recorded and predicted totals, speedups, the speedup band and
whether the recorded speedup lies inside it. GPU idle is judged by `+experiment=validate` only:
predicted.md's idle is the simulator's (an eager forward's wait for its kernel launches is idle),
the runtime's CUDA events count that wait busy, and validate re-times the simulated trace as the
events do (cbsim.calibration.simulated.event_timed); the totals and speedups need no such care.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent


def predictions(part: Path) -> dict[str, dict[str, float]]:
    out = {}
    for line in (part / "predicted.md").read_text().splitlines():
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


def recorded(part: Path, case: str) -> dict[str, dict]:
    return json.loads((part / case / "results.json").read_text())[case]["runs"]


def main() -> None:
    print("| part | workload | recorded sync / async s | error sync / async | speedup recorded / "
          "predicted (band) | points | inside the band |")  # fmt: skip
    print("| --- " * 7 + "|")
    inside = within = n = 0
    for part in sorted(p for p in HERE.iterdir() if (p / "predicted.md").exists()):
        for case, p in predictions(part).items():
            runs = recorded(part, case)
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
    main()
