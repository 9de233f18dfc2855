"""Append one profile's rows of some ops to committed kernel tables, with a header line saying
where they came from (the table's other rows stay as they were measured).

    python experiments/kernels/add_rows.py SRC_DIR DST_DIR --ops silu_mul_fused,kv_write_fused

For each SRC_DIR/MODEL.csv with a DST_DIR/MODEL.csv: the rows of those ops, after a "#" line
naming the source's command, hardware and date. Refuses if the destination holds them already.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbsim.rundir import atomic_write_text


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--ops", required=True)
    a = p.parse_args()
    ops = set(a.ops.split(","))
    for src in sorted(a.src.glob("*.csv")):
        dst = a.dst / src.name
        if not dst.exists():
            continue
        lines = src.read_text().splitlines()
        head = {k: ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("# ") and ":" in ln
                for k in [ln[2:].split(":", 1)[0]]}  # fmt: skip
        rows = [ln for ln in lines if ln.split(",", 1)[0] in ops]
        have = dst.read_text()
        if any(ln.split(",", 1)[0] in ops for ln in have.splitlines()):
            print(f"{dst}: already holds rows of {sorted(ops)}", file=sys.stderr)
            return 1
        note = (
            f"# rows {', '.join(sorted(ops))} added from: {head.get('command', '?')} "
            f"({head.get('hardware', '?')}; {head.get('date', '?')}; {head.get('fused', '')})"
        )
        atomic_write_text(dst, have.rstrip("\n") + "\n" + "\n".join([note, *rows]) + "\n")
        print(f"{dst}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
