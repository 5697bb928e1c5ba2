"""Audit of the configurator: labels, training data and prediction that were silently wrong.

* ``dataset --ratio`` below the line a sweep walked at (run tables without ``walk_ratio``): refused;
* a model trained on one length feature ignored the other: refused outside what its labels held;
* a labels file without ``policy`` / ``rule`` / ``profile`` merged with any other: refused;
* ``--profile NAME`` read a file or directory of that name in the current directory: the shipped model;
* provenance pins each labels file (SHA-256, bytes, rows) and the twin's version; labels carry their sweep's grid;
* the forest's throughput spread is capped at the offered load, as the expected throughput is;
* the slo rule's "not starving" is computed at ``--ratio`` from the run's own figures.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from tests.configurator.test_models import synthetic_labels
from tests.helpers import configure_error
from twin.cli import main
from twin.configurator.dataset import build_dataset, combine_labels, trained_grid
from twin.configurator.labels import FEATURES, features_of, label_scenarios
from twin.configurator.models import load_model, save_model, train

REPO = Path(__file__).resolve().parents[2]
ADAPTERCHECK_RUNS = REPO / "results/configurator/adaptercheck/runs_llama_adaptercheck.parquet"
GRID = {"served": [8, 16, 32, 64, 128, 384], "slots": [8, 16, 32, 64]}
PROV = {"profile": "llama-3.1-8b_h100_vllm085", "rule": "throughput90"}


def _walk(rows: list[tuple[int, int, float | None]], offered: float = 1000.0, **extra) -> pd.DataFrame:
    """Run rows of one scenario: ``(slots, served, throughput share or None = stopped early)``, as a sweep without
    ``walk_ratio`` wrote them."""
    f = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    out = []
    for slots, served, share in rows:
        r = {"scenario": "s", "seed": 0, "max_lora_rank": 32, "policy": "fcfs+client-cap", "status": "ok",
             "served_adapters": served, "adapter_slots": slots, "offered_tok_s": offered * served / 8, **f}
        if share is None:
            r.update(early_stop=True, total_tok_s=math.nan, tok_s_upper=extra.get("upper", 0.7) * r["offered_tok_s"])
        else:
            r.update(early_stop=False, total_tok_s=share * r["offered_tok_s"], tok_s_upper=math.nan)
        out.append(r)
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- 2: --ratio below the sweep's walk
def test_dataset_refuses_a_ratio_below_the_committed_sweeps_walk(capsys):
    """The committed adapter-check run table predates ``walk_ratio``; its walks stopped at their first run below 0.9,
    so labels at 0.5 lacked the runs a walk at 0.5 goes on to (337 of 831 labels were wrong, exit 0)."""
    err = configure_error(["configure", "dataset", str(ADAPTERCHECK_RUNS), "--ratio", "0.5"], capsys)
    assert "labels at --ratio 0.5:" in err and "would pass" in err
    assert "the runs a walk at 0.5 goes on to are missing" in err
    assert "label at --ratio 0.9 (the published walk's line) or above" in err
    runs = pd.read_parquet(ADAPTERCHECK_RUNS)
    assert len(build_dataset(runs, ratio=0.9)) == len(build_dataset(runs, ratio=0.95)) == 831  # at or above: labelled


def test_a_lower_ratio_is_refused_only_where_a_walk_stopped_above_it():
    runs = _walk([(8, 8, 0.95), (8, 16, 0.85), (16, 16, 0.97), (16, 32, 0.5)])
    with pytest.raises(ValueError, match=r"labels at --ratio 0.8: 1 slot walk\(s\).*s, 8 slots: 16 served adapters "
                                         r"read 0.850 of the offered tokens"):
        build_dataset(runs, ratio=0.8)
    lab = build_dataset(runs, ratio=0.86)  # every walk stopped below 0.86: the same walks, the same labels
    assert (lab["served_adapters"].tolist(), lab["adapter_slots"].tolist()) == ([16], [16])
    assert len(build_dataset(runs, ratio=0.9)) == 1
    # the sweep's flag says where its walk stopped (a table with `starving`): the same verdicts
    flagged = runs.assign(starving=[False, True, False, True])
    with pytest.raises(ValueError, match="labels at --ratio 0.8"):
        build_dataset(flagged, ratio=0.8)
    with pytest.raises(ValueError, match="labels at --ratio 0.8: 1 slot walk"):  # (rows of an old sweep beside new)
        build_dataset(flagged.assign(walk_ratio=float("nan")), ratio=0.8)


def test_an_early_stop_counts_with_its_upper_bound():
    runs = _walk([(8, 8, 0.95), (8, 16, None)], upper=0.7)
    with pytest.raises(ValueError, match="stopped early, its throughput at most 0.700 of the offered tokens"):
        build_dataset(runs, ratio=0.6)
    assert len(build_dataset(runs, ratio=0.75)) == 1


def test_walks_that_go_on_after_a_starving_run_lack_nothing():
    """``[early_stop] walk = false``: a run after a starving one in the same walk; every run is there."""
    runs = _walk([(8, 8, 0.95), (8, 16, 0.7), (8, 32, 0.6)])
    lab = build_dataset(runs, ratio=0.65)
    assert lab["served_adapters"].tolist() == [16]


# --------------------------------------------------------------------------- 3: one length feature
def _length_labels(outputs=(197.0,)) -> pd.DataFrame:
    lab = synthetic_labels(60)
    lab["mean_input_tokens"] = [222.0 + 100 * (i % 3) for i in range(len(lab))]
    lab["mean_output_tokens"] = [outputs[i % len(outputs)] for i in range(len(lab))]
    return lab


@pytest.fixture(scope="module")
def input_only(tmp_path_factory):
    m = train(_length_labels(), "cart", features=[*FEATURES, "mean_input_tokens"], search=False, provenance=PROV,
              grid=GRID)
    return save_model(m, tmp_path_factory.mktemp("len") / "input-only.cart.json")


def test_a_model_on_one_length_feature_refuses_another_value_of_the_other(input_only, capsys):
    m = load_model(input_only)
    assert m["provenance"]["lengths_seen"] == {"mean_input_tokens": [222.0, 422.0],
                                               "mean_output_tokens": [197.0, 197.0]}
    base = ["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--model", str(input_only)]
    for bad in ("222,5000", "222,1"):
        err = configure_error(base + ["--lengths", bad], capsys)
        assert ("this configurator uses mean_input_tokens but not mean_output_tokens, and its answer ignores "
                f"mean_output_tokens {bad.split(',')[1]} (its labels held 197)") in err, err
    assert main(base + ["--lengths", "222,197", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"] == [222.0, 197.0]


def test_an_unused_length_within_the_labels_range_is_accepted():
    from twin.configurator.features import length_columns, workload_columns

    m = train(_length_labels(outputs=(197.0, 300.0)), "cart", features=[*FEATURES, "mean_input_tokens"],
              search=False, provenance=PROV, grid=GRID)
    assert length_columns(m, (222.0, 250.0)) == {"mean_input_tokens": 222.0, "mean_output_tokens": 250.0}
    with pytest.raises(ValueError, match=r"mean_output_tokens 400 \(its labels held 197-300\)"):
        length_columns(m, (222.0, 400.0))
    feats = {**features_of([0.4, 0.05, 0.00625], [8, 16, 32]), "arrival_cv": 1.0}
    assert workload_columns(m, {**feats, "mean_input_tokens": 500.0, "mean_output_tokens": 310.0}, "--workload f")
    with pytest.raises(ValueError, match=r"--workload f: this configurator does not use mean_output_tokens 900"):
        workload_columns(m, {**feats, "mean_input_tokens": 500.0, "mean_output_tokens": 900.0}, "--workload f")


def test_a_model_without_length_features_checks_the_mix_its_labels_held():
    """Trained without the length features on a 400 / 300 sweep, a model refused 400,300 and took 222,197."""
    from twin.configurator.features import length_columns

    lab = synthetic_labels(40).assign(mean_input_tokens=400.0, mean_output_tokens=300.0)
    m = train(lab, "cart", search=False, provenance=PROV, grid=GRID)
    assert length_columns(m, (400.0, 300.0))
    with pytest.raises(ValueError, match="trained without the length-mix features, on 400 / 300 tokens only"):
        length_columns(m, (222.0, 197.0))


def test_a_damaged_lengths_record_is_refused(input_only, tmp_path):
    d = json.loads(Path(input_only).read_text())
    d["provenance"]["lengths_seen"] = {"mean_output_tokens": [300.0, 100.0]}
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="provenance lengths_seen"):
        load_model(tmp_path / "bad.json")


# --------------------------------------------------------------------------- 4: a source without policy/rule/profile
def _lab(keys, **cols) -> pd.DataFrame:
    lab = synthetic_labels(len(keys)).assign(scenario=list(keys), rule="throughput90",
                                             profile="llama-3.1-8b_h100_vllm085", policy="fcfs+client-cap")
    return lab.assign(**cols)


@pytest.mark.parametrize("col", ["policy", "rule", "profile"])
def test_a_labels_source_without_a_column_the_others_have_is_refused(col):
    other = {"policy": "ema-prefetch", "rule": "throughput90", "profile": "llama-3.1-8b_h100_vllm085"}[col]
    a = _lab(["s1", "s2"]).drop(columns=col)
    b = _lab(["s3", "s4"], **{col: other})
    with pytest.raises(ValueError, match=rf"a\.csv has no {col} column \(or only blanks there\) while b\.csv has one"):
        combine_labels([("a.csv", a), ("b.csv", b)])
    with pytest.raises(ValueError, match=rf"a\.csv has no {col} column"):
        combine_labels([("a.csv", a.assign(**{col: float("nan")})), ("b.csv", b)])
    assert len(combine_labels([("a.csv", a), ("b.csv", b.drop(columns=col))])) == 4  # neither says: as before


def test_train_refuses_a_policy_less_labels_file_beside_another_policys(tmp_path, capsys):
    """The repro: one file without a policy column plus an ema-prefetch file trained a one-policy model (no
    indicators, no policy key), which then refused --policy ema-prefetch as trained on fcfs+client-cap only."""
    _lab([f"a{i}" for i in range(8)]).drop(columns="policy").to_csv(tmp_path / "a.csv", index=False)
    _lab([f"b{i}" for i in range(8)], policy="ema-prefetch").to_csv(tmp_path / "b.csv", index=False)
    err = configure_error(["configure", "train", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--kind", "cart",
                           "--no-search", "--out", str(tmp_path / "m.json")], capsys)
    assert "has no policy column" in err and "policy of those labels is unknown" in err
    assert not (tmp_path / "m.json").exists()


def test_a_policy_column_blank_in_some_rows_is_refused():
    from twin.configurator.features import training_columns

    lab = _lab([f"s{i}" for i in range(6)], policy=["ema-prefetch"] * 3 + [None] * 3)
    with pytest.raises(ValueError, match="policy column is blank in 3 of 6 rows"):
        training_columns(lab)


# --------------------------------------------------------------------------- 5: --profile is a name
def test_a_profile_name_is_the_shipped_model_whatever_the_current_directory_holds(tmp_path, monkeypatch, capsys):
    qwen = "qwen-2.5-7b_h100_vllm085"
    monkeypatch.chdir(tmp_path)
    (tmp_path / qwen).mkdir()  # a directory named like the profile ("Is a directory")
    argv = ["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--profile", qwen, "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == qwen and d["model"] == "rf"
    (tmp_path / qwen).rmdir()
    other = train(synthetic_labels(30), "rf", search=False, provenance={**PROV, "profile": qwen}, grid=GRID)
    save_model(other, tmp_path / qwen)  # a model file named like the profile: not loaded in place of the shipped one
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["served_adapters_raw"] == d["served_adapters_raw"]
    assert load_model(qwen)["_path"].endswith(f"models/{qwen}.rf.json.gz")
    assert load_model(f"./{qwen}")["provenance"]["scenarios"] == 30  # (a path: the file)
    (tmp_path / "d.json").mkdir()
    err = configure_error(argv[:-1] + ["--model", "d.json"], capsys)
    assert "d.json: a directory, not a configurator model file" in err


# --------------------------------------------------------------------------- 6: provenance pins the training data
def test_a_new_model_pins_each_labels_file_and_the_twins_version(tmp_path, capsys):
    from twin.sweep.scenario import twin_version

    lab = _lab([f"s{i}" for i in range(10)])
    lab.to_csv(tmp_path / "labels.csv", index=False)
    assert main(["configure", "train", str(tmp_path / "labels.csv"), "--kind", "cart", "--no-search", "--out",
                 str(tmp_path / "m.json"), "--json"]) == 0
    capsys.readouterr()
    prov = load_model(tmp_path / "m.json")["provenance"]
    data = (tmp_path / "labels.csv").read_bytes()
    assert prov["source_files"] == [{"path": str(tmp_path / "labels.csv"), "sha256": hashlib.sha256(data).hexdigest(),
                                     "bytes": len(data), "rows": 10}]
    assert prov["twin_version"] == twin_version()


def test_labels_carry_their_sweeps_configurations():
    """A model trained on a labels file snapped to the values its labels held only (no label at 32 served: 32 was not
    a configuration of it); the labels now carry every configuration the runs tried, as the sweep directory's grid."""
    runs = _walk([(8, 8, 0.95), (8, 16, 0.95), (8, 32, 0.5), (16, 16, 0.97), (16, 32, 0.3)])
    runs = runs.assign(starving=[False, False, True, False, True])
    lab = build_dataset(runs)
    assert lab["grid_served"].tolist() == ["8 16 32"] and lab["grid_slots"].tolist() == ["8 16"]
    assert trained_grid(lab, []) == {"served": [8, 16, 32], "slots": [8, 16]}
    assert trained_grid(lab.drop(columns=["grid_served", "grid_slots"]), []) == {"served": [16, 32], "slots": [16]}
    with pytest.raises(ValueError, match="labels column grid_served 'x'"):
        trained_grid(lab.assign(grid_served="x"), [])


# --------------------------------------------------------------------------- 7: the spread under the offered cap
@pytest.mark.parametrize("rates", ["0.6,0.003125,0.003125", "1e-9,1e-9,1e-9"])
def test_the_forests_spread_is_capped_as_its_throughput(rates, capsys):
    argv = ["configure", "predict", "--rates", rates, "--ranks", "8,8,8"]
    assert main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    u = d["uncertainty"]
    assert d["throughput_model_tok_s"] > d["offered_tok_s"] == d["throughput_tok_s"]
    assert u["throughput_tok_s"]["p90"] <= d["offered_tok_s"] and u["throughput_tok_s"]["p10"] <= d["offered_tok_s"]
    assert u["throughput_model_tok_s"]["p90"] > d["offered_tok_s"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    tp = f"{d['throughput_tok_s']:.0f}"
    assert f"throughput {tp}-{tp} tok/s (capped at the offered load, as the expected throughput; the trees' " in text


# --------------------------------------------------------------------------- 9: the slo rule's starvation line
def _slo_runs(**cols) -> pd.DataFrame:
    rows = _walk([(8, 8, 0.95), (8, 16, 0.7), (8, 32, 0.4)]).assign(slo_attainment=1.0)
    return rows.assign(**cols)


def test_the_slo_rule_leaves_out_starving_runs_without_a_starving_column():
    lab = label_scenarios(_slo_runs(), "slo")  # (no starving column: the 0.4 run, the most tokens, was the label)
    assert lab["served_adapters"].tolist() == [8]


def test_the_slo_rule_keeps_a_run_whose_starving_flag_is_blank():
    runs = _slo_runs(starving=[float("nan"), 1.0, 1.0])  # (NaN read as True: the one run that keeps up was dropped)
    assert label_scenarios(runs, "slo")["served_adapters"].tolist() == [8]


def test_the_slo_rule_follows_ratio():
    runs = _slo_runs(starving=[False, True, True])  # the sweep's flags, at its 0.9
    assert label_scenarios(runs, "slo", ratio=0.6)["served_adapters"].tolist() == [16]
    assert label_scenarios(runs, "slo", ratio=0.3)["served_adapters"].tolist() == [32]
