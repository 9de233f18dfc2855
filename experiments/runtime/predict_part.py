"""What the simulator predicts for a part of experiments/runtime/cases.py, before it is recorded.

    python experiments/runtime/predict_part.py PART [hardware=PROFILE] [--bands]

Each case through `cbsim.api.simulate` (what `python -m cbsim` runs) with both engines: total
time, GPU idle, the async speedup, and the settled SM clock ratio of its median decode step
(hardware.gpu.clock); with --bands also the P5-P95 bands of the speedup and of the sync GPU idle
(`mode.bands=true`, the profile's host spread and model error). GPU idle is the simulator's
(an eager forward's wait for its kernel launches counts idle; the runtime's events count it busy,
as `+experiment=validate` re-times it). Printed as a markdown table;
committed beside the recording it predicts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cases import MATRIX, part_cases  # noqa: E402

from cbsim.api import compose, simulate  # noqa: E402
from cbsim.calibration.steps import StepShape  # noqa: E402
from cbsim.costs import CostModel  # noqa: E402


def decode_clock(cfg) -> float:
    """The settled clock ratio of a full batch's decode step at its mid context."""
    w = cfg.workload
    cm = CostModel(cfg)
    n = w.batch_size
    ctx = w.prompt_len + w.gen_len // 2
    pad = cm.graph_size(n)
    f = cm.forward(
        StepShape(n, n, n * ctx, n, "decode"),
        graph=pad is not None,
        carry_over=True,
        padded_requests=pad,
    )
    return f.clock_ratio


def main(argv: list[str]) -> None:
    part = argv[0]
    if part not in MATRIX:
        raise SystemExit(f"unknown part {part!r}; allowed: {', '.join(MATRIX)}")
    hw = [a for a in argv[1:] if a.startswith("hardware=")] or ["hardware=h200_kernels_calibrated"]
    bands = "--bands" in argv[1:]
    flag = " --bands" if bands else ""
    print(
        f"predicted with {hw[0]} (python experiments/runtime/{Path(__file__).name} {part}{flag})\n"
    )
    extra = " speedup P5-P95 (median) | sync idle P5-P95 |" if bands else ""
    print(f"| case | sync s | async s | speedup | sync idle | async idle | decode clock |{extra}")
    print("| --- " * (7 + 2 * bands) + "|")
    for name, overrides in part_cases(part).items():
        cfg = compose(*overrides, *hw, "engine=compare", f"mode.bands={str(bands).lower()}")
        r = simulate(config=cfg)
        m = r.engine_metrics()
        s, a = m["sync"], m["async"]
        row = (
            f"| {name} | {s['total_time_s']:.3f} | {a['total_time_s']:.3f} | "
            f"x{s['total_time_s'] / a['total_time_s']:.3f} | {s['gpu_idle_fraction']:.2%} | "
            f"{a['gpu_idle_fraction']:.2%} | {decode_clock(cfg):.3f} |"
        )
        if bands:
            b = r.metrics["bands"]
            sp, idle = b["speedup"], b["sync"]["gpu_idle_fraction"]
            row += (
                f" x{sp['p5']:.3f}-x{sp['p95']:.3f} (x{sp['median']:.3f}) | "
                f"{idle['p5']:.2%}-{idle['p95']:.2%} |"
            )
        print(row)


if __name__ == "__main__":
    main(sys.argv[1:])
