"""The ``interval`` profile variant (issue 17): the scheduler form ``lora_queue_walk``, its fit on the
token interval of running requests (:mod:`calibration.fitting.serving_interval`) and the 90 %-crossing
score of a validation pass (:mod:`twin.validation.crossings`)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from twin.perf.forms import FORMS, LoraQueueScheduler, LoraQueueWalkScheduler
from twin.perf.profile import PROFILE_DIR, load_profile
from twin.validation.crossings import crossings_from_per_run, summary

LLAMA = "llama-3.1-8b_h100_vllm085"
VARIANT = LLAMA + "_interval"


def test_walk_form_adds_k_walk_per_blocked_waiting_request():
    assert FORMS[("scheduler", "lora_queue_walk")] is LoraQueueWalkScheduler
    base = {"k0": 5e-5, "k1": 1.6e-6, "k1_sq": 9e-10, "k2": 1e-12, "k_blocked": 2.8e-7}
    q = LoraQueueScheduler(params=base)
    w0 = LoraQueueWalkScheduler(params={**base, "k_walk": 0.0})
    w = LoraQueueWalkScheduler(params={**base, "k_walk": 6e-7})
    fq, f0, fw = q.scalar(), w0.scalar(), w.scalar()
    rng = np.random.default_rng(1)
    for _ in range(300):
        R, W, G, N = int(rng.integers(0, 600)), int(rng.integers(0, 30000)), int(rng.integers(0, 400)), int(rng.integers(1, 500))
        assert f0(R, W, G, N) == fq(R, W, G, N)  # k_walk = 0 is the fitted scheduler, bit for bit
        blocked = max(1.0 - G / N, 0.0) if G > 0 else 0.0
        assert fw(R, W, G, N) == pytest.approx(fq(R, W, G, N) + 6e-7 * W * blocked, rel=1e-12, abs=1e-15)
        assert fw(R, W, G, N) == pytest.approx(float(w.predict(R, W, G, N)), rel=1e-12, abs=1e-15)
    assert "k_walk" in LoraQueueWalkScheduler.waiting_params  # the engine re-evaluates it when the queue changes


def test_variant_is_off_by_default_and_changes_only_two_terms():
    default = load_profile(LLAMA)
    assert load_profile(None).name != VARIANT
    assert default.components["scheduler"].form == "lora_queue"
    v = load_profile(VARIANT)
    assert v.components["scheduler"].form == "lora_queue_walk"
    assert v.raw["provenance"]["validation_data_used"] is False
    assert v.raw["provenance"]["variant"]["of"] == LLAMA
    for kind in ("backbone", "lora", "load", "kv"):
        assert v.raw["components"][kind]["params"] == default.raw["components"][kind]["params"], kind
    dp, vp = default.components["scheduler"].params, v.components["scheduler"].params
    assert {k: vp[k] for k in dp} == dict(dp)
    assert 1e-7 < vp["k_walk"] < 5e-6  # 0.1-5 us per blocked waiting request and step (fit: ~0.6 us)
    assert 1e-4 < v.components["mixed"].params["h_adapter"] < 1e-3
    # a step without blocked requests is unchanged apart from the refitted mixed term
    args = dict(prefill_tokens=0, n_dec=100, ctx_tokens=40000, n_req=100, active=20, max_rank=16, slots=32,
                running=100, waiting=0, served=64)
    assert v.step_s(**args) == default.step_s(**args)
    assert v.step_s(**{**args, "waiting": 5000}) > default.step_s(**{**args, "waiting": 5000})


def test_crossings_from_per_run():
    rows = []
    for served, real, twin in ((8, 1.0, 1.0), (16, 0.95, 0.96), (32, 0.80, 0.85), (64, 0.5, 0.5)):
        rows.append({"source": "dt_modelling", "scenario": "s", "adapter_slots": 8, "served_adapters": served,
                     "status": "ok", "offered_tok_s_est": 1000.0, "real_throughput": real * 1000.0,
                     "twin_throughput": twin * 1000.0})
    rows.append({**rows[0], "source": "ml_test"})
    cr = crossings_from_per_run(pd.DataFrame(rows), "dt_modelling")
    assert cr["side"].tolist() == ["last_above", "first_below"]
    assert cr["served_adapters"].tolist() == [16, 32]
    assert cr["twin_minus_real_points"].tolist() == pytest.approx([1.0, 5.0])
    assert cr["within_tolerance"].tolist() == [True, False]
    s = summary(cr)
    assert s["crossings"] == 2 and s["within_2_points"] == 1 and s["largest_abs_points"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="offered_tok_s_est"):
        crossings_from_per_run(pd.DataFrame(rows).drop(columns=["offered_tok_s_est"]))


def test_interval_fit_reproduces_the_committed_variant(real_data):
    from calibration.fitting.serving_interval import SOURCES, fit_interval, interval_obs, interval_variant
    from calibration.fitting.tables import Vllm085Tables

    t = Vllm085Tables.read(real_data / "calibration" / "vllm085_h100", "llama-3.1-8b")
    prof = load_profile(LLAMA)
    obs = interval_obs(t, prof.without("mixed"))
    q = obs[obs["source"] == SOURCES[0]]
    # Little's law agrees with the client's ITL in the queued runs, and exceeds duration / steps
    assert 0.9 < float((q["little_ms"] / q["itl_ms"]).median()) < 1.0
    assert float((q["little_ms"] / q["dur_step_ms"]).median()) > 1.05
    fit = fit_interval(t, prof)
    c = fit["candidates"]["prefill_adapters+blocked_waiting"]
    assert fit["chosen"] == "prefill_adapters+blocked_waiting"
    # the windows (no blocked request) keep their error; the all-waiting form breaks them
    assert c["heldout"][SOURCES[2]]["mape_pct"] < 2.5 < fit["candidates"]["prefill_adapters+waiting"]["heldout"][SOURCES[2]]["mape_pct"]
    raw = json.loads((PROFILE_DIR / f"{LLAMA}.json").read_text())
    out = interval_variant(raw, fit, command="python -m calibration.fitting.serving_interval --write")
    committed = json.loads((PROFILE_DIR / f"{VARIANT}.json").read_text())
    assert out["components"]["scheduler"]["params"] == committed["components"]["scheduler"]["params"]
    assert out["components"]["mixed"]["params"] == committed["components"]["mixed"]["params"]
