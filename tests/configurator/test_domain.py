"""The training domain of a configurator (twin/configurator/domain.py) and predict's warning outside it."""

from __future__ import annotations

import json

import pytest

from twin.configurator.domain import describe, feature_box, grid_box, outside, training_domain
from twin.configurator.labels import FEATURES, features_of
from twin.configurator.models import load_model, save_model, train
from twin.sweep.grid import rank_multisets, rate_triples

from tests.configurator.test_models import GRID, synthetic_labels
from tests.helpers import configure_parser

INSIDE = ("0.4,0.05,0.00625", "8,16,32")


def test_shipped_model_domain_is_the_published_grid_box():
    d = training_domain(load_model("llama-3.1-8b_h100_vllm085", "rf"))
    # trained on all 831 non-test scenarios, it stores the box of its training labels: the grid's box
    assert d["source"] == "the training scenarios"
    box = d["features"]
    assert set(box) == set(FEATURES)
    assert box["rate_max"] == [0.0125, 3.2] and box["rate_min"] == [0.003125, 0.8]
    assert box["rank_max"] == [8.0, 32.0] and box["rank_std"][0] == 0.0
    # every scenario of the grid is inside; the box is exactly theirs
    rows = [features_of(r, k) for r in rate_triples() for k in rank_multisets()]
    assert all(not outside(d, x) for x in rows)
    for f in FEATURES:
        assert box[f] == [min(x[f] for x in rows), max(x[f] for x in rows)]


@pytest.mark.parametrize("rates,ranks,flagged", [
    ([100, 0.05, 0.1], [8, 16, 32], {"rate_max", "rate_mean", "rate_std"}),
    ([0.4], [8], {"rate_std"}),  # one rate class: no triple of distinct rates has a std of 0
    ([0.4, 0.05, 0.1], [8, 16, 512], {"rank_max", "rank_mean", "rank_std"}),
    ([0.4, 0.05, 0.00625], [8, 16, 32], set()),
])
def test_outside_names_the_features_off_the_box(rates, ranks, flagged):
    d = training_domain(load_model("llama-3.1-8b_h100_vllm085", "rf"))
    off = outside(d, features_of(rates, ranks))
    assert {e["feature"] for e in off} == flagged
    for e in off:
        assert e["value"] < e["lo"] or e["value"] > e["hi"]
        assert e["feature"] in describe(off)


def test_train_stores_the_labels_box_and_it_wins_over_the_grid(tmp_path):
    lab = synthetic_labels(40)
    m = train(lab, "cart", cv=3, search=False, grid=GRID,
              provenance={"profile": "p", "rule": "throughput90", "sweeps": [{"grid": "adapter-twin-llama"}]})
    assert m["provenance"]["domain"] == feature_box(lab, FEATURES)
    m2 = load_model(save_model(m, tmp_path / "p.cart.json"))
    d = training_domain(m2)
    assert d["source"] == "the training scenarios"
    assert d["features"] == feature_box(lab, FEATURES)


def test_no_domain_without_provenance_or_named_grid():
    assert training_domain({"features": list(FEATURES), "provenance": {}}) is None
    assert grid_box(["my-grid.toml"], FEATURES) is None
    assert outside(None, features_of([9.0], [8])) == []


def test_predict_warns_outside_and_reports_the_domain(capsys):
    p = configure_parser()
    ns = p.parse_args(["configure", "predict", "--rates", "100,0.05,0.1", "--ranks", "8,16,32"])
    assert ns.func(ns) == 0
    cap = capsys.readouterr()
    assert "outside the model's training domain (the training scenarios): rate_max 100 > 3.2" in cap.err
    assert "serve " in cap.out
    ns = p.parse_args(["configure", "predict", "--rates", INSIDE[0], "--ranks", INSIDE[1], "--json"])
    assert ns.func(ns) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert json.loads(cap.out)["domain"] == {"source": "the training scenarios", "outside": []}
