"""The light runs' step against their TPOT (issue 17): twin/validation/light_step.py and the kernel grid's
``split64_cost``."""

from __future__ import annotations


import pandas as pd
import pytest

from tests.helpers import assert_one_is_the_profile_and_scalar_is_predict, kernel_grid_lora, lora_steps, random_workload, real_run_row
from twin.config import EngineConfig
from twin.perf.profile import load_profile
from twin.simulate import simulate
from twin.validation.light_step import (light_runs, light_summary, main, step_at_light_mix, with_split64_cost)

LLAMA = "llama-3.1-8b_h100_vllm085"


def _lora(c: float | None):
    return kernel_grid_lora(LLAMA) if c is None else kernel_grid_lora(LLAMA, split64_cost=c)


def test_split64_cost_only_touches_64_split_steps_and_scalar_matches_predict():
    own = load_profile(LLAMA).components["lora"].params["split64_cost"]  # fitted (calibration.fitting.split64)
    assert 0.3 < own < 0.9
    base, same, low = _lora(None), _lora(own), _lora(0.25)
    fb, fs, fl = base.scalar(), same.scalar(), low.scalar()
    for A, r, T, G, R in lora_steps(5, (8, 16, 32)):
        assert_one_is_the_profile_and_scalar_is_predict(fb, fs, fl, low, (A, r, T, G, R))
        if T > 512 and R >= 128:  # (no CUDA-graph padding: 8 splits in the layers and the LM head)
            assert fl(0.0, A, r, T, G, R) == fb(0.0, A, r, T, G, R)
    # a small decode step: cheaper 64-split working blocks, the launched blocks unchanged
    assert fl(0.0, 20, 16, 40, 64, 40) < fb(0.0, 20, 16, 40, 64, 40)
    assert fl(0.0, 0, 16, 40, 64, 40) == fb(0.0, 0, 16, 40, 64, 40) == 0.0


def test_a_run_with_split64_cost_is_exact_against_single_steps():
    prof = with_split64_cost(load_profile(LLAMA), 0.25)
    w = random_workload(n=300, rps=3.0, adapters=24, seed=3, max_prompt=500, max_out=150)
    cfg = EngineConfig(max_loras=16, max_cpu_loras=24, max_lora_rank=16)
    a = simulate(w, prof, cfg, horizon_s=200.0).summary
    b = simulate(w, prof, cfg, horizon_s=200.0, max_run_steps=1).summary
    for k in ("requests_finished", "ttft_ms_mean", "itl_ms_mean", "engine_steps", "total_tok_s"):
        assert a[k] == b[k]
    c = simulate(w, load_profile(LLAMA), cfg, horizon_s=200.0).summary
    assert c["itl_ms_mean"] > a["itl_ms_mean"]  # cheaper small steps


def test_with_split64_cost_refuses_bad_values_and_other_forms():
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="split64"):
            with_split64_cost(load_profile(LLAMA), bad)
    with pytest.raises(ValueError, match="kernel_grid"):
        with_split64_cost(load_profile("llama-2-7b_h100_vllm050"), 0.5)


def _row(**kw):
    base = dict(source="ml_test", ts_mean_running=20.0, ts_mean_waiting=0.0, ts_mean_kv_usage=0.05,
                input_tok_s=2.0 * 222.0, real_tpot=20.0, served_adapters=32, adapter_slots=32,
                rates="0.1-0.05-0.025", ranks="8-16", max_lora_rank=16)
    return real_run_row(**{**base, **kw})


def test_step_at_light_mix_is_the_profiles_step_at_the_runs_composition():
    prof = load_profile(LLAMA)
    runs = pd.DataFrame([_row(run_id="a"), _row(run_id="q", ts_mean_waiting=50.0), _row(run_id="kv",
                                                                                       ts_mean_kv_usage=0.9)])
    assert list(light_runs(runs)["run_id"]) == ["a"]
    mix = step_at_light_mix(runs, prof)
    assert list(mix["run_id"]) == ["a"]
    r = mix.iloc[0]
    f = 2.0 * 0.020  # 2 requests/s x 20 ms
    assert r["prefill_share"] == pytest.approx(f)
    C = 0.05 * prof.kv_capacity_tokens(32, 16)
    d = prof.step_s(0, 20, C, 20, r["adapters"], 16, 32, 20.0, 0.0, 32)
    p = prof.step_s(222, 19, C, 20, r["adapters"], 16, 32, 20.0, 0.0, 32)
    assert r["model_step_ms"] == pytest.approx(((1 - f) * d + f * p) * 1000)
    assert r["ratio"] == pytest.approx(20.0 / r["model_step_ms"])
    assert 1.0 < r["adapters"] <= 20.0
    s = light_summary(mix)
    assert s["runs"] == 1 and s["by_slots"]["slots 17-32"]["runs"] == 1 and s["median"] == round(r["ratio"], 4)
    assert light_summary(mix.iloc[0:0]) == {}
    assert step_at_light_mix(runs.drop(columns=["real_tpot"]), prof).empty


def test_cli_refuses_bad_input_before_work(capsys):
    assert main(["--split64-cost", "-1"]) == 2
    assert "--split64-cost" in capsys.readouterr().err
    assert main(["--serving-us", "nan"]) == 2
    assert "--serving-us" in capsys.readouterr().err


def test_cli_on_the_real_runs(real_data, capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "fit" in out and "test" in out and "by slots" in out
    assert main(["--split64-cost", "0.25", "--json"]) == 0
    import json

    s = json.loads(capsys.readouterr().out)
    assert s["dt_modelling"]["runs"] >= 10 and s["ml_test"]["runs"] >= 50
    assert main(["--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(["--no-mixed", "--json"]) == 0
    nomix = json.loads(capsys.readouterr().out)
    for src in ("dt_modelling", "ml_test"):  # a cost taken out: the model step falls, real / model rises
        assert nomix[src]["runs"] == base[src]["runs"] == s[src]["runs"]
        assert nomix[src]["median"] > base[src]["median"] and s[src]["median"] > base[src]["median"]
