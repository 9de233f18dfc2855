"""Perfetto-native traces: flows along the event waits, a slice per request, a merged trace of
sync and async as two named processes; all round-trip through the reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_nests
from synthetic_trace import loop_trace

from cbsim.metrics import compute_metrics
from cbsim.trace import (
    TraceBuilder,
    TraceError,
    merge_traces,
    read_trace,
    read_traces,
    split_merged,
    write_merged_trace,
    write_trace,
)
from cbsim.trace import schema as S
from cbsim.trace.checks import badly_nested
from cbsim.trace.perfetto import FLOW_CAT, REQUEST_SLICE_CAT, with_derived


def _enclosing(trace, e):
    """The span on e's thread that holds e's ts."""
    return [
        x
        for x in trace.events
        if x["ph"] == "X"
        and (x["pid"], x["tid"]) == (e["pid"], e["tid"])
        and x["ts"] <= e["ts"] <= x["ts"] + x["dur"]
    ]


def test_flows_run_from_each_copy_to_its_forward_d2h_and_host_wait(tmp_path):
    trace = read_trace(write_trace(loop_trace("async", 6), tmp_path / "a.json"))
    flows = [e for e in trace.events if e.get("cat") == FLOW_CAT]
    assert len(flows) == 6 * 3 * 2  # three waits a step, a start and a finish each
    by_id: dict[int, dict[str, dict]] = {}
    for e in flows:
        by_id.setdefault(e["id"], {})[e["ph"]] = e
    expect = {
        "h2d_done": (S.COPY_H2D, S.GRAPH_REPLAY),
        "compute_done": (S.GRAPH_REPLAY, S.COPY_D2H),
        "d2h_done": (S.COPY_D2H, S.WAIT),
    }
    for pair in by_id.values():
        s, f = pair["s"], pair["f"]
        assert s["name"] == f["name"] and f["bp"] == "e"
        (src,), (dst,) = _enclosing(trace, s), _enclosing(trace, f)
        assert (src["name"], dst["name"]) == expect[s["name"]]
        assert src["args"]["step"] == dst["args"]["step"] == s["args"]["step"]
        assert src["ts"] <= dst["ts"] + dst["dur"]
    assert compute_metrics(trace) == compute_metrics(loop_trace("async", 6))  # metrics unmoved


def request_trace():
    b = TraceBuilder("sim", {"engine": "async"})
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    b.request_event(S.ARRIVAL, 0.0, rid=0)
    b.request_event(S.SCHEDULED, 30.0, rid=0)
    b.request_event(S.FIRST_TOKEN, 100.0, rid=0)
    b.request_event(S.FINISH, 400.0, rid=0, tokens=4)
    b.request_event(S.ARRIVAL, 50.0, rid=1)  # never scheduled: an interrupted run
    return b.build()


def _slices(trace, rid):
    evs = [e for e in trace.events if e.get("cat") == REQUEST_SLICE_CAT and e["id"] == rid]
    begins = {e["name"]: e["ts"] for e in evs if e["ph"] == "b"}
    ends = {e["name"]: e["ts"] for e in evs if e["ph"] == "e"}
    assert begins.keys() == ends.keys()
    return {n: (begins[n], ends[n]) for n in begins}, [e["ph"] for e in evs]


def test_one_async_slice_per_request_with_its_phases(tmp_path):
    trace = read_trace(write_trace(request_trace(), tmp_path / "r.json"))
    spans, order = _slices(trace, 0)
    assert spans == {
        "request 0": (0.0, 400.0),
        "queued": (0.0, 30.0),
        "prefill": (30.0, 100.0),
        "decode": (100.0, 400.0),
    }
    assert order == ["b", "b", "e", "b", "e", "b", "e", "e"]  # nested: children inside
    ttft = spans["prefill"][1] - spans["request 0"][0]
    assert ttft == pytest.approx(compute_metrics(trace)["ttft_ms_p50"] * 1e3)
    spans, _ = _slices(trace, 1)
    assert spans == {"request 1": (50.0, 400.0), "queued + prefill": (50.0, 400.0)}


def test_metadata_block_beside_otherdata(tmp_path):
    path = write_trace(request_trace(), tmp_path / "r.json")
    obj = json.loads(path.read_text())
    assert obj["metadata"] == {k: v for k, v in obj["otherData"].items()}
    assert read_trace(path).other_data == request_trace().other_data


def test_derived_events_follow_normalised_spans():
    b = TraceBuilder("runtime", {"clock_drift_us": 1000.0})
    for step in range(3):
        t = step * 1000.0
        b.span(S.H2D, S.COPY_H2D, t, 10.0, step=step)
        b.span(S.COMPUTE, S.FORWARD, t + 10.0, 900.0, step=step)
        b.span(S.D2H, S.COPY_D2H, t + 910.0, 10.0, step=step)
        b.span(S.HOST, S.WAIT, t + 5.0, 1000.0, step=step)
    from cbsim.trace import normalize

    fixed = normalize(with_derived(b.build()))
    for e in fixed.events:
        if e.get("cat") == FLOW_CAT:
            assert len(_enclosing(fixed, e)) == 1


def test_a_merged_trace_holds_sync_and_async_as_two_named_processes(tmp_path):
    runs = {"sync": loop_trace("sync", 5), "async": loop_trace("async", 5)}
    path = write_merged_trace(runs, tmp_path / "trace_compare.json.gz")
    merged = read_trace(path)
    names = {
        e["pid"]: e["args"]["name"]
        for e in merged.events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {1: "sync", 2: "async"}
    threads = {
        (e["pid"], e["args"]["name"]) for e in merged.events if e.get("name") == "thread_name"
    }
    assert {(p, lane) for p in (1, 2) for lane in S.REQUIRED_LANES} <= threads
    back = read_traces(path)
    assert list(back) == ["sync", "async"]
    for label, trace in runs.items():
        assert back[label].other_data == trace.other_data
        assert compute_metrics(back[label]) == compute_metrics(trace)
        assert sorted(json.dumps(e, sort_keys=True) for e in back[label].events) == sorted(
            json.dumps(e, sort_keys=True) for e in with_derived(trace).events
        )
    assert_nests(merged)
    flow_ids = [e["id"] for e in merged.events if e.get("cat") == FLOW_CAT]
    assert len(flow_ids) == len(set(flow_ids)) * 2  # no run shares a flow id with the other
    assert read_traces(write_trace(runs["sync"], tmp_path / "s.json")).keys() == {"sync"}


def test_a_merged_trace_with_a_bad_run_names_the_run(tmp_path):
    bad = loop_trace("async", 3)
    fwd = next(e for e in bad.events if e.get("name") == S.GRAPH_REPLAY)
    bad.events.append({**fwd, "ts": fwd["ts"] + 1.0})  # overlaps on the compute stream
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(merge_traces({"sync": loop_trace("sync", 3), "async": bad}).to_json_obj())
    )
    with pytest.raises(TraceError, match="merged run 'async': spans .* overlap"):
        read_trace(path)
    assert split_merged(loop_trace("sync", 2)).keys() == {"sync"}


def test_a_merged_trace_is_measured_run_by_run():
    merged = merge_traces({"sync": loop_trace("sync", 3), "async": loop_trace("async", 3)})
    with pytest.raises(TraceError, match="merged trace of sync, async: measure each run"):
        compute_metrics(merged)


def test_the_report_and_the_api_read_a_merged_trace_as_its_runs(tmp_path):
    from cbsim.api import load_traces
    from cbsim.report.trace_report import report_traces

    runs = {"sync": loop_trace("sync", 5), "async": loop_trace("async", 5)}
    path = write_merged_trace(runs, tmp_path / "trace_compare.json")
    metrics = report_traces([path], tmp_path / "r.html")
    assert set(metrics) == {"sync", "async"}
    assert metrics["sync"]["total_time_s"] == compute_metrics(runs["sync"])["total_time_s"]
    assert set(load_traces(path).traces) == {"sync", "async"}


def test_a_compare_run_writes_one_gzipped_trace_per_engine_that_nests_and_reads_back(tmp_path):
    from conftest import assert_nests, run_cli

    from cbsim.api import load_traces

    out = tmp_path / "run"
    args = ["+experiment=small_batch", "engine=compare", "workload.gen_len=16"]
    proc = run_cli([*args, f"hydra.run.dir={out}", "output.report=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    traces = sorted(p.name for p in out.glob("trace*"))
    assert traces == ["trace_async.json.gz", "trace_sync.json.gz"]
    for name in traces:
        assert_nests(out / name)
    loaded = load_traces(*(out / name for name in traces))
    assert set(loaded.traces) == {"sync", "async"}
    assert '"trace_sync.json.gz"' in (out / "finished.json").read_text()


def test_back_to_back_spans_still_nest_once_their_times_are_rounded_to_the_nanosecond():
    durations = np.random.default_rng(0).uniform(0.0001, 3.0, 2000)
    starts = np.concatenate(([0.0], np.cumsum(durations)[:-1]))
    b = TraceBuilder("sim")
    for ts, dur in zip(starts, durations):
        b.span(S.HOST, S.PREPARE, ts, dur)
    assert badly_nested(b.build().events) == []
    naive = [
        {"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": round(t, 3), "dur": round(d, 3)}
        for t, d in zip(starts, durations)
    ]
    assert badly_nested(naive, limit=10**6)  # rounding each on its own crosses neighbours


def test_a_span_that_crosses_another_on_any_lane_is_named():
    events = [
        {"ph": "X", "name": "wait", "pid": 1, "tid": 1, "ts": 0.0, "dur": 2.0},
        {"ph": "X", "name": "update", "pid": 1, "tid": 1, "ts": 1.999, "dur": 1.0},
        {"ph": "X", "name": "inner", "pid": 1, "tid": 1, "ts": 2.5, "dur": 0.5},
        {"ph": "X", "name": "other lane", "pid": 1, "tid": 2, "ts": 1.0, "dur": 5.0},
    ]
    (only,) = badly_nested(events)
    assert "span 1 ('update') starts inside span 0 ('wait') and ends 999 ns after it" in only


def test_every_lane_and_process_has_a_sort_index_in_the_order_a_reader_expects():
    trace = with_derived(loop_trace("async", 2))
    index = {
        (e["name"], e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in trace.events
        if e["ph"] == "M" and e["name"].endswith("sort_index")
    }
    for (pid, tid), lane in trace.lane_of.items():
        assert ("thread_sort_index", pid, tid) in index, lane
    order = sorted(
        S.REQUIRED_LANES, key=lambda lane: index[("thread_sort_index", *S.LANE_IDS[lane])]
    )
    assert order == [S.HOST, S.H2D, S.COMPUTE, S.D2H]
    procs = sorted(S.PROCESS_NAMES, key=lambda pid: index["process_sort_index", pid, 0])
    assert [S.PROCESS_NAMES[p] for p in procs] == ["cpu", "gpu", "requests"]


@pytest.mark.parametrize(
    "overrides",
    [
        ("+experiment=seed", "workload.gen_len=96"),
        ("+experiment=online", "workload.num_requests=48", "workload.rate=24"),
    ],
    ids=["seed", "online"],
)
def test_simulated_seed_and_online_traces_nest_on_every_lane_alone_and_merged(overrides):
    from cbsim.api import simulate

    result = simulate(*overrides, "mode.bands=false")
    assert set(result.traces) == {"sync", "async"}
    for trace in result.traces.values():
        assert_nests(with_derived(trace))
    assert_nests(merge_traces(result.traces))
