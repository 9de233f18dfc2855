"""One simulated run: set up (cbsim.run_setup, as the runtime does), run a loop, return the trace."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from typing import Any

from cbsim.config.hardware import HardwareConfig
from cbsim.config.schema import CbsimConfig
from cbsim.run_setup import RunSetup, setup_run
from cbsim.sim.host_phases import HostPhases
from cbsim.sim.loop import LOOPS
from cbsim.sim.progress import run_with_progress
from cbsim.sim.recorder import CHUNK_SPANS
from cbsim.trace import Trace, TraceBuilder
from cbsim.trace import schema as S
from cbsim.trace.hardware import BASIS_PROFILE
from cbsim.trace.window import StepWindows

log = logging.getLogger("cbsim.sim")


def setup_sim(config: CbsimConfig, engine: str) -> RunSetup:
    """The shared setup, with the simulator's EOS (the last vocabulary id, sampled as the last of
    each drawn length of tokens)."""
    return setup_run(
        config, engine=engine, eos_token_id=config.model.vocab_size - 1, eos_headroom=True
    )


@dataclass
class SimResult:
    """One simulated engine: its trace (when asked for), what its metrics are computed from
    (``cbsim.metrics.MetricInputs(**result.tables)``: the run folded as it ran, without a trace
    only), its memory estimate, the simulator's own counts and, without a trace when asked, the
    windows of spans the report draws (cbsim.trace.window)."""

    engine: str
    trace: Trace | None
    tables: dict[str, Any] | None
    memory: dict[str, Any]
    counters: dict[str, Any]
    windows: StepWindows | None = None


def run(config: CbsimConfig, engine: str, *, fast_forward: bool = True) -> Trace:
    """Simulate ``engine`` ("sync" or "async") on ``config``; the trace is the whole result.
    ``fast_forward=False`` steps through steady stretches one step at a time (for checks)."""
    return simulate(config, engine, want_trace=True, fast_forward=fast_forward).trace


def simulate(
    config: CbsimConfig,
    engine: str,
    want_trace: bool = False,
    *,
    fast_forward: bool = True,
    config_dict: dict[str, Any] | None = None,
    chunk: int = CHUNK_SPANS,
    window: int | None = None,
) -> SimResult:
    """Simulate ``engine``; with ``want_trace`` the trace, else the run folded for its metrics
    (the same numbers, no events built, memory that does not grow with the steps).
    ``config_dict``: the resolved config the tables carry for the metrics that read it
    (bandwidth, SLOs), as a trace's otherData.config does. ``chunk``: without a trace, the spans
    buffered before they are folded (the same numbers whatever it is; small ones check that).
    ``window``: without a trace, keep the spans of windows of this many steps for the report."""
    setup = setup_sim(config, engine)
    eng, hw = setup.engine, config.hardware
    trace = None
    if want_trace:
        trace = TraceBuilder("sim", {"engine": engine, "hardware": profile_hardware(hw)})
        if eng.streams == "default":
            trace.declare_lane(S.DEFAULT)
    sim = HostPhases(config, setup, trace, chunk, window)
    sim.fast_forward_on = fast_forward
    sim.env.process(LOOPS[engine](sim))
    _run(sim, config, setup, engine, trace)
    mem = memory(sim, setup)
    if not mem["fits_device"]:
        # a what-if may exceed the device on purpose (llama3_70b on one H200): say so, run anyway
        log.warning(
            "%s engine: weights + KV cache + IO buffers + graph pool = %.1f GB exceed "
            "hardware.memory_bytes=%.1f GB; this configuration would not fit one %s",
            engine,
            mem["device_bytes_needed"] / 1e9,
            hw.memory_bytes / 1e9,
            hw.name,
        )
    counts = counters(sim)
    if trace is not None:
        trace.other_data["memory"] = mem
        trace.other_data["sim_counters"] = counts
        return SimResult(engine, trace.build(), None, mem, counts)
    tables = {
        **sim.rec.tables(),
        "source": "sim",
        "engine": engine,
        "memory": mem,
        "config": config_dict,
        "counters": None,
    }
    return SimResult(engine, None, tables, mem, counts, sim.rec.window)


def profile_hardware(hw: HardwareConfig) -> dict[str, Any]:
    """otherData.hardware of a simulation: the profile's GPU, labelled as the profile's (no
    machine was read or measured)."""
    return {
        "basis": BASIS_PROFILE,
        "name": hw.name,
        "source": hw.source,
        "device_name": hw.device_name,
        "memory_bytes": hw.memory_bytes,
        "hbm_bandwidth": hw.hbm_bandwidth,
    }


def _run(
    sim: HostPhases, config: CbsimConfig, setup: RunSetup, engine: str, trace: TraceBuilder | None
) -> None:
    """The SimPy environment run to its end, with the collector paused and a progress bar when
    asked; an interrupt hands the trace so far to the app."""
    # A run builds ~10^5 long-lived dicts and frees nothing cyclic until it ends: the cyclic
    # garbage collector would rescan them again and again (a third of the run time), so it is
    # paused for the run and its garbage collected afterwards.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if config.output.progress is True:
            total = sum(r.max_new_tokens for r in setup.requests)
            run_with_progress(sim.env, sim.n, total, f"simulating {engine}")
        else:
            sim.env.run()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the trace so far, for the app to keep
        if trace is not None:
            exc.partial_trace = trace.build().mark_incomplete("interrupted")  # type: ignore[attr-defined]
        raise
    finally:
        if was_enabled:
            gc.enable()


def memory(sim: HostPhases, setup: RunSetup) -> dict[str, Any]:
    """The device-fit estimate (cbsim.run_setup.DeviceFit) with its parts per slot: IO buffers
    for every slot; one graph pool shared by both slots' graphs (the largest) and without (one
    per slot)."""
    costs, eng, fit, slots = sim.costs, setup.engine, setup.fit, setup.io_slots
    pool = fit.parts["graph_pool_bytes"]
    largest = costs.graph_size(sim.config.workload.batch_size) or costs.graph_sizes[-1]
    sizes = [s for s in costs.graph_sizes if s <= largest]
    return {
        "io_slots": slots,
        "io_buffer_bytes_per_slot": fit.parts["io_buffer_bytes"] // slots,
        "io_buffer_bytes": fit.parts["io_buffer_bytes"],
        "graph_pool_bytes_per_slot": pool,
        "graph_pool_bytes": pool,
        "graph_pool_bytes_unshared": pool * slots,
        # a decode graph per batch size; a piecewise step's layers + 1 per token bucket
        "graphs_captured": (len(sizes) + len(costs.token_buckets) * (costs.layers + 1)) * slots
        if eng.cuda_graphs
        else 0,
        "kv_cache_bytes": fit.parts["kv_cache_bytes"],
        "weight_bytes": fit.parts["weight_bytes"],
        "device_bytes_needed": fit.bytes_needed,
        "fits_device": fit.fits,
    }


def counters(sim: HostPhases) -> dict[str, Any]:
    """The simulator's own counts, for checking metrics computed from the trace."""
    # the run ends when the host is done and, without event waits, when the GPU is
    n = sim.n
    total = max(sim.env.now, *(st.tail for st in sim.device.streams))
    gpu_lane = S.DEFAULT if sim.device.default_stream else S.COMPUTE
    busy = sim.lane_busy_us[gpu_lane]
    steps = n["steps"]
    return {
        "total_us": total,
        "steps": steps,
        "generated_tokens": n["generated_tokens"],
        "dropped_tokens": n["dropped_tokens"],
        "requests": len(sim.requests),
        "requests_finished": n["requests_finished"],
        "preemptions": sim.sched.num_preemptions,
        "host_blocks": n["host_blocks"],
        "host_blocks_per_step": n["host_blocks"] / steps if steps else 0.0,
        "host_blocked_us": n["host_blocked_us"],
        "host_idle_us": n["idle_us"],
        "host_stalls": n["host_stalls"],
        "host_stall_us": n["host_stall_us"],
        "host_phase_us": dict(sorted(sim.host_us.items())),
        "gpu_lane": gpu_lane,
        "gpu_busy_us": busy,
        "gpu_idle_fraction": 1.0 - busy / total if total > 0 else 0.0,
        "lane_busy_us": dict(sorted(sim.lane_busy_us.items())),
        "graph_steps": n["graph_steps"],
        "eager_steps": n["eager_steps"],
        "kernels_launched": n["kernels_launched"],
        "carry_over_steps": n["carry_over_steps"],
        "launch_wait_us": n["launch_wait_us"],
        "hazards": sum(sim.hazards.values()),
        "hazards_by_kind": dict(sorted(sim.hazards.items())),
        "simpy_events": _simpy_events(sim),
        "trace_events": sim.rec.num_events,
    }


def _simpy_events(sim: HostPhases) -> int:
    """Events SimPy scheduled (it numbers them with a counter; read once, after the run)."""
    eid = getattr(sim.env, "_eid", None)
    return int(next(eid)) if eid is not None else 0
