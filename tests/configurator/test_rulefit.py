"""Configurator kind ``rulefit``: imodels' RuleFit per target, saved as JSON rule ensembles that
predict without scikit-learn or imodels (exactly imodels' prediction), explained and printed."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.configurator.test_models import GRID, HAS_IMODELS, synthetic_labels
from twin.configurator.labels import FEATURES, TARGETS, features_of
from twin.configurator.models import (KINDS, ensemble_terms, format_rule_ensembles, load_model, predict, save_model,
                                      train)
from twin.sweep.grid import PUBLISHED_GRID

ROOT = Path(__file__).resolve().parents[2]
needs_imodels = pytest.mark.skipif(not HAS_IMODELS, reason="imodels is not installed (the optional extra: "
                                                           "pip install 'lora-twin[configurator]')")
#: few rule-generating trees keep the fits to about a second (the shipped models use the default 50)
FAST = {"n_estimators": 10}
SCENARIO = ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32"]


def _cli():
    from twin.configurator.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    return p


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """The synthetic labels, a trained ``rulefit`` model (saved) and the same estimator fitted
    directly with the model's stored hyper-parameters."""
    if not HAS_IMODELS:
        pytest.skip("imodels is not installed (the optional extra: pip install 'lora-twin[configurator]')")
    from twin.configurator.rulefit import RuleFitMultiRegressor

    lab = synthetic_labels(60)
    m = train(lab, "rulefit", search=False, params=FAST, grid=GRID,
              provenance={"profile": "test-profile", "rule": "throughput90"})
    path = save_model(m, tmp_path_factory.mktemp("rulefit") / "test-profile.rulefit.json")
    X = lab[list(FEATURES)].to_numpy(float)
    est = RuleFitMultiRegressor(**m["provenance"]["params"]).fit(X, np.log(lab[list(TARGETS)].to_numpy(float)))
    return lab, m, path, est


def test_rulefit_is_an_imodels_kind():
    from twin.configurator.models import IMODELS_KINDS

    assert "rulefit" in KINDS and "rulefit" in IMODELS_KINDS


@needs_imodels
def test_json_reproduces_imodels_prediction_on_the_training_features(fitted):
    lab, m, _, est = fitted
    assert m["kind"] == "rulefit" and m["trees"] == [] and m["combine"] == "rule_ensemble"
    assert [e["target"] for e in m["rule_ensembles"]] == list(TARGETS)
    assert m["provenance"]["estimator"] == "RuleFitMultiRegressor" and m["provenance"]["params"]["n_estimators"] == 10
    assert m["provenance"]["rules"] == sum(len(e["rules"]) for e in m["rule_ensembles"]) > 0
    want = est.predict(lab[list(FEATURES)].to_numpy(float))  # log targets, imodels' own predict
    for i, (_, r) in enumerate(lab.iterrows()):
        x = {f: float(r[f]) for f in FEATURES}
        for j, ens in enumerate(m["rule_ensembles"]):
            got, _ = ensemble_terms(ens, x)
            assert got == pytest.approx(want[i, j], abs=1e-9)
        res = predict(m, x)
        assert math.log(res["served_adapters_raw"]) == pytest.approx(want[i, 0], abs=1e-9)
        assert math.log(res["adapter_slots_raw"]) == pytest.approx(want[i, 1], abs=1e-9)
        assert math.log(res["throughput_tok_s"]) == pytest.approx(want[i, 2], abs=1e-9)


@needs_imodels
def test_trains_the_known_rule(fitted):
    lab, m, _, _ = fitted
    hits = 0
    for _, r in lab.iterrows():
        res = predict(m, {f: r[f] for f in FEATURES})
        assert res["served_adapters"] in PUBLISHED_GRID and res["adapter_slots"] <= res["served_adapters"]
        hits += (res["served_adapters"], res["adapter_slots"]) == (r["served_adapters"], r["adapter_slots"])
    assert hits >= 0.9 * len(lab)


@needs_imodels
def test_round_trip_and_prediction_without_sklearn_or_imodels(fitted):
    _, m, path, _ = fitted
    back = load_model(path)
    assert back.pop("_path") == str(path)
    assert back == json.loads(json.dumps(m))
    code = ("import sys, json; sys.modules['sklearn'] = None; sys.modules['imodels'] = None\n"
            "from twin.configurator.models import load_model, predict\n"
            "from twin.configurator.labels import features_of\n"
            f"m = load_model({str(path)!r})\n"
            "print(json.dumps(predict(m, features_of([0.4, 0.05, 0.00625], [8, 16, 32]), explain=True)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(predict(m, features_of([0.4, 0.05, 0.00625], [8, 16, 32]),
                                                                   explain=True)))


@needs_imodels
def test_explain_terms_add_up_to_the_prediction(fitted):
    _, m, _, _ = fitted
    x = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    res = predict(m, x, explain=True)
    assert "uncertainty" not in res
    for t, raw in (("served_adapters", res["served_adapters_raw"]), ("adapter_slots", res["adapter_slots_raw"]),
                   ("throughput_tok_s", res["throughput_tok_s"])):
        terms = res["terms"][t]["terms"]
        assert terms[0]["term"] == "intercept"
        assert sum(u["contribution"] for u in terms) == pytest.approx(math.log(raw), abs=1e-12)
        ens = m["rule_ensembles"][list(TARGETS).index(t)]
        held = [u["rule"] for u in terms if u["term"] == "rule"]
        # exactly the rules whose conditions all hold are listed
        from twin.configurator.models import condition_holds

        assert held == [k + 1 for k, r in enumerate(ens["rules"]) if all(condition_holds(c, x)
                                                                         for c in r["conditions"])]
    assert len(res["rule_path"]) == sum(1 for v in res["terms"].values() for u in v["terms"] if u["term"] == "rule")


@needs_imodels
def test_predict_explain_and_rules_cli(fitted, capsys):
    _, m, path, _ = fitted
    p = _cli()
    ns = p.parse_args(["configure", "predict", *SCENARIO, "--model", str(path), "--json", "--explain"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"] == "rulefit" and d["served_adapters"] in PUBLISHED_GRID and "terms" in d
    for k in ("served_adapters", "adapter_slots", "throughput_tok_s"):
        assert k in d
    ns = p.parse_args(["configure", "predict", *SCENARIO, "--model", str(path), "--explain"])
    assert ns.func(ns) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"serve {d['served_adapters']} adapters with {d['adapter_slots']} GPU adapter slots")
    for t in TARGETS:
        assert f"\n{t} = exp(" in out
    lines = out.splitlines()
    k = lines.index(next(line for line in lines if line.startswith("served_adapters = exp(")))
    served_terms = [float(line.split()[0]) for line in lines[k + 1:] if line.startswith("  ")][
        :len(d["terms"]["served_adapters"]["terms"])]
    assert lines[k + 1].endswith("intercept")
    assert sum(served_terms) == pytest.approx(math.log(d["served_adapters_raw"]), abs=1e-3)
    ns = p.parse_args(["configure", "rules", "--model", str(path)])
    assert ns.func(ns) == 0
    text = capsys.readouterr().out
    assert text == format_rule_ensembles(load_model(path)) + "\n"
    assert f"{m['provenance']['rules']} rules" in text.splitlines()[0]
    for ens in m["rule_ensembles"]:  # every kept term printed, by decreasing importance
        block = text.split(f"## {ens['target']} = ")[1].split("\n## ")[0].splitlines()[1:]
        assert len(block) == len(ens["rules"]) + len(ens["linear"])
        imp = [float(line.split("importance ")[1].split(":")[0]) for line in block]
        assert imp == sorted(imp, reverse=True)
    ns = p.parse_args(["configure", "rules", "--model", str(path), "--json"])
    assert ns.func(ns) == 0
    assert json.loads(capsys.readouterr().out)["rule_ensembles"] == m["rule_ensembles"]


def test_ensemble_terms_by_hand():
    """The JSON format's arithmetic on a hand-written ensemble: clipped linear terms and the rules
    whose every condition holds (open bounds as null)."""
    ens = {"target": "served_adapters", "intercept": 1.0,
           "linear": [{"feature": "rate_max", "coef": 2.0, "clip": [0.1, 1.0], "std": 0.3, "importance": 0.6},
                      {"feature": "rank_max", "coef": -0.01, "clip": [None, None], "std": 8.0, "importance": 0.08}],
           "rules": [{"conditions": [{"feature": "rate_max", "op": "<=", "value": 0.5},
                                     {"feature": "rank_max", "op": ">", "value": 16}], "coef": 0.25, "support": 0.3,
                      "importance": 0.11},
                     {"conditions": [{"feature": "rate_min", "op": ">=", "value": 0.1}], "coef": -3.0,
                      "support": 0.1, "importance": 0.9}]}
    total, terms = ensemble_terms(ens, {"rate_max": 3.2, "rank_max": 32, "rate_min": 0.05})
    assert total == pytest.approx(1.0 + 2.0 * 1.0 - 0.32)  # rate_max clipped to 1.0; no rule holds
    assert [t["term"] for t in terms] == ["intercept", "linear", "linear"]
    total, terms = ensemble_terms(ens, {"rate_max": 0.05, "rank_max": 32, "rate_min": 0.1})
    assert total == pytest.approx(1.0 + 2.0 * 0.1 - 0.32 + 0.25 - 3.0)
    assert [t.get("rule") for t in terms if t["term"] == "rule"] == [1, 2]
    with pytest.raises(ValueError, match="unknown operator"):
        ensemble_terms({**ens, "rules": [{"conditions": [{"feature": "rate_max", "op": "!=", "value": 1}],
                                          "coef": 1.0}]}, {"rate_max": 0.2, "rank_max": 8})


def test_rulefit_without_imodels_names_the_extra(monkeypatch, tmp_path, capsys):
    from twin.sweep.runner import MissingExtra

    monkeypatch.setitem(sys.modules, "imodels", None)
    with pytest.raises(MissingExtra, match=r"rulefit.*pip install 'lora-twin\[configurator\]'"):
        train(synthetic_labels(12), "rulefit", search=False)
    lab = tmp_path / "lab.csv"
    synthetic_labels(12).to_csv(lab, index=False)
    ns = _cli().parse_args(["configure", "train", str(lab), "--kind", "rulefit", "--out", str(tmp_path / "m.json")])
    assert ns.func(ns) == 2
    err = capsys.readouterr().err
    assert "rulefit" in err and "lora-twin[configurator]" in err and not (tmp_path / "m.json").exists()


def test_params_may_not_override_the_searched_grid():
    with pytest.raises(ValueError, match="searched by the grid search"):
        train(synthetic_labels(12), "cart", params={"max_leaf_nodes": 8})


@needs_imodels
@pytest.mark.data
def test_evaluate_scores_a_rulefit_model_on_real_ml_test(fitted, real_data, capsys):
    _, _, path, _ = fitted
    ns = _cli().parse_args(["configure", "evaluate", "--real", str(real_data / "validation/vllm085_h100_llama31_8b.csv"),
                            "--model", str(path), "--no-search", "--json"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scenarios"] == 9 and d["model"] == str(path)
    row = d["table"][0]
    assert row["predictor"] == "RuleFit (imodels, per target)" and 0 <= row["regret_min"] <= 1.0 + 1e-9


@pytest.mark.parametrize("params, X, y, message", [
    (dict(max_rules=0), None, None, "max_rules must be an integer >= 1, got 0"),    # was accepted
    (dict(max_rules="3"), None, None, "max_rules must be an integer >= 1, got '3'"),
    (dict(tree_size=0), None, None, "tree_size must be an integer >= 2"),           # was numpy's "scale < 0"
    (dict(n_estimators=0), None, None, "n_estimators must be an integer >= 1"),     # was an AttributeError
    ({}, "1d", None, "Expected 2D array"),                                           # was an IndexError
    ({}, None, "3d", "dim 3"),                                                       # was accepted
    ({}, "one", "one", "at least 2 samples"),                                        # was a ZeroDivisionError
])
def test_fit_checks_its_parameters_and_data_the_scikit_learn_way(params, X, y, message):
    from twin.configurator.rulefit import RuleFitMultiRegressor

    rng = np.random.default_rng(0)
    X0, Y0 = rng.random((20, 3)), rng.random((20, 2))
    X1 = X0[:, 0] if X == "1d" else X0[:1] if X == "one" else X0
    Y1 = Y0[:, :, None] if y == "3d" else Y0[:1] if y == "one" else Y0
    est = RuleFitMultiRegressor(**params)
    with pytest.raises(ValueError, match=message):
        est.fit(X1, Y1)


@needs_imodels
def test_predict_checks_the_feature_count():
    from twin.configurator.rulefit import RuleFitMultiRegressor

    rng = np.random.default_rng(0)
    X, Y = rng.random((20, 3)), rng.random((20, 2))
    est = RuleFitMultiRegressor(max_rules=5, n_estimators=5, random_state=0).fit(X, Y)
    assert est.n_features_in_ == 3
    with pytest.raises(ValueError, match="X has 2 features, but RuleFitMultiRegressor is expecting 3"):
        est.predict(X[:, :2])
