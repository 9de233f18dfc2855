"""Real spans on zoom: the binned overview carries every span, compactly, and draws the ones in
the visible window as bars once the window holds few enough of them.

The payload is per run and per (lane, phase): start and duration in integer ticks of 0.1 µs, the
starts and step numbers delta-encoded (a JSON array of small integers is about 4 bytes a span),
decoded once in the browser. The hook (TIMELINE_JS) listens to the overview's relayout: above
DETAIL_BUDGET spans in view it shows the bins, at or below it hides them and draws the spans.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cbsim.report.frames import IDLE_ROW, RunFrames
from cbsim.report.style import color_of, row_y
from cbsim.report.visible import NOT_BUSY, SHORT_SHARE, TICK_PX, bar_width

DETAIL_BUDGET = 3_000  # spans drawn as SVG bars at once: fast in software rendering too
TICKS_PER_MS = 1e4  # 0.1 µs


def _deltas(values: np.ndarray) -> list[int]:
    v = np.asarray(values, dtype=np.int64)
    return np.diff(np.concatenate([[0], v])).tolist() if len(v) else []


def _group(name: str, y: int, ts_ms, end_ms, step, unit: float) -> dict[str, Any]:
    order = np.argsort(ts_ms, kind="stable")
    t = np.rint(np.asarray(ts_ms, float)[order] * TICKS_PER_MS)
    d = np.maximum(np.rint(np.asarray(end_ms, float)[order] * TICKS_PER_MS) - t, 0)
    out: dict[str, Any] = {
        "name": name,
        "y": y,
        "color": color_of(name),
        "width": bar_width(name),
        "tick": name not in NOT_BUSY,
        "q": TICKS_PER_MS * unit,  # ticks per axis unit
        "ts": _deltas(t),
        "dur": d.astype(np.int64).tolist(),
    }
    if step is not None:
        out["step"] = _deltas(np.asarray(step)[order])
    return out


def zoom_payload(runs: list[RunFrames], unit: float, unit_name: str) -> dict[str, Any]:
    """Everything the hook needs: every span of every run, by subplot axis."""
    out = []
    for i, run in enumerate(runs, start=1):
        ys = row_y(run.rows)
        groups = [
            _group(str(name), ys[lane], g["ts_ms"], g["end_ms"], g["step"], unit)
            for (lane, name), g in run.spans.groupby(["lane", "name"], sort=False)
            if lane in ys
        ]
        if IDLE_ROW in ys and len(run.idle):
            groups.append(
                _group(IDLE_ROW, ys[IDLE_ROW], run.idle["ts_ms"], run.idle["end_ms"], None, unit)
            )
        suffix = "" if i == 1 else str(i)
        out.append(
            {"engine": run.engine, "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", "groups": groups}
        )
    return {
        "unit": unit_name,
        "budget": DETAIL_BUDGET,
        "short": SHORT_SHARE,
        "tick_px": TICK_PX,
        "runs": out,
    }


TIMELINE_JS = r"""
window.cbsimHooks = window.cbsimHooks || {};
window.cbsimHooks.timelineDetail = function (div) {
  const payload = JSON.parse(document.getElementById(div.id + '-extra').textContent);
  payload.runs.forEach(function (run) {
    run.groups.forEach(function (g) {
      const n = g.ts.length, t0 = new Float64Array(n), t1 = new Float64Array(n);
      const st = new Int32Array(n);
      let t = 0, s = 0, longest = 0;
      for (let i = 0; i < n; i++) {
        t += g.ts[i]; t0[i] = t / g.q; t1[i] = (t + g.dur[i]) / g.q;
        longest = Math.max(longest, g.dur[i] / g.q);
        if (g.step) { s += g.step[i]; st[i] = s; }
      }
      g.t0 = t0; g.t1 = t1; g.st = g.step ? st : null; g.longest = longest;
    });
  });
  function first(arr, x) {  // first index with arr[i] >= x
    let lo = 0, hi = arr.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < x) { lo = m + 1; } else { hi = m; } }
    return lo;
  }
  function visible(x0, x1) {
    const picks = []; let total = 0;
    payload.runs.forEach(function (run) {
      run.groups.forEach(function (g) {
        const idx = [];
        for (let i = first(g.t0, x0 - g.longest), n = first(g.t0, x1); i < n; i++) {
          if (g.t1[i] >= x0) { idx.push(i); }
        }
        total += idx.length;
        if (idx.length) { picks.push([run, g, idx]); }
      });
    });
    return [total, picks];
  }
  function ticks(run, g, idx, x0, x1) {  // spans too short to see in [x0, x1]: a fixed-size tick
    const u = payload.unit, scale = u === 's' ? 1e6 : 1e3, min = (x1 - x0) * payload.short;
    const short = g.tick ? idx.filter(function (i) { return g.t1[i] - g.t0[i] < min; }) : [];
    if (!short.length) { return []; }
    return [{
      type: 'scatter', mode: 'markers', meta: 'detail', showlegend: false,
      xaxis: run.xaxis, yaxis: run.yaxis,
      x: short.map(function (i) { return (g.t0[i] + g.t1[i]) / 2; }),
      y: short.map(function () { return g.y; }),
      customdata: short.map(function (i) { return ((g.t1[i] - g.t0[i]) * scale).toFixed(1); }),
      marker: {symbol: 'line-ns', size: payload.tick_px, line: {width: 2, color: g.color}},
      hovertemplate: '<b>' + g.name + '</b> %{customdata} µs<extra>' + run.engine + '</extra>',
    }];
  }
  function bars(run, g, idx) {
    const u = payload.unit, scale = u === 's' ? 1e6 : 1e3;
    return {
      type: 'bar', orientation: 'h', meta: 'detail', showlegend: false,
      xaxis: run.xaxis, yaxis: run.yaxis, width: g.width, marker: {color: g.color},
      base: idx.map(function (i) { return g.t0[i]; }),
      x: idx.map(function (i) { return g.t1[i] - g.t0[i]; }),
      y: idx.map(function () { return g.y; }),
      customdata: idx.map(function (i) {
        return [g.st ? g.st[i] : '', ((g.t1[i] - g.t0[i]) * scale).toFixed(1)];
      }),
      hovertemplate: '<b>' + g.name + '</b> %{customdata[1]} µs<br>' +
        (g.st ? 'step %{customdata[0]}<br>' : '') + 'starts at %{base:.6g} ' + u +
        '<extra>' + run.engine + '</extra>',
    };
  }
  let busy = false, again = false;
  function update() {
    if (busy) { again = true; return; }
    const r = div._fullLayout.xaxis.range, x0 = +r[0], x1 = +r[1];
    const [total, picks] = visible(x0, x1);
    const show = total > 0 && total <= payload.budget;
    const old = [];
    div.data.forEach(function (t, i) { if (t.meta === 'detail') { old.push(i); } });
    busy = true;
    let p = old.length ? Plotly.deleteTraces(div, old) : Promise.resolve();
    p = p.then(function () {
      const now = [];
      div.data.forEach(function (t, i) { if (t.meta === 'bins') { now.push(i); } });
      return Plotly.restyle(div, {visible: !show}, now);
    });
    if (show) {
      p = p.then(function () {
        const traces = [];
        picks.forEach(function (k) {
          traces.push(bars(k[0], k[1], k[2]));
          ticks(k[0], k[1], k[2], x0, x1).forEach(function (t) { traces.push(t); });
        });
        return Plotly.addTraces(div, traces);
      });
    }
    return p.then(function () {
      div.dataset.detailSpans = String(show ? total : 0);
      busy = false;
      if (again) { again = false; return update(); }
    });
  }
  div.dataset.detailSpans = '0';
  div.on('plotly_relayout', function (ev) {
    if (Object.keys(ev).some(function (k) { return /^xaxis\d*\.(range|autorange)/.test(k); })) {
      update();
    }
  });
  if (payload.unit === 's') { window.cbsimHooks.msAxis(div); }
};
// an axis in seconds labels its ticks in ms once under MS_BELOW_S seconds are in view
window.cbsimHooks.msAxis = function (div) {
  const MS_BELOW_S = 2;
  function nice(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    return [1, 2, 5, 10].map(function (m) { return m * p; }).find(function (s) { return s >= raw; });
  }
  function relabel() {
    const lay = div._fullLayout, upd = {};
    Object.keys(lay).filter(function (k) { return /^xaxis\d*$/.test(k); }).forEach(function (k) {
      const r = lay[k].range, a = +r[0] * 1e3, b = +r[1] * 1e3;
      if ((b - a) / 1e3 >= MS_BELOW_S) { upd[k + '.tickmode'] = 'auto'; return; }
      const step = nice((b - a) / 6), vals = [], text = [];
      for (let t = Math.ceil(a / step) * step; t <= b; t += step) {
        vals.push(t / 1e3);
        text.push(t.toLocaleString('en-US', {maximumFractionDigits: 3}) + ' ms');
      }
      upd[k + '.tickmode'] = 'array'; upd[k + '.tickvals'] = vals; upd[k + '.ticktext'] = text;
    });
    div.dataset.msTicks = String(Object.values(upd).filter(function (v) {
      return v === 'array'; }).length);
    return Plotly.relayout(div, upd);
  }
  div.on('plotly_relayout', function (ev) {
    if (Object.keys(ev).some(function (k) { return /^xaxis\d*\.(range|autorange)/.test(k); })) {
      relabel();
    }
  });
};
"""
