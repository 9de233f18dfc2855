"""Where inside a replayed graph the GPU waits: the largest gaps between consecutive kernels of the
replays in a torch.profiler chrome trace (diag_async_forward.py writes them to /tmp), by position.

    python experiments/runtime/diag_graph_gaps.py TRACE.json [TRACE.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diag_async_forward import SKIP, replays  # noqa: E402


def main(paths: list[str]) -> None:
    for path in paths:
        rows = replays(json.loads(Path(path).read_text()))[SKIP:]
        gaps: dict[int, list[float]] = defaultdict(list)
        names: dict[int, str] = {}
        for r in rows:
            for i in range(1, len(r)):
                gaps[i].append(r[i]["ts"] - (r[i - 1]["ts"] + r[i - 1]["dur"]))
                names[i] = f"{r[i - 1]['name'][:40]} -> {r[i]['name'][:40]}"
        mean = sorted(((float(np.mean(v)), i) for i, v in gaps.items()), reverse=True)
        total = sum(m for m, _ in mean)
        print(f"{Path(path).name}: {len(rows)} replays, mean gaps {total:.1f} us per replay")
        for m, i in mean[:8]:
            print(f"  {m:7.2f} us before kernel {i}: {names[i]}")


if __name__ == "__main__":
    main(sys.argv[1:])
