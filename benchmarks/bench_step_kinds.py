"""The runtime per step kind (decode, mixed, prefill): the async host `launch` per step, the GPU
forward per step, and its share of the measured copy rate, beside transformers' continuous
batching in the same process; prints ONE table.

    PYTHONUNBUFFERED=1 python benchmarks/bench_step_kinds.py [--case NAME | "LABEL: OVERRIDES"]...
        [--engines sync,async] [--mixed-graphs off,buckets,full] [--anchor MODEL:BATCH:PROMPT:GEN |
        none] [--copy-tbps T] [--set KEY=VALUE]... [--deadline-s S] [--out FILE.json] [--small]

(a smoke test on a CPU: --small, the tiny model in the runtime's CPU emulation, both engines and
every mixed_graphs setting; or --case tiny-online --set mode.device=cpu, through
`cbsim.runtime.run` as on the GPU, where only sync with mixed_graphs=off runs)

Each case is a list of Hydra overrides (online workloads whose steps carry prompts, and a decode
batch), run with `engine=compare` per engine and per `engine.mixed_graphs` value through
`cbsim.runtime.run`, the function `python -m cbsim mode=runtime` calls. A setting the runtime
refuses (a ConfigError: buckets on a GPU until runtime/piecewise.py is verified there, async on a
CPU) is a row saying so. From each trace, per step kind (the forward span's `kind`: "decode"
only decode rows, "prefill" only prompt tokens, "mixed" both): steps, prompt + decode tokens
per step, the host `launch` span (mean, p50), the forward on the compute lane (mean), the share
of forwards replayed from a graph, and the bytes floor: every weight but the embedding table
plus `kv_tokens` x KV bytes per token (each row's context, the chunk's own tokens included: the
K/V its attention reads), at the copy rate the runtime measured at its start
(otherData.hardware) or else `--copy-tbps`. Prompt steps are compute-bound: their share is low
by nature; decode's is the figure that says how close a step comes to the memory floor.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback

import numpy as np
import pandas as pd
from bench_decode import COPY_TBPS, anchor, copy_rate, weights_read_bytes  # beside this script
from bench_mixed_graphs import SMALL, WORKLOADS

from cbsim.config import CbsimConfig, ConfigError
from cbsim.config.schema import ModelConfig
from cbsim.trace import Trace
from cbsim.trace import schema as S
from cbsim.trace.hardware import recorded_device

KINDS = ("decode", "mixed", "prefill")
GRAPHS = ("off", "buckets", "full")
ONLINE = ("+experiment=online", "mode=runtime", "engine=compare")
CASES: dict[str, tuple[str, ...]] = {
    # the 8B at 6 requests/s, prompts uniform 102..1946 tokens, lognormal generations (mean 384)
    "8b-poisson": (
        *ONLINE,
        "workload.num_requests=96",
        "workload.prompt_dist=uniform",
        "workload.prompt_len=1024",
        "workload.prompt_spread=0.9",
    ),
    # a small model at a high arrival rate: prompt tokens in most steps, launch-bound when eager
    "1b-rate": (*ONLINE, *WORKLOADS["1B poisson 40/s"], "workload.num_requests=192"),
    "3b-2k": (*ONLINE, *WORKLOADS["3B poisson 20/s, 2K prompts"], "workload.num_requests=96"),
    # one wave of 32: a prefill step, then decode only
    "8b-decode": (
        "mode=runtime",
        "engine=compare",
        "model=llama3_8b",
        "workload.batch_size=32",
        "workload.prompt_len=256",
        "workload.gen_len=512",
    ),
    # --small: the tiny model on the CPU, every kind of step in a second
    "tiny-online": (*ONLINE, *SMALL, "workload.num_requests=12"),
}
GPU_CASES = ("8b-poisson", "1b-rate", "3b-2k", "8b-decode")
DEFAULT_ANCHOR = "llama3_8b:32:256:64"


def parse_case(text: str) -> tuple[str, tuple[str, ...]]:
    """A --case: a name from CASES, or "LABEL: OVERRIDE OVERRIDE ..."."""
    if text in CASES:
        return text, CASES[text]
    label, sep, rest = text.partition(":")
    if not sep or not rest.split():
        raise SystemExit(
            f"--case {text!r}: allowed: one of {', '.join(CASES)}, or 'LABEL: OVERRIDES...'"
        )
    return label.strip(), tuple(rest.split())


def step_kinds(spans: pd.DataFrame, model: ModelConfig, bytes_per_s: float) -> list[dict]:
    """One row per step kind present: the forwards on the compute lane and the host launches,
    grouped by their `kind` arg (what the scheduler built the step as)."""
    fwd = spans[(spans.lane == S.COMPUTE) & spans.name.isin(S.FORWARD_NAMES)]
    launch = spans[(spans.lane == S.HOST) & (spans.name == S.LAUNCH)]
    weights = weights_read_bytes(model)
    rows = []
    for kind in KINDS:
        f = fwd[fwd.kind == kind]
        if f.empty:
            continue
        dur_ms = f.dur.to_numpy() / 1e3
        floor_ms = 1e3 * (weights + f.kv_tokens.to_numpy() * model.kv_bytes_per_token)
        floor_ms = floor_ms / bytes_per_s
        host_ms = launch[launch.kind == kind].dur.to_numpy() / 1e3
        rows.append(
            {
                "kind": kind,
                "steps": len(f),
                "tokens_per_step": float(f.query_tokens.mean()),
                "launch_ms_mean": float(host_ms.mean()) if len(host_ms) else None,
                "launch_ms_p50": float(np.median(host_ms)) if len(host_ms) else None,
                "fwd_ms_mean": float(dur_ms.mean()),
                "floor_ms_mean": float(floor_ms.mean()),
                "floor_share": float(floor_ms.sum() / dur_ms.sum()) if dur_ms.sum() > 0 else None,
                "graphed": float((f.name == S.GRAPH_REPLAY).mean()),
            }
        )
    return rows


def run_trace(overrides: list[str], engine: str, emulate: bool) -> tuple[CbsimConfig, Trace]:
    """(config, trace) of one run: `cbsim.runtime.run`, or with --small the runtime's CPU
    emulation of the async loop and the graphs (execute(..., cpu_emulation=True))."""
    from cbsim.api import compose
    from cbsim.runtime import run
    from cbsim.runtime.engine import execute

    config = compose(*overrides)
    if emulate:
        return config, execute(config, engine, cpu_emulation=True).trace
    return config, run(config, engine)


def measure(
    label: str, overrides: list[str], engine: str, graphs: str, a: argparse.Namespace
) -> list[dict]:
    """The rows of one case, engine and mixed_graphs value: one per step kind, or one that
    says it was refused or failed."""
    key = {"case": label, "engine": engine, "graphs": graphs}
    try:
        config, trace = run_trace(
            [*overrides, f"engine.mixed_graphs={graphs}", *a.set], engine, a.small
        )
    except ConfigError as exc:
        return [{**key, "refused": str(exc)}]
    except Exception as exc:  # keep the other cases
        traceback.print_exc()
        return [{**key, "error": repr(exc)[:300]}]
    finally:
        release_memory()
    rate, basis = copy_rate(trace.other_data, a.copy_tbps)
    run = {**key, "copy_tbps": rate / 1e12, "copy_basis": basis}
    run["device"] = recorded_device(trace.other_data) or "?"
    kinds = step_kinds(trace.spans, config.model, rate)
    return [{**run, **k} for k in kinds] or [{**key, "error": "no forward spans"}]


def release_memory() -> None:
    """What a run built goes before the next one sizes its KV cache from the free memory."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def run_cases(a: argparse.Namespace) -> list[dict]:
    t0 = time.perf_counter()
    rows: list[dict] = []
    for label, overrides in a.cases:
        for engine in a.engines:
            for graphs in a.mixed_graphs:
                key = {"case": label, "engine": engine, "graphs": graphs}
                if time.perf_counter() - t0 > a.deadline_s:
                    rows.append({**key, "error": "skipped: deadline"})
                    continue
                got = measure(label, list(overrides), engine, graphs, a)
                for r in got:
                    print(json.dumps(r, default=str), flush=True)
                rows += got
    return rows


def anchor_row(spec: str) -> dict:
    """transformers' generate_batch (bench_decode.anchor), or the reason it has no number."""
    release_memory()  # transformers sizes its KV cache from the memory free now
    try:
        return anchor(spec)
    except Exception as exc:
        return {"case": spec, "error": repr(exc)[:300]}


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict], anchors: list[dict]) -> str:
    runs = [r for r in rows if "kind" in r]
    rates = sorted({f"{r['copy_tbps']:.3g} TB/s {r['copy_basis']}" for r in runs})
    devices = sorted({r["device"] for r in runs}) or ["no run"]
    lines = [
        "per step kind: host launch ms per step (mean, p50), GPU forward ms (mean), floor ms "
        "(weights + KV read at the copy rate) and its share of the forward",
        f"copy rate: {'; '.join(rates) or '-'}; {', '.join(devices)}",
        f"{'case':<14}{'engine':<7}{'graphs':<9}{'kind':<9}{'steps':>7}{'tok/step':>10}"
        f"{'launch':>9}{'p50':>8}{'fwd ms':>9}{'floor':>8}{'share':>8}{'graphed':>9}",
    ]
    for r in rows:
        head = f"{r['case']:<14}{r['engine']:<7}{r['graphs']:<9}"
        if "kind" not in r:
            why = f"refused: {r['refused']}" if "refused" in r else f"failed: {r['error']}"
            lines.append(head + why)
            continue
        lines.append(
            f"{head}{r['kind']:<9}{r['steps']:>7}{r['tokens_per_step']:>10.1f}"
            f"{fmt(r['launch_ms_mean'], '.3f'):>9}{fmt(r['launch_ms_p50'], '.3f'):>8}"
            f"{r['fwd_ms_mean']:>9.3f}{r['floor_ms_mean']:>8.3f}"
            f"{fmt(r['floor_share'], '.1%'):>8}{r['graphed']:>9.0%}"
        )
    for x in anchors:
        if "error" in x:
            lines.append(f"{'hf cb':<14}{x['case']} failed: {x['error']}")
        else:
            lines.append(
                f"{'hf cb':<14}{x['case']}: {x['ms_per_step']:.3f} ms/step, {x['wall_s']:.2f} s "
                "(transformers generate_batch, paged|sdpa, sync, CUDA graphs; wall / new tokens)"
            )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", default=[], help="a name or 'LABEL: OVERRIDES'")
    p.add_argument("--engines", default="sync,async")
    p.add_argument("--mixed-graphs", default=",".join(GRAPHS))
    p.add_argument("--anchor", default=None, help=f"default {DEFAULT_ANCHOR}; none skips it")
    p.add_argument("--copy-tbps", type=float, default=COPY_TBPS, help="without a measured rate")
    p.add_argument("--deadline-s", type=float, default=1e9, help="start no run after this")
    p.add_argument("--set", action="append", default=[], help="one more override (repeatable)")
    p.add_argument("--out", default=None, help="the rows as JSON (written atomically)")
    p.add_argument("--small", action="store_true", help="tiny, in the runtime's CPU emulation")
    a = p.parse_args(argv)
    a.cases = [parse_case(c) for c in a.case or (["tiny-online"] if a.small else GPU_CASES)]
    a.engines = a.engines.split(",")
    a.mixed_graphs = a.mixed_graphs.split(",")
    for flag, values, allowed in (
        ("--engines", a.engines, ("sync", "async")),
        ("--mixed-graphs", a.mixed_graphs, GRAPHS),
    ):
        if not values or not set(values) <= set(allowed):
            p.error(f"{flag} {','.join(values)}: allowed: a comma list of {', '.join(allowed)}")
    a.anchor = a.anchor or ("none" if a.small else DEFAULT_ANCHOR)
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    t0 = time.perf_counter()
    rows = run_cases(a)
    anchors = []
    if a.anchor != "none" and time.perf_counter() - t0 < a.deadline_s:
        anchors.append(anchor_row(a.anchor))
    print("\n" + table(rows, anchors), flush=True)
    if a.out:
        from cbsim.rundir import atomic_write_json

        atomic_write_json(a.out, {"argv": sys.argv, "rows": rows, "anchors": anchors})


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
