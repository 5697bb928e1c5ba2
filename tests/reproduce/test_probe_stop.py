"""A peak search's probe stops once its measured mean TTFT is known to reach the limit
(``twin.reproduce.base.measured_ttft_mean_lower_bound``, ``ttft_mean_exceeds``; ``simulate(stop_when=...)``).

Exactness: a run checked in chunks is bit-identical to a whole one; the bound never exceeds the
final measured mean at any check; a probe's decision is the full run's at every rate tried, on
both serving systems."""

from __future__ import annotations

import pytest

import policies  # noqa: F401  (registers the presets)
from traces.registry import get_workload
from twin.config import EngineConfig
from twin.reproduce.base import Runner, measured_ttft_mean_lower_bound, ttft_mean_exceeds, window_metrics
from twin.scenario import RunConfig
from twin.simulate import simulate

WARMUP = 10.0
LIMIT = 0.5


def _chat(rps: float, seed: int = 0):
    return get_workload("multiturn-synth", duration=40.0, rps=rps, adapters=12, seed=seed, popularity="uniform",
                        ranks=[32, 64])


CFG = EngineConfig(max_loras=8, max_model_len=8192, kv_capacity_tokens=60_000)


@pytest.mark.parametrize("policy", ["fastlibra", "slora"])
def test_a_chunked_run_is_identical_to_a_whole_one(policy):
    w = _chat(3.0)
    whole = simulate(w, None, CFG, policy=policy, record_steps=False)
    checks = []
    chunked = simulate(w, None, CFG, policy=policy, record_steps=False,
                       stop_when=lambda e: checks.append(e.env.now) or False, stop_check_s=2.5)
    assert len(checks) > 5 and not chunked.summary.get("stopped_early")
    cols = ["ttft_s", "e2e_s", "tpot_s", "outcome"]
    assert whole.requests[cols].equals(chunked.requests[cols])
    drop = {"sim_wall_s", "x_realtime", "wall_s", "step_segments"}  # (a check ends a run of decode steps)
    assert {k: v for k, v in whole.summary.items() if k not in drop} == \
        {k: v for k, v in chunked.summary.items() if k not in drop}


@pytest.mark.parametrize("policy", ["fastlibra", "fastlibra-wos", "slora"])
@pytest.mark.parametrize("rps", [2.0, 6.0, 12.0])
def test_the_bound_never_exceeds_the_final_measured_mean(policy, rps):
    bounds = []
    res = simulate(_chat(rps, seed=1), None, CFG, policy=policy, record_steps=False,
                   stop_when=lambda e: bounds.append(measured_ttft_mean_lower_bound(e, WARMUP)) or False,
                   stop_check_s=1.0)
    final = window_metrics(res.requests, WARMUP)["measured_ttft_ms_mean"] / 1000.0
    assert bounds and max(bounds) <= final * (1 + 1e-12)
    assert bounds == sorted(bounds)  # (it only grows: TTFTs become known, waits lengthen)


def test_an_overloaded_run_stops_early_and_would_have_failed():
    w = _chat(12.0, seed=1)
    full = simulate(w, None, CFG, policy="fastlibra", record_steps=False)
    stopped = simulate(w, None, CFG, policy="fastlibra", record_steps=False, stop_when=ttft_mean_exceeds(LIMIT, WARMUP))
    assert stopped.summary["stopped_early"] and stopped.summary["stopped_at_s"] < full.engine.env.now
    assert window_metrics(full.requests, WARMUP)["measured_ttft_ms_mean"] >= LIMIT * 1000.0


def test_probe_decisions_equal_full_runs_and_reuse_them():
    run = RunConfig(trace="multiturn-synth", adapters=12, ranks=[32, 64], seed=0, duration=WARMUP + 15.0,
                    kv_tokens=60_000, max_model_len=8192)
    ok = lambda s: (not s.get("stopped_early") and s["measured_ttft_ms_mean"] is not None  # noqa: E731
                    and s["measured_ttft_ms_mean"] < LIMIT * 1000.0)
    stops = 0
    for preset in ("fastlibra", "slora"):
        for rps in (1.0, 4.0, 8.0, 16.0):
            r = Runner(cache=False)
            probe = r.point(run, preset, rps, measure_from_s=WARMUP, fail_above_ttft_s=LIMIT)
            full = r.point(run, preset, rps, measure_from_s=WARMUP)
            assert ok(probe) == ok(full), (preset, rps)
            stops += bool(probe.get("stopped_early"))
            if probe.get("stopped_early"):
                assert probe["measured_ttft_ms_mean_lower"] >= LIMIT * 1000.0
                assert len(r.memo) == 2
            else:  # a probe that ran to the end is the full point: stored once, reused
                assert probe is full and len(r.memo) == 1
    assert stops >= 2


def test_a_limit_needs_the_measured_window():
    with pytest.raises(ValueError, match="measure_from_s"):
        Runner(cache=False).point(RunConfig(trace="synthetic", adapters=2, duration=5.0, rps=1.0), "vllm",
                                  fail_above_ttft_s=0.5)


def test_no_stop_where_requests_can_be_dropped_or_cut_at_a_horizon():
    """The bound assumes every request finishes: the rule never fires under the client cap
    (requests dropped after their arrival) or with a horizon."""
    rule = ttft_mean_exceeds(0.0, 0.0)  # would fire at once wherever it applies
    w = _chat(6.0)
    capped = simulate(w, None, CFG, policy="vllm", scheduler="fcfs+client-cap", record_steps=False, stop_when=rule)
    cut = simulate(w, None, CFG, policy="fastlibra", horizon_s=30.0, record_steps=False, stop_when=rule)
    assert not capped.summary.get("stopped_early") and not cut.summary.get("stopped_early")
    assert simulate(w, None, CFG, policy="fastlibra", record_steps=False, stop_when=rule).summary["stopped_early"]
