"""The trace reader is bounded and total: a malformed file, however made, is a TraceError that
names the file and says why (never another exception); a file within the bounds is read."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbsim.metrics import compute_metrics
from cbsim.trace import TraceBuilder, TraceError, read_trace, write_trace
from cbsim.trace import schema as S
from cbsim.trace.checks import MAX_DEPTH
from cbsim.trace.load import stream_object

REPO = Path(__file__).resolve().parents[1]
RECORDED = (
    REPO / "cbsim" / "recorded" / "h200" / "six_workloads" / "small_batch" / "trace_sync.json.gz"
)


def small_obj() -> dict:
    b = TraceBuilder("sim", {"engine": "sync"})
    b.span(S.HOST, S.PREPARE, 0.0, 10.0, step=0, slot=0, requests=2, query_tokens=8)
    b.span(S.COMPUTE, S.FORWARD, 12.0, 50.0, step=0, requests=2, kind="prefill", new_tokens=2)
    b.request_event(S.ARRIVAL, 0.0, rid=0)
    b.counter(S.SCHEDULER_COUNTER, 0.0, waiting=0, running=2, kv_blocks_used=1)
    return json.loads(json.dumps(b.build().to_json_obj()))


def _refused(path: Path, fragment: str, **kw) -> str:
    with pytest.raises(TraceError) as err:
        read_trace(path, **kw)
    msg = str(err.value)
    assert msg.startswith(str(path)) and fragment in msg and "\n" not in msg
    return msg


def test_a_gzip_bomb_is_refused_without_holding_it(tmp_path):
    """Gzip members of zeros, one after another (how a 4 MB file expands to 4 GiB; the full
    size is measured in benchmarks/bench_trace_read.py): refused at the limit."""
    member = gzip.compress(b"\0" * (8 << 20), compresslevel=9)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(member * 16)  # 128 MiB uncompressed from 128 KB
    _refused(bomb, "uncompressed, the limit", max_bytes=32 << 20)


def test_five_thousand_deep_json_is_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [], "otherData": ' + "[" * 5000 + "]" * 5000 + "}")
    _refused(deep, "nested too deeply")


def test_nesting_past_the_bound_is_refused_even_when_python_could_parse_it(tmp_path):
    obj = small_obj()
    obj["otherData"]["config"] = {"x": json.loads("[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2))}
    path = tmp_path / "nested.json"
    path.write_text(json.dumps(obj))
    _refused(path, f"more than {MAX_DEPTH} levels")


def _mutated(tmp_path, fn, name="bad.json") -> Path:
    obj = small_obj()
    fn(obj)
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def _meta(obj, name):
    return next(e for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == name)


def _first(obj, ph):
    return next(e for e in obj["traceEvents"] if e["ph"] == ph)


WRONG_TYPES = [
    ("thread_name args a string", lambda o: _meta(o, "thread_name").update(args="host"), "args"),
    ("pid a list", lambda o: _first(o, "X").update(pid=[1]), "integer pid"),
    ("tid a string", lambda o: _first(o, "X").update(tid="1"), "integer pid"),
    ("thread name a number", lambda o: _meta(o, "thread_name")["args"].update(name=3), "name"),
    ("span name a list", lambda o: _first(o, "X").update(name=["x"]), "string name"),
    ("step a string", lambda o: _first(o, "X")["args"].update(step="0"), "args.step"),
    ("kind a number", lambda o: _first(o, "X")["args"].update(kind=1), "args.kind"),
    ("rid a list", lambda o: _first(o, "i")["args"].update(rid=[0]), "args.rid"),
    ("counter value text", lambda o: _first(o, "C")["args"].update(waiting="0"), "number"),
    ("otherData.config a list", lambda o: o["otherData"].update(config=[]), "config"),
    ("otherData.engine a number", lambda o: o["otherData"].update(engine=1), "engine"),
    ("ts infinite", lambda o: _first(o, "X").update(ts=float("inf")), "numeric ts"),
    ("event a number", lambda o: o["traceEvents"].append(7), "'ph'"),
]


@pytest.mark.parametrize("label,fn,fragment", WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_wrong_types_are_refused_with_the_field_named(tmp_path, label, fn, fragment):
    _refused(_mutated(tmp_path, fn), fragment)


def test_a_corrupted_gzip_body_is_refused(tmp_path):
    good = write_trace(read_trace(RECORDED), tmp_path / "good.json.gz").read_bytes()
    body = bytearray(good)
    for i in range(len(body) // 2, len(body) // 2 + 64):
        body[i] ^= 0x5A
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(body))
    _refused(bad, "corrupt gzip")
    bad.write_bytes(good[: len(good) // 2])
    _refused(bad, "truncated")
    bad.write_bytes(good + b"garbage")
    _refused(bad, "corrupt gzip")
    bad.write_bytes(good + good)  # two members: one valid gzip stream per the format
    with pytest.raises(TraceError, match="not JSON"):
        read_trace(bad)


def test_a_trace_over_the_size_limit_is_refused_up_front_naming_the_limit(tmp_path):
    path = write_trace(read_trace(RECORDED), tmp_path / "t.json")
    msg = _refused(path, "over the limit of 1000000 bytes", max_bytes=1_000_000)
    assert "max_bytes" in msg


def test_a_partial_trace_is_readable_and_marked_incomplete(tmp_path):
    trace = read_trace(RECORDED)
    path = write_trace(trace, tmp_path / "trace_sync_partial.json.gz")
    back = read_trace(path)
    assert back.incomplete and back.other_data["incomplete"] == "interrupted"
    assert not read_trace(write_trace(trace, tmp_path / "trace_sync.json.gz")).incomplete
    marked = TraceBuilder("sim").build().mark_incomplete("SIGTERM")
    assert read_trace(write_trace(marked, tmp_path / "t.json")).other_data["incomplete"] == (
        "SIGTERM"
    )


def test_the_metadata_block_repeats_the_plain_otherdata_values(tmp_path):
    path = write_trace(read_trace(RECORDED), tmp_path / "t.json")
    obj = json.loads(path.read_text())
    assert obj["metadata"]["source"] == "runtime" and obj["metadata"]["schema"] == S.SCHEMA_NAME
    assert "config_overrides" in obj["otherData"]
    assert not {"config", "config_overrides"} & set(obj["metadata"])


# ---- property tests: random damage to a real (recorded) trace --------------------------------


@pytest.fixture(scope="module")
def recorded_bytes() -> bytes:
    """The first 1,500 events of a recorded H200 trace, as the JSON a writer produces."""
    obj = json.loads(gzip.decompress(RECORDED.read_bytes()))
    obj["traceEvents"] = obj["traceEvents"][:1500]
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _read_or_refuse(path: Path) -> None:
    try:
        trace = read_trace(path)
    except TraceError as exc:
        assert str(exc).startswith(str(path))
        return
    compute_metrics(trace)  # anything accepted can be measured


PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(cut=st.floats(0.0, 1.0), gz=st.booleans())
def test_any_truncation_is_a_trace_error(tmp_path, recorded_bytes, cut, gz):
    data = gzip.compress(recorded_bytes, mtime=0) if gz else recorded_bytes
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(data[: int(cut * (len(data) - 1))])
    _read_or_refuse(path)


@PROPERTY
@given(
    hits=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), min_size=1, max_size=8),
    gz=st.booleans(),
)
def test_any_byte_corruption_is_a_trace_error_or_a_valid_trace(tmp_path, recorded_bytes, hits, gz):
    data = bytearray(gzip.compress(recorded_bytes, mtime=0) if gz else recorded_bytes)
    for where, byte in hits:
        data[int(where * (len(data) - 1))] = byte
    path = tmp_path / ("bad.json.gz" if gz else "bad.json")
    path.write_bytes(bytes(data))
    _read_or_refuse(path)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)
FIELDS = ("ph", "name", "pid", "tid", "ts", "dur", "args", "cat", "id", "s")
ARGS = ("step", "slot", "requests", "kind", "new_tokens", "rid", "tokens", "name", "waiting")


@PROPERTY
@given(
    which=st.floats(0.0, 1.0),
    field=st.sampled_from(FIELDS + tuple(f"args.{a}" for a in ARGS)),
    value=JSON_VALUES,
)
def test_any_field_set_to_any_json_value_is_a_trace_error_or_measurable(
    tmp_path, recorded_bytes, which, field, value
):
    obj = json.loads(recorded_bytes)
    e = obj["traceEvents"][int(which * (len(obj["traceEvents"]) - 1))]
    if field.startswith("args."):
        if not isinstance(e.get("args"), dict):
            e["args"] = {}
        e["args"][field[5:]] = value
    else:
        e[field] = value
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps(obj))
    _read_or_refuse(path)


def test_zlib_is_not_leaked(tmp_path):
    """A gzip header followed by a body zlib cannot inflate: a TraceError, not zlib.error."""
    bad = tmp_path / "b.json.gz"
    bad.write_bytes(gzip.compress(b"{}")[:10] + zlib.compress(b"x" * 100)[::-1])
    _refused(bad, "corrupt gzip")


def test_a_trace_with_too_many_events_is_refused_before_parsing(tmp_path):
    path = write_trace(read_trace(RECORDED), tmp_path / "t.json")
    _refused(path, "over the limit of 100 (max_events", max_events=100)


BAD_FILES = {
    "not json": b"{not json",
    "deep": b'{"traceEvents": [], "otherData": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "raw kineto": b'{"traceEvents": []}',
    "corrupt gzip": b"\x1f\x8b" + b"garbage" * 10,
    "pid a list": json.dumps(
        {**small_obj(), "traceEvents": [{"ph": "X", "pid": [1], "tid": 1, "ts": 0, "dur": 1}]}
    ).encode(),
}


@pytest.mark.parametrize("label", list(BAD_FILES))
def test_the_report_cli_prints_one_line_and_exits_2(tmp_path, capsys, label):
    from cbsim.report.trace_report import main

    path = tmp_path / ("bad.json.gz" if "gzip" in label else "bad.json")
    path.write_bytes(BAD_FILES[label])
    assert main([str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "r.html").exists()


def _streamed(data: bytes, chunk: int) -> tuple[list, dict, int | None]:
    """stream_object over ``data`` cut into pieces of ``chunk`` bytes: the elements of
    traceEvents, the other keys, the count."""
    items: list = []
    pieces = (data[i : i + chunk] for i in range(0, len(data), chunk))
    others, count = stream_object(pieces, "traceEvents", lambda i, e: items.append(e))
    return items, others, count


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(JSON_VALUES, max_size=6),
    other=st.dictionaries(st.sampled_from(["a", "otherData", "é"]), JSON_VALUES, max_size=3),
    first=st.booleans(),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    chunk=st.integers(1, 40),
)
def test_the_stream_reader_reads_what_json_reads(events, other, first, indent, ascii_only, chunk):
    """However the file is cut into pieces (a number, a string, an escape split between two),
    the streamed elements and the other keys, before or after the list, are json's."""
    doc = {"traceEvents": events, **other} if first else {**other, "traceEvents": events}
    data = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    items, others, count = _streamed(data, chunk)
    assert items == events and count == len(events) and others == other


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chunk=st.integers(1, 16))
def test_the_stream_reader_on_any_bytes_reads_json_or_refuses(data, chunk):
    """A valid document cut, patched or extended anywhere: what the stream reader accepts,
    json accepts the same; everything else is a TraceError, never another exception."""
    doc = {"traceEvents": data.draw(st.lists(JSON_VALUES, max_size=4)), "x": [1.5, "a"]}
    raw = bytearray(json.dumps(doc).encode())
    at = data.draw(st.integers(0, len(raw)))
    patch = data.draw(st.binary(max_size=3) | st.sampled_from([b"]", b"}", b",", b'"', b"\\u12"]))
    raw[at : at + data.draw(st.integers(0, 3))] = patch
    try:
        items, others, count = _streamed(bytes(raw), chunk)
    except TraceError as exc:
        assert "\n" not in str(exc)
        return
    parsed = json.loads(bytes(raw))
    assert parsed == (others if count is None else {**others, "traceEvents": items})
