"""The async minus the sync decode forward of every recorded pair of h200_run15-18.

    python experiments/runtime/h200_run19/sync_async_pairs.py > experiments/runtime/h200_run19/pairs.txt

Per case: the two engines' decode forwards matched by KV tokens (the same batch in both), the
median of the differences with its quartiles, and the sync median; then the medians' summary.
"""

from __future__ import annotations

import glob
import os
import statistics

from cbsim.trace.io import read_trace

RUNS = ("h200_run15", "h200_run16", "h200_run17", "h200_run18")
ROOT = os.path.join(os.path.dirname(__file__), "..")
MIN_MATCHED = 20  # steps two engines must share for a pair to count


def decode_forwards(path: str):
    sp = read_trace(path).spans
    fwd = sp[(sp.lane == "compute") & (sp.kind == "decode")]
    return fwd.groupby("kv_tokens").dur.median()


def main() -> None:
    medians = []
    for run in RUNS:
        for d in sorted(glob.glob(os.path.join(ROOT, run, "*", "*", ""))):
            a, s = d + "trace_async.json.gz", d + "trace_sync.json.gz"
            if not (os.path.exists(a) and os.path.exists(s)):
                continue
            fa, fs = decode_forwards(a), decode_forwards(s)
            common = fa.index.intersection(fs.index)
            if len(common) < MIN_MATCHED:
                continue
            diff = fa[common] - fs[common]
            sync_us = float(fs[common].median())
            med = float(diff.median())
            medians.append(med)
            name = os.path.relpath(d, ROOT).rstrip("/")
            print(
                f"{name:<46} steps {len(common):>5}  sync {sync_us:>7.0f} us  async - sync "
                f"{med:>6.1f} us [{diff.quantile(0.25):6.1f}, {diff.quantile(0.75):6.1f}] "
                f"{med / sync_us:>6.1%}"
            )
    q = statistics.quantiles(medians, n=4)
    print(
        f"{len(medians)} pairs: median {statistics.median(medians):.1f} us, quartiles "
        f"{q[0]:.1f} / {q[2]:.1f}, range {min(medians):.1f}-{max(medians):.1f}"
    )


if __name__ == "__main__":
    main()
