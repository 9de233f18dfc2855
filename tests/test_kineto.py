"""Kineto import: real torch.profiler files from the H200 (and the CPU) open as cbsim traces;
malformed files are refused with a reason."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import assert_nests

from cbsim.metrics import compute_metrics
from cbsim.report.trace_report import main as report_main
from cbsim.trace import TraceError, read_trace, write_trace
from cbsim.trace import schema as S
from cbsim.trace.kineto import convert, import_kineto, main
from cbsim.trace.load import gunzip_pieces, stream_object

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]
# recorded on the H200 by tests/data/make_kineto_trace.py: 4 decode steps of a tiny Llama on three
# streams, eagerly and graph-replayed
H200 = {"eager": DATA / "kineto_h200_eager.json.gz", "graph": DATA / "kineto_h200_graph.json.gz"}


def _raw(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.mark.parametrize("kind", ["eager", "graph"])
def test_h200_trace_lanes_steps_and_metrics(kind, tmp_path):
    trace = import_kineto(H200[kind])
    assert trace.source == "kineto"
    assert_nests(trace)
    spans = trace.spans
    forward = spans[spans.lane == S.COMPUTE]
    name = S.GRAPH_REPLAY if kind == "graph" else S.FORWARD
    assert list(forward.name) == [name] * 4
    assert list(forward.step) == [0, 1, 2, 3]
    # every compute-stream kernel of the file is inside one of the step spans
    raw = _raw(H200[kind])
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    stream = {str(s): lane for s, lane in trace.other_data["kineto"]["streams"].items()}
    assert stream[str(kernels[0]["args"]["stream"])] == S.COMPUTE
    assert sum(
        e["args"]["kernels"]
        for e in trace.events
        if e.get("ph") == "X" and e["pid"] == 2 and e["tid"] == 2
    ) == len(kernels)
    copies = spans[spans.lane.isin([S.H2D, S.D2H])]
    assert set(copies.name) == {S.COPY_H2D, S.COPY_D2H} and len(copies) == 8
    host = spans[spans.lane == S.HOST]
    assert {S.SCHEDULE, S.LAUNCH, S.WAIT, S.UPDATE} <= set(host.name)
    # one thread: host spans never nest or overlap
    h = host.sort_values("ts")
    assert (h.ts.to_numpy()[1:] >= h.end.to_numpy()[:-1] - 1e-3).all()
    # it is a valid trace file: written, read back, measured
    path = write_trace(trace, tmp_path / "k.json.gz")
    m = compute_metrics(read_trace(path))
    assert m["steps"] == 4 and 0.0 < m["gpu_idle_fraction"] < 1.0
    assert spans.ts.min() >= 0.0


def test_steps_from_graph_launches_without_ranges():
    """An engine that marks nothing (no record_function): each cudaGraphLaunch is a step."""
    trace = import_kineto(H200["graph"], step_marker="^no such range$")
    assert trace.other_data["kineto"]["steps_from"] == "cudaGraphLaunch"
    assert_nests(trace)
    fwd = trace.spans[trace.spans.lane == S.COMPUTE]
    assert list(fwd.name) == [S.GRAPH_REPLAY] * 4
    eager = import_kineto(H200["eager"], step_marker="^no such range$")
    assert eager.other_data["kineto"]["steps_from"] == "none"
    assert compute_metrics(eager)["steps"] == 0


RUNTIME_KINETO = sorted((REPO / "experiments" / "kineto").glob("runtime_*.json.gz"))


@pytest.mark.skipif(not RUNTIME_KINETO, reason="the runtime's H200 Kineto trace is not committed")
def test_runtime_kineto_trace_from_the_h200():
    """The runtime's own async engine under torch.profiler on the H200 (experiments/kineto/)."""
    trace = import_kineto(RUNTIME_KINETO[-1])
    m = compute_metrics(trace)
    assert m["steps"] > 0 and m["gpu_forward_ms_mean"] > 0
    spans = trace.spans
    assert S.COPY_H2D in set(spans[spans.lane == S.H2D].name)
    assert spans[spans.lane == S.COMPUTE].name.isin(S.FORWARD_NAMES).any()


def test_transformers_continuous_batching_from_the_h200():
    """An engine not written here: transformers' generate_batch (paged|sdpa, CUDA graphs) under
    torch.profiler on the H200 (experiments/kineto/profile_transformers_cb.py). It marks no
    ranges, runs its loop in a thread of its own, and CUPTI names its graph launches "INVALID":
    the steps come from the runtime calls behind many kernels, the host lane from the thread that
    launches."""
    trace = import_kineto(DATA / "kineto_h200_transformers_cb.json.gz")
    assert trace.other_data["kineto"]["steps_from"] == "cudaGraphLaunch"
    spans = trace.span_frame({"kernels": 0})
    fwd = spans[(spans.lane == S.COMPUTE) & spans.name.isin(S.FORWARD_NAMES)]
    replays = fwd[fwd.name == S.GRAPH_REPLAY]
    assert len(fwd) == 23 and len(replays) == 22  # 24 new tokens: the prefill, then decodes
    assert (replays.kernels == replays.kernels.iloc[0]).all() and replays.kernels.iloc[0] > 500
    host = spans[spans.lane == S.HOST]
    assert (host.name == "cudaGraphLaunch").sum() == 22 and (host.name == S.WAIT).any()
    m = compute_metrics(trace)
    assert m["steps"] == 23 and 5.0 < m["step_time_ms_p50"] < 50.0


def test_back_to_back_jitter_is_settled_not_rejected(tmp_path):
    """CUPTI can put an operation a few tens of ns into the one before it on the same stream."""
    ev = [
        {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": ts,
            "dur": 10.0,
            "args": {"stream": 7, "correlation": i},
        }
        for i, (cat, name, ts) in enumerate(
            [("kernel", "k0", 0.0), ("gpu_memset", "Memset (Device)", 9.968)]
        )
    ]
    trace = import_kineto(_write(tmp_path, {"traceEvents": ev}))
    a, b = trace.spans.sort_values("ts").itertuples()
    assert b.ts == pytest.approx(a.end) and b.dur == pytest.approx(10.0 - 0.032)


def test_cpu_only_trace_has_host_lane_only():
    trace = import_kineto(DATA / "kineto_cpu.json.gz")
    spans = trace.spans
    assert (spans.lane == S.HOST).all() and len(spans) >= 9
    assert {S.SCHEDULE, S.UPDATE} <= set(spans.name)


def test_cli_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "out.json.gz"
    assert main([str(H200["graph"]), str(out)]) == 0
    assert read_trace(out).source == "kineto"
    assert main([str(H200["eager"]), str(tmp_path / "e.json")]) == 0
    assert "python -m cbsim.report" in capsys.readouterr().out
    assert report_main([str(tmp_path / "e.json"), "-o", str(tmp_path / "e.html")]) == 0
    html = (tmp_path / "e.html").read_text()
    assert "cbsim-plot" in html and "e.json · kineto trace" in html
    assert main([str(tmp_path / "missing.json"), str(out)]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "STEP_REGEX" in capsys.readouterr().out


def _write(tmp_path: Path, obj, name="bad.json") -> Path:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.mark.parametrize(
    "obj,reason",
    [
        ("{not json", "not JSON"),
        ([1, 2], "traceEvents"),
        ({"traceEvents": {}}, "traceEvents"),
        ({"traceEvents": []}, "no profiler events"),
        (
            {"traceEvents": [{"ph": "X", "cat": "foo", "name": "x", "ts": 0, "dur": 1}]},
            "no profiler events",
        ),
        (
            {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "a", "dur": 1}]},
            "numeric ts and dur",
        ),
        (
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "k",
                        "ts": 0,
                        "dur": -1,
                        "args": {"stream": 7},
                    }
                ]
            },
            "negative duration",
        ),
        ({"traceEvents": [3]}, "not an object"),
        ({"traceEvents": [], "otherData": {"schema": "cbsim.trace"}}, "already a cbsim trace"),
    ],
)
def test_malformed_is_rejected_with_reason(tmp_path, obj, reason):
    with pytest.raises(TraceError, match=reason):
        import_kineto(_write(tmp_path, obj))


def test_corrupt_gzip_and_overlapping_stream_rejected(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage")
    with pytest.raises(TraceError, match="corrupt gzip"):
        import_kineto(bad)
    # two copies overlapping on one stream cannot be a real stream's timeline
    ev = [
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pinned -> Device)",
            "pid": 0,
            "tid": 3,
            "ts": t,
            "dur": 10,
            "args": {"stream": 3, "bytes": 8},
        }
        for t in (0, 5)
    ]
    with pytest.raises(TraceError, match="overlap"):
        import_kineto(_write(tmp_path, {"traceEvents": ev}))


def test_per_kernel_gpu_time_by_kind_of_step():
    """transformers' own engine: the top kernel of its graph-replayed steps is cuDNN's SDPA, and
    every kernel of the file is in the table once."""
    trace = import_kineto(DATA / "kineto_h200_transformers_cb.json.gz")
    table = trace.other_data["kineto"]["kernels"]
    assert table[S.GRAPH_REPLAY]["steps"] == 22 and table[S.FORWARD]["steps"] == 1
    top = table[S.GRAPH_REPLAY]["top"][0]
    assert "sdpa" in top["name"] and 0.3 < top["share"] < 1.0
    for g in table.values():
        shares = [k["share"] for k in g["top"]]
        assert shares == sorted(shares, reverse=True) and sum(shares) <= 1.0 + 1e-6
    raw = _raw(DATA / "kineto_h200_transformers_cb.json.gz")
    kernel_us = sum(e["dur"] for e in raw["traceEvents"] if e.get("cat") == "kernel")
    assert sum(g["kernel_us"] for g in table.values()) == pytest.approx(kernel_us, rel=1e-6)


def test_the_report_reads_the_per_kernel_table():
    from cbsim.report.kernels import kernel_records, kernel_tables

    trace = import_kineto(DATA / "kineto_h200_transformers_cb.json.gz")
    records = kernel_records(trace)
    table = trace.other_data["kineto"]["kernels"]
    for kind, g in table.items():
        mine = [r for r in records if r["kind"] == kind]
        assert sum(r["gpu_us"] for r in mine) == pytest.approx(g["kernel_us"])
    top = table[S.GRAPH_REPLAY]["top"][0]
    html = kernel_tables(records)[S.GRAPH_REPLAY]
    assert top["name"][:40] in html and f"{top['share']:.1%}" in html


@pytest.mark.parametrize(
    "name, cat, category",
    [
        (
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7",
            "kernel",
            "attention",
        ),
        ("nvjet_sm90_tst_72x64_64x12_4x1_v_bz_TNN", "kernel", "GEMM"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize", "kernel", "GEMM"),
        ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", "kernel", "copy"),
        ("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", "copy"),
        ("void at::native::vectorized_elementwise_kernel<8, FillFunctor>", "kernel", "elementwise"),
        ("triton_poi_fused_add_rms_norm_0", "kernel", "elementwise"),
        ("some_unknown_library_kernel_v2", "kernel", "other"),
    ],
)
def test_a_kernel_name_reads_as_an_engineer_reads_it(name, cat, category):
    from cbsim.trace.kernel_category import kernel_category

    assert kernel_category(name, cat) == category


def test_the_import_leads_with_its_kernel_categories_and_top_kernel(tmp_path):
    """transformers' continuous batching on the H200: attention first, its cuDNN SDPA kernel the
    top one, in the report's headline; the categories hold every kernel's and copy's time."""
    from cbsim.report.kernels import category_sentence, category_totals

    path = DATA / "kineto_h200_transformers_cb.json.gz"
    trace = import_kineto(path)
    totals = category_totals(trace)
    assert next(iter(totals)) == "attention"
    raw = json.load(gzip.open(path))["traceEvents"]
    gpu_us = sum(
        e["dur"]
        for e in raw
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    assert sum(totals.values()) == pytest.approx(gpu_us, rel=0.02)
    sentence = category_sentence(trace)
    assert sentence.startswith("GPU time by kernel category: attention")
    assert "cudnn_generated_fort_native_sdpa" in sentence
    write_trace(trace, tmp_path / "k.json.gz")
    assert report_main([str(tmp_path / "k.json.gz"), "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert html.index("GPU time by kernel category") < html.index("Where the time went")
    assert "<td>generated tokens</td><td>-</td>" in html  # an import counts no tokens


def test_the_import_caps_are_flags_and_a_trace_past_them_is_refused_in_one_line(tmp_path, capsys):
    src = DATA / "kineto_h200_graph.json.gz"
    out = tmp_path / "k.json.gz"
    assert main([str(src), str(out), "--max-events", "10"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "10" in err and not out.exists()
    assert main([str(src), str(out), "--max-events", "5000000", "--max-mb", "1024"]) == 0
    assert out.is_file()


def test_the_stream_import_is_the_whole_file_import():
    """Read as a stream or parsed whole (cbsim.trace.kineto.convert), a trace imports the same;
    and the stream reader, cut into odd pieces, gives json's events."""
    for path in sorted(DATA.glob("kineto_*.json.gz")):
        whole = convert(_raw(path), name=path.name).to_json_obj()
        assert import_kineto(path).to_json_obj() == whole, path.name
    path = DATA / "kineto_h200_transformers_cb.json.gz"
    events: list = []
    stream_object(
        gunzip_pieces(path, 1 << 30, chunk=4099), "traceEvents", lambda i, e: events.append(e)
    )
    assert events == _raw(path)["traceEvents"]


EVENT = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0}


@pytest.mark.parametrize(
    "label, data, says",
    [
        ("no traceEvents", {"deviceProperties": [], "otherData": {}}, '"traceEvents" list'),
        ("an element no object", '{"traceEvents": [%s, 3]}', "event 1 is not an object"),
        ("garbage after the list", '{"traceEvents": [%s] garbage}', "not JSON (expected ','"),
        ("garbage after the object", '{"traceEvents": [%s]} {}', "extra data after"),
        ("cut in the list", '{"traceEvents": [%s, {"ph"', "not JSON"),
        (
            "no integer correlation",
            '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", '
            '"ts": 0.0, "dur": 1.0, "args": {"correlation": "7"}}]}',
            "args.correlation",
        ),
        ("truncated gzip", '{"traceEvents": [%s]}', "truncated"),
    ],
)
def test_a_malformed_stream_is_refused_in_one_line(tmp_path, capsys, label, data, says):
    text = data if isinstance(data, str) else json.dumps(data)
    raw = text.replace("%s", json.dumps(EVENT)).encode()
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(raw)[:-6] if "gzip" in label else gzip.compress(raw))
    out = tmp_path / "out.json.gz"
    assert main([str(path), str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cbsim: {path}: ") and says in err and "\n" not in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "bad, says", [("3", "event 1 is not an object"), (None, "over 2 elements")]
)
def test_a_stream_is_refused_before_the_rest_is_read(tmp_path, bad, says):
    """The reason shows at element 1 (an element that is no object) or 2 (past --max-events):
    refused there, the rest of the file (here: no gzip at all) never read."""
    first = [json.dumps(EVENT)] + ([bad] if bad else [json.dumps(EVENT)] * 2)
    head = '{"traceEvents": [' + ", ".join(first) + ", " + ", ".join([json.dumps(EVENT)] * 1000)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(head.encode()) + b"not gzip" * 1000)
    with pytest.raises(TraceError, match=says):
        import_kineto(path, max_events=2)


@pytest.mark.slow
def test_a_large_trace_imports_in_bounded_memory(tmp_path):
    """200k events of a Kineto-shaped trace (benchmarks/bench_kineto_import.py's), each import in
    a process of its own: the stream import holds under half the memory of the file parsed whole
    (json.load, then convert), and writes the same trace."""
    spec = importlib.util.spec_from_file_location(
        "bench", REPO / "benchmarks" / "bench_kineto_import.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "big.json.gz"
    assert bench.write_kineto(path, 200_000) == 200_000
    outcome, _, stream_mb = bench.measure(bench.IMPORT, path, tmp_path / "s.json.gz", 200_000)
    assert outcome == "imported"
    outcome, _, whole_mb = bench.measure(bench.WHOLE, path, tmp_path / "w.json.gz", 200_000)
    assert outcome == "imported"
    assert (tmp_path / "s.json.gz").read_bytes() == (tmp_path / "w.json.gz").read_bytes()
    assert stream_mb < whole_mb / 2, (stream_mb, whole_mb)
