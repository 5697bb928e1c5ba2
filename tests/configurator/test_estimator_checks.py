"""The configurator's own estimators pass scikit-learn's estimator checks (``check_estimator``).

``HSTreeMultiRegressor`` and ``RuleFitMultiRegressor`` are multi-output regressors (``MultiOutputMixin``: without it
``check_supervised_y_2d`` expected the warning of a single-output model given a column ``y``); the HS tree refuses
NaN, infinity and sparse ``X`` as its tags say (the tree alone took them, learning missing-value branches that the
JSON export does not store); RuleFit names a single sample as scikit-learn's checks expect (``n_samples=1``). No check
is marked as an expected failure; ``check_array_api_input`` skips itself (scikit-learn's own SkipTest) where
``SCIPY_ARRAY_API`` is not set. RuleFit's checks need imodels (the optional extra) and use 5 boosted trees instead of
50 to stay quick (``n_estimators`` changes no tag and no check's verdict).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from twin.configurator.hstree import HSTreeMultiRegressor
from twin.configurator.rulefit import RuleFitMultiRegressor


def _has_imodels() -> bool:
    try:
        import imodels  # noqa: F401
    except ImportError:
        return False
    return True


ESTIMATORS = [HSTreeMultiRegressor()] + ([RuleFitMultiRegressor(n_estimators=5)] if _has_imodels() else [])


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_rulefit_checks_need_imodels():
    """(Where imodels is missing, RuleFit's checks are not collected: they would all fail on the missing extra.)"""
    if not _has_imodels():
        pytest.skip("imodels is not installed (pip install 'lora-twin[configurator]'): RuleFit's checks not run")
    assert any(isinstance(e, RuleFitMultiRegressor) for e in ESTIMATORS)


def test_the_hs_tree_refuses_what_its_tags_refuse():
    import scipy.sparse as sp

    X = np.arange(20.0).reshape(10, 2)
    y = np.column_stack([np.arange(10.0), np.arange(10.0) % 3])
    est = HSTreeMultiRegressor(max_leaf_nodes=4)
    tags = est.__sklearn_tags__()
    assert tags.target_tags.multi_output and not tags.input_tags.allow_nan and not tags.input_tags.sparse
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(bad, y)
    with pytest.raises(TypeError, match="[Ss]parse"):
        est.fit(sp.csr_matrix(X), y)
    est.fit(X, y)
    assert est.predict(X).shape == (10, 2)
    with pytest.raises(ValueError, match="NaN"):
        est.predict(bad)


def test_a_prediction_refuses_a_non_finite_feature():
    """A JSON tree has no missing-value branch (scikit-learn's ``missing_go_to_left``): a NaN feature went right at
    every split; it is refused, naming the feature."""
    from twin.configurator.labels import features_of
    from twin.configurator.models import load_model, predict

    m = load_model("llama-3.1-8b_h100_vllm085", "cart")
    x = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    with pytest.raises(ValueError, match="feature rate_std is nan"):
        predict(m, {**x, "rate_std": float("nan")})


def test_training_refuses_a_non_finite_feature():
    """scikit-learn's forest and CART take NaN and learn a missing-value branch per split, which the JSON export does
    not keep: train refuses such labels instead."""
    from tests.configurator.test_models import synthetic_labels
    from twin.configurator.models import train

    lab = synthetic_labels(20)
    lab.loc[3, "rate_std"] = float("nan")
    for kind in ("rf", "cart"):
        with pytest.raises(ValueError, match="feature rate_std is not a finite number"):
            train(lab, kind, search=False, provenance={"profile": "p", "rule": "throughput90"})
