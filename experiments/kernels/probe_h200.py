"""Probe the H200 where the kernel tables are silent: decode attention between KV-tile multiples and
at a block-table width wider than the context, and kernels under sustained load (clock/power).

Run on the GPU with cbsim and runtime installed (experiments/kernels/probe_call.sh does it):
    python3 -P experiments/kernels/probe_h200.py OUT_DIR [SECONDS_PER_SUSTAINED_POINT]
Writes OUT_DIR/probe.json: ``decode`` rows (model, batch, context, width, us per call; timed as
runtime/profile_kernels.py times a table point: a graph of back-to-back calls, KV rotated past L2)
and ``sustained`` rows (model, kernel, rows, per-chunk us per call over the run, with host
timestamps to line up with the nvidia-smi log the call script records beside it).
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path

import torch

from cbsim.api import compose
from cbsim.costs.kernels import gemm_shapes
from cbsim.runtime.attention import AttnMeta, prefill_fresh
from cbsim.runtime.profile_kernels import (
    L2_ROTATE_BYTES,
    Timer,
    _copies,
    _decode_kernel,
    _elementwise,
    decode_calls,
)

TILE_CONTEXTS = [128, 129, 160, 192, 224, 256, 257, 288, 320, 352, 384, 416, 448, 480, 512]
TILE_BATCHES = [1, 16, 64, 256]
# the runtime's 1b_8x8192+1024 decode: contexts 8192..9216, each at its own width and at the
# widest table the run's graph sees
WIDE_CONTEXTS = [8192, 8320, 8448, 8704, 8960, 9216]
WIDE_WIDTHS = [0, 9216, 16384]  # 0: the context's own width


def _config(model: str):
    return compose(f"model={model}", "mode=runtime")


def _decode_points(model: str, points: list[tuple[int, int, int]], timer: Timer) -> list[dict]:
    cfg = _config(model)
    dev, dt = timer.device, torch.bfloat16
    m, bs = cfg.model, cfg.workload.kv_block_size
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    kernel, scale, per_token = _decode_kernel(cfg, dev), d**-0.5, 2 * hkv * d * 2
    most = max(b * max(ctx, w) for b, ctx, w in points)
    blocks = -(-max(most, L2_ROTATE_BYTES // per_token) // bs) + 1
    kc = torch.randn(blocks, bs, hkv, d, dtype=dt, device=dev)
    vc = torch.randn_like(kc)
    rows = []
    for b, ctx, w in points:
        width = -(-max(ctx, w) // bs)
        us = timer(decode_calls(kernel, kc, vc, hq, b, ctx, width, scale))
        rows.append(dict(model=model, batch=b, context=ctx, width=width * bs, us=round(us, 3)))
        print(f"decode {model} b={b} ctx={ctx} width={width * bs}: {us:.2f} us", flush=True)
    del kc, vc
    torch.cuda.empty_cache()
    return rows


def _sustained(name: str, calls: list, seconds: float, chunk_ms: float = 4.0) -> dict:
    """Replay a graph of ``calls`` back to back for ``seconds``: per chunk of replays, us per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in calls:
            c()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    with torch.cuda.stream(stream):
        ev[0].record()
        graph.replay()
        ev[1].record()
    ev[1].synchronize()
    one_ms = ev[0].elapsed_time(ev[1])
    per_chunk = max(1, int(chunk_ms / max(one_ms, 1e-3)))
    chunks = max(10, int(seconds * 1e3 / (per_chunk * one_ms)))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(chunks + 1)]
    time.sleep(0.3)  # idle first, so the first chunk starts as a short table point does
    t_host = time.time()
    with torch.cuda.stream(stream):
        events[0].record()
        for i in range(chunks):
            for _ in range(per_chunk):
                graph.replay()
            events[i + 1].record()
    events[-1].synchronize()
    t_end = time.time()
    per_call = [
        events[i].elapsed_time(events[i + 1]) * 1e3 / (per_chunk * len(calls))
        for i in range(chunks)
    ]
    del graph
    print(f"sustained {name}: first {per_call[0]:.1f} us, last {per_call[-1]:.1f} us", flush=True)
    return dict(
        kernel=name,
        host_start=t_host,
        host_end=t_end,
        chunk_calls=per_chunk * len(calls),
        us=[round(x, 3) for x in per_call],
    )


def _sustained_points(model: str, seconds: float) -> list[dict]:
    cfg = _config(model)
    dev, dt, m = torch.device("cuda"), torch.bfloat16, cfg.model
    out = []
    for name, n, k in gemm_shapes(m, fused=True):
        for rows in (256, 8192):
            if name == "lm_head" and rows > 1024:
                continue
            ws = [
                torch.randn(n, k, dtype=dt, device=dev) * 0.02 for _ in range(_copies(2 * n * k, 2))
            ]
            x = torch.randn(rows, k, dtype=dt, device=dev)
            y = torch.empty(rows, n, dtype=dt, device=dev)
            calls = [partial(torch.mm, x, w.t(), out=y) for w in ws]
            out.append(dict(model=model, rows=rows, **_sustained(f"gemm_{name}", calls, seconds)))
            del ws, x, y
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    for length in (8192,):
        q = torch.randn(length, hq, d, dtype=dt, device=dev)
        k = torch.randn(length, hkv, d, dtype=dt, device=dev)
        v = torch.randn_like(k)
        tok = torch.zeros(1, dtype=torch.long, device=dev)
        meta = AttnMeta(cache=None, num_tokens=length, slot_mapping=tok, pre_tok=tok)
        meta.pre_qlen, meta.pre_qmax = torch.full_like(tok, length), length
        meta.derive()
        calls = [partial(prefill_fresh, q, k, v, meta, d**-0.5)] * 2
        out.append(
            dict(model=model, rows=length, **_sustained("prefill_attention", calls, seconds))
        )
    torch.cuda.empty_cache()
    return out


def _forward_probe(model: str, batch: int, context: int, timer: Timer, out_dir: str) -> dict:
    """One decode forward's kernels (per-layer weights and KV) captured as one graph: its time
    against the sum of the same kernels timed alone, and a Kineto table of a few replays."""
    cfg = _config(model)
    dev, dt, m, bs = timer.device, torch.bfloat16, cfg.model, cfg.workload.kv_block_size
    hq, hkv, d = m.num_heads, m.num_kv_heads, m.head_dim
    ew = {op: make(batch) for op, (_, _, make) in _elementwise(cfg, dev).items()}
    shapes = {name: (n, k) for name, n, k in gemm_shapes(m, fused=True)}
    kernel, width = _decode_kernel(cfg, dev), -(-context // bs)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    table = torch.arange(batch * width, dtype=torch.int32, device=dev).view(batch, width)
    q = torch.randn(batch, hq, d, dtype=dt, device=dev)

    def gemm(name):
        n, k = shapes[name]
        w = torch.randn(n, k, dtype=dt, device=dev) * 0.02
        x = torch.randn(batch, k, dtype=dt, device=dev)
        return partial(torch.mm, x, w.t(), out=torch.empty(batch, n, dtype=dt, device=dev))

    layer_ops = ["rms_norm", "qkv", "rope", "kv_write", "attn", "o", "add"]
    layer_ops += ["rms_norm", "gate_up", "silu_mul", "down", "add"]
    calls, alone = [], {}
    for _ in range(m.num_layers):
        kc = torch.randn(batch * width + 1, bs, hkv, d, dtype=dt, device=dev)
        vc = torch.randn_like(kc)
        for op in layer_ops:
            if op == "attn":
                calls.append(partial(kernel, q, kc, vc, table, lens, d**-0.5))
            elif op in shapes:
                calls.append(gemm(op))
            else:
                calls.append(ew[op])
    calls += [ew["rms_norm"], gemm("lm_head"), ew["argmax"]]
    whole = timer(calls) * len(calls)
    for op in dict.fromkeys(layer_ops + ["lm_head", "argmax"]):
        i = (layer_ops + ["lm_head", "argmax"]).index(op)
        body = m.num_layers * len(layer_ops)
        idx = [j for j in range(body) if j % len(layer_ops) == i] if op in layer_ops else []
        sample = [calls[j] for j in idx] or [calls[-2] if op == "lm_head" else calls[-1]]
        alone[op] = round(timer(sample), 3)
    print(f"forward {model} b={batch} ctx={context}: graph {whole:.0f} us", flush=True)
    result = dict(model=model, batch=batch, context=context, graph_us=round(whole, 1))
    result["alone_us"] = alone
    result["ops_per_layer"] = layer_ops
    try:
        result["kineto"] = _kineto(calls, out_dir)
    except Exception as exc:  # the profiler is optional: the timings above stand without it
        result["kineto"] = f"failed: {exc}"
    return result


def _kineto(calls: list, out_dir: str) -> list[dict]:
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(Path(out_dir, "kineto_forward.json")))
    rows = [
        dict(name=e.key[:80], calls=e.count, us=round(e.device_time_total, 1))
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r["us"])[:40]


def main(out_dir: str, seconds: float = 0.4, device: str = "cuda") -> None:
    """device=cpu: a smoke test of the decode grid (torch fallback, wall clock; no sustained)."""
    torch.manual_seed(0)
    dev = torch.device(device)
    timer = Timer(dev, 3.0, time.monotonic() + 600)
    cuda = dev.type == "cuda"
    result: dict = {"hardware": torch.cuda.get_device_name() if cuda else "cpu"}
    result["torch"] = torch.__version__
    decode = []
    with torch.inference_mode():
        for model in ("llama3_1b", "llama3_8b"):
            tile = [(b, c, 0) for b in TILE_BATCHES for c in TILE_CONTEXTS]
            wide = [(8, c, w) for c in WIDE_CONTEXTS for w in WIDE_WIDTHS if w == 0 or w >= c]
            if not cuda:
                tile, wide = tile[:2], wide[:2]
            decode += _decode_points(model, tile + wide, timer)
        result["decode"] = decode
        Path(out_dir, "probe.json").write_text(json.dumps(result))
        if cuda:
            result["sustained"] = _sustained_points("llama3_8b", seconds)
            Path(out_dir, "probe.json").write_text(json.dumps(result))
        result["forward"] = _forward_probe("llama3_8b", 256 if cuda else 2, 256, timer, out_dir)
    Path(out_dir, "probe.json").write_text(json.dumps(result))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], float(args[1]) if len(args) > 1 else 0.4, args[2] if len(args) > 2 else "cuda")
