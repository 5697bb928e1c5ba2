"""A rate point past its system's peak is cut at a drain cap (``Runner.point(stop_at_s=...)``,
``twin.reproduce.fastlibra.DRAIN_CAP_S``) and reports a lower bound on its mean TTFT; a point that
ends before the cap is the full point. Means over rates, ratios and the rows keep track of which
values are bounds (``fastlibra.bounded_*``), and a bound gets a verdict only when it excludes the band."""

from __future__ import annotations

import math

import numpy as np
import pytest

import policies  # noqa: F401  (registers the presets)
from twin.reproduce import fastlibra
from twin.reproduce.base import Row, Runner
from twin.reproduce.fastlibra import EXACT, LOWER, UPPER, bounded_change, bounded_mean, bounded_ratio, bounded_value
from twin.reproduce.report import verdict
from twin.scenario import RunConfig

WARMUP = 10.0
RUN = RunConfig(trace="multiturn-synth", adapters=12, ranks=[32, 64], seed=0, duration=WARMUP + 15.0,
                kv_tokens=60_000, max_model_len=8192)


def test_a_point_that_drains_before_the_cap_is_the_full_point():
    r = Runner(cache=False)
    capped = r.point(RUN, "fastlibra", 1.0, measure_from_s=WARMUP, stop_at_s=RUN.duration + 600.0)
    full = r.point(RUN, "fastlibra", 1.0, measure_from_s=WARMUP)
    assert not capped.get("stopped_early") and capped is full and len(r.memo) == 1


def test_a_cut_point_bounds_the_full_runs_mean_ttft():
    cap = RUN.duration + 5.0
    r = Runner(cache=False)
    cut = r.point(RUN, "fastlibra", 16.0, measure_from_s=WARMUP, stop_at_s=cap)
    full = r.point(RUN, "fastlibra", 16.0, measure_from_s=WARMUP)
    assert full["simulated_s"] > cap  # the backlog drains after the cap: this point is cut
    assert cut["stopped_early"] and cut["stopped_at_s"] == pytest.approx(cap)
    assert cut["measured_ttft_ms_mean"] is None and cut["measured_tpot_ms_mean"] is None
    assert 0 < cut["measured_ttft_ms_mean_lower"] <= full["measured_ttft_ms_mean"]
    # the counts of the run up to the cut
    assert cut["measured_arrived"] == full["measured_finished"] + full["measured_unfinished"]
    assert cut["measured_finished"] < full["measured_finished"]
    assert cut["requests_finished"] < full["requests_finished"]
    assert cut["throughput_rps"] == pytest.approx(cut["requests_finished"] / cut["simulated_s"])
    assert cut["requests_unfinished"] == full["requests_finished"] - cut["requests_finished"]
    # the FastLibra swapper's counters up to the cut are kept (the ablation's notes read them)
    assert "fastlibra_swaps_out" in cut
    assert len(r.memo) == 2


def test_a_cap_needs_the_measured_window_and_excludes_a_probe_limit():
    with pytest.raises(ValueError, match="measure_from_s"):
        Runner(cache=False).point(RUN, "fastlibra", 1.0, stop_at_s=100.0)
    with pytest.raises(ValueError, match="not both"):
        Runner(cache=False).point(RUN, "fastlibra", 1.0, measure_from_s=WARMUP, stop_at_s=100.0,
                                  fail_above_ttft_s=0.5)


def test_bounded_arithmetic():
    assert bounded_mean([(1.0, EXACT), (3.0, EXACT)]) == (2.0, EXACT)
    assert bounded_mean([(1.0, EXACT), (3.0, LOWER)]) == (2.0, LOWER)
    assert math.isnan(bounded_mean([(1.0, UPPER), (3.0, LOWER)])[0])  # nothing follows from a mix
    assert bounded_mean([(float("nan"), LOWER), (3.0, EXACT)]) == (3.0, EXACT)
    assert bounded_ratio((4.0, LOWER), (2.0, EXACT)) == (2.0, LOWER)
    assert bounded_ratio((4.0, EXACT), (2.0, LOWER)) == (2.0, UPPER)  # a larger base: a smaller ratio
    assert math.isnan(bounded_ratio((4.0, LOWER), (2.0, LOWER))[0])
    assert bounded_change((1.0, EXACT), (4.0, LOWER)) == (-75.0, UPPER)
    assert bounded_value((1.23456, EXACT), 2) == 1.23456
    assert bounded_value((1.23456, LOWER), 2) == ">= 1.23" and bounded_value((-75.0, UPPER), 1) == "<= -75"


def test_a_bound_is_judged_only_when_it_excludes_the_band():
    r = lambda twin: Row("mean TTFT normalised", "WOM", "x", 1.27, twin)  # noqa: E731
    assert verdict(r(">= 3.1")) == "no"    # at least 3.1: outside 1.27 +- 0.10 whatever the full run
    assert verdict(r(">= 1.2")) == "n/a"   # could still be within
    assert verdict(r(1.3)) == "yes"
    assert verdict(Row("TTFT vs vLLM", "", "%", -60.3, "<= -75")) == "no"
    assert verdict(Row("TTFT vs vLLM", "", "%", -60.3, "<= -55")) == "n/a"


def _pt(ttft, tpot, cut=False):
    if cut:
        return {"stopped_early": True, "measured_ttft_ms_mean_lower": ttft, "measured_ttft_ms_mean": None,
                "measured_tpot_ms_mean": None}
    return {"measured_ttft_ms_mean": ttft, "measured_tpot_ms_mean": tpot}


def test_means_over_rates_use_the_bound_and_the_same_tpot_rates_for_all():
    m = fastlibra.means_over_rates({"FastLibra": [_pt(100, 20), _pt(200, 22), _pt(300, 24)],
                                    "WOM": [_pt(100, 21), _pt(400, 30), _pt(9000, None, cut=True)]})
    assert {k: m["FastLibra"][k] for k in ("ttft_ms_mean", "tpot_ms_mean", "ttft_lower", "tpot_rates")} == {
        "ttft_ms_mean": 200.0, "tpot_ms_mean": 21.0, "ttft_lower": False, "tpot_rates": 2}
    assert m["WOM"]["ttft_ms_mean"] == pytest.approx(np.mean([100, 400, 9000])) and m["WOM"]["ttft_lower"]
    assert m["WOM"]["tpot_ms_mean"] == 25.5 and m["WOM"]["tpot_rates"] == 2


def test_means_over_rates_average_memory_and_hit_rates():
    """The HBM utilisation and hit rates of a system are means over its rate points (missing ones
    left out); the history hit rate counts lookups served from HBM only (host hits are copies)."""
    pts = [{"measured_ttft_ms_mean": 1.0, "measured_tpot_ms_mean": 1.0, "memory_in_use_mean": 0.5,
            "adapter_hit_rate_requests": 0.8, "prefix_lookups": 10, "prefix_hits": 6, "prefix_host_hits": 2},
           {"measured_ttft_ms_mean": 1.0, "measured_tpot_ms_mean": 1.0, "memory_in_use_mean": 0.9,
            "adapter_hit_rate_requests": None, "prefix_lookups": 0}]
    m = fastlibra.means_over_rates({"X": pts})["X"]
    assert m["memory_in_use_mean"] == pytest.approx(0.7)
    assert m["adapter_hit_rate"] == pytest.approx(0.8) and m["history_hbm_hit_rate"] == pytest.approx(0.4)
