"""The continuation kernel's walk: per element of its widest table that each kv head's program
walks (table tokens x head dim), layer after layer."""

from __future__ import annotations

import dataclasses

import pytest
from cost_shapes import Shape
from test_kernel_tables import config

from cbsim.costs import CostModel


def with_gpu(cfg, **gpu):
    cfg.hardware = dataclasses.replace(
        cfg.hardware, gpu=dataclasses.replace(cfg.hardware.gpu, **gpu)
    )
    return cfg


def decode(requests, context):
    return Shape([1] * requests, [context] * requests)


def test_the_continuation_walk_grows_with_layers_and_head_dim():
    """A 20-token chunk after 8000 cached tokens: the walk is per element each kv head's program
    walks, table tokens x head dim, layer after layer; 0 walks nothing."""
    step = Shape([1, 20], [300, 8020], kind="mixed")
    width = -(-8020 // 16) * 16

    def walk(**model):
        cfg = with_gpu(config(**model), prefix_walk_us_per_element=1e-3)
        return CostModel(cfg).prefix_walk_us(step)

    assert walk() == pytest.approx(1e-3 * width * 32 * 128)
    assert walk(num_layers=16, head_dim=64, num_heads=32) == pytest.approx(walk() / 4)
    none = CostModel(with_gpu(config(), prefix_walk_us_per_element=0.0))
    assert none.prefix_walk_us(step) == 0.0
    # as decode rows (engine.continuation_decode_max >= 20) the chunk walks no masked table
    cfg = with_gpu(config(), prefix_walk_us_per_element=1e-3)
    cfg.engine = dataclasses.replace(cfg.engine, continuation_decode_max=20)
    assert CostModel(cfg).prefix_walk_us(step) == 0.0
