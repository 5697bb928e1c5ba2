"""The ``mixed`` profile component: serving time of a step that carries a prefill, per distinct adapter
(:class:`twin.perf.forms.PrefillAdaptersMixed`) or per adapter slot (:class:`~twin.perf.forms.PrefillSlotsMixed`,
the Llama profile's since stop 42), fitted by :mod:`calibration.fitting.mixed` at a fixed point with the kernel
grid's 64-split price (:mod:`calibration.fitting.split64`)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from tests.helpers import random_workload
from twin.config import EngineConfig
from twin.perf.forms import FORMS, PrefillAdaptersMixed, PrefillSlotsMixed
from twin.perf.profile import PROFILE_DIR, Profile, load_profile
from twin.simulate import simulate

LLAMA = "llama-3.1-8b_h100_vllm085"


def _with_h(h: float) -> Profile:
    """The Llama profile with its ``mixed`` constant replaced by ``h`` (s per slot or adapter)."""
    d = copy.deepcopy(load_profile(LLAMA).raw)
    (name,) = d["components"]["mixed"]["params"]
    d["components"]["mixed"]["params"][name] = h
    return Profile.from_dict(d, "test")


def test_forms_units_and_zero_without_prefill():
    assert FORMS[("mixed", "prefill_adapters")] is PrefillAdaptersMixed
    assert PrefillAdaptersMixed.units == {"h_adapter": "s/distinct adapter/step with prefill"}
    assert PrefillSlotsMixed.units == {"h_slot": "s/adapter slot/step with prefill"}
    m = PrefillAdaptersMixed(params={"h_adapter": 2e-4})
    s = PrefillSlotsMixed(params={"h_slot": 1e-4})
    f, g = m.scalar(), s.scalar()
    rng = np.random.default_rng(0)
    for _ in range(200):
        P, A, G = int(rng.integers(0, 3000)), int(rng.integers(0, 200)), int(rng.integers(0, 500))
        assert f(P, A, G) == pytest.approx(float(m.predict(P, A, G)), rel=1e-12, abs=0)
        assert g(P, A, G) == pytest.approx(float(s.predict(P, A, G)), rel=1e-12, abs=0)
        assert f(P, A, G) == (2e-4 * A if P > 0 else 0.0)
        assert g(P, A, G) == (1e-4 * G if P > 0 else 0.0)


def test_profile_has_the_fitted_component():
    p = load_profile(LLAMA)
    c = p.components["mixed"]
    assert c.form == "prefill_slots"
    h = c.params["h_slot"]
    assert 2e-5 < h < 1e-3  # 0.02-1 ms per slot (the fit: ~0.125 ms)
    assert c.meta["units"]["h_slot"] == "s/adapter slot/step with prefill"
    assert c.meta["stderr"]["h_slot"] > 0
    # chosen jointly with the kernel grid: each engine form at its own fixed point, the best criterion
    joint = c.meta["selection"]["joint"]
    assert set(joint) == {"prefill_slots", "prefill_adapters"} and joint["prefill_slots"] < joint["prefill_adapters"]
    # the queue-walk form the issue proposed was scored and is worse on held-out calibration data
    cands = c.meta["candidates"]
    assert cands["running+waiting"]["heldout"]["all"]["mape_pct"] > cands["prefill_slots"]["heldout"]["all"]["mape_pct"]
    assert "mixed" not in load_profile("qwen-2.5-7b_h100_vllm085").components  # no serving runs of that model


def test_step_adds_the_term_on_prefill_steps_only():
    p = load_profile(LLAMA)
    off = p.without("mixed")
    assert off.mixed_s is None and "mixed" not in off.raw["components"]
    h = p.components["mixed"].params["h_slot"]
    rng = np.random.default_rng(1)
    for _ in range(300):
        P, D = int(rng.integers(0, 2048)), int(rng.integers(0, 400))
        C, A, G = int(rng.integers(0, 200_000)), int(rng.integers(0, 120)), int(rng.integers(1, 449))
        args = (P, D, C, max(D + (P > 0), 1), A, 16, G, D, int(rng.integers(0, 10_000)), 2 * G)
        on, base = p.step_s(*args), off.step_s(*args)
        if P == 0:
            assert on == base  # bit for bit: decode steps and decode runs are untouched
        else:
            assert on == pytest.approx(base + h * G, rel=1e-12)
    with pytest.raises(ValueError, match="optional"):
        p.without("lora")


def test_off_switch_gives_the_old_results_exactly():
    """h = 0 and the component removed give the same run bit for bit (the old step formula);
    the fitted constant makes the same run slower."""
    w = random_workload(n=250, rps=8.0, adapters=30, seed=7)
    cfg = EngineConfig(max_loras=16, max_num_seqs=128, max_model_len=4096)
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    off = simulate(w, load_profile(LLAMA).without("mixed"), cfg)
    zero = simulate(w, _with_h(0.0), cfg)
    pd.testing.assert_frame_equal(off.requests[cols], zero.requests[cols], check_exact=True)
    on = simulate(w, load_profile(LLAMA), cfg)
    assert on.summary["ttft_ms_mean"] > off.summary["ttft_ms_mean"]
    # run skipping stays exact with the component (prefill steps are never skipped over)
    one = simulate(w, load_profile(LLAMA), cfg, max_run_steps=1)
    pd.testing.assert_frame_equal(on.requests[cols], one.requests[cols], check_exact=True)


@pytest.mark.data
def test_fitted_from_the_calibration_tables(real_data):
    from calibration.fitting.split64 import add_split64_and_mixed

    prof = json.loads((PROFILE_DIR / f"{LLAMA}.json").read_text())
    bare = copy.deepcopy(prof)
    del bare["components"]["mixed"]
    out = add_split64_and_mixed(bare, real_data / "calibration" / "vllm085_h100")
    got, shipped = out["components"]["mixed"], prof["components"]["mixed"]
    assert got["form"] == shipped["form"] == "prefill_slots"
    assert got["params"]["h_slot"] == pytest.approx(shipped["params"]["h_slot"], rel=1e-6)
    assert got["selection"]["chosen"] == "prefill_slots"
    lo = out["components"]["lora"]["params"]
    for k in ("l_cta", "l_active", "split64_cost"):
        assert lo[k] == pytest.approx(prof["components"]["lora"]["params"][k], rel=1e-6), k
