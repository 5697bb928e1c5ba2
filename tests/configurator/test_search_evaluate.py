"""`configure search` (the twin as optimiser) and `configure evaluate` on the real ml_test runs."""

from __future__ import annotations

import argparse
import json

import pytest

from twin.configurator.models import save_model, train
from twin.sweep.grid import PUBLISHED_GRID

from tests.configurator.test_models import synthetic_labels
from tests.helpers import ml_test_row


def _cli():
    from twin.configurator.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    return p


def test_search_cli_and_cache(tmp_path, capsys):
    p = _cli()
    argv = ["configure", "search", "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--window", "120", "--served",
            "8,16,32", "--slots", "8,16", "--cache", str(tmp_path), "--json"]
    ns = p.parse_args(argv)
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["served_adapters"] in (8, 16, 32) and d["adapter_slots"] in (8, 16) and d["throughput_tok_s"] > 0
    shards = list((tmp_path / "shards").glob("*.parquet"))
    assert len(shards) == 1
    mtime = shards[0].stat().st_mtime
    ns = p.parse_args(argv)
    assert ns.func(ns) == 0  # cached: nothing re-run
    assert json.loads(capsys.readouterr().out) == d
    assert shards[0].stat().st_mtime == mtime


def _strict(text: str):
    """``json.loads`` that refuses NaN and Infinity (not JSON; jq and most parsers reject them)."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_search_with_coupled_lengths_prints_strict_json(tmp_path, capsys):
    """``--length-corr`` reaches the walk (its own shard, the coupling in its rows and in the answer),
    and a walk whose last run starves has no next run: ``next_ratio`` is ``null``, not ``NaN``."""
    import pandas as pd

    p = _cli()
    argv = ["configure", "search", "--rates", "3.2,1.6,0.8", "--ranks", "8,16,32", "--window", "60", "--served",
            "8,16", "--slots", "8", "--cache", str(tmp_path), "--json"]
    ns = p.parse_args(argv + ["--length-corr", "-0.37"])
    assert ns.func(ns) == 0
    d = _strict(capsys.readouterr().out)
    assert d["length_corr"] == -0.37 and d["served_adapters"] == 8
    assert d["next_ratio"] is None  # the first run already starves: the walk stops there
    rows = pd.read_parquet(next((tmp_path / "shards").glob("*.parquet")))
    assert (rows["length_corr"] == -0.37).all()
    ns = p.parse_args(argv)
    assert ns.func(ns) == 0
    assert _strict(capsys.readouterr().out)["length_corr"] == 0.0
    assert len(list((tmp_path / "shards").glob("*.parquet"))) == 2  # another task, not the coupled one's cache
    with pytest.raises(ValueError, match="--length-corr: 1.0 is not a correlation"):
        ns = p.parse_args(argv + ["--length-corr", "1"])
        ns.func(ns)


@pytest.mark.data
def test_evaluate_on_real_ml_test(real_data, tmp_path, capsys):
    m = train(synthetic_labels(), "rf", cv=3, provenance={"profile": "test", "rule": "throughput90"},
              grid={"served": list(PUBLISHED_GRID), "slots": list(PUBLISHED_GRID)})
    path = save_model(m, tmp_path / "m.json")
    p = _cli()
    ns = p.parse_args(["configure", "evaluate", "--real", str(real_data / "validation/vllm085_h100_llama31_8b.csv"),
                       "--model", str(path), "--no-search", "--json", "--out", str(tmp_path / "ev")])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    for k in ("scenarios", "smape_served", "smape_slots", "smape_throughput", "regret_mean", "regret_min",
              "starving", "model", "profile"):
        assert k in d
    assert d["scenarios"] == 9 and 0 <= d["regret_min"] <= d["regret_mean"] <= 1.0 + 1e-9
    names = [r["predictor"] for r in d["table"]]
    assert "constant (training median)" in names and "published random forest" in names
    assert (tmp_path / "ev" / "evaluation.csv").exists()
    # the model names no profile of this twin ("test"): the runs' model's configurator profile
    assert d["profile"] == "llama-3.1-8b_h100_vllm085_adaptercheck"


@pytest.mark.data
def test_evaluate_with_a_model_runs_the_profile_it_was_trained_on(real_data, capsys):
    """Without --profile, ``evaluate --model M`` scores (and would search and check) on M's own profile, as its
    --help says; without --model, on the configurator profile of the runs' model."""
    from twin.configurator.models import DEFAULT_PROFILE, shipped_model_path

    real = str(real_data / "validation/vllm085_h100_llama31_8b.csv")
    p = _cli()
    for model, profile in ((str(shipped_model_path("llama-3.1-8b_h100_vllm085", "cart")), "llama-3.1-8b_h100_vllm085"),
                           (None, DEFAULT_PROFILE)):
        ns = p.parse_args(["configure", "evaluate", "--real", real, "--no-search", "--json"]
                          + (["--model", model] if model else []))
        assert ns.func(ns) == 0
        assert json.loads(capsys.readouterr().out)["profile"] == profile


def test_search_runs_the_engine_of_the_profiles_shipped_configurator():
    """``configure search`` without --serving-us / --rank-tile-cost: the engine the profile's shipped configurator
    was trained on (the default profile's: twin validate's constants), the calibrated engine for a profile with
    none (or with a calibrated-engine one, Qwen's); a constant given wins."""
    from twin.configurator.cli import _shipped_engine
    from twin.configurator.models import DEFAULT_PROFILE
    from twin.validation.specs import RANK_TILE_COST, SERVING_S_PER_RUNNING

    assert _shipped_engine(DEFAULT_PROFILE, None, None) == (pytest.approx(SERVING_S_PER_RUNNING * 1e6), RANK_TILE_COST)
    assert _shipped_engine("qwen-2.5-7b_h100_vllm085", None, None) == (0.0, None)
    assert _shipped_engine("llama-2-7b_a40_vidur", None, None) == (0.0, None)
    assert _shipped_engine(DEFAULT_PROFILE, 0.0, 1.0) == (0.0, 1.0)
    assert _shipped_engine(DEFAULT_PROFILE, 5.0, None) == (5.0, RANK_TILE_COST)


@pytest.mark.data
def test_regret_of_the_real_optimum_is_one(real_data):
    import pandas as pd

    from twin.configurator.evaluate import real_grid, score_predictor
    from twin.configurator.labels import real_optima
    from twin.sweep.scenario import load_real

    real = load_real(real_data / "validation/vllm085_h100_llama31_8b.csv")
    truth = real_optima(real, "ml_test")
    perfect = pd.DataFrame({"scenario": truth["scenario"], "served_raw": truth["served_adapters"],
                            "slots_raw": truth["adapter_slots"], "throughput": truth["throughput_tok_s"]})
    s, _ = score_predictor("oracle", perfect, truth, real_grid(real[real["source"] == "ml_test"]),
                           list(PUBLISHED_GRID), list(PUBLISHED_GRID))
    assert s["smape_served"] == 0 and s["smape_slots"] == 0 and s["regret_min"] == pytest.approx(1.0)
    # the throughput90 optimum itself starves in two scenarios (the highest throughput across slot values is below
    # the line there, where fewer slots serve 99 %): starving counts them, starving_beyond_label does not
    assert s["starving"] == 2 and s["starving_beyond_label"] == 0
    assert s["smape_throughput_at_rec"] == 0 and s["regret_known"] == 9


def test_evaluate_refuses_another_models_profile_before_any_work(tmp_path):
    """The shipped configurators of one model's profile are not scored against another model's runs;
    a table naming no model, or a source it lacks, is refused with the fix."""
    import pandas as pd

    from twin.configurator.evaluate import evaluate

    row = ml_test_row(model="Qwen/Qwen2.5-7B-Instruct")
    path = tmp_path / "qwen.csv"
    pd.DataFrame([row]).to_csv(path, index=False)
    with pytest.raises(ValueError, match="pass --profile qwen-2.5-7b_h100_vllm085"):
        evaluate(path, profile="llama-3.1-8b_h100_vllm085", run_search=False)
    with pytest.raises(ValueError, match="--source"):
        evaluate(path, source="dt_modelling", run_search=False)
    pd.DataFrame([row]).drop(columns="model").to_csv(path, index=False)
    with pytest.raises(ValueError, match="name no model"):
        evaluate(path, run_search=False)


def test_a_search_without_a_terminal_says_once_that_it_is_under_way(tmp_path, monkeypatch, capsys):
    """Without a terminal (no progress bar) the README's evaluate command printed nothing for its ~20 minutes of
    twin runs; with progress None (what the commands pass then) one line follows the first finished walk, and
    nothing comes before it (a missing executor extra is still the first and only thing said)."""
    from twin.configurator import search as search_mod
    from twin.sweep import runner

    def fake(tasks, jobs, **_):
        for _t in tasks:
            yield []
    monkeypatch.setitem(runner._EXEC, "fake", fake)
    tasks = [{"scenario": {"rates": [0.1 * i]}} for i in range(3)]
    for progress, said in ((None, True), (False, False)):
        search_mod._run_tasks(tasks, tmp_path, "fake", 2, progress)
        err = capsys.readouterr().err
        assert ("search: the twin's walk over the grid, 1 of 3 scenarios done" in err) == said, err
        assert err.count("\n") == int(said)


def test_search_a_workload_file(tmp_path, capsys):
    """``configure search --workload FILE``: the twin walks nested subsets of the file's adapters (the sweep's
    workload scenario, the same runs as a grid with that file); the options the file gives are refused beside
    it, and the file's checks speak of the options."""
    from tests.sweep.test_workload_scenario import _trace
    from twin.cli import main

    f = _trace(tmp_path / "t.parquet", n_adapters=40, rps=12.0)
    base = ["configure", "search", "--workload", str(f), "--served", "10,20,40,64", "--slots", "8,16", "--window",
            "600", "--cache", str(tmp_path / "c")]
    assert main(base + ["--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["workload"] == str(f.resolve()) and res["arrival"] == "file"
    assert res["served_adapters"] in (10, 20, 40) and res["adapter_slots"] in (8, 16)
    assert res["runs"] <= 2 + 3  # (64 > the file's 40 adapters: left out of the walk)
    assert res["lengths"][0] == pytest.approx(224.5, abs=15)
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nprofile = "llama-3.1-8b_h100_vllm085"\nwindow_s = 600\n[scenarios]\nworkload = '
                    '["t.parquet"]\n[configs]\nserved = [10, 20, 40]\nslots = [8, 16]\n')
    assert main(["sweep", str(grid), "--out", str(tmp_path / "sw"), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["configure", "dataset", str(tmp_path / "sw"), "--json"]) == 0
    (lab,) = json.loads(capsys.readouterr().out)["labels"]
    assert (lab["served_adapters"], lab["adapter_slots"]) == (res["served_adapters"], res["adapter_slots"])
    assert lab["throughput_tok_s"] == pytest.approx(res["throughput_tok_s"], rel=1e-12)
    for extra, msg in ((["--rates", "0.1", "--ranks", "8"],
                        "--workload with --rates, --ranks: the workload file gives"),
                       (["--arrival", "gamma:2"], "leave out --arrival")):
        assert main(base + extra) == 2
        assert msg in capsys.readouterr().err
    assert main(base[:2] + ["--workload", str(tmp_path / "no.parquet")]) == 2
    assert "--workload " + str(tmp_path / "no.parquet") + ": no such file" in capsys.readouterr().err
    assert main(base[:4] + ["--served", "64", "--slots", "8", "--cache", str(tmp_path / "c")]) == 2
    assert "--served [64] / --slots [8]: the workload file" in capsys.readouterr().err
    assert main(["configure", "search", "--cache", str(tmp_path / "c")]) == 2
    assert "--rates and --ranks are required" in capsys.readouterr().err


def test_search_predictions_and_crossings_use_the_real_tables_scenario_names(monkeypatch):
    """The fit split's folders are not named by the twin's keys (``rank_16_rates_0.1_0.05_0.025``, the twin's
    ``rate_0.1-0.05-0.025_size_8-16``): the search's optimum is scored under the real name, and the crossings find
    the walk's runs through the twin's key (evaluating ``--source dt_modelling`` once failed with 'regret')."""
    import pandas as pd

    import twin.configurator.evaluate as ev

    key = "rate_0.1-0.05-0.025_size_8-16"
    runs = pd.DataFrame({"scenario": [key, key], "served_adapters": [8, 16], "adapter_slots": [8, 8],
                         "status": ["ok", "ok"], "total_tok_s": [95.0, 150.0], "offered_tok_s": [100.0, 200.0],
                         "early_stop": [False, False]})
    labels = pd.DataFrame({"scenario": [key], "served_adapters": [8], "adapter_slots": [8], "throughput_tok_s": [95.0]})
    monkeypatch.setattr(ev, "search", lambda pairs, *a, **k: (labels, runs))
    truth = pd.DataFrame({"scenario": ["rank_16_rates_0.1_0.05_0.025"], "rates": ["0.1-0.05-0.025"],
                          "ranks": ["8-16"]})
    preds, got_runs = ev.search_predictions(truth, "p", None, "local", 1, False)
    assert preds["scenario"].tolist() == ["rank_16_rates_0.1_0.05_0.025"]
    assert got_runs["scenario"].tolist() == [key, key]  # (the check looks its runs up by the twin's key)

    real = pd.DataFrame({"source": "dt_modelling", "scenario": "rank_16_rates_0.1_0.05_0.025", "rates": "0.1-0.05-0.025",
                         "ranks": "8-16", "served_adapters": [8, 16], "adapter_slots": 8, "status": "ok",
                         "total_tok_s": [97.0, 160.0], "offered_tok_s_est": [100.0, 200.0]})
    monkeypatch.setattr(ev, "from_real", lambda df: df.assign(offered_tok_s=df["offered_tok_s_est"]))
    cross = ev.crossings(real, got_runs, "dt_modelling")
    assert cross["side"].tolist() == ["last_above", "first_below"]
    assert cross["twin_ratio"].tolist() == pytest.approx([0.95, 0.75])

    empty = ev.score_predictor("nobody", preds.iloc[:0], truth.assign(served_adapters=8, adapter_slots=8,
                                                                     throughput_tok_s=95.0, ratio_at_label=0.95),
                               {}, [8, 16], [8])[0]
    assert empty["scenarios"] == 0 and empty["starving"] == 0


@pytest.mark.data
def test_crossings_say_when_failed_runs_lie_between(real_data):
    """Failed real runs are left out before the walk, so two of the 22 crossings span a gap in the grid (160 -> 256
    across a cancelled 192; 16 -> 128 across three failed runs). The table says so (adjacent False), where it read as
    two neighbouring configurations."""
    from twin.configurator.evaluate import crossings
    from twin.sweep.scenario import load_real

    c = crossings(load_real(real_data / "validation/vllm085_h100_llama31_8b.csv"), None)
    last = c[c["side"] == "last_above"].set_index(["scenario", "adapter_slots"])
    gaps = sorted(k for k, ok in last["adjacent"].items() if not ok)
    assert gaps == [("rate_0.4-0.05-0.0125_size_8-16-16", 16), ("rate_3.2-1.6-0.1_size_8-8-32", 16)]
    assert len(last) == 22
