"""Helpers of the simulator's tests: configs built from the dataclasses (``make``), and
``check_trace``, everything that must hold of any simulated trace."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import strategies as st

from cbsim.config.schema import CbsimConfig, EngineConfig, ModelConfig, WorkloadConfig
from cbsim.metrics import compute_metrics
from cbsim.trace import schema as S
from cbsim.trace import validate
from cbsim.workload import make_requests

TINY = ModelConfig(
    name="tiny",
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=4096,
    dtype="float32",
)
MODELS = {
    "tiny": TINY,
    "llama3_1b": ModelConfig(
        name="llama3_1b",
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
    ),
    "llama3_8b": ModelConfig(),
}


def make(model: str = "llama3_1b", engine: dict | None = None, **workload) -> CbsimConfig:
    """A config built from the dataclasses (no Hydra: fast enough for property tests)."""
    eng = {"name": "async", **(engine or {})}
    if eng["name"] == "sync":
        eng.setdefault("io_slots", 1)
        eng.setdefault("carry_over", False)
    wl = {"batch_size": 4, "prompt_len": 32, "gen_len": 16, **workload}
    return CbsimConfig(
        model=MODELS[model], engine=EngineConfig(**eng), workload=WorkloadConfig(**wl)
    )


def spans(trace, lane=None, name=None):
    df = trace.spans
    if lane is not None:
        df = df[df.lane == lane]
    if name is not None:
        df = df[df.name.isin([name] if isinstance(name, str) else name)]
    return df


def step_times(trace) -> np.ndarray:
    """Per step, as the metrics define it: between consecutive forward ends."""
    fwd = trace.spans[trace.spans.name.isin(S.FORWARD_NAMES)]
    ends = np.sort(fwd.groupby("step")["end"].max().to_numpy())
    return np.diff(np.concatenate([[0.0], ends]))


def check_trace(trace, cfg: CbsimConfig, ordered: bool = True) -> dict:
    """Everything that must hold of any simulated trace; returns its metrics."""
    validate(json.loads(json.dumps(trace.to_json_obj())))  # also: no overlap on a stream lane
    c = trace.other_data["sim_counters"]
    m = compute_metrics(trace)
    sp = trace.spans
    # every stream lane executes one op at a time
    for lane in S.STREAM_LANES:
        lane_sp = sp[sp.lane == lane].sort_values("ts")
        assert (lane_sp.ts.to_numpy()[1:] >= lane_sp.end.to_numpy()[:-1] - 0.002).all(), lane
    if ordered:  # events order H2D -> compute -> D2H within every step
        gpu = sp[sp.cat == "gpu"]
        h2d_end = gpu[gpu.name == S.COPY_H2D].groupby("step").end.max()
        d2h_ts = gpu[gpu.name == S.COPY_D2H].groupby("step").ts.min()
        comp = gpu[gpu.name.isin([*S.FORWARD_NAMES, S.CARRY_OVER])].groupby("step")
        comp_ts, comp_end = comp.ts.min(), comp.end.max()
        assert (comp_ts >= h2d_end.reindex(comp_ts.index) - 0.002).all()
        assert (d2h_ts.reindex(comp_end.index) >= comp_end - 0.002).all()
    # every request receives exactly its tokens
    reqs = make_requests(cfg.workload, cfg.model.vocab_size)
    inst = trace.instants
    fin = inst[inst.name == S.FINISH].set_index("rid")
    assert sorted(fin.index) == [r.rid for r in reqs]
    assert all(fin.at[r.rid, "tokens"] == r.max_new_tokens for r in reqs)
    want = sum(r.max_new_tokens for r in reqs)
    # metrics from the trace agree with the simulator's own counters
    assert m["steps"] == c["steps"]
    assert m["generated_tokens"] == c["generated_tokens"] == want
    assert m["requests_finished"] == c["requests_finished"] == len(reqs)
    # times are rounded to the nanosecond in the trace: allow that much per span
    ns = 0.001 * (len(sp) + 1)
    assert m["total_time_s"] * 1e6 == pytest.approx(c["total_us"], abs=ns)
    busy_us = (1.0 - m["gpu_idle_fraction"]) * m["total_time_s"] * 1e6
    assert busy_us == pytest.approx(c["gpu_busy_us"], abs=ns)
    assert m["cpu_blocks_per_step"] == pytest.approx(c["host_blocks_per_step"])
    blocked_us = m["cpu_blocked_fraction"] * m["total_time_s"] * 1e6
    assert blocked_us == pytest.approx(c["host_blocked_us"], abs=ns)
    assert m["hazards"] == c["hazards"]
    assert m["hazards_by_kind"] == c["hazards_by_kind"]
    return m


@st.composite
def long_workloads(draw):
    """Workloads with decode stretches long enough to fast-forward, and everything that breaks
    them: arrivals, EOS, a tight KV cache, chunked prefill, finishing requests."""
    batch = draw(st.integers(1, 8))
    wl = {
        "batch_size": batch,
        "num_requests": draw(st.integers(1, 12)),
        "prompt_len": draw(st.integers(1, 120)),
        "prompt_dist": draw(st.sampled_from(["fixed", "uniform"])),
        "prompt_spread": 0.4,
        "gen_len": draw(st.integers(8, 160)),
        "gen_dist": draw(st.sampled_from(["fixed", "uniform", "lognormal"])),
        "gen_spread": 0.5,
        "arrival": draw(st.sampled_from(["offline", "poisson"])),
        "rate": draw(st.sampled_from([5.0, 50.0, 500.0])),
        "max_batch_tokens": max(batch, draw(st.sampled_from([16, 64, 512]))),
        "chunked_prefill": True,
        "kv_block_size": draw(st.sampled_from([4, 16])),
        "seed": draw(st.integers(0, 1000)),
        "ignore_eos": draw(st.booleans()),
    }
    if wl["gen_dist"] != "lognormal" and draw(st.booleans()):  # preemption by recompute
        longest = 2 * (int(wl["prompt_len"] * 1.4) + int(wl["gen_len"] * 1.5)) + 8
        wl["kv_num_blocks"] = -(-longest // wl["kv_block_size"]) + draw(st.integers(0, 6))
    return wl
