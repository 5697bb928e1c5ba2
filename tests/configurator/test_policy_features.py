"""The scheduler/cache policy and the request-length mix as configurator features
(:mod:`twin.configurator.features`): one model recommends per policy, refuses what it never saw,
and prints its policy conditions readably."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.configurator.test_models import GRID, HAS_IMODELS, synthetic_labels
from tests.helpers import configure_parser
from twin.configurator.features import (describe_condition, length_columns, policy_column, readable_conditions,
                                        training_columns)
from twin.configurator.labels import FEATURES, features_of
from twin.sweep.grid import rank_multisets, rate_triples
from twin.configurator.models import (format_rule_ensembles, format_rules, load_model, predict, save_model,
                                      shipped_model_path, train)

A, B = "fcfs+client-cap", "vllm-partition"
PROV = {"profile": "test-profile", "rule": "throughput90"}
KINDS = ("rf", "cart", "hstree") + (("figs", "rulefit") if HAS_IMODELS else ())


def policy_labels(n: int = 60) -> pd.DataFrame:
    """The synthetic labels once per policy; under ``B`` the optimum serves a quarter of the adapters
    with half the slots (the label rule depends on the policy, not only on the scenario)."""
    a = synthetic_labels(n).assign(policy=A)
    b = synthetic_labels(n).assign(policy=B)
    b["served_adapters"] = (b["served_adapters"] // 4).clip(lower=16)
    b["adapter_slots"] = (b["adapter_slots"] // 2).clip(lower=16)
    b["adapter_slots"] = b[["adapter_slots", "served_adapters"]].min(axis=1)
    b["throughput_tok_s"] *= 0.5
    return pd.concat([a, b], ignore_index=True)


@pytest.fixture(scope="module")
def policy_models(tmp_path_factory):
    lab = policy_labels()
    d = tmp_path_factory.mktemp("policy_models")
    paths = {}
    for kind in KINDS:
        m = train(lab, kind, cv=3, search=kind in ("cart", "hstree"), provenance=PROV, grid=GRID,
                  params={"n_estimators": 20} if kind in ("rf", "rulefit") else None)
        paths[kind] = save_model(m, d / f"policy.{kind}.json")
    return lab, paths


def _x(row) -> dict[str, float]:
    return {f: float(row[f]) for f in FEATURES}


def test_labels_of_several_policies_add_one_indicator_per_policy():
    lab = policy_labels(12)
    cols, pols = training_columns(lab, None)
    assert pols == [A, B] and cols == list(FEATURES) + [policy_column(A), policy_column(B)]
    # named explicitly: indicators even for labels of one policy
    one = lab[lab["policy"] == A]
    cols, pols = training_columns(one, list(FEATURES) + ["policy"])
    assert pols == [A] and cols[-1] == "policy=fcfs+client-cap"
    assert training_columns(one, None) == (list(FEATURES), [])
    with pytest.raises(ValueError, match="no policy column"):
        training_columns(one.drop(columns="policy"), list(FEATURES) + ["policy"])
    with pytest.raises(ValueError, match="indicator column"):
        training_columns(lab, list(FEATURES) + ["policy=vllm"])


@pytest.mark.parametrize("kind", KINDS)
def test_one_model_recommends_per_policy(policy_models, kind):
    lab, paths = policy_models
    m = load_model(paths[kind])
    assert m["policies"] == [A, B]
    assert m["features"][-2:] == [policy_column(A), policy_column(B)]
    hits, differ = 0, 0
    for _, r in lab.iterrows():
        res = predict(m, _x(r), policy=r["policy"])
        assert res["policy"] == r["policy"]
        hits += (res["served_adapters"], res["adapter_slots"]) == (r["served_adapters"], r["adapter_slots"])
    for _, r in lab[lab["policy"] == A].iterrows():
        differ += predict(m, _x(r), policy=A)["served_adapters"] > predict(m, _x(r), policy=B)["served_adapters"]
    # the trees fit the rule; RuleFit's lasso keeps few terms (an approximation of it)
    need = 0.8 if kind == "rulefit" else 0.9
    assert hits >= need * len(lab), (kind, hits)
    assert differ >= need * (len(lab) // 2), (kind, differ)
    # the default policy is the published one
    r = lab.iloc[0]
    assert predict(m, _x(r)) == predict(m, _x(r), policy=A)


def test_json_round_trip_keeps_the_policies(policy_models, tmp_path):
    lab, paths = policy_models
    m = load_model(paths["rf"])
    again = load_model(save_model({k: v for k, v in m.items() if k != "_path"}, tmp_path / "again.json"))
    assert again["policies"] == [A, B] and again["features"] == m["features"]
    for _, r in lab.head(10).iterrows():
        for pol in (A, B):
            assert predict(again, _x(r), policy=pol) == predict(m, _x(r), policy=pol)


def test_an_unknown_policy_is_refused_naming_the_known_ones(policy_models):
    lab, paths = policy_models
    m = load_model(paths["cart"])
    with pytest.raises(ValueError, match=r"'chameleon'.*knows fcfs\+client-cap, vllm-partition"):
        predict(m, _x(lab.iloc[0]), policy="chameleon")
    # a model not trained on the published policy needs --policy
    only_b = train(policy_labels(30).query("policy == @B"), "cart", features=list(FEATURES) + ["policy"],
                   search=False, provenance=PROV, grid=GRID)
    with pytest.raises(ValueError, match=r"'fcfs\+client-cap'.*knows vllm-partition"):
        predict(only_b, _x(lab.iloc[0]))
    assert predict(only_b, _x(lab.iloc[0]), policy=B)["policy"] == B


def test_a_model_without_policy_features_refuses_another_policy():
    shipped = load_model(shipped_model_path("llama-3.1-8b_h100_vllm085", "rf"))
    # no indicators; the one policy it was trained on is recorded as "policy" (absent: the published one)
    assert "policies" not in shipped and shipped.get("policy", A) == A
    x = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    base = predict(shipped, x)
    assert base["policy"] == A and predict(shipped, x, policy=A) == base
    with pytest.raises(ValueError, match="trained without policy features.*'fcfs\\+client-cap' runs only"):
        predict(shipped, x, policy="vllm")
    # trained on one other policy without indicators: that policy is its own, the published one is refused
    m = train(policy_labels(30).query("policy == @B"), "cart", search=False, provenance=PROV, grid=GRID)
    assert m["policy"] == B and "policies" not in m
    assert predict(m, x)["policy"] == B
    with pytest.raises(ValueError, match="trained without policy features, on 'vllm-partition'"):
        predict(m, x, policy=A)


def test_rules_text_shows_the_policy_condition(policy_models):
    _, paths = policy_models
    for kind in ("cart", "hstree"):
        text = format_rules(load_model(paths[kind]))
        assert "policy is vllm-partition" in text or "policy is fcfs+client-cap" in text, text
        assert "policy=" not in text
    if "rulefit" in paths:
        text = format_rule_ensembles(load_model(paths["rulefit"]))
        assert "policy is" in text and "policy=" not in text, text


def test_condition_text_on_an_indicator():
    f = policy_column("chameleon")
    assert describe_condition(f, "<=", 0.5) == "policy is not chameleon"
    assert describe_condition(f, "<", 1.0) == "policy is not chameleon"
    assert describe_condition(f, ">", 0.5) == "policy is chameleon"
    assert describe_condition(f, ">=", 1.0) == "policy is chameleon"
    assert describe_condition(f, "<=", 1.5) == "policy=chameleon <= 1.5"  # holds for both: kept numeric
    assert describe_condition("rate_max", "<=", 0.25) == "rate_max <= 0.25"
    conds = [{"feature": "rate_max", "op": ">", "value": 0.3},
             {"feature": policy_column("a"), "op": "<=", "value": 0.5},
             {"feature": policy_column("b"), "op": "<=", "value": 0.5}]
    assert readable_conditions(conds) == ["rate_max > 0.3", "policy is not a", "policy is not b"]
    assert readable_conditions(conds, ["a", "b", "c"]) == ["rate_max > 0.3", "policy is c"]
    conds.append({"feature": policy_column("c"), "op": ">", "value": 0.5})
    assert readable_conditions(conds) == ["rate_max > 0.3", "policy is c"]


def test_predict_cli_policy(policy_models, capsys):
    _, paths = policy_models
    p = configure_parser()
    base = ["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32"]
    out = {}
    for pol in (A, B):
        ns = p.parse_args(base + ["--model", str(paths["cart"]), "--policy", pol, "--json", "--explain"])
        assert ns.func(ns) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["policy"] == pol and f"policy is {pol}" in d["rule_path"]
        out[pol] = (d["served_adapters"], d["adapter_slots"])
    assert out[A] != out[B]
    ns = p.parse_args(base + ["--model", str(paths["cart"]), "--policy", B, "--explain"])
    assert ns.func(ns) == 0
    text = capsys.readouterr().out
    assert "policy vllm-partition" in text and "policy is vllm-partition" in text
    ns = p.parse_args(["configure", "rules", "--model", str(paths["cart"]), "--json"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["policies"] == [A, B] and any(c["feature"] == policy_column(B) for r in d["rules"] for c in r["conditions"])
    ns = p.parse_args(base + ["--model", str(paths["cart"]), "--policy", "sjf"])
    with pytest.raises(ValueError, match=r"unknown policy 'sjf' \(no preset of `twin policies`\); this configurator "
                                         r"knows fcfs"):
        ns.func(ns)
    ns = p.parse_args(base + ["--model", str(paths["cart"]), "--feature", f"policy={B}=1"])
    with pytest.raises(ValueError, match="--policy NAME"):
        ns.func(ns)
    ns = p.parse_args(base + ["--policy", "vllm"])  # the shipped model: no policy features
    with pytest.raises(ValueError, match="trained without policy features"):
        ns.func(ns)


def length_labels() -> pd.DataFrame:
    """Synthetic labels, each scenario under two length mixes: long prompts halve the served adapters."""
    short = synthetic_labels(40).assign(mean_input_tokens=222.0, mean_output_tokens=197.0)
    long = synthetic_labels(40).assign(mean_input_tokens=800.0, mean_output_tokens=197.0)
    long["served_adapters"] //= 2
    return pd.concat([short, long], ignore_index=True)


def test_length_mix_round_trips_through_predict(tmp_path, capsys):
    lab = length_labels()
    feats = list(FEATURES) + ["mean_input_tokens", "mean_output_tokens"]
    m = train(lab, "cart", features=feats, search=False, provenance=PROV, grid=GRID)
    path = save_model(m, tmp_path / "lengths.cart.json")
    m = load_model(path)
    assert m["features"] == feats and "policies" not in m
    for _, r in lab.iterrows():
        x = {**_x(r), **length_columns(m, (r["mean_input_tokens"], r["mean_output_tokens"]))}
        assert predict(m, x)["served_adapters_raw"] == pytest.approx(r["served_adapters"], rel=1e-5)
    p = configure_parser()
    rates, ranks = rate_triples()[0], rank_multisets()[0]  # the first scenario of length_labels
    base = ["configure", "predict", "--rates", ",".join(map(str, rates)), "--ranks", ",".join(map(str, ranks)),
            "--model", str(path)]
    served = {}
    for lengths in ("222,197", "800,197"):
        ns = p.parse_args(base + ["--lengths", lengths, "--json", "--explain"])
        assert ns.func(ns) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["lengths"] == [float(v) for v in lengths.split(",")]
        assert any(c.startswith("mean_input_tokens") for c in d["rule_path"])
        served[lengths] = d["served_adapters"]
    assert served["800,197"] < served["222,197"]
    ns = p.parse_args(base + ["--lengths", "800,197", "--explain"])
    assert ns.func(ns) == 0
    assert "lengths 800/197" in capsys.readouterr().out
    ns = p.parse_args(base)  # trained on the lengths: they must be given
    with pytest.raises(ValueError, match="--lengths IN,OUT"):
        ns.func(ns)
    ns = p.parse_args(base + ["--lengths", "800,197", "--feature", "mean_input_tokens=800"])
    with pytest.raises(ValueError, match="both set the request-length mix"):
        ns.func(ns)
    for bad in ("800", "800,-1", "a,b"):
        ns = p.parse_args(base + ["--lengths", bad])
        with pytest.raises(ValueError, match="--lengths"):
            ns.func(ns)


def test_a_model_without_length_features_refuses_another_length_mix(capsys):
    p = configure_parser()
    base = ["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32"]
    ns = p.parse_args(base + ["--lengths", "800,197"])
    with pytest.raises(ValueError, match="trained without the length-mix features"):
        ns.func(ns)
    ns = p.parse_args(base + ["--lengths", "222,197", "--json"])  # the published mix: accepted
    assert ns.func(ns) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == A


def test_evaluate_predicts_a_policy_model_for_the_published_policy(policy_models):
    from twin.configurator.evaluate import model_predictions

    lab, paths = policy_models
    truth = lab[lab["policy"] == A].head(8)
    m = load_model(paths["cart"])
    got = model_predictions(m, truth)
    want = [predict(m, _x(r), policy=A)["served_adapters_raw"] for _, r in truth.iterrows()]
    assert got["served_raw"].tolist() == want
    only_b = train(policy_labels(30).query("policy == @B"), "cart", search=False, provenance=PROV, grid=GRID)
    with pytest.raises(ValueError, match="trained without policy features"):
        model_predictions(only_b, truth)


def test_the_grid_search_trains_on_a_few_scenarios():
    """8 scenarios and 5 folds: the halving search's first round needs 2 scenarios per fold, so the
    folds are capped at half the scenarios (scikit-learn refused 5 folds of 8 before)."""
    lab = policy_labels(4)
    assert len(lab) == 8
    m = train(lab, "cart", cv=5, provenance=PROV, grid=GRID)
    assert m["provenance"]["cv_folds"] == 4 and m["policies"] == [A, B]


def test_search_walks_the_twin_with_the_policy_and_lengths(tmp_path, capsys):
    p = configure_parser()
    base = ["configure", "search", "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--served", "8,16", "--slots",
            "8", "--window", "30", "--cache", str(tmp_path / "cache"), "--json"]
    ns = p.parse_args(base + ["--policy", B, "--lengths", "300,150"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["policy"] == B and d["lengths"] == [300.0, 150.0] and d["runs"] >= 1
    from twin.sweep.runner import read_results

    runs = read_results(tmp_path / "cache")
    assert set(runs["policy"]) == {B} and set(runs["mean_input_tokens"]) == {300.0}
    for bad, msg in ((["--policy", "nope"], "unknown policy 'nope'"), (["--lengths", "600,300"], "reachable range")):
        ns = p.parse_args(base + bad)
        with pytest.raises(ValueError, match=msg):
            ns.func(ns)
