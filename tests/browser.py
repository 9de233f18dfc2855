"""Open an HTML file in headless Chromium and report what happened, through the DevTools protocol.

Chromium is driven over ``--remote-debugging-pipe`` (commands on fd 3, replies on fd 4, each a JSON
message ended by a NUL byte), so nothing beyond the standard library and Debian's ``chromium`` is
needed. ``open_page`` returns the console errors, uncaught exceptions, any request that left the
machine, the time until the page said it finished drawing (``window.cbsimReady``), and the result of
a JavaScript expression evaluated then. ``Browser`` keeps one Chromium for several pages.

Usage from the command line: ``python tests/browser.py report.html [more.html ...]``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("CBSIM_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--no-default-browser-check",
    # WebGL without a GPU: SwiftShader (headless CI machines have no GPU)
    "--enable-unsafe-swiftshader",
    "--use-angle=swiftshader",
    "--window-size=1400,1000",
    "--remote-debugging-pipe",
]
# what counts as drawn: every plot div has a plotly graph with its traces
PROBE_JS = """
(() => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  return JSON.stringify({
    plots: plots.length,
    traces: plots.map(p => (p._fullData || []).length),
    svg_paths: document.querySelectorAll('.js-plotly-plot path').length,
    gl_canvases: document.querySelectorAll('.js-plotly-plot canvas').length,
    render_ms: window.cbsimRenderMs || null,
    title: document.title,
  });
})()
"""

# the page rectangle of the element a selector names, for a clipped screenshot
CLIP_JS = """(() => { const r = document.querySelector(%s).getBoundingClientRect();
  return JSON.stringify({x: r.left + scrollX, y: r.top + scrollY, width: r.width,
                         height: r.height}); })()"""


def available() -> bool:
    return Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)


@dataclass
class PageResult:
    ready: bool
    load_s: float  # navigation start until the page's plots finished drawing
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        out = [f"console: {e}" for e in self.console_errors]
        out += [f"network request: {u}" for u in self.external_requests]
        if not self.ready:
            out.append("the page never set window.cbsimReady")
        return out


class _Pipe:
    """A DevTools session over the pipe pair; events are queued for the caller."""

    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, os.fdopen(to_browser, "wb"), from_browser
        self.next_id = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                break
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self.lock:
                for m in messages:
                    msg = json.loads(m)
                    if "id" in msg:
                        self.replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self.lock.notify_all()

    def send(
        self,
        method: str,
        params: dict | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.out.write(json.dumps(msg).encode() + b"\0")
        self.out.flush()
        deadline = time.monotonic() + timeout
        with self.lock:
            while ident not in self.replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"no reply to {method}")
                self.lock.wait(min(left, 0.5))
            reply = self.replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def evaluate(self, session: str, expression: str, timeout: float = 30.0) -> Any:
        """The value of an expression; a promise is awaited (the zoom probes return one)."""
        r = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
            timeout=timeout,
        )
        return r.get("result", {}).get("value")


def _launch(profile: str) -> tuple[subprocess.Popen, int, int]:
    cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads fd 3
    res_r, res_w = os.pipe()  # Chromium writes replies on fd 4

    def child_fds() -> None:
        a, b = os.dup(cmd_r), os.dup(res_w)  # out of the way of 3 and 4 first
        os.dup2(a, 3)
        os.dup2(b, 4)
        os.set_inheritable(3, True)
        os.set_inheritable(4, True)

    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_fds,
        close_fds=False,
    )
    os.close(cmd_r)
    os.close(res_w)
    return proc, cmd_w, res_r


def _console_errors(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    errors, external = [], []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            )
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append(p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(("file:", "data:", "blob:", "about:")):
                external.append(url)
    return errors, external


class Browser:
    """One headless Chromium; each open() loads a file in a fresh tab. Use as a context manager."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="cbsim-chromium-")
        self.proc, to_browser, from_browser = _launch(self.profile)
        self.cdp = _Pipe(self.proc, to_browser, from_browser)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def open(
        self,
        path: str | os.PathLike[str],
        timeout: float = 60.0,
        settle: float = 0.3,
        expression: str = PROBE_JS,
        screenshot: str | os.PathLike[str] | None = None,
        clip: str | None = None,
    ) -> PageResult:
        """Load a file, wait for window.cbsimReady (or the timeout), collect what went wrong;
        then evaluate `expression` (awaited) and take the screenshot (of `clip` alone)."""
        cdp, url = self.cdp, Path(path).resolve().as_uri()
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        try:
            for domain in ("Runtime", "Log", "Network", "Page"):
                cdp.send(f"{domain}.enable", session=session)
            t0 = time.monotonic()
            cdp.send("Page.navigate", {"url": url}, session, timeout=timeout)
            ready = False
            while time.monotonic() - t0 < timeout:
                if cdp.evaluate(session, "window.cbsimReady === true"):
                    ready = True
                    break
                if any(e.get("method") == "Runtime.exceptionThrown" for e in self._events(session)):
                    break
                time.sleep(0.02)
            load_s = time.monotonic() - t0
            time.sleep(settle)  # let late console messages arrive
            probe = json.loads(cdp.evaluate(session, expression) or "{}")
            if screenshot:
                params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
                if clip:  # only the element the CSS selector names (e.g. one plot)
                    rect = json.loads(cdp.evaluate(session, CLIP_JS % json.dumps(clip)))
                    params["clip"] = {**rect, "scale": 1}
                shot = cdp.send("Page.captureScreenshot", params, session)
                Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
            errors, external = _console_errors(self._events(session))
            return PageResult(ready, load_s, errors, external, probe)
        finally:
            cdp.send("Target.closeTarget", {"targetId": target})

    def _events(self, session: str) -> list[dict[str, Any]]:
        with self.cdp.lock:
            return [e for e in self.cdp.events if e.get("sessionId") == session]


def open_page(path: str | os.PathLike[str], **kwargs: Any) -> PageResult:
    """Open one file in a browser of its own (see Browser.open for the arguments)."""
    with Browser() as browser:
        return browser.open(path, **kwargs)


if __name__ == "__main__":
    with Browser() as browser:
        for arg in sys.argv[1:]:
            r = browser.open(arg, screenshot=os.environ.get("CBSIM_SCREENSHOT"))
            print(f"{arg}: ready={r.ready} load {r.load_s:.2f} s {json.dumps(r.probe)}")
            for problem in r.problems:
                print("  " + problem)
