"""The smoke grid end to end: local and Dask executors, identical results, shards, resume."""

from __future__ import annotations

import argparse
import json
import shutil

import pandas as pd
import pytest

from twin.sweep.grid import NAMED_GRIDS, load_grid
from twin.sweep import runner
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
    out = tmp_path / "smoke"  # a copy: the module's sweep stays as it was made for the other tests
    shutil.copytree(local_smoke[0], out)
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
    with pytest.raises(ValueError, match=r"holds a sweep of another grid or profile \(grid smoke, digest "):
        run_sweep(g, out, "local", progress=False)


def test_resume_into_another_grids_directory_is_an_exit_2_error(local_smoke, tmp_path, capsys):
    """It was a SystemExit: exit status 1 and no ``twin sweep: error:``."""
    from twin.cli import main

    out, _ = local_smoke
    p = tmp_path / "g.toml"
    p.write_text('name = "smoke"\nwindow_s = 30\n[scenarios]\nrates = [[0.4, 0.2, 0.1]]\nranks = [[8, 16, 32]]\n'
                 '[configs]\nserved = [8]\nslots = [8]\n')
    assert main(["sweep", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"twin sweep: error: {out} holds a sweep of another grid or profile (grid smoke, digest " in err and \
        "use another --out, or --no-resume to start over" in err and "Traceback" not in err


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
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(NAMED_GRIDS)
    assert len({ln.index(" tasks,") for ln in lines}) == 1  # one column, whatever the names' lengths
    assert all(name in p._subparsers._group_actions[0].choices["sweep"].description for name in NAMED_GRIDS)
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
    names the first and the exit status is 1 (it was 0), so a sweep of failed runs does not read as a success."""
    import twin.sweep.walk as walk
    from twin.sweep.cli import register_cli

    def boom(*a, **k):
        raise RuntimeError("the profile exploded")

    monkeypatch.setattr(walk, "run_config", boom)
    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["sweep", "smoke", "--out", str(tmp_path / "sw"), "--limit", "1", "--no-progress"])
    assert ns.func(ns) == 1
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
    assert exclusion_keys(None) == set()
    with pytest.raises(ValueError, match="--exclude '': empty"):  # (an unset shell variable: it excluded nothing)
        exclusion_keys("")
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


def _start_failure_sweep(out):
    """A sweep directory whose every run failed the start-up check (5000 slots of rank 32 leave no KV
    cache), as an earlier twin wrote it: the rows of the walk of the smoke grid's first scenario."""
    from twin.sweep.runner import write_shard
    from twin.sweep.walk import run_task

    g = load_grid("smoke")
    g.slots, g.served = [5000], [5000]
    t = g.tasks()[0]
    rows = run_task(t)
    assert [r["status"] for r in rows] == ["start_failure"]
    write_shard(out, t["task_hash"], rows)
    return g


def test_a_grid_where_no_configuration_starts_is_refused_before_any_run(tmp_path):
    g = load_grid("smoke")
    g.slots, g.served = [5000], [5000]
    with pytest.raises(ValueError, match=r"grid: no configuration passes vLLM's start-up check with profile "
                                         r"llama-3.1-8b_h100_vllm085_adaptercheck, so every run would be a start failure \(at "
                                         r"5000 slots of max LoRA rank 32: 5000 adapter slots of max rank 32 leave no memory for the KV cache"
                                         r".* give smaller"):
        run_sweep(g, tmp_path / "sw", "local", progress=False)
    assert not (tmp_path / "sw").exists()


def test_the_summary_of_a_sweep_whose_runs_all_failed_to_start_says_so(tmp_path, capsys):
    """``--summary`` of a sweep of start failures only used to be ``error: starving`` (a KeyError):
    it counts them and names the reasons."""
    from twin.cli import main
    from twin.sweep.runner import summarize_results

    _start_failure_sweep(tmp_path)
    s = summarize_results(read_results(tmp_path))
    assert (s["runs"], s["simulated"], s["start_failures"], s["starving"], s["early_stopped"]) == (1, 0, 1, 0, 0)
    assert s["note"] == "no run was simulated: all 1 runs failed vLLM's start-up check"
    assert s["start_failure_reasons"][0].startswith("1 run: 5000 adapter slots of max rank 32 leave no memory for "
                                                    "the KV cache")
    assert main(["sweep", "smoke", "--out", str(tmp_path), "--summary"]) == 0
    out = capsys.readouterr().out
    assert "no run was simulated: all 1 runs failed vLLM's start-up check" in out and "5000 adapter slots" in out
    assert main(["sweep", "smoke", "--out", str(tmp_path), "--summary", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["start_failures"] == 1


def test_the_summary_of_a_sweep_of_errors_only_names_the_first(tmp_path, monkeypatch):
    import twin.sweep.walk as walk
    from twin.sweep.runner import summarize_results

    def boom(*a, **k):
        raise RuntimeError("the profile exploded")

    monkeypatch.setattr(walk, "run_config", boom)
    run_sweep(load_grid("smoke"), tmp_path, "local", limit=1, progress=False)
    s = summarize_results(read_results(tmp_path))
    assert s["errors"] == s["runs"] > 0 and s["simulated"] == 0 and s["early_stopped"] == 0
    assert s["note"] == f"no run was simulated: all {s['runs']} runs ended in an error"
    assert s["first_error"] == "RuntimeError: the profile exploded"


def test_the_summary_of_a_table_that_is_no_sweep_is_a_clear_error(tmp_path):
    from twin.sweep.runner import summarize_results

    with pytest.raises(ValueError, match=r"not a sweep's run table \(missing columns status, task_hash\)"):
        summarize_results(pd.DataFrame({"a": [1]}))


def test_a_sweep_whose_runs_all_failed_to_start_says_so_in_its_report(tmp_path, monkeypatch, capsys):
    """Runs that all end as start failures: the report counts them and names the first reason,
    rather than only '5 runs (0 simulated ...)'."""
    import twin.sweep.walk as walk
    from twin.cli import main

    def no_start(sc, n, g, mr, **k):
        return {"served_adapters": n, "adapter_slots": g, "max_lora_rank": mr, "seed": k["seed"], "early_stop": False,
                "status": "start_failure", "startup_reason": "vLLM would refuse to start", "wall_s": 0.0}

    monkeypatch.setattr(walk, "run_config", no_start)
    assert main(["sweep", "smoke", "--out", str(tmp_path / "sw"), "--limit", "1", "--no-progress"]) == 0
    cap = capsys.readouterr()
    assert "runs (0 simulated, 5 failed to start, 0 stopped early)" in cap.out
    assert ("no run was simulated: 5 of the 5 runs failed vLLM's start-up check (first: vLLM would refuse to start)"
            in cap.err)
    rep = json.loads((tmp_path / "sw" / "sweep.json").read_text())["history"][-1]
    assert rep["runs_start_failed"] == 5 and rep["first_start_failure"] == "vLLM would refuse to start"


@pytest.mark.parametrize("name, text, message", [
    ("ab.csv", "a,b\n1,2\n", r"--exclude {f}: no `scenario` column \(columns: a, b\); the table must hold the "
                             r"scenario keys to leave out in a `scenario` column"),
    ("empty.csv", "", r"--exclude {f}: the file is empty; give scenario keys, a real-run CSV"),
    ("header.csv", "scenario\n", r"--exclude {f}: the table holds no scenario rows, so it excludes nothing"),
    ("real.csv", "source,scenario\ndt_modelling,x\n", r"--exclude {f}: the table holds no ml_test rows"),
    ("dir", None, r"--exclude {f}: a directory, not a CSV table"),
    ("missing.csv", "-", r"--exclude {f}: file not found"),
    ("keys.txt", "x\n", r"--exclude {f}: not a .csv file"),
])
def test_an_exclusion_file_that_gives_no_scenario_is_refused_naming_it(tmp_path, capsys, name, text, message):
    """``--exclude`` with a table lacking the ``scenario`` column used to print ``error: scenario``; an
    empty file, a directory or a missing CSV excluded nothing in silence."""
    import re

    from twin.cli import main
    from twin.sweep.runner import exclusion_keys

    f = tmp_path / name
    if text is None:
        f.mkdir()
    elif text != "-":
        f.write_text(text)
    msg = message.format(f=re.escape(str(f)))
    with pytest.raises(ValueError, match=msg):
        exclusion_keys(f"rate_3.2-1.6-0.8_size_8-16-32,{f}")
    assert main(["sweep", "smoke", "--exclude", str(f), "--out", str(tmp_path / "sw"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(msg, err) and "Traceback" not in err and err.startswith("twin sweep: error: ")
    assert not (tmp_path / "sw").exists()


def test_exclusion_keys_of_a_table_that_match_no_scenario_are_warned_about(tmp_path, capsys):
    """A table's keys may legitimately miss the grid (a real-run table, labels of another grid): a warning."""
    from twin.cli import main

    labels = tmp_path / "labels.csv"
    pd.DataFrame({"scenario": ["rate_3.2-1.6-0.8_size_8-16-32", "no-such-key"]}).to_csv(labels, index=False)
    assert main(["sweep", "smoke", "--exclude", str(labels), "--dry-run", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["tasks"] == 1
    assert ("twin sweep: warning: 1 of the 2 --exclude keys match no scenario of grid smoke (e.g. 'no-such-key') "
            "and exclude nothing; its keys look like 'rate_") in cap.err
    assert main(["sweep", "smoke", "--exclude", "rate_3.2-1.6-0.8_size_8-16-32", "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err  # (a named grid's short window is its design: not warned of)
    both = "rate_3.2-1.6-0.8_size_8-16-32,rate_0.8-0.4-0.1_size_8-16-32"
    assert main(["sweep", "smoke", "--exclude", both, "--dry-run"]) == 0
    assert "--exclude leaves none of the 2 tasks of grid smoke: nothing to run" in capsys.readouterr().err


def test_a_shard_that_selects_no_task_is_warned_about(capsys):
    """``--shard 2/3`` of the 2-task smoke grid ran nothing and said "0 tasks run (0 of 0)", exit 0."""
    from twin.cli import main

    assert main(["sweep", "smoke", "--shard", "2/3", "--dry-run", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["tasks"] == 0
    assert ("twin sweep: warning: --shard 2/3 selects none of the 2 tasks of grid smoke (part 2 of 3 takes tasks 2, "
            "5, ... counted from 0): nothing to run; a grid of 2 tasks has 2 non-empty parts") in cap.err
    assert main(["sweep", "smoke", "--shard", "1/3", "--dry-run"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("given, named, dry", [
    ("bogus,zzz", "--exclude bogus,zzz: these keys match no scenario of grid smoke, so they would exclude nothing",
     False),
    ("rate_3.2-1.6-0.8_size_8-16-32, no-such-key", "--exclude no-such-key: the key matches no scenario of grid "
                                                   "smoke, so it would exclude nothing", True),
    ("LABELS,no-such-key", "--exclude no-such-key: the key matches no scenario", False),  # (a table beside a typo)
])
def test_exclusion_keys_given_as_keys_that_match_no_scenario_are_refused(tmp_path, capsys, given, named, dry):
    """`twin sweep GRID --exclude bogus,zzz` only warned and ran: a key typed as such that names no scenario of the
    grid is a typo (or another grid's key), refused before anything runs or --out is made."""
    from twin.cli import main

    labels = tmp_path / "labels.csv"
    pd.DataFrame({"scenario": ["rate_3.2-1.6-0.8_size_8-16-32", "other-grid-key"]}).to_csv(labels, index=False)
    out = tmp_path / "sw"
    argv = ["sweep", "smoke", "--exclude", given.replace("LABELS", str(labels))]
    argv += ["--dry-run"] if dry else ["--out", str(out), "--no-progress"]
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert not cap.out and "Traceback" not in cap.err and not out.exists()
    assert cap.err.startswith(f"twin sweep: error: {named}")
    assert "; its keys look like 'rate_" in cap.err and "warning" not in cap.err


def test_an_address_with_the_local_executor_is_refused(tmp_path, capsys):
    """``--address`` only reaches a Dask / Ray cluster; with the local executor it was ignored."""
    from twin.cli import main

    assert main(["sweep", "smoke", "--address", "tcp://host:8786", "--out", str(tmp_path / "sw"),
                 "--no-progress"]) == 2
    assert ("twin sweep: error: --address tcp://host:8786: only the dask and ray executors connect to a cluster; "
            "add --executor dask (or ray)") in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()
    with pytest.raises(ValueError, match=r"--address tcp://host:8786: only the dask and ray executors"):
        run_sweep(load_grid("smoke"), tmp_path / "sw", "local", address="tcp://host:8786", progress=False)
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("text, message", [
    ('profile = 5\n[scenarios]\nrates = [[0.4, 0.2, 0.1]]\nranks = [[8, 16, 32]]\n',
     "grid profile: 5 is not a profile name or a JSON path"),
    ('[scenarios]\npolicy = []\n', "grid [scenarios] policy: an empty list"),
    ('name = "../../escape"\n', "grid name '../../escape' holds a path separator"),
    ('seeds = [0, 0]\n', "grid seeds: 0 is listed twice"),
])
def test_a_bad_grid_file_is_an_exit_2_error_on_the_command_line(tmp_path, capsys, text, message):
    from twin.cli import main

    p = tmp_path / "g.toml"
    p.write_text(text)
    assert main(["sweep", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twin sweep: error: {message}") and "Traceback" not in err


def test_a_grid_file_left_at_the_published_axes_says_so_on_a_dry_run(tmp_path, capsys):
    from twin.cli import main

    p = tmp_path / "only.toml"
    p.write_text('name = "only"\n')
    assert main(["sweep", str(p), "--dry-run", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["tasks"] == 840
    assert cap.err.startswith("twin sweep: note: grid 'only' leaves rates, ranks, served, slots at the published "
                              "grid's values and profile at the default (")


def test_a_dry_run_names_the_profile_and_warns_of_a_short_window(tmp_path, capsys):
    """A grid on the default profile printed ``profile None``; a window_s too short for the 90 % line (the requests in
    flight at its end go uncounted: every run of this grid read as starving) said nothing."""
    from twin.cli import main
    from twin.perf.profile import DEFAULT_FITTED
    from twin.sweep.scenario import get_profile

    p = tmp_path / "g2.toml"
    p.write_text("window_s = 60\n[scenarios]\nrates = [[0.4, 0.2], [0.8, 0.4]]\nranks = [[8]]\n[configs]\n"
                 "served = [8, 16]\nslots = [8]\n")
    assert main(["sweep", str(p), "--dry-run", "--limit", "1", "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["profile"] == get_profile(None).name == DEFAULT_FITTED
    assert ("twin sweep: warning: window_s 60 is short for the starvation line (throughput >= 0.9 of the offered "
            "tokens): a request of grid 'g2' takes ~") in cap.err, cap.err
    assert "to spare is expected to read as starving; give window_s >= " in cap.err
    p.write_text(p.read_text().replace("window_s = 60", "window_s = 3600"))
    assert main(["sweep", str(p), "--dry-run"]) == 0
    assert f"profile            {DEFAULT_FITTED}\n" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another task"])
def test_a_damaged_shard_is_recomputed_not_counted_as_done(local_smoke, tmp_path, capsys, damage):
    """A shard overwritten or cut short (a crash, a full disk) counted as a finished task: the resumed sweep
    ran nothing and every later read failed with pyarrow's message alone."""
    import shutil

    from twin.cli import main

    src, _ = local_smoke
    out = tmp_path / "sw"
    shutil.copytree(src, out)
    before = read_results(out)
    shard = sorted((out / "shards").glob("*.parquet"))[0]
    said = "not readable as Parquet ("
    if damage == "garbage":
        shard.write_bytes(b"this is not parquet")
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    else:  # the other task's shard copied over this one
        other = sorted((out / "shards").glob("*.parquet"))[1]
        shard.write_bytes(other.read_bytes())
        said = f"rows of task {other.stem}, not of task {shard.stem}"
    assert main(["sweep", "smoke", "--out", str(out), "--summary"]) == 2
    err = capsys.readouterr().err
    assert (f"twin sweep: error: {shard}: a damaged sweep shard, {said}" in err and
            "run the sweep again with the same --out (a resumed sweep recomputes the tasks of damaged shards)" in err)
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--json"]) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert (d["tasks_run"], d["tasks_done_before"], d["shards_damaged"]) == (1, 1, [shard.name])
    assert (f"twin sweep: note: 1 damaged shards (not readable as Parquet, or not their task's run rows, e.g. "
            f"{shard.name})") in cap.err
    pd.testing.assert_frame_equal(_norm(read_results(out)), _norm(before))


@pytest.mark.parametrize("text, message", [
    ("{bad", "sweep.json: not a sweep's record (not readable as JSON: "),
    ("[1, 2]", "sweep.json: not a sweep's record (expected an object with grid, grid_digest, profile_hash and history)"),
    ('{"grid": {}, "history": 5}', "sweep.json: not a sweep's record (expected an object"),
])
def test_a_damaged_sweep_record_is_named_and_no_resume_starts_over(local_smoke, tmp_path, capsys, text, message):
    """A sweep.json that is no JSON object was a traceback (AttributeError) or json's message alone."""
    import shutil

    from twin.cli import main

    src, _ = local_smoke
    out = tmp_path / "sw"
    shutil.copytree(src, out)
    (out / "sweep.json").write_text(text)
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twin sweep: error: {out / 'sweep.json'}: ") and message in err and "Traceback" not in err
    assert "use another --out, or --no-resume to start over" in err
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--no-resume", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks_run"] == 2
    assert json.loads((out / "sweep.json").read_text())["grid"]["name"] == "smoke"


@pytest.mark.parametrize("executor, module, extra", [("ray", "ray", "lora-twin[ray]"),
                                                     ("dask", "dask.distributed", "lora-twin[sweep]")])
def test_a_missing_executor_extra_is_refused_before_out_is_made(tmp_path, capsys, monkeypatch, executor, module,
                                                                extra):
    """Without ray (or dask) the sweep made --out and wrote a sweep.json with a history entry of a run that never
    happened, then failed."""
    import sys

    from twin.cli import main

    monkeypatch.setitem(sys.modules, module, None)  # (as if not installed, whether or not it is)
    assert main(["sweep", "smoke", "--executor", executor, "--out", str(tmp_path / "sw"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin sweep: error: the ") and f"pip install '{extra}'" in err and "--executor local" in err
    assert not (tmp_path / "sw").exists()
    with pytest.raises(runner.MissingExtra, match=extra.replace("[", r"\[")):
        run_sweep(load_grid("smoke"), tmp_path / "sw", executor, progress=False)
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("flags, message", [
    (["--list", "--out", "x"], "--list lists the named grids and runs none, so --out would be ignored"),
    (["smoke", "--list"], "--list lists the named grids and runs none, so GRID would be ignored"),
    (["--list", "--summary"], "so --summary would be ignored"),
    (["--summary", "--out", "{out}", "--limit", "1", "--jobs", "2"],
     "--summary summarizes the results already in --out and runs nothing, so --limit and --jobs would be ignored; "
     "leave them out (or drop --summary to run the sweep)"),
    (["--summary", "--out", "{out}", "--executor", "dask"], "so --executor would be ignored"),
    (["--summary", "--out", "{out}", "--no-resume"], "so --no-resume would be ignored"),
    (["--summary", "--out", "{out}", "--dry-run"], "so --dry-run would be ignored"),
    (["policy-demo", "--summary", "--out", "{out}"], "--summary --out {out}: it holds a sweep of grid smoke, not "
                                                     "policy-demo; leave out the grid name"),
    (["smoke", "--dry-run", "--out", "{out}", "--no-resume"],
     "--dry-run prints the grid's size and runs nothing, so --no-resume and --out would be ignored; leave them out "
     "(or drop --dry-run to run the sweep)"),
    (["smoke", "--dry-run", "--out", "/etc/passwd"], "so --out would be ignored; leave it out"),
    (["smoke", "--dry-run", "--executor", "ray", "--jobs", "4"], "--dry-run prints the grid's size and runs nothing, "
                                                                 "so --executor and --jobs would be ignored"),
    (["smoke", "--dry-run", "--order", "grid"], "so --order would be ignored"),
])
def test_options_list_and_summary_would_ignore_are_refused(local_smoke, capsys, flags, message):
    """``--list`` / ``--summary`` / ``--dry-run`` run nothing: a run's options beside them (or a grid the --out is
    not a sweep of) were ignored in silence (``--dry-run`` reads the selection options: ``--limit`` and the
    like)."""
    from twin.cli import main

    out, _ = local_smoke
    assert main(["sweep"] + [f.format(out=out) for f in flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twin sweep: error: ") and message.format(out=out) in err, err
    assert main(["sweep", "--summary", "--out", str(out), "--json"]) == 0  # the grid left out: the --out's
    assert json.loads(capsys.readouterr().out)["tasks"] == 2


def test_resuming_shards_of_another_twin_version_says_so(local_smoke, tmp_path, capsys):
    """Shards written by another twin version were reused without a word (and the record forgot the version)."""
    import shutil

    from twin.cli import main

    src, _ = local_smoke
    out = tmp_path / "sw"
    shutil.copytree(src, out)
    meta = json.loads((out / "sweep.json").read_text())
    meta["twin_version"] = "0.0.1"  # (a record of an earlier twin: no list of versions)
    meta.pop("twin_versions", None)
    (out / "sweep.json").write_text(json.dumps(meta))
    for _ in range(2):  # (and still on the next resume: the record keeps every version)
        assert main(["sweep", "smoke", "--out", str(out), "--no-progress"]) == 0
        assert f"twin sweep: note: {out} holds shards written by lora-twin 0.0.1 (2 shards reused)" in \
            capsys.readouterr().err
    assert json.loads((out / "sweep.json").read_text())["twin_versions"][0] == "0.0.1"
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--no-resume"]) == 0
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress"]) == 0
    assert "note" not in capsys.readouterr().err


def test_a_policy_hook_that_raises_in_a_sweep_run_is_a_policy_error_naming_it(monkeypatch):
    """A scheduler hook (a plug-in preset's) that raises during a sweep run is raised as a PolicyError naming
    the policy, the hook and the original error (chained), as `twin run` reports it; the walk records that
    message in the row's error."""
    import twin.sweep.scenario as scenario
    from twin.interfaces import PolicyError, Scheduler
    from twin.registry import make_cache
    from twin.sweep.walk import run_task

    class Exploding(Scheduler):
        name = "exploding"

        def on_preempt(self, rid):
            pass

        def schedule_waiting(self, ctx):
            return 1 / 0

    monkeypatch.setattr(scenario, "_policy_objects", lambda policy: (Exploding(), make_cache("lru")))
    sc = {"key": "boom", "rates": [0.4, 0.2, 0.1], "ranks": [8, 16, 16], "lengths": [222.0, 197.0]}
    want = (r"scheduler 'exploding' \(.*Exploding\) failed in its hook schedule_waiting \(line \d+\): "
            r"ZeroDivisionError: division by zero; fix the policy")
    with pytest.raises(PolicyError, match=want) as e:
        scenario.run_config(sc, 8, 8, 16, window_s=20.0, profile="llama-3.1-8b_h100_vllm085")
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    rows = run_task({"scenario": sc, "task_id": "boom", "task_hash": "0", "slots": [8], "served": [8],
                     "max_rank": 16, "seed": 0, "window_s": 20.0, "profile": "llama-3.1-8b_h100_vllm085"})
    assert rows[0]["status"] == "error" and rows[0]["error"].startswith("PolicyError: scheduler 'exploding'")


@pytest.mark.parametrize("grid, how", [("smoke", "load_grid"), ({"name": "x"}, "grid_from_dict")])
def test_run_sweep_takes_a_grid_spec(tmp_path, grid, how):
    """Was AttributeError: 'str' object has no attribute 'tasks'."""
    with pytest.raises(TypeError, match=f"give a twin.sweep.grid.GridSpec, e.g. from .*{how}"):
        run_sweep(grid, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_count_that_is_not_a_whole_number_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--jobs '2': must be a whole number"):
        run_sweep(load_grid("smoke"), tmp_path, jobs="2")


def _sweep_copy(local_smoke, tmp_path):
    src, _ = local_smoke
    out = tmp_path / "sw"
    shutil.copytree(src, out)
    return out


@pytest.mark.parametrize("old_record", [False, True])
def test_shards_of_another_grid_are_refused_by_resume_summary_reader_and_dataset(local_smoke, tmp_path, capsys,
                                                                                 old_record):
    """Another grid's shards copied into a sweep's shards/ were counted: the resume said "0 tasks run (2 already
    done of 2)", --summary counted 3 tasks for the 2-task grid and `configure dataset` labelled the mixed rows.
    ``old_record``: a sweep.json of an earlier twin (no task_hashes: the grid's tasks are rebuilt from it)."""
    from twin.cli import main

    out = _sweep_copy(local_smoke, tmp_path)
    if old_record:
        meta = json.loads((out / "sweep.json").read_text())
        meta.pop("task_hashes", None)
        (out / "sweep.json").write_text(json.dumps(meta))
    before = read_results(out)
    stray = out / "shards" / "0123456789abcdef.parquet"
    shutil.copy(sorted((out / "shards").glob("*.parquet"))[0], stray)
    for cmd in (["sweep", "smoke", "--out", str(out), "--no-progress"], ["sweep", "--summary", "--out", str(out)],
                ["configure", "dataset", str(out)]):
        assert main(cmd) == 2, cmd
        err = capsys.readouterr().err
        assert ("error: 1 shard file under " in err and "belongs to no task of grid smoke (0123456789abcdef.parquet)"
                in err and "remove it" in err and "Traceback" not in err), err
    with pytest.raises(runner.ForeignShards, match="0123456789abcdef.parquet"):
        read_results(out)
    stray.unlink()  # (what the message says): the sweep resumes as before
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks_run"] == 0
    pd.testing.assert_frame_equal(_norm(read_results(out)), _norm(before))


def test_a_sweep_copied_without_its_record_does_not_resume_another_grid(local_smoke, tmp_path, capsys):
    """A sweep's directory copied and its sweep.json deleted: another grid swept into it ran and mixed its rows
    with the copied shards, exit 0. The grid the shards are of still resumes there."""
    from twin.cli import main

    out = _sweep_copy(local_smoke, tmp_path)
    (out / "sweep.json").unlink()
    p = tmp_path / "g.toml"
    p.write_text('name = "other"\nwindow_s = 30\n[scenarios]\nrates = [[0.4, 0.2, 0.1]]\nranks = [[8, 16, 32]]\n'
                 '[configs]\nserved = [8]\nslots = [8]\n')
    assert main(["sweep", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error: 2 shard files under " in err and "belong to no task of grid other (" in err and "remove them" in err
    assert not (out / "sweep.json").exists()  # (refused before the record is written)
    assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks_run"] == 0


def test_a_stray_unreadable_shard_of_no_task_is_named_to_remove(local_smoke, tmp_path, capsys):
    """An empty shards/zzzz.parquet let the resume exit 0, and --summary then said to run the sweep again,
    which cannot fix it (no task writes that file)."""
    from twin.cli import main

    out = _sweep_copy(local_smoke, tmp_path)
    (out / "shards" / "zzzz.parquet").write_bytes(b"")
    for cmd in (["sweep", "smoke", "--out", str(out), "--no-progress"], ["sweep", "--summary", "--out", str(out)]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "(zzzz.parquet; 1 not readable as Parquet)" in err and "remove it" in err, err
        assert "run the sweep again" not in err


def test_a_file_where_the_shards_go_is_named(tmp_path, capsys):
    """``OUT/shards`` a file: the error said "cannot use OUT/shards: File exists"."""
    from twin.cli import main

    (tmp_path / "shards").write_text("x")
    assert main(["sweep", "smoke", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'shards'} is a file, where the sweep keeps its shards (a folder)" in err
    assert "Traceback" not in err


def test_a_readable_table_that_is_not_run_rows_is_a_damaged_shard(tmp_path):
    """Another table saved under a shard's name read as Parquet: a resume counted its task as done, and every later
    read failed ("not a sweep's run table")."""
    from twin.sweep.runner import _shard_problem, damaged_shards

    d = tmp_path / "shards"
    d.mkdir()
    pd.DataFrame({"arrival_s": [0.0], "prompt_tokens": [5]}).to_parquet(d / "abc.parquet")
    pd.DataFrame({"task_hash": ["abc"], "status": ["ok"], "scenario": ["s"]}).to_parquet(d / "abd.parquet")
    pd.DataFrame({"task_hash": ["abe"], "status": ["ok"], "scenario": ["s"]}).to_parquet(d / "abe.parquet")
    assert _shard_problem(d / "abc.parquet") == ("a Parquet table but not a sweep's run rows (missing columns "
                                                  "task_hash, status, scenario)")
    assert _shard_problem(d / "abd.parquet") == "rows of task abc, not of task abd"
    assert _shard_problem(d / "abe.parquet") is None
    assert [p.name for p in damaged_shards(tmp_path)] == ["abc.parquet", "abd.parquet"]


def test_the_record_and_shards_are_written_whole_and_a_killed_writers_leftovers_go(local_smoke, tmp_path,
                                                                                    monkeypatch):
    """``sweep.json`` is written as the shards are (a temporary name of the writer's own, then renamed: a sweep killed
    while writing it left half a record, which made every finished shard unusable), and a resume removes what a
    killed writer left (its process gone) while another running writer's temporaries stay."""
    out = tmp_path / "smoke"
    shutil.copytree(local_smoke[0], out)
    writes: list[str] = []
    real_replace = runner.os.replace
    monkeypatch.setattr(runner.os, "replace", lambda a, b: (writes.append(f"{a}->{b}"), real_replace(a, b))[1])
    dead = 2 ** 22 + 12345  # (above Linux's default pid_max: no such process)
    stale = [out / "shards" / ".0123abcd.parquet.tmp", out / "shards" / f".0123abcd.{dead}.parquet.tmp",
             out / f".sweep.json.{dead}.tmp"]
    live = out / "shards" / f".4567cdef.{runner.os.getpid()}.parquet.tmp"
    for p in (*stale, live):
        p.write_bytes(b"half")
    run_sweep(load_grid("smoke"), out, "local", jobs=1, progress=False)
    assert not any(p.exists() for p in stale) and live.exists()
    assert any(w.endswith(f"->{out / 'sweep.json'}") and f".sweep.json.{runner.os.getpid()}.tmp" in w for w in writes)
    json.loads((out / "sweep.json").read_text())  # whole
    assert read_results(out)["status"].eq("ok").all()


# --------------------------------------------------------------------------- one sweep at a time into an --out
def _no_task_runs(monkeypatch):
    """Any task run fails the test (a refusal must come before any work)."""
    def ran(*a, **k):
        raise AssertionError("a task ran")
    monkeypatch.setattr(runner, "run_task", ran)
    monkeypatch.setitem(runner._EXEC, "local", ran)


def _lock_is_free(out) -> bool:
    import fcntl
    import os

    fd = os.open(out / runner.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # (releases it)


@pytest.mark.skipif(runner.fcntl is None, reason="no flock on this platform: no lock taken")
def test_a_second_sweep_into_a_locked_out_is_refused_up_front(local_smoke, tmp_path, capsys, monkeypatch):
    """Two sweeps into one --out at once both ran every task, and one's history entry in sweep.json was lost (also
    with --shard 0/2 and 1/2): the second is refused before any work, naming the holder; --summary and --dry-run,
    which write nothing, still work."""
    import os

    from twin.cli import main

    out = tmp_path / "smoke"
    shutil.copytree(local_smoke[0], out)
    (out / "shards" / sorted(p.name for p in (out / "shards").glob("*.parquet"))[0]).unlink()  # a task left to run
    record = (out / "sweep.json").read_text()
    held = runner.lock_out(out, "smoke", "0/2")  # another sweep's, as the lock file records it
    try:
        _no_task_runs(monkeypatch)
        assert main(["sweep", "smoke", "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert (f"twin sweep: error: --out {out} is in use by another twin sweep (pid {os.getpid()}, started "
                in err), err
        assert "grid smoke, --shard 0/2); wait for it to finish or give another --out" in err
        assert "give each its own --out" in err and "`twin configure dataset`" in err  # (the other is a shard)
        assert "Traceback" not in err
        assert main(["sweep", "smoke", "--out", str(out), "--no-progress", "--shard", "1/2"]) == 2
        assert "run them one after another into this one" in capsys.readouterr().err
        with pytest.raises(runner.OutInUse, match="is in use by another twin sweep"):
            run_sweep(load_grid("smoke"), out, progress=False)
        assert (out / "sweep.json").read_text() == record  # (untouched: no history entry added)
        assert main(["sweep", "--summary", "--out", str(out)]) == 0  # (reads only)
        assert main(["sweep", "smoke", "--dry-run"]) == 0
        capsys.readouterr()
    finally:
        runner.unlock_out(held)
    monkeypatch.undo()
    rep = run_sweep(load_grid("smoke"), out, progress=False)  # the holder gone: the sweep runs
    assert rep.tasks_run == 1 and _lock_is_free(out)


@pytest.mark.skipif(runner.fcntl is None, reason="no flock on this platform: no lock taken")
def test_a_lock_that_records_no_holder_still_refuses(tmp_path, capsys, monkeypatch):
    import fcntl
    import os

    from twin.cli import main

    fd = os.open(tmp_path / ".sweep.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        _no_task_runs(monkeypatch)
        assert main(["sweep", "smoke", "--out", str(tmp_path), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert f"--out {tmp_path} is in use by another twin sweep (its pid and start not recorded)" in err
        assert not (tmp_path / "sweep.json").exists() and not (tmp_path / "shards").exists()
    finally:
        os.close(fd)


@pytest.mark.skipif(runner.fcntl is None, reason="no flock on this platform: no lock taken")
@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError])
def test_the_lock_is_released_when_a_sweep_is_interrupted_or_fails(tmp_path, monkeypatch, raised):
    seen = []

    def stopped(tasks, jobs, **k):
        seen.append(_lock_is_free(tmp_path))  # (held while the tasks run)
        raise raised("stop")
        yield

    monkeypatch.setitem(runner._EXEC, "local", stopped)
    with pytest.raises(raised):
        run_sweep(load_grid("smoke"), tmp_path, progress=False)
    assert seen == [False] and _lock_is_free(tmp_path) and not runner._HELD_LOCK_FDS


def test_a_read_only_shards_folder_is_named_before_any_task(tmp_path, capsys, monkeypatch):
    """A read-only OUT/shards was found only when the first task's shard was written (its work lost), in an error
    naming no path ("cannot use: Failed to open local file ... Read-only file system")."""
    import errno
    import os

    from twin.cli import main

    (tmp_path / "shards").mkdir()
    real_open = os.open

    def read_only(path, *a, **k):  # (as a read-only mount answers: permission bits cannot make it so for root)
        if str(path).startswith(str(tmp_path / "shards")):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *a, **k)

    _no_task_runs(monkeypatch)
    monkeypatch.setattr(runner.os, "open", read_only)
    assert main(["sweep", "smoke", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (f"twin sweep: error: {tmp_path / 'shards'}: cannot write there (Read-only file system), where the sweep "
            f"keeps its shards" in err), err
    assert "Traceback" not in err and not (tmp_path / "sweep.json").exists()


_WORKERS_SCRIPT = r"""
import os, signal, sys, time
from twin.sweep import runner

def task(t):  # Ctrl-C reaches every process of the terminal's group: here the worker alone gets it
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    lock_open = False
    for held in [int(sys.argv[2])] + ([fd] if fd is not None else []):
        try:
            os.fstat(held)
            lock_open = True
        except OSError:
            pass
    return [{"i": t["i"], "lock_open": lock_open}]

runner.run_task = task
fd = runner.lock_out(sys.argv[1])
runner._HELD_LOCK_FDS.add(int(sys.argv[2]))  # (and a stand-in held as a lock is: fd is None without flock)
print(sorted((r[0]["i"], r[0]["lock_open"]) for r in runner._local([{"i": i} for i in range(4)], 2)))
"""


def test_local_workers_leave_ctrl_c_to_the_sweep_and_close_its_lock(tmp_path):
    """Ctrl-C with --jobs 2 printed each worker's KeyboardInterrupt traceback before the clean "interrupted" message:
    a worker ignores SIGINT (the parent stops the pool); and a forked worker closes its copy of the --out lock."""
    import os
    import subprocess
    import sys

    stand_in = os.open(tmp_path / "stand-in", os.O_RDWR | os.O_CREAT)
    os.set_inheritable(stand_in, True)
    try:
        p = subprocess.run([sys.executable, "-c", _WORKERS_SCRIPT, str(tmp_path), str(stand_in)], capture_output=True,
                           text=True, timeout=60, pass_fds=(stand_in,))
    finally:
        os.close(stand_in)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, p.stderr
    assert p.stdout.strip() == str([(i, False) for i in range(4)])


def test_a_terminated_sweep_stops_its_workers_and_says_how_to_resume(tmp_path):
    """SIGTERM (kill, a batch scheduler's time limit) stops a --jobs 2 sweep as Ctrl-C does: exit 130 with the
    resume message and no traceback, and no pool worker outlives it (they ran on as orphans)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "twin", "sweep", "arrival-demo", "--out", str(out), "--jobs", "2",
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while not (out / "sweep.json").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # (the pool's workers are running tasks)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "twin sweep: interrupted;" in err and "Traceback" not in err, err
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):  # (nothing of the sweep's process group is left)
        os.killpg(p.pid, 0)


@pytest.mark.parametrize("override", [{"max_model_len": 4096}, {"tensor_parallel": 2}])
def test_start_up_check_reads_the_grids_engine_overrides(override):
    """The start-up check read the slots and rank only: 128 slots at rank 32 was recorded as a start failure with
    max_model_len 4096 or tensor parallelism 2, where the engine built with the same override starts (KV 121,456 and
    486,448 tokens). It checks the engine the run builds now."""
    from twin.sweep.scenario import run_config

    sc = {"key": "x", "rates": [0.1, 0.05, 0.025], "ranks": [8, 16, 32], "lengths": [222.0, 197.0]}
    r = run_config(sc, 192, 128, 32, window_s=20.0, profile="llama-3.1-8b_h100_vllm085", engine_overrides=override)
    assert r["status"] == "ok" and r["kv_tokens"] in (121456, 486448)
    r = run_config(sc, 192, 128, 32, window_s=20.0, profile="llama-3.1-8b_h100_vllm085",
                   engine_overrides={"kv_capacity_tokens": 4096})  # (below one max_model_len request: refused)
    assert r["status"] == "start_failure" and "vLLM would refuse to start" in r["startup_reason"]


def test_labels_below_the_walks_ratio_are_refused():
    """A sweep walked at ratio 0.95 stops each slot value's walk at its first run below 0.95; labelled at 0.9 the
    labels silently lacked the runs a walk at 0.9 goes on to (11 of 24 differed). Refused now; at or above the walk's
    ratio the labels hold."""
    import pandas as pd

    from twin.configurator.dataset import build_dataset

    runs = pd.DataFrame({"scenario": ["s"] * 2, "served_adapters": [8, 16], "adapter_slots": [8, 8], "seed": [0, 0],
                         "max_lora_rank": [8, 8], "status": ["ok", "ok"], "offered_tok_s": [100.0, 200.0],
                         "total_tok_s": [99.0, 186.0], "early_stop": [False, False], "walk_ratio": [0.95, 0.95],
                         "rates": ["0.1-0.1-0.1"] * 2, "ranks": ["8-8-8"] * 2})
    with pytest.raises(ValueError, match=r"--ratio 0.9 from a sweep that walked at ratio 0.95"):
        build_dataset(runs, "throughput90", ratio=0.9)
