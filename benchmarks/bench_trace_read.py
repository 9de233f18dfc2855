"""What reading a hostile or huge trace costs: wall time and peak memory, each case in a fresh
process (so its peak RSS is its own), refused or read.

    python benchmarks/bench_trace_read.py [--dir DIR] [--events N ...]

Cases: a gzip bomb (4 MB that expands to 4 GiB: 64 members of 64 MiB of zeros), a plain
10^7-event trace (about 1.35 GB) and the same gzipped, and traces of N events (default 10^5 and
just under the reader's event limit, 10^6) read and measured (read_trace + compute_metrics).
The limits are cbsim.trace.load.DEFAULT_MAX_BYTES / DEFAULT_MAX_EVENTS. A benchmark, never a
timed test.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cbsim.trace.load import DEFAULT_MAX_EVENTS

READ = """
import sys, time
from cbsim.metrics import compute_metrics
from cbsim.trace import TraceError, read_trace
t0 = time.perf_counter()
try:
    compute_metrics(read_trace(sys.argv[1]))
    out = "read and measured"
except TraceError as exc:
    out = "refused: " + str(exc).split(": ", 1)[1][:56]
print(f"{time.perf_counter() - t0:.3f} {out}")
"""
HEAD = (
    '{"otherData":{"schema":"cbsim.trace","version":1,"source":"sim","engine":"sync"},'
    '"traceEvents":['
    + ",".join(
        '{{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}}'.format(*lane)
        for lane in ((1, 1, "host"), (2, 1, "h2d"), (2, 2, "compute"), (2, 3, "d2h"))
    )
)
SPAN = (
    ',{"ph":"X","name":"forward","cat":"gpu","pid":2,"tid":2,"ts":%d.5,"dur":1.0,'
    '"args":{"step":%d,"requests":32,"new_tokens":32}}'
)


def write_events(path: Path, n: int, gz: bool) -> Path:
    """n forward spans on the compute lane, back to back (about 100 bytes each)."""
    opener = gzip.open if gz else open
    with opener(path, "wt", **({"compresslevel": 1} if gz else {})) as f:
        f.write(HEAD)
        block = 100_000
        for start in range(0, n, block):
            f.write("".join(SPAN % (2 * i, i) for i in range(start, min(n, start + block))))
        f.write("]}")
    return path


def write_bomb(path: Path) -> Path:
    member = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    path.write_bytes(member * 64)
    return path


def measure(path: Path) -> tuple[str, float, float]:
    """(outcome, s, peak RSS MB) of reading and measuring the file in a fresh process (the time
    from the call to its answer, the interpreter's start-up left out)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", READ, str(path)], stdout=subprocess.PIPE, text=True
    )
    out = proc.stdout.read().strip() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        return f"crashed ({out})", float("nan"), usage.ru_maxrss / 1024
    wall, _, outcome = out.partition(" ")
    return outcome, float(wall), usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where to write the test files")
    ap.add_argument("--events", type=int, nargs="*", default=[100_000, DEFAULT_MAX_EVENTS - 10])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        cases = [("gzip bomb, 4 GiB from", write_bomb(d / "bomb.json.gz"))]
        cases.append(("10^7 events", write_events(d / "e7.json", 10_000_000, gz=False)))
        cases.append(("10^7 events, gzip", write_events(d / "e7.json.gz", 10_000_000, gz=True)))
        for n in args.events:
            cases.append((f"{n} events", write_events(d / f"e{n}.json", n, gz=False)))
        print(f"{'case':<24}{'file MB':>9}{'s':>9}{'peak RSS MB':>13}  outcome")
        for label, path in cases:
            out, wall, rss = measure(path)
            mb = path.stat().st_size / 1e6
            print(f"{label:<24}{mb:>9.1f}{wall:>9.2f}{rss:>13.0f}  {out}")


if __name__ == "__main__":
    main()
