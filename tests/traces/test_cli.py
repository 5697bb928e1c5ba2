"""``twin traces list|show|fetch|synth`` through argparse, as twin/cli.py will mount them."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from traces.cli import register_cli
from traces.synth import OPTIONS
from traces.workload import Workload


def run(argv):
    ap = argparse.ArgumentParser(prog="twin")
    register_cli(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(argv)
    return args.func(args)


def test_list(capsys, tmp_path):
    assert run(["traces", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "splitwise-synth" in out and "twin traces fetch splitwise" in out
    assert run(["traces", "list", "--json", "--data-dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["name"] == "synthetic" and r["available"] for r in rows)


def test_the_module_runs_the_same_commands_on_its_own(capsys, tmp_path):
    """``python -m traces.cli list|show|...`` (it used to want ``python -m traces.cli traces list``):
    the commands of ``twin traces``, its errors named by the module's own command."""
    from traces.cli import main

    assert main(["list", "--json", "--data-dir", str(tmp_path)]) == 0
    assert any(r["name"] == "synthetic" for r in json.loads(capsys.readouterr().out))
    assert main(["show", "nosuch"]) == 2
    assert capsys.readouterr().err.startswith("python -m traces.cli show: error: unknown trace 'nosuch'")
    assert main([]) == 2 and "{list,show,fetch,synth}" in capsys.readouterr().out


def test_show_table_json_and_plot(capsys, tmp_path):
    assert run(["traces", "show", "synthetic", "--duration", "60", "--popularity", "zipf:1.2"]) == 0
    out = capsys.readouterr().out
    for word in ("requests", "mean rate", "inter-arrival CV", "prompt tokens", "top-k adapter share"):
        assert word in out
    png = tmp_path / "f.png"
    assert run(["traces", "show", "synthetic", "--duration", "60", "--json", "--plot", str(png)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests"] > 0 and "1" in s["top_k_share"] and png.stat().st_size > 1000


def test_show_errors(capsys, tmp_path):
    assert run(["traces", "show", "no-such"]) == 2
    err = capsys.readouterr().err
    assert "built-in names" in err
    assert err.startswith("twin traces show: error: ")  # named as argparse names its errors (was "error: ")
    assert run(["traces", "show", "splitwise", "--data-dir", str(tmp_path)]) == 2
    assert "twin traces fetch splitwise" in capsys.readouterr().err


def test_every_synthesis_option_is_a_flag():
    ap = argparse.ArgumentParser()
    register_cli(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["traces", "synth", "--out", "x.parquet"])
    for name in OPTIONS:
        assert hasattr(args, name), name


def test_synth_writes_parquet_with_options(tmp_path, capsys):
    out = tmp_path / "w.parquet"
    argv = ["traces", "synth", "--out", str(out), "--arrival", "gamma", "--cv", "2", "--rps", "20", "--duration", "100",
            "--adapters", "20", "--ranks", "8,16", "--popularity", "U-P", "--lengths", "sharegpt", "--mean-in", "222",
            "--mean-out", "196", "--max-total", "2048", "--conversations", "--mean-turns", "2", "--think-s", "5",
            "--seed", "7"]
    assert run(argv) == 0
    w = Workload.load(out)
    assert w.meta["seed"] == 7 and w.meta["options"]["popularity"] == "U-P"
    assert w.meta["config"]["arrivals"]["cv"] == 2.0 and w.meta["config"]["conversations"]["enabled"] is True
    assert set(w.df["adapter_rank"]) <= {8, 16} and (w.df["turn"] > 0).any()


def test_synth_per_adapter_and_fixed(tmp_path):
    out = tmp_path / "w.parquet"
    assert run(["traces", "synth", "--out", str(out), "--arrival", "per-adapter", "--rates", "0.2,0.1",
                "--adapters", "10", "--duration", "200", "--lengths", "fixed:medium", "--no-shuffle-rates"]) == 0
    w = Workload.load(out)
    assert w.meta["arrivals_info"]["adapter_rates"] == [0.2, 0.1] * 5
    assert (w.df["prompt_tokens"] == 250).all()


def test_fetch_failure_exit_code(tmp_path, capsys):
    bad = (tmp_path / "missing.csv").as_uri()
    assert run(["traces", "fetch", "splitwise", "--data-dir", str(tmp_path), "--url", bad, "--timeout", "2"]) == 2
    assert "no network" in capsys.readouterr().err


@pytest.mark.data
def test_show_real_splitwise(real_data, capsys):
    assert run(["traces", "show", "splitwise", "--data-dir", str(real_data)]) == 0
    out = capsys.readouterr().out
    assert "19,366" in out and "5.530 req/s" in out


@pytest.mark.data
def test_show_says_when_a_traces_arrivals_were_re_timed(real_data, capsys):
    """arrival=poisson replaces the trace's timestamps at a default 4 req/s: the table said `source splitwise` and
    the rate as if they were the trace's. It says so now, and where the rate came from; a replay says nothing."""
    assert run(["traces", "show", "splitwise", "--arrival", "poisson", "--data-dir", str(real_data)]) == 0
    assert "re-timed: poisson at 4 req/s (the default; --rps sets it), not the trace's timestamps" in \
        capsys.readouterr().out
    assert run(["traces", "show", "splitwise", "--arrival", "poisson", "--rps", "2", "--json",
                "--data-dir", str(real_data)]) == 0
    assert json.loads(capsys.readouterr().out)["arrivals_retimed"] == {"process": "poisson", "rps": 2.0,
                                                                        "rps_given": True}
    assert run(["traces", "show", "splitwise", "--data-dir", str(real_data)]) == 0
    assert "re-timed" not in capsys.readouterr().out


@pytest.mark.data
def test_show_names_the_scenario_defaults_twin_run_adds(real_data, capsys):
    """`traces show splitwise` gives the trace as recorded (100 adapters at ranks 8..128, 5.5 req/s), while `twin run
    --trace splitwise` replays it at 2.2 req/s over 600 s at ranks 8/16/32: the table read as the run's workload. A
    note names what the run adds, only the defaults not given; with all of them given it goes, and the table is the
    run's workload (its request count)."""
    assert run(["traces", "show", "splitwise", "--data-dir", str(real_data)]) == 0
    out = capsys.readouterr().out
    assert ("note: twin run --trace splitwise replays it with --rps 2.2, --duration 600, --ranks 8,16,32 unless "
            "given") in out
    assert run(["traces", "show", "splitwise", "--rps", "2.2", "--data-dir", str(real_data)]) == 0
    assert "with --duration 600, --ranks 8,16,32 unless" in capsys.readouterr().out
    assert run(["traces", "show", "splitwise", "--rps", "2.2", "--duration", "600", "--ranks", "8,16,32",
                "--data-dir", str(real_data)]) == 0
    out = capsys.readouterr().out
    assert "note:" not in out and "requests             1,132" in out and "r64" not in out
    assert run(["traces", "show", "splitwise", "--json", "--data-dir", str(real_data)]) == 0
    json.loads(capsys.readouterr().out)  # (the JSON stays one object)
    assert run(["traces", "show", "synthetic"]) == 0  # a synthetic trace: its defaults are its own
    assert "note:" not in capsys.readouterr().out


def test_show_a_raw_trace_path(tmp_path, capsys):
    from traces.samples import write_sample

    path = write_sample("burstgpt", tmp_path / "b.csv", n=100)
    assert run(["traces", "show", str(path), "--adapters-from", "key", "--adapters", "2"]) == 0
    out = capsys.readouterr().out
    assert "adapters             2" in out


def test_synthesis_options_use_the_shared_parsers():
    from traces.synth import SynthConfig, apply_options

    cfg = apply_options(SynthConfig(), {"rates": "0.2/0.1", "ranks": "8-16", "shuffle_rates": "no",
                                        "conversations": "yes"})
    assert cfg.arrivals.rates == [0.2, 0.1] and cfg.adapters.ranks == [8, 16]
    assert cfg.arrivals.shuffle_rates is False and cfg.conversations.enabled is True
    with pytest.raises(ValueError, match="conversations: expected true or false"):
        apply_options(SynthConfig(), {"conversations": "maybe"})
    with pytest.raises(ValueError, match="ranks: 'x' is not a valid int"):
        apply_options(SynthConfig(), {"ranks": "8,x"})


def test_rate_per_bin_divides_the_partial_last_bin_by_its_width():
    """Arrivals over 160 s in 100 s bins: the second bin spans 60 s, so its rate is its count / 60;
    a last bin under half a bin wide is left out (no rate over a sliver of time)."""
    from traces.stats import summarize

    t = np.concatenate([np.linspace(0, 99, 100), np.linspace(100, 160, 60)])
    w = Workload.from_arrays(t, np.full(len(t), 10), np.full(len(t), 5))
    rps = summarize(w, bin_s=100)["rate_over_time"]["rps"]
    assert rps == [1.0, 1.0]
    t2 = np.concatenate([t, [170.0, 180.0]])  # arrivals over 180 s
    w2 = Workload.from_arrays(t2, np.full(len(t2), 10), np.full(len(t2), 5))
    assert len(summarize(w2, bin_s=120)["rate_over_time"]["rps"]) == 2  # 0-120, 120-180 (half a bin: kept)
    assert len(summarize(w2, bin_s=170)["rate_over_time"]["rps"]) == 1  # 170-180 is a sliver: left out


def test_show_json_is_json_when_a_figure_is_undefined(capsys):
    """One request has no rate or inter-arrival CV: `twin traces show --json` printed NaN, which JSON readers refuse;
    it prints null."""
    from twin.cli import main

    assert main(["traces", "show", "synthetic", "--n-requests", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)  # (json.loads takes NaN: check the text too)
    assert d["mean_rps"] is None
