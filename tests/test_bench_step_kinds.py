"""benchmarks/bench_step_kinds.py's plumbing on a CPU (--small): the runtime's CPU emulation
gives rows per step kind for both engines and every mixed_graphs setting, and a config the
runtime refuses is a row with its message, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
BAD = "bad: mode=runtime model=tiny mode.device=cpu workload.batch_size=0"


def test_rows_per_step_kind_and_a_refusal(tmp_path):
    out = tmp_path / "kinds.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_step_kinds.py"), "--small"]
    cmd += ["--case", "tiny-online", "--case", BAD, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    rows = json.loads(out.read_text())["rows"]
    refused = [r for r in rows if r["case"] == "bad"]
    assert len(refused) == 6 and all("workload.batch_size" in r["refused"] for r in refused)
    for engine in ("sync", "async"):
        for graphs in ("off", "buckets", "full"):
            got = {
                r["kind"]: r
                for r in rows
                if (r["case"], r["engine"], r["graphs"]) == ("tiny-online", engine, graphs)
            }
            assert "decode" in got and {"mixed", "prefill"} & set(got), (engine, graphs, got)
            assert 1 <= got["decode"]["tokens_per_step"] <= 4  # one token per row, batch 4
            prompt = [got[k] for k in ("mixed", "prefill") if k in got]
            # buckets and full replay prompt steps from graphs; off runs them eagerly
            assert all((p["graphed"] > 0) == (graphs != "off") for p in prompt)
            assert all(r["floor_share"] > 0 and r["launch_ms_mean"] > 0 for r in got.values())
    assert "tok/step" in done.stdout and "refused: workload.batch_size" in done.stdout
