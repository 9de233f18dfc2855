"""What importing a large torch.profiler (Kineto) trace costs: wall time and peak memory of
``python -m cbsim.trace.kineto IN OUT`` in a fresh process (so its peak RSS is its own, not the
generator's), on a generated Kineto-shaped trace of N events.

    python benchmarks/bench_kineto_import.py [--events N ...] [--dir DIR] [--whole]

The trace is an eager decode loop as torch.profiler records it: per step a ``forward#N`` range
on the main thread holding 64 kernel launches (an aten op, the op it calls, the
cudaLaunchKernel and its flow events, the kernel with Kineto's args), a host-to-device and a
device-to-host copy, a synchronize and a ``schedule`` range; about 170 bytes of JSON an event,
gzip level 1. It is written one event at a time (a 10^7-event trace never sits in memory).
``--whole`` also times the file parsed whole (json.load, then cbsim.trace.kineto.convert), what
the import did before it read a stream: about 1 KB an event. A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

KERNELS_PER_STEP = 64
OPS = ("aten::linear", "aten::mm", "aten::add", "aten::mul", "aten::silu", "aten::softmax")
KERNELS = (
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNN",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>"
    ", std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "std::array<char*, 3ul>)",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0",
)
HOST = '{"ph":"X","cat":"%s","name":"%s","pid":417,"tid":417,"ts":%.3f,"dur":%.3f,"args":{%s}}'
KERNEL = (
    '{"ph":"X","cat":"kernel","name":"%s","pid":0,"tid":7,"ts":%.3f,"dur":%.3f,"args":'
    '{"queued":0,"device":0,"context":1,"stream":7,"correlation":%d,"registers per thread":'
    '168,"shared memory":98304,"blocks per SM":1.939394,"warps per SM":15.515152,"grid":'
    '[256,1,1],"block":[384,1,1],"est. achieved occupancy %%":25}}'
)
COPY = (
    '{"ph":"X","cat":"gpu_memcpy","name":"Memcpy %s (Pinned -> Device)","pid":0,"tid":%d,'
    '"ts":%.3f,"dur":%.3f,"args":{"device":0,"context":1,"stream":%d,"correlation":%d,'
    '"bytes":%d,"memory bandwidth (GB/s)":12.5}}'
)
FLOW = '{"ph":"%s","id":%d,"pid":417,"tid":417,"ts":%.3f,"cat":"ac2g","name":"ac2g"%s}'
HEAD = (
    '{"schemaVersion":1,"deviceProperties":[{"id":0,"name":"NVIDIA H200","numSms":132}],'
    '"cuda_runtime_version":13000,"displayTimeUnit":"ms","baseTimeNanoseconds":'
    '1790857026000000000,"traceEvents":[\n'
)
TAIL = '\n],"traceName":"bench.json"}\n'


def step_events(step: int, t: float, corr: int) -> tuple[list[str], float, int]:
    """The events of one decode step starting at host time t (us), and where the next starts."""
    ev: list[str] = []
    ev.append(HOST % ("user_annotation", "schedule", t, 20.0, f'"External id":{corr}'))
    t0, gpu = t + 25.0, t + 60.0
    host = t0
    for k in range(KERNELS_PER_STEP + 2):
        corr += 1
        if k in (0, KERNELS_PER_STEP + 1):  # the inputs in, the sampled tokens out
            kind, stream = ("HtoD", 13) if k == 0 else ("DtoH", 21)
            ev.append(
                HOST % ("cuda_runtime", "cudaMemcpyAsync", host, 3.0, f'"correlation":{corr}')
            )
            ev.append(COPY % (kind, stream, gpu, 1.5, stream, corr, 4096))
            host, gpu = host + 4.0, gpu + 2.0
            continue
        op = OPS[k % len(OPS)]
        ev.append(HOST % ("cpu_op", op, host, 9.0, f'"External id":{corr},"Ev Idx":{k}'))
        ev.append(HOST % ("cpu_op", "aten::empty", host + 0.5, 1.0, f'"External id":{corr}'))
        ev.append(
            HOST % ("cuda_runtime", "cudaLaunchKernel", host + 4.0, 4.0, f'"correlation":{corr}')
        )
        ev.append(FLOW % ("s", corr, host + 4.0, ""))
        ev.append(FLOW % ("f", corr, gpu, ',"bp":"e"'))
        ev.append(KERNEL % (KERNELS[k % len(KERNELS)], gpu, 6.25, corr))
        host, gpu = host + 10.0, gpu + 7.0
    ev.insert(1, HOST % ("user_annotation", f"forward#{step}", t0, host - t0, '"External id":0'))
    end = max(host, gpu) + 5.0
    ev.append(HOST % ("cuda_runtime", "cudaStreamSynchronize", host, end - host, ""))
    return ev, end + 10.0, corr


def write_kineto(path: Path, events: int) -> int:
    """A Kineto-shaped trace of exactly ``events`` events, gzip, written as it is made."""
    with gzip.open(path, "wt", compresslevel=1) as f:
        return _write_events(f, events)


def _write_events(f: TextIO, events: int) -> int:
    f.write(HEAD)
    n, step, t, corr = 0, 0, 1.0e12, 1000
    while n < events:
        ev, t, corr = step_events(step, t, corr)
        ev = ev[: events - n]
        f.write((",\n" if n else "") + ",\n".join(ev))
        n, step = n + len(ev), step + 1
    f.write(TAIL)
    return n


# Each script ends by printing its peak RSS in MB: the process's own high-water mark (VmHWM),
# which starts afresh at exec; ru_maxrss would also count the parent's memory at the fork (a
# test runner's hundreds of MB).
PEAK = """
import resource
try:
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(peak / 1024)
"""
IMPORT = (
    """
import sys
from cbsim.trace.kineto import main
code = main([sys.argv[1], sys.argv[2], "--max-events", sys.argv[3], "--max-mb", "100000"])
if code:
    sys.exit(code)
"""
    + PEAK
)
WHOLE = (
    """
import gzip, json, sys
from pathlib import Path
from cbsim.trace.io import write_trace
from cbsim.trace.kineto import convert
with gzip.open(sys.argv[1], "rb") as f:
    obj = json.load(f)
write_trace(convert(obj, name=Path(sys.argv[1]).name), sys.argv[2])
"""
    + PEAK
)


def measure(script: str, path: Path, out: Path, events: int) -> tuple[str, float, float]:
    """(outcome, wall s, peak RSS MB) of the script in a fresh process: the time includes the
    interpreter's start-up (about a second)."""
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path), str(out), str(events)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if proc.returncode:
        return f"failed ({proc.stderr.strip().splitlines()[-1:]})", wall, float("nan")
    return "imported", wall, float(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, nargs="+", default=[10_000_000])
    p.add_argument(
        "--dir", type=Path, default=None, help="where the traces go (default: a temp dir)"
    )
    p.add_argument("--whole", action="store_true", help="also time the file parsed whole")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = []
        for n in args.events:
            path = Path(tmp) / f"kineto_{n}.json.gz"
            t = time.perf_counter()
            write_kineto(path, n)
            gen_s = time.perf_counter() - t
            with gzip.open(path, "rb") as f:
                json_mb = sum(len(b) for b in iter(lambda: f.read(1 << 24), b"")) / 2**20
            gz_mb = path.stat().st_size / 2**20
            cases = [("stream", IMPORT)] + ([("whole", WHOLE)] if args.whole else [])
            for label, script in cases:
                outcome, wall, rss = measure(script, path, Path(tmp) / "out.json.gz", n)
                rows.append((n, json_mb, gz_mb, gen_s, label, wall, rss, outcome))
                print(
                    f"{n} events, {label}: {wall:.1f} s, {rss:.0f} MB, {outcome}", file=sys.stderr
                )
            path.unlink()
    head = ("events", "JSON MB", "gz MB", "gen s", "import", "wall s", "peak RSS MB", "outcome")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n, mb, gz, gen, label, wall, rss, outcome in rows:
        print(
            f"| {n:,} | {mb:.0f} | {gz:.0f} | {gen:.0f} | {label} | {wall:.1f} | {rss:.0f} | {outcome} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
