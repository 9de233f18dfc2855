"""Reports in a real browser: headless Chromium draws every plot, logs no error, asks no network.

Skipped when Chromium is absent (CI installs Debian's chromium; locally: apt-get install chromium).
"""

from __future__ import annotations

import pytest
from browser import Browser, available
from conftest import make_config, run_cli
from test_report import runs_of
from test_sweep import SWEEP, make_sweep

from cbsim.report import write_run_report
from cbsim.sweep import write_summary

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not available(),
        reason="needs headless Chromium at /usr/bin/chromium "
        "(apt-get install chromium; or set CBSIM_CHROMIUM)",
    ),
]
# the issue asks for < 5 s; the assertion leaves room for a loaded 2-core CI machine
OPEN_LIMIT_S = 15.0


@pytest.fixture(scope="module")
def chromium():
    with Browser() as browser:
        yield browser


def check(result, plots: int) -> None:
    assert not result.problems, result.problems
    assert result.probe["plots"] == plots, result.probe
    assert all(n > 0 for n in result.probe["traces"]), result.probe


@pytest.mark.parametrize("steps", [40, 300])  # bars, then WebGL segments
def test_compare_report_draws_without_errors(chromium, tmp_path, steps):
    path = write_run_report(
        runs_of(steps, hazards=2), make_config(["engine=compare"]), tmp_path / "report.html"
    )
    r = chromium.open(path)
    check(r, 4 if steps == 40 else 5)
    assert r.probe["svg_paths"] > 100
    if steps == 300:
        assert r.probe["gl_canvases"] > 0


def test_seed_size_report_opens_fast(chromium, tmp_path):
    path = write_run_report(
        runs_of(8192), make_config(["engine=compare"]), tmp_path / "report.html"
    )
    r = chromium.open(path)
    print(
        f"8192-step compare report ({path.stat().st_size / 1e6:.1f} MB): drawn {r.load_s:.2f} s "
        f"after navigation (plots {r.probe.get('render_ms', 0) / 1e3:.2f} s of it)"
    )
    check(r, 5)
    assert r.load_s < OPEN_LIMIT_S


# zooms the binned overview to 3 of its 2,000ths, then back out; what was drawn each time
ZOOM_JS = """
(async () => {
  const div = document.querySelector('[data-hook="timelineDetail"]');
  const axes = Object.keys(div._fullLayout).filter(k => /^xaxis\\d*$/.test(k));
  const r = div._fullLayout.xaxis.range, w = (r[1] - r[0]) / 2000, upd = {};
  axes.forEach(k => { upd[k + '.range'] = [r[0] + 1000 * w, r[0] + 1003 * w]; });
  const legend = Array.from(document.querySelectorAll('.cbtitle')).map(e => e.textContent);
  await Plotly.relayout(div, upd);
  await new Promise(res => setTimeout(res, 400));
  const zoomed = {spans: +div.dataset.detailSpans,
    bars: div.querySelectorAll('.barlayer .point').length,
    bins: div.data.filter(t => t.meta === 'bins').map(t => t.visible)};
  const out = {};
  axes.forEach(k => { out[k + '.autorange'] = true; });
  await Plotly.relayout(div, out);
  await new Promise(res => setTimeout(res, 400));
  return JSON.stringify({legend, zoomed, after: +div.dataset.detailSpans,
    bins: div.data.filter(t => t.meta === 'bins').map(t => t.visible)});
})()
"""


def test_binned_timeline_has_a_legend_and_zooms_to_real_spans(chromium, tmp_path):
    path = write_run_report(
        runs_of(1200), make_config(["engine=compare"]), tmp_path / "report.html"
    )
    r = chromium.open(path, expression=ZOOM_JS)
    assert not r.problems, r.problems
    assert any("busy" in t and "in the bin (%)" in t for t in r.probe["legend"]), r.probe
    zoomed = r.probe["zoomed"]
    assert 0 < zoomed["spans"] <= 3000 and zoomed["bars"] == zoomed["spans"], r.probe
    assert zoomed["bins"] and not any(zoomed["bins"]), r.probe  # bins give way to the spans
    assert r.probe["after"] == 0 and all(r.probe["bins"]), r.probe


def test_sweep_report_draws_without_errors(chromium, tmp_path):
    sweep = make_sweep(tmp_path / "sw", SWEEP, unfinished={5})
    r = chromium.open(write_summary(sweep).html)
    check(r, 3)


TITLES_JS = """JSON.stringify({
  colorbars: Array.from(document.querySelectorAll('.cbtitle')).map(e => e.textContent),
  ytitles: Array.from(document.querySelectorAll('text'))
    .filter(e => /^y\\d*title$/.test(e.getAttribute('class'))).map(e => e.textContent),
  scripts: Array.from(document.scripts).filter(s => s.src).map(s => s.src.split('/').pop()),
})"""


def test_sweep_report_draws_colourbars_with_units_from_a_shared_plotly(chromium, tmp_path):
    sweep = make_sweep(tmp_path / "sw", SWEEP)
    r = chromium.open(write_summary(sweep).html, expression=TITLES_JS)
    assert not r.problems, r.problems
    assert r.probe["scripts"] == ["plotly.min.js"]
    assert r.probe["colorbars"].count("speedup (x)") == 1, r.probe
    assert r.probe["colorbars"].count("GPU idle (%)") == 1, r.probe
    assert "GPU idle (%)" in r.probe["ytitles"] and "workload.gen_len" in r.probe["ytitles"]


def test_online_and_capacity_pages_draw(chromium, tmp_path):
    from test_report_serving import ONLINE

    from cbsim.api import simulate
    from cbsim.report.capacity_page import write_capacity_page

    r = simulate(*ONLINE)
    page = r.report(tmp_path / "online.html")
    check(chromium.open(page), 7)  # + the latency CDFs and the queue
    point = {"rate": 1.0, "meets_slo": True, "p99_ttft_ms": 50.0, "p99_tpot_ms": 9.0}
    result = {
        "stat": "p99",
        "slo": {"ttft": 100.0, "tpot": 10.0},
        "requests": 8,
        "answer": "capacity under p99 TTFT <= 100 ms: sync 1 req/s",
        "engines": {
            "sync": {
                "capacity_rate": 1.0,
                "band": [0.9, 1.2],
                "seed_rates": [1.0, 0.9, 1.2],
                "at_least": False,
                "curve": [point],
            }
        },
    }
    check(chromium.open(write_capacity_page(result, tmp_path / "capacity.html")), 1)


# the line over a timeline drawn from the windows a run without a trace kept
WINDOW_JS = """JSON.stringify({plots: document.querySelectorAll('.js-plotly-plot').length,
  traces: Array.from(document.querySelectorAll('.js-plotly-plot')).map(p => p._fullData.length),
  line: (document.querySelector('p.window') || {}).innerText || '',
  titles: Array.from(document.querySelectorAll('.gtitle, .annotation-text')).map(e =>
    e.textContent)})"""


def test_an_online_run_without_a_trace_draws_its_windows_and_every_step(chromium, tmp_path):
    import dataclasses

    from test_report_serving import ONLINE

    from cbsim.app import run_engines

    quiet = ["output.print_table=false", "output.progress=false", "mode.bands=false"]
    cfg = make_config([*ONLINE, "engine=compare", *quiet, "output.trace=false"])
    cfg.output.report = True
    run_engines(cfg, dataclasses.asdict(cfg), tmp_path)
    r = chromium.open(tmp_path / "report.html", expression=WINDOW_JS)
    # the time split, the windows, step time, each step's make-up, the latency CDFs, the queue
    check(r, 6)
    assert "the timeline shows windows of 6 steps" in r.probe["line"], r.probe
    for engine in ("sync", "async"):
        titles = [t for t in r.probe["titles"] if t.startswith(f"{engine} · ")]
        kinds = [t.split(" · ")[1].split(":")[0] for t in titles]
        assert kinds == ["first steps", "steady state", "end"], r.probe["titles"]


@pytest.mark.slow
def test_a_simulated_run_report_opens(chromium, tmp_path):
    args = [
        "engine=compare",
        "workload.batch_size=4",
        "workload.gen_len=16",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    res = run_cli(args, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    check(chromium.open(tmp_path / "run" / "report.html"), 4)
    # mode.bands=auto on h200 (a spread): the page that drew cleanly holds the bands table
    assert "host-speed draws" in (tmp_path / "run" / "report.html").read_text()


# at full view, then zoomed to 20 ms: what a person reads on the page and on the time axis
READ_JS = """
(async () => {
  const div = document.querySelector('[data-hook="timelineDetail"]');
  const why = (document.querySelector('p.why') || {}).innerText || '';
  const ticks = () => Array.from(div.querySelectorAll('.xtick text')).map(e => e.textContent);
  const full = ticks();
  const axes = Object.keys(div._fullLayout).filter(k => /^xaxis\\d*$/.test(k)), upd = {};
  axes.forEach(k => { upd[k + '.range'] = [5.0, 5.02]; });
  await Plotly.relayout(div, upd);
  await new Promise(res => setTimeout(res, 600));
  return JSON.stringify({why, full, zoomed: ticks(), spans: +div.dataset.detailSpans,
    short: div.data.filter(t => t.meta === 'detail' && t.type === 'scatter').length});
})()
"""


def test_a_long_run_reads_why_and_zooms_in_milliseconds_with_short_spans_visible(
    chromium, tmp_path
):
    path = write_run_report(runs_of(2700, engines=("sync",)), None, tmp_path / "report.html")
    r = chromium.open(path, expression=READ_JS)
    assert not r.problems, r.problems
    assert r.probe["why"].startswith("Why: in sync, the host works 0.90 ms a step"), r.probe
    assert not any(t.endswith(" ms") for t in r.probe["full"]), r.probe  # 11 s: in seconds
    assert r.probe["zoomed"] and all(t.endswith(" ms") for t in r.probe["zoomed"]), r.probe
    assert r.probe["spans"] > 0 and r.probe["short"] >= 2, r.probe  # copies and launches ticked
