"""benchmarks/bench_continuation.py's plumbing on a CPU (--small): a continuation chunk through
the masked path and as decode rows gives the same attention, at each length and context."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]


def test_both_routes_of_a_continuation_agree(tmp_path):
    out = tmp_path / "cont.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_continuation.py"), "--small"]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["q"], r["ctx"]) for r in rows} == {(4, 64), (16, 64), (4, 256), (16, 256)}
    assert all(r["diff"] < 1e-4 for r in rows), rows
    assert "rows/masked" in done.stdout
