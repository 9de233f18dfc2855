"""The held-out means' own error (cbsim.validation.noise): the chi-square tail against known
quantiles, and the misses over each mean's error."""

import math

import pytest

from cbsim.validation.noise import chi2_sf, mean_error, means_noise


@pytest.mark.parametrize(
    "x, dof, p",
    [
        (3.841459, 1, 0.05),  # the textbook 95% quantiles
        (5.991465, 2, 0.05),
        (7.814728, 3, 0.05),
        (15.507313, 8, 0.05),
        (18.307038, 10, 0.05),
        (6.634897, 1, 0.01),
        (20.090235, 8, 0.01),
        (0.0, 4, 1.0),
    ],
)
def test_chi2_tail_matches_the_quantile_tables(x, dof, p):
    assert chi2_sf(x, dof) == pytest.approx(p, rel=1e-5, abs=1e-12)


def test_chi2_tail_falls_and_refuses_no_dof():
    tails = [chi2_sf(x, 5) for x in (0.5, 2.0, 8.0, 30.0)]
    assert tails == sorted(tails, reverse=True) and tails[-1] < 1e-4
    with pytest.raises(ValueError, match="dof"):
        chi2_sf(1.0, 0)


def test_misses_are_measured_against_each_means_own_error():
    # workload a: std 0.02 over 4 repeats (mean's error 1 point), missed by 3 points
    # workload b: std 0.06 over 9 (2 points), missed by -1; c: one repeat, no error to judge by
    out = means_noise([3.0, -1.0, 5.0], [0.02, 0.06, None], [4, 9, 1])
    assert out["z"][2] is None
    assert out["z"][:2] == pytest.approx([3.0, -0.5])
    assert out["rmse_points"] == pytest.approx(math.sqrt((1.0 + 4.0) / 2))
    assert out["dof"] == 2 and out["chi2"] == pytest.approx(9.25)
    assert out["p"] == pytest.approx(math.exp(-9.25 / 2))  # two dof: the tail is exp(-x/2)
    assert mean_error(None, 5) is None and mean_error(0.1, 1) is None


def test_no_repeats_leave_nothing_to_judge_by():
    out = means_noise([1.0, None], [None, None], [1, 1])
    assert out["rmse_points"] is None and out["chi2"] is None and out["p"] is None
    assert out["dof"] == 0
