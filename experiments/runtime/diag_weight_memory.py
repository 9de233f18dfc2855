"""Whether a bandwidth-bound pass over a model's weights gets slower because of the streams a
process has used or because of where the weights lie in device memory.

    python experiments/runtime/diag_weight_memory.py OUTDIR

h200_run19 found a process's first runtime run 2-7% faster in its decode forward than every
later one, each run building its own model; a sync run reusing the first run's stream stayed
fast until an async run had used three other streams. Here, without the runtime: the 8B
shape's 128 layer GEMMs at 24 rows (15 GB of bf16 weights) captured in one CUDA graph, and one
pass over a 5 GB KV-sized buffer (a sum), replayed in turn after each of these events:

    first       weights W1 as the process's first allocation, replayed on stream s1
    streams     three more streams made and used (a kernel and an event each); W1 on s1
    other       W1 replayed on one of those streams
    rebuilt     W1 freed, the allocator's cache emptied, W2 allocated and captured; on s1
    second      W3 allocated beside W2 (new memory, W2 kept); on s1
    rebuilt_again  W2 on s1 again, after W3's allocation

Per event the median of REPS replays (CUDA events), in us, and the TB/s of its bytes. Writes
OUTDIR/diag_weight_memory.json and prints a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # qkv, o, gate_up, down
LAYERS = 32
ROWS = 24
KV_BYTES = 5 * 2**30
REPS = 20
TINY = 2000


def graph_of(body) -> torch.cuda.CUDAGraph:
    """body run once on a side stream (cuBLAS picks and allocates its workspace), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return g


def weights() -> list[torch.Tensor]:
    out = []
    for _ in range(LAYERS):
        for n, k in SHAPES:
            w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
            out.append(w.normal_(0, 0.02))
    return out


def captured(ws: list[torch.Tensor], kv: torch.Tensor) -> tuple:
    """The graph and the buffers it reads and writes (kept alive with it)."""
    xs = {k: torch.randn(ROWS, k, device="cuda", dtype=torch.bfloat16) for _, k in SHAPES}
    outs = [torch.empty(ROWS, w.shape[0], device="cuda", dtype=torch.bfloat16) for w in ws]
    total = torch.empty(1, device="cuda", dtype=torch.float32)

    def body() -> None:
        for w, o in zip(ws, outs, strict=True):
            torch.matmul(xs[w.shape[1]], w.t(), out=o)
        torch.sum(kv.view(1, -1), dim=1, dtype=torch.float32, out=total)

    return graph_of(body), xs, outs, total


def tiny_graph() -> tuple:
    """TINY launches of a one-block kernel: a graph whose time is the GPU's per-kernel cost."""
    x = torch.zeros(256, device="cuda")

    def body() -> None:
        for _ in range(TINY):
            x.add_(1)

    return graph_of(body), x


def replay_us(g, stream: torch.cuda.Stream) -> float:
    times = []
    with torch.cuda.stream(stream):
        for _ in range(REPS + 2):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g[0].replay()
            b.record()
            b.synchronize()
            times.append(1e3 * a.elapsed_time(b))
    times = sorted(times[2:])
    return times[len(times) // 2]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    nbytes = sum(n * k * 2 for n, k in SHAPES) * LAYERS + KV_BYTES
    kv = torch.empty(KV_BYTES // 2, device="cuda", dtype=torch.bfloat16).normal_()
    rows = []
    tiny = tiny_graph()

    def note(event: str, g, stream: torch.cuda.Stream, ws) -> None:
        us = replay_us(g, stream)
        tiny_us = replay_us(tiny, stream) / TINY
        rows.append(
            {
                "event": event,
                "us": us,
                "tiny_kernel_us": tiny_us,
                "tbps": nbytes / us / 1e6,
                "weights_ptr_gb": ws[0].data_ptr() / 1e9,
                "reserved_gb": torch.cuda.memory_reserved() / 1e9,
            }
        )
        print(
            f"{event:<12}{us:>10.0f} us{nbytes / us / 1e6:>7.3f} TB/s  w0 at "
            f"{ws[0].data_ptr() / 1e9:.1f} GB, reserved {rows[-1]['reserved_gb']:.1f} GB, "
            f"{tiny_us:.3f} us a tiny kernel"
        )

    s1 = torch.cuda.Stream()
    w1 = weights()
    g1 = captured(w1, kv)
    note("first", g1, s1, w1)
    note("first", g1, s1, w1)
    others = [torch.cuda.Stream() for _ in range(3)]
    for s in others:
        with torch.cuda.stream(s):
            torch.ones(1024, device="cuda").sum()
            torch.cuda.Event().record()
    torch.cuda.synchronize()
    note("streams", g1, s1, w1)
    note("other", g1, others[0], w1)
    del g1, w1
    torch.cuda.empty_cache()
    w2 = weights()
    g2 = captured(w2, kv)
    note("rebuilt", g2, s1, w2)
    w3 = weights()
    g3 = captured(w3, kv)
    note("second", g3, s1, w3)
    note("rebuilt_again", g2, s1, w2)
    (out / "diag_weight_memory.json").write_text(json.dumps({"bytes": nbytes, "rows": rows}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
