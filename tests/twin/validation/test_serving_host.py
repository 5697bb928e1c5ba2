"""The serving path's host time per running request and step (issue 17, item 1): validation wiring, fit runs."""

from __future__ import annotations

import argparse

import pytest

from tests.helpers import real_run_row
from twin.validation.specs import SERVING_S_PER_RUNNING, spec_from_row


def test_spec_and_cli_carry_the_constant():
    from twin.validation.cli import check_args, register_cli

    row = real_run_row()
    assert spec_from_row(row).serving_s_per_running == SERVING_S_PER_RUNNING
    assert spec_from_row(row, serving_s_per_running=0.0).serving_s_per_running == 0.0
    assert 1e-6 < SERVING_S_PER_RUNNING < 1e-4  # microseconds of host time per running request and step
    parser = argparse.ArgumentParser(prog="twin")
    register_cli(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["validate"]).serving_us == pytest.approx(SERVING_S_PER_RUNNING * 1e6)
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ValueError, match="--serving-us"):
            check_args(parser.parse_args(["validate", "--serving-us", bad]))
    check_args(parser.parse_args(["validate", "--serving-us", "0"]))


def test_recreation_applies_it_to_the_engine():
    """A re-created run with the constant has longer steps than without (and reports it)."""
    from twin.validation.recreate import simulate_run

    row = real_run_row(rates="3.2", served_adapters=8, adapter_slots=8, max_cpu_loras=8, benchmark_time_s=120.0)
    a = simulate_run(spec_from_row(row), None)
    b = simulate_run(spec_from_row(row, serving_s_per_running=0.0), None)
    assert a["twin_status"] == b["twin_status"] == "ok"
    assert a["twin_itl"] > b["twin_itl"]


@pytest.mark.data
def test_fit_runs_are_unsaturated_fit_split_runs_with_a_large_batch(real_data):
    from twin.validation.serving_host import MAX_KV_USAGE, MIN_RUNNING, serving_fit_runs
    from twin.validation.specs import load_real

    real = load_real(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    runs = serving_fit_runs(real)
    assert len(runs) == 32
    assert set(runs["source"]) == {"dt_modelling"}
    assert (runs["ts_mean_kv_usage"] < MAX_KV_USAGE).all() and (runs["ts_mean_running"] >= MIN_RUNNING).all()
    # the ml_test rows do not change the selection
    assert serving_fit_runs(real[real["source"] == "dt_modelling"])["run_id"].tolist() == runs["run_id"].tolist()
