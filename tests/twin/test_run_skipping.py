"""Runs of decode steps priced at once give exactly the results of stepping one iteration at a time
(``max_run_steps=1``): the cases a differential fuzzer found where they did not (stop 65's audit), and the
horizon's cut, which both must make the same way.

Each test runs one scenario twice, with run skipping and with ``max_run_steps=1``, and compares every request
column and every summary figure exactly (wall-clock figures aside)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers import constant_profile, random_workload
from traces.workload import Workload
from twin.config import EngineConfig
from twin.simulate import simulate

_WALL = ("wall_s", "x_realtime", "step_segments")  # (segments: what skipping saves)


def _both(w, prof, cfg, **kw):
    """The scenario with run skipping and stepping one iteration at a time."""
    return simulate(w, prof, cfg, **kw), simulate(w, prof, cfg, max_run_steps=1, **kw)


def _assert_same(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    sa = {k: repr(v) for k, v in a.summary.items() if k not in _WALL}
    sb = {k: repr(v) for k, v in b.summary.items() if k not in _WALL}
    assert sa == sb


def test_a_prefetch_started_after_the_admissions_ends_the_run():
    """SJF with an EMA-prefetching cache: a prefetch started after a step's admissions holds the free slot, so the
    head that was refused for KV (NO_KV, which stops a run until a finish) is refused for its slot at the next step
    (NO_SLOT, which SJF skips: a later request gets in). The run was sized with the stale NO_KV: the later request
    was admitted a whole run late (0.54 s) and a late prefetch hit went uncounted."""
    prof = constant_profile(c0=0.005837328969646527, c_decode=5e-05, lora_pct=180.0, sched=1e-4, disk_s=0.0,
                            cpu_s=0.1, kv_tokens=20000)
    w = Workload.from_arrays([17.07470655881322, 18.625942561462992, 18.666213995860936, 19.679240231474175],
                             [752, 1380, 571, 383], [300, 260, 45, 12], [11, 1, 3, 5], [8, 8, 8, 8])
    cfg = EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048, max_loras=3, kv_capacity_tokens=3000,
                       max_model_len=3000)
    a, b = _both(w, prof, cfg, scheduler="sjf", cache="ema-prefetch", check_invariants=True)
    assert b.summary["prefetch_late_hits"] == 1
    _assert_same(a, b)
    # the same with the default FCFS (the ema-prefetch preset)
    w = Workload.from_arrays([0.0897, 0.1134, 0.3344, 0.3724, 1.1759, 1.7226, 2.0099],
                             [941, 622, 1322, 359, 1161, 525, 1349], [45, 11, 161, 239, 255, 144, 189],
                             [5, 4, 2, 4, 7, 1, 3], [8] * 7)
    cfg = EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048, max_loras=3, kv_capacity_tokens=3000,
                       max_model_len=1500)
    _assert_same(*_both(w, prof, cfg, policy="ema-prefetch", cache_opts={"interval_s": 0.1, "top_k": 2}))


def test_adapter_aware_aging_ends_a_run_while_the_batch_is_full():
    """adapter-aware with max_num_seqs 1: no admission passes before a finish (NO_SEQ), but a request that waited
    max_wait_s moves to the front of the walk its lookahead prefetch follows at every step. Runs ignored the aging:
    248 prefetches instead of 453, 13.2 instead of 21.4 GB over the link."""
    w = Workload.from_arrays([33.56, 33.92, 35.0, 36.91, 38.11, 38.19], [743, 950, 890, 664, 809, 857],
                             [377, 156, 235, 119, 47, 144], [39, 0, 4, 39, 39, 39], [16, 8, 8, 16, 16, 16])
    cfg = EngineConfig(max_num_seqs=1, max_num_batched_tokens=256, max_loras=2, kv_capacity_tokens=1500,
                       max_model_len=1500)
    a, b = _both(w, "llama-2-7b_a40_vidur", cfg, policy="adapter-aware")
    assert b.summary["prefetches"] > 400
    _assert_same(a, b)


def test_blocked_requests_are_counted_once_whatever_the_runs():
    """Requests refused for adapter memory were counted per admission attempt: a run of decode steps made one
    attempt where stepping makes one per step (1 vs 49 below), and multiplying a run's first attempt by its steps
    over-counted where the running requests' KV grows within the run and a refusal turns from adapter memory
    (NO_SLOT) to KV (NO_KV) partway (fastlibra-wos: 65 vs 62; adapter-aware with chameleon+prefetch: 190 vs 158).
    A request counts once now (requests_blocked_by_adapter_memory), the same either way."""
    prof = constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 0.001], [10, 10], [50, 5], [0, 1], [64, 64])
    cfg = EngineConfig(max_loras=1, max_model_len=512, kv_capacity_tokens=6000, adapter_memory="region",
                       adapter_placement="paged")
    a, b = _both(w, prof, cfg, scheduler="sjf", cache="lru")
    assert b.summary["requests_blocked_by_adapter_memory"] == 1
    assert a.summary["step_segments"] < b.summary["step_segments"]
    _assert_same(a, b)
    prof = constant_profile(c0=0.006348212428669207, c_ctx=1e-07, c_decode=0.0, kv_tokens=100000)
    w = Workload.from_arrays(
        [26.876386269121443, 27.05710815321425, 27.543051554932482, 27.543051554932482, 27.61106716690379,
         27.61106716690379, 27.61106716690379],
        [64] * 7, [365, 255, 321, 282, 293, 150, 281], [2, 3, 3, -1, 2, 0, 3], [32, 64, 64, 0, 32, 8, 64],
        conversation_id=[310012, 310020, 310023, 320016, 320029, 320019, 320030], turn=[0] * 7, prefix_tokens=[0] * 7)
    cfg = EngineConfig(max_loras=3, block_size=8, kv_capacity_tokens=6000, max_model_len=512)
    # (idle 0: no swapper swap-in; at idle 0.3 its swap-ins, which start at its ticks since the audit, bring the
    # adapters in before any request is refused for their memory)
    a, b = _both(w, prof, cfg, policy="fastlibra-wos", cache_opts={"busy": 0.5, "idle": 0.0})
    assert b.summary["requests_blocked_by_adapter_memory"] >= 1
    _assert_same(a, b)
    w = Workload.from_arrays([14.948173382045887] * 3, [64] * 3, [224, 214, 41], [2, 5, 8], [8, 16, 8],
                             conversation_id=[160000, 160010, 160008], turn=[0] * 3, prefix_tokens=[0] * 3)
    cfg = EngineConfig(max_num_seqs=8, kv_capacity_tokens=1500, max_model_len=512)
    a, b = _both(w, "llama-3.1-8b_h100_vllm085_interval_ranktile", cfg, scheduler="adapter-aware",
                 cache="chameleon+prefetch")
    assert b.summary["requests_blocked_by_adapter_memory"] >= 1
    _assert_same(a, b)


def test_failed_prefetch_placements_are_counted_per_step_in_a_run():
    """A prefetch whose adapter finds no hole in a fragmented region fails, changing nothing, and stepping retries
    it at every step; a run made one attempt (adapter_alloc_failures 5 vs 104). The run counts its steps' attempts."""
    w = Workload.from_arrays(
        [8.522168540056267, 12.765092588628388, 13.136082718348321, 14.902208545875794, 15.28354492923682,
         15.301470936025236, 17.213540506827066], [64] * 7, [258, 89, 275, 183, 295, 23, 216],
        [5, 10, 9, 8, 3, 7, 11], [32, 64, 32, 16, 128, 128, 128])
    a, b = _both(w, "llama-3.1-8b_h100_vllm085_adaptercheck", EngineConfig(max_loras=4, adapter_memory="region"),
                 scheduler="adapter-aware", cache="ema-prefetch")
    assert b.summary["adapter_alloc_failures"] > 50
    _assert_same(a, b)


def test_scrape_stall_merges_the_same_tokens_whatever_the_runs():
    """The client's merged chunks need every step's end: a run's steps were spaced evenly, while they grow with the
    context (1 to 9 ms here), so a stall boundary between a real and an interpolated end counted a token in or out
    (mean client ITL 48.07 vs 49.22 ms). The steps' ends are the clock's now."""
    prof = constant_profile(c0=0.001, c_ctx=1e-6, kv_tokens=100_000)
    n = 6
    w = Workload.from_arrays(np.arange(n) * 0.01, [1000] * n, [1500] * n, np.arange(n), [8] * n)
    a, b = _both(w, prof, EngineConfig(max_loras=8, max_model_len=4096), scrape_s_per_label=0.02,
                 scrape_period_s=0.05)
    assert 0.5 < b.summary["itl_merged_gap_share"] < 0.9
    _assert_same(a, b)


@pytest.mark.parametrize("system", ["vllm", "slora"])
def test_gpu_busy_fraction_is_exact(system):
    """The busy time summed each segment's t1 - t0: a run's one difference and its steps' k differences differ in
    the last bits (0.9994334106712263 vs ...265). It is summed over back-to-back spans now."""
    w = random_workload(n=200, rps=5.0, adapters=8, seed=2)
    a, b = _both(w, None, EngineConfig(max_loras=4), system=system)
    assert a.summary["step_segments"] < b.summary["step_segments"]
    _assert_same(a, b)


@pytest.mark.parametrize("policy", ["vllm", "slora"])
def test_a_stop_rule_reads_the_state_stepping_has(policy):
    """``simulate(stop_when=...)`` reads the engine at its checks; mid-run it read the run's start state (vLLM at
    1 s: 2 KV blocks and 6 steps where stepping has 4 and 39), which the reproductions' memory gauge averaged
    (FastLibra's HBM utilisation, up to 0.7 % low). A run now ends by the check."""
    prof = constant_profile(c0=0.01, kv_tokens=40_000)
    w = Workload.from_arrays([0.0, 0.3], [16, 16], [400, 5], [0, 0], [8, 8])
    reads = {}
    for k in (None, 1):
        got = reads[k] = []

        def rule(e, got=got):
            got.append((e.env.now, e.memory_in_use(), e.used_blocks, e.steps_run, e.arr_ptr))
            return False

        simulate(w, prof, EngineConfig(max_loras=2, max_model_len=2048), policy=policy, max_run_steps=k,
                 stop_when=rule, stop_check_s=1.0)
    assert len(reads[None]) >= 3 and reads[None] == reads[1]


@pytest.mark.parametrize("system", ["vllm", "slora"])
@pytest.mark.parametrize("horizon", [6.47, 5.0, 11.3])
def test_the_step_in_flight_at_the_horizon_is_not_completed(system, horizon):
    """The step running at the horizon was completed after it: requests finished at 6.4709 s with a horizon of
    6.47 s, and a steps row ended after the simulated time. It is in flight there now: no finish, first token or
    step after the horizon, and the requests in it are unfinished -- the same with run skipping as stepping."""
    w = random_workload(n=240, rps=8.0, adapters=40, seed=7, max_out=200)
    cfg = EngineConfig(max_loras=4)
    a, b = _both(w, None, cfg, system=system, horizon_s=horizon)
    _assert_same(a, b)
    r, st = a.requests, a.steps
    assert r["finish_s"].max() <= horizon and r["first_token_s"].max() <= horizon
    assert st["t_end"].max() <= horizon
    s = a.summary
    assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == s["requests_arrived"]
    assert s["requests_unfinished"] > 0


@pytest.mark.parametrize("policy,horizon", [("vllm", 0.3), ("slora", 0.005)])
def test_a_step_whose_loads_end_after_the_horizon_does_not_start_them(policy, horizon):
    """The horizon's cut came after the step's synchronous adapter loads: a 0.6 s load started before a 0.3 s horizon
    ran the clock to 0.6 s and put its link time (all of it after the horizon) into the link utilisation. A step
    whose loads alone end past the horizon is in flight there and does not start them."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0], [16], [5], [0], [64])
    a, b = _both(w, prof, EngineConfig(max_loras=1, max_model_len=512, kv_capacity_tokens=6000), policy=policy,
                 horizon_s=horizon)
    _assert_same(a, b)
    assert a.engine.env.now <= horizon and a.summary["link_utilization"] == 0.0
    assert a.requests["outcome"].tolist() == ["unfinished"]


def _assert_cut_at(full, cut, horizon) -> None:
    """``cut`` (a run to ``horizon``) is ``full`` (the same run without one) up to the horizon: every first token and
    finish the full run has by then, at the same time, and none after; no step row, load wait or link time after it."""
    f, c = full.requests, cut.requests
    for col in ("first_token_s", "finish_s"):
        by = f[col] <= horizon
        assert c.loc[by, col].tolist() == f.loc[by, col].tolist(), col
        assert c.loc[~by, col].isna().all(), col
    assert cut.engine.env.now <= horizon
    if len(cut.steps):
        assert cut.steps["t_end"].max() <= horizon
    # a load wait is recorded when it ended, and it ended by the horizon: the full run's, for a request that finished
    # by then or had its first token and was never preempted (it waits for loads before its first token only);
    # at most the full run's for one scheduled by then (a later prefill chunk, or a re-admission after a preemption,
    # may wait again after the horizon); 0 for one never scheduled by then
    lw_c, lw_f = c["load_wait_s"], f["load_wait_s"]
    whole = (f["finish_s"] <= horizon) | ((f["first_token_s"] <= horizon) & (f["preemptions"] == 0))
    assert lw_c[whole].tolist() == lw_f[whole].tolist()
    scheduled = f["first_scheduled_s"] <= horizon
    assert (lw_c[scheduled] <= lw_f[scheduled]).all()
    assert (lw_c[~scheduled] == 0.0).all()
    assert cut.engine.link.busy_s <= horizon


def test_a_prefill_waiting_for_a_prefetch_does_not_run_past_the_horizon():
    """S-LoRA (the audit's repro): r1's adapter is prefetched over a slow link and r2's load queues behind that copy
    in the same prefill. The cut check added only the loads without a copy in flight, so the prefill at 0.40 s
    started, waited 4.3 s for the link and ran the clock to 4.70 s with a 0.5 s horizon (load waits and link bytes
    after it). Its loads' end is known from the link's FIFO state: the prefill is in flight at the horizon."""
    prof = constant_profile(c0=0.01, kv_tokens=200_000)
    prof.components["load"].params["cpu_gbps"] = 0.1
    w = Workload.from_arrays([0.0, 0.005, 0.006], [16, 16, 16], [400, 5, 5], [0, 1, 2], [8, 64, 64])
    cfg = EngineConfig(max_total_tokens=5000, slora_prefetch=True)
    full = simulate(w, prof, cfg, policy="slora", check_invariants=True)
    assert full.summary["prefetches"] >= 1 and full.requests.loc[2, "load_wait_s"] > 4.0
    t_pre = full.requests.loc[1, "first_scheduled_s"]
    t_tok = full.requests.loc[1, "first_token_s"]
    for horizon in (0.5, 1.0, t_tok - 1e-9, t_tok, t_tok + 0.5):
        a, b = _both(w, prof, cfg, policy="slora", horizon_s=horizon, check_invariants=True)
        _assert_same(a, b)
        _assert_cut_at(full, a, horizon)
        if horizon < t_tok:  # the prefill is in flight: it started no copy, waited for none
            assert a.engine.env.now <= t_pre
            assert a.engine.link.bytes_moved == 2 * a.engine.adapters.bytes[0]  # r0's load only (the prefetch ends later)
            assert a.requests.loc[[1, 2], "load_wait_s"].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("horizon", [0.9, 1.215, 1.25, 1.3])
def test_a_vllm_step_waiting_for_a_prefetch_does_not_run_past_the_horizon(horizon):
    """vLLM engine, a prefetch in its disk read when the step that needs it starts: r1 shares r0's adapter and joins at
    0.61 s, where the prefetch of r2's adapter starts (disk 0.61-1.11 s, link 1.11-1.21 s); r2, admitted at 0.66 s
    when r1 finishes, waits for that copy, so its step ends at 1.22 s (load wait 0.55 s). The cut check once ignored
    waits: the step waited and ran the clock past the horizon. Both ends come from the link's schedule, exactly."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 0.001, 0.002], [16, 16, 16], [30, 5, 5], [0, 0, 2], [8, 8, 8])
    cfg = EngineConfig(max_loras=3, max_num_seqs=2, max_model_len=512, kv_capacity_tokens=6000)
    kw = dict(policy="slora", system="vllm", check_invariants=True)
    full = simulate(w, prof, cfg, **kw)
    r = full.requests
    assert full.summary["prefetches"] == 1 and r.loc[2, "first_token_s"] == pytest.approx(1.22)
    assert r.loc[2, "first_scheduled_s"] == pytest.approx(0.66) and r.loc[2, "load_wait_s"] == pytest.approx(0.55)
    a, b = _both(w, prof, cfg, horizon_s=horizon, **kw)
    _assert_same(a, b)
    _assert_cut_at(full, a, horizon)
    if horizon < 1.22:  # the waiting step is in flight: the clock stays at the horizon or before
        assert a.engine.env.now <= horizon


_LINK_CASES = [("slora", "vllm"), ("adapter-aware", None), ("ema-prefetch", None), ("chameleon+prefetch", "vllm"),
               ("chameleon", "vllm"), ("slora", None), ("chameleon", None), ("chameleon+prefetch", None),
               ("slora+sjf", None)]


@pytest.mark.parametrize("seed", [28, 45, 47, 64, 66, 92, 100, 120])
def test_a_steps_loads_end_where_the_link_schedule_says(seed):
    """``HostLink.loads_end`` (the horizon's check of a step with loads) gives the time SimPy's link then gives, to the
    bit: ``check_invariants`` asserts it after every step's loads. The seeds (from a differential fuzzer) have
    prefetches in their disk read when a step waiting for them starts, and synchronous copies that request the link
    at the very instant a prefetch does (the order SimPy's events give)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    arr = np.cumsum(rng.exponential(1 / float(rng.uniform(2, 40)), n))
    A = int(rng.integers(1, 12))
    ad = rng.integers(-1 if rng.random() < 0.3 else 0, A, n)
    ranks = np.asarray([8, 16, 32, 64])[rng.integers(0, 4, A)]
    w = Workload.from_arrays(arr, rng.integers(1, 1200, n), rng.integers(1, 400, n), ad,
                             np.where(ad >= 0, ranks[np.maximum(ad, 0)], 0))
    policy, system = _LINK_CASES[int(rng.integers(0, len(_LINK_CASES)))]
    prof = constant_profile(c0=0.004, c_prefill=2e-6, c_decode=2e-5, c_ctx=1e-7, sched=1e-4,
                            kv_tokens=int(rng.choice([5000, 20000, 50000])))
    prof.components["load"].params["cpu_gbps"] = float(rng.choice([0.1, 0.5, 5.0]))
    if system == "vllm" or policy in ("adapter-aware", "ema-prefetch"):
        kw = dict(max_loras=int(rng.integers(1, 6)), max_num_seqs=int(rng.integers(1, 8)), max_model_len=4096)
        if rng.random() < 0.5:
            kw["max_cpu_loras"] = kw["max_loras"] + int(rng.integers(0, 3))
    else:
        kw = dict(max_total_tokens=int(rng.choice([2500, 4000, 8000, 20000])), slora_prefetch=bool(rng.random() < 0.7))
    horizon = float(rng.uniform(0.05, arr[-1] + 2)) if rng.random() < 0.6 else None
    cfg = EngineConfig(**kw)
    full = simulate(w, prof, cfg, policy=policy, system=system, check_invariants=True)
    for h in ([horizon] if horizon else []) + [float(x) for x in full.requests["first_token_s"].dropna().iloc[::7]]:
        a, b = _both(w, prof, cfg, policy=policy, system=system, horizon_s=h, check_invariants=True)
        _assert_same(a, b)
        _assert_cut_at(full, a, h)
