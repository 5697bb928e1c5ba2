"""The sweep's ``arrival`` axis: per-adapter Poisson or gamma (bursty) streams, from the grid to the runs, the
labels, a configurator that uses the burstiness as a feature, ``configure predict --arrival`` and ``configure
search --arrival``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from traces import arrivals as A
from twin.cli import main
from twin.sweep.grid import GridSpec, grid_from_dict, scenario_key
from twin.sweep.scenario import make_spec, run_seed
from twin.sweep.walk import scenario_columns


# --------------------------------------------------------------------------- the process by name
@pytest.mark.parametrize("name, kind, cv, canonical", [
    ("poisson", "poisson", 1.0, "poisson"), (" Poisson ", "poisson", 1.0, "poisson"),
    ("gamma:2", "gamma", 2.0, "gamma:2"), ("gamma:2.0", "gamma", 2.0, "gamma:2"),
    ("gamma:0.5", "gamma", 0.5, "gamma:0.5"),
])
def test_parse_arrival_names(name, kind, cv, canonical):
    p = A.parse_arrival(name)
    assert (p.kind, p.cv, p.name) == (kind, cv, canonical)


@pytest.mark.parametrize("name, message", [
    ("bursty", "unknown arrival process 'bursty'; use poisson"),
    ("gamma", "unknown arrival process 'gamma'"),
    ("gamma:", "the coefficient of variation must be a number in [0.001, 100]"),
    ("gamma:x", "the coefficient of variation must be a number"),
    ("gamma:0", "the coefficient of variation must be a number"),
    ("gamma:1e6", "the coefficient of variation must be a number"),
    ("gamma:nan", "the coefficient of variation must be a number"),
    (3, "unknown arrival process 3"),
])
def test_parse_arrival_refuses_with_the_forms(name, message):
    with pytest.raises(A.ArrivalError, match=None) as e:
        A.parse_arrival(name)
    assert message in str(e.value)


# --------------------------------------------------------------------------- the streams
@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_stationary_gamma_streams_have_the_rate_at_every_time_and_the_cv(cv):
    """The equilibrium start: as many arrivals in the window's first sixth as in any other (an ordinary start
    at cv 4 puts half of a slow adapter's first arrivals in its first 0.05 s), the mean rate, the gaps' CV."""
    rng = np.random.default_rng(11)
    rate, window = 0.05, 3600.0
    streams = [A.gamma_renewal(rate, cv, rng, duration_s=window, stationary=True) for _ in range(2000)]
    t = np.concatenate(streams)
    assert len(t) / (2000 * window) == pytest.approx(rate, rel=0.03)
    per_sixth = np.histogram(t, bins=6, range=(0, window))[0] / len(t)
    assert np.abs(per_sixth - 1 / 6).max() < 0.012, per_sixth
    gaps = np.concatenate([np.diff(s) for s in streams if len(s) > 1])
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    ordinary = np.concatenate([A.gamma_renewal(rate, cv, rng, duration_s=window) for _ in range(2000)])
    if cv >= 2:  # (the ordinary start's clump at 0 the stationary start avoids)
        assert (ordinary < 1.0).sum() > 5 * max((t < 1.0).sum(), 1)


def test_stationary_gamma_with_a_count_starts_at_its_first_arrival():
    rng = np.random.default_rng(2)
    t = A.gamma_renewal(2.0, 3.0, rng, n=50, stationary=True)
    assert len(t) == 50 and (np.diff(t) >= 0).all() and t[0] > 0
    assert len(A.gamma_renewal(2.0, 3.0, rng, n=0, stationary=True)) == 0


def test_per_adapter_arrivals():
    rng = np.random.default_rng(5)
    rates = np.array([1.0, 0.25, 0.05])
    t, ids = A.per_adapter_arrivals(rates, 2000.0, A.parse_arrival("gamma:3"), rng)
    assert (np.diff(t) >= 0).all() and t.min() >= 0 and t.max() < 2000.0
    counts = np.bincount(ids, minlength=3)
    assert counts[0] / 2000 == pytest.approx(1.0, rel=0.25) and counts[0] > counts[1] > counts[2]
    g0 = np.diff(t[ids == 0])
    assert g0.std() / g0.mean() == pytest.approx(3.0, rel=0.3)
    tp, idp = A.per_adapter_arrivals(rates, 2000.0, A.parse_arrival("poisson"), np.random.default_rng(5))
    g = np.diff(tp[idp == 0])
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.1)
    with pytest.raises(A.ArrivalError, match="positive req/s"):
        A.per_adapter_arrivals([0.1, 0.0], 10.0, A.parse_arrival("poisson"), rng)


# --------------------------------------------------------------------------- the grid
def test_grid_arrival_axis_is_canonical_keyed_and_checked():
    g = grid_from_dict({"scenarios": {"rates": [[0.4, 0.1]], "ranks": [[8, 16]], "arrival": ["poisson", "gamma:2.0"]},
                        "configs": {"served": [8], "slots": [8]}})
    assert g.arrival == ["poisson", "gamma:2"]
    keys = [s["key"] for s in g.scenarios()]
    assert keys == ["rate_0.4-0.1_size_8-16", "rate_0.4-0.1_size_8-16_arrival_gamma-2"]
    assert scenario_key([0.4, 0.1], [8, 16], None, "vllm", "gamma:2") == \
        "rate_0.4-0.1_size_8-16_arrival_gamma-2_policy_vllm"
    # the published grids' scenarios and task hashes hold: Poisson adds nothing to a key
    plain = grid_from_dict({"scenarios": {"rates": [[0.4, 0.1]], "ranks": [[8, 16]]},
                            "configs": {"served": [8], "slots": [8]}})
    assert [t["task_hash"] for t in plain.tasks()] == [t["task_hash"] for t in g.tasks()][:1]
    for bad, msg in ((["poisson", "gamma:2", "gamma:2.0"], "gamma:2"), (["bursty"], "unknown arrival process 'bursty'"),
                     (["gamma:-1"], "coefficient of variation")):
        with pytest.raises(ValueError, match=None) as e:
            grid_from_dict({"scenarios": {"rates": [[0.4]], "ranks": [[8]], "arrival": bad},
                            "configs": {"served": [8], "slots": [8]}})
        assert "[scenarios] arrival" in str(e.value) and msg in str(e.value), str(e.value)


def test_a_gamma_scenario_draws_its_own_workload_and_rows_carry_the_cv():
    from twin.validation.recreate import build_workload

    g = GridSpec(rates=[[0.2, 0.05]], ranks=[[8, 16]], arrival=["poisson", "gamma:3"], served=[16], slots=[8],
                 window_s=1800.0)
    pois, gam = g.scenarios()
    assert run_seed(pois["key"], 16, 0) != run_seed(gam["key"], 16, 0)
    assert scenario_columns(pois)["arrival_cv"] == 1.0 and scenario_columns(gam)["arrival_cv"] == 3.0
    sp, sg = make_spec(pois, 16, 8, 16, 0, 1800.0), make_spec(gam, 16, 8, 16, 0, 1800.0)
    assert (sp.arrival, sg.arrival) == ("poisson", "gamma:3")
    wp, wg = build_workload(sp)[0].df, build_workload(sg)[0].df
    for df, lo, hi in ((wp, 0.8, 1.2), (wg, 2.2, 3.8)):
        cvs = []
        for _, d in df.groupby("adapter_id"):
            gaps = np.diff(np.sort(d["arrival_s"].to_numpy()))
            if len(gaps) > 30:
                cvs.append(gaps.std() / gaps.mean())
        assert lo < np.median(cvs) < hi, (lo, hi, np.median(cvs))
    # a real run's sent count conditions Poisson streams only
    import dataclasses

    with pytest.raises(ValueError, match="only Poisson streams are re-created conditioned on the count"):
        build_workload(dataclasses.replace(sg, requests_sent=100.0))


def _sweep(tmp_path, arrivals):
    grid = tmp_path / "g.toml"
    grid.write_text(f"""
name = "arrival-test"
profile = "llama-3.1-8b_h100_vllm085"
window_s = 600
[scenarios]
rates = [[0.8, 0.4, 0.1]]
ranks = [[8, 16, 32]]
arrival = {json.dumps(arrivals)}
[configs]
served = [16, 32, 64]
slots = [8, 16]
""")
    return grid


def test_sweep_dataset_train_predict_with_the_arrival_feature(tmp_path, capsys):
    """A sweep over two arrival processes, its labels (one per process, with ``arrival_cv``), a tree trained on
    the published 8 plus ``arrival_cv``, and predictions that need ``--arrival``."""
    out = tmp_path / "sw"
    assert main(["sweep", str(_sweep(tmp_path, ["poisson", "gamma:4"])), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    runs = pd.concat([pd.read_parquet(f) for f in sorted((out / "shards").glob("*.parquet"))])
    assert set(runs["arrival"]) == {"poisson", "gamma:4"}
    assert set(runs.groupby("arrival")["arrival_cv"].first().items()) == {("poisson", 1.0), ("gamma:4", 4.0)}
    labels = tmp_path / "labels.csv"
    assert main(["configure", "dataset", str(out), "--out", str(labels)]) == 0
    lab = pd.read_csv(labels)
    assert sorted(lab["arrival_cv"]) == [1.0, 4.0] and len(lab) == 2
    feats = "rate_max,rate_min,rate_mean,rate_std,rank_max,rank_min,rank_mean,rank_std,arrival_cv"
    model = tmp_path / "m.json"
    assert main(["configure", "train", str(labels), "--kind", "cart", "--no-search", "--features", feats,
                 "--out", str(model)]) == 0
    capsys.readouterr()
    args = ["configure", "predict", "--model", str(model), "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--json"]
    assert main(args + ["--arrival", "gamma:4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["arrival"] == "gamma:4" and res["served_adapters"] >= 16
    assert main(["configure", "predict", "--model", str(model), "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32"]) == 2
    assert "or as --arrival poisson|gamma:CV" in capsys.readouterr().err
    assert main(args + ["--arrival", "gamma:4", "--feature", "arrival_cv=4"]) == 2
    assert "--feature arrival_cv and --arrival both set the arrival process" in capsys.readouterr().err
    # the shipped configurators were trained on Poisson runs only
    assert main(["configure", "predict", "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--arrival", "gamma:2"]) == 2
    assert "trained without the arrival feature, on Poisson arrivals only" in capsys.readouterr().err
    assert main(["configure", "predict", "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--arrival", "poisson",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["arrival"] == "poisson"


def test_search_and_check_run_the_arrival_process(tmp_path, capsys):
    """``configure search --arrival`` walks the scenario of that process; its runs are the sweep's (same task)."""
    cache = tmp_path / "cache"
    base = ["configure", "search", "--rates", "0.8,0.4,0.1", "--ranks", "8,16,32", "--served", "16,32",
            "--slots", "8", "--window", "600", "--cache", str(cache), "--json"]
    assert main(base + ["--arrival", "gamma:4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["arrival"] == "gamma:4"
    runs = pd.concat([pd.read_parquet(f) for f in (cache / "shards").glob("*.parquet")])
    assert set(runs["arrival"]) == {"gamma:4"} and set(runs["scenario"]) == {
        "rate_0.8-0.4-0.1_size_8-16-32_arrival_gamma-4"}
    assert main(base + ["--arrival", "gamma:zero"]) == 2
    assert "--arrival: arrival process 'gamma:zero'" in capsys.readouterr().err
    from twin.configurator.check import check_recommendation

    c = check_recommendation([0.8, 0.4, 0.1], [8, 16, 32], 16, 8, "llama-3.1-8b_h100_vllm085", served_grid=[16, 32],
                             slot_grid=[8], window_s=600.0, arrival="gamma:4")
    assert c["scenario"] == "rate_0.8-0.4-0.1_size_8-16-32_arrival_gamma-4"
    r16 = runs[(runs["served_adapters"] == 16) & (runs["adapter_slots"] == 8)].iloc[0]
    assert c["steps"][0]["ratio"] == pytest.approx(r16["total_tok_s"] / r16["offered_tok_s"], rel=1e-12)
