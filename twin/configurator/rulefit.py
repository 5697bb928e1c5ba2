"""Multi-target RuleFit (configurator kind ``rulefit``) and its export to plain JSON rule ensembles.

Friedman and Popescu, "Predictive learning via rule ensembles", Ann. Appl. Stat. 2(3), 2008: a
target is predicted by a sparse linear model over the features and over rules,

    F(x) = a0 + sum_j b_j * l_j(x_j) + sum_k a_k * r_k(x),

where ``l_j(x_j) = min(max(x_j, lo_j), hi_j)`` is feature j winsorised to its training quantiles
(sec. 5, "robustness"; the 0.4 / std scaling of the paper is folded into ``b_j`` here), and each
rule ``r_k`` is 1 where a conjunction of ``feature <= / > threshold`` conditions holds (the paths to
the nodes of small gradient-boosted trees, sec. 3), 0 elsewhere. The lasso keeps few terms: imodels'
``max_rules`` bounds the terms with a non-zero coefficient, and the least penalty within that bound is
used (``cv=False``; the configurator's grid search picks ``max_rules`` by cross-validated SMAPE).
Importance (sec. 6, eq. 28-29): ``|b_j| * std(l_j)`` for a linear term and ``|a_k| * sqrt(s_k (1 - s_k))``
for a rule of support ``s_k``.

imodels 3.0.4's ``RuleFitRegressor`` takes one target only; a configurator predicts served adapters,
slots and throughput together, so :class:`RuleFitMultiRegressor` fits one RuleFit per target (on
the log targets, as every configurator kind), sharing the hyper-parameters that the grid search
tunes. :func:`export_rule_ensemble` writes one fitted RuleFit as plain numbers, which
:func:`twin.configurator.models.predict` evaluates without scikit-learn or imodels.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from twin.configurator.models import IMODELS_EXTRA
from twin.sweep.runner import MissingExtra

#: comparison operators a RuleFit condition may use (imodels writes tree paths with ``<=`` and ``>``)
RULE_OPS = ("<=", "<", ">", ">=")


class RuleFitMultiRegressor(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """One imodels ``RuleFitRegressor`` per target column, with shared hyper-parameters (multi-output:
    scikit-learn's ``multi_output`` tag; ``X`` dense and finite, as its tags say).

    Parameters
    ----------
    max_rules : terms with a non-zero coefficient (rules and linear terms) per target, at most.
    tree_size : mean number of leaves of the boosted trees that generate the candidate rules
        (exponentially distributed sizes, Friedman and Popescu 2008 sec. 3.3).
    n_estimators : boosted trees that generate the candidate rules (5-fold CV SMAPE of served / slots
        on the first 105 Llama sweep scenarios, max_rules 30, tree_size 4, imodels' own CV: 30 trees
        1.8 / 7.7 %, 50 trees 1.9 / 8.3 %, imodels' default 100 trees 2.1 / 11.2 %).
    cv : imodels' choice of the lasso penalty among those keeping <= ``max_rules`` terms: by its own
        5-fold cross-validation of the squared error (True) or the least such penalty (False, the
        default). The configurator's grid search already picks ``max_rules`` by cross-validated SMAPE,
        and imodels' CV refits the lasso 5 times per penalty on the path (100 penalties where fewer
        candidate rules than ``max_rules`` exist, as in the search's small halving folds): about 10x
        the fitting time for a second, differently scored selection.
    random_state : seed of the trees' subsampling and of the lasso's cross-validation.

    Fitted attributes: ``estimators_`` (one ``RuleFitRegressor`` per target), ``n_outputs_``.
    """

    def __init__(self, max_rules: int = 30, tree_size: int = 4, n_estimators: int = 50,
                 cv: bool = False, random_state: int | None = None):
        self.max_rules = max_rules
        self.tree_size = tree_size
        self.n_estimators = n_estimators
        self.cv = cv
        self.random_state = random_state

    def fit(self, X, y):
        for name, low in (("max_rules", 1), ("tree_size", 2), ("n_estimators", 1)):
            v = getattr(self, name)
            if not (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) and v >= low):
                raise ValueError(f"{type(self).__name__}: {name} must be an integer >= {low}, got {v!r}")
        # (scikit-learn's checks: 2-D numeric X, 1-D or 2-D numeric y of as many rows, finite values)
        X, Y = validate_data(self, X, y, multi_output=True, y_numeric=True, dtype=float)
        if X.shape[0] < 2:
            raise ValueError(f"{type(self).__name__}: fitting needs at least 2 samples, got n_samples={X.shape[0]}")
        Y = Y.reshape(-1, 1) if Y.ndim == 1 else Y
        try:  # (after the checks, which need no imodels: bad arguments are named with or without it)
            from imodels import RuleFitRegressor
        except ImportError as e:
            raise MissingExtra(f"model kind 'rulefit' needs imodels ({e}): {IMODELS_EXTRA}") from None
        self.estimators_ = [RuleFitRegressor(max_rules=self.max_rules, tree_size=self.tree_size,
                                             n_estimators=self.n_estimators, cv=self.cv,
                                             random_state=self.random_state)
                            .fit(X, Y[:, j]) for j in range(Y.shape[1])]
        self.n_outputs_ = Y.shape[1]
        return self

    def predict(self, X):
        check_is_fitted(self, "estimators_")
        X = validate_data(self, X, reset=False, dtype=float)
        P = np.column_stack([e.predict(X) for e in self.estimators_])
        return P[:, 0] if self.n_outputs_ == 1 else P


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def export_rule_ensemble(est: Any, features: list[str], target: str) -> dict[str, Any]:
    """One fitted imodels RuleFit as ``{"target", "intercept", "linear": [...], "rules": [...]}``.

    ``linear``: ``{"feature", "coef", "clip": [lo, hi], "std", "importance"}`` for every feature
    with a non-zero coefficient; its term is ``coef * min(max(x, lo), hi)`` (``null`` bounds are
    open; the winsorising and imodels' 0.4 / std scaling are folded into ``clip`` and ``coef``).
    ``rules``: ``{"conditions": [{"feature", "op", "value"}], "coef", "support", "importance"}``
    for every rule the lasso kept; its term is ``coef`` where every condition holds."""
    n_feat = len(features)
    if int(est.n_features_) != n_feat:
        raise ValueError(f"the RuleFit saw {est.n_features_} features, {n_feat} names given")
    linear: list[dict[str, Any]] = []
    if est.include_linear:
        coef = np.asarray(est.coef[:n_feat], float)
        if est.lin_standardise:
            mult = np.asarray(est.friedscale.scale_multipliers, float)
            lims = np.asarray(est.winsorizer.winsor_lims, float)
        else:  # imodels uses the raw feature then
            mult = np.ones(n_feat)
            lims = np.vstack([np.full(n_feat, -np.inf), np.full(n_feat, np.inf)])
        std = np.asarray(est.stddev, float)
        for j in range(n_feat):
            if coef[j] != 0.0:
                b = float(coef[j] * mult[j])
                linear.append({"feature": features[j], "coef": b, "clip": [_finite(lims[0, j]), _finite(lims[1, j])],
                               "std": float(std[j]), "importance": abs(b) * float(std[j])})
    index = {f"X_{j}": j for j in range(n_feat)}
    rules: list[dict[str, Any]] = []
    for r in est.rules_without_feature_names_:
        conds = []
        for (placeholder, op), value in r.agg_dict.items():
            if op not in RULE_OPS or placeholder not in index:
                raise ValueError(f"RuleFit rule {str(r)!r}: condition {placeholder} {op} {value} cannot be exported "
                                 f"(operators {RULE_OPS} on features X_0..X_{n_feat - 1} only)")
            conds.append({"feature": features[index[placeholder]], "op": op, "value": float(value)})
        a = float(r.args[0])
        s = float(r.support)
        rules.append({"conditions": conds, "coef": a, "support": s,
                      "importance": abs(a) * math.sqrt(max(s * (1.0 - s), 0.0))})
    return {"target": target, "intercept": float(np.asarray(est.intercept).reshape(-1)[0]), "linear": linear,
            "rules": rules}
