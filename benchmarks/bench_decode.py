"""Decode-step speed of the 8B shape at batch 32 against the H200's memory-bandwidth floor.

One run does, in order (each section guarded by a time budget, results appended as JSON lines):

  env      device, versions, the measured copy bandwidth (the floor's denominator)
  check    the Triton paged decode kernel against the float32 torch reference on the GPU (poisoned
           unused pages, padding rows, mixed lengths, several partitions), inside a CUDA graph too
  kernel   32 layers of decode attention (one graph, one KV cache per layer, B=32, Hq=32, Hkv=8,
           D=128) per context: Triton variants vs gathered SDPA vs the fp32 reference
  gemm     the M=32 bf16 projections of one layer, unfused (q, k, v, gate, up) vs fused (qkv,
           gate_up), each over 32 weight copies (as 32 layers would be; none fits in L2)
  model    the 8B Llama (random bf16 weights, transformers' own layers) decode step, CUDA-graph
           replayed: paged KV + Triton kernel vs gathered SDPA, unfused vs fused projections,
           transformers' own `sdpa` over a StaticCache, and a no-attention step (weights only)

Run on the GPU machine (no cbsim imports, so no hydra/omegaconf needed there):
    PYTHONUNBUFFERED=1 python3 benchmarks/bench_decode.py --out $OUT
and on a CPU for a smoke test of the plumbing:
    python benchmarks/bench_decode.py --small
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: runtime.kernels
from runtime.kernels.fused_elementwise import (  # noqa: E402
    fuse_norm_and_rope,
    unfuse_norm_and_rope,
)
from runtime.kernels.fused_projections import fuse_qkv_and_gate_up  # noqa: E402
from runtime.kernels.paged_attention import (  # noqa: E402
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_sdpa,
    store_kv,
    triton_available,
)

# The floor's denominator: HBM copy bandwidth on the H200 as the brief and issue 7 define it (read +
# written bytes of a large device-to-device copy). This run's own copy measurement is recorded too.
COPY_TBPS_BRIEF = 4.27

SHAPE_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
)
SHAPE_SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=97,
)


class Bench:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(self.out / "bench_decode.jsonl", "a")
        self.rows: list[dict] = []
        self.cuda = torch.cuda.is_available() and not args.small
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.shape = SHAPE_SMALL if args.small else SHAPE_8B
        self.copy_tbps = COPY_TBPS_BRIEF
        self.section_end = math.inf

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return min(self.args.deadline, self.section_end) - self.elapsed()

    def record(self, **row):
        row["t"] = round(self.elapsed(), 2)
        self.rows.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()

    def log(self, msg: str):
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)

    # ---- timing -------------------------------------------------------------------------------

    def time_fn(self, fn, iters: int = 20, warmup: int = 3) -> dict:
        """Median ms of fn: graph-replayed on CUDA (fn captured once), perf_counter on the CPU."""
        if not self.cuda:
            fn()
            ts = []
            for _ in range(max(2, iters // 5)):
                t = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t) * 1e3)
            return dict(ms=statistics.median(ts), ms_min=min(ts), ms_max=max(ts), graph=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile / autotune / allocate outside the capture
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(warmup):
            graph.replay()
        torch.cuda.synchronize()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) for s, e in events]
        del graph
        return dict(ms=statistics.median(ts), ms_min=min(ts), ms_max=max(ts), graph=True)

    # ---- sections -----------------------------------------------------------------------------

    def env(self):
        info = dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            host=platform.node(),
            python=platform.python_version(),
            torch=torch.__version__,
            cuda=torch.version.cuda,
            device=torch.cuda.get_device_name() if self.cuda else "cpu",
            argv=sys.argv,
        )
        try:
            import transformers

            info["transformers"] = transformers.__version__
        except ImportError:
            pass
        if triton_available():
            import triton

            info["triton"] = triton.__version__
        if self.cuda:
            props = torch.cuda.get_device_properties(0)
            info["sms"] = props.multi_processor_count
            info["mem_gib"] = round(props.total_memory / 2**30, 1)
            # eager copies timed with events (a graph-captured memcpy node measured 2.7 TB/s in
            # run 1, against 4.3 for an eager copy in KINDS.md); 4 GiB read + 4 GiB written
            a = torch.randn(1 << 31, device="cuda", dtype=torch.bfloat16)
            b = torch.empty_like(a)
            for _ in range(3):
                b.copy_(a)
            ev = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(10)
            ]
            for e0, e1 in ev:
                e0.record()
                b.copy_(a)
                e1.record()
            torch.cuda.synchronize()
            ms = statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
            info["copy_tbps_measured_eager"] = round(2 * a.numel() * 2 / (ms * 1e-3) / 1e12, 3)
            info["copy_tbps_floor"] = self.copy_tbps
            del a, b
        self.record(section="env", **info)
        self.log(f"env: {info}")

    def make_cache(self, B, ctx, num_layers, block_size, Hkv, D, dtype):
        """Per-layer paged K/V caches holding B requests of up to ctx tokens, pages shuffled."""
        pages = -(-ctx // block_size)
        num_blocks = B * pages + 1
        caches = []
        for _ in range(num_layers):
            k = torch.randn(num_blocks, block_size, Hkv, D, device=self.device, dtype=dtype)
            v = torch.randn(num_blocks, block_size, Hkv, D, device=self.device, dtype=dtype)
            caches.append((k, v))
        perm = torch.randperm(num_blocks - 1, device=self.device).to(torch.int32)
        table = perm.view(B, pages)
        return caches, table

    def check(self):
        """Triton kernel vs fp32 reference on the GPU, many shapes; results as relative errors."""
        if not (self.cuda and triton_available()):
            self.log("check: skipped (needs CUDA + triton)")
            return
        D, Hq, Hkv = 128, 32, 8
        torch.manual_seed(1)
        worst = 0.0
        cases = [  # (dtype, block size, partitions): one Triton compile per (dtype, bs, partition)
            (torch.bfloat16, 16, (None, 256, 512, 1024)),
            (torch.bfloat16, 64, (None, 512)),
            (torch.float16, 16, (512,)),
            (torch.float32, 16, (None, 512)),
        ]
        for dtype, block_size, partitions in cases:
            ctxs = [1, 15, 16, 17, 255, 1000, 2049, 0, 8192, 5000, 3, 777]
            B = len(ctxs)
            pages = [-(-c // block_size) for c in ctxs]
            num_blocks = sum(pages) + 8
            k = torch.randn(num_blocks, block_size, Hkv, D, device="cuda").to(dtype)
            v = torch.randn(num_blocks, block_size, Hkv, D, device="cuda").to(dtype)
            perm = torch.randperm(num_blocks, device="cuda")
            table = torch.full((B, max(pages) + 3), -1, dtype=torch.int32, device="cuda")
            used = torch.zeros(num_blocks, dtype=torch.bool, device="cuda")
            i = 0
            for b, n in enumerate(pages):
                table[b, :n] = perm[i : i + n].int()
                used[perm[i : i + n]] = True
                i += n
            k[~used] = float("nan")  # a kernel that reads a page it should not returns NaN
            v[~used] = float("nan")
            q = torch.randn(B, Hq, D, device="cuda").to(dtype)
            lens = torch.tensor(ctxs, dtype=torch.int32, device="cuda")
            ref = paged_decode_attention_reference(
                q.double(), k.double(), v.double(), table, lens, D**-0.5
            )
            for partition in partitions:
                out = torch.full_like(q, float("nan"))
                paged_decode_attention(
                    q, k, v, table, lens, D**-0.5, partition_size=partition, out=out
                )
                torch.cuda.synchronize()
                err = ((out.double() - ref).norm() / ref.norm()).item()
                max_abs = (out.double() - ref).abs().max().item()
                finite = bool(torch.isfinite(out).all())
                zero_rows = bool((out[lens == 0] == 0).all())
                worst = max(worst, err if dtype != torch.float32 else 0.0)
                self.record(
                    section="check",
                    dtype=str(dtype),
                    block_size=block_size,
                    partition=partition,
                    rel_err=err,
                    max_abs_err=max_abs,
                    finite=finite,
                    zero_rows=zero_rows,
                    ok=finite and zero_rows and err < (1e-5 if dtype == torch.float32 else 1e-2),
                )
            # inside a graph, with the lengths changed after capture
            out = torch.empty_like(q)
            graph = torch.cuda.CUDAGraph()
            paged_decode_attention(q, k, v, table, lens, D**-0.5, out=out)
            with torch.cuda.graph(graph):
                paged_decode_attention(q, k, v, table, lens, D**-0.5, out=out)
            lens2 = (lens // 2).to(torch.int32)
            lens.copy_(lens2)
            graph.replay()
            torch.cuda.synchronize()
            ref = paged_decode_attention_reference(
                q.double(), k.double(), v.double(), table, lens, D**-0.5
            )
            err = ((out.double() - ref).norm() / ref.norm()).item()
            self.record(
                section="check", dtype=str(dtype), block_size=block_size, partition="graph",
                rel_err=err, max_abs_err=(out.double() - ref).abs().max().item(),
                finite=bool(torch.isfinite(out).all()),
                ok=bool(torch.isfinite(out).all()) and err < (1e-5 if dtype == torch.float32 else 1e-2),
            )  # fmt: skip
        bad = [r for r in self.rows if r.get("section") == "check" and not r["ok"]]
        self.log(
            f"check: {'ALL OK' if not bad else f'{len(bad)} FAILED: {bad}'}; worst bf16/fp16 rel err {worst:.2e}"
        )

    def kernel(self):
        """32 layers of attention per context; picks the fastest Triton config for the model section."""
        a = self.args
        B, Hq, Hkv, D, L = a.batch, 32, 8, 128, 32
        if not self.cuda:
            B, Hq, Hkv, D, L = 4, 8, 2, 16, 2
        dtype = torch.bfloat16 if self.cuda else torch.float32
        contexts = self.contexts
        max_ctx = max(contexts)
        caches, table_full = self.make_cache(B, max_ctx, L, a.block_size, Hkv, D, dtype)
        q = torch.randn(B, Hq, D, device=self.device, dtype=dtype)
        scale = D**-0.5
        variants = {}
        if self.cuda and triton_available():
            # run 1 swept block_n, warps, stages and partitions 128..2048 at p512 (perf-notes.md);
            # run 2 checks the "auto" partition against its neighbours and the two runner-up tiles
            for p, bn, nw, ns in (
                ("auto", 64, 4, 2),
                ("auto", 64, 4, 3),
                ("auto", 128, 4, 2),
                (1024, 64, 4, 2),
                (2048, 64, 4, 2),
                (4096, 64, 4, 2),
            ):
                variants[f"triton p{p} n{bn} w{nw} s{ns}"] = dict(
                    fn=paged_decode_attention,
                    kw=dict(partition_size=p, block_n=bn, num_warps=nw, num_stages=ns),
                )
        variants["torch sdpa-gather"] = dict(fn=paged_decode_attention_sdpa, kw={})
        variants["torch fp32 reference"] = dict(fn=paged_decode_attention_reference, kw={})
        sweep_only = {
            k for k in variants if k.startswith("triton") and k != "triton pauto n64 w4 s2"
        }
        results = {}
        for ctx in contexts:
            pages = -(-ctx // a.block_size)
            table = table_full[:, :pages].contiguous()
            lens = torch.full((B,), ctx, dtype=torch.int32, device=self.device)
            kv_bytes = L * B * ctx * Hkv * D * 2 * torch.finfo(dtype).bits // 8
            for name, var in variants.items():
                if self.left() < a.reserve_s:
                    self.log("kernel: out of time")
                    return
                if name in sweep_only and ctx not in contexts:
                    continue
                if name == "torch fp32 reference" and ctx > 1024:
                    continue
                fn, kw = var["fn"], var["kw"]

                def step(fn=fn, kw=kw, table=table, lens=lens):
                    for k, v in caches:
                        fn(q, k, v, table, lens, scale, **kw)

                try:
                    t = self.time_fn(step)
                except Exception as e:  # a variant that fails to compile or capture is reported
                    self.record(section="kernel", variant=name, ctx=ctx, error=repr(e)[:300])
                    self.log(f"kernel {name} ctx {ctx}: FAILED {e!r:.200}")
                    continue
                gbs = kv_bytes / (t["ms"] * 1e-3) / 1e9
                results[(name, ctx)] = t["ms"]
                self.record(section="kernel", variant=name, ctx=ctx, layers=L, batch=B, kv_bytes=kv_bytes,
                            gbps=gbs, pct_copy=100 * gbs / (self.copy_tbps * 1e3), **t)  # fmt: skip
                self.log(
                    f"kernel {name:28s} ctx {ctx:5d}: {t['ms']:8.3f} ms/32 layers  {gbs:7.0f} GB/s"
                )
            # the same kernel with a table sized for the longest context: reads only live KV
            if self.cuda and triton_available() and ctx < max_ctx:
                name = "triton pauto n64 w4 s2 (full-width table)"

                def step_full(lens=lens):
                    for k, v in caches:
                        paged_decode_attention(q, k, v, table_full, lens, scale)

                t = self.time_fn(step_full)
                gbs = kv_bytes / (t["ms"] * 1e-3) / 1e9
                self.record(section="kernel", variant=name, ctx=ctx, layers=L, batch=B, kv_bytes=kv_bytes,
                            gbps=gbs, pct_copy=100 * gbs / (self.copy_tbps * 1e3), **t)  # fmt: skip
                self.log(
                    f"kernel {name:28s} ctx {ctx:5d}: {t['ms']:8.3f} ms/32 layers  {gbs:7.0f} GB/s"
                )
        # the best Triton config over the contexts where all were timed
        swept = list(contexts)
        best, best_total = None, math.inf
        for name in variants:
            if not name.startswith("triton"):
                continue
            ts = [results.get((name, c)) for c in swept]
            if None not in ts and sum(ts) < best_total:
                best, best_total = name, sum(ts)
        if best:
            self.triton_kw = variants[best]["kw"]
            self.record(section="kernel", best=best, best_kw=self.triton_kw)
            self.log(f"kernel: best Triton config {best} {self.triton_kw}")
        caches = None  # noqa: F841 (frees the 32 layers' KV before the next section)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def gemm(self):
        """M=32 bf16 GEMMs of one 8B layer: unfused vs fused, over 32 weight copies each."""
        if not self.cuda:
            self.log("gemm: skipped (CPU)")
            return
        H, inter, M, copies = 4096, 14336, self.args.batch, 32
        shapes = {
            "q": (4096, H), "k": (1024, H), "v": (1024, H), "qkv": (6144, H), "o": (H, 4096),
            "gate": (inter, H), "up": (inter, H), "gate_up": (2 * inter, H), "down": (H, inter), "lm_head": (128256, H),
        }  # fmt: skip
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        xd = torch.randn(M, inter, device="cuda", dtype=torch.bfloat16)
        per = {}
        for name, (n, k) in shapes.items():
            if self.left() < self.args.reserve_s:
                return
            c = 2 if name == "lm_head" else copies
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(c)]
            inp = xd if k == inter else x

            def step(ws=ws, inp=inp):
                for w in ws:
                    torch.nn.functional.linear(inp, w)

            t = self.time_fn(step)
            us = t["ms"] * 1e3 / c
            gbs = n * k * 2 / (us * 1e-6) / 1e9
            per[name] = us
            self.record(section="gemm", name=name, n=n, k=k, m=M, us_per_gemm=us, gbps=gbs,
                        pct_copy=100 * gbs / (self.copy_tbps * 1e3))  # fmt: skip
            self.log(f"gemm {name:8s} [{M}x{k}]x[{k}x{n}]: {us:8.1f} us  {gbs:7.0f} GB/s")
            del ws
        if {"q", "k", "v", "qkv", "gate", "up", "gate_up"} <= per.keys():
            unf = per["q"] + per["k"] + per["v"] + per["gate"] + per["up"]
            fus = per["qkv"] + per["gate_up"]
            self.record(section="gemm", summary="per layer", unfused_us=unf, fused_us=fus,
                        saved_ms_per_step=(unf - fus) * 32 / 1e3)  # fmt: skip
            self.log(f"gemm: q+k+v+gate+up {unf:.1f} us vs qkv+gate_up {fus:.1f} us per layer: "
                     f"{(unf - fus) * 32 / 1e3:.3f} ms/step saved over 32 layers")  # fmt: skip
        torch.cuda.empty_cache()

    def model(self):
        """The 8B decode step through transformers' Llama with a paged KV cache."""
        from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

        a = self.args
        B, bs = a.batch, a.block_size
        dtype = torch.bfloat16 if self.cuda else torch.float32
        config = LlamaConfig(**self.shape, max_position_embeddings=131072, rope_theta=500000.0,
                             tie_word_embeddings=False)  # fmt: skip
        t = time.perf_counter()
        with torch.device(self.device):
            model = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.log(f"model: built in {time.perf_counter() - t:.1f}s")
        n_params = sum(p.numel() for p in model.parameters())
        embed = model.model.embed_tokens.weight.numel()
        elt = torch.finfo(dtype).bits // 8
        weight_bytes = (
            n_params - embed
        ) * elt  # every weight but the embedding table is read per step
        L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        kv_per_token = L * Hkv * D * 2 * elt
        self.record(section="model", params=n_params, weight_bytes_read=weight_bytes,
                    weight_bytes_total=n_params * elt, kv_bytes_per_token=kv_per_token)  # fmt: skip

        state = {}

        def paged_attention(
            module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw
        ):
            # query [B, Hq, 1, D] (RoPE applied), key/value [B, Hkv, 1, D]: decode, one token each
            k_cache, v_cache = state["caches"][module.layer_idx]
            store_kv(k_cache, v_cache, key[:, :, 0], value[:, :, 0], state["slots"])
            out = state["fn"](query[:, :, 0], k_cache, v_cache, state["table"], state["lens"], scaling,
                              **state["kw"])  # fmt: skip
            return out.unsqueeze(1), None  # [B, 1, Hq, D]

        def no_attention(
            module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw
        ):
            return query.transpose(
                1, 2
            ), None  # weights-only timing: attention replaced by identity

        AttentionInterface.register("cbsim_paged", paged_attention)
        AttentionInterface.register("cbsim_none", no_attention)
        model.set_attn_implementation("cbsim_paged")

        contexts = self.contexts
        max_ctx = max(contexts)
        caches, table_full = self.make_cache(B, max_ctx, L, bs, Hkv, D, dtype)
        state["caches"] = caches
        ids = torch.randint(0, config.vocab_size, (B, 1), device=self.device)

        # -- correctness of the plumbing: token-by-token paged decode == one causal forward
        self.plumbing_check(model, config, state, dtype)

        def decode_step():
            logits = model(input_ids=ids, position_ids=state["pos"], use_cache=False).logits
            return logits[:, -1].argmax(-1)

        def set_context(ctx, fn, kw, full_table=False):
            pages = -(-ctx // bs)
            table = table_full if full_table else table_full[:, :pages].contiguous()
            pos = torch.full((B, 1), ctx - 1, dtype=torch.long, device=self.device)
            slots = table[:, (ctx - 1) // bs].long() * bs + (ctx - 1) % bs
            lens = torch.full((B,), ctx, dtype=torch.int32, device=self.device)
            state.update(table=table, pos=pos, slots=slots, lens=lens, fn=fn, kw=kw)

        def run(label, ctx, fn, kw, **extra):
            if self.left() < a.reserve_s:
                self.log(f"model {label} ctx {ctx}: skipped, out of time")
                return
            try:
                t = self.time_fn(decode_step, iters=a.iters)
            except Exception as e:
                self.record(section="model", variant=label, ctx=ctx, error=repr(e)[:400])
                self.log(f"model {label} ctx {ctx}: FAILED {e!r:.300}")
                traceback.print_exc()
                return
            kv = B * ctx * kv_per_token if fn is not None else 0
            moved = weight_bytes + kv
            floor_ms = moved / (self.copy_tbps * 1e12) * 1e3
            gbs = moved / (t["ms"] * 1e-3) / 1e9
            self.record(section="model", variant=label, ctx=ctx, batch=B, bytes=moved, kv_bytes=kv,
                        floor_ms=floor_ms, gbps=gbs, pct_floor=100 * floor_ms / t["ms"],
                        tok_per_s=B / (t["ms"] * 1e-3), **t, **extra)  # fmt: skip
            self.log(f"model {label:34s} ctx {ctx:5d}: {t['ms']:8.3f} ms/step  {gbs:7.0f} GB/s  "
                     f"{100 * floor_ms / t['ms']:5.1f}% of floor ({floor_ms:.2f} ms)")  # fmt: skip

        triton_ok = self.cuda and triton_available()
        tkw = getattr(self, "triton_kw", dict(partition_size="auto"))

        def sweep(prefix, sdpa=False, full_width=False):
            for ctx in contexts:
                if triton_ok:
                    set_context(ctx, paged_decode_attention, tkw)
                    run(f"{prefix} + triton paged", ctx, paged_decode_attention, tkw)
                    if full_width and ctx < max_ctx:
                        set_context(ctx, paged_decode_attention, tkw, full_table=True)
                        run(
                            f"{prefix} + triton, full-width table", ctx, paged_decode_attention, tkw
                        )
                if sdpa or not triton_ok:
                    set_context(ctx, paged_decode_attention_sdpa, {})
                    run(f"{prefix} + torch sdpa-gather", ctx, paged_decode_attention_sdpa, {})
                if self.cuda:
                    torch.cuda.empty_cache()

        def weights_only(prefix):
            # attention = identity: the GEMM + norm + rope + residual part of the step
            set_context(contexts[0], None, {})
            model.set_attn_implementation("cbsim_none")
            run(f"{prefix}, no attention", 0, None, {})
            model.set_attn_implementation("cbsim_paged")

        def step_logits(ctx=1024):
            set_context(
                min(ctx, max_ctx),
                paged_decode_attention if triton_ok else paged_decode_attention_sdpa,
                tkw if triton_ok else {},
            )
            with torch.no_grad():
                return (
                    model(input_ids=ids, position_ids=state["pos"], use_cache=False)
                    .logits[:, -1]
                    .float()
                )

        weights_only("unfused")
        sweep("unfused", sdpa=True)
        ref_logits = step_logits()

        fuse_qkv_and_gate_up(model)
        if self.cuda:
            torch.cuda.empty_cache()
        self.compare_logits(
            "fused qkv/gate_up vs unfused, one decode step", step_logits(), ref_logits
        )
        weights_only("fused proj")
        sweep("fused proj")

        counts = fuse_norm_and_rope(model)
        self.compare_logits(
            f"+ fused norm/rope ({counts}) vs unfused, one decode step", step_logits(), ref_logits
        )
        self.plumbing_check(model, config, state, dtype, label="all fusions")
        weights_only("fused proj+norm+rope")
        sweep("fused proj+norm+rope", full_width=True)
        try:
            self.profile_step(model, state, set_context, decode_step, tkw)
        except Exception as e:
            self.log(f"profile: FAILED {e!r:.300}")

        if not a.skip_hf:  # last: the least informative, and it needs its own KV allocation
            unfuse_norm_and_rope(model)
            state.clear()
            caches = table_full = None  # noqa: F841
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
            self.hf_static_sdpa(model, config, ids, kv_per_token, weight_bytes)

    def compare_logits(self, label, out, ref):
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        same = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        self.record(section="logits", label=label, rel_err=err, argmax_agree=same)
        self.log(f"logits {label}: rel err {err:.2e}, argmax agreement {same:.2f}")

    def profile_step(self, model, state, set_context, decode_step, tkw, ctx=1024):
        """Kernels per decode step and GPU time by kind (eager, torch.profiler), at one context."""
        if not self.cuda or self.left() < self.args.reserve_s + 10:
            return
        from torch.profiler import ProfilerActivity, profile

        set_context(min(ctx, max(self.contexts)), paged_decode_attention, tkw)
        with torch.no_grad():
            decode_step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                decode_step()
                torch.cuda.synchronize()
        kinds: dict[str, list[float]] = {}
        for ev in prof.events():
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            n = ev.name.lower()
            kind = (
                "gemm" if any(w in n for w in ("gemm", "gemv", "cutlass", "sm90", "splitk", "nvjet"))
                else "attention" if "paged_decode" in n
                else "norm/rope (triton)" if ("rmsnorm" in n or "rope" in n)
                else "memcpy/memset" if ("memcpy" in n or "memset" in n)
                else "other elementwise/index"
            )  # fmt: skip
            kinds.setdefault(kind, []).append(ev.time_range.elapsed_us())
        summary = {k: dict(kernels=len(v), us=round(sum(v), 1)) for k, v in kinds.items()}
        self.record(section="profile", ctx=ctx, kinds=summary)
        self.log(f"profile (eager, ctx {ctx}): {summary}")
        (self.out / "profile.txt").write_text(
            prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        )

    def plumbing_check(self, model, config, state, dtype, label="unfused"):
        """Feed a short sequence token by token through the paged decode path (each step writes its
        K/V and attends to the prefix); the last logits must match one causal forward with sdpa."""
        if self.left() < self.args.reserve_s:
            return
        B, T, bs = 2, 24, self.args.block_size
        L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        caches, table = self.make_cache(B, T, L, bs, Hkv, D, dtype)
        saved = dict(state)
        seq = torch.randint(0, config.vocab_size, (B, T), device=self.device)
        fn = (
            paged_decode_attention
            if (self.cuda and triton_available())
            else paged_decode_attention_reference
        )
        state.update(caches=caches, table=table, fn=fn, kw={})
        with torch.no_grad():
            for t in range(T):
                state["slots"] = table[:, t // bs].long() * bs + t % bs
                state["lens"] = torch.full((B,), t + 1, dtype=torch.int32, device=self.device)
                pos = torch.full((B, 1), t, dtype=torch.long, device=self.device)
                paged = model(
                    input_ids=seq[:, t : t + 1], position_ids=pos, use_cache=False
                ).logits[:, -1]
            model.set_attn_implementation("sdpa")
            dense = model(input_ids=seq, use_cache=False).logits[:, -1]
            model.set_attn_implementation("cbsim_paged")
        err = ((paged.double() - dense.double()).norm() / dense.double().norm()).item()
        same_argmax = bool((paged.argmax(-1) == dense.argmax(-1)).all())
        self.record(
            section="plumbing",
            label=label,
            attention=fn.__name__,
            rel_err=err,
            same_argmax=same_argmax,
        )
        self.log(f"plumbing ({label}, {fn.__name__}): paged decode vs causal sdpa rel err {err:.2e}, "
                 f"argmax equal {same_argmax}")  # fmt: skip
        state.clear()
        state.update(saved)

    def hf_static_sdpa(self, model, config, ids, kv_per_token, weight_bytes):
        """transformers' own `sdpa` over a StaticCache (gpt-fast style: KV padded to the cache length)."""
        from transformers import StaticCache

        B = self.args.batch
        model.set_attn_implementation("sdpa")
        for ctx in self.contexts:
            if self.left() < self.args.reserve_s + 20:
                self.log("hf: out of time")
                break
            try:
                cache = StaticCache(config=config, max_cache_len=ctx)
                # fill the cache's lazy layers with one real forward, then decode at position ctx-1
                with torch.no_grad():
                    model(input_ids=ids, past_key_values=cache, use_cache=True,
                          cache_position=torch.tensor([ctx - 1], device=self.device))  # fmt: skip
                pos = torch.full((B, 1), ctx - 1, dtype=torch.long, device=self.device)
                cpos = torch.tensor([ctx - 1], device=self.device)

                def step(cache=cache, pos=pos, cpos=cpos):
                    out = model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True,
                                cache_position=cpos)  # fmt: skip
                    return out.logits[:, -1].argmax(-1)

                t = self.time_fn(step, iters=self.args.iters)
            except Exception as e:
                self.record(
                    section="model",
                    variant="transformers sdpa + StaticCache (qkv/gate_up fused)",
                    ctx=ctx,
                    error=repr(e)[:400],
                )
                self.log(f"hf sdpa ctx {ctx}: FAILED {e!r:.300}")
                traceback.print_exc()
                break
            finally:
                cache = None
                gc.collect()
                if self.cuda:
                    torch.cuda.empty_cache()
            moved = weight_bytes + B * ctx * kv_per_token
            floor_ms = moved / (self.copy_tbps * 1e12) * 1e3
            gbs = moved / (t["ms"] * 1e-3) / 1e9
            self.record(section="model", variant="transformers sdpa + StaticCache (qkv/gate_up fused)", ctx=ctx, batch=B, bytes=moved,
                        floor_ms=floor_ms, gbps=gbs, pct_floor=100 * floor_ms / t["ms"],
                        tok_per_s=B / (t["ms"] * 1e-3), **t)  # fmt: skip
            self.log(f"model {'transformers sdpa + StaticCache (fused)':34s} ctx {ctx:5d}: {t['ms']:8.3f} ms/step  "
                     f"{gbs:7.0f} GB/s  {100 * floor_ms / t['ms']:5.1f}% of floor")  # fmt: skip

    def e2e(self):
        """The runtime's async engine (cbsim.runtime.engine.execute) at the seed shape, with every
        fusion applied to the model it is handed. Needs the cbsim package and its config deps."""
        if not self.cuda:
            self.log("e2e: skipped (needs CUDA)")
            return
        from hydra import compose, initialize_config_module

        from cbsim.config.store import load_config, register_configs
        from cbsim.metrics import compute_metrics
        from cbsim.runtime.engine import execute
        from cbsim.runtime.model import build_model

        register_configs()
        model = None
        for case in self.args.e2e.split(","):
            gen, engine = case.split(":")
            gen = int(gen)
            need = 30 + gen * 0.012  # seconds: setup + about 12 ms a step
            if self.left() < need:
                self.log(f"e2e gen {gen} {engine}: skipped, {self.left():.0f} s left < {need:.0f}")
                continue
            overrides = ["mode=runtime", f"engine={engine}", "model=llama3_8b", "workload.batch_size=32",
                         "workload.prompt_len=256", f"workload.gen_len={gen}"]  # fmt: skip
            with initialize_config_module(config_module="cbsim.conf", version_base="1.3"):
                config = load_config(compose(config_name="config", overrides=overrides))
            if model is None:
                model = build_model(
                    config.model, torch.device(config.mode.device), seed=config.workload.seed
                )
                fuse_qkv_and_gate_up(model)
                counts = fuse_norm_and_rope(model)
                self.log(f"e2e: model built and fused ({counts})")
            try:
                res = execute(config, engine, model=model)
            except Exception as e:
                self.record(section="e2e", overrides=overrides, error=repr(e)[:500])
                self.log(f"e2e {overrides}: FAILED {e!r:.400}")
                traceback.print_exc()
                continue
            m = compute_metrics(res.trace)
            n_params = sum(p.numel() for p in model.parameters())
            weight_bytes = (n_params - model.model.embed_tokens.weight.numel()) * 2
            kv_tok = 32 * 8 * 128 * 2 * 2
            B, prompt = 32, 256
            # floor of the decode steps: weights + live KV of each step at 4.27 TB/s
            floor_s = sum(weight_bytes + B * (prompt + i) * kv_tok for i in range(1, gen)) / (
                self.copy_tbps * 1e12
            )
            row = dict(section="e2e", overrides=overrides, engine=engine, gen_len=gen,
                       total_time_s=m["total_time_s"], step_time_ms_mean=m["step_time_ms_mean"],
                       step_time_ms_p50=m["step_time_ms_p50"], gpu_forward_ms_mean=m["gpu_forward_ms_mean"],
                       tokens_per_s=m["tokens_per_s"], gpu_idle_fraction=m["gpu_idle_fraction"],
                       host_ms_per_step=m["host_ms_per_step"], decode_floor_s=floor_s,
                       pct_floor=100 * floor_s / m["total_time_s"], counters=res.summary,
                       memory=res.trace.other_data.get("memory"),
                       attention=res.trace.other_data.get("attention"))  # fmt: skip
            self.record(**row)
            self.log(f"e2e {engine} 32x(256+{gen}): {m['total_time_s']:.2f} s, {m['step_time_ms_mean']:.3f} ms/step "
                     f"(p50 {m['step_time_ms_p50']:.3f}), forward {m['gpu_forward_ms_mean']:.3f} ms, "
                     f"{m['tokens_per_s']:.0f} tok/s, GPU idle {m['gpu_idle_fraction']:.3%}, "
                     f"decode floor {floor_s:.2f} s = {row['pct_floor']:.1f}% of the run")  # fmt: skip
            del res
            gc.collect()
            torch.cuda.empty_cache()

    def table(self):
        lines = [
            "| variant | ctx | ms/step | tok/s | GB/s | floor ms | % of floor |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            if r.get("section") == "model" and "ms" in r:
                lines.append(
                    f"| {r['variant']} | {r['ctx']} | {r['ms']:.3f} | {r['tok_per_s']:.0f} | {r['gbps']:.0f} "
                    f"| {r['floor_ms']:.2f} | {r['pct_floor']:.1f} |"
                )
        text = "\n".join(lines)
        (self.out / "bench_decode_table.md").write_text(text + "\n")
        print("\n" + text, flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=os.environ.get("OUT", "experiments/perf/local"))
    p.add_argument("--contexts", default="256,1024,4096,8192")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sections", default="env,check,kernel,gemm,model")
    p.add_argument(
        "--deadline", type=float, default=270.0, help="seconds; sections stop starting work after"
    )
    p.add_argument(
        "--reserve-s", type=float, default=10.0, help="stop a section when less than this is left"
    )
    p.add_argument("--skip-hf", action="store_true", help="skip transformers' sdpa + StaticCache")
    p.add_argument("--e2e", default="1024:async,8192:async", help="section e2e: GEN_LEN:ENGINE,...")
    p.add_argument(
        "--small", action="store_true", help="tiny model on the CPU: a smoke test of the plumbing"
    )
    args = p.parse_args(argv)
    bench = Bench(args)
    if args.small:
        bench.contexts = [8, 40]
        args.batch = 4
    else:
        bench.contexts = [int(c) for c in args.contexts.split(",")]
    budgets = dict(
        check=30.0, kernel=60.0, gemm=20.0, e2e=200.0
    )  # seconds; the model section gets the rest
    for name in args.sections.split(","):
        bench.section_end = bench.elapsed() + budgets.get(name, math.inf)
        try:
            getattr(bench, name)()
        except Exception as e:
            bench.record(section=name, error=repr(e)[:500])
            bench.log(f"{name}: FAILED {e!r:.500}")
            traceback.print_exc()
    bench.table()
    bench.log("done")


if __name__ == "__main__":
    main()
