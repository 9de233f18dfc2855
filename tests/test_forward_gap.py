"""The device's idle between two forwards queued back to back (hardware.gpu.forward_gap_us):
a GPU-bound async run idles exactly that long between its decode forwards, a sync run's gaps
(host time) already exceed it, and zero leaves every timestamp as it was."""

from __future__ import annotations

import dataclasses

import numpy as np
from sim_harness import make, spans

from cbsim.sim.engine import run
from cbsim.trace import schema as S


def _with_gap(cfg, gap: float):
    gpu = dataclasses.replace(cfg.hardware.gpu, forward_gap_us=gap)
    cfg.hardware = dataclasses.replace(cfg.hardware, gpu=gpu)
    return cfg


def _gaps(trace) -> np.ndarray:
    f = spans(trace, S.COMPUTE).sort_values("ts")
    return f.ts.to_numpy()[1:] - f.end.to_numpy()[:-1]


def test_a_gpu_bound_async_run_idles_the_gap_between_forwards():
    # the 8B shape at batch 32: a 5 ms forward against ~0.3 ms of host work, the host ahead
    base = run(_with_gap(make("llama3_8b", batch_size=32, gen_len=64), 0.0), "async")
    gapped = run(_with_gap(make("llama3_8b", batch_size=32, gen_len=64), 1.73), "async")
    g0, g1 = _gaps(base)[8:], _gaps(gapped)[8:]  # steady decode (timestamps kept to 1 ns)
    assert np.allclose(g0, 0.0, atol=2e-3)
    assert np.allclose(g1, 1.73, atol=2e-3)


def test_a_sync_run_is_not_moved_by_a_gap_shorter_than_its_host_time():
    cfg = make("llama3_8b", engine={"name": "sync"}, batch_size=8, gen_len=32)
    base = run(_with_gap(cfg, 0.0), "sync")
    gapped = run(
        _with_gap(make("llama3_8b", engine={"name": "sync"}, batch_size=8, gen_len=32), 1.73),
        "sync",
    )
    assert base.events == gapped.events
