"""sweep.html: where async batching pays, over the swept settings.

The verdict, then per facet the heatmaps and line charts of cbsim.report.sweep_figures (speedup
and GPU idle over two swept keys; settings that do not fit the device marked), the pair table and
the jobs not finished. The page, like every job's report.html, uses the one plotly.min.js written
into the sweep directory.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from cbsim.report.html import Page, esc, table
from cbsim.report.sweep_figures import FITS, heatmap_figure, lines_figure, single_figure
from cbsim.report.sweep_figures import crossovers as crossovers
from cbsim.sweep.summary import (
    COMPARISON_FILE,
    FINISHED,
    SUMMARY_FILE,
    override_key,
    override_keys,
    override_value,
)
from cbsim.sweep.verdict import sweep_verdict

PREFERRED_X = ("workload.batch_size",)
PREFERRED_Y = ("workload.gen_len", "workload.prompt_len")
MAX_FACETS = 8


def _varying(comp: pd.DataFrame, keys: list[str]) -> list[str]:
    return [k for k in keys if comp[k].astype(str).nunique() > 1]


def pick_axes(comp: pd.DataFrame, keys: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(x key, y key, facet keys) among the keys that vary."""
    vary = _varying(comp, keys)
    x = next((k for k in PREFERRED_X if k in vary), vary[0] if vary else None)
    rest = [k for k in vary if k != x]
    y = next((k for k in PREFERRED_Y if k in rest), rest[0] if rest else None)
    return x, y, [k for k in rest if k != y]


def with_fit(jobs: list, comp: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The pair table with a fits_device column: False where a job of the setting reported
    that its configuration does not fit the device (metrics fits_device)."""
    bad = set()
    for job in jobs:
        m = job.metrics or {}
        fits = [m.get(FITS)] + [(m.get(e) or {}).get(FITS) for e in ("sync", "async")]
        if any(f is False for f in fits):
            ov = {override_key(o): override_value(o) for o in job.overrides}
            bad.add(tuple(str(ov.get(k)) for k in keys))
    if comp.empty:
        return comp
    rows = comp[keys].astype(str).itertuples(index=False, name=None) if keys else [()] * len(comp)
    return comp.assign(**{FITS: [r not in bad for r in rows]})


def verdict(comp: pd.DataFrame, keys: list[str], threshold: float) -> str:
    """Where async pays, in words (cbsim.sweep.verdict), over the keys that vary."""
    return sweep_verdict(comp, *pick_axes(comp, keys), threshold)


def jobs_verdict(jobs: list, comp: pd.DataFrame, threshold: float) -> str:
    """The page's lead and the terminal's last line."""
    if comp.empty:
        return (
            "No setting has both engines finished yet: sweep engine=sync,async (or "
            "engine=compare) to see where async pays."
        )
    keys = [k for k in override_keys(jobs) if k != "engine"]
    comp = with_fit(jobs, comp, keys)
    return verdict(comp, _varying(comp, keys), threshold)


NOTE = (
    "Speedup = sync time / async time for the same settings (jobs paired by every override but "
    "the engine, or one engine=compare job). GPU idle = share of the run the compute stream "
    "executed nothing. The black border between cells, and the thick segment on the threshold "
    "line between two measured settings, mark where the speedup crosses x{t:g}, the line this "
    "report calls paying (set it with hydra.callbacks.sweep_summary.min_speedup); where exactly "
    "in between was not measured. Grey cells and crossed points do not fit the device."
)
PAIR_COLUMNS = ("speedup", "gpu_idle_sync", "gpu_idle_async", "time_sync_s", "time_async_s", FITS)


def write_sweep_report(jobs: list, comp: pd.DataFrame, path: Path, threshold: float = 1.05) -> Path:
    """sweep.html beside summary.csv; plotly.min.js written once into the same directory."""
    path = Path(path)
    done = sum(j.status == FINISHED for j in jobs)
    page = Page(f"cbsim sweep · {path.parent.name}")
    page.heading(f"cbsim sweep: {done} of {len(jobs)} jobs finished", level=1)
    keys = [k for k in override_keys(jobs) if k != "engine"]
    page.para(esc(jobs_verdict(jobs, comp, threshold)), "lead")
    if not comp.empty:
        comp = with_fit(jobs, comp, keys)
        page.para(NOTE.format(t=threshold), "note")
        figures(page, comp, keys, threshold)
        page.heading("All pairs")
        if "speedup_p5" in comp:
            page.para(BAND_NOTE, "note")
        page.add(pair_table(comp, keys, threshold))
    missing = [j for j in jobs if j.status != FINISHED]
    if missing:
        page.heading(f"Not finished: {len(missing)}")
        page.para(
            "Run the same command again with hydra.sweep.dir set to this directory: "
            "finished jobs are skipped, these are run.",
            "note",
        )
        page.add(
            table(
                ["job", "status", "overrides"],
                [[j.num, j.status, " ".join(j.overrides)] for j in missing],
            )
        )
    reports = sum((path.parent / str(j.num) / "report.html").is_file() for j in jobs)
    page.para(
        f"Every job's overrides and metrics: <code>{SUMMARY_FILE}</code>; the pairs: "
        f"<code>{COMPARISON_FILE}</code>"
        + (f"; {reports} jobs' report.html in their directories." if reports else "."),
        "note",
    )
    return page.write(path, js_dir=path.parent)


def figures(page: Page, comp: pd.DataFrame, keys: list[str], threshold: float) -> None:
    """Heatmap and line charts per facet (a value of the swept keys beyond the two axes)."""
    x, y, facets = pick_axes(comp, keys)
    groups = list(comp.groupby(facets, sort=True)) if facets else [((), comp)]
    for values, g in groups[:MAX_FACETS]:
        values = values if isinstance(values, tuple) else (values,)
        if facets:
            page.heading(", ".join(f"{k}={v}" for k, v in zip(facets, values)), level=3)
        if x is None:
            page.figure(single_figure(g, threshold), "speedup")
            continue
        page.figure(heatmap_figure(g, x, y, threshold), "heatmap")
        page.figure(lines_figure(g, x, y, threshold), "lines")
        if y is not None:
            page.figure(lines_figure(g, y, x, threshold), "lines_y")
    if len(groups) > MAX_FACETS:
        page.para(
            f"{len(groups) - MAX_FACETS} more groups of {', '.join(facets)} are in "
            f"{COMPARISON_FILE}.",
            "note",
        )


BAND_NOTE = (
    "P5-P95: the band of the setting over the profile's measured spread of host speed and of the "
    "forward model's error, widened by the model's error on held-out runs where the profile "
    "carries one (mode.bands=true, cbsim.bands; '-' where the setting drew none); the medians are "
    "in comparison.csv."
)
# the pair table's band columns (comparison.csv's <stem>_p5 / _p95, cbsim.sweep.summary)
BAND_STEMS = ("speedup", "gpu_idle_sync", "gpu_idle_async")


def pair_table(comp: pd.DataFrame, keys: list[str], threshold: float) -> str:
    """One row per setting; with bands (mode.bands=true), each band's P5-P95 beside its value."""
    cols = [c for c in (*keys, *PAIR_COLUMNS) if c in comp]
    stems = [s for s in BAND_STEMS if f"{s}_p5" in comp]
    records = comp.sort_values(keys).to_dict("records") if keys else comp.to_dict("records")
    rows = [[_cell(c, r[c]) for c in cols] + [_band_cell(s, r) for s in stems] for r in records]
    classes = [
        [("good" if r["speedup"] >= threshold else "bad") if c == "speedup" else "" for c in cols]
        + [""] * len(stems)
        for r in records
    ]
    return table(cols + [f"{s} P5-P95" for s in stems], rows, classes)


def _band_cell(stem: str, record: dict[str, Any]) -> str:
    low, high = record.get(f"{stem}_p5"), record.get(f"{stem}_p95")
    if (
        low is None
        or high is None
        or any(isinstance(v, float) and math.isnan(v) for v in (low, high))
    ):
        return "-"
    return f"{_cell(stem, low)} to {_cell(stem, high)}"


def _cell(col: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if col == "speedup":
        return f"x{value:.3f}"
    if col.startswith("gpu_idle"):
        return f"{value:.2%}"
    if col.startswith("time"):
        return f"{value:.3f}"
    if col == FITS:
        return "yes" if value else "no"
    return str(value)
