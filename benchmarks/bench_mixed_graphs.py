"""What engine.mixed_graphs buys: steps with prompt tokens replayed from piecewise CUDA graphs
per token bucket (buckets: runtime/piecewise.py) or one graph each (full: runtime/full_graphs.py)
against launched eagerly (cbsim/costs/mixed_graphs.py), simulated, and measured by the runtime
on a GPU.

    python benchmarks/bench_mixed_graphs.py                    # hardware=h200 and h100
    python benchmarks/bench_mixed_graphs.py --hardware h100 --requests 64
    python benchmarks/bench_mixed_graphs.py --runtime          # the GPU: the runtime, measured
    python benchmarks/bench_mixed_graphs.py --runtime --small  # a CPU smoke test of the plumbing

Simulated (the default): predictions of the cost model. Per online workload (engine=compare)
and profile, per setting: the async engine's host ``launch`` per step by step kind (mean, ms), its GPU
idle, its TTFT p50 / p99, both engines' totals, and the graph pool the switch sizes. A third
row, "buckets, 1-op attention", is the same switch with the runtime's attention cut to one
kernel per group and layer (hardware.gpu.*_kernels_per_layer=1, *_kernels_extra=0): what the
pieces leave eager decides how far the launch falls.
"""

from __future__ import annotations

import argparse
import time

import cbsim

# online workloads whose steps carry prompts all the time: small models at a high arrival
# rate (launch-bound while their mixed steps are eager) and the 8B at a moderate one
WORKLOADS = {
    "1B poisson 40/s": (
        "model=llama3_1b",
        "workload.batch_size=64",
        "workload.rate=40",
        "workload.prompt_len=1024",
        "workload.gen_len=128",
    ),
    "3B poisson 20/s, 2K prompts": (
        "model=llama3_3b",
        "workload.batch_size=64",
        "workload.rate=20",
        "workload.prompt_len=2048",
        "workload.prompt_dist=fixed",
        "workload.gen_len=128",
        "workload.max_batch_tokens=4096",
    ),
    "8B poisson 6/s": ("model=llama3_8b",),
}
KINDS = ("decode", "mixed", "prefill")
# the attention between the pieces as one kernel per group and layer (vLLM's one custom op)
ONE_OP = tuple(
    f"hardware.gpu.{g}_kernels_{what}={n}"
    for g in ("decode", "prefill", "prefix")
    for what, n in (("per_layer", 1), ("extra", 0))
    if not (g == "decode" and what == "extra")
)
SETTINGS = {
    "off": ("engine.mixed_graphs=off",),
    "buckets": ("engine.mixed_graphs=buckets",),
    "buckets, 1-op attention": ("engine.mixed_graphs=buckets", *ONE_OP),
    "full": ("engine.mixed_graphs=full",),
}


def row(hardware: str, overrides: tuple[str, ...], setting: str, requests: int) -> list[str]:
    r = cbsim.simulate(
        "+experiment=online",
        f"hardware={hardware}",
        "engine=compare",
        f"workload.num_requests={requests}",
        *overrides,
        *SETTINGS[setting],
    )
    s = r.spans
    launch = s[(s.engine == "async") & (s.name == "launch")].groupby("kind").dur_ms.mean()
    a, sync = r.metrics["async"], r.metrics["sync"]
    return [
        setting,
        *(f"{launch[k]:.2f}" if k in launch else "-" for k in KINDS),
        f"{100 * a['gpu_idle_fraction']:.1f}",
        f"{a['ttft_ms_p50']:.0f}",
        f"{a['p99_ttft_ms']:.0f}",
        f"{sync['total_time_s']:.2f}",
        f"{a['total_time_s']:.2f}",
        f"{a['graph_pool_bytes'] / 2**20:.0f}",
    ]


# --small: the tiny model in the CPU emulation (execute(..., cpu_emulation=True)), seconds
SMALL = (
    "model=tiny",
    "mode.device=cpu",
    "workload.batch_size=4",
    "workload.rate=50",
    "workload.prompt_len=24",
    "workload.gen_len=8",
    "workload.max_batch_tokens=32",
    "engine.eager_token_multiple=8",
    "engine.graph_batch_sizes=[1,2,4]",
)


def runtime_rows(overrides: tuple[str, ...], setting: str, requests: int, small: bool):
    """The runtime's measured row per engine: host launch and forward (GPU time, ms) by step
    kind, TTFT p50, total, the graph pool and the piecewise graphs' share of it."""
    from cbsim.api import compose
    from cbsim.metrics import compute_metrics
    from cbsim.runtime.engine import execute

    cfg = compose(
        "+experiment=online",
        "mode=runtime",
        f"workload.num_requests={requests}",
        *overrides,
        *SETTINGS[setting],
    )
    for engine in ("sync", "async"):
        res = execute(cfg, engine, cpu_emulation=small)
        s, m = res.trace.spans, compute_metrics(res.trace)
        launch = s[(s.lane == "host") & (s.name == "launch")].groupby("kind").dur.mean()
        fwd = s[s.lane == "compute"].groupby("kind").dur.mean()
        mem = res.trace.other_data["memory"]
        yield [
            setting,
            engine,
            *(f"{launch[k] / 1e3:.2f}" if k in launch else "-" for k in KINDS),
            *(f"{fwd[k] / 1e3:.2f}" if k in fwd else "-" for k in KINDS),
            f"{m['ttft_ms_p50']:.0f}",
            f"{m['total_time_s']:.2f}",
            f"{mem['graph_pool_bytes'] / 2**20:.0f}",
            f"{mem['mixed_pool_bytes'] / 2**20:.0f}",
            str(mem["mixed_graphs"]),
        ]


def measure(args) -> None:
    name = "small (tiny, CPU emulation)" if args.small else args.workload
    overrides = SMALL if args.small else WORKLOADS[args.workload]
    head = ["mixed_graphs", "engine", *(f"launch {k} ms" for k in KINDS)]
    head += [*(f"forward {k} ms" for k in KINDS), "TTFT p50 ms", "total s"]
    head += ["pool MiB", "pieces' MiB", "piece graphs"]
    print(f"measured by the runtime, {name}, {args.requests} requests ({' '.join(overrides)})")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for setting in ("off", "buckets", "full"):
        for cells in runtime_rows(overrides, setting, args.requests, args.small):
            print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", nargs="+", default=["h200", "h100"])
    ap.add_argument("--requests", type=int, default=96, help="requests per workload")
    ap.add_argument("--runtime", action="store_true", help="measure the runtime (the GPU)")
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="1B poisson 40/s")
    ap.add_argument("--small", action="store_true", help="with --runtime: tiny, on the CPU")
    args = ap.parse_args()
    if args.runtime:
        measure(args)
        return
    head = ["mixed_graphs", *(f"launch {k} ms" for k in KINDS), "GPU idle %"]
    head += ["TTFT p50 ms", "TTFT p99 ms", "sync s", "async s", "pool MiB"]
    print(f"simulated predictions, engine=compare, {args.requests} requests per workload")
    print("launch, GPU idle and TTFT: the async engine's")
    for hw in args.hardware:
        for name, overrides in WORKLOADS.items():
            t0 = time.process_time()
            rows = [row(hw, overrides, m, args.requests) for m in SETTINGS]
            took = time.process_time() - t0
            print(f"\nhardware={hw}, {name} ({' '.join(overrides)}; {took:.0f} s CPU)")
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
            for cells in rows:
                print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
