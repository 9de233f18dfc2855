"""Holdouts that ask the user's question: a model no run in the fit has, a device call the fit
never saw; the async speedup per workload; bands that say whether the recording lies inside.

Synthetic recordings: simulator traces of two model shapes in two device calls of one stack (the
second call's host 20% slower), each call a directory with its manifest.yaml, as
experiments/recordings/<gpu>/<set>/ holds them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import UNFITTED, compose_cfg, load_config, run_cli
from omegaconf import OmegaConf
from test_validation import TRUTH

from cbsim.calibration.manifest import manifest_of
from cbsim.calibration.recordings import load, resolve_traces
from cbsim.config import ConfigError
from cbsim.sim import run
from cbsim.trace import write_trace
from cbsim.validation.holdout import fit_sets
from cbsim.validation.tasks import EXTRA_KEYS, run_validation_task

# three shapes: holding one out leaves two, whose different weights tell a GEMM efficiency from
# the fixed cost per step
MODELS = ("llama3_8b", "llama3_3b", "llama3_1b")
# batch size -> prompt length: prefills of two sizes, so the fit sees their FLOP rate
BATCHES = {4: 512, 16: 128}
# the second call's host: every host cost this much slower (another host, or the same one loaded)
CALLS = {"call_a": 1.0, "call_b": 1.2}
HOST_KEYS = [k for k in TRUTH if k.startswith("hardware.host.") and not k.endswith("every_steps")]


# a small per-row cost keeps every shape's prefill on the FLOP side of the GEMM roofline, where
# two shapes measure the rate the third needs (with a large one the small shapes' prefills are
# row-bound and say nothing of FLOPs: a held-out 8B prefill then keeps the prior's rate)
SHAPES_TRUTH = {**TRUTH, "hardware.gpu.gemm_row_us": 1.0}


def _record(folder: Path, model: str, batch: int, engine: str, host_factor: float) -> Path:
    truth = {k: v * host_factor if k in HOST_KEYS else v for k, v in SHAPES_TRUTH.items()}
    overrides = (
        [*UNFITTED]
        + [f"{k}={v}" for k, v in truth.items()]
        + [
            f"model={model}",
            f"engine={engine}",
            f"workload.batch_size={batch}",
            f"workload.prompt_len={BATCHES[batch]}",
            "workload.gen_len=32",
        ]
    )
    cfg = compose_cfg(overrides)
    trace = run(load_config(cfg), engine)
    trace.other_data["config"] = OmegaConf.to_container(cfg, resolve=True)
    case = folder / f"{model}_bs{batch}"
    case.mkdir(exist_ok=True)
    return write_trace(trace, case / f"trace_{engine}.json.gz")


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recordings")
    session = root / "synthetic_run"
    session.mkdir()
    (session / "manifest.yaml").write_text(
        "session: synthetic_run\nstack: synthetic\ncommit: test\nquirks:\n  cold_first_step: false\n"
    )
    for call, factor in CALLS.items():
        (session / call).mkdir()
        (session / call / "manifest.yaml").write_text(f"call: {call}\n")
        for model in MODELS:
            for batch in BATCHES:
                for engine in ("sync", "async"):
                    _record(session / call, model, batch, engine, factor)
    return root


def _validate(stack: Path, tmp_path: Path, *overrides: str, traces: str = "**") -> dict:
    cfg = load_config(
        compose_cfg(
            [
                "+experiment=validate",
                *UNFITTED,
                "extra.holdout=workload",
                f"extra.recordings={stack}",
                f"trace=[synthetic_run/{traces}/trace_*.json.gz]",
                "extra.report=false",
                "extra.progress=false",
                "extra.jobs=1",
                "output.print_table=false",
                *overrides,
            ]
        )
    )
    return run_validation_task(cfg, {}, tmp_path)


def test_manifests_nest_a_call_inside_its_session(stack):
    trace = next((stack / "synthetic_run" / "call_b").glob("*/trace_sync.json.gz"))
    m = manifest_of(trace, stack)
    assert (m.session, m.stack, m.call, m.commit) == (
        "synthetic_run",
        "synthetic",
        "call_b",
        "test",
    )
    rec = load([trace], stack)[0]
    assert rec.call == "call_b" and rec.name.startswith("synthetic_run/call_b/")


def test_a_bad_manifest_is_one_line_naming_the_file_and_key(tmp_path):
    (tmp_path / "manifest.yaml").write_text("sesion: typo\n")
    with pytest.raises(ConfigError, match="manifest.yaml: unknown key 'sesion'; allowed: ") as e:
        manifest_of(tmp_path / "trace_sync.json.gz", tmp_path)
    assert "\n" not in str(e.value)
    (tmp_path / "manifest.yaml").write_text("quirks:\n  cold_first_step: maybe\n")
    with pytest.raises(ConfigError, match="quirks.cold_first_step='maybe'; allowed: true or false"):
        manifest_of(tmp_path / "trace_sync.json.gz", tmp_path)


def test_model_holdout_fits_on_the_other_model_only(stack, tmp_path):
    # one call: one host speed, so what differs between the fit and the held-out run is the model
    out = _validate(stack, tmp_path, "extra.holdout=model", traces="call_a/*")
    assert len(out["runs"]) == len(MODELS) * len(BATCHES) * 2
    for r in out["runs"]:
        assert r["held_out_by"] == "model"
        assert r["fit_on"] and not any(f"/{r['model']}_bs" in name for name in r["fit_on"])
        # the same costs on another GEMM shape: the roofline carries them over
        assert abs(r["errors"]["total_time_pct"]) < 3.0, (r["name"], r["errors"])
    sp = out["summary"]["speedup"]
    assert sp["workloads"] == len(MODELS) * len(BATCHES)
    assert sp["within_target"] == sp["workloads"], out["speedups"]


def test_call_holdout_predicts_one_call_from_the_other_inside_the_band(stack, tmp_path):
    out = _validate(
        stack,
        tmp_path,
        "extra.holdout=call",
        "hardware.host.spread.draws=5",
        "hardware.model_error.gpu_idle=0.2",
        traces="*/llama3_1b_*",
    )
    assert len(out["runs"]) == len(CALLS) * len(BATCHES) * 2
    for r in out["runs"]:
        other = "call_a" if r["call"] == "call_b" else "call_b"
        assert r["held_out_by"] == "call"
        assert r["fit_on"] and all(f"/{other}/" in name for name in r["fit_on"])
        lo, hi = r["band"]["gpu_idle_fraction"]
        assert lo <= r["sim"]["gpu_idle_fraction"] <= hi
        if r["engine"] == "sync":
            # a 20% slower host lies inside the profile's between-call spread (0.29 in log): the
            # sync loop's idle is host time
            assert r["in_band"]["gpu_idle_fraction"], (r["name"], r["band"], r["real"])
        assert r["within_target"]["gpu_idle_pp"], (r["name"], r["errors"], r["band"])
    assert all(
        p["band"] and p["band"][0] <= p["predicted"] <= p["band"][1] for p in out["speedups"]
    )
    bands = out["summary"]["bands"]
    assert bands["runs"] == len(out["runs"]) and bands["idle_half_width_pp_median"] > 0
    # the profile's model error widens every idle band beyond its draws' (the fits keep it)
    for r in out["runs"]:
        (lo, hi), (dlo, dhi) = r["band"]["gpu_idle_fraction"], r["draw_band"]["gpu_idle_fraction"]
        assert lo < dlo <= dhi < hi, (r["name"], r["band"], r["draw_band"])
    # and the error that would have held 90% of these runs is measured on the draws' bands
    need = bands["model_error_for_coverage"]
    assert set(need) == {"total_time", "gpu_idle", "speedup"} and min(need.values()) >= 0


def test_fit_sets_fall_back_to_the_run_when_nothing_else_differs(stack):
    recs = load(resolve_traces(["synthetic_run/call_a/*/trace_*.json.gz"], stack), stack)
    sets = fit_sets(recs, "call")  # one call only: each run from the others of its call
    assert {kind for _, kind in sets} == {"run"}
    assert all(i not in s for i, (s, _) in enumerate(sets))
    # a workload is its requests: held out with both engines and every model, one fit set each
    sets = fit_sets(recs, "workload")
    assert len({s for s, _ in sets}) == len(BATCHES)
    # within one call (one host's speed): the other workloads of that call only
    both = load(resolve_traces(["synthetic_run/*/*/trace_*.json.gz"], stack), stack)
    for i, (s, kind) in enumerate(fit_sets(both, "workload", same_call=True)):
        assert kind == "workload" and {both[j].call for j in s} == {both[i].call}


def test_extra_keys_are_declared_per_task():
    assert {"holdout", "recordings", "bands", "jobs"} <= set(EXTRA_KEYS["validate"])
    assert {"profile", "install", "recordings"} <= set(EXTRA_KEYS["calibrate"])
    for task in ("calibrate", "validate"):
        preset = OmegaConf.load(Path(__file__).parents[1] / "conf" / "experiment" / f"{task}.yaml")
        assert set(preset.extra) <= set(EXTRA_KEYS[task]), task


def test_validate_cli_leads_with_the_speedup_table(stack, tmp_path):
    out = tmp_path / "val"
    res = run_cli(
        [
            "+experiment=validate",
            f"extra.recordings={stack}",
            "trace=[synthetic_run/call_a/llama3_1b_bs*/trace_*.json.gz]",
            "extra.progress=false",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.index("async speedup per workload") < res.stdout.index("error of the")
    html = (out / "validation.html").read_text()
    assert html.index("Async speedup per workload") < html.index("Error per run")
    data = json.loads((out / "validation.json").read_text())
    assert len(data["speedups"]) == len(BATCHES)


def test_profile_holdout_does_not_claim_runs_were_held_out(stack, tmp_path):
    out = tmp_path / "prof"
    res = run_cli(
        [
            "+experiment=validate",
            f"extra.recordings={stack}",
            "trace=[synthetic_run/call_a/llama3_1b_bs4/trace_*.json.gz]",
            "extra.holdout=profile",
            "extra.progress=false",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    html = (out / "validation.html").read_text()
    assert "no run was held out of a fit made here" in html
    assert "held out" not in html.replace("no run was held out", "")
