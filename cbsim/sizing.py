"""A run's size before it starts: steps, trace events, peak memory and wall time from the config.

The preflight (before Hydra makes a directory), ``cbsim.api.simulate`` and ``cbsim.sweep.grid``
call ``check_size``: a run whose estimate is over this machine (``limits.max_memory_gb``), over a
trace cbsim reads back (``limits.max_trace_mb``) or past the time a trace can hold is refused in
one line naming the key that makes it large, the estimate, the limit and the override. The
estimate reads the config and the drawn request shapes only (no scheduler, no cost tables): well
under a second for 16M requests.

Steps: prompt chunks of ``max_batch_tokens`` plus decode steps, at least one wave's longest
request and at most every request alone; Poisson arrivals decode over the time requests are in
flight (each for its new tokens at a step the weights' streaming bounds). The per-step and
per-event costs below are measured on this project's simulator (llama3_8b on h200, 32-2048
requests, 2-core host): a step writes 8.2 events; an event is 280 bytes of JSON.

Memory: a simulation that builds its trace (output.trace) holds every event until it is
written; one that does not (output.trace=false, and a band's draws) folds its spans as it runs
(cbsim.trace.fold) and holds a few numbers a step (benchmarks/bench_sim_memory.py); with its
report on it also keeps a few windows of steps' spans (cbsim.trace.window) and each engine's fold
until the page is written, which draws a few more numbers a step. All hold a few hundred bytes a
request and a few a KV block, and no token id: the workload draws prompt ids only for a back end
that reads them and the simulator's scheduler keeps counts (cbsim.workload.PromptIds,
Scheduler(keep_tokens=False)). The runtime keeps every token id.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig
from cbsim.job_metrics import wants_bands
from cbsim.trace.checks import MAX_TS_US
from cbsim.trace.load import DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS
from cbsim.workload import draw_shapes

EVENTS_PER_STEP = 8.2
JSON_BYTES_PER_EVENT = 280
# the interpreter with numpy, pandas, simpy and the cost tables (a 32-request run: 100 MB)
BASE_BYTES = 150e6
# a built trace, its metric tables and the report's frames, per event (peak RSS, 256 requests)
TRACED_BYTES_PER_EVENT = 2.0e3
# without a trace: the fold's numbers per step (a forward's step, end and tokens, each host
# phase's duration) and their copies while joined (peak RSS: 117 bytes a step at 20K-80K steps)
UNTRACED_BYTES_PER_STEP = 150
# without a trace: the spans buffered before they are folded, and the folding's tables
FOLD_BUFFER_BYTES = 30e6
# without a trace, the report on: plotly.js, the windows' spans and the figures, and per step
# and engine the per-step series and charts drawn from the fold (peak RSS: 210 bytes a step
# over the fold's at 20K-80K steps, 40 MB at 20K)
REPORT_FIXED_BYTES = 40e6
REPORT_BYTES_PER_STEP = 250
# a simulation's request: its scheduler row, its Request, its row in the fold (peak RSS grew
# 541-557 bytes a request from 50K to 200K requests of 16 + 4 tokens without a trace, two runs;
# 1,724 while the token ids were kept: benchmarks/bench_sim_memory.py, "many requests")
SIM_BYTES_PER_REQUEST = 560
# a simulation's KV block (of the cache, and of an admitted request's block table): the block
# manager's 9 bytes (free stack, used map, scratch) and the table's 4, as allocated; peak RSS
# grew 8.2-9.3 bytes a block (benchmarks/bench_sim_memory.py, "long prompts")
SIM_BYTES_PER_KV_BLOCK = 13
# the runtime's request: its row, prompt ids (int32) and each output token (the scheduler's
# buffers: it feeds the prompts and returns the outputs)
BYTES_PER_REQUEST = 600
BYTES_PER_PROMPT_TOKEN = 4
BYTES_PER_OUTPUT_TOKEN = 16
# simulated steps a second of wall time on this 2-core host (traced: the trace built and written)
TRACED_STEPS_PER_S = 4e3
UNTRACED_STEPS_PER_S = 5e3
# a simulated request's own wall time (drawn, queued, admitted, retired, folded): 24.7 us from
# 50K to 200K requests of few steps (benchmarks/bench_sim_memory.py, "many requests"); 23 us in
# a 1M-request run of 78K steps (128 + 16 tokens, batch 256, engine=async, 42 s)
SIM_S_PER_REQUEST = 25e-6
# starting Python, composing the config, writing the report
STARTUP_S = 3.0
# the limit on memory when limits.max_memory_gb is None: this share of physical memory
MEMORY_SHARE = 0.8
# the fastest decode step the Poisson estimate assumes (host-bound small models)
MIN_STEP_S = 3e-4


def physical_memory_bytes() -> int:
    """This machine's physical memory (what a run on the CPU, and the simulator, can use)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@dataclass(frozen=True)
class Estimate:
    """One run's size: per engine steps and trace events; for the whole run the largest trace
    file, peak memory and wall time."""

    steps: int
    events: int
    trace_events: int  # the largest trace file's (a comparison's merged file holds both runs)
    trace_bytes: int
    memory_bytes: int
    # the peak memory of the same simulation without a trace or a report (its spans folded)
    untraced_memory_bytes: int
    # ... without a trace, its report on (drawn from the folds and windows of steps)
    windowed_memory_bytes: int
    wall_s: float
    bands_s: float  # the part of wall_s the bands' draws take (mode.bands)
    span_s: float  # the last arrival, simulated seconds
    driver: str  # the key that makes the run this large, as key=value

    def describe(self) -> str:
        text = (
            f"about {self.steps:,} steps and {self.events:,} trace events an engine, "
            f"{_size(self.memory_bytes)} peak memory, {_duration(self.wall_s)}"
        )
        if self.bands_s > 0.5 * self.wall_s and self.wall_s > 60:
            rest = _duration(self.wall_s - self.bands_s)
            text += (
                f" ({_duration(self.bands_s)} of it the bands' draws: {rest} with mode.bands=false)"
            )
        return text


def _size(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def decode_step_s(cfg: CbsimConfig) -> float:
    """A decode step's time as the weights' streaming bounds it (the Poisson estimate's clock)."""
    hw = cfg.hardware
    return max(MIN_STEP_S, cfg.model.weight_bytes / (hw.hbm_bandwidth * hw.gpu.gemm_bandwidth_eff))


def busy_seconds(arrival: np.ndarray, seconds: np.ndarray) -> float:
    """The length of the union of [arrival, arrival + seconds) (arrivals sorted)."""
    ends = arrival + seconds
    reach = np.maximum.accumulate(ends)
    before = np.concatenate(([-np.inf], reach[:-1]))
    return float(np.maximum(reach - np.maximum(arrival, before), 0.0).sum())


def estimate_steps(cfg: CbsimConfig) -> tuple[int, float, str]:
    """Steps of one engine, the last arrival (s) and the key that drives the count."""
    w = cfg.workload
    prompt, gen, arrival = draw_shapes(w)
    n, total_gen = len(gen), int(gen.sum())
    prefill = -(-int(prompt.sum()) // w.max_batch_tokens)
    decode = max(-(-total_gen // w.batch_size), int(gen.max()))
    span_s = float(arrival[-1])
    if w.arrival == "poisson":
        step_s = decode_step_s(cfg)
        in_flight = busy_seconds(arrival, gen * step_s) / step_s
        decode = max(decode, min(total_gen, int(in_flight)))
    driver = (
        f"workload.num_requests={n}"
        if w.num_requests is not None and n > w.batch_size
        else f"workload.gen_len={w.gen_len}"
    )
    return prefill + decode, span_s, driver


def estimate(cfg: CbsimConfig, in_sweep: bool = False) -> Estimate:
    """The size of ``cfg``'s run (``in_sweep``: as a sweep's job decides its outputs)."""
    out = cfg.output.decided(in_sweep)
    steps, span_s, driver = estimate_steps(cfg)
    engines = 2 if cfg.engine.name == "compare" else 1
    events = int(steps * EVENTS_PER_STEP)
    trace_events = events * engines if engines > 1 else events
    fixed = BASE_BYTES + request_bytes(cfg)
    # engines run one after the other: without a trace, one engine's fold at a time; with the
    # report, every engine's fold until the page is written
    untraced = fixed + steps * UNTRACED_BYTES_PER_STEP + FOLD_BUFFER_BYTES
    per_step = engines * (UNTRACED_BYTES_PER_STEP + REPORT_BYTES_PER_STEP)
    windowed = fixed + steps * per_step + FOLD_BUFFER_BYTES + REPORT_FIXED_BYTES
    if cfg.mode.name == "runtime":
        memory = fixed + runtime_bytes(cfg) if cfg.mode.device.startswith("cpu") else fixed
        wall = STARTUP_S + steps * engines * decode_step_s(cfg)
        bands_s = 0.0
    else:
        traced = bool(out.trace)
        memory = fixed + events * TRACED_BYTES_PER_EVENT * engines
        if not traced:
            memory = windowed if out.report else untraced
        rate = TRACED_STEPS_PER_S if traced else UNTRACED_STEPS_PER_S
        requests_s = cfg.workload.total_requests * SIM_S_PER_REQUEST  # each simulation
        bands_s = band_draws(cfg, in_sweep) * (steps / UNTRACED_STEPS_PER_S + requests_s)
        wall = STARTUP_S + engines * (steps / rate + requests_s) + bands_s
    return Estimate(
        steps=steps,
        events=events,
        trace_events=trace_events if out.trace else 0,
        trace_bytes=trace_events * JSON_BYTES_PER_EVENT if out.trace else 0,
        memory_bytes=int(memory),
        untraced_memory_bytes=int(untraced),
        windowed_memory_bytes=int(windowed),
        wall_s=wall,
        bands_s=bands_s,
        span_s=span_s,
        driver=_driver(cfg, span_s, driver),
    )


def _driver(cfg: CbsimConfig, span_s: float, steps_driver: str) -> str:
    """The key to name: the rate past a trace's time, the model on a runtime, else the key
    that sets the step count."""
    if span_s * 1e6 > MAX_TS_US:
        return f"workload.rate={cfg.workload.rate:g}"
    return f"model={cfg.model.name}" if cfg.mode.name == "runtime" else steps_driver


def band_draws(cfg: CbsimConfig, in_sweep: bool) -> int:
    """Simulations the bands add (cbsim.bands: both engines per draw), 0 without bands."""
    return 2 * cfg.hardware.host.spread.draws if wants_bands(cfg, in_sweep) else 0


def request_bytes(cfg: CbsimConfig) -> int:
    """What the requests hold on the host: a simulation's rows and KV blocks, or the
    runtime's rows and token ids."""
    w = cfg.workload
    n = w.total_requests
    if cfg.mode.name == "runtime":
        per_token = w.prompt_len * BYTES_PER_PROMPT_TOKEN + w.gen_len * BYTES_PER_OUTPUT_TOKEN
        return n * (BYTES_PER_REQUEST + per_token)
    blocks = n * -(-(w.prompt_len + w.gen_len) // w.kv_block_size)
    return n * SIM_BYTES_PER_REQUEST + blocks * SIM_BYTES_PER_KV_BLOCK


def runtime_bytes(cfg: CbsimConfig) -> int:
    """Weights and the whole KV cache, as the runtime allocates them on its device."""
    w, model = cfg.workload, cfg.model
    blocks = w.kv_num_blocks
    if blocks is None:
        blocks = w.total_requests * -(-(w.prompt_len + w.gen_len) // w.kv_block_size)
    return model.weight_bytes + blocks * w.kv_block_size * model.kv_bytes_per_token


def memory_limit(cfg: CbsimConfig) -> tuple[int, str]:
    """The memory a run may take, and where that figure comes from."""
    physical = physical_memory_bytes()
    if cfg.limits.max_memory_gb is not None:
        return int(cfg.limits.max_memory_gb * 1e9), "set"
    share = f"{MEMORY_SHARE:.0%} of this machine's {physical / 1e9:.3g} GB"
    return int(MEMORY_SHARE * physical), share


def check_size(cfg: CbsimConfig, in_sweep: bool = False) -> Estimate:
    """The estimate, or a ConfigError when the run is over a limit (task=run only)."""
    est = estimate(cfg, in_sweep)
    if est.span_s * 1e6 > MAX_TS_US:
        raise ConfigError(
            f"{est.driver}: its {cfg.workload.total_requests} arrivals span {est.span_s:.3g} s of "
            f"simulated time, past the {MAX_TS_US / 1e6:.3g} s (104 days) a trace's float64 "
            "times hold to the nanosecond; allowed: a higher workload.rate or fewer requests"
        )
    _check_trace(cfg, est)
    limit, source = memory_limit(cfg)
    if est.memory_bytes > limit:
        what = est.describe()
        if cfg.mode.name == "runtime":
            what = f"weights and KV cache of {_size(est.memory_bytes)} on mode.device={cfg.mode.device}"
        raise ConfigError(
            f"{est.driver}: {what}; over limits.max_memory_gb={limit / 1e9:.3g}"
            f"{'' if source == 'set' else f' ({source})'}; allowed: a smaller run, "
            f"{_untraced_hint(cfg, est, limit)}"
            f"or limits.max_memory_gb={math.ceil(est.memory_bytes / 1e9)} to run it anyway"
        )
    return est


def _untraced_hint(cfg: CbsimConfig, est: Estimate, limit: int) -> str:
    """The run without its trace (its report drawn from windows of steps), or without its
    report too, when that is what makes it fit."""
    if cfg.mode.name != "sim":
        return ""
    out = cfg.output
    if out.trace is not False and est.windowed_memory_bytes <= limit:
        return (
            f"output.trace=false (no trace kept, the report's timeline in windows of "
            f"{out.report_window_steps} steps: {_size(est.windowed_memory_bytes)}), "
        )
    if est.untraced_memory_bytes < est.memory_bytes and est.untraced_memory_bytes <= limit:
        return (
            f"output.trace=false output.report=false (no trace kept: "
            f"{_size(est.untraced_memory_bytes)}), "
        )
    return ""


def unreadable(cfg: CbsimConfig, events: int) -> str | None:
    """Why a built trace of ``events`` would be past what cbsim reads back (or
    limits.max_trace_mb), or None (the estimate's check on the real count, before writing)."""
    limit_mb = cfg.limits.max_trace_mb
    size = events * JSON_BYTES_PER_EVENT
    max_bytes = DEFAULT_MAX_BYTES if limit_mb is None else limit_mb * 1e6
    if size <= max_bytes and (limit_mb is not None or events <= DEFAULT_MAX_EVENTS):
        return None
    return (
        f"{events:,} events (about {_size(size)}) is over what cbsim reads back "
        f"({DEFAULT_MAX_EVENTS:,} events, {DEFAULT_MAX_BYTES >> 20} MiB) or limits.max_trace_mb; "
        f"allowed: limits.max_trace_mb={math.ceil(size / 1e6)} to write it"
    )


def _check_trace(cfg: CbsimConfig, est: Estimate) -> None:
    """A trace file over what the reader accepts (or limits.max_trace_mb) is refused."""
    if not est.trace_events:
        return
    limit_mb = cfg.limits.max_trace_mb
    max_bytes = DEFAULT_MAX_BYTES if limit_mb is None else int(limit_mb * 1e6)
    over_events = limit_mb is None and est.trace_events > DEFAULT_MAX_EVENTS
    if est.trace_bytes <= max_bytes and not over_events:
        return
    whose = "the merged trace of both engines" if cfg.engine.name == "compare" else "its trace"
    limit = (
        f"what cbsim reads back ({DEFAULT_MAX_EVENTS:,} events, {DEFAULT_MAX_BYTES >> 20} MiB)"
        if limit_mb is None
        else f"limits.max_trace_mb={limit_mb:g}"
    )
    raise ConfigError(
        f"{est.driver}: {whose} would hold about {est.trace_events:,} events "
        f"({_size(est.trace_bytes)}), over {limit}; allowed: a smaller run, "
        f"output.trace=false, or limits.max_trace_mb={math.ceil(est.trace_bytes / 1e6)} "
        "to write it anyway"
    )
