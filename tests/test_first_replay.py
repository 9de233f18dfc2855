"""A captured graph's first launch (hardware.host.graph_first_replay_us_per_kernel): with
engine.upload_graphs=false each IO slot's first launch of a batch bucket's graph takes that much
more host time per graph node, once per run; later launches, eager steps and a zero value are as
before. With engine.upload_graphs (the default) the capture launched every graph: no step pays."""

from __future__ import annotations

import dataclasses

import numpy as np
from sim_harness import make, spans

from cbsim.costs import CostModel
from cbsim.sim.engine import run
from cbsim.trace import schema as S


def _graph_launches(trace) -> np.ndarray:
    launch = spans(trace, S.HOST, S.LAUNCH).set_index("step").dur
    graphs = spans(trace, name=S.GRAPH_REPLAY).sort_values("ts")
    return launch.loc[graphs.step].to_numpy()


def _extra_launch_us(
    engine: str, graph_width_classes: bool = True, upload_graphs: bool = False, **workload
):
    """Each graph step's launch with a first-launch cost of 2 us per node minus without it, and
    the config (the 1B shape)."""
    launches = []
    # the decode graphs' first launches (the prompt steps' graphs off: eager)
    eng = {"name": engine, "graph_width_classes": graph_width_classes, "mixed_graphs": "off"}
    eng["upload_graphs"] = upload_graphs
    for us in (0.0, 2.0):
        cfg = make("llama3_1b", engine=eng, **workload)
        host = dataclasses.replace(cfg.hardware.host, graph_first_replay_us_per_kernel=us)
        cfg.hardware = dataclasses.replace(cfg.hardware, host=host)
        launches.append(_graph_launches(run(cfg, engine)))
    return launches[1] - launches[0], cfg


def test_each_slots_first_graph_launch_costs_its_nodes_once():
    for engine, slots in (("sync", 1), ("async", 2)):
        extra, cfg = _extra_launch_us(engine, batch_size=4, gen_len=24)
        costs = CostModel(cfg)
        nodes = costs.kernels + cfg.hardware.gpu.decode_kernels_per_layer * costs.layers
        assert len(extra) > slots + 4
        # the carry-over scatter is a node of an async graph
        per = nodes + (1 if engine == "async" else 0)
        assert np.allclose(extra[:slots], 2.0 * per, rtol=0.02), (engine, extra[:4], per)
        assert np.allclose(extra[slots:], 0.0, atol=1e-6), engine


def test_a_smaller_bucket_later_in_the_run_pays_its_own_first_launch():
    # requests finish at different lengths: the batch falls to smaller graph buckets
    extra, cfg = _extra_launch_us(
        "sync", batch_size=4, gen_len=24, gen_dist="uniform", gen_spread=0.6
    )
    paid = extra > 1.0
    assert 2 <= paid.sum() <= len(cfg.engine.graph_batch_sizes)


def test_a_graph_per_table_width_pays_a_first_launch_where_the_context_crosses_a_class():
    """engine.graph_width_classes: the longest request crosses 1024 tokens (the decode kernel's
    first launch class at 4 requests), so each slot launches a second graph there; with one
    width per bucket it does not."""
    paid = {}
    for on in (True, False):
        extra, cfg = _extra_launch_us(
            "sync", batch_size=4, prompt_len=1000, gen_len=48, graph_width_classes=on
        )
        paid[on] = np.flatnonzero(extra > 1.0)
    assert paid[False].tolist() == [0]
    # step s decodes context 1001 + s: the one at 1025 tokens replays the wider graph first
    assert paid[True].tolist() == [0, 24]


def test_graphs_launched_at_capture_pay_nothing_in_a_step():
    for engine in ("sync", "async"):
        extra, _ = _extra_launch_us(engine, upload_graphs=True, batch_size=4, gen_len=24)
        assert np.allclose(extra, 0.0, atol=1e-6), engine


def test_a_recording_says_whether_its_build_launched_the_graphs_at_capture():
    """otherData.graphs_uploaded: true where the build did; builds before the key paid each
    graph's first launch in a step, and are simulated so."""
    from pathlib import Path

    from cbsim.calibration.recordings import Recorded, load

    root = Path(__file__).resolve().parents[1] / "cbsim" / "recorded"
    path = sorted(root.glob("h200/six_workloads/*/trace_async.json.gz"))[0]
    (old,) = load([path], root)
    assert "graphs_uploaded" not in old.trace.other_data
    assert old.config.engine.upload_graphs is False
    old.trace.other_data["graphs_uploaded"] = True
    assert Recorded(path, old.trace, root).config.engine.upload_graphs is True
