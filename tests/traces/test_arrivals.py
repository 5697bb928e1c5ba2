"""Arrival processes: the rate, CV and shape each one promises."""

from __future__ import annotations


import numpy as np
import pytest

from traces import arrivals as arr


def test_poisson_rate_and_cv():
    t = arr.poisson(10.0, np.random.default_rng(1), duration_s=2000.0)
    assert abs(t.size / 2000.0 - 10.0) / 10.0 < 0.02          # 20,000 expected, sd 0.7 %
    assert abs(arr.interarrival_cv(t) - 1.0) < 0.03
    assert np.all(np.diff(t) >= 0) and t.max() < 2000.0


def test_poisson_exact_count():
    t = arr.poisson(5.0, np.random.default_rng(2), n=1234)
    assert t.size == 1234 and np.all(np.diff(t) > 0)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv(cv):
    t = arr.gamma_renewal(20.0, cv, np.random.default_rng(3), n=60_000)
    assert abs(arr.interarrival_cv(t) - cv) / cv < 0.05
    assert abs(t.size / t[-1] - 20.0) / 20.0 < 0.05


def test_gamma_duration_window():
    t = arr.gamma_renewal(8.0, 3.0, np.random.default_rng(4), duration_s=5000.0)
    assert t.max() < 5000.0
    assert abs(t.size / 5000.0 - 8.0) / 8.0 < 0.1


def test_onoff_mean_rate_and_burstiness():
    rng = np.random.default_rng(5)
    t = arr.onoff(4.0, rng, duration_s=200_000.0, on_s=10.0, off_s=30.0)
    assert abs(t.size / 200_000.0 - 4.0) / 4.0 < 0.06
    assert arr.interarrival_cv(t) > 1.5                       # bursts: much burstier than Poisson
    # off periods are silent: many gaps much longer than the mean gap
    assert (np.diff(t) > 10.0).sum() > 100


def test_onoff_off_frac_one_is_poisson():
    t = arr.onoff(4.0, np.random.default_rng(6), 10_000.0, on_s=10, off_s=30, off_frac=1.0)
    assert abs(arr.interarrival_cv(t) - 1.0) < 0.05


def test_per_adapter_rates_round_robin():
    rng = np.random.default_rng(7)
    t, ids, rates = arr.per_adapter_poisson([0.1, 0.05, 0.025], 30, 20_000.0, rng)
    assert sorted(np.unique(rates).tolist()) == [0.025, 0.05, 0.1]
    assert all((rates == r).sum() == 10 for r in (0.1, 0.05, 0.025))
    counts = np.bincount(ids, minlength=30)
    for r in (0.1, 0.05, 0.025):
        est = counts[rates == r].sum() / (10 * 20_000.0)
        assert abs(est - r) / r < 0.05
    assert np.all(np.diff(t) >= 0)
    # each adapter's stream is Poisson: inter-arrival CV ~ 1
    a0 = t[ids == int(np.argmax(rates))]
    assert abs(arr.interarrival_cv(a0) - 1.0) < 0.1


def test_per_adapter_no_shuffle_is_plain_round_robin():
    r = arr.assign_rates_round_robin([3, 2, 1], 7, None, shuffle=False)
    assert r.tolist() == [3, 2, 1, 3, 2, 1, 3]


def test_per_adapter_arrivals_of_the_overloaded_hour():
    """The overloaded hour's 1.3 M per-adapter arrivals (their generation time is a benchmark's figure,
    ``benchmarks/bench_speed.py``, never a test's)."""
    rng = np.random.default_rng(8)
    t, ids, _ = arr.per_adapter_poisson([1.6, 0.8, 0.4], 384, 3600.0, rng)
    assert 1.25e6 < t.size < 1.33e6
    assert (np.diff(t) >= 0).all() and 0 <= t.min() and t.max() < 3600.0 and ids.min() == 0 and ids.max() == 383


def test_rescale_keeps_shape():
    rng = np.random.default_rng(9)
    prof = np.r_[np.ones(10), 3 * np.ones(10), 0.5 * np.ones(10)]
    t = arr.profiled_renewal(5.0, 1.5, prof, 60.0, 1800.0, rng)
    t2, factor = arr.rescale_to_rps(t, 20.0)
    assert abs(t2.size / t2.max() - 20.0) < 1e-9
    assert factor == pytest.approx((t.size / (t.max() - t.min())) / 20.0)
    assert arr.interarrival_cv(t2) == pytest.approx(arr.interarrival_cv(t - t.min()), rel=1e-9)
    p1 = arr.rate_profile(t - t.min(), (t.max() - t.min()) / 30)
    p2 = arr.rate_profile(t2, t2.max() / 30)
    np.testing.assert_allclose(p1, p2, atol=1e-9)


def test_profiled_renewal_follows_profile():
    rng = np.random.default_rng(10)
    prof = np.array([0.5, 1.5] * 5)
    t = arr.profiled_renewal(10.0, 1.0, prof, 100.0, 1000.0, rng)
    got = arr.rate_profile(t, 100.0, 1000.0)
    np.testing.assert_allclose(got, prof, rtol=0.12)


def test_time_window():
    t = np.arange(100.0)
    m = arr.time_window(t, 10.0, 20.0)
    assert t[m].min() == 10.0 and t[m].max() == 29.0 and m.sum() == 20


@pytest.mark.parametrize("bad", [dict(rps=0.0, duration_s=10), dict(rps=1.0), dict(rps=1.0, duration_s=5, n=5)])
def test_bad_parameters_raise(bad):
    rps = bad.pop("rps")
    with pytest.raises(arr.ArrivalError):
        arr.poisson(rps, np.random.default_rng(0), **bad)


@pytest.mark.parametrize("call, error, message", [
    (lambda g: arr.poisson(1.0, 0, duration_s=10), TypeError, "rng: got int; give a numpy.random.Generator"),
    (lambda g: arr.per_adapter_poisson([1.0], 3, 10.0, None), TypeError, "rng: got NoneType"),
    (lambda g: arr.poisson("1", g, duration_s=10), arr.ArrivalError, "arrival rate must be > 0"),
    (lambda g: arr.poisson(1.0, g, duration_s="3"), arr.ArrivalError, "duration_s must be > 0"),
    (lambda g: arr.poisson(1.0, g, n=2.5), arr.ArrivalError, "whole number"),       # was truncated to 2
    (lambda g: arr.poisson(1.0, g, n=float("nan")), arr.ArrivalError, "whole number"),
    (lambda g: arr.poisson(1e12, g, duration_s=1e6), arr.ArrivalError, "check the units"),  # was a MemoryError
    (lambda g: arr.gamma_renewal(1.0, 1e6, g, duration_s=10), arr.ArrivalError, "cv must be in"),  # was a hang
    (lambda g: arr.gamma_renewal(1.0, 1e-200, g, duration_s=10), arr.ArrivalError, "cv must be in"),
    (lambda g: arr.onoff(1.0, g, 10, on_s=float("nan")), arr.ArrivalError, "finite on_s > 0"),
    (lambda g: arr.onoff(1.0, g, 10, off_s=float("inf")), arr.ArrivalError, "finite on_s > 0"),
    (lambda g: arr.onoff(1.0, g, 10, on_s=1e-300, off_s=0), arr.ArrivalError, "periods"),
    (lambda g: arr.assign_rates_round_robin([1.0], 2.5, g), arr.ArrivalError, "n_adapters must be a whole"),
    (lambda g: arr.assign_rates_round_robin("abc", 3, g), arr.ArrivalError, "non-empty list of positive"),
    (lambda g: arr.cumulative_intensity([np.nan, 1.0], 1.0, 10), arr.ArrivalError, "finite non-negative"),
    (lambda g: arr.rescale_to_rps(np.array([0.0, np.nan, 2.0]), 1.0), arr.ArrivalError, "must be finite"),
    (lambda g: arr.rate_profile(np.array([0.0, 1.0]), 0), arr.ArrivalError, "bin_s must be"),
    (lambda g: arr.rate_profile(np.array([0.0, 1e6]), 1e-9), arr.ArrivalError, "bins"),
])
def test_odd_arguments_are_refused_before_any_draw(call, error, message):
    with pytest.raises(error, match=message):
        call(np.random.default_rng(0))


def test_the_widest_cv_still_fills_its_window():
    t = arr.gamma_renewal(1.0, arr.MAX_CV, np.random.default_rng(0), duration_s=600.0)
    assert t.size and t.max() < 600.0


def test_per_adapter_interarrival_cv():
    """The median CV of each adapter's own gaps: the gamma streams' CV, 1 for Poisson streams, base-model requests
    and adapters with too few requests left out."""
    rng = np.random.default_rng(9)
    rates = np.full(40, 0.2)
    for proc, want in (("gamma:3", 3.0), ("poisson", 1.0)):
        t, ids = arr.per_adapter_arrivals(rates, 3000.0, arr.parse_arrival(proc), rng)
        cv, n = arr.per_adapter_interarrival_cv(t, ids)
        assert n == 40 and abs(cv - want) / want < 0.15, (proc, cv)
        none = arr.per_adapter_interarrival_cv(t, np.full(len(ids), -1))
        assert np.isnan(none[0]) and none[1] == 0
    # one adapter's gaps by hand: 0, 1, 3, 6 -> gaps 1, 2, 3 (CV = std / mean = 0.8165 / 2); the other has 2 requests
    t = np.array([0.0, 1.0, 3.0, 6.0, 2.0, 5.0, 0.5])
    ids = np.array([0, 0, 0, 0, 1, 1, -1])
    cv, n = arr.per_adapter_interarrival_cv(t, ids, min_requests=3)
    assert n == 1 and cv == pytest.approx(np.std([1, 2, 3]) / 2)
    assert arr.per_adapter_interarrival_cv(t, ids, min_requests=5)[1] == 0
