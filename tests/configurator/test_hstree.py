"""Hierarchical shrinkage of a multi-output CART tree (twin/configurator/hstree.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.tree import DecisionTreeRegressor

from twin.configurator.hstree import HSTreeMultiRegressor, shrink_node_values


def _data(n: int = 120, outputs: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 1, size=(n, 4))
    Y = np.column_stack([np.sin(3 * X[:, 0]) + X[:, 1] * k + 0.1 * rng.normal(size=n) for k in range(outputs)])
    return X, Y


def test_lambda_zero_is_the_cart_tree():
    X, Y = _data()
    hs = HSTreeMultiRegressor(max_leaf_nodes=12, reg_param=0.0, random_state=0).fit(X, Y)
    cart = DecisionTreeRegressor(max_leaf_nodes=12, random_state=0).fit(X, Y)
    np.testing.assert_allclose(hs.predict(X), cart.predict(X), rtol=0, atol=1e-12)


def test_the_shrinkage_formula_on_each_path():
    """f(leaf) = E[root] + sum over edges of (E[child] - E[parent]) / (1 + lambda / N(parent))."""
    X, Y = _data(60, 2)
    lam = 7.0
    hs = HSTreeMultiRegressor(max_leaf_nodes=6, reg_param=lam, random_state=1).fit(X, Y)
    t = hs.estimator_.tree_
    raw = t.value[:, :, 0]
    parent = {c: p for p in range(t.node_count) for c in (t.children_left[p], t.children_right[p]) if c >= 0}
    for leaf in np.flatnonzero(t.children_left == -1):
        want, node = np.zeros(2), leaf
        while node in parent:
            p = parent[node]
            want += (raw[node] - raw[p]) / (1 + lam / t.weighted_n_node_samples[p])
            node = p
        want += raw[0]
        np.testing.assert_allclose(hs.node_values_[leaf], want, rtol=1e-12)


def test_large_lambda_pulls_every_leaf_to_the_root_mean():
    X, Y = _data()
    hs = HSTreeMultiRegressor(max_leaf_nodes=20, reg_param=1e12, random_state=0).fit(X, Y)
    np.testing.assert_allclose(hs.predict(X), np.broadcast_to(Y.mean(axis=0), Y.shape), atol=1e-6)
    # and shrinkage never moves a prediction past its CART value: between root mean and leaf mean
    mid = HSTreeMultiRegressor(max_leaf_nodes=20, reg_param=10.0, random_state=0).fit(X, Y)
    cart = mid.estimator_.predict(X)
    root = Y.mean(axis=0)
    assert np.abs(mid.predict(X) - root).sum() < np.abs(cart - root).sum()


def test_equals_imodels_hstree_on_one_target():
    imodels = pytest.importorskip("imodels", reason="imodels is not installed (optional extra: "
                                                    "pip install 'lora-twin[configurator]')")
    X, Y = _data(150, 1, seed=3)
    y = Y[:, 0]
    for lam in (0.1, 1.0, 25.0):
        ours = HSTreeMultiRegressor(max_leaf_nodes=16, min_samples_leaf=2, reg_param=lam, random_state=0).fit(X, y)
        ref = imodels.HSTreeRegressor(DecisionTreeRegressor(max_leaf_nodes=16, min_samples_leaf=2, random_state=0),
                                      reg_param=lam).fit(X, y)
        np.testing.assert_allclose(ours.predict(X), ref.predict(X), rtol=1e-10, atol=1e-12)


def test_bad_reg_param_is_refused():
    X, Y = _data(30)
    for bad in (-1.0, float("nan"), "ten"):
        with pytest.raises(ValueError, match="reg_param"):
            HSTreeMultiRegressor(reg_param=bad).fit(X, Y)
    with pytest.raises(ValueError, match="reg_param"):
        shrink_node_values(DecisionTreeRegressor(max_depth=2).fit(X, Y).tree_, -0.5)
    with pytest.raises(ValueError, match="reg_param"):
        HSTreeMultiRegressor(reg_param=True).fit(X, Y)


def test_a_numpy_reg_param_is_a_number():
    """np.float32(2) (e.g. from a numpy grid of candidates) was refused as not a number."""
    X, Y = _data(30)
    a = HSTreeMultiRegressor(reg_param=np.float32(2.0), random_state=0).fit(X, Y).predict(X)
    np.testing.assert_allclose(a, HSTreeMultiRegressor(reg_param=2.0, random_state=0).fit(X, Y).predict(X))


def test_estimator_conventions():
    """scikit-learn conventions: arguments stored as given, fitted state ends in ``_``, clone and
    get_params round-trip, unfitted predict refused."""
    from sklearn.exceptions import NotFittedError

    est = HSTreeMultiRegressor(max_leaf_nodes=8, min_samples_leaf=3, reg_param=2.5, random_state=7)
    assert est.get_params() == {"max_leaf_nodes": 8, "min_samples_leaf": 3, "reg_param": 2.5, "random_state": 7}
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((1, 4)))
    X, Y = _data()
    a = clone(est).fit(X, Y).predict(X)
    b = clone(est).fit(X, Y).predict(X)
    np.testing.assert_array_equal(a, b)
    assert not any(k.endswith("_") for k in vars(clone(est)))
