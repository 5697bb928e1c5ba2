"""Adapter ranks and popularity: the shares each law promises."""

from __future__ import annotations

import numpy as np
import pytest

from traces.adapters import (PopularityError, adapter_probabilities, assign_adapters, assign_ranks, bursty_adapters,
                             map_keys_to_adapters, parse_popularity, position_probabilities, top_k_share)


def test_default_ranks_n_over_5_each():
    r = assign_ranks(100)
    assert {k: int((r == k).sum()) for k in (8, 16, 32, 64, 128)} == {8: 20, 16: 20, 32: 20, 64: 20, 128: 20}


def test_rank_list_with_repeats():
    r = assign_ranks(90, [8, 8, 16])
    assert (r == 8).sum() == 60 and (r == 16).sum() == 30


@pytest.mark.parametrize("spec,label", [("uniform", "uniform"), ("powerlaw", "powerlaw:0.5"), ("P:0.3", "powerlaw:0.3"),
                                        ("zipf:1.2", "zipf:1.2"), ("skewed:0.05", "skewed:0.05"),
                                        ("distinct", "distinct"), ("U-P", "uniform-powerlaw:0.5"),
                                        ("P-P", "powerlaw:0.5-powerlaw:0.5"), ("u-u", "uniform-uniform"),
                                        ("P:0.3-zipf:1.2", "powerlaw:0.3-zipf:1.2")])
def test_parse(spec, label):
    assert parse_popularity(spec).label() == label


@pytest.mark.parametrize("spec", ["gauss", "zipf:x", "uniform:2", "U-P-P", "distinct-U", "powerlaw:0"])
def test_parse_errors(spec):
    with pytest.raises(PopularityError):
        parse_popularity(spec)


@pytest.mark.parametrize("spec", ["zipf:-1", "U-P:-2", "powerlaw:-0.5-U"])
def test_a_negative_parameter_is_named_as_such(spec):
    """``zipf:-1`` must not read as the two-level spec ``zipf:`` then ``1`` (an unknown law '1')."""
    with pytest.raises(PopularityError, match=r"is negative: a law's parameter must be > 0"):
        parse_popularity(spec)


def test_zipf_top1_share():
    n, s = 100, 1.2
    expected = 1.0 / np.sum(np.arange(1, n + 1) ** -s)
    ids, _ = assign_adapters(100_000, n, np.random.default_rng(1), popularity=f"zipf:{s}")
    assert abs(top_k_share(ids, 1) - expected) < 0.01
    assert expected == pytest.approx(0.2775, abs=1e-3)


def test_powerlaw_cdf_is_slora():
    # P(position < k) = (k/N)^alpha
    n, a = 200, 0.4
    p = position_probabilities(parse_popularity(f"powerlaw:{a}").adapter, n)
    for k in (1, 10, 50, 200):
        assert p[:k].sum() == pytest.approx((k / n) ** a)
    ids, _ = assign_adapters(100_000, n, np.random.default_rng(2), popularity=f"powerlaw:{a}")
    assert abs(top_k_share(ids, 10) - (10 / n) ** a) < 0.01


def test_uniform_and_distinct():
    ids, _ = assign_adapters(100_000, 50, np.random.default_rng(3), popularity="uniform")
    assert np.bincount(ids).min() > 1800 and top_k_share(ids, 1) < 0.0225
    ids, ranks = assign_adapters(1000, 7, np.random.default_rng(3), popularity="distinct")
    assert ids.tolist() == [i % 7 for i in range(1000)]
    assert np.all(ranks == assign_ranks(7)[ids])


def test_skewed_gaussian_std():
    n, x = 2000, 0.05
    p = position_probabilities(parse_popularity(f"skewed:{x}").adapter, n)
    i = np.arange(n)
    mu = (p * i).sum()
    sd = np.sqrt((p * (i - mu) ** 2).sum())
    assert mu == pytest.approx((n - 1) / 2, abs=1e-6)
    assert sd == pytest.approx(x * n, rel=0.01)
    # smaller x is more skewed
    ids_a, _ = assign_adapters(50_000, n, np.random.default_rng(4), popularity="skewed:0.02")
    ids_b, _ = assign_adapters(50_000, n, np.random.default_rng(4), popularity="skewed:0.3")
    assert top_k_share(ids_a, 100) > 2 * top_k_share(ids_b, 100)


@pytest.mark.parametrize("spec,rank_share8", [("U-U", 0.2), ("U-P", 0.2), ("P-P", 0.2 ** 0.5)])
def test_chameleon_two_level(spec, rank_share8):
    rng = np.random.default_rng(5)
    ids, ranks = assign_adapters(200_000, 100, rng, popularity=spec)
    assert abs((ranks == 8).mean() - rank_share8) < 0.01
    within = ids[ranks == 16]
    share = np.sort(np.bincount(within)[np.bincount(within) > 0])[::-1] / within.size
    if spec.endswith("U"):
        assert share[0] < 0.07                  # 20 adapters of rank 16, uniform: 5 % each
    else:
        assert abs(share[0] - (1 / 20) ** 0.5) < 0.02   # power law within the rank: top-1 = (1/20)^0.5


def test_popularity_independent_of_rank_for_single_level():
    p = adapter_probabilities("zipf:1.5", assign_ranks(100), np.random.default_rng(6))
    assert p.sum() == pytest.approx(1.0)
    top = np.argsort(p)[::-1][:10]
    assert len(set(assign_ranks(100)[top])) > 1


def test_base_model_only():
    ids, ranks = assign_adapters(10, 0, np.random.default_rng(0))
    assert (ids == -1).all() and (ranks == 0).all()


def test_map_keys_most_invoked_first():
    keys = np.array(["b"] * 5 + ["a"] * 3 + ["c"] * 7 + ["d"])
    ids, ranks, top = map_keys_to_adapters(keys, 2, [8, 16])
    assert top == ["c", "b"]
    assert (ids[keys == "c"] == 0).all() and (ids[keys == "b"] == 1).all() and (ids[keys == "a"] == -1).all()
    assert (ranks[keys == "c"] == 8).all() and (ranks[keys == "b"] == 16).all()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 300), st.sampled_from(["uniform", "powerlaw:0.3", "powerlaw:1.5", "zipf:0", "zipf:2.5",
                                             "skewed:0.01", "skewed:2", "U-P", "P-P", "P:0.2-zipf:1.1"]))
def test_probabilities_are_distributions(n, spec):
    p = adapter_probabilities(spec, assign_ranks(n), np.random.default_rng(n))
    assert p.shape == (n,) and np.all(p >= 0) and abs(p.sum() - 1.0) < 1e-9


def test_bursty_hot_set_per_burst():
    """bursty:B: within each burst of B requests the hot set (10 % of the adapters) takes about
    90 % of the requests; over the run every adapter is about equally popular."""
    n, burst = 40, 100
    ids, ranks = assign_adapters(200 * burst, n, np.random.default_rng(5), popularity=f"bursty:{burst}")
    assert np.all(ranks == assign_ranks(n)[ids])
    shares = [np.sort(np.bincount(ids[s:s + burst], minlength=n))[::-1][:4].sum() / burst
              for s in range(0, ids.size, burst)]
    assert 0.85 < np.mean(shares) < 0.97
    counts = np.bincount(ids, minlength=n)
    assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()
    again, _ = assign_adapters(200 * burst, n, np.random.default_rng(5), popularity=f"bursty:{burst}")
    assert np.array_equal(ids, again)


@pytest.mark.parametrize("spec", ["bursty:0", "bursty:2.5", "bursty-U", "U-bursty"])
def test_bursty_refused_forms(spec):
    with pytest.raises(PopularityError):
        parse_popularity(spec)


@pytest.mark.parametrize("call, error, message", [
    (lambda g: assign_ranks(2.5), PopularityError, "whole number >= 0, got 2.5"),
    (lambda g: assign_ranks(3, [8.5]), PopularityError, "positive integers"),       # was truncated to 8
    (lambda g: assign_adapters(-1, 3, g), PopularityError, "n_requests"),
    (lambda g: assign_adapters(10, 3, 0), TypeError, "rng: got int"),
    (lambda g: bursty_adapters(10, 3, 0, g), PopularityError, "burst must be"),
    (lambda g: bursty_adapters(10, 0, 2, g), PopularityError, "n_adapters must be"),
    (lambda g: top_k_share(np.array([1, 2]), 0), PopularityError, "k must be"),      # was 0.0
])
def test_odd_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call(np.random.default_rng(0))
