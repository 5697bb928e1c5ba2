"""`twin configure`: combinations an audit found accepted in silence are refused up front, as ``twin configure SUBCMD:
error: ...`` (exit 2) naming the problem and the fix, before any run or file is written. Fast: small tables, a
one-run sweep of a 60 s window."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.configurator.test_models import synthetic_labels
from tests.helpers import configure_error
from twin.cli import main
from twin.sweep.grid import grid_from_dict
from twin.sweep.runner import run_sweep

LLAMA, QWEN = "llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085"
SCENARIO = ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32"]


_error = configure_error  # (tests/helpers.py)


@pytest.fixture()
def sweep(tmp_path):
    """A finished `twin sweep` of a one-scenario, one-configuration grid named x (60 s window)."""
    grid = grid_from_dict({"name": "x", "profile": LLAMA, "window_s": 60,
                           "scenarios": {"rates": [[0.4, 0.2, 0.1]], "ranks": [[8, 16, 32]]},
                           "configs": {"served": [8], "slots": [8]}})
    out = tmp_path / "sweep"
    run_sweep(grid, out, progress=False)
    return out


@pytest.fixture()
def labels(tmp_path):
    f = tmp_path / "labels.csv"
    synthetic_labels(8).assign(rule="throughput90", profile=LLAMA).to_csv(f, index=False)
    return f


@pytest.fixture()
def rf_model(labels, tmp_path, capsys):
    """A random-forest model trained on Llama labels (no rules)."""
    out = tmp_path / "m.json"
    assert main(["configure", "train", str(labels), "--kind", "rf", "--no-search", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    return out


# --------------------------------------------------------------------------- 1: a search cache holding a sweep
def test_search_refuses_a_cache_holding_another_grids_sweep(sweep, capsys):
    """`configure search --cache D`, D a sweep of grid x, exited 0 and wrote its shard into D; `configure dataset D`
    and `twin sweep x --out D` then refused D (a shard of no task of grid x)."""
    shards = sorted(p.name for p in (sweep / "shards").glob("*.parquet"))
    err = _error(["configure", "search", *SCENARIO, "--window", "10", "--served", "8", "--slots", "8",
                  "--cache", str(sweep)], capsys)
    assert (f"--cache {sweep}: holds a sweep of another grid (x, its sweep.json), whose tasks are not the search's: "
            f"the search's shards would be mixed into that sweep's rows") in err
    assert "give another --cache (a directory of the search's own, e.g. sweeps/search-cache)" in err
    assert sorted(p.name for p in (sweep / "shards").glob("*.parquet")) == shards  # nothing ran
    assert main(["configure", "dataset", str(sweep)]) == 0  # still a sweep of grid x alone
    capsys.readouterr()


def test_search_refuses_a_cache_whose_sweep_record_is_unreadable(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "sweep.json").write_text("{")
    err = _error(["configure", "search", *SCENARIO, "--window", "10", "--served", "8", "--slots", "8",
                  "--cache", str(tmp_path / "c")], capsys)
    assert f"--cache {tmp_path / 'c'}: {tmp_path / 'c' / 'sweep.json'}: not a sweep's record" in err
    assert "give another --cache" in err and "--out" not in err
    assert not (tmp_path / "c" / "shards").exists()


def test_a_search_cache_of_its_own_is_still_reused(tmp_path, capsys):
    argv = ["configure", "search", *SCENARIO, "--window", "10", "--served", "8", "--slots", "8", "--json",
            "--cache", str(tmp_path / "c")]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0  # (no sweep.json: the search's own cache, read again)
    assert json.loads(capsys.readouterr().out)["served_adapters"] == first["served_adapters"]


# --------------------------------------------------------------------------- 2: a source given twice
def test_dataset_refuses_a_sweep_given_twice(sweep, capsys):
    """`configure dataset D D` said "1 scenarios labelled from 2 runs": the runs counted twice."""
    for again in (str(sweep), f"{sweep}/", str(sweep / ".." / sweep.name)):
        err = _error(["configure", "dataset", str(sweep), again], capsys)
        assert f"{again} is given twice" in err and "give each sweep directory or labels file once" in err
    assert main(["configure", "dataset", str(sweep)]) == 0
    assert "1 scenarios labelled (throughput90) from 1 runs" in capsys.readouterr().out


def test_train_refuses_a_source_given_twice(labels, sweep, tmp_path, capsys):
    """`configure train D D` trained on every scenario twice."""
    for srcs in ([labels, labels], [sweep, f"{sweep}/"]):
        err = _error(["configure", "train", *map(str, srcs), "--no-search", "--out", str(tmp_path / "m.json")],
                     capsys)
        assert f"{srcs[1]} is given twice" in err and "its runs or labels would be counted twice" in err
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------- 3, 4: evaluate --no-search
@pytest.mark.parametrize("flags, named", [
    (["--search-cache", "{tmp}/sc"], "--search-cache with --no-search: it sets"),
    (["--executor", "local"], "--executor with --no-search: it sets"),
    (["--jobs", "1"], "--jobs with --no-search: it sets"),
    (["--jobs", "2", "--executor", "dask"], "--executor / --jobs with --no-search: they set"),
])
def test_evaluate_no_search_refuses_the_search_options(tmp_path, capsys, flags, named):
    """`evaluate --no-search --search-cache DIR / --executor / --jobs` ignored them."""
    flags = [f.format(tmp=tmp_path) for f in flags]
    err = _error(["configure", "evaluate", "--no-search", *flags], capsys)
    assert named in err and "the twin-as-optimiser baseline's runs, which --no-search leaves out" in err
    assert "drop --no-search" in err
    assert not (tmp_path / "sc").exists()


@pytest.mark.parametrize("flags, named", [
    (["--serving-us", "5"], "--serving-us with --no-search and without --check: it sets"),
    (["--rank-tile-cost", "0.5"], "--rank-tile-cost with --no-search and without --check: it sets"),
    (["--serving-us", "5", "--rank-tile-cost", "0.5"], "--serving-us / --rank-tile-cost with --no-search and without "
                                                       "--check: they set"),
])
def test_evaluate_no_search_refuses_engine_constants_no_run_reads(tmp_path, capsys, flags, named):
    """`evaluate --no-search --serving-us 5` ran no twin run, yet recorded the constant as the summary's engine."""
    err = _error(["configure", "evaluate", "--no-search", *flags, "--out", str(tmp_path / "ev")], capsys)
    assert named in err and "the engine of the twin's runs (the twin-as-optimiser baseline's and --check's)" in err
    assert "or give --check" in err and not (tmp_path / "ev").exists()


def test_evaluate_no_search_refuses_a_profile_other_than_the_models(rf_model, tmp_path, capsys):
    """`evaluate --no-search --model m.json --profile P` took a model of another profile than P (predict refuses it)."""
    argv = ["configure", "evaluate", "--no-search", "--model", str(rf_model), "--out", str(tmp_path / "ev")]
    err = _error(argv + ["--profile", QWEN], capsys)
    assert (f"--profile {QWEN} with --model {rf_model}: the model was trained on {LLAMA}, and --profile picks only a "
            f"shipped model; leave --profile out (the model's own profile is used)") in err
    assert not (tmp_path / "ev").exists()
    # predict says the same
    assert err.split("error: ")[1] == _error(["configure", "predict", *SCENARIO, "--model", str(rf_model),
                                              "--profile", QWEN], capsys).split("error: ")[1]


# --------------------------------------------------------------------------- 5: --lengths
@pytest.mark.parametrize("command", ["predict", "search"])
@pytest.mark.parametrize("value", ["abc", "-1,5", "0,0", "222", "222,197,5", "inf,197", "222,,197"])
def test_lengths_are_refused_with_one_message(tmp_path, capsys, command, value):
    """`--lengths abc` gave the example 0.5,1,2 and `--lengths -1,5` "values must be >= 0", while 0,0 was "expected
    two positive numbers"."""
    extra = ["--cache", str(tmp_path / "c")] if command == "search" else []
    err = _error(["configure", command, *SCENARIO, *extra, "--lengths", value], capsys)
    assert (f"--lengths {value!r}: expected two positive numbers IN,OUT (mean input and output tokens), e.g. "
            f"--lengths 222,197") in err
    assert "0.5,1,2" not in err and ">= 0" not in err
    assert not (tmp_path / "c").exists()


# --------------------------------------------------------------------------- 6: output extensions
def test_dataset_refuses_an_output_other_than_csv_or_parquet(sweep, tmp_path, capsys):
    """`configure dataset D --out lab.txt` wrote CSV into a .txt."""
    err = _error(["configure", "dataset", str(sweep), "--out", str(tmp_path / "lab.txt")], capsys)
    assert f"--out {tmp_path / 'lab.txt'}: give a .csv or .parquet file" in err
    assert not (tmp_path / "lab.txt").exists()
    assert main(["configure", "dataset", str(sweep), "--out", str(tmp_path / "lab.PARQUET")]) == 0
    capsys.readouterr()
    assert len(pd.read_parquet(tmp_path / "lab.PARQUET")) == 1  # (Parquet, as its name says)


@pytest.mark.parametrize("name", ["m.txt", "m", "m.json.txt", "m.gz.json.zip"])
def test_train_refuses_an_output_other_than_json(labels, tmp_path, capsys, name):
    """`configure train --out m.txt` wrote the model's JSON into a .txt."""
    err = _error(["configure", "train", str(labels), "--no-search", "--out", str(tmp_path / name)], capsys)
    assert f"--out {tmp_path / name}: give a .json or .json.gz file" in err
    assert not (tmp_path / name).exists()


def test_train_writes_json_and_json_gz(labels, tmp_path, capsys):
    for name in ("m.json", "m.json.gz"):
        assert main(["configure", "train", str(labels), "--no-search", "--out", str(tmp_path / name), "--json"]) == 0
        capsys.readouterr()
        assert main(["configure", "predict", *SCENARIO, "--model", str(tmp_path / name), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["served_adapters"] >= 1


# --------------------------------------------------------------------------- 7: rules of a model without rules
def test_rules_of_a_model_without_rules_is_an_error(rf_model, capsys):
    """`configure rules --model <rf>` said "twin configure rules: ... has no rules", without "error:"."""
    err = _error(["configure", "rules", "--model", str(rf_model)], capsys)
    assert f"twin configure rules: error: {rf_model} has no rules (kind rf); give a model trained with --kind cart, " \
           f"hstree or rulefit" in err


def test_evaluate_refuses_a_search_cache_holding_another_grids_sweep(sweep, tmp_path, capsys):
    """The evaluation's search baseline walks into --search-cache as `configure search` does into --cache."""
    from tests.helpers import ml_test_row

    real = tmp_path / "real.csv"
    pd.DataFrame([ml_test_row(model="meta-llama/Llama-3.1-8B-Instruct")]).to_csv(real, index=False)
    shards = sorted(p.name for p in (sweep / "shards").glob("*.parquet"))
    err = _error(["configure", "evaluate", "--real", str(real), "--search-cache", str(sweep)], capsys)
    assert f"--search-cache {sweep}: holds a sweep of another grid (x, its sweep.json)" in err
    assert "give another --search-cache" in err
    assert sorted(p.name for p in (sweep / "shards").glob("*.parquet")) == shards
