"""The ``twin`` command: the embedded default scenario, JSON output, files, clear errors; flags derived
from the config dataclasses, shared by ``twin run`` and ``twin compare``."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pandas as pd
import pytest

from traces.flags import add_arguments, from_namespace
from twin.cli import main, make_parser
from twin.compare import NOT_COMPARE_OPTIONS, CompareConfig
from twin.config import EngineConfig, vllm_default_limits
from twin.perf.profile import load_profile
from twin.scenario import DEFAULT_ADAPTER_SLOTS, RunConfig, engine_limits

REQUIRED_KEYS = ["requests_arrived", "requests_finished", "requests_rejected", "requests_unfinished",
                 "throughput_rps", "input_tok_s", "output_tok_s", "ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99",
                 "itl_ms_mean", "itl_ms_p99", "tpot_ms_mean", "e2e_ms_mean", "e2e_ms_p99", "adapter_hit_rate",
                 "adapter_loads", "link_gb", "simulated_s", "wall_s"]


def test_run_default_json_and_files(tmp_path, capsys):
    assert main(["run", "--json", "--no-progress", "--duration", "60", "--out", str(tmp_path)]) == 0
    s = json.loads(capsys.readouterr().out)
    for k in REQUIRED_KEYS:
        assert k in s, k
    assert s["requests_arrived"] == s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] > 0
    req = pd.read_parquet(tmp_path / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert len(req) >= s["requests_arrived"] and steps["n_steps"].sum() == s["engine_steps"]
    assert json.loads((tmp_path / "summary.json").read_text())["requests_finished"] == s["requests_finished"]


def test_run_table(capsys):
    assert main(["run", "--no-progress", "--duration", "30"]) == 0
    out = capsys.readouterr().out
    assert "TTFT ms mean / p50 / p99" in out and "throughput (req/s)" in out


@pytest.mark.parametrize("policy", ["vllm", "slora"])
def test_run_frontend_latency_shifts_client_times_only(capsys, policy):
    """``--frontend-ms`` (twin run and compare share it) adds exactly that latency to every
    client-observed first token and finish; the engine's run, ITL and TPOT are untouched."""
    runs = {}
    for ms in ("0", "7.5"):
        assert main(["run", "--json", "--no-progress", "--duration", "30", "--policy", policy,
                     "--frontend-ms", ms]) == 0
        runs[ms] = json.loads(capsys.readouterr().out)
    a, b = runs["0"], runs["7.5"]
    assert "frontend_ms" not in a and b["frontend_ms"] == 7.5
    for k in ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "e2e_ms_mean"):
        assert b[k] == pytest.approx(a[k] + 7.5, abs=1e-6), k
    for k in ("itl_ms_mean", "engine_steps", "requests_finished", "throughput_rps"):
        assert b[k] == a[k], k
    # TPOT divides (E2E + f) - (TTFT + f): the shift cancels up to the last bit of the subtraction
    assert b["tpot_ms_mean"] == pytest.approx(a["tpot_ms_mean"], rel=1e-12)


@pytest.mark.parametrize("value", ["-1", "nan", "abc"])
def test_run_frontend_latency_bad_values_refused(capsys, value):
    assert main(["run", "--frontend-ms", value, "--duration", "10"]) == 2
    assert "--frontend-ms" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["vllm", "slora"])
def test_run_serving_host_time_lengthens_every_step(capsys, policy):
    """``--serving-us`` (twin run, compare and reproduce share it) adds host time per running request to
    every engine step: the steps, and so ITL and TPOT, grow; the summary names the value."""
    runs = {}
    for us in ("0", "19"):
        assert main(["run", "--json", "--no-progress", "--duration", "30", "--policy", policy,
                     "--serving-us", us]) == 0
        runs[us] = json.loads(capsys.readouterr().out)
    a, b = runs["0"], runs["19"]
    assert "serving_us_per_running" not in a and b["serving_us_per_running"] == pytest.approx(19.0)
    assert b["itl_ms_mean"] > a["itl_ms_mean"] and b["tpot_ms_mean"] > a["tpot_ms_mean"]
    assert b["requests_arrived"] == a["requests_arrived"]


@pytest.mark.parametrize("value", ["-1", "nan", "abc"])
def test_run_serving_host_time_bad_values_refused(capsys, value):
    assert main(["run", "--serving-us", value, "--duration", "10"]) == 2
    assert "--serving-us" in capsys.readouterr().err


def test_run_rank_tile_cost_prices_rank_32_slots_only(capsys):
    """``--rank-tile-cost`` (twin run, compare and reproduce share it): rank-32 slots' second shrink tile at that
    share of the first, so their steps are shorter; rank-16 slots are unchanged; the summary names the value."""
    runs = {}
    for ranks in ("32", "16"):
        for cost in (None, "0.25"):
            argv = ["run", "--json", "--no-progress", "--duration", "30", "--ranks", ranks, "--slots", "16"]
            assert main(argv + (["--rank-tile-cost", cost] if cost else [])) == 0
            runs[ranks, cost] = json.loads(capsys.readouterr().out)
    assert runs["32", "0.25"]["rank_tile_cost"] == 0.25 and "rank_tile_cost" not in runs["32", None]
    assert runs["32", "0.25"]["itl_ms_mean"] < runs["32", None]["itl_ms_mean"]
    assert runs["16", "0.25"]["itl_ms_mean"] == runs["16", None]["itl_ms_mean"]


@pytest.mark.parametrize("argv, what", [
    (["--rank-tile-cost", "-1"], "--rank-tile-cost"),
    (["--rank-tile-cost", "abc"], "--rank-tile-cost"),
    (["--rank-tile-cost", "0.3", "--system", "slora"], "S-LoRA"),
    (["--rank-tile-cost", "0.3", "--profile", "llama-2-7b_h100_vllm050"], "has no rank tiles"),
])
def test_run_rank_tile_cost_bad_input_refused(capsys, argv, what):
    assert main(["run", "--duration", "10", "--no-progress"] + argv) == 2
    err = capsys.readouterr().err
    assert what in err and "Traceback" not in err


def test_run_whose_scheduler_admits_nothing_says_so(monkeypatch, capsys):
    """``twin run`` with a scheduler that never admits a request: a ``twin run: warning:`` line naming the
    scheduler and a ``note`` row in the summary, not a Python warning."""
    import twin.cli
    from twin.interfaces import Scheduler
    from twin.registry import make_cache

    class NeverAdmit(Scheduler):
        name = "never-admit"

        def on_preempt(self, rid):
            pass

        def schedule_waiting(self, ctx):
            return None

    real = twin.cli.simulate
    monkeypatch.setattr(twin.cli, "simulate", lambda *a, **k: real(*a, **{**k, "scheduler_obj": NeverAdmit(),
                                                                          "cache_obj": make_cache("lru")}))
    assert main(["run", "--no-progress", "--duration", "5"]) == 0
    out, err = capsys.readouterr()
    assert "twin run: warning: no request was admitted: scheduler 'never-admit'" in err, err
    assert "NothingAdmittedWarning" not in err and "Traceback" not in err
    assert "note" in out and "no request was admitted" in out


def test_unknown_policy_lists_available(capsys):
    assert main(["run", "--policy", "no-such-policy", "--duration", "10"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'no-such-policy'" in err and "vllm" in err


def test_impossible_config_is_refused(capsys):
    assert main(["run", "--slots", "64", "--ranks", "128", "--duration", "10"]) == 2
    assert "vLLM would refuse to start" in capsys.readouterr().err


def test_policies_listing(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "fcfs" in out and "lru" in out and "vllm" in out


def test_every_engine_config_field_has_help():
    for f in dataclasses.fields(EngineConfig):
        assert f.metadata.get("help"), f.name


def test_run_flags_round_trip_to_the_defaults():
    args = make_parser().parse_args(["run"])
    assert from_namespace(RunConfig, args) == RunConfig()
    assert RunConfig().max_num_seqs is None and RunConfig().max_batched_tokens is None  # vLLM's for the GPU
    assert (EngineConfig().max_num_seqs, EngineConfig().max_num_batched_tokens) == vllm_default_limits(None)
    assert RunConfig().tp == EngineConfig().tensor_parallel


@pytest.mark.parametrize("options, profile, want", [
    ({}, None, (256, 2048)),                                     # the H100-64GB calibration: below 70 GiB
    ({"gpu_mem_gb": 80.0}, None, (1024, 8192)),                  # 80 GB (a GPU's GB: GiB) >= 70 GiB
    ({"gpu_mem_gb": 70.0}, None, (1024, 8192)),
    ({"gpu_mem_gb": 69.9}, None, (256, 2048)),                   # < 70 GiB
    ({}, "llama-2-7b_a100-80gb_vidur", (1024, 8192)),
    ({"max_num_seqs": 64}, "llama-2-7b_a100-80gb_vidur", (64, 8192)),
    ({"max_batched_tokens": 4096}, "llama-2-7b_a100-80gb_vidur", (1024, 4096)),
    ({}, "llama-2-7b_a40_vidur", (256, 2048)),
])
def test_batch_limits_default_to_vllms_for_the_gpus_memory(options, profile, want):
    """vLLM 0.8.5's server picks max_num_seqs / max_num_batched_tokens by the device's memory
    (EngineArgs._set_default_args_v1: >= 70 GiB -> 1024 / 8192, else 256 / 2048); a given value is kept."""
    assert engine_limits(RunConfig(profile=profile, **options), load_profile(profile)) == want
    assert vllm_default_limits(70 * 2**30) == (1024, 8192) and vllm_default_limits(70 * 2**30 - 1) == (256, 2048)


def test_a_run_records_the_batch_limits_it_used(tmp_path, capsys):
    assert main(["run", "--duration", "5", "--profile", "llama-2-7b_a100-80gb_vidur", "--out", str(tmp_path)]) == 0
    cfg = json.loads((tmp_path / "summary.json").read_text())["config"]
    assert (cfg["max_num_seqs"], cfg["max_num_batched_tokens"]) == (1024, 8192)


def test_a_default_batch_limit_below_the_given_other_names_where_it_came_from(capsys):
    assert main(["run", "--duration", "5", "--max-num-seqs", "4096"]) == 2
    err = capsys.readouterr().err
    assert "--max-batched-tokens 2048 (vLLM's default on H100-64GB) is below --max-num-seqs 4096" in err
    assert "Traceback" not in err
    assert main(["run", "--duration", "5", "--max-num-seqs", "9000", "--gpu-mem-gb", "80"]) == 2
    assert "--max-batched-tokens 8192 (vLLM's default on a GPU of 80 GB) is below --max-num-seqs 9000" in (
        capsys.readouterr().err)
    assert engine_limits(RunConfig(max_num_seqs=4096, gpu_mem_gb=80.0), load_profile(None)) == (4096, 8192)


def test_run_and_compare_share_their_scenario_flags():
    run = make_parser().parse_args(["run"])
    cmp = make_parser().parse_args(["compare", "--policies", "vllm,chameleon-nocache", "--rps", "1,2.5"])
    shared = [f.name for f in dataclasses.fields(RunConfig) if f.name not in NOT_COMPARE_OPTIONS]
    for name in shared:
        assert getattr(cmp, name) == getattr(run, name), name
    assert from_namespace(CompareConfig, cmp).policies == ["vllm", "chameleon-nocache"]
    assert from_namespace(CompareConfig, cmp).rps == [1.0, 2.5]


def test_one_slot_default_capped_at_the_adapters():
    assert RunConfig().adapter_slots(100) == DEFAULT_ADAPTER_SLOTS == 16
    assert RunConfig().adapter_slots(5) == 5
    assert RunConfig().adapter_slots(0) == 1
    assert RunConfig(slots=32).adapter_slots(5) == 32


def test_list_flags_use_the_shared_parser(capsys):
    args = make_parser().parse_args(["run", "--ranks", "8,16,32", "--trace-opt", "length_scale=0.5",
                                     "--trace-opt", "lengths=sharegpt"])
    run = from_namespace(RunConfig, args)
    assert run.ranks == [8, 16, 32]
    assert dict(run.trace_options) == {"length_scale": 0.5, "lengths": "sharegpt"}
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--ranks", "8,x"])
    assert "argument --ranks: 'x' is not a valid int" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--ranks", "8-16-32"])  # a range or a list? commas only on the CLI
    assert "list the values with commas, e.g. 8,16,32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--trace-opt", "novalue"])
    assert "--trace-opt takes KEY=VALUE" in capsys.readouterr().err


def test_flags_from_a_dataclass():
    @dataclasses.dataclass
    class Options:
        count: int = dataclasses.field(default=3, metadata={"help": "how many"})
        rate: float | None = dataclasses.field(default=None, metadata={"help": "rate", "flag": "--r"})
        verbose: bool = dataclasses.field(default=False, metadata={"help": "talk"})
        internal: str = "not a flag"

    p = argparse.ArgumentParser()
    add_arguments(p, Options)
    assert from_namespace(Options, p.parse_args([])) == Options()
    got = from_namespace(Options, p.parse_args(["--count", "5", "--r", "0.5", "--verbose"]))
    assert (got.count, got.rate, got.verbose, got.internal) == (5, 0.5, True, "not a flag")
    assert "how many (default: 3)" in " ".join(p.format_help().split())
    with pytest.raises(ValueError, match="no field"):
        add_arguments(argparse.ArgumentParser(), Options, exclude=["nope"])


def test_a_closed_stdout_pipe_stops_quietly(monkeypatch, capsys):
    """`twin ... | head`: the reader going away is not reported as an unusable path."""
    import argparse

    import twin.cli as cli

    def closed(_args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.make_parser()
    monkeypatch.setattr(cli, "make_parser", lambda: parser)
    parser.set_defaults(func=closed)
    ns = parser.parse_args(["policies"])
    monkeypatch.setattr(parser, "parse_known_args",
                        lambda argv=None: (argparse.Namespace(**{**vars(ns), "func": closed}), []))
    assert cli.main(["policies"]) == 1
    assert capsys.readouterr().err == ""


def test_a_run_into_an_earlier_runs_out_replaces_its_figures(tmp_path, capsys):
    """Without --plot, the figures an earlier run left in --out go (they would describe another run)."""
    assert main(["run", "--no-progress", "--duration", "20", "--out", str(tmp_path), "--plot"]) == 0
    assert (tmp_path / "latency.png").exists() and (tmp_path / "timeline.png").exists()
    assert main(["run", "--no-progress", "--duration", "20", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "steps.parquet", "summary.json"]


def test_a_users_files_in_out_are_neither_removed_nor_overwritten(tmp_path, capsys):
    """A folder that holds no earlier run keeps a user's figures of the same names; one whose summary.json is not a
    twin run's is refused before any work (the file would be overwritten)."""
    (tmp_path / "latency.png").write_bytes(b"a user's figure")
    assert main(["run", "--no-progress", "--duration", "20", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "latency.png").read_bytes() == b"a user's figure"
    other = tmp_path / "other"
    other.mkdir()
    for text in ('{"accuracy": 0.9}', "not json", "[1, 2]"):
        (other / "summary.json").write_text(text)
        capsys.readouterr()
        assert main(["run", "--no-progress", "--duration", "20", "--out", str(other)]) == 2
        err = capsys.readouterr().err
        assert "summary.json is not the summary of a twin run and would be overwritten; give a new or empty" in err
        assert (other / "summary.json").read_text() == text and not (other / "requests.parquet").exists()


def _options_of(parser: argparse.ArgumentParser, path: str):
    """``(command, action)`` of every argument of ``parser`` and its subcommands, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_of(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_of_every_command_says_what_it_does():
    """``--help`` of each command (``twin``, its subcommands and theirs) describes every option and
    positional argument: options without help used to read as bare ``--seed SEED`` / ``--json``."""
    actions = list(_options_of(make_parser(), "twin"))
    commands = {path for path, _ in actions}
    assert {"twin run", "twin configure train", "twin calibrate bench", "twin traces fetch", "twin sweep"} <= commands
    bare = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in actions
            if a.help is None or not str(a.help).strip()]
    assert not bare, f"options without help text: {bare}"


def test_each_rejection_reason_points_to_an_option_twin_run_takes(capsys):
    """The console names the option behind each rejection reason (``[--slora-max-prompt-len]``): every
    reason but "LoRA is disabled" has one, and each is an option of ``twin run``."""
    from twin.requests import REJECT_OPTIONS, REJECT_REASONS, with_option

    run_flags = {f for a in make_parser()._subparsers._group_actions[0].choices["run"]._actions
                 for f in a.option_strings}
    assert set(REJECT_OPTIONS) == set(REJECT_REASONS) - {"", "LoRA request but LoRA is disabled"}
    for reason, opts in REJECT_OPTIONS.items():
        assert all(o in run_flags for o in opts.split(" / ")), (reason, opts)
        assert with_option(reason) == f"{reason} [{opts}]"
    assert main(["run", "--policy", "slora", "--duration", "30", "--no-progress"]) == 0
    assert "prompt longer than the S-LoRA server's max prompt length [--slora-max-prompt-len])" in \
        capsys.readouterr().out


def test_the_command_starts_without_the_fitting_plotting_or_learning_libraries():
    """Every ``twin`` command builds the whole parser, so what the command modules import at file level is a
    start-up cost of each (``twin run`` used to import scipy.optimize twice over: the calibration commands'
    fitting and the ShareGPT length solver). Those imports belong to the commands that run them."""
    import subprocess
    import sys

    heavy = ["scipy.optimize", "scipy.special", "calibration.fitting.core", "sklearn", "matplotlib", "torch", "dask", "ray"]
    code = ("import sys, twin.cli, twin.scenario, twin.simulate; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_run_table_says_what_was_served(capsys, tmp_path):
    """``twin run``'s table names the adapters the workload requested, the GPU adapter slots and the largest
    rank (S-LoRA: one unified pool, no slots; no adapters: the base model only)."""
    assert main(["run", "--duration", "30", "--slots", "8", "--no-progress", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    req = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    used = req["adapter_id"][req["adapter_id"] >= 0]
    want = f"{used.nunique()} / 8 / {int(req['adapter_rank'].max())}"
    assert f"adapters requested / slots / max rank    {want}\n" in out, out
    assert main(["run", "--duration", "30", "--policy", "slora", "--no-progress"]) == 0
    assert " / unified pool / " in capsys.readouterr().out
    assert main(["run", "--duration", "30", "--adapters", "0", "--no-progress"]) == 0
    assert "adapters requested / slots / max rank    none: the base model only" in capsys.readouterr().out


def test_run_flags_are_grouped_in_the_help(capsys):
    """``twin run --help`` (and ``twin compare --help``) lists the scenario flags under sections
    (workload, policy, server, S-LoRA server, run, fitted terms): every RunConfig flag in exactly one."""
    flagged = [f.name for f in dataclasses.fields(RunConfig) if "help" in f.metadata]
    grouped = [name for names in RunConfig.FLAG_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(flagged)
    for command in ("run", "compare"):
        with pytest.raises(SystemExit):
            make_parser().parse_args([command, "--help"])
        out = capsys.readouterr().out
        left_out = NOT_COMPARE_OPTIONS if command == "compare" else ()
        for title, names in RunConfig.FLAG_GROUPS.items():
            shown = f"\n{title}:\n" in out
            assert shown == any(n not in left_out for n in names), (command, title)
        server = out.split("\nserver (profile, GPU, vLLM engine):\n")[1].split("\n\n")[0]
        assert "--max-num-seqs" in server and "--rps" not in server


def test_the_front_end_latency_named_in_the_help_is_the_one_validate_uses():
    """``twin run --help`` names the front-end latency ``twin validate`` adds (it said 7.9 ms after the constant
    was refitted to 8.6); the core does not import the validation package, so this test keeps the two in step."""
    import re

    from twin.scenario import RunConfig
    from twin.validation.specs import FRONTEND_LATENCY_S

    help_text = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(RunConfig)}["frontend_ms"]
    assert [float(x) for x in re.findall(r"uses ([0-9.]+)", help_text)] == [round(FRONTEND_LATENCY_S * 1000, 1)]


def test_run_table_counts_the_adapters_of_the_requests_that_arrived(capsys, tmp_path):
    """With ``--horizon`` before the workload's end, the requests past it never arrive: the table's adapters are
    those the arrived requests asked for (it counted the whole workload's)."""
    assert main(["run", "--rps", "3", "--horizon", "40", "--no-progress", "--out", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    req = pd.read_parquet(tmp_path / "h" / "requests.parquet")
    came = req[(req["outcome"] != "not_arrived") & (req["adapter_id"] >= 0)]
    assert came["adapter_id"].nunique() < req["adapter_id"][req["adapter_id"] >= 0].nunique()
    assert f"adapters requested / slots / max rank    {came['adapter_id'].nunique()} / " in out, out


def test_the_default_max_lora_rank_is_one_vllm_accepts(tmp_path):
    """Without --max-lora-rank, a vLLM run pads to the smallest rank of vLLM's list that holds the largest adapter
    (a workload of rank-33 adapters ran at max rank 33, which vLLM refuses; --max-lora-rank 33 is refused too)."""
    from traces.registry import get_workload
    from twin.perf.profile import load_profile
    from twin.scenario import build_engine_config

    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [100, 100], "output_tokens": [10, 10],
                  "adapter_id": [0, 1], "adapter_rank": [33, 20]}).to_csv(tmp_path / "w.csv", index=False)
    w = get_workload(str(tmp_path / "w.csv"))
    prof = load_profile(None)
    assert build_engine_config(RunConfig(trace=str(tmp_path / "w.csv")), w, prof).max_lora_rank == 64
    assert build_engine_config(RunConfig(trace=str(tmp_path / "w.csv"), max_lora_rank=128), w, prof).max_lora_rank \
        == 128
    assert build_engine_config(RunConfig(trace="synthetic"), get_workload("synthetic", duration=30.0), prof
                               ).max_lora_rank is None  # (ranks 8/16/32: the workload's largest, as before)


def test_policy_options_reach_the_policy_and_replay(tmp_path, capsys):
    """--scheduler-opt / --cache-opt set a policy's constructor arguments (they were reachable from Python
    only): Chameleon's quota SLO changes its quotas, the scenario records them and a --config replay
    repeats the run."""
    base = ["run", "--json", "--no-progress", "--policy", "chameleon"]
    assert main(base) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*base, "--scheduler-opt", "slo_s=0.5", "--cache-opt", "freq_window_s=60", "--out",
                 str(tmp_path / "a")]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert tight["chameleon_quotas"] != default["chameleon_quotas"]
    sc = tight["scenario"]
    assert sc["scheduler_options"] == {"slo_s": 0.5} and sc["scheduler_params"]["slo_s"] == 0.5
    assert sc["cache_options"] == {"freq_window_s": 60} and sc["cache_params"]["freq_window_s"] == 60
    assert main(["run", "--json", "--no-progress", "--config", str(tmp_path / "a" / "summary.json")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["chameleon_quotas"] == tight["chameleon_quotas"] and again["ttft_ms_p99"] == tight["ttft_ms_p99"]
    f = tmp_path / "s.toml"  # a scenario file's table
    f.write_text('policy = "chameleon"\n[scheduler_options]\nslo_s = 0.5\n[cache_options]\nfreq_window_s = 60\n')
    assert main(["run", "--json", "--no-progress", "--config", str(f)]) == 0
    assert json.loads(capsys.readouterr().out)["chameleon_quotas"] == tight["chameleon_quotas"]


@pytest.mark.parametrize("argv, message", [
    (["--policy", "chameleon", "--scheduler-opt", "slo_s=-1"], "--scheduler-opt: scheduler 'chameleon' "
                                                               "(ChameleonScheduler): option slo_s = -1"),
    (["--policy", "chameleon", "--scheduler-opt", "slo=5"], "takes no option(s) 'slo'; its options: k, "),
    (["--scheduler-opt", "slo_s=5"], "--scheduler-opt: scheduler 'fcfs' takes no option(s) 'slo_s'"),
    (["--policy", "chameleon", "--scheduler-opt", "slo_s=1", "--scheduler-opt", "slo_s=2"],
     "--scheduler-opt slo_s=... is given twice"),
    (["--policy", "chameleon", "--cache-opt", "freq_window_s=x"],
     "--cache-opt: adapter-cache policy 'chameleon' (ChameleonCache): option freq_window_s = 'x': give a number"),
    # the kind is checked before the constructor's own range checks ('nan' <= 1: a TypeError before)
    (["--policy", "chameleon", "--scheduler-opt", "accuracy=nan"],
     "--scheduler-opt: scheduler 'chameleon' (ChameleonScheduler): option accuracy = 'nan': give a number"),
    (["--policy", "chameleon", "--scheduler-opt", "accuracy=2"],
     "--scheduler-opt: chameleon: accuracy must be in [0, 1], got 2 (of accuracy=2); give a value it takes"),
    (["--scheduler-opt", "slo_s"], "--scheduler-opt takes KEY=VALUE, got 'slo_s'"),
])
def test_bad_policy_options_are_refused_before_any_work(argv, message, capsys):
    assert main(["run", "--duration", "10", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("opt, message", [
    ("max_scan=2.5", "option max_scan = 2.5: give a whole number (default 16)"),
    ("bypass=maybe", "option bypass = 'maybe': give True or False (default True)"),
    ("slo_s=abc", "option slo_s = 'abc': give a number (default None)"),  # (failed later inside a hook)
    ("slo_s=True", "option slo_s = True: give a number"),
    ("name=x", "scheduler 'chameleon' takes no option(s) 'name'"),  # (collided with make_scheduler's own name)
])
def test_a_built_in_option_of_the_wrong_kind_is_refused(opt, message, capsys):
    """A built-in's options have the kind its constructor declares (bool, int, float): max_scan=2.5 and
    bypass='maybe' ran silently."""
    assert main(["run", "--duration", "5", "--policy", "chameleon", "--scheduler-opt", opt]) == 2
    assert message in capsys.readouterr().err


def test_a_cache_option_the_cache_does_not_take_lists_its_options(capsys):
    """A cache passing **memory on answered with Python's bare 'unexpected keyword argument'."""
    assert main(["run", "--duration", "5", "--policy", "chameleon", "--cache", "lru", "--cache-opt",
                 "freq_window_s=60"]) == 2
    assert ("adapter-cache policy 'lru' takes no option(s) 'freq_window_s'; its options: adapter_memory, "
            in capsys.readouterr().err)


def test_a_plug_in_that_does_not_store_its_arguments_is_refused_on_the_command_line(capsys):
    """`twin run --cache NAME` of such a plug-in ended in a bare AttributeError from get_params()."""
    from policies.lru import LRUCache
    from twin import registry

    class NotStored(LRUCache):
        name = "t-cli-notstored"

        def __init__(self, weight: float = 1.0, **memory):
            super().__init__(**memory)
            self.w = weight
    registry.register_cache(NotStored)
    try:
        assert main(["run", "--duration", "5", "--cache", "t-cli-notstored"]) == 2
        assert "constructor argument(s) weight are not stored under their own names" in capsys.readouterr().err
    finally:
        registry.CACHES.pop("t-cli-notstored", None)


def test_run_table_says_why_the_mean_itl_is_empty_beside_its_p99(capsys):
    """Nothing finished by the horizon: the mean ITL (finished requests) is empty while the P99 (every emitted
    token) is not, and the table says which."""
    assert main(["run", "--duration", "5", "--rps", "1", "--horizon", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ITL ms mean / p99"))
    mean, p99 = row.split(None, 5)[-1].split(" / ")
    assert mean == "- (no finished request of 2+ tokens)" and float(p99) > 0


@pytest.mark.parametrize("policy", ["vllm", "slora"])
def test_the_summarys_config_records_the_settings_the_engine_resolved(tmp_path, capsys, policy):
    """``config`` records the values used: the settings left to the engine (None) hold what it chose (the largest
    adapter's rank, the profile's KV capacity and target modules), as the console table shows them."""
    assert main(["run", "--no-progress", "--duration", "10", "--policy", policy, "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    c = s["config"]
    assert c["kv_capacity_tokens"] == s["kv_capacity_tokens"]
    assert c["lora_targets"] == ",".join(load_profile(s["profile"]).lora_targets)
    if policy == "vllm":
        assert c["max_lora_rank"] == 32
