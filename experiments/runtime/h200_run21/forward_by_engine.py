"""The same decode graph's replay time in the sync and the async run of each recorded workload.

    python experiments/runtime/h200_run21/forward_by_engine.py [PART ...]   (default: every part)

Per workload, the medians of the replayed decode graphs' spans over the first, middle and last
tenth of the steps, sync and async, and the sync launch span (how far the sync span's start can
be off: its marker passes before the host submits the graph; `cbsim.trace.normalize` moves it to
the submission). An async replay starts long after its launch (it queues behind the forward
before it), so its span is the GPU's time alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cbsim.trace import read_trace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from diag_replay_kernels import windows  # noqa: E402


def replays(path: Path):
    f = read_trace(path).span_frame()
    graphs = f[(f.lane == "compute") & (f.name == "graph_replay")].set_index("step")
    launch = f[(f.lane == "host") & (f.name == "launch")].set_index("step")
    return graphs.dur, launch.dur


def main(parts: list[str]) -> None:
    parts = parts or sorted(p.name for p in HERE.iterdir() if (p / "manifest.yaml").exists())
    print(
        "| part | workload | sync replay us (start / mid / end) | async | async / sync | sync launch us |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for part in parts:
        for case in sorted(
            p for p in (HERE / part).iterdir() if (p / "trace_async.json.gz").exists()
        ):
            sync, launch = replays(case / "trace_sync.json.gz")
            asyn, _ = replays(case / "trace_async.json.gz")
            if len(sync) < 40 or len(asyn) < 40:
                continue
            s, a = windows(sync), windows(asyn)
            ratio = " / ".join(f"{y / x:.3f}" for x, y in zip(s, a))
            print(
                f"| {part} | {case.name} | {' / '.join(f'{x:.0f}' for x in s)} | "
                f"{' / '.join(f'{x:.0f}' for x in a)} | {ratio} | {launch.median():.0f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
