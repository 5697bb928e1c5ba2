"""twin/validation/light_mix.py: the profile's step in the real runs without a queue, against their mean TPOT.

Contract tested: :func:`light_runs` keeps the runs whose gauges show no queue (mean waiting < 1, mean KV usage
< 0.5) and that have a TPOT and running requests, and nothing when a gauge column is absent;
:func:`step_at_light_mix` prices each one at its own mean composition -- ``R`` running requests, the expected
distinct adapters ``sum(1 - (1 - share)^R)`` capped at the slots, ``C`` = KV usage x capacity, and a share
``min(1, rate x TPOT)`` of steps that prefill the pool's mean prompt -- and gives real TPOT / model step;
:func:`light_summary` gives the medians (overall and by slot range) and the published SMAPE. The profile here
is linear with hand-set constants, so every expected step is computed from its equation, not by the profile.
(``tests/twin/validation/test_light_step.py`` covers the command line and one run against ``Profile.step_s``.)
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

from tests.helpers import constant_profile, real_run_row
from twin.perf.profile import Profile
from twin.validation.light_mix import LIGHT_MAX_KV_USAGE, LIGHT_MAX_WAITING, SLOT_BINS, light_runs, light_summary, \
    step_at_light_mix

# the profile: backbone c0 + c_prefill P + c_decode D + c_ctx C; LoRA k6 % of the base per adapter; scheduler
# k0 + k2 W; KV (KV_TOKENS - 16 G r) tokens in blocks of 16
C0, CP, CD, CC, K6, K0, K2 = 0.01, 1e-4, 2e-4, 1e-7, 5.0, 0.001, 0.002
KV_TOKENS, SLOT_TOKENS_PER_RANK = 100_000, 16
POOL_IN = 222.0


def _profile() -> Profile:
    p = constant_profile(c0=C0, c_prefill=CP, c_decode=CD, c_ctx=CC, lora_pct=100.0, k6=K6, sched=K0, k2=K2,
                         kv_tokens=KV_TOKENS)
    d = copy.deepcopy(p.raw)
    d["components"]["kv"]["params"]["slot_bytes_per_rank"] = SLOT_TOKENS_PER_RANK * 131072.0
    return Profile.from_dict(d, "light-mix test profile")


def _capacity(G: int, r: int) -> int:
    return (KV_TOKENS - SLOT_TOKENS_PER_RANK * G * r) // 16 * 16


def _step(P: int, n_dec: int, C: float, A: float, W: float) -> float:
    """The hand-set profile's step (s): scheduler + backbone x (1 + k6 A / 100)."""
    base = C0 + CP * P + CD * n_dec + CC * C
    return K0 + K2 * W + base * (1.0 + K6 * A / 100.0)


def _row(**kw) -> dict:
    base = dict(run_id="r", source="ml_test", ts_mean_running=10.0, ts_mean_waiting=0.5, ts_mean_kv_usage=0.2,
                input_tok_s=4.0 * POOL_IN, real_tpot=25.0, served_adapters=2, adapter_slots=2, rates="0.3-0.1",
                ranks="8-16", max_lora_rank=16, pool_mean_input_tokens=POOL_IN)
    return real_run_row(**{**base, **kw})


def test_the_light_thresholds_are_no_waiting_request_and_under_half_the_kv() -> None:
    assert (LIGHT_MAX_WAITING, LIGHT_MAX_KV_USAGE) == (1.0, 0.5)


def test_light_runs_keeps_runs_without_a_queue_that_have_a_tpot_and_running_requests() -> None:
    runs = pd.DataFrame([_row(run_id="ok"), _row(run_id="waiting_at_line", ts_mean_waiting=1.0),
                         _row(run_id="just_below", ts_mean_waiting=0.999, ts_mean_kv_usage=0.499),
                         _row(run_id="kv_at_line", ts_mean_kv_usage=0.5), _row(run_id="no_tpot", real_tpot=0.0),
                         _row(run_id="nan_tpot", real_tpot=np.nan), _row(run_id="idle", ts_mean_running=0.0)])
    assert light_runs(runs)["run_id"].tolist() == ["ok", "just_below"]


@pytest.mark.parametrize("gauge", ["ts_mean_running", "ts_mean_waiting", "ts_mean_kv_usage", "input_tok_s",
                                   "real_tpot", "pool_mean_input_tokens"])
def test_a_table_without_a_gauge_has_no_light_run(gauge: str) -> None:
    runs = pd.DataFrame([_row()]).drop(columns=gauge)
    out = light_runs(runs)
    assert out.empty and list(out.columns) == list(runs.columns)
    assert step_at_light_mix(runs, _profile()).empty


def test_the_step_is_the_profiles_at_the_runs_mean_composition() -> None:
    prof = _profile()
    r = step_at_light_mix(pd.DataFrame([_row(adapter_slots=8)]), prof).iloc[0]
    # rates 0.3 and 0.1: shares 3/4 and 1/4; 10 running requests -> expected distinct adapters
    A = (1 - 0.25 ** 10) + (1 - 0.75 ** 10)
    f = 4.0 * 0.025  # 4 requests/s (888 prompt tokens/s over 222) x 25 ms
    C = 0.2 * _capacity(8, 16)
    step = (1 - f) * _step(0, 10, C, A, 0.5) + f * _step(222, 9, C, A, 0.5)
    assert r["adapters"] == pytest.approx(A)
    assert r["prefill_share"] == pytest.approx(f)
    assert r["model_step_ms"] == pytest.approx(step * 1000.0, rel=1e-12)
    assert r["real_tpot_ms"] == pytest.approx(25.0)
    assert r["ratio"] == pytest.approx(0.025 / step, rel=1e-12)
    assert (r["run_id"], r["source"], r["slots"], r["served"], r["running"]) == ("r", "ml_test", 8, 2, 10.0)


def test_the_expected_adapters_are_capped_at_the_slots() -> None:
    prof = _profile()
    # 4 adapters at equal rates, 10 running requests: 4 (1 - 0.75^10) = 3.77 expected, 2 slots
    mix = step_at_light_mix(pd.DataFrame([_row(served_adapters=4, adapter_slots=2, rates="0.1"),
                                          _row(served_adapters=4, adapter_slots=8, rates="0.1")]), prof)
    assert mix["adapters"].tolist() == pytest.approx([2.0, 4 * (1 - 0.75 ** 10)])


def test_the_adapters_are_fewer_than_the_running_requests_drawn_from_them() -> None:
    prof = _profile()
    # one running request draws one adapter whatever the rates; two draw 1 + (1 - sum of squared shares)
    mix = step_at_light_mix(pd.DataFrame([_row(ts_mean_running=1.0), _row(ts_mean_running=2.0)]), prof)
    assert mix["adapters"].tolist() == pytest.approx([1.0, 1 + 1 - (0.75 ** 2 + 0.25 ** 2)])


def test_the_prefill_share_is_at_most_every_step() -> None:
    prof = _profile()
    r = step_at_light_mix(pd.DataFrame([_row(input_tok_s=100.0 * POOL_IN)]), prof).iloc[0]
    A = (1 - 0.25 ** 10) + (1 - 0.75 ** 10)  # (1.94: under the 2 slots)
    C = 0.2 * _capacity(2, 16)
    assert r["prefill_share"] == 1.0
    assert r["model_step_ms"] == pytest.approx(_step(222, 9, C, A, 0.5) * 1000.0, rel=1e-12)


def test_a_batch_under_one_request_is_priced_as_one_decode() -> None:
    prof = _profile()
    r = step_at_light_mix(pd.DataFrame([_row(ts_mean_running=0.3, input_tok_s=0.0)]), prof).iloc[0]
    A = (1 - 0.25 ** 0.3) + (1 - 0.75 ** 0.3)
    C = 0.2 * _capacity(2, 16)
    assert r["prefill_share"] == 0.0
    assert r["model_step_ms"] == pytest.approx(_step(0, 1, C, A, 0.5) * 1000.0, rel=1e-12)


def test_a_slower_real_tpot_gives_a_larger_ratio_in_proportion() -> None:
    prof = _profile()
    a, b = step_at_light_mix(pd.DataFrame([_row(real_tpot=20.0, input_tok_s=0.0),
                                           _row(real_tpot=40.0, input_tok_s=0.0)]), prof)["ratio"]
    assert b == pytest.approx(2 * a)


def test_no_light_run_gives_an_empty_table() -> None:
    assert step_at_light_mix(pd.DataFrame([_row(ts_mean_waiting=3.0)]), _profile()).empty


def _mix(slots: list[int], model: list[float], real: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"slots": slots, "model_step_ms": model, "real_tpot_ms": real,
                         "ratio": [r / m for m, r in zip(model, real)]})


def test_light_summary_gives_the_median_ratio_and_the_published_smape() -> None:
    mix = _mix([8, 8, 8], [10.0, 20.0, 40.0], [12.0, 20.0, 30.0])
    s = light_summary(mix)
    assert s["runs"] == 3
    assert s["median"] == pytest.approx(1.0)  # ratios 1.2, 1.0, 0.75
    # published convention: 100 x mean(|m - y| / (|m| + |y|)), half the textbook SMAPE
    assert s["smape"] == pytest.approx(round(100 * (2 / 22 + 0 + 10 / 70) / 3, 3))
    assert "without a queue" in s["note"]


def test_light_summary_bins_runs_by_slots_with_each_upper_end_in_its_range() -> None:
    mix = _mix([1, 16, 17, 32, 64, 100, 512], [10.0] * 7, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0])
    s = light_summary(mix)
    assert [hi for _, hi in SLOT_BINS] == [16, 32, 64, 128, 512]
    assert s["by_slots"] == {"slots 1-16": {"runs": 2, "median": 1.5}, "slots 17-32": {"runs": 2, "median": 3.5},
                             "slots 33-64": {"runs": 1, "median": 5.0}, "slots 65-128": {"runs": 1, "median": 6.0},
                             "slots 129-512": {"runs": 1, "median": 7.0}}
    assert s["median"] == pytest.approx(4.0)


def test_light_summary_of_no_run_is_empty() -> None:
    assert light_summary(_mix([], [], [])) == {}
