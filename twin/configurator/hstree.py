"""Hierarchical shrinkage of a multi-output CART tree (kind ``hstree``).

Agarwal, Tan, Ronen, Singh and Yu, "Hierarchical Shrinkage: Improving the accuracy and
interpretability of tree-based methods", ICML 2022, eq. (3): a node's prediction is the root mean
plus every step down its path, each step shrunk by the size of the node it leaves,

    f(x) = E[root] + sum over the path's edges (parent -> child) of
           (E[child] - E[parent]) / (1 + lambda / N(parent)),

where E is a node's mean target and N its number of training samples. The tree's structure and
therefore its rules stay exactly CART's; only the leaf values move toward their ancestors', more
where a split rests on few scenarios. This is imodels' ``HSTreeRegressor`` with its default
``node_based`` scheme, which in imodels 3.0.4 refuses a multi-column target; a configurator predicts
served adapters, slots and throughput from one tree, so the same arithmetic is applied here to
scikit-learn's multi-output tree (a test checks it equals imodels' on one target). No imodels needed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.tree import DecisionTreeRegressor
from sklearn.utils.validation import check_is_fitted, validate_data

from traces.arguments import is_real_number


def shrink_node_values(tree: Any, reg_param: float) -> np.ndarray:
    """Node values (``n_nodes x n_outputs``) of a fitted scikit-learn ``tree_`` after hierarchical
    shrinkage with ``reg_param`` (lambda >= 0; 0 gives the tree's own values)."""
    if not reg_param >= 0:
        raise ValueError(f"reg_param must be >= 0, got {reg_param!r}")
    raw = np.asarray(tree.value, float)
    raw = raw[:, :, 0] if raw.ndim == 3 else raw
    out = np.empty_like(raw)
    left, right = tree.children_left, tree.children_right
    n = np.asarray(tree.weighted_n_node_samples, float)
    out[0] = raw[0]
    stack = [0]
    while stack:
        i = stack.pop()
        if left[i] == right[i]:  # leaf
            continue
        for c in (left[i], right[i]):
            out[c] = out[i] + (raw[c] - raw[i]) / (1.0 + reg_param / n[i])
            stack.append(c)
    return out


class HSTreeMultiRegressor(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """A CART regression tree (at most ``max_leaf_nodes`` leaves) with hierarchical shrinkage.

    Multi-output (``y`` of one or more columns; scikit-learn's ``multi_output`` tag). ``X`` is a dense array of
    finite numbers, as its tags say: NaN, infinity and sparse matrices are refused by ``fit`` and ``predict``
    (the tree's own missing-value branches, ``missing_go_to_left``, are never learned, and the configurator's JSON
    trees do not store them: a prediction refuses a non-finite feature, :func:`twin.configurator.models.predict`).

    Parameters
    ----------
    max_leaf_nodes : leaves of the CART tree (the configurator keeps <= 30, one rule per leaf).
    min_samples_leaf : scenarios per leaf at least.
    reg_param : lambda of the shrinkage; 0 is plain CART, larger pulls rare leaves to their parents.
    random_state : seed of the CART tree's tie breaking.

    Fitted attributes: ``estimator_`` (the CART tree), ``node_values_`` (shrunk values per node),
    ``n_outputs_``.
    """

    def __init__(self, max_leaf_nodes: int | None = 30, min_samples_leaf: int = 1, reg_param: float = 10.0,
                 random_state: int | None = None):
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.reg_param = reg_param
        self.random_state = random_state

    def fit(self, X, y):
        if not (is_real_number(self.reg_param) and self.reg_param >= 0):
            raise ValueError(f"reg_param must be a number >= 0, got {self.reg_param!r}")
        # (scikit-learn's checks: a dense 2-D X of finite numbers, a numeric y of as many rows; the tree alone took
        # NaN, learning missing-value branches, and sparse X, against the estimator's tags)
        X, y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=np.float64)
        self.estimator_ = DecisionTreeRegressor(max_leaf_nodes=self.max_leaf_nodes,
                                                min_samples_leaf=self.min_samples_leaf,
                                                random_state=self.random_state).fit(X, y)
        self.node_values_ = shrink_node_values(self.estimator_.tree_, float(self.reg_param))
        self.n_outputs_ = self.estimator_.n_outputs_
        return self

    def predict(self, X):
        check_is_fitted(self, "node_values_")
        X = validate_data(self, X, reset=False, dtype=np.float64)
        v = self.node_values_[self.estimator_.apply(X)]
        return v[:, 0] if self.n_outputs_ == 1 else v
