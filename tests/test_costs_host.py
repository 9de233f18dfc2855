"""The host phases' cost form over requests, tokens and KV blocks (batch 1 to 256)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from cbsim.config import ConfigError
from cbsim.config.schema import CbsimConfig, HostCosts, PhaseCost
from cbsim.costs import CostModel


def test_the_form_adds_each_term_with_its_count():
    p = PhaseCost(
        fixed_us=10.0,
        per_request_us=2.0,
        per_token_us=0.5,
        per_block_us=0.1,
        per_request_sq_us=0.01,
    )
    assert p.cost(256, 300, 1000) == pytest.approx(10 + 2 * 256 + 0.01 * 256**2 + 0.5 * 300 + 100)
    assert p.cost(1, 1, 0) == pytest.approx(10 + 2 + 0.01 + 0.5)


def test_positional_terms_keep_their_meaning():
    assert PhaseCost(100.0, 10.0, 0.5, 0.2) == PhaseCost(
        fixed_us=100.0, per_request_us=10.0, per_token_us=0.5, per_block_us=0.2
    )


def test_a_quadratic_term_bends_the_cost_past_the_fitted_range():
    linear = PhaseCost(fixed_us=50.0, per_request_us=1.0)
    bent = dataclasses.replace(linear, per_request_sq_us=0.004)
    assert bent.cost(16, 16) - linear.cost(16, 16) < 2.0  # hardly visible at small batches
    assert bent.cost(256, 256) > 1.8 * linear.cost(256, 256)


def test_the_cost_model_charges_the_profile_form():
    cfg = CbsimConfig()
    cfg.hardware.host = HostCosts(prepare=PhaseCost(fixed_us=5.0, per_request_sq_us=0.01))
    assert CostModel(cfg).prepare_us(100, 100, 0) == pytest.approx(5.0 + 100.0)


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan])
def test_a_bad_term_names_its_key(value):
    with pytest.raises(ConfigError, match=r"hardware\.host\.schedule\.per_request_sq_us="):
        HostCosts(schedule=PhaseCost(per_request_sq_us=value))


def test_the_fit_columns_are_the_cost_form():
    """PhaseCost.counts gives a fit one column per coefficient, in the form cost() charges."""
    p = PhaseCost(3.0, 0.7, 0.11, 0.05, 0.002)
    for r, t, b in [(1, 1, 1), (32, 32, 900), (256, 4096, 20000)]:
        counts = PhaseCost.counts(r, t, b)
        assert set(counts) == {f.name for f in dataclasses.fields(PhaseCost)}
        assert sum(getattr(p, k) * v for k, v in counts.items()) == pytest.approx(p.cost(r, t, b))


def test_a_step_with_prompt_tokens_pays_the_prefill_step_once():
    cost = PhaseCost(fixed_us=10.0, per_token_us=0.5, per_prefill_step_us=100.0)
    assert cost.cost(8, 8) == 10.0 + 4.0  # decode: a token per request
    assert cost.cost(8, 9) == 10.0 + 4.5 + 100.0  # one prompt token beyond: a prefill step
    assert cost.cost(2, 2048) == 10.0 + 1024.0 + 100.0
    counts = PhaseCost.counts(np.array([8, 8, 2]), np.array([8, 9, 2048]))
    assert counts["per_prefill_step_us"].tolist() == [0.0, 1.0, 1.0]
