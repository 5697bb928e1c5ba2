"""Length models: fixed sizes, ShareGPT-like with filters and matched means, lognormal, copula,
scaling and max-length filtering."""

from __future__ import annotations

import numpy as np
import pytest

from traces.lengths import (FIXED_SIZES, SHAREGPT_FILTER, CopulaLengths, EmpiricalLengths, FixedLengths, LengthConfig,
                            LengthError, LengthFilter, LognormalLengths, ShareGPTLengths, build_length_model,
                            load_fitted, sample_lengths, scale_lengths, sharegpt_like)


@pytest.mark.parametrize("size,pair", [("small", (23, 27)), ("medium", (250, 231)), ("large", (423, 358)),
                                       ("100/50", (100, 50))])
def test_fixed_sizes(size, pair):
    p, o = FixedLengths.named(size).sample(10, np.random.default_rng(0))
    assert (p == pair[0]).all() and (o == pair[1]).all()
    assert FIXED_SIZES["medium"] == (250, 231)


def test_fixed_bad_name():
    with pytest.raises(LengthError, match="small"):
        FixedLengths.named("huge")


def _check_filter(p, o):
    assert p.min() >= 4 and o.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048


def test_sharegpt_like_base_statistics():
    p, o = sharegpt_like(20_000, np.random.default_rng(1))
    _check_filter(p, o)
    # the histogram's reported statistics: prompt mean 250.9, P25 23, P75 423; output P25 27, P75 359
    assert abs(p.mean() - 250.9) / 250.9 < 0.02
    assert abs(np.percentile(p, 25) - 23) <= 2 and abs(np.percentile(p, 75) - 423) <= 5
    assert abs(np.percentile(o, 25) - 27) <= 2 and abs(np.percentile(o, 75) - 359) <= 5


@pytest.mark.parametrize("method", ["scale", "tilt"])
@pytest.mark.parametrize("n,seed", [(2000, 2), (20_000, 3)])
def test_sharegpt_like_matches_target_means(method, n, seed):
    p, o = sharegpt_like(n, np.random.default_rng(seed), mean_in=222, mean_out=196, method=method)
    _check_filter(p, o)
    assert abs(p.mean() - 222) / 222 < 0.01
    assert abs(o.mean() - 196) / 196 < 0.01


def test_sharegpt_expected_means_exact():
    m = ShareGPTLengths.from_json().solve(222.0, 196.0)
    assert m.expected_means(m.par_in, m.par_out) == pytest.approx((222.0, 196.0), rel=1e-6)
    assert 0.8 < m.par_in < 1.0 and 0.7 < m.par_out < 1.0   # Llama-3 tokenizer: fewer tokens per text


def test_sharegpt_unreachable_mean():
    with pytest.raises(LengthError, match="not reachable"):
        ShareGPTLengths.from_json().solve(5000.0, None)


def test_sharegpt_committed_knots_match_histogram_means():
    d = load_fitted("sharegpt_lengths")
    assert d["prompt"]["knots_x"][0] == 4.0 and d["prompt"]["knots_x"][-1] == 1024.0
    assert abs(d["prompt"]["mean_unfiltered"] - 250.9) < 2.0
    assert np.all(np.diff(d["prompt"]["knots_F"]) >= 0) and d["output"]["knots_F"][-1] == pytest.approx(1.0)


def test_lognormal_fit_recovers_parameters():
    truth = LognormalLengths(6.0, 0.8, 4.5, 1.0, 0.4)
    p, o = truth.sample(50_000, np.random.default_rng(4))
    fit = LognormalLengths.fit(p, o)
    assert fit.mu_in == pytest.approx(6.0, abs=0.02) and fit.sigma_in == pytest.approx(0.8, abs=0.02)
    assert fit.mu_out == pytest.approx(4.5, abs=0.02) and fit.rho == pytest.approx(0.4, abs=0.03)
    m = fit.with_means(300.0, 100.0)
    p2, o2 = m.sample(100_000, np.random.default_rng(5))
    assert abs(p2.mean() - 300) / 300 < 0.02 and abs(o2.mean() - 100) / 100 < 0.03


def test_copula_reproduces_marginals_and_correlation():
    rng = np.random.default_rng(6)
    p = np.r_[rng.integers(300, 500, 5000), rng.integers(900, 1200, 5000)]
    o = (p // 5 + rng.integers(1, 50, p.size)).astype(np.int64)
    cop = CopulaLengths.fit(p, o)
    ps, os_ = cop.sample(20_000, np.random.default_rng(7))
    for q in (10, 25, 75, 90):  # (the median of this bimodal sample lies anywhere in the gap)
        assert abs(np.percentile(ps, q) - np.percentile(p, q)) / np.percentile(p, q) < 0.05
    assert np.corrcoef(ps, os_)[0, 1] > 0.8


def test_empirical_resamples_pairs():
    e = EmpiricalLengths(np.array([10, 20, 30]), np.array([1, 2, 3]))
    p, o = e.sample(100, np.random.default_rng(8))
    assert set(zip(p.tolist(), o.tolist())) <= {(10, 1), (20, 2), (30, 3)}


def test_scale_and_filter():
    p, o = scale_lengths(np.array([100, 3]), np.array([10, 1]), 0.5)
    assert p.tolist() == [50, 2] and o.tolist() == [5, 1]
    f = LengthFilter(max_prompt=60, max_total=60)
    assert f.mask(np.array([50, 61, 55]), np.array([5, 1, 6])).tolist() == [True, False, False]
    with pytest.raises(LengthError):
        scale_lengths(p, o, 0.0)


def test_sample_lengths_redraws_until_filter_passes():
    cop = CopulaLengths.from_dict(load_fitted("splitwise_conv_fit")["lengths"]["copula"])
    filt = LengthFilter(max_prompt=2048, max_total=2048)
    p, o = sample_lengths(cop, 5000, np.random.default_rng(9), scale=0.5, filt=filt)
    assert p.size == 5000 and p.max() <= 2048 and (p + o).max() <= 2048


def test_build_length_model_dispatch():
    assert isinstance(build_length_model(LengthConfig("splitwise")), CopulaLengths)
    assert isinstance(build_length_model(LengthConfig("fixed:large")), FixedLengths)
    sg = build_length_model(LengthConfig("sharegpt", mean_in=222, mean_out=196))
    assert isinstance(sg, ShareGPTLengths) and sg.filt == SHAREGPT_FILTER
    ln = build_length_model(LengthConfig("lognormal", mean_in=500))
    assert isinstance(ln, LognormalLengths)
    with pytest.raises(LengthError, match="unknown length model"):
        build_length_model(LengthConfig("nope"))
    with pytest.raises(LengthError, match="mean_in"):
        build_length_model(LengthConfig("splitwise", mean_in=100))
