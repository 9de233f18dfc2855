"""What every section shares: the shapes, the floor's denominator, and ``BenchBase`` (the run's
clock and time budget, JSON-lines recording, graph-replayed timing, paged KV caches, the table)."""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

import torch

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


class BenchBase:
    """The run's state and the tools the sections use (the sections are mixins of ``Bench``)."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(self.out / "bench_kernels.jsonl", "a")
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

    def compare_logits(self, label, out, ref):
        err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
        same = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        self.record(section="logits", label=label, rel_err=err, argmax_agree=same)
        self.log(f"logits {label}: rel err {err:.2e}, argmax agreement {same:.2f}")

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
        (self.out / "bench_kernels_table.md").write_text(text + "\n")
        print("\n" + text, flush=True)
