"""The smoke grid end to end: local and Dask executors, identical results, shards, resume."""

from __future__ import annotations

import argparse
import json

import pandas as pd
import pytest

from twin.sweep.grid import load_grid
from twin.sweep.runner import read_results, run_sweep

KEY = ["task_hash", "adapter_slots", "served_adapters"]
RESULT_COLS = ["status", "offered_tok_s", "total_tok_s", "throughput_ratio", "early_stop", "starving", "requests",
               "ttft_ms_mean", "itl_ms_mean", "slo_attainment", "preemptions", "adapter_loads", "run_seed"]


def _norm(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(KEY).reset_index(drop=True)[KEY + RESULT_COLS]


@pytest.fixture(scope="module")
def local_smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke_local")
    rep = run_sweep(load_grid("smoke"), out, "local", jobs=1, progress=False)
    return out, rep


def test_smoke_local(local_smoke):
    out, rep = local_smoke
    df = read_results(out)
    assert rep.tasks_run == 2 and rep.runs == len(df)
    assert set(df["status"]) == {"ok"}
    assert df["profile_hash"].nunique() == 1 and df["twin_version"].notna().all()
    # the walk stops at the first starving run of each slot value
    for (_, g), sub in df.groupby(["task_hash", "adapter_slots"]):
        sub = sub.sort_values("served_adapters")
        starving = sub["starving"].astype(bool).tolist()
        assert True not in starving[:-1]
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["grid"]["name"] == "smoke"


def test_resume_recomputes_nothing(local_smoke, tmp_path):
    out, _ = local_smoke
    before = read_results(out)
    rep = run_sweep(load_grid("smoke"), out, "local", jobs=1, progress=False)
    assert rep.tasks_run == 0 and rep.tasks_done_before == 2
    # an interrupted sweep: one shard missing -> only that task runs again
    shards = sorted((out / "shards").glob("*.parquet"))
    shards[0].unlink()
    rep = run_sweep(load_grid("smoke"), out, "local", jobs=1, progress=False)
    assert rep.tasks_run == 1
    pd.testing.assert_frame_equal(_norm(read_results(out)), _norm(before))


def test_resume_refuses_another_grid(local_smoke, tmp_path):
    out, _ = local_smoke
    g = load_grid("smoke")
    g.window_s = 30.0
    with pytest.raises(SystemExit, match="another grid"):
        run_sweep(g, out, "local", progress=False)


def test_local_pool_identical(local_smoke, tmp_path):
    out, _ = local_smoke
    run_sweep(load_grid("smoke"), tmp_path, "local", jobs=2, progress=False)
    pd.testing.assert_frame_equal(_norm(read_results(tmp_path)), _norm(read_results(out)))


def test_dask_identical(local_smoke, tmp_path):
    pytest.importorskip("dask.distributed")
    out, _ = local_smoke
    rep = run_sweep(load_grid("smoke"), tmp_path, "dask", jobs=2, progress=False)
    assert rep.tasks_run == 2
    pd.testing.assert_frame_equal(_norm(read_results(tmp_path)), _norm(read_results(out)))


def test_ray_identical(local_smoke, tmp_path):
    pytest.importorskip("ray")
    out, _ = local_smoke
    run_sweep(load_grid("smoke"), tmp_path, "ray", jobs=2, progress=False)
    pd.testing.assert_frame_equal(_norm(read_results(tmp_path)), _norm(read_results(out)))


def test_cli(tmp_path, capsys):
    from twin.sweep.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["sweep", "--list"])
    assert ns.func(ns) == 0
    assert "adapter-twin-llama" in capsys.readouterr().out
    ns = p.parse_args(["sweep", "--list", "--json"])
    assert ns.func(ns) == 0
    listed = {g["name"]: g for g in json.loads(capsys.readouterr().out)}
    assert listed["adapter-twin-llama"]["tasks"] == 840 and listed["smoke"]["runs_max"] > 0
    ns = p.parse_args(["sweep", "adapter-twin-llama", "--dry-run", "--json"])
    ns.func(ns)
    d = json.loads(capsys.readouterr().out)
    assert d["tasks"] == 840 and d["runs_max"] == 46200
    ns = p.parse_args(["sweep", "smoke", "--out", str(tmp_path), "--limit", "1", "--json", "--no-progress"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tasks_run"] == 1
    ns = p.parse_args(["sweep", "smoke", "--out", str(tmp_path), "--summary", "--json"])
    ns.func(ns)
    assert json.loads(capsys.readouterr().out)["tasks"] == 1


@pytest.mark.parametrize("flags, message", [
    (["--jobs", "0"], r"--jobs 0: must be >= 1"),
    (["--shard", "3/2"], r"--shard 3/2: give i/k with 0 <= i < k"),
    (["--shard", "1-4"], r"--shard 1-4: give i/k"),
    (["--limit", "0"], r"--limit 0: must be >= 1"),
    (["--every", "0"], r"--every 0: must be >= 1"),
])
def test_a_selection_that_makes_no_sense_is_refused_before_any_work(tmp_path, flags, message):
    """``--jobs 0`` or ``--shard 3/2`` used to run with no worker limit or select nothing in silence."""
    from twin.sweep.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["sweep", "smoke", "--out", str(tmp_path / "sw"), "--no-progress"] + flags)
    with pytest.raises(ValueError, match=message):
        ns.func(ns)
    assert not (tmp_path / "sw").exists()
    with pytest.raises(ValueError, match=message):
        kw = {"jobs": 0} if "--jobs" in flags else {"shard": flags[1]} if "--shard" in flags else \
            {"limit": 0} if "--limit" in flags else {"every": 0}
        run_sweep(load_grid("smoke"), tmp_path / "sw", "local", progress=False, **kw)


def test_an_impossible_engine_override_is_refused_before_any_run(tmp_path):
    """``[configs.engine]`` values vLLM would refuse at every run (here more running requests than
    the step's token budget) are an error up front, not a sweep of error rows."""
    g = load_grid("smoke")
    g.engine = {"max_num_seqs": 4096}
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(2048\) must be >= max_num_seqs \(4096\)"):
        run_sweep(g, tmp_path / "sw", "local", progress=False)
    assert not (tmp_path / "sw").exists()


def test_runs_that_raise_are_counted_and_named_in_the_report(tmp_path, monkeypatch, capsys):
    """A run that raises is kept as a row with status 'error'; the report counts them and the CLI
    names the first, so a sweep of failed runs does not read as a success."""
    import twin.sweep.walk as walk
    from twin.sweep.cli import register_cli

    def boom(*a, **k):
        raise RuntimeError("the profile exploded")

    monkeypatch.setattr(walk, "run_config", boom)
    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["sweep", "smoke", "--out", str(tmp_path / "sw"), "--limit", "1", "--no-progress"])
    assert ns.func(ns) == 0
    err = capsys.readouterr().err
    assert "runs ended in an error (first: RuntimeError: the profile exploded)" in err
    rep = json.loads((tmp_path / "sw" / "sweep.json").read_text())["history"][-1]
    assert rep["runs_failed"] == rep["runs"] > 0 and rep["first_error"] == "RuntimeError: the profile exploded"


def test_exclusion_keys_take_keys_real_run_tables_and_label_tables_together(tmp_path):
    """``--exclude``: the real-run table holds out its ml_test scenarios only; any other table with a
    ``scenario`` column (labels of ``configure dataset``) all of its scenarios; keys as given."""
    from twin.sweep.runner import exclusion_keys, select_tasks

    real = tmp_path / "real.csv"
    pd.DataFrame({"source": ["ml_test", "dt_modelling", "ml_test"], "scenario": ["t1", "d1", "t1"]}).to_csv(real)
    labels = tmp_path / "labels.csv"
    pd.DataFrame({"scenario": ["l1", "l2"], "served_adapters": [16, 32]}).to_csv(labels, index=False)
    assert exclusion_keys(f"{real},{labels},k1") == {"t1", "l1", "l2", "k1"}
    assert exclusion_keys(None) == set() and exclusion_keys("") == set()
    tasks = [{"scenario": {"key": k}} for k in ("t1", "d1", "l1", "l2", "k1", "x")]
    assert [t["scenario"]["key"] for t in select_tasks(tasks, exclude=exclusion_keys(f"{labels},{real}"))] == \
        ["d1", "k1", "x"]


def test_an_interrupted_sweep_says_how_to_resume(local_smoke, tmp_path, monkeypatch, capsys):
    """Ctrl-C during a sweep: no traceback, exit 130, the kept shards and the command that resumes."""
    import shutil

    import twin.sweep.runner as runner
    from twin.cli import main

    src, _ = local_smoke
    out = tmp_path / "cut"
    shutil.copytree(src, out)
    kept = sorted(p.name for p in (out / "shards").glob("*.parquet"))
    (out / "shards" / kept[0]).unlink()  # one task left to run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_sweep", interrupted)
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"interrupted; {len(kept) - 1} finished task shards are kept under {out / 'shards'}" in err
    assert "run the same command to resume" in err
