"""Trace format v1: round trip, and rejection of malformed input with a reason."""

from __future__ import annotations

import gzip
import json

import pytest

from cbsim.trace import TraceBuilder, TraceError, read_trace, write_trace
from cbsim.trace import schema as S
from cbsim.trace.perfetto import with_derived


def small_trace():
    b = TraceBuilder("sim", {"engine": "sync"})
    b.span(S.HOST, S.PREPARE, 0.0, 10.0, step=0, slot=0, requests=2, query_tokens=8)
    b.span(S.H2D, S.COPY_H2D, 10.0, 2.0, step=0, slot=0)
    b.span(
        S.COMPUTE,
        S.FORWARD,
        12.0,
        50.0,
        step=0,
        slot=0,
        requests=2,
        query_tokens=8,
        kv_tokens=8,
        kind="prefill",
        new_tokens=2,
    )
    b.span(S.D2H, S.COPY_D2H, 62.0, 1.0, step=0, slot=0)
    b.request_event(S.ARRIVAL, 0.0, rid=0)
    b.counter(S.SCHEDULER_COUNTER, 0.0, waiting=0, running=2, kv_blocks_used=1)
    return b.build()


def test_round_trip_json_and_gzip(tmp_path):
    trace = small_trace()
    for name in ("t.json", "t.json.gz"):
        path = write_trace(trace, tmp_path / name)
        back = read_trace(path)
        # what was built, then the flows and request slices derived on write
        assert back.events[: len(trace.events)] == trace.events
        assert back.events == with_derived(trace).events and back.other_data == trace.other_data
        assert list(back.spans.name) == [S.PREPARE, S.COPY_H2D, S.FORWARD, S.COPY_D2H]


def test_writes_are_byte_identical(tmp_path):
    a = write_trace(small_trace(), tmp_path / "a.json.gz").read_bytes()
    b = write_trace(small_trace(), tmp_path / "b.json.gz").read_bytes()
    assert a == b


def test_lanes_are_named_for_perfetto():
    trace = small_trace()
    assert set(S.REQUIRED_LANES) <= set(trace.lanes)
    meta = [e for e in trace.events if e["ph"] == "M" and e["name"] == "process_name"]
    assert {e["args"]["name"] for e in meta} >= {"cpu", "gpu"}


def _write_obj(tmp_path, obj, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def _obj():
    return small_trace().to_json_obj()


def _mutate(fn):
    obj = json.loads(json.dumps(_obj()))
    fn(obj)
    return obj


def _drop_lane(obj, lane):
    obj["traceEvents"] = [
        e for e in obj["traceEvents"] if not (e["ph"] == "M" and e["args"].get("name") == lane)
    ]


def _first_span(obj, name):
    return next(e for e in obj["traceEvents"] if e.get("name") == name)


REJECTIONS = [
    ("not json", None, "not JSON"),
    ("wrong top level", [1, 2, 3], "traceEvents"),
    ("no otherData", {"traceEvents": []}, "otherData"),
    ("schema version", _mutate(lambda o: o["otherData"].update(version=99)), "schema version"),
    ("schema name", _mutate(lambda o: o["otherData"].update(schema="x")), "otherData.schema"),
    ("source", _mutate(lambda o: o["otherData"].update(source="ouija")), "otherData.source"),
    (
        "negative duration",
        _mutate(lambda o: _first_span(o, S.FORWARD).update(dur=-1)),
        "negative duration",
    ),
    ("missing lane", _mutate(lambda o: _drop_lane(o, S.D2H)), "missing lanes: d2h"),
    (
        "non-numeric ts",
        _mutate(lambda o: _first_span(o, S.FORWARD).update(ts="soon")),
        "numeric ts",
    ),
    (
        "unknown pid/tid",
        _mutate(lambda o: _first_span(o, S.FORWARD).update(tid=77)),
        "no thread_name",
    ),
    ("event without ph", _mutate(lambda o: o["traceEvents"].append({"name": "x"})), "'ph'"),
    (
        "negative copy rate",
        _mutate(lambda o: o["otherData"].update(hardware={"name": "gpu", "copy_bytes_per_s": -1})),
        "hardware.copy_bytes_per_s",
    ),
    (
        "unknown hardware basis",
        _mutate(lambda o: o["otherData"].update(hardware={"basis": "guess"})),
        "hardware.basis",
    ),
]


@pytest.mark.parametrize("label,obj,fragment", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_malformed_traces_are_rejected_with_a_reason(tmp_path, label, obj, fragment):
    if obj is None:
        path = tmp_path / "bad.json"
        path.write_text("{not json")
    else:
        path = _write_obj(tmp_path, obj)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(path) in str(err.value)
    if fragment:
        assert fragment in str(err.value)


def test_overlap_on_a_stream_lane_is_rejected(tmp_path):
    b = TraceBuilder("runtime")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 10.0, step=0)
    b.span(S.COMPUTE, S.FORWARD, 5.0, 10.0, step=1)
    path = write_trace(b.build(), tmp_path / "o.json")
    with pytest.raises(TraceError, match="overlap on stream lane 'compute'"):
        read_trace(path)


def test_size_limit_and_corrupt_gzip(tmp_path):
    path = write_trace(small_trace(), tmp_path / "t.json")
    with pytest.raises(TraceError, match="over the limit"):
        read_trace(path, max_bytes=100)
    bad = tmp_path / "t.json.gz"
    bad.write_bytes(gzip.compress(b"{}")[:12])
    with pytest.raises(TraceError, match="gzip"):
        read_trace(bad)
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "missing.json")
