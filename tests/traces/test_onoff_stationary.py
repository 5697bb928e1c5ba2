"""On/off arrivals start in their stationary state: the expected count in any window is rps x its length
(they started at the beginning of an on period, and short windows overshot the requested --rps)."""

from __future__ import annotations

import numpy as np
import pytest

from traces import arrivals as arr


@pytest.mark.parametrize("duration_s,reps,tol", [
    (300.0, 2000, 0.06),   # was 2.15 req/s (+7.6 %); the standard error of the mean here is ~0.02
    (30.0, 2000, 0.15),    # was 3.46 req/s (+73 %); standard error ~0.05
])
def test_onoff_mean_count_is_rate_times_window(duration_s, reps, tol):
    rng = np.random.default_rng(0)
    counts = np.array([arr.onoff(2.0, rng, duration_s, on_s=10.0, off_s=30.0).size for _ in range(reps)])
    rate = counts.mean() / duration_s
    assert abs(rate - 2.0) < tol, rate


def test_onoff_starts_on_with_the_stationary_probability():
    """With silent off periods, a window much shorter than a period holds requests iff it starts on: a
    quarter of the time for on_s=10, off_s=30 (it was always)."""
    rng = np.random.default_rng(1)
    any_in_first = np.array([arr.onoff(100.0, rng, 0.5, on_s=10.0, off_s=30.0).size > 0 for _ in range(4000)])
    assert abs(any_in_first.mean() - 0.25) < 0.03


def test_onoff_with_off_frac_keeps_the_rate_in_short_windows():
    rng = np.random.default_rng(2)
    counts = np.array([arr.onoff(4.0, rng, 20.0, on_s=5.0, off_s=20.0, off_frac=0.5).size for _ in range(3000)])
    assert abs(counts.mean() / 20.0 - 4.0) < 0.15


def test_onoff_without_off_periods_is_poisson_at_rps():
    rng = np.random.default_rng(3)
    counts = np.array([arr.onoff(3.0, rng, 10.0, on_s=5.0, off_s=0.0).size for _ in range(3000)])
    assert abs(counts.mean() / 10.0 - 3.0) < 0.1
    assert abs(counts.var() / counts.mean() - 1.0) < 0.1  # (Poisson: variance = mean)
