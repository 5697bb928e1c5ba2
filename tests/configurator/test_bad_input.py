"""`twin configure`: bad input is a clear error (``twin configure SUBCMD: error: ...``, exit 2) naming the problem
and the fix, before any work -- never a traceback, never silently accepted. Fast: argument parsing and
small tables only; the one twin run is a 60 s window of 8 adapters."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.configurator.test_models import synthetic_labels
from tests.helpers import configure_error, configure_parser, ml_test_row
from traces.registry import MAX_REQUESTS
from twin.cli import main
from twin.configurator.dataset import load_labels, load_runs
from twin.configurator.labels import features_of
from twin.configurator.search import check_requests
from twin.sweep import runner

SEARCH = ["configure", "search", "--window", "60", "--served", "8", "--slots", "8"]
PREDICT = ["configure", "predict"]


_error = configure_error  # (tests/helpers.py)


def _run_rows(status: str = "ok", **kw) -> dict:
    row = dict(scenario="rate_0.4-0.2-0.1_size_8-16-32", served_adapters=8, adapter_slots=8, status=status)
    row.update(kw)
    return row


# --------------------------------------------------------------------------- 1: executor extras
def _missing_ray(tasks, jobs, **_):
    raise runner.MissingExtra("the Ray executor needs ray: pip install 'lora-twin[ray]' (or pip install ray)")
    yield  # (a generator, as the executors are)


def test_search_with_a_missing_executor_extra_is_an_input_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(runner._EXEC, "ray", _missing_ray)  # as without ray, whether or not it is installed
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--executor", "ray",
                           "--cache", str(tmp_path / "sc")], capsys)
    assert "the Ray executor needs ray: pip install 'lora-twin[ray]'" in err and "--executor local" in err
    assert not list(tmp_path.glob("sc/shards/*.parquet"))  # nothing ran


def test_evaluate_with_a_missing_executor_extra_is_an_input_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(runner._EXEC, "ray", _missing_ray)
    row = ml_test_row(model="meta-llama/Llama-3.1-8B-Instruct")
    real = tmp_path / "real.csv"
    pd.DataFrame([row]).to_csv(real, index=False)
    err = _error(["configure", "evaluate", "--real", str(real), "--executor", "ray", "--search-cache",
                  str(tmp_path / "ec")], capsys)
    assert "the Ray executor needs ray" in err


# --------------------------------------------------------------------------- 2: tables that are not what the command reads
@pytest.fixture()
def tables(tmp_path):
    d = {}
    d["shard"] = tmp_path / "shard.csv"  # a sweep's run rows exported to CSV
    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    pd.DataFrame([_run_rows(offered_tok_s=1000.0, total_tok_s=950.0, **feats)]).to_csv(d["shard"], index=False)
    d["empty"] = tmp_path / "empty.csv"
    d["empty"].write_text("")
    d["garbage"] = tmp_path / "garbage.parquet"
    d["garbage"].write_bytes(b"this is not parquet")
    d["real"] = tmp_path / "real.csv"
    pd.DataFrame([dict(run_dir="x", offered_tok_s_est=10.0, **_run_rows())]).to_csv(d["real"], index=False)
    d["labels"] = tmp_path / "labels.csv"
    synthetic_labels(8).to_csv(d["labels"], index=False)
    d["nolabels"] = tmp_path / "nolabels.csv"
    synthetic_labels(8).iloc[:0].to_csv(d["nolabels"], index=False)
    d["other"] = tmp_path / "other.csv"
    pd.DataFrame({"a": [1], "b": [2]}).to_csv(d["other"], index=False)
    return d


@pytest.mark.parametrize("key, message", [
    ("shard", r"shard\.csv: a sweep's run table, not labels \(missing columns \['throughput_tok_s'\]\); label it "
              r"first: `twin configure dataset .*shard\.csv --out labels\.csv`"),
    ("empty", r"empty\.csv: the file is empty; give the labels written by `twin configure dataset --out"),
    ("garbage", r"garbage\.parquet: cannot be read as a labels table \(.*\); give the labels written by "
                r"`twin configure dataset"),
    ("real", r"real\.csv: a real-run table \(the validation format\), not labels .*`twin configure evaluate --real"),
    ("other", r"other\.csv: not a labels table \(missing columns \['scenario', 'served_adapters', 'adapter_slots', "
              r"'throughput_tok_s', 'rate_max'.*\); `twin configure train` expects the labels written by "
              r"`twin configure dataset --out labels\.csv`"),
    ("nolabels", r"nolabels\.csv: a labels table without rows"),
])
def test_train_names_a_file_that_is_not_labels(tables, tmp_path, capsys, key, message):
    import re

    err = _error(["configure", "train", str(tables[key]), "--no-search", "--out", str(tmp_path / "m.json")], capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("column, value, message", [
    ("throughput_tok_s", "abc", r"labels\.csv: row 3 \(line 4\), column throughput_tok_s: 'abc' is not a number > 0"),
    ("served_adapters", -5, r"row 3 \(line 4\), column served_adapters: -5 is not a whole number >= 1"),
    ("rate_max", float("nan"), r"row 3 \(line 4\), column rate_max: an empty cell is not a finite number"),
    ("rate_max", float("inf"), r"column rate_max: inf is not a finite number"),
    # labels no sweep gives, trained on silently: more slots than served adapters, an unknown rule
    ("adapter_slots", 100000, r"row 3 \(line 4\), column adapter_slots: 100000 is more than the row's served_adapters"),
    ("rule", "nope", r"row 3 \(line 4\), column rule: 'nope' is not a label rule \(throughput90, robust, slo\)"),
])
def test_train_names_a_bad_label_value(tmp_path, capsys, column, value, message):
    """A label or feature that is no number (a sklearn/float() error before), negative (a log of it), or
    empty (a NaN feature was trained on silently) names the file, row, column and value."""
    import re

    lab = synthetic_labels(8).assign(rule="throughput90").astype({column: object})
    lab.loc[2, column] = value
    lab.to_csv(tmp_path / "labels.csv", index=False)
    err = _error(["configure", "train", str(tmp_path / "labels.csv"), "--no-search", "--out",
                  str(tmp_path / "m.json")], capsys)
    assert re.search(message, err), err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("column, value, message", [
    ("total_tok_s", "abc", r"runs\.csv: row 1 \(line 2\), column total_tok_s: 'abc' is not a number >= 0"),
    ("served_adapters", -3, r"column served_adapters: -3 is not a whole number >= 1"),
    ("served_adapters", "x", r"column served_adapters: 'x' is not a whole number >= 1"),
    ("rate_max", float("nan"), r"column rate_max: an empty cell is not a finite number \(a run with status ok needs"),
])
def test_dataset_names_a_bad_run_value(tmp_path, capsys, column, value, message):
    """A run row's value that is no number (a TypeError traceback before) or out of range (labelled as the
    optimum before) names the file, row, column and value."""
    import re

    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    rows = pd.DataFrame([_run_rows(offered_tok_s=1000.0, total_tok_s=950.0, **feats),
                         _run_rows(served_adapters=16, offered_tok_s=2000.0, total_tok_s=1000.0, **feats)])
    rows = rows.astype({column: object})
    rows.loc[0, column] = value
    rows.to_csv(tmp_path / "runs.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "runs.csv")], capsys)
    assert re.search(message, err), err


@pytest.mark.parametrize("column, value, message", [
    ("adapter_slots", 100, r"row 1 \(line 2\), column adapter_slots: 100 is more than the row's served_adapters"),
    ("offered_tok_s", 0.0, r"column total_tok_s: 950\.0 is more than the row's offered_tok_s \(0\): a run serves at "
                           r"most the tokens of its own arrivals"),
    ("served_adapters", 16, r"the run of scenario rate_0\.4-0\.2-0\.1_size_8-16-32 at 16 served adapters and 8 slots "
                            r"is given twice"),
])
def test_dataset_refuses_an_impossible_run_row(tmp_path, capsys, column, value, message):
    """Rows no sweep writes, labelled before (stop 69's audit): slots beyond the served adapters ("4 served / 100
    slots"), a throughput beside no offered tokens (a ratio of NaN at the label), the same run twice ("from 2
    runs")."""
    import re

    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    rows = pd.DataFrame([_run_rows(offered_tok_s=1000.0, total_tok_s=950.0, **feats),
                         _run_rows(served_adapters=16, offered_tok_s=2000.0, total_tok_s=1000.0, **feats)])
    rows.loc[0, column] = value
    if column == "served_adapters":  # (the first row made a copy of the second's configuration)
        rows.loc[0, ["offered_tok_s", "total_tok_s"]] = [2000.0, 1000.0]
    rows.to_csv(tmp_path / "runs.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "runs.csv")], capsys)
    assert re.search(message, err), err


def test_train_checks_every_labels_file_before_labelling_a_sweep(tables, tmp_path):
    with pytest.raises(ValueError, match=r"shard\.csv: a sweep's run table"):
        load_labels(tables["shard"])
    # the features asked for are the columns needed (policy: the indicators, checked by training)
    assert len(load_labels(tables["labels"], ["rate_max", "policy"])) == 8
    with pytest.raises(ValueError, match=r"labels\.csv has no column 'mean_input_tokens'"):
        load_labels(tables["labels"], ["rate_max", "mean_input_tokens"])


@pytest.mark.parametrize("key, message", [
    ("garbage", r"garbage\.parquet: cannot be read as a sweep's runs \(.*\); give the --out directory of `twin sweep`"),
    ("empty", r"empty\.csv: the file is empty; give the --out directory of `twin sweep`"),
    ("labels", r"labels\.csv: not a sweep's run table \(missing columns \['status'\]\); it is a labels table \(from "
               r"`twin configure dataset`\): give it to `twin configure train`"),
    ("real", r"real\.csv: not a sweep's run table \(missing columns \['offered_tok_s', 'total_tok_s'\]\); it looks like "
             r"a real-run table .*`twin configure evaluate --real FILE`"),
    ("other", r"other\.csv: not a sweep's run table \(missing columns \['scenario', 'served_adapters', "
              r"'adapter_slots', 'status'\]\); give the --out directory of `twin sweep`"),
])
def test_dataset_names_a_file_that_is_not_a_sweep(tables, capsys, key, message):
    import re

    err = _error(["configure", "dataset", str(tables[key])], capsys)
    assert re.search(message, err), err


def test_dataset_of_a_sweep_whose_every_run_failed_to_start(tmp_path, capsys):
    why = "the KV cache left after the weights and 8 LoRA slots of max rank 1000000 holds 0 tokens"
    runner.write_shard(tmp_path / "failed", "h1", [_run_rows("start_failure", startup_reason=why, task_hash="h1")])
    err = _error(["configure", "dataset", str(tmp_path / "failed")], capsys)
    assert (f"failed: no run of the sweep started or finished, so there is nothing to label: 1 runs (1 start_failure); "
            f"the first says: {why}") in err
    # beside a sweep that ran, its scenario is simply left out (as in one sweep directory)
    runner.write_shard(tmp_path / "ran", "h2", [_run_rows(scenario="s2", offered_tok_s=1000.0, total_tok_s=950.0,
                                                         task_hash="h2")])
    runs = load_runs([tmp_path / "failed", tmp_path / "ran"])
    assert len(runs) == 2
    assert main(["configure", "dataset", str(tmp_path / "failed"), str(tmp_path / "ran"), "--json"]) == 0
    assert [r["scenario"] for r in json.loads(capsys.readouterr().out)["labels"]] == ["s2"]


# --------------------------------------------------------------------------- 3: the search's request cap
def test_search_refuses_a_window_beyond_the_request_cap_before_any_run(tmp_path, capsys):
    err = _error(SEARCH[:2] + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--served", "8", "--slots", "8",
                               "--window", "1e12", "--cache", str(tmp_path / "sc")], capsys)
    assert "--window 1e+12: the search's busiest run would be offered ~1,466,666,666,667 requests (8 served adapters" \
           in err and "more than the 5,000,000 a run may hold" in err and "lower --window" in err
    assert not (tmp_path / "sc").exists()


def test_the_request_cap_is_twin_runs():
    pairs = [([1.0, 1.0, 1.0], [8, 16, 32]), ([0.5, 0.5, 0.5], [8, 8, 8])]
    check_requests(pairs, [10], MAX_REQUESTS / 10)  # exactly the cap: allowed (twin run refuses above it)
    with pytest.raises(ValueError, match="more than the 5,000,000"):
        check_requests(pairs, [10, 11], MAX_REQUESTS / 10)  # the largest served count decides
    check_requests([([0.4, 0.05, 0.00625], [8, 16, 32])], [384], 3600)  # the published grid's busiest: fine


# --------------------------------------------------------------------------- 4: rates, ranks, --feature, --served
@pytest.mark.parametrize("rates, ranks, message", [
    ("0.4,0.05", "8,16,32", "--rates '0.4,0.05': 2 values, expected a triple"),
    ("0.4,0.05,0.1,0.2", "8,16,32", "--rates '0.4,0.05,0.1,0.2': 4 values, expected a triple"),
    ("0.4,0.05,0.1", "8,16", "--ranks '8,16': 2 values, expected a triple"),
    ("0.4,,0.1", "8,16,32", "--rates '0.4,,0.1': an empty item"),
    ("0.4,0.05,0.1,", "8,16,32", "--rates '0.4,0.05,0.1,': an empty item"),
    ("0.4,0.05,0.1", ",8,16,32", "--ranks ',8,16,32': an empty item"),
    ("", "8,16,32", "--rates '': empty list"),
    ("-0.4,0.05,0.1", "8,16,32", "--rates '-0.4,0.05,0.1': -0.4 is not a rate; give per-adapter request rates in "
                                 "req/s above 0"),
    ("0,0.05,0.1", "8,16,32", "--rates '0,0.05,0.1': 0 is not a rate"),
    ("nan,0.05,0.1", "8,16,32", "--rates: 'nan' is not a valid float; give comma-separated values, e.g. 0.4,0.05,0.00625"),
    ("0.4,0.05,0.1", "0,16,32", "--ranks '0,16,32': 0 is not a LoRA rank; give whole numbers >= 1"),
    ("0.4,0.05,0.1", "-8,16,32", "--ranks '-8,16,32': -8 is not a LoRA rank"),
    ("0.4,0.05,0.1", "8.5,16,32", "--ranks: '8.5' is not a valid int"),
])
def test_predict_takes_a_rate_and_a_rank_triple(capsys, rates, ranks, message):
    err = _error(PREDICT + [f"--rates={rates}", f"--ranks={ranks}"], capsys)
    assert message in err, err


@pytest.mark.parametrize("rates, ranks, message", [
    ("0.4,0.05", "8,16,32", "--rates '0.4,0.05' and --ranks '8,16,32': 2 rates but 3 ranks; give one rate and one "
                            "rank per adapter class"),
    ("0.4,0.05,0.1,0.2", "8,16,32", "4 rates but 3 ranks"),
    ("0.4,0.05,0.1", "8,16", "3 rates but 2 ranks"),
    ("0.4,,0.1", "8,16,32", "--rates '0.4,,0.1': an empty item"),
    ("0.4,0.05,0.1", "8,16,0", "--ranks '8,16,0': 0 is not a LoRA rank"),
])
def test_search_takes_one_rate_and_one_rank_per_class(tmp_path, capsys, rates, ranks, message):
    err = _error(SEARCH + [f"--rates={rates}", f"--ranks={ranks}", "--cache", str(tmp_path / "sc")], capsys)
    assert message in err, err
    assert not (tmp_path / "sc").exists()


def test_the_rate_and_rank_forms_that_were_valid_still_are():
    from twin.configurator.cli import _pair

    p = configure_parser()
    for rates, ranks in (("0.4,0.05,0.00625", "8,16,32"), ("0.4-0.05-0.00625", "8-16-32"),
                         ("0.4 0.05 0.00625", " 8, 16, 32 ")):
        ns = p.parse_args(PREDICT + ["--rates", rates, "--ranks", ranks])
        assert _pair(ns) == ([0.4, 0.05, 0.00625], [8, 16, 32])
    ns = p.parse_args(SEARCH + ["--rates", "0.4,0.1", "--ranks", "8,16"])  # search: any number of classes
    assert _pair(ns, triple=False) == ([0.4, 0.1], [8, 16])


@pytest.mark.parametrize("feature", ["rate_max=5", "rank_std=0", "rate_mean=0.1"])
def test_predict_refuses_a_feature_that_rates_or_ranks_give(capsys, feature):
    name = feature.split("=")[0]
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--feature", feature], capsys)
    assert f"--feature '{feature}': {name} is derived from --rates / --ranks" in err
    assert "change --rates / --ranks instead" in err
    help_text = configure_parser()._subparsers._group_actions[0].choices["configure"]._subparsers._group_actions[0] \
        .choices["predict"].format_help()
    assert "derived from" in " ".join(help_text.split())  # and --help says so


@pytest.mark.parametrize("flag, value, message", [
    ("--served", "", "--served '': empty list; give comma-separated values, e.g. --served 16,32,64"),
    ("--served", "8,,16", "--served '8,,16': an empty item"),
    ("--served", "0", "--served '0': 0 is not a served-adapter count; give whole numbers >= 1"),
    ("--slots", " ", "--slots ' ': empty list"),
    ("--slots", "-4", "--slots '-4': -4 is not a slot count"),
])
def test_search_refuses_an_empty_or_bad_configuration_grid(tmp_path, capsys, flag, value, message):
    err = _error(["configure", "search", "--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--window", "60",
                  f"{flag}={value}", "--cache", str(tmp_path / "sc")], capsys)
    assert message in err, err
    assert not (tmp_path / "sc").exists()


# --------------------------------------------------------------------------- 5: train --profile
def test_train_refuses_an_unknown_profile_before_reading_the_data(tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    synthetic_labels(8).to_csv(labels, index=False)
    argv = ["configure", "train", str(labels), "--no-search", "--out", str(tmp_path / "m.json")]
    err = _error(argv + ["--profile", "nosuch"], capsys)
    assert "--profile: unknown profile 'nosuch'; available: default, " in err and "llama-3.1-8b_h100_vllm085" in err
    err = _error(argv + ["--profile", ""], capsys)
    assert "--profile '': give the profile the sweeps ran with" in err
    err = _error(argv + ["--profile", str(tmp_path / "nosuch.json")], capsys)
    assert "nosuch.json does not exist" in err
    assert not (tmp_path / "m.json").exists()
    assert main(argv + ["--profile", "llama-3.1-8b_h100_vllm085", "--json"]) == 0  # a shipped one is fine
    assert json.loads(capsys.readouterr().out)["profile"] == "llama-3.1-8b_h100_vllm085"


@pytest.mark.parametrize("features, message", [
    ("", "--features '': an empty name"),
    ("rate_max,,rank_max", "--features 'rate_max,,rank_max': an empty name"),
    ("rate_max,rate_max", "--features 'rate_max,rate_max': rate_max is named twice"),
])
def test_train_refuses_an_empty_or_repeated_feature(tmp_path, capsys, features, message):
    labels = tmp_path / "labels.csv"
    synthetic_labels(8).to_csv(labels, index=False)
    err = _error(["configure", "train", str(labels), "--no-search", "--out", str(tmp_path / "m.json"),
                  f"--features={features}"], capsys)
    assert message in err


# --------------------------------------------------------------------------- 6: search --rule slo
def _options(command: str) -> set[str]:
    sub = configure_parser()._subparsers._group_actions[0].choices["configure"]._subparsers._group_actions[0]
    return {o for a in sub.choices[command]._actions for o in a.option_strings}


def test_search_slo_rule_names_options_that_search_takes(tmp_path, capsys):
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--rule", "slo",
                           "--cache", str(tmp_path / "sc")], capsys)
    assert "--rule slo: the search's runs record no [slo] attainment; give percentile SLOs on its runs, e.g. " \
           "--ttft-p99-s 5 --itl-p99-s 0.15" in err
    assert not (tmp_path / "sc").exists()
    for command in ("search", "dataset", "train"):  # every command whose slo message names them takes them
        assert {"--ttft-p99-s", "--itl-p99-s"} <= _options(command)
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--ttft-p99-s", "5",
                           "--cache", str(tmp_path / "sc")], capsys)
    assert "--ttft-p99-s / --itl-p99-s apply to --rule slo, not 'throughput90'" in err
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--rule", "slo", "--itl-p99-s", "-1",
                           "--cache", str(tmp_path / "sc")], capsys)
    assert "--itl-p99-s -1: must be > 0" in err


def test_search_slo_rule_with_percentile_slos(tmp_path, capsys):
    argv = SEARCH + ["--rates", "0.1,0.05,0.025", "--ranks", "8,16,32", "--cache", str(tmp_path / "sc"), "--json"]
    assert main(argv + ["--rule", "slo", "--ttft-p99-s", "5", "--itl-p99-s", "0.15"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rule"] == "slo" and d["slo"] == {"ttft_p99_s": 5.0, "itl_p99_s": 0.15}
    assert (d["served_adapters"], d["adapter_slots"]) == (8, 8)
    err = _error(argv + ["--rule", "slo", "--ttft-p99-s", "1e-6"], capsys)  # the cached run, below any TTFT
    assert "no configuration of the search meets the SLOs (P99 TTFT <= 1e-06 s) without starving: 1 runs (1 ok)" in err
    assert main(argv) == 0  # the default rule's answer carries no slo
    assert "slo" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e300"])
def test_search_and_evaluate_refuse_a_bad_serving_host_time(tmp_path, capsys, value):
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--serving-us", value,
                           "--cache", str(tmp_path / "c")], capsys)
    assert "--serving-us" in err and not (tmp_path / "c").exists()
    err = _error(["configure", "evaluate", "--real", str(tmp_path / "none.csv"), "--serving-us", value], capsys)
    assert "--serving-us" in err


@pytest.mark.parametrize("value, what", [("-1", "--rank-tile-cost"), ("nan", "--rank-tile-cost"),
                                         ("1e300", "--rank-tile-cost")])
def test_search_and_evaluate_refuse_a_bad_rank_tile_cost(tmp_path, capsys, value, what):
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--rank-tile-cost", value,
                           "--cache", str(tmp_path / "c")], capsys)
    assert what in err and not (tmp_path / "c").exists()
    err = _error(["configure", "evaluate", "--real", str(tmp_path / "none.csv"), "--rank-tile-cost", value], capsys)
    assert what in err


def test_search_refuses_a_rank_tile_cost_its_profile_cannot_take(tmp_path, capsys):
    err = _error(SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--rank-tile-cost", "0.3",
                           "--profile", "llama-2-7b_h100_vllm050", "--cache", str(tmp_path / "c")], capsys)
    assert "has no rank tiles" in err and not (tmp_path / "c").exists()


def test_rank_tile_cost_of_predict_and_evaluate_takes_profile_and_names_the_fix(tmp_path, capsys):
    """`--rank-tile-cost` of predict / evaluate: a number, or 'profile' (the profile's own tiles, whatever the
    model was trained on); anything else is refused by the parser with the fix (exit 2)."""
    from tests.helpers import configure_parser

    p = configure_parser()
    ns = p.parse_args(["configure", "evaluate", "--rank-tile-cost", "Profile"])
    assert ns.rank_tile_cost == "profile" and ns.serving_us is None  # None: the model's engine
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--check",
                       "--rank-tile-cost", "0.5"])
    assert ns.rank_tile_cost == 0.5
    with pytest.raises(SystemExit) as e:
        p.parse_args(["configure", "evaluate", "--rank-tile-cost", "cheap"])
    assert e.value.code == 2
    from twin.validation.specs import RANK_TILE_COST

    assert (f"'cheap': give a cost relative to the first rank tile, e.g. {RANK_TILE_COST:g} (1: every tile alike), "
            f"or 'profile'") in capsys.readouterr().err


# --------------------------------------------------------------------------- 7: --model FILE and --kind
@pytest.mark.parametrize("argv, message", [
    (PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--kind", "figs"],
     "--kind figs with --model {m}: the file is a cart model, and --kind picks only a shipped model of --profile; "
     "leave --kind out, or leave --model out for the shipped figs model"),
    (["configure", "rules", "--kind", "hstree"], "--kind hstree with --model {m}: the file is a cart model"),
])
def test_a_kind_the_model_file_is_not_is_refused(capsys, argv, message):
    """``--kind`` picks a shipped model; beside ``--model FILE`` it was silently ignored (the file's kind ran)."""
    from twin.configurator.models import shipped_model_path

    m = str(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart"))
    err = _error(argv + ["--model", m], capsys)
    assert message.format(m=m) in err, err
    assert main(argv[:-2] + ["--kind", "cart", "--model", m, "--json"]) == 0  # the file's own kind: fine
    capsys.readouterr()


def test_a_model_file_of_an_unknown_kind_is_refused(tmp_path, capsys):
    from twin.configurator.models import shipped_model_path

    m = json.loads(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart").read_text())
    m["kind"] = "nosuch"
    (tmp_path / "m.json").write_text(json.dumps(m))
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--model", str(tmp_path / "m.json")],
                 capsys)
    assert "m.json: damaged configurator model (kind 'nosuch', expected one of rf, cart, hstree, figs, rulefit)" in err


@pytest.mark.parametrize("key, value, message", [
    # an empty grid: numpy's "attempt to get argmin of an empty sequence"
    ("grid", {"served": [], "slots": [16]}, "damaged configurator model (grid served [], expected a non-empty list of "
                                           "whole numbers >= 1 (the served-adapter counts a prediction snaps to))"),
    ("grid", {"served": [16], "slots": ["x"]}, "grid slots ['x'], expected a non-empty list of whole numbers >= 1"),
    ("grid", [16, 32], "grid [16, 32], expected {\"served\": [...], \"slots\": [...]}"),
    # values read without a check: an unknown combine ran as a mean, a text log_targets as true
    ("combine", "median", "combine 'median', expected mean (a forest), sum (FIGS) or rule_ensemble (RuleFit)"),
    ("log_targets", "yes", "log_targets 'yes', expected true or false"),
    # a TypeError traceback in predict, rules and evaluate
    ("rules", 5, "rules 5, expected a list of rules (each its conditions and prediction)"),
    # accepted, or refused as something else
    ("policy", 5, "policy 5, expected the name of the policy the model was trained on"),
    ("policies", [5], "policies [5], expected the list of the policy names"),
    ("features", ["foo"] * 8, "feature 'foo' listed twice; each feature is one column of the model's input"),
    ("features", [5] * 8, "feature 5 is not a feature name (the configurator computes rate_max, "),
    # predicted, printed "policy bogus", and failed only under --check
    ("policy", "bogus", "a policy it was trained on is not one the twin sweeps: unknown policy 'bogus'"),
    # "could not convert string to float: 'x'" under --check, naming neither the file nor the field
    ("provenance", {"engine": {"serving_us": 18, "rank_tile_cost": "x"}}, "provenance engine {'serving_us': 18, "
                                                                            "'rank_tile_cost': 'x'}, expected"),
])
def test_a_hand_edited_model_file_is_refused_naming_the_key(tmp_path, capsys, key, value, message):
    from twin.configurator.models import shipped_model_path

    m = json.loads(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart").read_text())
    m[key] = {**m[key], **value} if key == "provenance" else value
    (tmp_path / "m.json").write_text(json.dumps(m))
    for argv in (PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32"], ["configure", "rules"]):
        err = _error(argv + ["--model", str(tmp_path / "m.json")], capsys)
        assert "m.json: damaged configurator model (" in err and message in err, err


def test_a_model_file_without_a_grid_snaps_to_the_published_grid(tmp_path, capsys):
    """A model trained without a grid (``grid: {}``, as ``train(..., grid=None)`` writes it, or the key left out)
    snapped every recommendation to 16 adapters and 16 slots (the raw 154 / 32 shown beside it); it snaps to the
    published grid, as ``predict --check`` does."""
    from twin.configurator.models import shipped_model_path

    m = json.loads(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart").read_text())
    argv = PREDICT + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--json", "--model"]
    assert main(argv + [str(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart"))]) == 0
    shipped = json.loads(capsys.readouterr().out)
    for grid in ({}, None):
        if grid is None:
            m.pop("grid")
        else:
            m["grid"] = grid
        (tmp_path / "m.json").write_text(json.dumps(m))
        assert main(argv + [str(tmp_path / "m.json")]) == 0
        got = json.loads(capsys.readouterr().out)
        assert (got["served_adapters"], got["adapter_slots"]) == (shipped["served_adapters"], shipped["adapter_slots"])
        assert (got["served_adapters"], got["adapter_slots"]) != (16, 16)


def test_a_table_row_with_a_cell_too_many_is_refused(tmp_path, capsys):
    """A trailing comma on the rows of a labels table: pandas read its first column as row labels and
    shifted every value one column left."""
    lab = synthetic_labels(8)
    text = lab.to_csv(index=False).splitlines()
    (tmp_path / "labels.csv").write_text("\n".join([text[0]] + [t + "," for t in text[1:]]) + "\n")
    err = _error(["configure", "train", str(tmp_path / "labels.csv"), "--no-search", "--out",
                  str(tmp_path / "m.json")], capsys)
    assert (f"labels.csv: row 1 (line 2) has {len(lab.columns) + 1} cells but the header names {len(lab.columns)} "
            f"columns (a trailing comma?)") in err, err
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------- 8: options nothing reads, mixed runs
@pytest.mark.parametrize("flags, message", [
    (["--slo-share", "0.5"], "--slo-share 0.5: applies to --rule slo (the minimum SLO attainment), not 'throughput90', "
                             "which does not read it; leave it out or give --rule slo"),
    (["--rule", "robust", "--slo-share", "0.5"], "--slo-share 0.5: applies to --rule slo"),
    (["--tolerance", "0.05"], "--tolerance 0.05: applies to --rule robust (the throughput tolerance among the best "
                              "configurations), not 'throughput90'"),
    (["--rule", "slo", "--tolerance", "0.05"], "--tolerance 0.05: applies to --rule robust"),
    (["--rule", "slo", "--slo-share", "0.5", "--ttft-p99-s", "5"],
     "--slo-share 0.5 with --ttft-p99-s / --itl-p99-s: the percentile SLOs decide which runs meet the SLO"),
])
def test_a_labelling_option_the_rule_does_not_read_is_refused(tmp_path, capsys, flags, message):
    """``dataset --slo-share`` under throughput90 / robust (or beside percentile SLOs) and ``--tolerance``
    under any rule but robust were ignored in silence."""
    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    pd.DataFrame([_run_rows(offered_tok_s=1000.0, total_tok_s=950.0, **feats)]).to_csv(tmp_path / "r.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "r.csv")] + flags + ["--out", str(tmp_path / "l.csv")], capsys)
    assert message in err, err
    assert not (tmp_path / "l.csv").exists()


def test_runs_of_two_profiles_are_refused_by_dataset(tmp_path, capsys):
    """Runs of two profiles were labelled into one table (which ``train`` then refused); ``dataset`` says so."""
    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    rows = [_run_rows(offered_tok_s=1000.0, total_tok_s=950.0, profile=p, **feats)
            for p in ("llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085")]
    pd.DataFrame(rows).to_csv(tmp_path / "r.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "r.csv"), "--out", str(tmp_path / "l.csv")], capsys)
    assert ("the runs mix profiles (llama-3.1-8b_h100_vllm085 in 1 runs; qwen-2.5-7b_h100_vllm085 in 1 runs): label "
            "the sweeps of each profile apart (and train one model per profile)") in err
    assert not (tmp_path / "l.csv").exists()


def test_runs_without_a_throughput_to_label_are_refused_by_dataset(tmp_path, capsys):
    """Runs whose throughput is empty (stopped early, or the column lost) raised pandas' "Encountered all NA values"
    from the label walk, or printed and wrote an empty table as labelled."""
    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    pd.DataFrame([_run_rows(offered_tok_s=1000.0, total_tok_s=float("nan"), **feats)]).to_csv(tmp_path / "r.csv",
                                                                                              index=False)
    err = _error(["configure", "dataset", str(tmp_path / "r.csv"), "--out", str(tmp_path / "l.csv")], capsys)
    assert "no scenario of the 1 runs could be labelled under rule throughput90: no candidate run has a throughput" \
        in err, err
    assert not (tmp_path / "l.csv").exists()


@pytest.mark.parametrize("flags, message", [
    ([], "3 labelled scenarios are too few for the grid search's cross-validation (it needs at least 6: two per "
         "fold, three folds); label more scenarios, or give --no-search"),
    (["--no-search", "--rule", "robust"], "--rule robust: labels sweep directories, and the labels given were labelled "
                                          "under throughput90; leave out --rule, or relabel"),
    (["--no-search", "--ttft-p99-s", "5"], "--ttft-p99-s: label sweep directories, and {f} is a labels file"),
])
def test_train_refuses_what_it_would_skip(tmp_path, capsys, flags, message):
    """3 labels trained with no grid search although one was asked for (the default); ``--rule`` /
    ``--ttft-p99-s`` beside labels files only were ignored (nothing is labelled there)."""
    lab = synthetic_labels(3).assign(rule="throughput90")
    f = tmp_path / "labels.csv"
    lab.to_csv(f, index=False)
    err = _error(["configure", "train", str(f), "--out", str(tmp_path / "m.json")] + flags, capsys)
    assert message.format(f=f) in err, err
    assert not (tmp_path / "m.json").exists()
    assert main(["configure", "train", str(f), "--no-search", "--rule", "throughput90", "--out",
                 str(tmp_path / "m.json"), "--json"]) == 0  # the labels' own rule: fine
    capsys.readouterr()


@pytest.mark.parametrize("value", [float("nan"), 1e300])
def test_a_model_file_with_a_nonsense_leaf_is_refused(tmp_path, capsys, value):
    """A NaN or 1e300 leaf printed "serve 16 adapters ... (raw nan / nan); expected throughput nan tok/s" (exit 0)."""
    from twin.configurator.models import shipped_model_path

    m = json.loads(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart").read_text())
    t = m["trees"][0]
    key = "leaf_value" if "leaf_value" in t else "value"
    t[key][-1][0] = value
    (tmp_path / "m.json").write_text(json.dumps(m))
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--model", str(tmp_path / "m.json")],
                 capsys)
    assert "damaged configurator model (tree 0: a leaf value that is not a finite number of a sensible size" in err


def test_train_without_out_leaves_the_shipped_model_alone(tmp_path, capsys, monkeypatch):
    """``configure train`` wrote over the shipped model of the profile by default (a smoke sweep's two-scenario tree
    replaced the 831-scenario one, which predict, rules and evaluate then used); it writes to configurators/ in the
    current directory unless --out names a file."""
    import hashlib

    from twin.cli import main
    from twin.configurator.models import shipped_model_path

    shipped = shipped_model_path("llama-3.1-8b_h100_vllm085", "cart")
    before = hashlib.sha256(shipped.read_bytes()).hexdigest()
    lab = synthetic_labels(8).assign(rule="throughput90")
    lab.to_csv(tmp_path / "labels.csv", index=False)
    monkeypatch.chdir(tmp_path)
    assert main(["configure", "train", "labels.csv", "--kind", "cart", "--no-search",
                 "--profile", "llama-3.1-8b_h100_vllm085"]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "configurators" / "llama-3.1-8b_h100_vllm085.cart.json").exists()
    assert "use it with --model configurators/llama-3.1-8b_h100_vllm085.cart.json" in out, out
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == before


# --------------------------------------------------------------------------- predict --check, search: impossible input
@pytest.mark.parametrize("argv", [PREDICT + ["--check"], PREDICT, SEARCH])
def test_a_rank_above_vllms_limit_is_refused_before_any_run(tmp_path, capsys, monkeypatch, argv):
    """`predict --check --ranks 8,16,1024` ran the twin (start failures) and still recommended a configuration;
    search ran its walk. Both now refuse as `twin run` does."""
    import twin.sweep.scenario as scenario

    def no_run(*a, **k):
        raise AssertionError("a twin run")

    monkeypatch.setattr(scenario, "run_config", no_run)
    err = _error(argv + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,1024", "--cache", str(tmp_path / "sc")]
                 if argv is SEARCH else argv + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,1024"], capsys)
    assert ("--ranks 1024: above 512, the largest --max-lora-rank vLLM accepts (8, 16, 32, 64, 128, 256, 320, 512; "
            "LoRAConfig): vLLM cannot serve such an adapter; give ranks of at most 512, e.g. --ranks 8,16,32") in err
    assert main(["run", "--ranks", "8,16,1024", "--adapters", "3"]) == 2  # (the same words as twin run's)
    assert err.split("error: ", 1)[1] in capsys.readouterr().err


def test_predict_check_where_no_configuration_starts_recommends_nothing(capsys):
    """Rank 512: every configuration the check tries fails vLLM's start-up check; it printed "serve 160 adapters
    with 16 GPU adapter slots" anyway."""
    argv = PREDICT + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,512", "--check"]
    assert main(argv) == 1
    cap = capsys.readouterr()
    assert "serve " not in cap.out and "GPU adapter slots" not in cap.out
    assert ("twin configure predict: no recommendation: the twin's check tried 160/32, 160/16 (served/slots) and none "
            "passed vLLM's start-up check (first: 32 adapter slots of max rank 512 leave no memory for the KV cache") \
        in cap.err
    assert main(argv + ["--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["served_adapters"] is None and d["adapter_slots"] is None and d["check"]["none_started"] is True
    assert d["check"]["steps"][0]["startup_reason"].startswith("32 adapter slots of max rank 512 leave no memory")


def test_predict_check_refuses_rates_beyond_the_request_cap(capsys, monkeypatch):
    """`--rates 1e30,1,1 --check` printed numpy's "lam value too large"."""
    import twin.sweep.scenario as scenario

    def no_run(*a, **k):
        raise AssertionError("a twin run")

    monkeypatch.setattr(scenario, "run_config", no_run)
    err = _error(PREDICT + ["--rates", "1e30,1,1", "--ranks", "8,16,32", "--check"], capsys)
    # (refused with the rates, before the model is read: one such adapter alone exceeds a run's requests)
    assert ("--rates '1e30,1,1': 1e+30 req/s per adapter is beyond what the twin can simulate: one such adapter sends "
            "more than 5,000,000 requests (a run's limit)" in err), err
    assert "lam" not in err
    # a rate within the bound whose recommended configuration still exceeds the cap: the check's own refusal
    err = _error(PREDICT + ["--rates", "1000,1000,1000", "--ranks", "8,16,32", "--check"], capsys)
    assert ("the twin's check at the recommended " in err and
            "more than the 5,000,000 a run may hold (the cap of `twin run`); lower --rates" in err), err


def test_predict_names_an_unknown_policy_as_unknown(capsys):
    """`--policy nosuch` said the model "was trained without policy features"."""
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--policy", "nosuch"], capsys)
    assert "unknown policy 'nosuch'; use 'fcfs+client-cap' (the published runs) or a preset of `twin policies`: " \
        in err and "ema-prefetch" in err and "trained without" not in err
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--policy", "ema-prefetch"], capsys)
    assert "this configurator was trained without policy features" in err  # (a known policy: the model's limit)


@pytest.mark.parametrize("flag", ["--served", "--slots"])
def test_search_refuses_a_repeated_served_or_slot_value(tmp_path, capsys, flag):
    """`--served 8,8` ran the value twice and printed "next run nan"."""
    argv = [a for a in SEARCH]
    argv[argv.index(flag) + 1] = "8,8"
    err = _error(argv + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--cache", str(tmp_path / "sc")], capsys)
    assert f"{flag} '8,8': 8 is listed twice (its runs would be done twice); give each value once" in err
    assert not (tmp_path / "sc").exists()


@pytest.mark.parametrize("argv, flag", [
    (SEARCH + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--cache"], "--cache"),
    (["configure", "evaluate", "--search-cache"], "--search-cache"),
])
def test_a_cache_that_is_a_file_is_named_by_its_flag(tmp_path, capsys, argv, flag):
    """`--cache junk.csv` said "cannot use junk.csv/shards: Not a directory", naming no option."""
    junk = tmp_path / "junk.csv"
    junk.write_text("x\n")
    err = _error(argv + [str(junk)], capsys)
    assert f"{flag} {junk}: is an existing file, not a directory; give a directory" in err


def test_train_says_when_it_cross_validates_with_fewer_folds_than_cv(tmp_path, capsys):
    """`--cv 100` on 6 scenarios trained with 3 folds (two scenarios per fold) without a word."""
    f = tmp_path / "labels.csv"
    synthetic_labels(6).assign(rule="throughput90").to_csv(f, index=False)
    assert main(["configure", "train", str(f), "--kind", "cart", "--cv", "100", "--out", str(tmp_path / "m.json"),
                 "--json"]) == 0
    cap = capsys.readouterr()
    assert ("twin configure train: note: --cv 100: 6 labelled scenarios make at most 3 folds (the halving search fits "
            "two scenarios per fold), so the search cross-validated with 3") in cap.err
    assert json.loads(cap.out)["cv_folds"] == 3
    assert main(["configure", "train", str(f), "--kind", "cart", "--cv", "3", "--out", str(tmp_path / "m.json"),
                 "--json"]) == 0
    assert "note" not in capsys.readouterr().err


# --------------------------------------------------------------------------- labels files, --profile, --cv, --features
def test_a_model_trained_on_a_labels_file_snaps_to_the_labels_configurations(tmp_path, capsys):
    """A model trained on a labels file snapped to the published grid (16 and up): labels of 8 served adapters
    and 8 slots gave "serve 16 adapters with 16 GPU adapter slots (raw 8.0 / 8.0)", where the model trained on
    their sweep directory said 8 / 8. It records the configurations of its labels (and of its sweeps)."""
    from twin.configurator.dataset import trained_grid

    lab = synthetic_labels(4).assign(served_adapters=8, adapter_slots=8, rule="throughput90",
                                     profile="llama-3.1-8b_h100_vllm085")
    lab.to_csv(tmp_path / "labels.csv", index=False)
    assert main(["configure", "train", str(tmp_path / "labels.csv"), "--kind", "cart", "--no-search", "--out",
                 str(tmp_path / "m.json"), "--json"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "m.json").read_text())["grid"] == {"served": [8], "slots": [8]}
    assert main(PREDICT + ["--rates", "0.4,0.2,0.1", "--ranks", "8,8,8", "--model", str(tmp_path / "m.json"),
                           "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["served_adapters"], got["adapter_slots"]) == (8, 8)
    # a sweep's grid and its labels' values (next_served: a configuration its walk ran) together
    sweeps = [{"served": [8, 16], "slots": [8]}]
    assert trained_grid(lab.assign(next_served=float("nan")), sweeps) == {"served": [8, 16], "slots": [8]}
    assert trained_grid(lab.assign(next_served=32.0), []) == {"served": [8, 32], "slots": [8]}


def test_a_profile_other_than_the_labels_or_the_models_is_refused(tmp_path, capsys):
    """`train labels.csv --profile qwen...` recorded qwen for llama labels (predict --check then ran qwen), and
    `predict --model <a llama model> --profile qwen...` ignored --profile."""
    from twin.configurator.models import shipped_model_path

    llama, qwen = "llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085"
    lab = synthetic_labels(4).assign(profile=llama, rule="throughput90")
    lab.to_csv(tmp_path / "labels.csv", index=False)
    argv = ["configure", "train", str(tmp_path / "labels.csv"), "--no-search", "--out", str(tmp_path / "m.json")]
    err = _error(argv + ["--profile", qwen], capsys)
    assert (f"--profile {qwen}: the labels were made with profile {llama} (their profile column), not {qwen}; the "
            f"model would record the wrong profile") in err and "leave --profile out (it is read from the data)" in err
    assert not (tmp_path / "m.json").exists()
    assert main(argv + ["--profile", llama, "--json"]) == 0  # the labels' own: fine
    capsys.readouterr()
    model = str(shipped_model_path(llama, "cart"))
    for command in (PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32"], ["configure", "rules"]):
        err = _error(command + ["--model", model, "--profile", qwen], capsys)
        assert (f"--profile {qwen} with --model {model}: the model was trained on {llama}, and --profile picks only a "
                f"shipped model; leave --profile out (the model's own profile is used)") in err, err
        assert main(command + ["--model", model, "--profile", llama]) == 0  # the model's own: fine
        capsys.readouterr()


def test_train_refuses_cv_without_a_search(tmp_path, capsys):
    """`--cv 3 --no-search` was accepted and read by nothing."""
    lab = synthetic_labels(8).assign(rule="throughput90")
    lab.to_csv(tmp_path / "labels.csv", index=False)
    err = _error(["configure", "train", str(tmp_path / "labels.csv"), "--cv", "3", "--no-search", "--out",
                  str(tmp_path / "m.json")], capsys)
    assert "--cv 3 with --no-search: no cross-validation is run (the default hyper-parameters are fitted once); " \
           "leave one out" in err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("features, message", [
    ("rate_max,nosuch", "has no column 'nosuch' (a feature is a numeric column of the labels; the configurator "
                        "computes rate_max, rate_min, rate_mean, rate_std, rank_max, rank_min, rank_mean, rank_std, "
                        "mean_input_tokens, mean_output_tokens and policy)"),
    ("rate_max,rank_maxx", "--features: {labels} has no column 'rank_maxx' (did you mean 'rank_max'?)"),
    ("rate_max,policy=fcfs", "--features: 'policy=fcfs' is an indicator column; name 'policy'"),
])
def test_train_names_an_unknown_feature_as_a_feature(tables, tmp_path, capsys, features, message):
    """A misspelt feature read "labels.csv: not a labels table (missing columns ['nosuch'])"."""
    err = _error(["configure", "train", str(tables["labels"]), "--no-search", "--out", str(tmp_path / "m.json"),
                  "--features", features], capsys)
    assert message.format(labels=tables["labels"]) in err, err
    assert "not a labels table" not in err


def test_a_numeric_column_of_the_labels_can_be_a_feature(tmp_path, capsys):
    """A feature is any numeric column of the labels (predict --feature NAME=VALUE gives it), not only those the
    configurator computes."""
    lab = synthetic_labels(8).assign(rule="throughput90", gpu_gb=80.0)
    lab.to_csv(tmp_path / "labels.csv", index=False)
    assert main(["configure", "train", str(tmp_path / "labels.csv"), "--no-search", "--kind", "cart", "--features",
                 "rate_max,rank_max,gpu_gb", "--out", str(tmp_path / "m.json")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    # ... and the saved model predicts with it (stop 57's model-file check refused every such model as damaged)
    assert main(["configure", "predict", "--model", str(tmp_path / "m.json"), "--rates", "0.4,0.2,0.1", "--ranks",
                 "8,16,32", "--feature", "gpu_gb=80", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["served_adapters"] >= 1
    err = _error(["configure", "predict", "--model", str(tmp_path / "m.json"), "--rates", "0.4,0.2,0.1", "--ranks",
                  "8,16,32"], capsys)
    assert "the model was trained on features ['gpu_gb'] beyond the rate and rank triples; give them as --feature " \
           "NAME=VALUE (e.g. --feature gpu_gb=...)" in err, err


# --------------------------------------------------------------------------- the slo rule's starving runs
def test_dataset_slo_says_the_runs_that_meet_the_slo_are_starving(tmp_path, capsys):
    """Every run met the SLO but starved, and the message said "no run meets the SLO (lower --slo-share, ...)",
    an option refused beside --ttft-p99-s."""
    feats = features_of([0.4, 0.2, 0.1], [8, 16, 32])
    rows = [_run_rows(scenario=f"s{i}", offered_tok_s=1000.0, total_tok_s=880.0 + i, starving=True,
                      ttft_ms_p99=200.0, itl_ms_p99=20.0, **feats) for i in range(3)]
    pd.DataFrame(rows).to_csv(tmp_path / "r.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "r.csv"), "--rule", "slo", "--ttft-p99-s", "5"], capsys)
    assert ("no scenario of the 3 runs could be labelled under rule slo: all 3 runs meet the SLO but are starving "
            "(throughput at most 0.882 of the offered tokens, below the starvation line, --ratio 0.9); the slo rule "
            "labels only runs that keep up") in err, err
    assert "--slo-share" not in err
    err = _error(["configure", "dataset", str(tmp_path / "r.csv"), "--rule", "slo", "--ttft-p99-s", "0.1"], capsys)
    assert "none of the 3 runs with a throughput meets the SLO; loosen --ttft-p99-s / --itl-p99-s" in err, err
    assert "--slo-share" not in err
    pd.DataFrame([{**r, "slo_attainment": 0.5} for r in rows]).to_csv(tmp_path / "r.csv", index=False)
    err = _error(["configure", "dataset", str(tmp_path / "r.csv"), "--rule", "slo"], capsys)
    assert "none of the 3 runs with a throughput meets the SLO; lower --slo-share, or give the sweep's [slo]" in err


# --------------------------------------------------------------------------- search: a window too short for the line
def test_search_warns_of_a_window_too_short_for_the_starvation_line(tmp_path, capsys):
    """`--window 30` answered differently than `--window 600` without a word: the requests still in flight at the
    window's end (about a request's time / the window of the offered tokens) go uncounted."""
    argv = ["configure", "search", "--rates", "0.2,0.1", "--ranks", "8,8", "--served", "8", "--slots", "8",
            "--cache", str(tmp_path / "sc")]
    assert main(argv + ["--window", "30"]) == 0
    err = capsys.readouterr().err
    assert ("twin configure search: warning: --window 30 is short for the starvation line (throughput >= 0.9 of the "
            "offered tokens): a request of the scenario takes ~") in err, err
    assert "even a run offered next to nothing is expected to read as starving; give --window >= " in err
    assert main(argv + ["--window", "600"]) == 0
    assert "warning" not in capsys.readouterr().err
    # a search the short window leaves without an answer says it too (the warning came after the runs, and an
    # error came first)
    assert main(argv + ["--window", "30", "--rule", "slo", "--ttft-p99-s", "0.000001"]) == 2
    err = capsys.readouterr().err
    assert "warning: --window 30 is short for the starvation line" in err and "no configuration of the search" in err


def test_labels_without_a_profile_column_give_a_model_that_loads(tmp_path, capsys):
    """Hand-made labels with no profile column: the model records the default profile and says so (it recorded
    profile None, which load_model then refused as a damaged file)."""
    synthetic_labels(8).drop(columns=["profile"], errors="ignore").to_csv(tmp_path / "labels.csv", index=False)
    assert main(["configure", "train", str(tmp_path / "labels.csv"), "--kind", "cart", "--no-search", "--out",
                 str(tmp_path / "m.json")]) == 0
    assert "the labels name no profile (no profile column)" in capsys.readouterr().err
    assert main(["configure", "predict", "--rates", "0.4,0.2,0.1", "--ranks", "8,16,32", "--model",
                 str(tmp_path / "m.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["adapter_slots"] >= 1


def test_a_model_whose_log_prediction_overflows_is_refused(tmp_path, capsys):
    """A leaf of 1000 in log space passed the load check (< 1e12) and overflowed exp: numpy's warning, then a
    recommendation of inf served adapters with exit 0."""
    from twin.configurator.models import shipped_model_path

    m = json.loads(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart").read_text())
    assert m["log_targets"]
    m["trees"][0]["leaf_value"] = [[1000.0, 3.0, 9.0] for _ in m["trees"][0]["leaf_value"]]
    (tmp_path / "m.json").write_text(json.dumps(m))
    err = _error(PREDICT + ["--rates", "0.4,0.05,0.1", "--ranks", "8,16,32", "--model", str(tmp_path / "m.json")],
                 capsys)
    assert "m.json: predicts served_adapters of exp(1000), beyond 1e12 (a damaged model file" in err, err
    assert "overflow" not in err


def test_train_refuses_labels_of_a_profile_this_twin_cannot_load(tmp_path, capsys):
    """Labels whose profile column names an unknown profile trained to exit 0; the model failed only at
    `predict --check` ("unknown profile"). --profile FILE is the fix the error names."""
    labels = tmp_path / "labels.csv"
    synthetic_labels(8).assign(profile="other").to_csv(labels, index=False)
    err = _error(["configure", "train", str(labels), "--no-search", "--out", str(tmp_path / "m.json")], capsys)
    assert "the labels were made with profile 'other' (their profile column), which this twin cannot load" in err
    assert "give --profile with that profile's name or JSON file" in err and not (tmp_path / "m.json").exists()


def test_the_search_line_says_when_the_walk_has_no_next_run():
    """`configure search` printed "next run nan" where the walk ran nothing after the label."""
    from twin.configurator.cli import _next_run

    assert _next_run(float("nan")) == _next_run(None) == "no next run in the walk"
    assert _next_run(0.8874) == "next run 0.887"
