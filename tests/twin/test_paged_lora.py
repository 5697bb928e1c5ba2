"""FastLibra's LoRA compute over adapter weights paged in the KV pool
(:class:`twin.perf.slora_forms.PagedLora`, ``shared/refs/fastlibra.md`` §2)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import policies  # noqa: F401
from traces.workload import Workload
from twin.config import EngineConfig
from twin.perf.forms import KernelGridLora
from twin.perf.profile import load_profile
from twin.perf.slora_forms import PagedLora, PunicaLoraCost
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate


def _prof():
    return load_profile(None).with_lora_targets("qkvo")


def test_paged_decode_step_is_slora_decode_padded_to_the_rank():
    """A pure decode step of R requests costs S-LoRA's decode with every request at rank r; it does
    not depend on the slots nor on how many adapters share the batch; scalar == predict."""
    prof = _prof()
    paged, punica = PagedLora.from_profile(prof), PunicaLoraCost.from_profile(prof)
    f = paged.scalar()
    for R, r in ((1, 8), (16, 64), (40, 32)):
        assert f(0.0, 3, r, R, 8, R) == pytest.approx(punica.decode_s(R * r, r, R), rel=1e-12)
        assert f(0.0, 3, r, R, 200, R) == f(0.0, 1, r, R, 8, R) == f(0.0, 3, r, R, 8, R)
        assert float(paged.predict(0.0, 3, r, R, 8, R)) == pytest.approx(f(0.0, 3, r, R, 8, R), rel=1e-12)
    assert f(0.0, 0, 64, 16, 8, 16) == 0.0                        # no adapter in the step: no LoRA time
    # prompt tokens beyond one per request add their shrink and padded expand
    c = paged.params
    assert f(0.0, 2, 64, 516, 8, 4) - f(0.0, 2, 64, 4, 8, 4) == pytest.approx(512 * 64 * (c["c_tok"] + c["c_pad"]))
    # vectorised
    v = paged.predict(0.0, np.array([0, 2]), 64, np.array([16.0, 16.0]), 8, np.array([16.0, 16.0]))
    assert v[0] == 0.0 and v[1] == pytest.approx(f(0.0, 2, 64, 16, 8, 16))
    # vLLM's kernel grid pays for every slot; the paged form does not
    grid = prof.components["lora"]
    assert isinstance(grid, KernelGridLora) and grid.scalar()(0.0, 3, 64, 16, 50, 16) > grid.scalar()(0.0, 3, 64, 16, 8, 16)


def _workload():
    rng = np.random.default_rng(3)
    n = 60
    ad = rng.integers(0, 12, n)
    return Workload.from_arrays(np.sort(rng.uniform(0, 6, n)), rng.integers(50, 400, n), rng.integers(5, 60, n),
                                ad, np.where(ad % 2, 64, 32))


def test_fastlibra_charges_the_paged_form_and_the_profile_form_is_a_named_departure():
    prof = _prof()
    cfg = EngineConfig(max_model_len=4096)
    fl = simulate(_workload(), prof, cfg, policy="fastlibra", check_invariants=True)
    assert isinstance(fl.engine.profile.components["lora"], PagedLora)
    grid = simulate(_workload(), prof, cfg, scheduler_obj=make_scheduler("fcfs"),
                    cache_obj=make_cache("fastlibra", lora_compute="profile"), check_invariants=True)
    assert isinstance(grid.engine.profile.components["lora"], KernelGridLora)
    vl = simulate(_workload(), prof, cfg, policy="vllm-partition", check_invariants=True)
    assert isinstance(vl.engine.profile.components["lora"], KernelGridLora)
    # the paged form is cheaper than vLLM's grid over max(32, adapters) slots on this profile
    assert fl.summary["tpot_ms_mean"] < grid.summary["tpot_ms_mean"]
    assert make_cache("fastlibra").get_params()["lora_compute"] == "paged"
    with pytest.raises(ValueError, match="lora_compute"):
        make_cache("fastlibra", lora_compute="grid")


def test_paged_decode_runs_are_exact():
    """The decode-run fast path with the paged form equals stepping one iteration at a time."""
    prof = _prof()
    cfg = EngineConfig(max_model_len=4096)
    a = simulate(_workload(), prof, cfg, policy="fastlibra", check_invariants=True)
    b = simulate(_workload(), prof, cfg, policy="fastlibra", check_invariants=True, max_run_steps=1)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert a.summary["step_segments"] < b.summary["step_segments"]


def test_paged_form_prices_each_request_at_its_own_rank():
    """``rank_sums`` (S-LoRA: shrink work follows the sum of own ranks, the expand is padded to the
    max rank; ``slora.md`` §5): at every request of max rank it is the padded form, with lower
    ranks the own-rank terms shrink and the padded expand does not."""
    prof = _prof()
    paged, punica = PagedLora.from_profile(prof), PunicaLoraCost.from_profile(prof)
    f, c = paged.scalar(), paged.params
    for T, R, r in ((16, 16, 64), (516, 4, 64), (40, 40, 32)):
        assert f(0.0, 2, r, T, 8, R, (R * r, T * r)) == pytest.approx(f(0.0, 2, r, T, 8, R), rel=1e-12)
    # a decode step of a rank-32 and a rank-64 request at max_lora_rank 64
    assert f(0.0, 2, 64, 2, 8, 2, (96, 96)) == pytest.approx(c["launches_s"] + 96 * c["c_rank"] + 2 * 64 * c["c_pad"],
                                                             rel=1e-12)
    assert f(0.0, 2, 64, 2, 8, 2, (96, 96)) == pytest.approx(punica.decode_s(96, 64, 2), rel=1e-12)
    assert f(0.0, 2, 64, 2, 8, 2, (96, 96)) < f(0.0, 2, 64, 2, 8, 2)
    # a prefill chunk of 100 tokens of a rank-32 request beside one rank-64 decoder
    want = c["launches_s"] + 96 * c["c_rank"] + (64 + 3200 - 96) * c["c_tok"] + 101 * 64 * c["c_pad"]
    assert f(0.0, 2, 64, 101, 8, 2, (96, 64 + 3200)) == pytest.approx(want, rel=1e-12)
    assert float(paged.predict(0.0, 2, 64, 101, 8, 2, (96, 3264))) == pytest.approx(want, rel=1e-12)
    assert f(0.0, 0, 64, 101, 8, 2, (96, 3264)) == 0.0
    assert prof.lora_own_ranks is False and prof.with_paged_lora().lora_own_ranks is True


def test_fastlibra_steps_charge_each_request_its_own_rank():
    """One request alone, at max_lora_rank 64: its decode steps at rank 32 cost exactly
    ``32 * c_rank`` less than at rank 64 (the padded expand is the same), step by step."""
    prof = _prof()
    cfg = EngineConfig(max_model_len=4096, max_lora_rank=64)

    def decode_steps(rank):
        w = Workload.from_arrays(np.array([0.0]), np.array([100]), np.array([40]), np.array([0]), np.array([rank]))
        r = simulate(w, prof, cfg, policy="fastlibra", check_invariants=True, max_run_steps=1)
        s = r.steps
        return s.loc[(s["prefill_tokens"] == 0) & (s["decode_tokens"] == 1), "duration_s"].to_numpy()

    d32, d64 = decode_steps(32), decode_steps(64)
    c_rank = PagedLora.from_profile(prof).params["c_rank"]
    assert len(d32) == len(d64) == 39
    np.testing.assert_allclose(d64 - d32, 32 * c_rank, rtol=1e-9)
