"""A one-wave decode launch ends with its longest request (hardware.gpu.decode_uneven_share):
priced between the mean context's even batch and the longest's; launches of more programs and
even batches as the kernel table has them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from cost_shapes import Shape

from cbsim.api import compose
from cbsim.costs import CostModel

REPO = Path(__file__).resolve().parents[1]


def model(share: float, programs: int = 256) -> CostModel:
    cfg = compose("model=llama3_8b", "workload.prompt_len=4096", "workload.gen_len=256")
    gpu = dataclasses.replace(
        cfg.hardware.gpu, decode_wave_programs=programs, decode_uneven_share=share
    )
    return CostModel(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, gpu=gpu)))


def attention(m: CostModel, ctx: list[int]) -> float:
    step = Shape([1] * len(ctx), ctx)
    pad = m.graph_size(len(ctx))
    return m.forward(step, graph=True, carry_over=False, padded_requests=pad).attention_us


@pytest.mark.parametrize("share", [0.3, 0.59, 1.0])
def test_a_one_wave_launch_pays_its_share_toward_the_longest(share):
    uneven = [1000] * 8 + [3000] * 8  # 16 rows of the 8B: 16 x 8 kv heads x 2 splits = 256
    assert model(share).uneven_share(Shape([1] * 16, uneven), 16) == share
    # the same graph (its table as wide as the longest request's class) either way
    longest = attention(model(0.0), [3000] * 16)
    got = attention(model(share), uneven)
    at_mean = attention(model(0.0), uneven)
    assert got == pytest.approx(at_mean + share * (longest - at_mean), rel=1e-6)
    assert at_mean < got <= longest * (1 + 1e-9)


def test_even_batches_and_launches_of_more_programs_are_as_the_table_has_them():
    even = [2500] * 16
    assert attention(model(0.59), even) == attention(model(0.0), even)
    wide = [1000] * 24 + [3000] * 24  # 48 rows: 384 programs, more than one wave
    assert model(0.59).uneven_share(Shape([1] * 48, wide), 48) == 0.0
    assert attention(model(0.59), wide) == attention(model(0.0), wide)
    # no wave counted (decode_wave_programs 0): the mean context, every launch
    uneven = [1000] * 8 + [3000] * 8
    assert attention(model(0.59, programs=0), uneven) == attention(model(0.0), uneven)


def test_the_default_profile_carries_what_its_command_measures():
    """conf/hardware/h200.yaml's decode_uneven_share is what measure_uneven_share gives over
    the async Poisson runs of the sets the profile was fitted on."""
    from cbsim.calibration.recordings import load, recordings_root, resolve_traces
    from cbsim.calibration.uneven import measure_uneven_share

    root = recordings_root(str(REPO / "experiments" / "recordings"))
    hw = compose("hardware=h200").hardware
    paths = resolve_traces(["h200/fit_*/*poisson*/trace_async.json.gz"], root)
    share, runs = measure_uneven_share(load(paths, root), hw)
    assert runs == 7
    assert hw.gpu.decode_uneven_share == pytest.approx(share, abs=0.005)
