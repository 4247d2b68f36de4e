"""``link_rate.rate_of_loads``: what counts as loaded, the rate of no load, NaN and zero."""

from __future__ import annotations

import math

import numpy as np

from mccl_opt.link_rate import LOAD_NOISE, rate_of_loads


def test_the_rate_is_the_tightest_loaded_link():
    rng = np.random.default_rng(7)
    cap = rng.uniform(1.0, 400.0, 50)
    loads = rng.uniform(0.0, 3.0, 50)
    loads[::5] = 0.0
    used = loads > 0
    # the independent form the validator uses: 1 / max_a L_a / cap_a
    assert math.isclose(rate_of_loads(cap, loads), 1.0 / np.max(loads[used] / cap[used]),
                        rel_tol=1e-15)


def test_noise_and_idle():
    cap = np.array([100.0, 1e-12, 50.0])
    loads = np.array([2.0, 1e-13, 0.0])            # the narrow link carries only noise
    assert rate_of_loads(cap, loads) == 1e-12 / 1e-13
    assert rate_of_loads(cap, loads, noise=LOAD_NOISE) == 50.0
    assert rate_of_loads(cap, np.zeros(3)) == math.inf
    assert rate_of_loads(cap, np.zeros(3), idle=0.0) == 0.0


def test_nan_load_is_unloaded_nan_capacity_is_nan_zero_capacity_is_zero():
    cap = np.array([100.0, 10.0])
    assert rate_of_loads(cap, np.array([1.0, math.nan])) == 100.0
    assert math.isnan(rate_of_loads(np.array([math.nan, 10.0]), np.array([1.0, 1.0])))
    assert rate_of_loads(np.array([0.0, 10.0]), np.array([1.0, 1.0])) == 0.0
