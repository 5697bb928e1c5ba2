"""twin/configurator/dataset.py: labels from sweeps, and labels from several sources combined."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.helpers import configure_parser
from twin.configurator.dataset import build_dataset, combine_labels, load_runs
from twin.configurator.models import load_model


def _labels(keys, rule="throughput90", profile="p"):
    return pd.DataFrame({"scenario": list(keys), "policy": "fcfs", "seed": 0, "max_lora_rank": 32,
                         "profile": profile, "rule": rule, "served_adapters": 64, "adapter_slots": 32})


def test_combine_labels_concatenates_disjoint_sources():
    lab = combine_labels([("a.csv", _labels(["s1", "s2"])), ("sweeps/x", _labels(["s3"]))])
    assert lab["scenario"].tolist() == ["s1", "s2", "s3"]
    assert "_source" not in lab


@pytest.mark.parametrize("parts, message", [
    ([("a.csv", _labels(["s1", "s2"])), ("sweeps/x", _labels(["s2", "s3"]))],
     r"1 scenario\(s\) labelled more than once, e\.g\. s2 in a\.csv, sweeps/x"),
    ([("a.csv", _labels(["s1", "s1"]))], r"labelled more than once, e\.g\. s1 in a\.csv"),
    ([("a.csv", _labels(["s1"])), ("b.csv", _labels(["s2"], rule="robust"))],
     r"the labels mix rules \(throughput90 in a\.csv; robust in b\.csv\): label every source with the same --rule"),
    ([("a.csv", _labels(["s1"])), ("b.csv", _labels(["s2"], profile="q"))],
     r"the labels mix profiles .*train one model per profile"),
    ([], r"no labels given"),
])
def test_combine_labels_refuses_what_cannot_be_one_training_set(parts, message):
    with pytest.raises(ValueError, match=message):
        combine_labels(parts)


def test_the_same_seed_or_rank_of_a_scenario_is_another_label():
    """Two seeds (or maximum ranks) of one scenario are two labels, not a duplicate."""
    b = _labels(["s1"]).assign(seed=1)
    assert len(combine_labels([("a.csv", _labels(["s1"])), ("b.csv", b)])) == 2


def test_train_on_a_labels_file_plus_a_sweep_of_the_rest(tmp_path, capsys):
    """Labels kept from one sweep and a sweep of the scenarios it did not reach train one model on
    exactly the labels of a single sweep of both; a scenario given twice is refused."""
    from twin.sweep.grid import load_grid
    from twin.sweep.runner import run_sweep

    grid = load_grid("smoke")
    keys = sorted({t["scenario"]["key"] for t in grid.tasks()})
    assert len(keys) == 2
    run_sweep(grid, tmp_path / "all", progress=False)
    run_sweep(grid, tmp_path / "first", progress=False, exclude={keys[1]})
    run_sweep(grid, tmp_path / "second", progress=False, exclude={keys[0]})
    p = configure_parser()
    ns = p.parse_args(["configure", "dataset", str(tmp_path / "first"), "--out", str(tmp_path / "first.csv")])
    assert ns.func(ns) == 0
    capsys.readouterr()
    ns = p.parse_args(["configure", "train", str(tmp_path / "first.csv"), str(tmp_path / "second"), "--kind", "cart",
                       "--no-search", "--out", str(tmp_path / "m.json"), "--json"])
    assert ns.func(ns) == 0
    assert json.loads(capsys.readouterr().out)["scenarios"] == 2
    m = load_model(tmp_path / "m.json")
    assert m["provenance"]["sweeps"][0]["grid"] == "smoke"  # the swept part's provenance is kept
    assert m["provenance"]["sources"] == [str(tmp_path / "first.csv"), str(tmp_path / "second")]
    # the combined labels are those of the single sweep of both scenarios
    cols = ["scenario", "served_adapters", "adapter_slots", "throughput_tok_s"]
    whole = build_dataset(load_runs([tmp_path / "all"]))[cols].sort_values("scenario").reset_index(drop=True)
    parts = combine_labels([("first.csv", pd.read_csv(tmp_path / "first.csv")),
                            ("second", build_dataset(load_runs([tmp_path / "second"])))])
    pd.testing.assert_frame_equal(parts[cols].sort_values("scenario").reset_index(drop=True), whole,
                                  check_dtype=False)
    ns = p.parse_args(["configure", "train", str(tmp_path / "first.csv"), str(tmp_path / "all"), "--kind", "cart",
                       "--no-search", "--out", str(tmp_path / "m2.json")])
    with pytest.raises(ValueError, match=rf"labelled more than once, e\.g\. {keys[0]}"):
        ns.func(ns)


@pytest.mark.parametrize("engines, message", [
    ([{}, {"serving_us": 18.0, "rank_tile_cost": 0.7091}],
     r"the labels mix engines \(the calibrated engine \(serving_us 0, rank_tile_cost the profile's\) in a\.csv; "
     r"serving_us 18, rank_tile_cost 0\.7091 in b\.csv\): train one model per engine"),
    ([{"serving_us": 18.0}, {"serving_us": 18.0, "rank_tile_cost": 0.5}], r"the labels mix engines"),
])
def test_combine_labels_refuses_labels_of_two_engines(engines, message):
    """The calibrated engine and one with the serving path's host time or a rank-tile cost are different
    twins: their labels are not one training set (a labels table without the columns is the calibrated one)."""
    parts = [(name, _labels([f"s{i}"]).assign(**e)) for i, (name, e) in enumerate(zip(("a.csv", "b.csv"), engines))]
    with pytest.raises(ValueError, match=message):
        combine_labels(parts)
    same = [(name, _labels([f"s{i}"]).assign(**engines[1])) for i, name in enumerate(("a.csv", "b.csv"))]
    assert len(combine_labels(same)) == 2


def test_a_sweep_on_the_validated_engine_labels_and_trains_with_its_engine(tmp_path, capsys):
    """A sweep with the serving path's host time and a rank-tile cost: its labels carry them, the model's
    provenance records them, the twin's check of its recommendations takes them unless told otherwise, and
    the labels of the calibrated engine's sweep of the same grid are refused beside them."""
    import dataclasses

    from twin.configurator.models import PROFILE_TILES, model_engine, resolve_engine
    from twin.sweep.grid import load_grid
    from twin.sweep.runner import run_sweep

    calibrated = load_grid("smoke")
    keys = sorted({t["scenario"]["key"] for t in calibrated.tasks()})
    validated = dataclasses.replace(calibrated, name="smoke-validated", serving_us=18.0, rank_tile_cost=0.7091)
    run_sweep(validated, tmp_path / "v", progress=False)
    run_sweep(calibrated, tmp_path / "c", progress=False, exclude={keys[0]})
    lab = build_dataset(load_runs([tmp_path / "v"]))
    assert len(lab) == 2 and set(lab["serving_us"]) == {18.0} and set(lab["rank_tile_cost"]) == {0.7091}
    p = configure_parser()
    ns = p.parse_args(["configure", "train", str(tmp_path / "v"), "--kind", "cart", "--no-search",
                       "--out", str(tmp_path / "m.json")])
    assert ns.func(ns) == 0
    capsys.readouterr()
    m = load_model(tmp_path / "m.json")
    assert model_engine(m) == {"serving_us": 18.0, "rank_tile_cost": 0.7091}
    assert resolve_engine([m]) == (18.0, 0.7091)
    assert resolve_engine([m], 0.0, PROFILE_TILES) == (0.0, None)  # the flags win, 'profile' is the profile's own
    assert resolve_engine([m], rank_tile_cost=1.0) == (18.0, 1.0)
    old = {**m, "provenance": {k: v for k, v in m["provenance"].items() if k != "engine"}}
    assert model_engine(old) == {"serving_us": 0.0, "rank_tile_cost": None}  # models saved before: calibrated
    with pytest.raises(ValueError, match="trained on different engines"):
        resolve_engine([m, old])
    assert resolve_engine([m, old], 18.0, 0.7091) == (18.0, 0.7091)
    ns = p.parse_args(["configure", "train", str(tmp_path / "v"), str(tmp_path / "c"), "--kind", "cart",
                       "--no-search", "--out", str(tmp_path / "m2.json")])
    with pytest.raises(ValueError, match=r"the runs mix engines .*label the sweeps of each engine apart"):
        ns.func(ns)  # two sweep directories are labelled as one table of runs
    ns = p.parse_args(["configure", "dataset", str(tmp_path / "c"), "--out", str(tmp_path / "c.csv")])
    assert ns.func(ns) == 0
    ns = p.parse_args(["configure", "train", str(tmp_path / "v"), str(tmp_path / "c.csv"), "--kind", "cart",
                       "--no-search", "--out", str(tmp_path / "m2.json")])
    with pytest.raises(ValueError, match="the labels mix engines"):
        ns.func(ns)  # a labels file beside a sweep
