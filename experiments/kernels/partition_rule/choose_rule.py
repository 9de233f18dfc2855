"""Choose the decode kernel's launch rule from kernel tables that timed every launch (v2).

For each table and each (requests, context) it holds, at a block table as wide as the context:
the time of the launch a rule picks against the fastest launch timed there. A rule is the
runtime's (runtime/kernels/paged_attention.py: pick_tile, pick_partition): tiles of 128 tokens up
to ``tile_max`` tokens of table, else 64; about ``target`` programs (request x kv head x
partition); partitions a power of two of at least ``min_partition`` tokens.

    python experiments/kernels/partition_rule/choose_rule.py experiments/kernels/h200 > out.md
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from cbsim.costs.decode_kernel import LaunchRule, launch_name

BUCKETS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
CONTEXTS = [256, 512, 1024, 2048, 4096, 8192, 16384]


def launch(rows: int, kv_heads: int, width: int, target: int, min_part: int, tile_max: int) -> str:
    """The launch (kernel-table name) of the rule with 128-token tiles up to ``tile_max`` tokens."""
    rule = LaunchRule(target, min_part, small_tile_from=tile_max + 1 if tile_max < 1 << 20 else 0)
    tile = rule.tile(width)
    return launch_name(tile, rule.partition(rows, kv_heads, width, tile), width)


def load(path: Path) -> tuple[pd.DataFrame, int]:
    df = pd.read_csv(path, comment="#", keep_default_na=False)
    df = df[(df.op == "decode_attention") & (df.launch != "")]
    return df, int(df.g.iloc[0])


def score(tables, target: int, min_part: int, tile_max: int) -> tuple[float, float, float, int]:
    """Geometric mean and worst of rule / best over every point, the rule's total time over the
    fastest total (every point counted at its time); points without the launch."""
    ratios, missing, spent, fastest = [], 0, 0.0, 0.0
    for df, kvh in tables:
        for (rows, ctx), grp in df.groupby(["rows", "context"]):
            if rows not in BUCKETS or ctx not in CONTEXTS:
                continue
            name = launch(rows, kvh, ctx, target, min_part, tile_max)
            got = grp[grp.launch == name].us
            if got.empty:
                missing += 1
                continue
            ratios.append(float(got.iloc[0]) / float(grp.us.min()))
            spent, fastest = spent + float(got.iloc[0]), fastest + float(grp.us.min())
    r = np.asarray(ratios)
    return float(np.exp(np.log(r).mean())), float(r.max()), spent / fastest, missing


def main(directory: str) -> None:
    paths = sorted(Path(directory).glob("*.csv"))
    tables = [load(p) for p in paths]
    print(f"tables: {', '.join(p.stem for p in paths)}; requests {BUCKETS}; contexts {CONTEXTS}\n")
    rules = []
    for target, min_part, tile_max in itertools.product(
        [128, 256, 512, 1024, 2048], [128, 256, 512, 1024], [1024, 2048, 4096, 1 << 20]
    ):
        gm, worst, total, missing = score(tables, target, min_part, tile_max)
        rules.append((max(gm, total), gm, worst, total, target, min_part, tile_max))
    rules.sort()
    print(
        "| target programs | min partition | 128-token tiles up to | rule / fastest: geo mean |"
        " worst | total time |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    now = next(r for r in rules if r[4:7] == (1024, 1024, 2048))
    for _, gm, worst, total, target, mp, tm in [*rules[:12], now]:
        tag = " (the rule until now)" if (target, mp, tm) == (1024, 1024, 2048) else ""
        tiles = tm if tm < 1 << 20 else "any"
        print(f"| {target}{tag} | {mp} | {tiles} | {gm:.3f} | {worst:.2f} | {total:.3f} |")
    best = rules[0]
    print(
        f"\nRules sorted by the larger of the two means. Per table and point, the rule until now"
        f" and the first rule ({best[4]}, {best[5]}, {best[6]}) against the fastest launch"
        " (us per layer):\n"
    )
    for path, (df, kvh) in zip(paths, tables):
        print(f"\n{path.stem} ({kvh} kv heads)\n")
        print("| requests | context | until now | best rule | fastest | fastest launch |")
        print("| --- | --- | --- | --- | --- | --- |")
        for (rows, ctx), grp in df.groupby(["rows", "context"]):
            if rows not in BUCKETS or ctx not in CONTEXTS:
                continue
            t = dict(zip(grp.launch, grp.us))
            old = t.get(launch(rows, kvh, ctx, 1024, 1024, 2048), float("nan"))
            new = t.get(launch(rows, kvh, ctx, *best[4:7]), float("nan"))
            fast = grp.loc[grp.us.idxmin()]
            print(f"| {rows} | {ctx} | {old:.1f} | {new:.1f} | {fast.us:.1f} | {fast.launch} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "experiments/kernels/h200")
