"""One runtime run: check the inputs, build the device side, run a loop, return the trace.

`execute(config, engine)` returns a RunResult (trace, generated tokens per request, summary);
`cbsim.runtime.run` returns its trace. Everything that can be refused is refused before the model
is built: requests longer than the model context or the KV cache, token ids outside the
vocabulary, engine=async without CUDA. A CUDA out-of-memory while building names the config
values to lower. Ctrl-C (KeyboardInterrupt) during the loop stops it, finishes the trace so far
(otherData.interrupted = true) and raises `Interrupted`, a KeyboardInterrupt whose `.trace` holds
that partial trace, so the caller can still write it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cbsim.config.errors import ConfigError
from cbsim.config.schema import CbsimConfig
from .io_slots import dummy_decode, dummy_prefill, empty_decode_layout
from .loop import LoopState, run_async, run_sync
from .runner import ModelRunner
from .streams import SlotEvents, Streams
from .recorder import Recorder
from cbsim.scheduler import Scheduler, default_num_kv_blocks
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.workload import Request, check_requests_fit, make_requests

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


def fits(
    requests: list[Request], max_context: int, kv_tokens: int, max_prompt: int | None = None
) -> None:
    """Every request fits the model context and the KV cache (and, with chunked prefill off,
    one step's token budget), else a ConfigError naming it."""
    try:
        check_requests_fit(requests, max_context, kv_tokens, max_prompt)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


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


def hardware_info(device: torch.device) -> dict[str, Any]:
    import transformers

    info = {
        "device": str(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            cuda=torch.version.cuda,
            memory_bytes=props.total_memory,
            sms=props.multi_processor_count,
        )
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            pass
    else:
        info["name"] = "cpu"
    return info


def check_device(config: CbsimConfig, engine: str, cpu_emulation: bool = False) -> torch.device:
    """The device ``engine`` runs on, or a ConfigError when it cannot run there (cheap: the
    app checks every engine of a comparison before running any)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}; the runtime runs one of: {', '.join(ENGINES)}")
    device = torch.device(config.mode.device)
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
    w = config.workload
    requests = make_requests(w, config.model.vocab_size)
    num_blocks = default_num_kv_blocks(w, requests)
    fits(
        requests,
        config.model.max_position_embeddings,
        num_blocks * w.kv_block_size,
        None if w.chunked_prefill else w.max_batch_tokens,
    )
    check_vocab(requests, config.model.vocab_size)
    is_async = engine == "async"
    max_context = max(r.prompt_len + r.max_new_tokens for r in requests)
    t_setup = time.perf_counter()
    try:
        runner = ModelRunner(
            config,
            device,
            num_kv_blocks=num_blocks,
            max_context=max_context,
            num_slots=2 if is_async else 1,
            carry_over=is_async,
            graphs=config.engine.cuda_graphs,
            emulate_graphs=cpu_emulation,
            model=model,
        )
    except torch.OutOfMemoryError as exc:
        raise ConfigError(
            oom_message(config, num_blocks, "building the model and KV cache", exc)
        ) from None
    shape = runner.shape
    if config.model.path:  # a checkpoint's own context and vocabulary are what count
        fits(requests, shape["max_position_embeddings"], num_blocks * w.kv_block_size)
        check_vocab(requests, shape["vocab_size"])
    streams = Streams.create(device, three=is_async)
    try:
        longest_prompt = max(r.prompt_len for r in requests)
        warm_up(runner, streams, config.mode.warmup_steps, min(w.max_batch_tokens, longest_prompt))
        if streams.cuda:
            runner.capture_graphs(streams.compute)
    except torch.OutOfMemoryError as exc:
        raise ConfigError(oom_message(config, num_blocks, "capturing CUDA graphs", exc)) from None
    setup_s = time.perf_counter() - t_setup

    eos = runner.model.config.eos_token_id  # None for random weights; a checkpoint's own
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    sched = Scheduler(w, num_blocks, eos_token_id=eos)
    sched.add_all(requests)
    rec = Recorder(config.mode.tracing, device)
    rec.start(streams.compute)
    for r in requests:
        rec.request(
            S.ARRIVAL,
            rec.t0 + r.arrival_s,
            r.rid,
            prompt_len=r.prompt_len,
            max_new_tokens=r.max_new_tokens,
        )
    state = LoopState(
        runner, sched, rec, streams, SlotEvents(len(runner.slots)) if streams.cuda else None
    )
    interrupted = False
    try:
        (run_async if is_async else run_sync)(state)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if streams.cuda:
            torch.cuda.synchronize(device)
    wall_s = time.perf_counter() - rec.t0
    summary = {
        "wall_s": wall_s,
        "setup_s": setup_s,
        "steps": state.steps,
        "graph_steps": state.graph_steps,
        "eager_steps": state.steps - state.graph_steps,
        "generated_tokens": state.generated,
        "tokens_per_s": state.generated / max(wall_s, 1e-9),
        "ms_per_step": 1e3 * wall_s / max(state.steps, 1),
        "preemptions": sched.num_preemptions,
        "host_phase_s": {k: round(v, 6) for k, v in state.host_phase_s.items()},
        "num_kv_blocks": num_blocks,
    }
    other = {
        "engine": engine,
        "hardware": hardware_info(device),
        "memory": {
            **runner.memory,
            # without the shared pool each slot would hold its own: slots x one slot's pool
            "graph_pool_bytes_unshared": len(runner.slots)
            * runner.memory["graph_pool_bytes_single_slot"],
        },
        "counters": summary,
        "attention": "triton" if runner.decode_kernel else "torch",
        "cuda_graphs": bool(runner.buckets),
        "graph_buckets": runner.buckets,
        "io_slots": len(runner.slots),
        "tracing": config.mode.tracing,
        "interrupted": interrupted,
    }
    trace = rec.build(other)
    if interrupted:
        raise Interrupted(trace)
    outputs = {r.rid: sched.outputs(r.rid) for r in requests}
    return RunResult(trace, outputs, summary)


def warm_up(runner: ModelRunner, streams: Streams, steps: int, prefill_tokens: int) -> None:
    """Eager forwards on padding-only batches, `steps` times each: a decode batch of the largest
    size and a prompt chunk of `prefill_tokens` (library set-up, kernel choice, allocator
    growth), so the timed loop's first prefill costs what later ones do."""
    rows = runner.max_outputs
    dec = empty_decode_layout(rows, runner.graph_width, runner.carry_len)
    dec_flat = dummy_decode(dec, runner.cache.scratch_block, runner.block_size)
    prefills = [
        dummy_prefill(
            prefill_tokens, runner.block_size, runner.cache.scratch_block, runner.carry_len, fresh
        )
        for fresh in (True, False)
    ]
    ctx = torch.cuda.stream(streams.compute) if streams.cuda else _null()
    with ctx:
        if runner.decode_kernel is not None:
            compile_decode_variants(runner)
        for _ in range(steps):
            for flat, layout in ((dec_flat, dec), *prefills):
                slot = runner.slots[0]
                slot.dev_in[: flat.size].copy_(torch.from_numpy(flat).to(runner.device))
                runner.step_body(slot, layout)
    if streams.cuda:
        torch.cuda.synchronize()


def compile_decode_variants(runner: ModelRunner) -> None:
    """Run the decode kernel once per variant an eager step can reach (mixed steps: any number
    of decode rows up to the batch, any table width up to the longest request), so no Triton
    compile lands inside the timed loop."""
    from .kernels.paged_attention import compiled_variants

    cache, s = runner.cache, runner.shape
    kc, vc = cache.k[0], cache.v[0]
    hq = s["num_heads"]
    for rows, width in compiled_variants(
        runner.max_outputs, s["num_kv_heads"], runner.graph_width, runner.block_size
    ):
        q = torch.zeros(rows, hq, s["head_dim"], dtype=kc.dtype, device=runner.device)
        bt = torch.full((rows, width), cache.scratch_block, dtype=torch.int32, device=runner.device)
        ctx = torch.ones(rows, dtype=torch.int32, device=runner.device)
        runner.decode_kernel(q, kc, vc, bt, ctx, 1.0)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
