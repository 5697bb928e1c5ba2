"""FastLibra's reproductions measure a warmed-up server (``twin.reproduce.fastlibra.WARMUP_S``,
fastlibra.md §7: the paper's runs span ~1,800 s): every point simulates the warm-up first and
its TTFT/TPOT come from the requests that arrive after it (``base.window_metrics``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from twin.reproduce import fastlibra
from twin.reproduce.base import Runner, window_metrics
from twin.scenario import RunConfig


def test_window_metrics_keep_the_requests_after_the_warmup():
    df = pd.DataFrame({"arrival_s": [1.0, 5.0, 10.0, 12.0, 15.0],
                       "outcome": ["finished", "finished", "finished", "finished", "rejected"],
                       "ttft_s": [9.0, 9.0, 0.1, 0.3, np.nan],
                       "tpot_s": [1.0, 1.0, 0.02, np.nan, np.nan]})
    m = window_metrics(df, 10.0)
    assert m["measured_from_s"] == 10.0
    assert m["measured_finished"] == 2 and m["measured_unfinished"] == 1
    assert m["measured_ttft_ms_mean"] == pytest.approx(200.0)
    assert m["measured_tpot_ms_mean"] == pytest.approx(20.0)  # TPOT of requests with 2+ tokens only
    empty = window_metrics(df, 99.0)
    assert empty["measured_finished"] == 0 and empty["measured_ttft_ms_mean"] is None


def test_runner_point_adds_the_measured_figures():
    run = RunConfig(trace="synthetic", adapters=4, ranks=[8], seed=0, duration=20.0, rps=2.0)
    r = Runner(cache=False)
    whole = r.point(run, "vllm")
    warm = r.point(run, "vllm", measure_from_s=10.0)
    assert "measured_ttft_ms_mean" not in whole          # a point without warm-up is as before
    assert warm["ttft_ms_mean"] == whole["ttft_ms_mean"]  # the same run; its summary is the whole run
    assert 0 < warm["measured_finished"] < warm["requests_finished"]
    assert len(r.memo) == 2                              # memoised apart


class _StubRunner:
    """Answers points with a TTFT of 100 ms per req/s after the warm-up and 10 s over the whole run
    (a transient that must not count), recording the warm-up each point was asked for and the
    TTFT limit a probe may stop at."""

    def __init__(self):
        self.warmups = set()
        self.durations = set()
        self.limits = set()
        self.caps = set()

    def point(self, run, preset, rps, measure_from_s=None, fail_above_ttft_s=None, stop_at_s=None,
              memory_gauge_s=None):
        self.warmups.add(measure_from_s)
        self.durations.add(run.duration)
        self.limits.add(fail_above_ttft_s)
        self.caps.add(stop_at_s)
        return {"ttft_ms_mean": 1e4, "tpot_ms_mean": 1e3, "measured_ttft_ms_mean": 100.0 * rps,
                "measured_tpot_ms_mean": 20.0}


def test_fastlibra_points_are_measured_after_the_warmup():
    effort = dataclasses.replace(fastlibra.QUICK, warmup_s=30.0, duration_s=15.0)
    run = fastlibra.scenario("fastlibra-chatbot", effort, {})
    assert run.duration == 45.0
    stub = _StubRunner()
    m = fastlibra.measure(stub, True, {"WOL": "fastlibra-wol"})
    assert stub.warmups == {fastlibra.QUICK.warmup_s}
    # the peak search's probes may stop at the 500 ms limit; the rates' points run to the end or
    # to the drain cap after the last arrival
    assert stub.limits == {fastlibra.TTFT_LIMIT_S, None}
    assert stub.caps == {None, fastlibra.QUICK.warmup_s + fastlibra.QUICK.duration_s + fastlibra.DRAIN_CAP_S}
    assert stub.durations == {fastlibra.QUICK.warmup_s + fastlibra.QUICK.duration_s}
    for w in m["workloads"].values():
        # the peak follows the measured TTFT (< 500 ms below 5 req/s), not the whole run's 10 s
        assert 2.0 <= w["peaks_rps"]["FastLibra"] < 5.0
        assert w["means"]["FastLibra"]["tpot_ms_mean"] == 20.0
    assert fastlibra.FULL.warmup_s == fastlibra.WARMUP_S > 0
