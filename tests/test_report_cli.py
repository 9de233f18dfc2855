"""python -m cbsim.report: any trace file in the format gets the same metrics and report."""

from __future__ import annotations

import json

from conftest import REPO, make_config

from cbsim.report.trace_report import config_of, main
from cbsim.sim import run
from cbsim.trace import TraceBuilder, write_trace
from cbsim.trace import schema as S

SMALL = ["workload.batch_size=4", "workload.prompt_len=32", "workload.gen_len=16", "model=tiny"]


def test_sim_traces_with_their_config_get_the_run_report(tmp_path, capsys):
    config = make_config(SMALL + ["engine=compare"])
    paths = []
    for engine in ("sync", "async"):
        trace = run(config, engine)
        trace.other_data["config"] = json.loads(json.dumps(_as_dict(config)))
        assert config_of(trace) == config
        paths.append(str(write_trace(trace, tmp_path / f"trace_{engine}.json.gz")))
    out = tmp_path / "r.html"
    assert main([*paths, "-o", str(out)]) == 0
    html = out.read_text()
    assert "sync vs async" in html and "plotly" in html.lower()
    assert "GPU idle" in capsys.readouterr().out


def test_a_trace_without_config_gets_the_generic_report(tmp_path):
    b = TraceBuilder("kineto")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    b.span(S.HOST, S.LAUNCH, 0.0, 10.0, step=0)
    path = write_trace(b.build(), tmp_path / "k.json")
    out = tmp_path / "k.html"
    assert main([str(path), "-o", str(out)]) == 0
    assert "Timeline" in out.read_text()


def test_bad_input_is_a_message_and_exit_2(tmp_path, capsys):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"traceEvents": []}))
    assert main([str(raw)]) == 2
    err = capsys.readouterr().err
    assert "otherData" in err and "cbsim.trace.kineto" in err
    assert main([]) == 2
    assert main([str(raw), "-o"]) == 2


def test_a_bad_output_or_a_second_one_is_refused_before_any_work(tmp_path, capsys):
    trace = tmp_path / "t.json"
    b = TraceBuilder("kineto")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    write_trace(b.build(), trace)
    for argv, says in (
        ([str(trace), "-o", str(tmp_path)], "is a directory"),
        ([str(trace), "-o", str(trace / "r.html")], "is a file, not a directory"),
        ([str(trace), "-o", str(tmp_path / "a.html"), "-o", str(tmp_path / "b.html")], "twice"),
        ([str(tmp_path / "missing.json")], "no such file"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.glob("*.html"))
    assert main(["--help"]) == 0
    assert "--output" in capsys.readouterr().out


def test_every_command_line_tool_has_help_that_exits_0(capsys):
    from cbsim.sweep.__main__ import main as sweep_main
    from cbsim.sweep.grid import main as grid_main
    from cbsim.trace.kineto import main as kineto_main

    tools = {"report": main, "trace.kineto": kineto_main, "sweep": sweep_main}
    for name, tool in {**tools, "sweep.grid": grid_main}.items():
        assert tool(["--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: python -m cbsim.{name}")
        assert tool([]) == 2
        err = capsys.readouterr().err
        assert "required" in err and len(err.strip().splitlines()) == 1, err


def _as_dict(config):
    from dataclasses import asdict

    return asdict(config)


def test_two_recorded_traces_without_config_are_compared_with_names_and_units(tmp_path, capsys):
    rec = REPO / "cbsim" / "recorded" / "h200" / "six_workloads" / "small_batch"
    out = tmp_path / "h200.html"
    paths = [str(rec / "trace_sync.json.gz"), str(rec / "trace_async.json.gz")]
    assert main([*paths, "-o", str(out)]) == 0
    html = out.read_text()
    assert "cbsim · sync vs async · runtime traces" in html
    for label in ("total time (s)", "step time p50 (ms)", "async vs sync", "NVIDIA H200"):
        assert label in html
    assert "workload.batch_size=4" in html  # the recorded overrides stand in for the config
    assert "report: " in capsys.readouterr().out


def test_kernel_times_of_an_import_are_shown_by_share(tmp_path):
    b = TraceBuilder("kineto")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    trace = b.build()
    trace.other_data["kernels"] = [
        {"name": "cudnn_sdpa_fprop", "gpu_us": 910.0, "calls": 32, "kind": "decode"},
        {"name": "gemm_bf16", "gpu_us": 90.0, "calls": 224, "kind": "decode"},
    ]
    out = tmp_path / "k.html"
    assert main([str(write_trace(trace, tmp_path / "k.json")), "-o", str(out)]) == 0
    html = out.read_text()
    assert "Where the GPU time went, by kernel" in html
    assert "cudnn_sdpa_fprop</td><td>0.91</td><td>32</td><td>91.0%" in html


def test_reports_in_one_directory_can_share_plotly(tmp_path):
    b = TraceBuilder("kineto")
    b.span(S.COMPUTE, S.FORWARD, 0.0, 100.0, step=0)
    path = str(write_trace(b.build(), tmp_path / "k.json"))
    for name in ("a.html", "b.html"):
        assert main([path, "-o", str(tmp_path / "out" / name), "--shared-js"]) == 0
        html = (tmp_path / "out" / name).read_text()
        assert '<script src="plotly.min.js"></script>' in html and len(html) < 200_000
    assert (tmp_path / "out" / "plotly.min.js").stat().st_size > 3_000_000
