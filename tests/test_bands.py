"""Bands: seeded and deterministic, ordered P5 <= median <= P95, as wide as the measured host
spread says (between calls, within a run, the host's two levels over time), and exactly the plain
simulation when the profile has no spread. On the unfitted profile, whose spread each test sets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import UNFITTED, make_config

from cbsim.bands import (
    as_engine,
    drawn_profiles,
    format_bands,
    predict_bands,
    scaled_host,
    speed_factors,
)
from cbsim.config import ConfigError
from cbsim.config.hardware import GpuSpread, HostCosts, HostRegimes, HostSpread
from cbsim.costs import CostModel
from cbsim.metrics import compute_metrics
from cbsim.sim import run

SMALL = ["model=tiny", "workload.batch_size=4", "workload.prompt_len=32", "workload.gen_len=48"]


def config(between=0.0, within=0.0, draws=5, seed=0, extra=(), regimes=None, small=SMALL):
    cfg = make_config([*UNFITTED, *small, *extra])
    spread = HostSpread(between_calls=between, within_run=within, draws=draws, seed=seed)
    host = dataclasses.replace(cfg.hardware.host, spread=spread, regimes=regimes or HostRegimes())
    return dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, host=host))


def ordered(band):
    return band["p5"] <= band["median"] <= band["p95"]


def test_bands_are_deterministic_and_ordered():
    cfg = config(between=0.3, within=0.2)
    a, b = predict_bands(cfg), predict_bands(cfg)
    assert a == b
    for engine in ("sync", "async"):
        for metric in ("total_time_s", "gpu_idle_fraction"):
            assert ordered(a[engine][metric]), (engine, metric)
    assert ordered(a["speedup"])
    assert a["sync"]["total_time_s"]["p5"] < a["sync"]["total_time_s"]["p95"]
    assert predict_bands(config(between=0.3, within=0.2, seed=1)) != a


@pytest.mark.parametrize("name", ["sync", "async"])
def test_no_spread_gives_the_plain_simulation_as_a_point(name):
    """Both engines are banded whatever engine.name says (a sync config, carry-over off)."""
    off = ["engine.carry_over=false"] if name == "sync" else []
    cfg = config(extra=[f"engine={name}", *off])
    bands = predict_bands(cfg)
    for engine in ("sync", "async"):
        plain = compute_metrics(run(as_engine(cfg, engine), engine))
        for metric in ("total_time_s", "gpu_idle_fraction"):
            got = bands[engine][metric]
            assert got["p5"] == got["median"] == got["p95"] == pytest.approx(plain[metric])


def test_a_wider_host_spread_gives_a_wider_band():
    narrow = predict_bands(config(between=0.05))["sync"]["total_time_s"]
    wide = predict_bands(config(between=0.5))["sync"]["total_time_s"]
    assert wide["p95"] - wide["p5"] > 2 * (narrow["p95"] - narrow["p5"]) > 0


def test_speed_factors_are_stratified_around_one():
    f = speed_factors(0.3, 9, seed=0)
    assert f == speed_factors(0.3, 9, seed=0)
    assert f == sorted(f) and f[0] < 1 < f[-1]
    assert speed_factors(0.0, 4, seed=3) == [1.0] * 4


def test_a_draw_scales_every_host_cost_and_nothing_else():
    host = HostCosts()
    host.prepare.per_request_us = 4.0
    slow = scaled_host(host, 2.0, seed=7)
    assert slow.prepare.per_request_us == 8.0
    assert slow.graph_launch_us == 2 * host.graph_launch_us
    assert slow.sync_wake_us == 2 * host.sync_wake_us
    assert slow.stall_every_steps == host.stall_every_steps
    assert slow.spread.jitter and slow.spread.seed == 7


def test_within_run_jitter_keeps_the_mean_and_only_runs_in_a_draw():
    cfg = config(within=0.3)
    assert CostModel(cfg).jitter is None  # a plain run keeps the mean costs
    host = dataclasses.replace(cfg.hardware.host, spread=HostSpread(within_run=0.3, jitter=True))
    cm = CostModel(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, host=host)))
    mean = cfg.hardware.host.prepare.cost(8, 8)
    draws = []
    for _ in range(20000):
        cm.schedule_us(8, 8)  # a step starts: a new factor
        draws.append(cm.prepare_us(8, 8))
        assert cm.update_us(8, 8) / cfg.hardware.host.update.cost(8, 8) == pytest.approx(
            draws[-1] / mean
        )  # one factor for the phases of a step
    assert sum(draws) / len(draws) == pytest.approx(mean, rel=0.02)
    assert min(draws) < 0.7 * mean < 1.4 * mean < max(draws)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"between_calls": -0.1}, "between_calls"),
        ({"within_run": float("nan")}, "within_run"),
        ({"draws": 0}, "draws"),
    ],
)
def test_a_bad_spread_names_its_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"hardware\.host\.spread\.{key}="):
        HostSpread(**kwargs)


def test_a_plain_run_is_the_same_with_or_without_a_spread_in_the_profile():
    """The spread only enters a band's draws: the simulation itself keeps the mean costs."""
    with_spread = config(between=0.29, within=0.23)
    without = config()
    for engine in ("sync", "async"):
        a = compute_metrics(run(with_spread, engine))
        b = compute_metrics(run(without, engine))
        assert a == b


def test_the_printed_band_shows_each_quantile():
    text = format_bands(predict_bands(config(between=0.3, draws=3)))
    assert text.startswith("band: P5 / median / P95 over 3 draws")
    assert text.count(" / ") >= 10 and "async speedup x" in text


def test_the_forward_error_widens_the_async_band_and_hardly_the_speedup():
    """A GPU-bound async run does not move with the host; the model's own error moves it, in
    both engines of a draw alike (so the speedup's band barely changes)."""
    gpu_bound = ["model=llama3_8b", *SMALL[1:]]  # seconds of forwards, not the tiny model's
    cfg = make_config([*UNFITTED, *gpu_bound])
    host = dataclasses.replace(cfg.hardware.host, spread=HostSpread(between_calls=0.3, draws=5))
    cfg = dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, host=host))
    host_only = predict_bands(cfg)
    gpu = dataclasses.replace(cfg.hardware.gpu, spread=GpuSpread(forward_error=0.05))
    both = predict_bands(
        dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpu=gpu))
    )
    width = lambda b: b["p95"] - b["p5"]  # noqa: E731
    assert width(both["async"]["total_time_s"]) > width(host_only["async"]["total_time_s"])
    assert ordered(both["async"]["total_time_s"]) and ordered(both["speedup"])
    assert both["forward_error"] == 0.05 and host_only["forward_error"] == 0.0


def test_the_forward_scale_multiplies_every_forward_term():
    cfg = config()
    base = CostModel(cfg)
    gpu = dataclasses.replace(cfg.hardware.gpu, spread=GpuSpread(forward_scale=1.1))
    slow = CostModel(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpu=gpu)))

    class Decode:
        query_lens = np.ones(4, dtype=np.int64)
        context_lens = np.full(4, 100, dtype=np.int64)
        start_pos = context_lens - 1
        query_tokens, kv_tokens, num_samples, num_requests, kind = 4, 400, 4, 4, "decode"

        def __len__(self):
            return 4

    a = base.forward(Decode(), graph=True, carry_over=True)
    b = slow.forward(Decode(), graph=True, carry_over=True)
    assert b.total_us == pytest.approx(1.1 * a.total_us) and b.kernels == a.kernels


def width(b):
    return b["p95"] - b["p5"]


# the 1B shape at batch 1, sync: the GPU idles while the host works, so the host's level shows
ONE_B = ["model=llama3_1b", "workload.batch_size=1", "workload.prompt_len=128"]
TWO_LEVELS = HostRegimes(slow_factor=2.2, fast_dwell_s=1.0, slow_dwell_s=0.6)


def test_the_host_levels_widen_a_sync_band_with_the_slow_factor():
    def idle_width(regimes):
        cfg = config(regimes=regimes, small=[*ONE_B, "workload.gen_len=1024"], draws=7)
        return width(predict_bands(cfg)["sync"]["gpu_idle_fraction"])

    one = idle_width(HostRegimes(slow_factor=1.0, slow_dwell_s=0.6))
    mild = idle_width(HostRegimes(slow_factor=1.5, fast_dwell_s=1.0, slow_dwell_s=0.6))
    strong = idle_width(TWO_LEVELS)
    assert one == 0.0 < mild < strong and strong > 0.02  # 2 pp and more of sync idle


def test_a_short_run_sees_few_switches_and_gets_a_wider_band_than_a_long_one():
    """Dwell times scaled to the run: a run shorter than one stay lands all fast or all slow,
    one of many stays spends about the slow share slow (a long run averages the levels out)."""
    regimes = HostRegimes(slow_factor=2.2, fast_dwell_s=0.05, slow_dwell_s=0.03)
    short = config(regimes=regimes, draws=9, small=[*SMALL[:3], "workload.gen_len=100"])
    long = config(regimes=regimes, draws=9, small=[*SMALL[:3], "workload.gen_len=1600"])
    b_short, b_long = predict_bands(short), predict_bands(long)
    for engine in ("sync", "async"):
        w_short = width(b_short[engine]["gpu_idle_fraction"])
        w_long = width(b_long[engine]["gpu_idle_fraction"])
        assert w_long < 0.6 * w_short, engine
    assert b_short["regimes"] == dataclasses.asdict(regimes)


def test_a_gpu_bound_async_band_barely_moves_with_the_host_levels():
    cfg = config(regimes=TWO_LEVELS, small=["model=llama3_8b", *SMALL[1:3], "workload.gen_len=400"])
    bands = predict_bands(cfg)
    sync_w = width(bands["sync"]["gpu_idle_fraction"])
    async_w = width(bands["async"]["gpu_idle_fraction"])
    assert async_w < 0.1 * sync_w and async_w < 0.002
    text = format_bands(bands)
    assert "a slow level x2.2 (mean stays 1 s fast, 0.6 s slow)" in text


def test_each_draw_is_its_own_host_realization_and_forward_error():
    """The draws predict_bands and the validation's bands both run (cbsim.bands.drawn_profiles)."""
    cfg = config(between=0.2, draws=4, regimes=TWO_LEVELS)
    gpu = dataclasses.replace(cfg.hardware.gpu, spread=GpuSpread(forward_error=0.05))
    draws = drawn_profiles(dataclasses.replace(cfg.hardware, gpu=gpu))
    assert len(draws) == 4 and len({d.host.spread.seed for d in draws}) == 4
    assert all(d.host.spread.jitter and d.host.regimes == TWO_LEVELS for d in draws)
    assert len({d.gpu.spread.forward_scale for d in draws}) == 4
    assert len({d.host.graph_launch_us for d in draws}) == 4
