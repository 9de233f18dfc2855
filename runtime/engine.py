"""One runtime run: set it up, build the device side, run a loop, return the trace.

`execute(config, engine)` returns a RunResult (trace, generated tokens per request, summary);
`cbsim.runtime.run` returns its trace; the app, the recording harness and the GPU tests
all go through it. The run starts from `cbsim.run_setup.setup_run`, the simulator's setup, and
everything that can be refused is refused before the model is built: a request longer than the
model context or the KV cache, token ids outside the vocabulary, engine=async without CUDA, a
configuration that does not fit the device's own memory (host RAM on a CPU). A profile made on
another GPU (hardware.device_name) draws a one-line warning. A CUDA out-of-memory while
building names the config values to lower. Ctrl-C (KeyboardInterrupt) during the loop stops it,
finishes the trace so far (otherData.interrupted = true) and raises `Interrupted`, a
KeyboardInterrupt whose `.trace` holds that partial trace, so the caller can still write it.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig, WorkloadConfig
from cbsim.run_setup import RunSetup, setup_run
from cbsim.trace import Trace
from cbsim.workload import Request, check_requests_fit

from .collector import collector_frozen
from .device_info import checkpoint_facts
from .loop import LoopState, run_async, run_sync
from .machine import device_memory_bytes, read_machine, warn_if_other_gpu
from .piecewise import check_mixed_graphs, resolve_mixed_graphs
from .recorder import Recorder
from .runner import ModelRunner
from .streams import EventRing, Streams
from .warmup import warm_up

ENGINES = ("sync", "async")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `.trace` is the trace recorded up to that point."""

    def __init__(self, trace: Trace) -> None:
        super().__init__("runtime interrupted; the partial trace is in .trace")
        self.trace = trace
        self.partial_trace = trace  # the name cbsim.app looks for


@dataclass
class RunResult:
    trace: Trace
    outputs: dict[int, np.ndarray]
    summary: dict[str, Any]


def check_vocab(requests: list[Request], vocab_size: int) -> None:
    for r in requests:
        ids = np.asarray(r.prompt_ids)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
            raise ConfigError(
                f"request {r.rid}: token id {bad} is outside the vocabulary of "
                f"{vocab_size} tokens (model.vocab_size)"
            )


def oom_message(config: CbsimConfig, num_blocks: int, what: str, exc: Exception) -> str:
    w, kv = config.workload, config.model.kv_bytes_per_token
    return (
        f"CUDA out of memory while {what} ({str(exc).splitlines()[0]}). Lower one of: "
        f"workload.kv_num_blocks (now {num_blocks} blocks = "
        f"{num_blocks * w.kv_block_size * kv / 2**30:.2f} GiB of KV), workload.batch_size "
        f"(now {w.batch_size}), workload.max_batch_tokens (now {w.max_batch_tokens}), "
        f"engine.graph_batch_sizes (now up to {max(config.engine.graph_batch_sizes)}), or pick a "
        f"smaller model (model={config.model.name}, {config.model.weight_bytes / 1e9:.1f} GB of "
        "weights)"
    )


def check_device(config: CbsimConfig, engine: str, cpu_emulation: bool = False) -> torch.device:
    """The device ``engine`` runs on, or a ConfigError when it cannot run there (cheap: the
    app checks every engine of a comparison before running any)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; the runtime runs one of: {', '.join(ENGINES)}")
    device = torch.device(config.mode.device)
    check_mixed_graphs(config, device, cpu_emulation)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"mode.device={config.mode.device} but no CUDA device is visible; "
            "on a CPU use mode.device=cpu with engine=sync"
        )
    if engine == "async" and device.type != "cuda" and not cpu_emulation:
        raise ConfigError(
            "engine=async needs CUDA (three CUDA streams, events, pinned IO slots, CUDA graphs); "
            f"mode.device={config.mode.device}. On a CPU run engine=sync with mode.device=cpu"
        )
    return device


def plan_run(
    config: CbsimConfig, engine: str, device: torch.device, model: torch.nn.Module | None
) -> RunSetup:
    """The shared setup, with the runtime's own refusals: a vocabulary or context a checkpoint
    sets differently from model.*, and a device the run does not fit: its own memory
    (runtime/machine.py: device_memory_bytes), not the profile's hardware.memory_bytes."""
    facts = checkpoint_facts(config.model, model)  # {} for random weights: model.* is the model
    setup = setup_run(
        config,
        vocab_size=facts.get("vocab_size"),
        engine=engine,
        eos_token_id=facts.get("eos_token_id"),
        keep_tokens=True,  # prompts fed to the model, outputs returned
    )
    check_vocab(setup.requests, facts.get("vocab_size", config.model.vocab_size))
    if "max_position_embeddings" in facts:
        try:
            check_requests_fit(
                setup.requests,
                facts["max_position_embeddings"],
                setup.num_kv_blocks * config.workload.kv_block_size,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    available = device_memory_bytes(device)
    fit = dataclasses.replace(
        setup.fit, bytes_available=available, fits=setup.fit.bytes_needed <= available
    )
    if not fit.fits:
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in fit.parts.items())
        has = (
            f"{device} has {available / 2**30:.2f} GiB"
            if device.type == "cuda"
            else f"the host has {available / 2**30:.2f} GiB of RAM available (mode.device=cpu)"
        )
        raise ConfigError(
            f"the run needs {fit.bytes_needed / 2**30:.2f} GiB of device memory ({parts}) and "
            f"{has}; lower workload.kv_num_blocks, workload.batch_size or "
            "workload.max_batch_tokens, or pick a smaller model"
        )
    return dataclasses.replace(setup, fit=fit)


def build(
    config: CbsimConfig,
    setup: RunSetup,
    device: torch.device,
    cpu_emulation: bool,
    model: torch.nn.Module | None,
    *,
    three_streams: bool | None = None,
    carry_over: bool | None = None,
) -> tuple[ModelRunner, Streams]:
    """The model, KV cache, IO slots and streams, warmed up, graphs captured. The streams and
    the carry-over follow the engine (sync: one stream, none; async: engine.streams, on); the
    two keywords set them apart for diagnostics (a diagnostic over the H200's recordings)."""
    is_async = setup.engine.name == "async"
    if three_streams is None:
        # the sync engine always runs on one stream; async on three or, with streams=one, one
        three_streams = is_async and setup.engine.streams == "three"
    if carry_over is None:
        carry_over = is_async
    try:
        runner = ModelRunner(
            config,
            device,
            num_kv_blocks=setup.num_kv_blocks,
            max_context=setup.max_context,
            num_slots=setup.io_slots,
            carry_over=carry_over,
            graphs=setup.engine.cuda_graphs,
            emulate_graphs=cpu_emulation,
            model=model,
        )
    except torch.OutOfMemoryError as exc:
        raise ConfigError(
            oom_message(config, setup.num_kv_blocks, "building the model and KV cache", exc)
        ) from None
    streams = Streams.create(device, three=three_streams)
    if streams.cuda:
        # the model's initialization and the buffers' zero fills are queued on the default
        # stream; the warm-up and the loop run on non-blocking streams, which do not wait for it
        torch.cuda.synchronize(device)
    w = config.workload
    try:
        longest_prompt = max(r.prompt_len for r in setup.requests)
        warm_up(runner, streams, config.mode.warmup_steps, min(w.max_batch_tokens, longest_prompt))
        if streams.cuda:
            runner.capture_graphs(streams.compute)
    except torch.OutOfMemoryError as exc:
        raise ConfigError(
            oom_message(config, setup.num_kv_blocks, "capturing CUDA graphs", exc)
        ) from None
    return runner, streams


def execute(
    config: CbsimConfig,
    engine: str,
    *,
    cpu_emulation: bool = False,
    model: torch.nn.Module | None = None,
) -> RunResult:
    """Run one engine. cpu_emulation (tests only): on a CPU, run the async loop's order (batch
    N+1 built before N's tokens, placeholders filled by the carry-over) and the padded graph
    buckets eagerly, with no streams and no overlap, so that logic is checked without CUDA.
    model: an already built transformers model to use (benchmarks share one between engines);
    its attention is switched to the runtime's paged attention."""
    device = check_device(config, engine, cpu_emulation)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # events, anchors and graphs all on this one device
    config = resolve_mixed_graphs(config, device)
    machine = read_machine(device)  # before the model: the copy rate is timed on an idle GPU
    warn_if_other_gpu(config.hardware, machine)
    setup = plan_run(config, engine, device, model)
    t_setup = time.perf_counter()
    runner, streams = build(config, setup, device, cpu_emulation, model)
    setup_s = time.perf_counter() - t_setup
    sched = setup.scheduler
    steps = estimate_steps(config.workload, setup.requests)
    rec = Recorder(config.mode.tracing, device, steps, len(setup.requests))
    events = EventRing(rec.enabled) if streams.cuda else None
    state = LoopState(runner, sched, rec, streams, events)
    interrupted = False
    gc_counts: dict[str, int] = {}
    with collector_frozen(gc_counts):
        if streams.cuda:
            torch.cuda.set_stream(streams.compute)  # launches switch to H2D and D2H and back
        rec.start(streams.compute, setup.requests)
        try:
            (run_async if engine == "async" else run_sync)(state)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if streams.cuda:
                torch.cuda.synchronize(device)
                torch.cuda.set_stream(torch.cuda.default_stream(device))
        wall_s = time.perf_counter() - rec.t0
    if streams.cuda:
        rec.measure_drift()
    summary = summarize(state, setup, wall_s, setup_s, gc_counts)
    other = other_data(engine, runner, setup, summary, machine, config, interrupted, streams.mode)
    trace = rec.build(other)
    if interrupted:
        raise Interrupted(trace)
    outputs = {r.rid: sched.outputs(r.rid) for r in setup.requests}
    return RunResult(trace, outputs, summary)


def estimate_steps(w: WorkloadConfig, reqs: list[Request]) -> int:
    """Rows for the recorder: the longest request's new tokens per wave of batch_size
    requests, plus every prompt chunk (the recorder doubles its arrays if a run needs more)."""
    waves = -(-len(reqs) // w.batch_size)
    longest = max(r.max_new_tokens for r in reqs)
    chunks = sum(-(-r.prompt_len // w.max_batch_tokens) for r in reqs)
    return waves * longest + chunks + 64


def summarize(
    state: LoopState, setup: RunSetup, wall_s: float, setup_s: float, gc_counts: dict[str, int]
) -> dict[str, Any]:
    return {
        "wall_s": wall_s,
        "setup_s": setup_s,
        "steps": state.steps,
        "graph_steps": state.graph_steps,
        "mixed_graph_steps": state.mixed_graph_steps,
        "eager_steps": state.steps - state.graph_steps,
        "generated_tokens": state.generated,
        "tokens_per_s": state.generated / max(wall_s, 1e-9),
        "ms_per_step": 1e3 * wall_s / max(state.steps, 1),
        "preemptions": setup.scheduler.num_preemptions,
        "host_phase_s": {k: round(v, 6) for k, v in state.rec.host_phase_s().items()},
        "num_kv_blocks": setup.num_kv_blocks,
        **gc_counts,
    }


def other_data(
    engine: str,
    runner: ModelRunner,
    setup: RunSetup,
    summary: dict[str, Any],
    machine: dict[str, Any],
    config: CbsimConfig,
    interrupted: bool,
    streams: str | None,
) -> dict[str, Any]:
    return {
        "engine": engine,
        "hardware": machine,
        "memory": {
            **runner.memory,
            # without the shared pool each slot would hold its own: slots x one slot's pool
            "graph_pool_bytes_unshared": len(runner.slots)
            * runner.memory["graph_pool_bytes_single_slot"],
        },
        "device_fit": {
            "fits": setup.fit.fits,
            "bytes_needed": setup.fit.bytes_needed,
            "bytes_available": setup.fit.bytes_available,
            **setup.fit.parts,
        },
        "counters": summary,
        "attention": "triton" if runner.decode_kernel else "torch",
        # mode.blas, mode.graph_blas: the library torch's GEMMs went to, eager and in graphs
        "blas": runner.blas,
        "graph_blas": runner.graph_blas if runner.buckets else None,
        # mode.split_argmax: greedy sampling's argmax, two Triton kernels or torch's one
        "argmax": "split" if runner.split_argmax else "torch",
        "cuda_graphs": bool(runner.buckets),
        # engine.upload_graphs: every graph launched once at capture, not first in a step
        "graphs_uploaded": bool(runner.buckets) and config.engine.upload_graphs,
        # what the build fused (mode.fuse_*; CUDA only): the simulator counts the same kernels
        "fused": runner.fused,
        "graph_buckets": runner.buckets,
        # engine.graph_memsets: the graphs' memset nodes rewritten as fill kernels, how many
        "graph_memsets": {
            "mode": config.engine.graph_memsets if runner.memsets else "keep",
            "rewritten": runner.memsets.rewritten if runner.memsets else 0,
        },
        # engine.mixed_graphs=buckets or full: the token buckets steps with prompt tokens replay
        # at, piecewise or whole (cbsim.costs.mixed_graphs.token_buckets); [] when eager
        "mixed_graphs": config.engine.mixed_graphs,
        "mixed_graph_buckets": runner.mixed.buckets if runner.mixed else [],
        # a graph per launch class of the Triton decode kernel, and the block-table widths
        # (blocks) each bucket's graphs were captured at
        "graph_width_classes": bool(
            config.engine.graph_width_classes and runner.decode_kernel is not None
        ),
        "graph_widths": {str(b): w for b, w in runner.graph_widths.items()},
        # the Triton decode kernel's launch rule (engine.decode_launch); none: the torch path
        "decode_launch": dataclasses.asdict(runner.launch_rule) if runner.decode_kernel else None,
        "io_slots": len(runner.slots),
        # engine.eager_token_multiple: a step with prompt tokens ran over this many rows' multiple
        "eager_token_multiple": runner.token_multiple,
        # engine.continuation_decode_max: continuations up to this many tokens ran as decode rows
        "continuation_decode_max": runner.short_max,
        # the CUDA streams the loop ran on (None on a CPU): a forward's speed depends on them
        "streams": streams,
        "tracing": config.mode.tracing,
        "interrupted": interrupted,
    }
