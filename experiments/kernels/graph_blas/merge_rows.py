"""Add the decode graphs' cuBLASLt GEMM rows and the two-stage argmax's rows to the committed
kernel tables, and print how this machine's kernels compare.

    python experiments/kernels/graph_blas/merge_rows.py [--write]

The rows come from two profiles (`experiments/perf/graph_blas_call.sh`, README.md): ``linear/``,
the GEMMs as the runtime calls them (nn.Linear's F.linear; o and down ``addmm_`` into the
residual) on cuBLAS and, at the graphs' rows, cuBLASLt; ``mm/``, the elementwise rows
(argmax_split) and GEMMs through torch.mm into a given output, where cuBLASLt picks slower kernels
for qkv and gate_up than it does in the model (diag_graph_blas.json) - kept to show it, not
merged. Only rows the committed tables lack are added (gemm rows named ``cublaslt``, op
``argmax_split``); the tables' own rows, from the machine that profiled them, stay. A row is
added at the tables' machine's speed: its time here times the median, over the rows both timed,
of the table's time over this machine's for the same kernel on the table's library (cuBLAS for a
GEMM shape, torch's argmax for argmax_split), so what the library or the kernel changes is what
was measured side by side here.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLES = HERE.parents[0] / "h200"
MODELS = ("llama3_1b", "llama3_3b", "llama3_8b")
ADDED = (
    "gemm cublaslt rows (experiments/kernels/graph_blas/linear, 06:10 UTC) and argmax_split "
    "rows (graph_blas/mm, 05:42 UTC), another machine's, at this table's machine's speed "
    "(merge_rows.py)"
)


def rows(path: Path) -> tuple[list[str], list[dict]]:
    text = path.read_text().splitlines()
    head = [ln for ln in text if ln.startswith("#")]
    return head, list(csv.DictReader(ln for ln in text if ln and not ln.startswith("#")))


def key(r: dict) -> tuple:
    return r["op"], int(r["n"]), int(r["k"]), int(r["rows"]), r.get("launch") or ""


def new_rows(fresh: list[dict]) -> list[dict]:
    return [
        r
        for r in fresh
        if (r["op"] == "gemm" and r["launch"] == "cublaslt") or r["op"] == "argmax_split"
    ]


def machine_ratio(table: list[dict], fresh: list[dict], op: str, n: int, k: int) -> list[float]:
    """The table's time over this machine's, per row count both timed, of (op, n, k) on the
    table's own library (no launch)."""
    old = {key(r): float(r["us"]) for r in table}
    return [
        old[key(r)] / float(r["us"])
        for r in fresh
        if (r["op"], int(r["n"]), int(r["k"])) == (op, n, k) and not r["launch"] and key(r) in old
    ]


def compare(model: str, table: list[dict], fresh: list[dict]) -> dict[tuple, float]:
    """Prints the ratios; returns the machine ratio per (op, n, k) of the rows to add."""
    mine = {key(r): float(r["us"]) for r in fresh}
    shapes = sorted({(int(r["n"]), int(r["k"])) for r in fresh if r["op"] == "gemm"})
    print(
        f"\n{model}: GEMM (N, K) | the table's cuBLAS / this machine's (median, min-max) | "
        "cuBLASLt / cuBLAS here, graph rows (median, min-max)"
    )
    scale: dict[tuple, float] = {}
    for n, k in shapes:
        a = machine_ratio(table, fresh, "gemm", n, k)
        b = [
            us / mine[("gemm", n2, k2, m, "")]
            for (op, n2, k2, m, launch), us in mine.items()
            if (op, n2, k2, launch) == ("gemm", n, k, "cublaslt")
            and ("gemm", n2, k2, m, "") in mine
        ]
        scale[("gemm", n, k)] = statistics.median(a)
        print(
            f"  {(n, k)!s:16} {statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f})"
            f" | {statistics.median(b):.3f} ({min(b):.3f}-{max(b):.3f})"
        )
    vocab = next(int(r["n"]) for r in fresh if r["op"] == "argmax")
    a = machine_ratio(table, fresh, "argmax", vocab, 0)
    scale[("argmax_split", vocab, 0)] = statistics.median(a)
    print(f"  argmax {vocab}: the table's / this machine's {statistics.median(a):.3f}")
    return scale


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="add the rows to the committed tables")
    args = ap.parse_args(argv)
    for model in MODELS:
        target = TABLES / f"{model}.csv"
        head, table = rows(target)
        _, gemms = rows(HERE / "linear" / f"{model}.csv")
        _, other = rows(HERE / "mm" / f"{model}.csv")
        fresh = gemms + [r for r in other if r["op"] != "gemm"]
        scale = compare(model, table, fresh)
        have = {key(r) for r in table}
        add = [r for r in new_rows(fresh) if key(r) not in have]
        for r in add:
            r["us"] = f"{float(r['us']) * scale[(r['op'], int(r['n']), int(r['k']))]:.4g}"
        print(f"  {len(add)} rows to add")
        if args.write and add:
            lines = target.read_text().splitlines()
            at = max(i for i, ln in enumerate(lines) if ln.startswith("#")) + 1
            lines.insert(at, f"# added: {ADDED}")
            cols = lines[at + 1].split(",")
            lines += [",".join(str(r.get(c) or "") for c in cols) for r in add]
            target.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
