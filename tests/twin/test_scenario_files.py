"""Scenario files (issue 16, item 2): ``twin run --config FILE`` (TOML, YAML, JSON, a run's
summary.json), flags overriding the file, ``--dump-config``, and a run replayed bit for bit from
its ``summary.json``."""

from __future__ import annotations

import dataclasses
import io
import json
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from twin.cli import main
from twin.perf.profile import DEFAULT_FITTED
from twin.scenario import RECORDED, RUN_FIELDS, RunConfig, to_toml


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def summary_of(argv: list[str]) -> dict:
    rc, out, err = run_cli(argv + ["--json", "--no-progress"])
    assert rc == 0, err
    return json.loads(out)


def test_summary_embeds_the_resolved_scenario(tmp_path):
    s = summary_of(["run", "--duration", "20", "--policy", "slora", "--trace-opt", "length_scale=0.5",
                    "--out", str(tmp_path)])
    sc = s["scenario"]
    assert set(RUN_FIELDS) <= set(sc) and set(RECORDED) - {"trace_sha256"} <= set(sc)  # (a file's digest only)
    assert sc["policy"] == "slora" and sc["duration"] == 20.0 and sc["trace_options"]["length_scale"] == 0.5
    assert sc["profile"] == DEFAULT_FITTED and len(sc["profile_sha256"]) == 64
    assert sc["slots"] == 16  # the default, resolved
    assert (sc["rps"], sc["adapters"], sc["popularity"]) == (1.0, 100, "powerlaw")  # the preset's own, pinned
    assert sc["trace_options"]["lengths"] == "splitwise"
    assert sc["scheduler_params"] == {"lookahead_tokens": None, "max_lookahead": None}
    assert sc["cache_params"]["adapter_memory"] == "unified"
    assert json.loads((tmp_path / "summary.json").read_text())["scenario"] == sc


def _same_run(a: Path, b: Path) -> None:
    for name in ("requests.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(a / name), pd.read_parquet(b / name), check_exact=True)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    volatile = {"wall_s", "sim_wall_s", "x_realtime", "workload"}  # workload: its meta lists the pinned options
    assert {k: v for k, v in sa.items() if k not in volatile} == {k: v for k, v in sb.items() if k not in volatile}


@pytest.mark.parametrize("argv", [
    ["--duration", "30", "--rps", "3", "--ranks", "8,16", "--adapters", "20", "--popularity", "zipf:1.2",
     "--slots", "4", "--max-model-len", "16384", "--ttft-slo", "1", "--tbt-slo", "0.1", "--horizon", "60"],
    ["--trace", "chameleon", "--policy", "chameleon", "--duration", "20", "--seed", "3", "--gpu-mem-gb", "80",
     "--trace-opt", "length_scale=0.3"],  # (no --max-lora-rank: a vLLM option, refused on S-LoRA)
], ids=["vllm-synthetic", "chameleon"])
def test_summary_json_replays_the_run_bit_for_bit(tmp_path, argv):
    first, second, third = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    rc, _, err = run_cli(["run", "--no-progress", *argv, "--out", str(first)])
    assert rc == 0, err
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(first / "summary.json"), "--out", str(second)])
    assert rc == 0 and "warning" not in err, err
    _same_run(first, second)
    # the dumped TOML replays it too
    rc, toml_text, err = run_cli(["run", "--config", str(first / "summary.json"), "--dump-config"])
    assert rc == 0, err
    (tmp_path / "s.toml").write_text(toml_text)
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "s.toml"), "--out", str(third)])
    assert rc == 0 and "warning" not in err, err
    _same_run(first, third)


def test_flags_override_the_file(tmp_path):
    (tmp_path / "s.toml").write_text('duration = 10.0\nrps = 3.0\nslots = 4\n[trace_options]\nlength_scale = 0.5\n'
                                     'lengths = "sharegpt"\n')
    s = summary_of(["run", "--config", str(tmp_path / "s.toml"), "--rps", "1.5", "--trace-opt", "length_scale=0.25"])
    sc = s["scenario"]
    assert (sc["duration"], sc["rps"], sc["slots"]) == (10.0, 1.5, 4)
    assert {k: sc["trace_options"][k] for k in ("length_scale", "lengths")} == {"length_scale": 0.25,
                                                                                "lengths": "sharegpt"}
    assert s == {**s, **summary_of(["run", "--duration", "10", "--rps", "1.5", "--slots", "4", "--trace-opt",
                                    "length_scale=0.25", "--trace-opt", "lengths=sharegpt"]),
                 "wall_s": s["wall_s"], "x_realtime": s["x_realtime"]}


def test_yaml_and_json_scenarios(tmp_path):
    pytest.importorskip("yaml")
    (tmp_path / "s.yaml").write_text("duration: 10\nrps: 2\nranks: [8, 16]\ntrace_options:\n  length_scale: 0.5\n")
    (tmp_path / "s.json").write_text(json.dumps({"duration": 10, "rps": 2, "ranks": "8,16",
                                                 "trace_options": ["length_scale=0.5"]}))
    a = summary_of(["run", "--config", str(tmp_path / "s.yaml")])
    b = summary_of(["run", "--config", str(tmp_path / "s.json")])
    assert a["scenario"] == b["scenario"] and a["ttft_ms_mean"] == b["ttft_ms_mean"]
    assert a["scenario"]["ranks"] == [8, 16]


def test_dump_config_prints_toml_and_does_no_run(tmp_path):
    rc, out, err = run_cli(["run", "--dump-config", "--rps", "3", "--duration", "30"])
    assert rc == 0, err
    d = tomllib.loads(out)
    assert d["rps"] == 3.0 and d["duration"] == 30.0 and d["policy"] == "vllm" and "requests_arrived" not in out
    assert d["adapters"] == 100 and d["ranks"] == [8, 16, 32]
    assert "# horizon =" in out  # unset options are listed as comments
    # --out would be ignored: refused, and nothing is written
    rc, out, err = run_cli(["run", "--dump-config", "--rps", "3", "--duration", "30", "--out", str(tmp_path / "o")])
    assert rc == 2 and "--out with --dump-config: nothing is run or written" in err and out == ""
    assert not (tmp_path / "o").exists()


def test_a_changed_profile_or_policy_is_reported_when_replaying(tmp_path):
    s = summary_of(["run", "--duration", "5"])
    sc = dict(s["scenario"], profile_sha256="0" * 64)
    sc["cache_params"] = dict(sc["cache_params"], prefetch_sync=True)
    (tmp_path / "s.json").write_text(json.dumps(sc))
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "s.json")])
    assert rc == 0
    assert "warning: the profile's content differ(s)" in err and "warning: cache params differ(s)" in err


def test_an_edited_workload_file_is_reported_when_replaying(tmp_path):
    """The scenario records the workload file's SHA-256: a replay of the run after the file changed says so (it
    replayed the new rows without a word); the unchanged file replays without a warning."""
    trace = tmp_path / "w.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,200,10\n2,300,10\n")
    rc, _, err = run_cli(["run", "--no-progress", "--trace", str(trace), "--out", str(tmp_path / "o")])
    assert rc == 0, err
    recorded = json.loads((tmp_path / "o" / "summary.json").read_text())["scenario"]
    assert len(recorded["trace_sha256"]) == 64
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "o" / "summary.json")])
    assert rc == 0 and "differ(s)" not in err, err
    with trace.open("a") as f:
        f.write("7,500,50\n")
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "o" / "summary.json")])
    assert rc == 0 and "warning: the workload file's content differ(s) from the scenario file's" in err, err
    assert "trace_sha256" not in summary_of(["run", "--duration", "5"])["scenario"]  # (a built-in trace: a name)


def test_to_toml_round_trips_every_value_type():
    sc = {"trace": 'a "quoted" path\\x', "rps": 1e-5, "ranks": [8, 16], "seed": 3, "horizon": None,
          "trace_options": {"length_scale": 0.5, "lengths": "sharegpt", "conversations": True, "rates": [0.1, 0.05]},
          "cache_params": {"F": 0.45, "weird key": None}}
    back = tomllib.loads(to_toml(sc))
    assert back == {k: v for k, v in sc.items() if v is not None} | {"cache_params": {"F": 0.45}}


def test_every_run_option_has_a_flag_and_a_scenario_key():
    names = {f.name for f in dataclasses.fields(RunConfig)}
    assert names == set(RUN_FIELDS)
    rc, out, _ = run_cli(["run", "--dump-config", "--duration", "5"])
    d = tomllib.loads(out)
    for name in names:
        assert name in d or f"# {name} =" in out, name


def test_a_replay_does_not_follow_a_changed_preset_default(tmp_path, monkeypatch):
    """The synthetic preset's own rate, adapters and length model are pinned in the scenario: a
    later change of the preset (the default scenario's numbers) does not change a replay."""
    from traces import registry

    first, second = tmp_path / "a", tmp_path / "b"
    assert run_cli(["run", "--no-progress", "--duration", "20", "--out", str(first)])[0] == 0
    spec = registry.BUILTINS["synthetic"]
    monkeypatch.setitem(registry.BUILTINS, "synthetic",
                        dataclasses.replace(spec, defaults={**spec.defaults, "rps": 5.0, "popularity": "uniform"}))
    assert summary_of(["run", "--duration", "20"])["requests_arrived"] != \
        json.loads((first / "summary.json").read_text())["requests_arrived"]  # the preset did change
    assert run_cli(["run", "--no-progress", "--config", str(first / "summary.json"), "--out", str(second)])[0] == 0
    _same_run(first, second)


def test_relative_paths_are_read_from_the_scenario_file_and_a_saved_workload_replays(tmp_path, monkeypatch):
    """A run of a saved workload (a twin-written synthetic one) and a profile JSON given by relative
    paths replays from another directory: the summary records them absolute, and a hand-written
    scenario file's relative paths are read relative to the file (they used to be read from the
    current directory; and the synthetic settings pinned from the saved workload's meta were
    refused on replay as options a saved workload does not take)."""
    from twin.perf.profile import load_profile

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rc, _, err = run_cli(["traces", "synth", "--out", "w.parquet", "--duration", "20", "--rps", "2"])
    assert rc == 0, err
    (work / "p.json").write_text(json.dumps(load_profile(None).to_dict()))
    rc, _, err = run_cli(["run", "--no-progress", "--trace", "w.parquet", "--profile", "p.json", "--out", "a"])
    assert rc == 0, err
    sc = json.loads((work / "a" / "summary.json").read_text())["scenario"]
    assert sc["trace"] == str(work / "w.parquet") and sc["profile"] == str(work / "p.json")
    (work / "s.toml").write_text('trace = "w.parquet"\nprofile = "p.json"\n')
    monkeypatch.chdir(tmp_path)  # elsewhere: the summary and the relative scenario file both replay the run
    for config, out in (("work/a/summary.json", "b"), ("work/s.toml", "c")):
        rc, _, err = run_cli(["run", "--no-progress", "--config", config, "--out", out])
        assert rc == 0 and "warning" not in err, err
        _same_run(work / "a", tmp_path / out)
    # a relative path found in neither place is still named with the current directory's reading
    (tmp_path / "bad.toml").write_text('trace = "nosuch.parquet"\n')
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "bad.toml")])
    assert rc == 2 and "nosuch.parquet does not exist" in err, err


def test_a_length_source_file_is_read_from_the_scenario_file(tmp_path, monkeypatch):
    """``lengths = "empirical:PATH"`` (and ``lognormal:PATH``) in a scenario file's trace options is read
    relative to the file, as ``trace`` is; the summary records it absolute, so the run replays from
    another directory; trace names and the other length models are left as written."""
    from twin.scenario import rebase_trace_options

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rc, _, err = run_cli(["traces", "synth", "--out", "w.parquet", "--duration", "30", "--rps", "3"])
    assert rc == 0, err
    (work / "s.toml").write_text('duration = 20\n[trace_options]\nlengths = "empirical:w.parquet"\n')
    monkeypatch.chdir(tmp_path)  # (it used to fail: "trace file w.parquet does not exist")
    rc, _, err = run_cli(["run", "--no-progress", "--config", "work/s.toml", "--out", "a"])
    assert rc == 0, err
    sc = json.loads((tmp_path / "a" / "summary.json").read_text())["scenario"]
    assert sc["trace_options"]["lengths"] == f"empirical:{work / 'w.parquet'}"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rc, _, err = run_cli(["run", "--no-progress", "--config", str(tmp_path / "a" / "summary.json"), "--out", "b"])
    assert rc == 0 and "warning" not in err, err
    _same_run(tmp_path / "a", tmp_path / "elsewhere" / "b")
    base = work
    kept = [("lengths", "empirical:splitwise"), ("lengths", "sharegpt"), ("lengths", "fixed:1/2"),
            ("lengths", "lognormal:nosuch.parquet"), ("rps", 2.0)]
    assert rebase_trace_options(kept, base) == kept
    assert rebase_trace_options([("lengths", "lognormal:w.parquet")], base) == \
        [("lengths", f"lognormal:{work / 'w.parquet'}")]
