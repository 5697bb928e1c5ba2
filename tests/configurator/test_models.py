"""Configurator models: training, JSON without scikit-learn, rules, predict / rules CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import configure_parser
from twin.configurator.labels import FEATURES, features_of
from twin.configurator.models import (format_rules, load_model, predict, read_model_text, rules_predict,
                                      save_model, snap_config, train)
from twin.sweep.grid import PUBLISHED_GRID, rank_multisets, rate_triples

ROOT = Path(__file__).resolve().parents[2]
GRID = {"served": list(PUBLISHED_GRID), "slots": list(PUBLISHED_GRID)}


def _has_imodels() -> bool:
    try:
        import imodels  # noqa: F401
    except ImportError:
        return False
    return True


HAS_IMODELS = _has_imodels()
#: the kinds the model tests train: imodels' FIGS only where the optional extra is installed
TEST_KINDS = ("rf", "cart", "hstree") + (("figs",) if HAS_IMODELS else ())
needs_imodels = pytest.mark.skipif(not HAS_IMODELS, reason="imodels is not installed (the optional extra: "
                                                           "pip install 'lora-twin[configurator]')")


def synthetic_labels(n: int = 80) -> pd.DataFrame:
    """Labels from a known rule: served falls with the total rate, slots grow with the top rank."""
    rows = []
    trip, ranks = rate_triples(), rank_multisets()
    for i in range(n):
        r, k = trip[(i * 7) % len(trip)], ranks[i % len(ranks)]
        f = features_of(r, k)
        served = 384 if f["rate_max"] < 0.2 else 160 if f["rate_max"] < 0.5 else 64 if f["rate_max"] < 1 else 32
        slots = 32 if f["rank_max"] == 32 else 64
        slots = min(slots, served)
        rows.append({**f, "scenario": f"s{i}", "served_adapters": served, "adapter_slots": slots,
                     "throughput_tok_s": 1000.0 * min(f["rate_mean"] * served, 12.0) + 100.0})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    lab = synthetic_labels()
    d = tmp_path_factory.mktemp("models")
    out = {}
    for kind in TEST_KINDS:
        m = train(lab, kind, cv=3, provenance={"profile": "test-profile", "rule": "throughput90"}, grid=GRID)
        out[kind] = save_model(m, d / f"test-profile.{kind}.json")
    return lab, out


def test_train_fits_the_known_rule(models):
    lab, paths = models
    for kind, p in paths.items():
        m = load_model(p)
        assert m["kind"] == kind and m["provenance"]["scenarios"] == len(lab)
        assert "best_params" in m["provenance"]
        hits = 0
        for _, r in lab.iterrows():
            res = predict(m, {f: r[f] for f in FEATURES})
            hits += (res["served_adapters"], res["adapter_slots"]) == (r["served_adapters"], r["adapter_slots"])
        assert hits >= 0.9 * len(lab)


@pytest.mark.parametrize("kind", ["cart", "hstree"])
def test_cart_rules(models, kind):
    _, paths = models
    m = load_model(paths[kind])
    assert 1 <= len(m["rules"]) <= 30
    text = format_rules(m)
    assert text.count("\nR") == len(m["rules"]) and "THEN served" in text
    # the rules agree with the tree on every point
    rng = np.random.default_rng(0)
    trip, ranks = rate_triples(), rank_multisets()
    for _ in range(50):
        x = features_of(trip[rng.integers(len(trip))], ranks[rng.integers(len(ranks))])
        r = rules_predict(m["rules"], x)
        p = predict(m, x)
        assert r is not None
        assert r["predict"]["served_adapters"] == pytest.approx(p["served_adapters_raw"])


def test_predict_without_sklearn(models):
    _, paths = models
    code = ("import sys; sys.modules['sklearn'] = None; sys.modules['imodels'] = None\n"
            "from twin.configurator.models import load_model, predict\n"
            "from twin.configurator.labels import features_of\n"
            f"for p in {[str(p) for p in paths.values()]!r}:\n"
            "    m = load_model(p)\n"
            "    print(predict(m, features_of([0.4, 0.05, 0.00625], [8, 16, 32]))['served_adapters'])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    got = [int(x) for x in out.stdout.split()]
    assert len(got) == len(paths) and all(g in PUBLISHED_GRID for g in got)


@needs_imodels
def test_figs_json_predicts_exactly_what_the_estimator_predicts(models):
    """The exported FIGS trees (a sum, ``combine == "sum"``) reproduce imodels' own prediction on
    every training row, and the file stores the estimator's arguments."""
    from twin.configurator.models import _estimator

    lab, paths = models
    m = load_model(paths["figs"])
    assert m["kind"] == "figs" and m["combine"] == "sum" and m["provenance"]["estimator"] == "FIGSRegressor"
    params = m["provenance"]["params"]
    assert {"max_rules", "max_trees"} <= set(params) and params["max_rules"] <= 30
    assert sum(sum(1 for f in t["feature"] if f >= 0) for t in m["trees"]) <= params["max_rules"]
    est, _ = _estimator("figs", 0)
    est.set_params(**{k: params[k] for k in ("max_rules", "max_trees", "max_depth", "min_impurity_decrease")})
    X = lab[list(FEATURES)].to_numpy(float)
    est.fit(X, np.log(lab[["served_adapters", "adapter_slots", "throughput_tok_s"]].to_numpy(float)))
    want = np.exp(est.predict(X))
    for i, (_, r) in enumerate(lab.iterrows()):
        res = predict(m, {f: r[f] for f in FEATURES}, explain=True)
        assert res["served_adapters_raw"] == pytest.approx(want[i, 0], rel=1e-6)
        assert res["adapter_slots_raw"] == pytest.approx(want[i, 1], rel=1e-6)
        assert res["throughput_tok_s"] == pytest.approx(want[i, 2], rel=1e-6)
        assert "uncertainty" not in res and res["rule_path"][0] == "[tree 1]"
        assert len(res["rule_path_by_tree"]) == len(m["trees"])


def test_hstree_json_predicts_exactly_what_the_estimator_predicts(models):
    """The exported hierarchical-shrinkage tree reproduces the estimator on every training row, and
    needs no imodels (it is trained with imodels hidden)."""
    from twin.configurator.hstree import HSTreeMultiRegressor

    lab, paths = models
    m = load_model(paths["hstree"])
    assert m["kind"] == "hstree" and m["provenance"]["estimator"] == "HSTreeMultiRegressor"
    params = m["provenance"]["params"]
    assert params["max_leaf_nodes"] <= 30 and params["reg_param"] >= 0
    est = HSTreeMultiRegressor(**params)
    X = lab[list(FEATURES)].to_numpy(float)
    est.fit(X, np.log(lab[["served_adapters", "adapter_slots", "throughput_tok_s"]].to_numpy(float)))
    want = np.exp(est.predict(X))
    for i, (_, r) in enumerate(lab.iterrows()):
        res = predict(m, {f: r[f] for f in FEATURES})
        assert res["served_adapters_raw"] == pytest.approx(want[i, 0], rel=1e-5)
        assert res["adapter_slots_raw"] == pytest.approx(want[i, 1], rel=1e-5)


def test_hstree_trains_without_imodels(monkeypatch):
    monkeypatch.setitem(sys.modules, "imodels", None)
    m = train(synthetic_labels(20), "hstree", search=False)
    assert m["kind"] == "hstree" and m["rules"]


def test_an_imodels_kind_without_imodels_names_the_extra(monkeypatch, tmp_path, capsys):
    from twin.sweep.runner import MissingExtra

    monkeypatch.setitem(sys.modules, "imodels", None)
    with pytest.raises(MissingExtra, match=r"pip install 'lora-twin\[configurator\]'"):
        train(synthetic_labels(12), "figs", search=False)
    lab = tmp_path / "lab.csv"
    synthetic_labels(12).to_csv(lab, index=False)
    p = configure_parser()
    ns = p.parse_args(["configure", "train", str(lab), "--kind", "figs", "--out", str(tmp_path / "m.json")])
    assert ns.func(ns) == 2
    assert "lora-twin[configurator]" in capsys.readouterr().err and not (tmp_path / "m.json").exists()


def test_snap():
    assert snap_config(150, 40, list(PUBLISHED_GRID), list(PUBLISHED_GRID)) == (160, 32)
    assert snap_config(20, 300, list(PUBLISHED_GRID), list(PUBLISHED_GRID)) == (16, 16)


def test_predict_and_rules_cli(models, capsys):
    _, paths = models
    p = configure_parser()
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--model",
                       str(paths["rf"]), "--json", "--explain", "--adapters", "1000", "--gpu-hour-usd", "3"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("served_adapters", "adapter_slots", "throughput_tok_s", "uncertainty", "rule_path", "gpus_needed",
              "usd_per_million_tokens", "offered_tok_s"):
        assert k in d
    # the cost of the user's adapters: their traffic (in proportion to the adapters) over the GPUs they take
    n, g = 1000, d["gpus_needed"]
    assert g == -(-n // d["served_adapters"])
    assert d["usd_per_million_tokens"] == pytest.approx(g * 3 / (d["throughput_tok_s"] * n / d["served_adapters"]
                                                                 * 3600 / 1e6))
    assert d["throughput_tok_s"] <= d["offered_tok_s"]
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--model",
                       str(paths["cart"]), "--explain"])
    assert ns.func(ns) == 0
    assert "rule path" in capsys.readouterr().out
    if "figs" in paths:
        ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--model",
                           str(paths["figs"]), "--explain", "--json"])
        assert ns.func(ns) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["model"] == "figs" and d["served_adapters"] in PUBLISHED_GRID and d["rule_path"]
    ns = p.parse_args(["configure", "rules", "--model", str(paths["cart"])])
    assert ns.func(ns) == 0
    assert "IF" in capsys.readouterr().out
    ns = p.parse_args(["configure", "rules", "--model", str(paths["hstree"]), "--kind", "hstree"])
    assert ns.func(ns) == 0
    assert "hstree configurator" in capsys.readouterr().out


def test_dataset_and_train_cli_on_a_sweep(tmp_path, capsys):
    from twin.sweep.grid import load_grid
    from twin.sweep.runner import run_sweep

    run_sweep(load_grid("smoke"), tmp_path / "sw", progress=False)
    p = configure_parser()
    ns = p.parse_args(["configure", "dataset", str(tmp_path / "sw"), "--out", str(tmp_path / "lab.csv"), "--json"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scenarios"] == 2
    for rule in ("robust", "slo"):
        ns = p.parse_args(["configure", "dataset", str(tmp_path / "sw"), "--rule", rule,
                           *(["--slo-share", "0.5"] if rule == "slo" else ["--tolerance", "0.05"])])
        assert ns.func(ns) == 0
    capsys.readouterr()
    ns = p.parse_args(["configure", "train", str(tmp_path / "sw"), "--kind", "cart", "--no-search", "--out",
                       str(tmp_path / "m.json"), "--json"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scenarios"] == 2 and Path(d["model"]).exists()
    m = load_model(tmp_path / "m.json")
    assert m["grid"]["slots"] == [8, 16] and m["provenance"]["sweeps"][0]["grid"] == "smoke"
    # --features on a sweep directory (a NameError traceback until stop 58: pandas was imported only for labels files)
    ns = p.parse_args(["configure", "train", str(tmp_path / "sw"), "--kind", "cart", "--no-search", "--out",
                       str(tmp_path / "m2.json"), "--features", "rate_max,rank_max,mean_input_tokens,arrival_cv"])
    assert ns.func(ns) == 0
    assert load_model(tmp_path / "m2.json")["features"] == ["rate_max", "rank_max", "mean_input_tokens", "arrival_cv"]


def test_unknown_model_kind_is_refused():
    with pytest.raises(ValueError, match="unknown model kind"):
        train(synthetic_labels(12), "xgboost", search=False)


def test_predict_takes_extra_features_the_model_was_trained_on(tmp_path, capsys):
    """A model trained with ``--features`` beyond the triples needs them at prediction
    (``--feature NAME=VALUE``); without them the error names the flag, and the value matters."""
    lab = synthetic_labels()
    lab["mean_input_tokens"] = [100.0 if i % 2 else 800.0 for i in range(len(lab))]
    # longer prompts halve the served adapters: the tree must split on the extra feature
    lab.loc[lab["mean_input_tokens"] > 400, "served_adapters"] //= 2
    feats = list(FEATURES) + ["mean_input_tokens"]
    m = train(lab, "cart", features=feats, cv=3, search=False,
              provenance={"profile": "test-profile", "rule": "throughput90"}, grid=GRID)
    path = save_model(m, tmp_path / "extra.cart.json")
    p = configure_parser()
    base = ["configure", "predict", "--rates", "0.1,0.05,0.00625", "--ranks", "8,16,32", "--model", str(path), "--json"]
    ns = p.parse_args(base)
    with pytest.raises(ValueError, match="--feature mean_input_tokens="):
        ns.func(ns)
    served = {}
    for v in ("100", "800"):
        ns = p.parse_args(base + ["--feature", f"mean_input_tokens={v}"])
        assert ns.func(ns) == 0
        served[v] = json.loads(capsys.readouterr().out)["served_adapters"]
    assert served["800"] < served["100"]
    for bad in ("mean_input_tokens", "=3", "mean_input_tokens=abc"):
        ns = p.parse_args(base + ["--feature", bad])
        with pytest.raises(ValueError, match="--feature"):
            ns.func(ns)


def test_predict_refuses_a_feature_the_model_does_not_use(models):
    _, paths = models
    p = configure_parser()
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--model",
                       str(paths["rf"]), "--feature", "mean_input_tokens=222"])
    with pytest.raises(ValueError, match="does not use it"):
        ns.func(ns)


# --------------------------------------------------------------------------- float32 splits, file format
def test_float32_split_threshold_takes_the_float32_branch_for_every_input():
    """``x <= float32_split_threshold(t)`` holds exactly when ``float32(x) <= t``: checked at the
    thresholds scikit-learn writes (midpoints of float32 values, float32 values themselves) on the
    float64 values around each rounding boundary, ties to even included."""
    from twin.configurator.models import float32_split_threshold

    rng = np.random.default_rng(7)
    a = rng.uniform(1e-4, 400, 400).astype(np.float32)
    b = np.nextafter(a, np.float32(np.inf))
    thresholds = list(a.astype(float)) + list((a.astype(float) + b.astype(float)) / 2) + [0.053125, 1.2750000357627869]
    for t in thresholds:
        tp = float32_split_threshold(t)
        t32 = np.float32(t) if float(np.float32(t)) <= t else np.nextafter(np.float32(t), np.float32(-np.inf))
        mid = (float(t32) + float(np.nextafter(t32, np.float32(np.inf)))) / 2
        for x in (t, tp, mid, np.nextafter(mid, 0.0), np.nextafter(mid, np.inf), float(t32),
                  float(np.nextafter(t32, np.float32(np.inf)))):
            # scikit-learn's comparison: the float32 input widened to float64 against the float64 threshold
            assert (float(x) <= tp) == (float(np.float32(x)) <= t), (t, x)


def test_an_exported_tree_predicts_what_scikit_learn_predicts_at_its_split_points():
    """Scenario features that fall on a split (a rate mean halfway between two training means, where
    scikit-learn's float32 cast decides the branch) get scikit-learn's prediction from the JSON tree."""
    from sklearn.tree import DecisionTreeRegressor

    from twin.configurator.models import export_tree, tree_apply

    rates = [features_of(r, k) for r, k in zip(rate_triples(), rank_multisets() * 20)]
    X = np.asarray([[f["rate_mean"], f["rate_std"]] for f in rates], float)
    y = np.log1p(np.arange(len(X)) % 17)
    est = DecisionTreeRegressor(random_state=0).fit(X, y)
    tree = export_tree(est)
    splits = [i for i, lc in enumerate(est.tree_.children_left) if lc != -1]
    points = []
    for i in splits:  # the raw thresholds and the float64 values that round to them
        t, f = float(est.tree_.threshold[i]), int(est.tree_.feature[i])
        for v in (t, float(np.float32(t)), np.nextafter(t, np.inf), np.nextafter(float(np.float32(t)), np.inf)):
            p = X[0].copy()
            p[f] = v
            points.append(p)
    P = np.asarray(points)
    want = est.predict(P)
    got = np.asarray([tree_apply(tree, p)[0][0] for p in P])
    assert np.allclose(got, np.round(want, 6), atol=1e-6)
    plain = [est.tree_.value[_leaf_float64(est, p)][0][0] for p in P]  # a float64 walk of the raw thresholds
    assert not np.allclose(plain, want), "the points must include one where float32 and float64 walks part"


def _leaf_float64(est, x) -> int:
    t, node = est.tree_, 0
    while t.children_left[node] != -1:
        node = t.children_left[node] if x[t.feature[node]] <= t.threshold[node] else t.children_right[node]
    return node


def test_model_files_store_leaf_values_only_and_load_the_old_per_node_format(models, tmp_path):
    """A saved tree keeps values and counts per leaf (``leaf_value``, ``leaf_n``); loading gives the
    per-node lists back, and a file of the earlier per-node format predicts the same."""
    from twin.configurator.models import pack_tree, unpack_tree

    lab, paths = models
    stored = json.loads(Path(paths["rf"]).read_text())
    tree = stored["trees"][0]
    assert "value" not in tree and len(tree["leaf_value"]) == sum(lc == -1 for lc in tree["left"]) == len(tree["leaf_n"])
    m = load_model(paths["rf"])
    assert unpack_tree(pack_tree(m["trees"][0])) == m["trees"][0]
    old = dict(stored, trees=[unpack_tree(t) for t in stored["trees"]])
    (tmp_path / "old.json").write_text(json.dumps(old))
    m_old = load_model(tmp_path / "old.json")
    for _, r in lab.head(20).iterrows():
        x = {f: r[f] for f in FEATURES}
        assert predict(m_old, x) == {k: v for k, v in predict(m, x).items()}
    bad = dict(stored, trees=[dict(tree, leaf_value=tree["leaf_value"][:-1])])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="damaged: retrain"):
        load_model(tmp_path / "bad.json")


def test_the_shipped_model_files_are_small_and_leaf_packed():
    from twin.configurator.models import MODEL_DIR

    files = sorted(MODEL_DIR.glob("*.json*"))
    assert files
    for f in files:
        assert f.stat().st_size < 1_000_000, f"{f.name}: {f.stat().st_size} bytes"
        text = read_model_text(f)
        trees = json.loads(text)["trees"]
        assert all("leaf_value" in t for t in trees), f.name
        # a forest grows with its training scenarios (the Llama forest: 50 trees grown on 831 scenarios,
        # 52,654 nodes, 1.9 MB of JSON, shipped gzip-compressed); what stays fixed is the packing: values
        # at the leaves only, ~36 bytes of JSON a node (values at every node would take ~65)
        nodes = sum(len(t["left"]) for t in trees)
        if nodes > 1000:
            assert len(text) / nodes < 45, f"{f.name}: {len(text) / nodes:.1f} bytes per node"


def test_a_gzip_model_file_is_the_same_model(models, tmp_path):
    """``save_model`` compresses a ``.gz`` name (the same bytes for the same model) and
    ``load_model`` reads it back as the model of the plain file."""
    lab, paths = models
    m = load_model(paths["rf"])
    gz = save_model(m, tmp_path / "m.rf.json.gz")
    assert gz.read_bytes() == save_model(m, tmp_path / "again.rf.json.gz").read_bytes()
    assert read_model_text(gz) == Path(paths["rf"]).read_text()
    x = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    assert predict(load_model(gz), x) == predict(m, x)
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="cannot read the configurator model"):
        load_model(tmp_path / "bad.json.gz")


@pytest.mark.parametrize("text, message", [
    ("not json", r"not a configurator model \(not valid JSON"),
    ("[1, 2]", r"not a configurator model \(schema None, expected 'lora-twin-configurator/1'\)"),
    ('{"schema": "lora-twin-configurator/1"}', r"damaged configurator model \('kind' missing"),
    ('{"schema": "lora-twin-configurator/1", "kind": "rf", "features": ["rate_max"], "targets": '
     '["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {}, "trees": [{"left": [1]}]}',
     r"tree 0 lacks one of"),
    ('{"schema": "lora-twin-configurator/1", "kind": "rf", "features": ["rate_max"], "targets": '
     '["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {}, "trees": [{"left": [5, -1, -1], '
     '"right": [2, -1, -1], "feature": [0, -2, -2], "threshold": [0.5, -2, -2], "leaf_value": [[1, 1, 1], [2, 2, 2]], '
     '"leaf_n": [1, 1]}]}', r"tree 0, node 0: a child or feature index out of range"),
    # a split that points back at itself: a walk would never reach a leaf
    ('{"schema": "lora-twin-configurator/1", "kind": "rf", "features": ["rate_max"], "targets": '
     '["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {}, "trees": [{"left": [0, -1, -1], '
     '"right": [2, -1, -1], "feature": [0, -2, -2], "threshold": [0.5, -2, -2], "leaf_value": [[1, 1, 1], [2, 2, 2]], '
     '"leaf_n": [1, 1]}]}', r"tree 0, node 0: a child or feature index out of range \(children must follow"),
    ('{"schema": "lora-twin-configurator/1", "kind": "rf", "features": ["rate_max"], "targets": '
     '["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {}, "trees": [{"left": [1, -1, -1], '
     '"right": [2, -1, -1], "feature": [0, -2, -2], "threshold": [0.5, -2, -2], "leaf_value": [[1, 1], [2, 2, 2]], '
     '"leaf_n": [1, 1]}]}', r"tree 0: a leaf value that is not 3 numbers"),
    ('{"schema": "lora-twin-configurator/1", "kind": "rulefit", "features": ["rate_max"], "targets": '
     '["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {}, "trees": [], "combine": '
     '"rule_ensemble", "rule_ensembles": [{"target": "served_adapters", "linear": [], "rules": []}, {}, {}]}',
     r"a rule ensemble without its intercept, linear terms or rules"),
])
def test_a_malformed_model_file_is_refused_naming_the_file_and_the_fix(tmp_path, text, message):
    p = tmp_path / "m.json"
    p.write_text(text)
    with pytest.raises(ValueError, match=message + r".*written by `twin configure train`"):
        load_model(p)


def test_dataset_and_train_refuse_what_is_not_a_sweep_naming_the_fix(tmp_path):
    """A CSV without the run columns used to fail inside pandas ("No group keys passed!"), and a
    missing labels file with a bare errno message."""
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    p = configure_parser()
    for argv, message in ((["configure", "dataset", str(bad)], r"not a sweep's run table \(missing columns \['scenario'"),
                          (["configure", "dataset", str(tmp_path / "none")], r"no such sweep directory or run table"),
                          (["configure", "train", str(tmp_path / "none.csv")], r"no such sweep directory or labels file")):
        ns = p.parse_args(argv)
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            ns.func(ns)


_JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(-3, 3), st.text(max_size=3)),
                        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                        max_leaves=6)
_INDICES = st.lists(st.integers(-2, 4), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.fixed_dictionaries({
    "left": _INDICES, "right": _INDICES, "feature": _INDICES,
    "threshold": st.lists(st.one_of(st.floats(-1, 1), st.integers(-2, 2), st.none()), min_size=1, max_size=5),
    "leaf_value": st.lists(st.one_of(st.lists(st.floats(-2, 2), max_size=4), _JSONISH), max_size=5),
    "leaf_n": st.lists(_JSONISH, max_size=5)}), min_size=1, max_size=2))
def test_any_damaged_tree_is_refused_or_predicts(tmp_path_factory, trees):
    """Hand-edited trees (indices out of range, a split pointing back at itself, leaves of the wrong
    size) load and predict, or are refused with the ValueError the CLI reports: never a hang in the
    tree walk, never another exception."""
    p = tmp_path_factory.mktemp("m") / "m.json"
    p.write_text(json.dumps({"schema": "lora-twin-configurator/1", "kind": "rf", "features": list(FEATURES),
                             "targets": ["served_adapters", "adapter_slots", "throughput_tok_s"], "provenance": {},
                             "trees": trees}))
    try:
        predict(load_model(p), features_of([0.4, 0.05, 0.1], [8, 16, 32]), explain=True)
    except ValueError:
        pass


def test_a_path_reads_one_bound_pair_per_feature_and_the_forest_summary_adds_up():
    from twin.configurator.models import merge_bounds, path_feature_shares

    conds = [("rate_mean", "<=", 0.2266), ("rate_mean", ">", 0.05625), ("rate_max", ">", 0.25),
             ("rate_mean", ">", 0.1375), ("rank_mean", "<=", 20.0), ("rank_mean", "<=", 17.0)]
    assert merge_bounds(conds) == ["0.1375 < rate_mean <= 0.2266", "rate_max > 0.25", "rank_mean <= 17"]
    # two one-split trees on feature 0, one on feature 1: the shares of the paths' splits
    trees = [{"feature": [0, -2, -2]}, {"feature": [0, -2, -2]}, {"feature": [1, -2, -2]}]
    shares = path_feature_shares(trees, [[0, 1], [0, 2], [0, 1]], ["rate_mean", "rank_std"])
    assert shares == {"rate_mean": 0.667, "rank_std": 0.333}


def test_the_offered_load_caps_a_prediction():
    """A model's throughput beyond the tokens the served adapters offer is capped there (an extrapolation read 1204
    tok/s for 384 adapters at 0.001 req/s, about 161 offered), and said."""
    import io
    from contextlib import redirect_stdout

    from twin.cli import main
    from twin.configurator.cli import offered_tok_s

    assert offered_tok_s([0.4, 0.05, 0.00625], 160) == pytest.approx((0.45625 * 53 + 0.4) * (222 + 197))
    assert offered_tok_s([1.0, 0.5], 3, [100, 50]) == pytest.approx(2.5 * 150)
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["configure", "predict", "--rates", "0.001,0.001,0.001", "--ranks", "8,8,8", "--json"]) == 0
    d = json.loads(buf.getvalue())
    assert d["throughput_tok_s"] == pytest.approx(d["offered_tok_s"]) and d["offered_tok_s"] < d["throughput_model_tok_s"]


@pytest.mark.parametrize("rates, ranks, kind", [("3.2,1.6,0.025", "16,16,16", "rule"),
                                               ("0.2,0.05,0.025", "8,16,32", "between"),
                                               ("0.4,0.1,0.00625", "8,16,32", "near"),
                                               ("0.4,0.05,0.00625", "8,16,32", None)])
def test_a_recommendation_expected_below_the_line_is_said(rates, ranks, kind, capsys):
    """The shipped forest's recommendation whose expected throughput is below the 90 % line is said, with why:
    * ``rule``: traffic one GPU cannot keep up with (a real test scenario whose throughput90 optimum starves on the
      server too) gets the rule's starving first run at served = slots: the note names the rule and the search
      that finds one keeping up (there `search --rule slo` gives 16 / 16 at 0.996 of the offered tokens, and the
      real server serves 0.988 at 16 / 16); the GPUs needed and the cost say the configuration starves;
    * ``between``: rates between the grid's 0.1 and 0.4 req/s read 384 served on 32 slots at 57 % (stop 69's audit):
      no training label starves at served > slots, so the note says the model reads between its scenarios;
    * ``near``: 89 % of the line, inside the model's error (the scenario's own label reads 0.903): `--check`;
    and nothing for one that keeps up. ``expected_ratio`` is the throughput over the offered tokens."""
    from twin.cli import main

    assert main(["configure", "predict", "--rates", rates, "--ranks", ranks, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ratio_line"] == 0.9 and d["expected_ratio_from"] == "model"
    assert d["expected_ratio"] == pytest.approx(d["throughput_tok_s"] / d["offered_tok_s"])
    assert d["expected_starving"] is (kind is not None) and (d["expected_ratio"] < 0.9) is (kind is not None)
    assert main(["configure", "predict", "--rates", rates, "--ranks", ranks, "--adapters", "1000"]) == 0
    out = capsys.readouterr().out
    note = [line for line in out.splitlines() if line.startswith(("starving:", "near the line:"))]
    search = (f"`twin configure search --rates {rates} --ranks {ranks} --serving-us 18 --rank-tile-cost 0.7091 "
              f"--rule slo --ttft-p99-s S`")  # (the engine the shipped model was trained on)
    more = "a configuration expected to starve, so more GPUs than this are needed" in out
    if kind is None:
        assert not note and not more
        return
    assert len(note) == 1 and f"{d['offered_tok_s']:,.0f} tok/s" in note[0]
    if kind == "rule":
        assert d["served_adapters"] == d["adapter_slots"] == 32 and "the throughput90 rule keeps" in note[0]
        assert search in note[0] and more
    elif kind == "between":
        assert d["served_adapters"] > d["adapter_slots"]
        assert "No training label starves with more served adapters than slots" in note[0] and search in note[0]
        assert more
    else:
        assert note[0].startswith("near the line:") and "`--check` runs the twin there" in note[0] and not more


def test_with_check_the_expectation_is_the_twin_s_run(capsys):
    """``--check``: ``expected_ratio`` / ``expected_starving`` are the twin's run at the checked configuration (the
    model read 0.894 and "starving" beside the check's 0.903, kept; stop 69's audit), and no model note is printed
    (the check's line says what the twin read)."""
    from twin.cli import main

    argv = ["configure", "predict", "--rates", "0.4,0.1,0.00625", "--ranks", "8,16,32", "--check"]
    assert main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    last = d["check"]["steps"][-1]
    assert d["expected_ratio_from"] == "twin check" and d["expected_ratio"] == last["ratio"]
    assert d["expected_starving"] is d["check"]["starving"] is False
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "twin check on" in out and "near the line" not in out and "starving:" not in out


def test_the_suggested_search_runs_the_model_s_profile(capsys):
    """Another profile's shipped model suggests a search on that profile (it ran the default Llama profile)."""
    from twin.cli import main

    assert main(["configure", "predict", "--profile", "qwen-2.5-7b_h100_vllm085", "--rates", "3.2,1.6,0.025",
                 "--ranks", "16,16,16"]) == 0
    assert ("`twin configure search --rates 3.2,1.6,0.025 --ranks 16,16,16 --profile qwen-2.5-7b_h100_vllm085 "
            "--rule slo --ttft-p99-s S`") in capsys.readouterr().out


def test_training_records_the_labels_starvation_line(tmp_path):
    """``train`` records the line the labels were made at (``ratio_at_label - margin``) as ``ratio_line``, which
    ``predict`` then reads (a model without it: the published 90 %)."""
    from twin.cli import main

    lab = pd.read_csv(ROOT / "results/configurator/adaptercheck/labels_llama_adaptercheck_throughput90.csv").head(60)
    lab["margin"] = lab["ratio_at_label"] - 0.8
    src = tmp_path / "labels.csv"
    lab.to_csv(src, index=False)
    out = tmp_path / "m.json"
    assert main(["configure", "train", str(src), "--kind", "cart", "--no-search", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["provenance"]["ratio_line"] == 0.8
