"""An offline HTML page: figures as embedded JSON, plotly.js inline or one shared file beside it.

Every figure is a <div class="cbsim-plot"> followed by its JSON in a <script type="application/json">;
one script at the end draws them all, runs each figure's hook (the timeline's zoom detail), then sets
``window.cbsimReady = true`` (the browser test waits for it; a failure is logged to the console,
which the test treats as an error). plotly.js is 4.8 MB: a page drawn alone carries it inline, the
pages of a sweep or a report directory reference one ``plotly.min.js`` written once beside them
(``write_plotly_js``), so nothing is fetched from the network either way.
"""

from __future__ import annotations

import html
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from cbsim.rundir import atomic_write_text

PLOTLY_FILE = "plotly.min.js"

PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "scrollZoom": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d"],
}

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1400px; padding: 0 24px 40px; color: #222; }
h1 { font-size: 1.5em; margin: 18px 0 4px; } h2 { font-size: 1.15em; margin: 26px 0 6px; }
p.lead { font-size: 1.05em; margin: 4px 0 10px; }
.note { color: #555; font-size: 0.9em; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
table { border-collapse: collapse; font-size: 0.88em; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f4f4f4; }
table.kv td:last-child { text-align: left; }
td.bad, b.bad { color: #b00; font-weight: 600; } td.good { color: #176317; font-weight: 600; }
code { background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
.cbsim-plot { width: 100%; }
"""

RENDER_JS = """
(function () {
  const plots = Array.from(document.querySelectorAll('.cbsim-plot'));
  const config = %s;
  const t0 = performance.now();
  const hooks = window.cbsimHooks || {};
  Promise.all(plots.map(function (div) {
    const fig = JSON.parse(document.getElementById(div.id + '-data').textContent);
    return Plotly.newPlot(div, fig.data, fig.layout, config).then(function () {
      const hook = hooks[div.dataset.hook];
      if (hook) { return hook(div); }
    });
  })).then(function () {
    window.cbsimRenderMs = performance.now() - t0;
    window.cbsimReady = true;
    document.body.setAttribute('data-ready', '1');
  }).catch(function (err) { console.error('cbsim report: a plot failed to draw: ' + err); });
})();
"""


@lru_cache(maxsize=1)
def plotly_js() -> str:
    return get_plotlyjs()


def write_plotly_js(directory: str | os.PathLike[str]) -> Path:
    """plotly.min.js in a directory, written once (again only when plotly's version changed)."""
    path = Path(directory) / PLOTLY_FILE
    js = plotly_js()
    if not (path.is_file() and path.stat().st_size == len(js.encode())):
        atomic_write_text(path, js)
    return path


def plotly_src(page: str | os.PathLike[str], js: str | os.PathLike[str]) -> str:
    """The relative URL a page at `page` uses for the shared plotly.js at `js`."""
    rel = os.path.relpath(Path(js).resolve(), Path(page).resolve().parent)
    return Path(rel).as_posix()


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


class Page:
    """Collects sections and figures, then renders one HTML document."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.scripts: list[str] = []  # page scripts run before the figures are drawn
        self._n = 0

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def heading(self, text: str, level: int = 2, anchor: str = "") -> None:
        ident = f' id="{esc(anchor)}"' if anchor else ""
        self.parts.append(f"<h{level}{ident}>{esc(text)}</h{level}>")

    def para(self, markup: str, cls: str = "") -> None:
        self.parts.append(f'<p class="{cls}">{markup}</p>' if cls else f"<p>{markup}</p>")

    def figure(self, fig: go.Figure, name: str, hook: str = "", extra: Any = None) -> None:
        """A plot; `hook` names a window.cbsimHooks function run on the drawn div, which
        finds `extra` (JSON) in the element with id ``<div id>-extra``."""
        self._n += 1
        ident = f"fig-{self._n}-{name}"
        fig.update_layout(template="plotly_white", font=dict(size=12))
        data = _json_script(pio.to_json(fig, validate=False, engine="json"))
        attr = f' data-hook="{esc(hook)}"' if hook else ""
        self.parts.append(
            f'<div class="cbsim-plot" id="{ident}"{attr}></div>\n'
            f'<script type="application/json" id="{ident}-data">{data}</script>'
        )
        if extra is not None:
            payload = _json_script(json.dumps(extra, separators=(",", ":")))
            self.parts.append(
                f'<script type="application/json" id="{ident}-extra">{payload}</script>'
            )

    def script(self, js: str) -> None:
        """Page JavaScript (e.g. a figure hook), added once however many figures use it."""
        if js not in self.scripts:
            self.scripts.append(js)

    def render(self, plotly: str | None = None) -> str:
        """The document; plotly=None inlines plotly.js, else it is the script's relative URL."""
        body = "\n".join(self.parts)
        js = RENDER_JS % json.dumps(PLOTLY_CONFIG) if self._n else ""
        lib = (
            f"<script>{plotly_js()}</script>"
            if plotly is None
            else f'<script src="{esc(plotly)}"></script>'
        )
        hooks = "".join(f"<script>{s}</script>\n" for s in self.scripts)
        return (
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{esc(self.title)}</title>\n<style>{CSS}</style>\n"
            f"{lib}\n</head>\n<body>\n{body}\n{hooks}"
            f"<script>{js}</script>\n</body>\n</html>\n"
        )

    def write(
        self, path: str | os.PathLike[str], js_dir: str | os.PathLike[str] | None = None
    ) -> Path:
        """Write the page atomically; with js_dir the page references plotly.min.js there
        (written once) instead of inlining plotly.js."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        src = None if js_dir is None else plotly_src(path, write_plotly_js(js_dir))
        return atomic_write_text(path, self.render(src))


def _json_script(text: str) -> str:
    """JSON safe inside a <script> element."""
    return text.replace("</", "<\\/")


def table(
    header: list[str],
    rows: list[list[Any]],
    classes: list[list[str]] | None = None,
    kind: str = "",
) -> str:
    """An HTML table; cells are escaped, classes (same shape as rows) style single cells;
    kind "kv" left-aligns the value column of a key/value table."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, cell in enumerate(row):
            cls = classes[i][j] if classes and classes[i][j] else ""
            attr = f' class="{cls}"' if cls else ""
            cells.append(f"<td{attr}>{esc(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cls = f' class="{esc(kind)}"' if kind else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
