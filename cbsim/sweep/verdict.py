"""A sweep's verdict in words: where async pays, as the boundary a reader would state it.

"Async pays ≥ 5% at batch_size ≥ 32 when gen_len ≥ 1024, and at batch_size ≥ 128 when
gen_len = 256": for each value of the second swept key, the values of the first where the speedup
reaches the threshold, as a range; values of the second key with the same range are said together.
Keys beyond two are facets, one clause each.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from cbsim.report.sweep_figures import FITS, numeric, order

MAX_FACETS = 8


def threshold_words(threshold: float) -> str:
    gain = round((threshold - 1) * 100, 6)
    return f"≥ {gain:g}%" if gain > 0 else f"(speedup ≥ x{threshold:g})"


def range_words(key: str, every: list[Any], chosen: list[Any]) -> str:
    """``chosen`` (a subset of the sorted ``every``) as a reader says it: ``gen_len ≥ 1024``,
    ``batch_size ≤ 8``, ``8 ≤ batch_size ≤ 64``, ``gen_len = 256``, or a list."""
    name = key.split(".")[-1]
    idx = [every.index(v) for v in chosen]
    if len(chosen) == len(every):
        return f"every {name}"
    if numeric(every) and idx == list(range(idx[0], idx[-1] + 1)):
        if idx[-1] == len(every) - 1:
            return f"{name} ≥ {chosen[0]}"
        if idx[0] == 0:
            return f"{name} ≤ {chosen[-1]}"
        if len(chosen) > 1:
            return f"{chosen[0]} ≤ {name} ≤ {chosen[-1]}"
    if len(chosen) == 1:
        return f"{name} = {chosen[0]}"
    return f"{name} in {', '.join(map(str, chosen))}"


def boundary(comp: pd.DataFrame, x: str | None, y: str | None, threshold: float) -> str | None:
    """Where async pays over (x, y), in words; None where it pays nowhere."""
    pays = comp["speedup"].astype(float) >= threshold
    if not pays.any():
        return None
    if x is None or pays.all():
        return "at every setting"
    if y is None:
        return "at " + range_words(x, order(comp[x]), order(comp[x][pays]))
    ys = order(comp[y])
    by_range: dict[str, list[Any]] = {}
    for yv in ys:
        rows = comp[comp[y] == yv]
        good = rows[rows["speedup"].astype(float) >= threshold]
        if len(good):
            by_range.setdefault(range_words(x, order(rows[x]), order(good[x])), []).append(yv)
    clauses = []
    for words, y_values in by_range.items():
        where = "" if len(y_values) == len(ys) else f" when {range_words(y, ys, y_values)}"
        clauses.append(f"at {words}{where}")
    return ", and ".join(clauses)


def sweep_verdict(
    comp: pd.DataFrame, x: str | None, y: str | None, facets: list[str], threshold: float
) -> str:
    """One paragraph: where async pays (per facet), the speedups seen, and the settings that do
    not fit the device."""
    speed = comp["speedup"].astype(float)
    groups = list(comp.groupby(facets, sort=True)) if facets else [((), comp)]
    parts = []
    for values, g in groups[:MAX_FACETS]:
        values = values if isinstance(values, tuple) else (values,)
        where = boundary(g, x, y, threshold)
        if where:
            said = f"pays {threshold_words(threshold)} {where}"
        else:
            said = f"does not pay {threshold_words(threshold)} at any setting"
        facet = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(facets, values))
        parts.append(f"{said} with {facet}" if facet else said)
    text = "Async " + "; ".join(parts)
    if len(groups) > MAX_FACETS:
        text += f"; {len(groups) - MAX_FACETS} more groups in comparison.csv"
    if f"{speed.min():.3f}" == f"{speed.max():.3f}":
        text += f" (speedup x{speed.iloc[0]:.3f}" + (
            f" at all {len(comp)} settings)." if len(comp) > 1 else ")."
        )
    else:
        text += f" (speedup x{speed.min():.3f} to x{speed.max():.3f} over {len(comp)} settings)."
    if "speedup_p5" in comp and comp["speedup_p5"].notna().any():
        low, high = comp["speedup_p5"].astype(float), comp["speedup_p95"].astype(float)
        unsure = int(((low < threshold) & (high >= threshold)).sum())
        if unsure:
            text += f" At {unsure} of them the P5-P95 band spans the threshold."
    if FITS in comp and not comp[FITS].all():
        n = int((~comp[FITS].astype(bool)).sum())
        text += f" {n} setting{' does' if n == 1 else 's do'} not fit the device (greyed out)."
    return text
