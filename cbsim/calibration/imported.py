"""Profiler imports as calibration data: a torch.profiler (Kineto) trace of someone else's engine
carries no run config, so the command line's (model, workload, engine) is taken as its run config
(``extra.workload_from_cli=true``), and what the import measures is fitted besides the forward:
the kernels per step and the GPU's gap per kernel (``kernels``, ``kernel_busy_us`` per forward),
and, for a sync engine that names no host phases, the host's time between steps."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pandas as pd

from cbsim.calibration.fit import Fit
from cbsim.calibration.recordings import Recorded, forward_steps
from cbsim.calibration.result import Calibration, Row, set_quantile
from cbsim.config import CbsimConfig, ConfigError
from cbsim.trace import schema as S

log = logging.getLogger("cbsim")

HOST_PHASES = (S.SCHEDULE, S.PREPARE, S.UPDATE)


def has_run_config(rec: Recorded) -> bool:
    other = rec.trace.other_data
    return "config" in other or "config_overrides" in other


def assume_cli_config(recs: list[Recorded], config: CbsimConfig) -> list[str]:
    """Each trace without a run config takes ``config`` (the command line's) as its run config;
    one line per such trace saying so."""
    lines = []
    for rec in recs:
        if has_run_config(rec):
            continue
        if config.engine.name not in ("sync", "async"):
            raise ConfigError(
                f"engine={config.engine.name}: {rec.path} carries no run config, so the "
                "command line says what it ran; give the engine it was, engine=sync or "
                "engine=async (sync: the host waits for every step)"
            )
        rec.assumed = config
        w = config.workload
        lines.append(
            f"{rec.name}: no run config in the trace; taken from the command line: "
            f"model={config.model.name}, engine={config.engine.name}, batch_size="
            f"{w.batch_size}, prompt_len={w.prompt_len}, gen_len={w.gen_len}, "
            f"base hardware={config.hardware.name}"
        )
    return lines


def fit_import_kernels(recs: list[Recorded], cal: Calibration) -> None:
    """Kernels per decode and per prefill step (medians over the imports' forwards) as the cost
    model's kernel counts, and the per-kernel gap of graph replays and of eager forwards whose
    kernels kept the GPU busy (the host-bound first step left out)."""
    fwd = pd.concat([forward_steps(r) for r in recs]) if recs else pd.DataFrame()
    if fwd.empty or "kernels" not in fwd or fwd.kernels.isna().all():
        return
    fwd = fwd[fwd.kernels > 0]
    g, layers = cal.hardware.gpu, recs[0].config.model.num_layers
    decode = fwd[fwd.kind == "decode"].kernels
    prefill = fwd[fwd.kind == "prefill"].kernels
    counts: dict[str, float] = {}
    if len(decode):
        n = int(decode.median())
        counts |= {"kernels_per_layer": n // layers, "kernels_extra": n % layers}
        counts["decode_kernels_per_layer"] = 0
        if len(prefill):
            more = max(int(prefill.median()) - n, 0)
            counts |= {"prefill_kernels_per_layer": more // layers}
            counts["prefill_kernels_extra"] = more % layers
    if counts:
        prior = {k: float(getattr(g, k)) for k in counts}
        # another engine's counts: used as they are, whatever mode.fuse_epilogues says
        ints = {k: int(v) for k, v in counts.items()}
        cal.hardware.gpu = g = dataclasses.replace(g, **ints, kernel_counts_of="engine")
        fit = Fit(counts, dict.fromkeys(counts, True), np.zeros(len(fwd)))
        cal.rows.append(Row("kernels per step (import)", len(fwd), fit, prior))
    busy = fwd.kernel_busy_us.notna() & (fwd.kernel_busy_us >= 0.5 * fwd.dur)
    gap = (fwd.dur - fwd.kernel_busy_us) / fwd.kernels
    for graph, attr in ((True, "graph_node_gap_us"), (False, "eager_kernel_gap_us")):
        y = gap[busy & (fwd.graph == graph)].to_numpy()
        if len(y):
            set_quantile(cal, f"kernel gap (import{', graph' if graph else ''})", y, g, attr)


def idle_between_decodes(sp: pd.DataFrame) -> np.ndarray:
    """The compute lane's idle before each decode forward that follows a decode forward."""
    lane = S.COMPUTE if (sp.lane == S.COMPUTE).any() else S.DEFAULT
    fwd = sp[(sp.lane == lane) & sp.name.isin(S.FORWARD_NAMES)].sort_values("ts")
    fwd = fwd.drop_duplicates("step")
    idle = fwd.ts.to_numpy()[1:] - fwd.end.to_numpy()[:-1]
    both = (fwd.kind.to_numpy()[1:] == "decode") & (fwd.kind.to_numpy()[:-1] == "decode")
    return idle[both]


def fit_import_host(recs: list[Recorded], cal: Calibration, rounds: int = 3) -> None:
    """A sync engine's GPU idles between steps while its host works (wait, update, schedule,
    prepare, launch): without host-phase ranges to fit, the median idle between decode steps
    is matched by the simulator's (same config, the fitted profile) through
    ``host.prepare.fixed_us``, the phase every step pays once."""
    recs = [r for r in recs if r.engine == "sync" and not _names_phases(r)]
    measured = [idle_between_decodes(r.spans) for r in recs]
    if not recs or not sum(len(m) for m in measured):
        return
    host = cal.hardware.host
    prior, target = host.prepare.fixed_us, float(np.median(np.concatenate(measured)))
    sim = _simulated_idle(recs, cal)
    for _ in range(rounds):
        if not len(sim) or abs(float(np.median(sim)) - target) < 0.5:
            break
        fixed = max(host.prepare.fixed_us + target - float(np.median(sim)), 0.0)
        host.prepare = dataclasses.replace(host.prepare, fixed_us=fixed)
        sim = _simulated_idle(recs, cal)
    y = np.concatenate(measured)
    res = (float(np.median(sim)) - y) / max(target, 1e-9)
    fit = Fit({"fixed_us": host.prepare.fixed_us}, {"fixed_us": True}, res)
    what = "prepare (import: GPU idle between decode steps)"
    cal.rows.append(Row(what, len(y), fit, {"fixed_us": prior}))
    cal.notes.append(
        f"host time between steps from the import: GPU idle {target / 1e3:.3f} ms per decode "
        f"step, simulated {float(np.median(sim)) / 1e3:.3f} ms with host.prepare.fixed_us="
        f"{host.prepare.fixed_us:.0f} us (the import names no host phases)"
    )


def _simulated_idle(recs: list[Recorded], cal: Calibration) -> np.ndarray:
    from cbsim.sim import run

    out = []
    for r in recs:
        cfg = dataclasses.replace(r.config, hardware=cal.hardware)
        cfg = dataclasses.replace(cfg, mode=dataclasses.replace(cfg.mode, name="sim"))
        out.append(idle_between_decodes(run(cfg, "sync").spans))
    return np.concatenate(out)


def _names_phases(rec: Recorded) -> bool:
    sp = rec.spans
    return bool(((sp.lane == S.HOST) & sp.name.isin(HOST_PHASES)).any())
