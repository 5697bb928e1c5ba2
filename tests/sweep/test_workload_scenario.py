"""Sweeping a workload file: ``[scenarios] workload = ["FILE"]`` replays a user's trace at every configuration,
the served axis walking nested subsets of its adapters."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traces.workload import Workload
from twin.cli import main
from twin.sweep.grid import grid_from_dict, load_grid
from twin.sweep.walk import scenario_columns
from twin.sweep.workload_scenario import served_workload


def _trace(path, n_adapters: int = 30, duration: float = 600.0, rps: float = 6.0, seed: int = 0, base: int = 0):
    """A small trace: Poisson arrivals, adapters 100, 103, 106, ... (not 0..n-1), ranks 8/16, ``base``
    base-model requests."""
    rng = np.random.default_rng(seed)
    n = int(rps * duration)
    t = np.sort(rng.uniform(0, duration, n))
    ids = 100 + 3 * rng.integers(0, n_adapters, n)
    ids[:base] = -1
    ranks = np.where(ids < 0, 0, np.where(ids % 2 == 0, 8, 16))
    p = rng.integers(50, 400, n)
    o = rng.integers(20, 200, n)
    Workload.from_arrays(t, p, o, ids, ranks).save(path)
    return path


def _grid(tmp_path, body: str, name: str = "g.toml"):
    f = tmp_path / name
    f.write_text('name = "wl"\nprofile = "llama-3.1-8b_h100_vllm085"\n' + body)
    return f


def test_a_workload_grid_reads_its_file_relative_to_the_grid_and_walks_its_adapters(tmp_path):
    sub = tmp_path / "traces"
    sub.mkdir()
    _trace(sub / "t.parquet")
    g = load_grid(_grid(tmp_path, 'window_s = 600\n[scenarios]\nworkload = ["traces/t.parquet"]\n'
                                  '[configs]\nserved = [8, 16, 30, 64]\nslots = [8, 16]\n'))
    assert g.workloads == [str((sub / "t.parquet").resolve())]
    (sc,) = g.scenarios()
    assert sc["key"].startswith("workload_t_") and len(sc["key"]) == len("workload_t_") + 12
    assert sc["ranks"] == [8, 16] and sc["adapters"] == 30 and sc["arrival"] == "file"
    (task,) = g.tasks()
    assert task["served"] == [8, 16, 30]  # (64 > the file's 30 adapters)
    assert g.n_runs_max() == 3 + 2
    cols = scenario_columns(sc)
    assert cols["rate_mean"] == pytest.approx(6.0 / 30, rel=0.1) and cols["rank_max"] == 16
    assert cols["workload_sha256"] == sc["workload_sha256"] and cols["rates"] == ""
    assert 0.7 < cols["arrival_cv"] < 1.3  # Poisson per adapter


def test_served_subsets_are_nested_renumbered_and_keep_ranks_and_base_requests(tmp_path):
    f = _trace(tmp_path / "t.parquet", base=40)
    g = grid_from_dict({"window_s": 600, "scenarios": {"workload": [str(f)]}, "configs": {"served": [5, 10, 30],
                                                                                         "slots": [5]}})
    (sc,) = g.scenarios()
    full = Workload.load(f).df
    rank_of = dict(zip(full["adapter_id"], full["adapter_rank"]))
    sets = []
    for n in (5, 10, 30):
        df = served_workload(sc, n, 0, 600.0).df
        assert sorted(set(df["adapter_id"]) - {-1}) == list(range(n))
        assert (df["adapter_id"] == -1).sum() == 40  # every base-model request
        sets.append(set(zip(df["arrival_s"], df["prompt_tokens"], df["output_tokens"], df["adapter_rank"])))
    assert sets[0] < sets[1] < sets[2]
    assert len(sets[2]) == len(full)
    # each kept adapter keeps its rank: a renumbered adapter's requests all have one rank, an original one
    df = served_workload(sc, 10, 0, 600.0).df
    assert df[df["adapter_id"] >= 0].groupby("adapter_id")["adapter_rank"].nunique().max() == 1
    assert set(df.loc[df["adapter_id"] >= 0, "adapter_rank"]) <= set(rank_of.values())
    # another seed draws another order
    other = served_workload(sc, 5, 1, 600.0).df
    assert set(zip(other["arrival_s"], other["prompt_tokens"])) != {(a, p) for a, p, _, _ in sets[0]}


def test_a_file_changed_after_the_grid_was_read_is_refused(tmp_path):
    f = _trace(tmp_path / "t.parquet")
    g = grid_from_dict({"window_s": 600, "scenarios": {"workload": [str(f)]}, "configs": {"served": [8],
                                                                                         "slots": [8]}})
    (sc,) = g.scenarios()
    _trace(f, seed=1)
    with pytest.raises(ValueError, match="changed since the grid was read"):
        served_workload(sc, 8, 0, 600.0)


@pytest.mark.parametrize("scen, configs, message", [
    ({"workload": ["t.parquet"], "rates": [[0.1]]}, {},
     "grid [scenarios] workload and rates: a workload file gives its requests' rates, ranks, lengths and arrival "
     "times itself; leave out rates"),
    ({"workload": ["t.parquet"], "arrival": ["gamma:2"]}, {}, "leave out arrival"),
    ({"workload": ["missing.parquet"]}, {}, "grid [scenarios] workload 'missing.parquet': no such file"),
    ({"workload": ["t.parquet"]}, {"served": [64, 128], "slots": [8]},
     "grid [configs] served [64, 128] / slots [8]: the workload file {f} has 30 adapters, fewer than every served "
     "value"),
    ({"workload": ["late.parquet"]}, {}, "none of its 3,600 requests arrives before window_s 600 s (the first at"),
    ({"workload": ["base.parquet"]}, {}, "every request in the window is for the base model (adapter_id -1)"),
    ({"workload": ["bad.csv"]}, {}, "grid [scenarios] workload: {d}/bad.csv: missing column(s) output_tokens"),
    ({"workload": []}, {}, "grid [scenarios] workload: an empty list"),
])
def test_bad_workload_grids_are_refused_with_the_fix(tmp_path, monkeypatch, scen, configs, message):
    monkeypatch.chdir(tmp_path)
    f = _trace(tmp_path / "t.parquet")
    w = Workload.load(f)
    Workload(w.df.assign(arrival_s=w.df["arrival_s"] + 1000.0), {}).save(tmp_path / "late.parquet")
    Workload(w.df.assign(adapter_id=-1, adapter_rank=0), {}).save(tmp_path / "base.parquet")
    (tmp_path / "bad.csv").write_text("arrival_s,prompt_tokens\n1,x\n")
    d = {"window_s": 600, "scenarios": scen, "configs": configs or {"served": [8], "slots": [8]}}
    with pytest.raises(ValueError) as e:
        load_grid(_grid(tmp_path, _toml(d)))
    assert message.format(f=str(f.resolve()), d=str(tmp_path.resolve())) in str(e.value), str(e.value)


def _toml(d: dict) -> str:
    import json

    lines = [f"window_s = {d['window_s']}", "[scenarios]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in d["scenarios"].items()]
    lines += ["[configs]"] + [f"{k} = {json.dumps(v)}" for k, v in d["configs"].items()]
    return "\n".join(lines) + "\n"


def test_sweep_of_a_workload_file_labels_and_resumes(tmp_path, capsys):
    _trace(tmp_path / "t.parquet", n_adapters=40, rps=12.0)
    grid = _grid(tmp_path, 'window_s = 600\n[scenarios]\nworkload = ["t.parquet"]\npolicy = ["fcfs+client-cap", '
                           '"vllm-partition"]\n[configs]\nserved = [10, 20, 40]\nslots = [8, 16]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--no-progress"]) == 0
    runs = pd.concat([pd.read_parquet(p) for p in sorted((out / "shards").glob("*.parquet"))])
    assert set(runs["arrival"]) == {"file"} and runs["workload_sha256"].nunique() == 1
    assert set(runs["policy"]) == {"fcfs+client-cap", "vllm-partition"}
    ok = runs[(runs["status"] == "ok") & ~runs["early_stop"].astype(bool)]
    by_served = ok[ok["policy"] == "fcfs+client-cap"].groupby("served_adapters")["requests"].first()
    assert by_served.is_monotonic_increasing and by_served.loc[40] == pytest.approx(12.0 * 600, rel=0.05)
    capsys.readouterr()
    assert main(["sweep", str(grid), "--out", str(out), "--no-progress"]) == 0
    assert "0 tasks run (2 already done of 2)" in capsys.readouterr().out
    labels = tmp_path / "labels.csv"
    assert main(["configure", "dataset", str(out), "--out", str(labels)]) == 0
    lab = pd.read_csv(labels)
    assert len(lab) == 2 and lab["scenario"].str.startswith("workload_t_").all()
    assert lab["served_adapters"].isin([10, 20, 40]).all()


def test_a_window_that_outlasts_the_file_is_warned_of(tmp_path):
    """A window well past the file's last request gives every run's backlog time to drain, which the published
    runs' window (their arrivals fill it) does not: the sweep and the search warn, naming the window to give."""
    from twin.sweep.grid import window_note

    f = _trace(tmp_path / "t.parquet", duration=500.0)
    last = Workload.load(f).df["arrival_s"].max()
    g = grid_from_dict({"window_s": 600, "scenarios": {"workload": [str(f)]}, "configs": {"served": [8],
                                                                                         "slots": [8]}})
    note = window_note(g, "grid 'g'", "window_s")
    assert f"window_s 600: the last request of {f.resolve()} arrives at {last:.1f} s" in note
    assert f"give window_s {int(last)} to cut as they do" in note
    g.window_s = float(int(last))
    assert window_note(g, "grid 'g'", "window_s") == ""


def test_only_adapters_with_requests_in_the_window_are_the_scenario_s(tmp_path):
    """An adapter whose requests all arrive after ``window_s`` is not served (it would take a served place and
    offer nothing)."""
    f = _trace(tmp_path / "t.parquet", n_adapters=10, duration=600.0)
    w = Workload.load(f)
    late = pd.DataFrame({"arrival_s": [700.0, 710.0], "prompt_tokens": [10, 10], "output_tokens": [5, 5],
                         "adapter_id": [999, 999], "adapter_rank": [8, 8]})
    Workload(pd.concat([w.df.drop(columns=["request_id"]), late], ignore_index=True).assign(
        request_id=lambda d: range(len(d))), {}).save(f)
    g = grid_from_dict({"window_s": 600, "scenarios": {"workload": [str(f)]}, "configs": {"served": [5, 10, 11],
                                                                                         "slots": [5]}})
    (sc,) = g.scenarios()
    assert sc["adapters"] == 10 and g.tasks()[0]["served"] == [5, 10]
    assert scenario_columns(sc)["rate_min"] > 0
    df = served_workload(sc, 10, 0, 600.0).df
    assert df["arrival_s"].max() < 600 and sorted(set(df["adapter_id"])) == list(range(10))


def test_a_home_relative_workload_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _trace(tmp_path / "t.parquet")
    g = grid_from_dict({"window_s": 600, "scenarios": {"workload": ["~/t.parquet"]}, "configs": {"served": [8],
                                                                                                "slots": [8]}})
    assert g.workloads == [str((tmp_path / "t.parquet").resolve())]
