"""The requests' front-end latency outside the engine (issue 17): client-observed TTFT and E2E."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.helpers import random_workload, real_run_row
from twin.config import EngineConfig
from twin.simulate import simulate
from twin.validation.specs import FRONTEND_LATENCY_S, spec_from_row


def _pair(fs: float, **kw):
    w = random_workload(n=300, seed=5)
    a = simulate(w, None, EngineConfig(max_loras=4), horizon_s=kw.get("horizon_s"))
    b = simulate(w, None, EngineConfig(max_loras=4), horizon_s=kw.get("horizon_s"), frontend_s=fs)
    return a, b


def test_frontend_shifts_ttft_and_e2e_only():
    """The engine runs identically; every finished request's TTFT and E2E grow by exactly the
    latency, TPOT and ITL do not; the summary names the latency only when it is set."""
    fs = 0.0125
    a, b = _pair(fs)
    sa, sb = a.summary, b.summary
    assert sa["engine_steps"] == sb["engine_steps"] and sa["requests_finished"] == sb["requests_finished"]
    ra, rb = a.requests, b.requests
    fin = (ra["outcome"] == "finished").to_numpy()
    assert fin.sum() > 100
    np.testing.assert_allclose(rb["ttft_s"][fin], ra["ttft_s"][fin] + fs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rb["e2e_s"][fin], ra["e2e_s"][fin] + fs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rb["tpot_s"][fin], ra["tpot_s"][fin], rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(rb["ttft_s"], rb["first_token_s"] - rb["arrival_s"], atol=1e-12)
    for k in ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "e2e_ms_mean"):
        assert sb[k] == pytest.approx(sa[k] + fs * 1000, abs=1e-6)
    for k in ("itl_ms_mean", "itl_ms_p50", "itl_ms_p99", "tpot_ms_mean", "queue_ms_mean", "total_tok_s"):
        assert sb[k] == pytest.approx(sa[k], rel=1e-9)
    assert "frontend_ms" not in sa and sb["frontend_ms"] == pytest.approx(12.5)


def test_zero_latency_is_the_engine_exactly():
    a, b = _pair(0.0)
    assert a.summary == {**b.summary, "wall_s": a.summary["wall_s"], "x_realtime": a.summary["x_realtime"]}


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf")])
def test_bad_latency_is_refused(bad):
    with pytest.raises(ValueError, match="frontend_s"):
        simulate(random_workload(n=5, seed=1), None, EngineConfig(max_loras=4), frontend_s=bad)


def test_spec_and_cli_carry_the_constant():
    from twin.validation.cli import check_args, register_cli

    row = real_run_row()
    assert spec_from_row(row).frontend_s == FRONTEND_LATENCY_S
    assert spec_from_row(row, frontend_s=0.0).frontend_s == 0.0
    assert 0.001 < FRONTEND_LATENCY_S < 0.05  # milliseconds, a request's path outside the engine
    parser = argparse.ArgumentParser(prog="twin")
    register_cli(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["validate"]).frontend_ms == pytest.approx(FRONTEND_LATENCY_S * 1000)
    with pytest.raises(ValueError, match="--frontend-ms"):
        check_args(parser.parse_args(["validate", "--frontend-ms", "-3"]))
    check_args(parser.parse_args(["validate", "--frontend-ms", "0"]))


@pytest.mark.data
def test_fit_runs_are_fit_split_runs_without_a_queue(real_data):
    from twin.validation.frontend import MAX_SERVED, frontend_fit_runs
    from twin.validation.specs import load_real

    real = load_real(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    runs = frontend_fit_runs(real)
    assert len(runs) == 9
    assert set(runs["source"]) == {"dt_modelling"}
    assert (runs["ts_max_waiting"] == 0).all() and (runs["served_adapters"] <= MAX_SERVED).all()
    # the ml_test rows do not change the selection
    assert frontend_fit_runs(real[real["source"] == "dt_modelling"])["run_id"].tolist() == runs["run_id"].tolist()


def test_a_profile_file_is_found_by_its_name_afterwards(tmp_path):
    """``twin validate --profile FILE``: the summary's diagnostics look the profile up by name."""
    import json

    from twin.perf.profile import PROFILE_DIR
    from twin.validation.profiles import cached_profile

    d = json.loads((PROFILE_DIR / "llama-3.1-8b_h100_vllm085.json").read_text())
    d["name"] = "a-copy-under-another-name"
    f = tmp_path / "copy.json"
    f.write_text(json.dumps(d))
    p = cached_profile(str(f))
    assert cached_profile("a-copy-under-another-name") is p
