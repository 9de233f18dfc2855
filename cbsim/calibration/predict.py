"""What a calibrated profile predicts for one workload: both engines simulated (cbsim.sim) with
it, the async engine's speedup and each engine's GPU idle; and, for a profiler import, how the
fitted forward compares with the import's own."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cbsim.calibration.imported import idle_between_decodes
from cbsim.calibration.recordings import Recorded, forward_steps
from cbsim.config import CbsimConfig
from cbsim.config.schema import HardwareConfig
from cbsim.metrics import compute_metrics
from cbsim.trace import schema as S

SHOWN = ("total_time_s", "gpu_idle_fraction", "step_time_ms_p50")


def predict_speedup(config: CbsimConfig, hw: HardwareConfig) -> dict[str, Any]:
    """Sync and async simulated on ``config``'s workload with ``hw`` (the async engine as
    engine=async sets it up: two IO slots, carry-over; the sync one as the baseline)."""
    from cbsim.sim import run

    eng = dataclasses.replace(config.engine, name="async", io_slots=2, carry_over=True)
    cfg = dataclasses.replace(
        config,
        hardware=hw,
        engine=eng,
        mode=dataclasses.replace(config.mode, name="sim"),
    )
    out: dict[str, Any] = {"hardware": hw.name}
    for engine in ("sync", "async"):
        m = compute_metrics(run(cfg, engine))
        out[engine] = {k: m.get(k) for k in SHOWN}
    out["speedup"] = out["sync"]["total_time_s"] / out["async"]["total_time_s"]
    return out


def import_check(rec: Recorded, hw: HardwareConfig) -> dict[str, Any]:
    """The import's median decode forward and idle between decode steps against the
    simulator's (the same config, the fitted profile, its recorded engine)."""
    from cbsim.sim import run

    cfg = dataclasses.replace(rec.config, hardware=hw)
    cfg = dataclasses.replace(cfg, mode=dataclasses.replace(cfg.mode, name="sim"))
    trace = run(cfg, rec.engine)
    sp = trace.spans
    sim = sp[(sp.lane == S.COMPUTE) & sp.name.isin(S.FORWARD_NAMES) & (sp.kind == "decode")]
    fwd = forward_steps(rec)
    real = fwd[fwd.kind == "decode"]
    return {
        "trace": rec.name,
        "decode_forward_ms": {"import": _median_ms(real.dur), "fitted": _median_ms(sim.dur)},
        "idle_between_decodes_ms": {
            "import": _median_ms(idle_between_decodes(rec.spans)),
            "fitted": _median_ms(idle_between_decodes(sp)),
        },
        "step_time_ms_p50": {
            "import": compute_metrics(rec.trace).get("step_time_ms_p50"),
            "fitted": compute_metrics(trace).get("step_time_ms_p50"),
        },
    }


def _median_ms(values) -> float | None:
    v = np.asarray(values, dtype=float)
    return float(np.median(v)) / 1e3 if len(v) else None


def prediction_lines(pred: dict[str, Any], checks: list[dict[str, Any]]) -> list[str]:
    lines = []
    for c in checks:
        f, i = c["decode_forward_ms"], c["idle_between_decodes_ms"]
        p = c["step_time_ms_p50"]
        lines.append(
            f"{c['trace']} (import -> simulated with the profile): decode forward "
            f"{_ms(f['import'])} -> {_ms(f['fitted'])}, GPU idle between decode steps "
            f"{_ms(i['import'])} -> {_ms(i['fitted'])}, step p50 {_ms(p['import'])} -> "
            f"{_ms(p['fitted'])}"
        )
    s, a = pred["sync"], pred["async"]
    lines.append(
        f"predicted with {pred['hardware']}: sync {s['total_time_s']:.4f} s (GPU idle "
        f"{s['gpu_idle_fraction']:.1%}) -> async {a['total_time_s']:.4f} s (GPU idle "
        f"{a['gpu_idle_fraction']:.1%}): async speedup x{pred['speedup']:.3f}"
    )
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"
