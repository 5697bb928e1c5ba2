"""The ``twin`` command: the embedded default scenario, JSON output, files, clear errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from twin.cli import main

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
