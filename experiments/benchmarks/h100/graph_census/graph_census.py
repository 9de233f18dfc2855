"""Full-graph mixed steps: node census and replay cost per bucket (idle GPU, back to back), and
the async loop's launch pieces with each graph uploaded (replayed once) at capture."""

import ctypes
import json
import os
import sys
from collections import Counter, defaultdict
from time import perf_counter

import numpy as np
import torch

sys.path.insert(0, "benchmarks")
from bench_step_kinds import CASES

import cbsim.runtime.full_graphs as fg
import cbsim.runtime.runner as rn
from cbsim.api import compose
from cbsim.runtime import run

case, engine, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
cu = ctypes.CDLL("libcuda.so.1")


def census(g):
    h = ctypes.c_void_p(g.raw_cuda_graph())
    n = ctypes.c_size_t(0)
    cu.cuGraphGetNodes(h, None, ctypes.byref(n))
    nodes = (ctypes.c_void_p * n.value)()
    cu.cuGraphGetNodes(h, nodes, ctypes.byref(n))
    types, names, clusters = Counter(), Counter(), 0
    for nd in nodes:
        t = ctypes.c_int()
        cu.cuGraphNodeGetType(ctypes.c_void_p(nd), ctypes.byref(t))
        types[t.value] += 1
        if t.value == 0:
            p = (ctypes.c_ubyte * 72)()
            rc = cu.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(nd), p)
            func = ctypes.c_void_p.from_buffer(p, 0).value
            kern = ctypes.c_void_p.from_buffer(p, 56).value
            nm = ctypes.c_char_p()
            r2 = cu.cuFuncGetName(ctypes.byref(nm), ctypes.c_void_p(func)) if func else -1
            if r2 != 0 and kern:
                r2 = cu.cuKernelGetName(ctypes.byref(nm), ctypes.c_void_p(kern))
            names[(nm.value or b"?").decode()[:60] if r2 == 0 else f"?rc{rc}/{r2}"] += 1
            v = (ctypes.c_uint * 16)()
            if (
                cu.cuGraphKernelNodeGetAttribute(ctypes.c_void_p(nd), 4, v) == 0
                and v[0] * v[1] * v[2] > 1
            ):
                clusters += 1
    order = []
    for nd in nodes[:40]:
        t = ctypes.c_int()
        cu.cuGraphNodeGetType(ctypes.c_void_p(nd), ctypes.byref(t))
        if t.value == 0:
            p = (ctypes.c_ubyte * 72)()
            cu.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(nd), p)
            func = ctypes.c_void_p.from_buffer(p, 0).value
            kern = ctypes.c_void_p.from_buffer(p, 56).value
            nm = ctypes.c_char_p()
            r2 = cu.cuFuncGetName(ctypes.byref(nm), ctypes.c_void_p(func)) if func else -1
            if r2 != 0 and kern:
                r2 = cu.cuKernelGetName(ctypes.byref(nm), ctypes.c_void_p(kern))
            grid = [ctypes.c_uint.from_buffer(p, 8 + 4 * i).value for i in range(6)]
            order.append(("K", (nm.value or b"?").decode()[:70], grid))
        elif t.value == 2:
            mp = (ctypes.c_ubyte * 48)()
            rc = cu.cuGraphMemsetNodeGetParams(ctypes.c_void_p(nd), mp)
            dst = ctypes.c_uint64.from_buffer(mp, 0).value
            val = ctypes.c_uint.from_buffer(mp, 16).value
            es = ctypes.c_uint.from_buffer(mp, 20).value
            w = ctypes.c_size_t.from_buffer(mp, 24).value
            h = ctypes.c_size_t.from_buffer(mp, 32).value
            order.append(("M", rc, hex(dst), val, es, w, h))
        else:
            order.append(("T", t.value))
    return {
        "nodes": n.value,
        "types": dict(types),
        "clusters": clusters,
        "kernels": names.most_common(14),
        "order": order,
    }


out = {
    "variant": os.environ.get("VARIANT"),
    "bf16_red": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    "case": case,
    "engine": engine,
    "extra": extra,
}
orig_cap = fg.FullGraphs.capture


def t_cap(self, stream, pool):
    orig_cap(self, stream, pool)
    for (si, b), g in self.graphs.items():  # upload: one replay with the bucket's dummy loaded
        self._load(self.runner.slots[si], b)
        g.replay()
    torch.cuda.synchronize()
    cen = {}
    for b in [b for b in sorted(self.buckets) if b in (512, 768, 4096)]:
        self._load(self.runner.slots[0], b)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g, pool=pool, stream=stream):
            self.body(self.runner.slots[0], self.layouts[b])
        g.instantiate()
        g.replay()
        torch.cuda.synchronize()
        idle = []
        for _ in range(5):
            t = perf_counter()
            g.replay()
            idle.append(perf_counter() - t)
            torch.cuda.synchronize()
        busy = []
        for _ in range(5):
            t = perf_counter()
            g.replay()
            busy.append(perf_counter() - t)
        torch.cuda.synchronize()
        gpu = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            gpu.append(e0.elapsed_time(e1))
        cen[b] = {
            "idle_ms": round(1e3 * min(idle), 4),
            "busy_ms": round(1e3 * float(np.median(busy)), 4),
            "gpu_ms": round(float(np.median(gpu)), 4),
            **census(g),
        }
        print(b, json.dumps(cen[b]), flush=True)
    out["census"] = cen


fg.FullGraphs.capture = t_cap
rows, seen, cur = [], defaultdict(int), {}
orig_run, orig_in, orig_out = fg.FullGraphs.run, rn.ModelRunner.copy_in, rn.ModelRunner.copy_out


def t_run(self, slot, layout, bucket):
    t = perf_counter()
    orig_run(self, slot, layout, bucket)
    cur.update(replay=perf_counter() - t, bucket=bucket)


def t_in(self, plan):
    t = perf_counter()
    orig_in(self, plan)
    cur["copy_in"] = perf_counter() - t


def t_out(self, plan):
    t = perf_counter()
    orig_out(self, plan)
    cur["copy_out"] = perf_counter() - t
    if plan.tokens_bucket is not None:
        rows.append(dict(cur))
    cur.clear()


fg.FullGraphs.run, rn.ModelRunner.copy_in, rn.ModelRunner.copy_out = t_run, t_in, t_out
ov = [o for o in CASES[case] if o != "engine=compare"] + [
    "engine.mixed_graphs=full",
    "workload.num_requests=48",
    *extra,
]
tr = run(compose(*ov), engine)


def ms(a) -> float:
    return round(1e3 * float(np.mean(a)), 4)


out["loop"] = {k: ms([r[k] for r in rows]) for k in ("replay", "copy_in", "copy_out")}
byb = defaultdict(list)
for r in rows:
    byb[r["bucket"]].append(r["replay"])
out["loop_by_bucket"] = {b: (len(v), ms(v)) for b, v in sorted(byb.items())}
sp = tr.spans
for kind in ("decode", "mixed"):
    d = sp[(sp.lane == "host") & (sp.name == "launch") & (sp.kind == kind)].dur.to_numpy() / 1e3
    out[f"launch_{kind}"] = (
        (round(float(d.mean()), 4), round(float(np.median(d)), 4), len(d)) if len(d) else None
    )
print(json.dumps(out))
