"""``run(config, engine)``: simulate one engine and return its trace."""

from __future__ import annotations

import dataclasses
import gc
import logging
from typing import Any

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig, EngineConfig
from cbsim.sim.engine import SimEngine
from cbsim.sim.host import LOOPS
from cbsim.trace import Trace, TraceBuilder
from cbsim.trace import schema as S

log = logging.getLogger("cbsim.sim")


def engine_config(config: CbsimConfig, engine: str) -> EngineConfig:
    """The engine settings this run uses. The sync engine of a comparison (or of an async config)
    runs as the baseline: one IO slot, no carry-over."""
    if engine not in LOOPS:
        raise ConfigError(f"engine={engine!r}; allowed: {', '.join(LOOPS)}")
    e = config.engine
    if engine == "sync" and e.name != "sync":
        return dataclasses.replace(e, name="sync", io_slots=1, carry_over=False)
    if engine == "async" and e.name == "sync":
        raise ConfigError(
            "run(config, 'async') with engine.name=sync: use engine=async or engine=compare"
        )
    return dataclasses.replace(e, name=engine)


def run(config: CbsimConfig, engine: str) -> Trace:
    """Simulate ``engine`` ("sync" or "async") on ``config``; the trace is the whole result."""
    eng = engine_config(config, engine)
    hw = config.hardware
    trace = TraceBuilder(
        "sim", {"engine": engine, "hardware": {"name": hw.name, "source": hw.source}}
    )
    if eng.streams == "default":
        trace.declare_lane(S.DEFAULT)
    sim = SimEngine(config, eng, trace)
    sim.env.process(LOOPS[engine](sim))
    # A run builds ~10^5 long-lived trace dicts and frees nothing cyclic until it ends: the cyclic
    # garbage collector would rescan them again and again (a third of the run time), so it is
    # paused for the run and its garbage collected afterwards.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.env.run()
    finally:
        if was_enabled:
            gc.enable()
    mem = trace.other_data["memory"] = memory(sim)
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
    trace.other_data["sim_counters"] = counters(sim)
    return trace.build()


def memory(sim: SimEngine) -> dict[str, Any]:
    """IO buffers for every slot; graph pool with one pool shared by both slots' graphs (the
    largest) and without (one per slot)."""
    costs, eng, w = sim.costs, sim.engine, sim.config.workload
    longest = max(r.prompt_len + r.max_new_tokens for r in sim.requests)
    per_slot = costs.io_slot_bytes(w.batch_size, w.max_batch_tokens, longest)
    pool = costs.graph_pool_bytes_per_slot(w.batch_size) if eng.cuda_graphs else 0
    largest = costs.graph_size(w.batch_size) or costs.graph_sizes[-1]
    sizes = [s for s in costs.graph_sizes if s <= largest]
    out = {
        "io_slots": eng.io_slots,
        "io_buffer_bytes_per_slot": per_slot,
        "io_buffer_bytes": per_slot * eng.io_slots,
        "graph_pool_bytes_per_slot": pool,
        "graph_pool_bytes": pool,
        "graph_pool_bytes_unshared": pool * eng.io_slots,
        "graphs_captured": len(sizes) * eng.io_slots if eng.cuda_graphs else 0,
        "kv_cache_bytes": sim.sched.kv.num_blocks
        * w.kv_block_size
        * sim.config.model.kv_bytes_per_token,
        "weight_bytes": sim.config.model.weight_bytes,
    }
    needed = out["weight_bytes"] + out["kv_cache_bytes"] + out["io_buffer_bytes"] + pool
    out["device_bytes_needed"] = needed
    out["fits_device"] = bool(needed <= sim.config.hardware.memory_bytes)
    return out


def counters(sim: SimEngine) -> dict[str, Any]:
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
        "trace_events": len(sim.trace.events),
    }


def _simpy_events(sim: SimEngine) -> int:
    """Events SimPy scheduled (it numbers them with a counter; read once, after the run)."""
    eid = getattr(sim.env, "_eid", None)
    return int(next(eid)) if eid is not None else 0
