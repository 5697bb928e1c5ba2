"""``twin configure predict --workload FILE``: a recommendation for a trace of the user's own.

The features are those ``configure search --workload`` and a workload sweep measure (the published 8 over the file's
adapters); a model trained without the length or arrival features refuses a file unlike its training scenarios; the
recommendation serves at most the file's adapters, and ``--check`` runs the file's own scenario (the same runs as
the search's)."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from traces.workload import Workload
from twin.configurator.features import LENGTH_TOLERANCE, POISSON_CV_MAX, workload_columns
from twin.configurator.labels import FEATURES, features_of

EIGHT = {"features": list(FEATURES)}
WITH_ALL = {"features": [*FEATURES, "mean_input_tokens", "mean_output_tokens", "arrival_cv"]}


def _file(path, n_adapters: int = 40, duration: float = 600.0, rates=(0.3, 0.2, 0.1), mean_out: float = 197.0,
          cv: float = 1.0, seed: int = 0):
    """The per-adapter ``rates`` (req/s) round-robin over the adapters, ranks 8/16/32, lengths near the published
    pool's means (input uniform 50-394, output uniform 20 - 2*mean_out-20); gaps exponential (``cv`` 1) or gamma of
    that CV."""
    rng = np.random.default_rng(seed)
    rates = np.asarray(rates, float)[np.arange(n_adapters) % 3]
    ts, ids = [], []
    for a, r in enumerate(rates):
        k = 1.0 / cv ** 2
        gaps = rng.gamma(k, 1.0 / (r * k), int(r * duration * 2) + 20)
        t = np.cumsum(gaps)
        t = t[t < duration]
        ts.append(t)
        ids.append(np.full(t.size, a))
    t, ids = np.concatenate(ts), np.concatenate(ids)
    o = np.argsort(t, kind="stable")
    t, ids = t[o], ids[o]
    n = t.size
    ranks = np.array([8, 16, 32])[ids % 3]
    p = rng.integers(50, 395, n)
    out = rng.integers(20, int(2 * mean_out - 20) + 1, n)
    Workload.from_arrays(t, p, out, ids, ranks).save(path)
    return path


def _feats(**kw) -> dict[str, float]:
    f = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    f.update(mean_input_tokens=222.0, mean_output_tokens=197.0, arrival_cv=1.0)
    f.update(kw)
    return f


def test_workload_columns_takes_the_eight_and_only_the_features_the_model_uses():
    x = workload_columns(EIGHT, _feats(), "--workload f")
    assert x == features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    x = workload_columns(WITH_ALL, _feats(mean_input_tokens=1000.0, arrival_cv=3.0), "--workload f")
    assert x["mean_input_tokens"] == 1000.0 and x["mean_output_tokens"] == 197.0 and x["arrival_cv"] == 3.0


def test_a_model_without_the_length_features_refuses_a_file_with_other_lengths():
    ok = 222.0 * (1 + 0.9 * LENGTH_TOLERANCE)
    assert workload_columns(EIGHT, _feats(mean_input_tokens=ok), "--workload f")
    with pytest.raises(ValueError, match=r"--workload f: its requests' mean lengths are 222 input / 109 output.*"
                                         r"configure search --workload FILE"):
        workload_columns(EIGHT, _feats(mean_output_tokens=109.0), "--workload f")


def test_a_model_without_the_arrival_feature_refuses_a_bursty_file():
    assert workload_columns(EIGHT, _feats(arrival_cv=POISSON_CV_MAX), "--workload f")
    assert workload_columns(EIGHT, _feats(arrival_cv=math.nan), "--workload f")  # (too few requests: as Poisson)
    with pytest.raises(ValueError, match=r"bursty \(median inter-arrival CV 2.00.*Poisson arrivals only"):
        workload_columns(EIGHT, _feats(arrival_cv=2.0), "--workload f")
    with pytest.raises(ValueError, match="no adapter sends the 10 requests"):
        workload_columns(WITH_ALL, _feats(arrival_cv=math.nan), "--workload f")


def _cli(args: list[str]):
    from twin.configurator.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["configure", "predict", *args])
    return ns.func(ns)


def test_predict_a_workload_file_as_the_triple_it_was_drawn_from(tmp_path, capsys):
    """A file drawn round-robin from a rate triple reads (within its Poisson noise) as that triple, so the shipped
    forest recommends what it recommends for the triple; the file's adapters are the ones to host."""
    rates = [0.4, 0.05, 0.00625]
    f = _file(tmp_path / "w.parquet", n_adapters=300, duration=3600.0, rates=rates)
    assert _cli(["--rates", ",".join(map(str, rates)), "--ranks", "8,16,32", "--json"]) == 0
    triple = json.loads(capsys.readouterr().out)
    assert _cli(["--workload", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["served_adapters"], d["adapter_slots"]) == (triple["served_adapters"], triple["adapter_slots"])
    assert d["workload"]["adapters"] == 300 and d["arrival"] == "file"
    assert d["gpus_needed"] == math.ceil(300 / d["served_adapters"])
    assert d["lengths"][0] == pytest.approx(222, rel=0.05) and d["lengths"][1] == pytest.approx(197, rel=0.05)
    # the offered load is the file's own, at the recommended served adapters
    from twin.configurator.cli import workload_offered_tok_s
    from twin.sweep.workload_scenario import load_workload_scenario

    wl = {**load_workload_scenario(f, 3600.0), "window_s": 3600.0}
    assert d["offered_tok_s"] == pytest.approx(workload_offered_tok_s(wl, d["served_adapters"]))
    assert workload_offered_tok_s(wl, 300) == pytest.approx(
        sum(Workload.load(f).df[c].sum() for c in ("prompt_tokens", "output_tokens")) / 3600.0)
    assert d["throughput_tok_s"] <= d["offered_tok_s"]


def test_predict_workload_refuses_what_the_file_gives_and_bad_files(tmp_path):
    f = _file(tmp_path / "w.parquet")
    for extra, msg in ((["--rates", "0.4,0.05,0.00625"], "--workload with --rates"),
                       (["--lengths", "222,197"], "--workload with --lengths"),
                       (["--arrival", "gamma:2"], "--workload with --arrival"),
                       (["--window", "0"], "--window"),
                       (["--feature", "mean_input_tokens=222"], "--workload with --feature mean_input_tokens")):
        with pytest.raises(ValueError, match=msg):
            _cli(["--workload", str(f), *extra])
    with pytest.raises(ValueError, match="--window sets the seconds of a --workload file"):
        _cli(["--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--window", "600"])
    with pytest.raises(ValueError, match="no such file"):
        _cli(["--workload", str(tmp_path / "nope.parquet")])
    with pytest.raises(ValueError, match=r"^--workload .*none of its .* requests arrives before window_s.*--window"):
        _cli(["--workload", str(f), "--window", "1e-9"])
    short = _file(tmp_path / "s.parquet", mean_out=109.0)
    with pytest.raises(ValueError, match="mean lengths are"):
        _cli(["--workload", str(short)])
    bursty = _file(tmp_path / "b.parquet", cv=3.0)
    with pytest.raises(ValueError, match="bursty"):
        _cli(["--workload", str(bursty)])


def test_predict_workload_check_serves_at_most_the_files_adapters_and_runs_the_searchs_runs(tmp_path, capsys):
    """40 adapters at a low load: the model's served count (above 40) becomes 40, and the check's run at the
    recommendation is the run ``configure search --workload`` makes at that configuration (same scenario, seed and
    engine; 10-minute window)."""
    from twin.configurator.search import search

    f = _file(tmp_path / "w.parquet", rates=(0.1, 0.05, 0.025))
    assert _cli(["--workload", str(f), "--window", "600", "--check", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["served_adapters_model"] > 40 and d["model_recommendation"]["served_adapters"] == 40
    assert d["served_adapters"] <= 40 and d["adapter_slots"] <= d["served_adapters"]
    first = d["check"]["steps"][0]
    assert (first["served_adapters"], first["adapter_slots"]) == (40, d["model_recommendation"]["adapter_slots"])
    assert first["status"] == "ok" and first["simulated"]
    _, runs = search([], "llama-3.1-8b_h100_vllm085_adaptercheck", tmp_path / "cache", window_s=600.0,
                     served=[40], slots=[first["adapter_slots"]], workload=str(f), serving_us=18.0,
                     rank_tile_cost=0.7091)
    r = runs[(runs["served_adapters"] == 40) & (runs["adapter_slots"] == first["adapter_slots"])].iloc[0]
    assert r["scenario"] == d["check"]["scenario"]
    assert float(r["throughput_ratio"]) == first["ratio"]


def test_a_window_longer_than_the_file_warns_that_its_rates_are_diluted(tmp_path, capsys):
    """A 300-s file read over the default 3600-s window: the model reads its requests over 3600 s, 12x below the
    rates at which they arrive; predict says so and names ``--window`` (and the suggested searches carry it). Over
    a window the file fills, nothing is said."""
    from twin.cli import main

    f = _file(tmp_path / "short.parquet", n_adapters=12, duration=300.0)
    assert main(["configure", "predict", "--workload", str(f)]) == 0
    err = capsys.readouterr().err
    last = json.loads(_json_predict(main, f, capsys))["workload"]["last_arrival_s"]
    assert 290 < last < 300
    assert f"--window 3600: the last request of {f} arrives at {last:.1f} s" in err
    assert f"{3600 / last:.3g}x below the rates at which they arrive" in err and f"give --window {math.floor(last)}" in err
    assert main(["configure", "predict", "--workload", str(f), "--window", str(math.floor(last))]) == 0
    assert "below the rates at which they arrive" not in capsys.readouterr().err


def _json_predict(main, f, capsys) -> str:
    assert main(["configure", "predict", "--workload", str(f), "--json"]) == 0
    return capsys.readouterr().out


def test_fewer_adapters_to_host_than_the_file_names_are_refused(tmp_path, capsys):
    """``--adapters 2`` beside a 12-adapter file printed "serve 12 adapters" and then "2 adapters need 1 GPU"."""
    from twin.cli import main

    f = _file(tmp_path / "w.parquet", n_adapters=12, duration=3600.0)
    assert main(["configure", "predict", "--workload", str(f), "--adapters", "2"]) == 2
    err = capsys.readouterr().err
    assert f"--adapters 2 with --workload {f}: the file's requests name 12 adapters" in err
    assert main(["configure", "predict", "--workload", str(f), "--adapters", "24", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus_needed"] >= 1
