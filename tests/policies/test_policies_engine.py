"""Every preset under the engine: invariants, exact decode-run skipping, accounting; the
engine extensions (prefetch, unified pool, placement, prefix KV, TP); ``twin compare``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import policies  # noqa: F401
from twin.registry import PRESETS, make_cache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.policy_checks import conversation_workload
from twin.simulate import simulate


def conv_workload(n_conv=40, turns=3, adapters=10, seed=0, gap=4.0, rps=3.0):
    """Multi-turn conversations (the conformance battery's builder, with this module's defaults)."""
    return conversation_workload(n_conv, turns, adapters, seed, gap_s=gap, rps=rps)


PROF = dict(c0=0.008, c_prefill=4e-5, c_decode=1e-4, c_ctx=1e-8, k6=1.5, lora_pct=150, sched=1e-4, k2=3e-7,
            kv_tokens=40_000, disk_s=0.08, cpu_s=0.02)
CFG = dict(max_loras=3, max_num_seqs=32, max_model_len=4096)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_invariants_and_exact_run_skipping(preset):
    """Under every preset: the engine's invariants hold at every step (KV, adapter memory,
    pool accounting), everything finishes, and advancing decode runs gives exactly the
    step-by-step results."""
    prof = constant_profile(**PROF)
    w = conv_workload(n_conv=30, seed=1)
    cfg = EngineConfig(**CFG)
    a = simulate(w, prof, cfg, policy=preset, check_invariants=True)
    s = a.summary
    assert s["requests_finished"] + s["requests_rejected"] == s["requests_arrived"] == len(w)
    b = simulate(w, prof, cfg, policy=preset, max_run_steps=1)
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    assert a.summary["step_segments"] <= b.summary["step_segments"]


def test_default_path_installs_nothing():
    """fcfs + lru (vLLM) installs no extension: every hook stays None/False."""
    prof = constant_profile(**PROF)
    res = simulate(conv_workload(n_conv=5), prof, EngineConfig(**CFG), policy="vllm")
    e = res.engine
    assert e.extensions is None and e._admit_hook is None and e._reclaim is None and e._finish_hook is None
    assert e._prefetch_on is False and "adapter_memory" not in res.summary


def test_unified_pool_reclaims_idle_adapters_before_preempting():
    """Chameleon's cache lives in idle memory: with a pool that cannot hold both the cache
    and the batch's KV, idle adapters are evicted (blocks reclaimed) instead of preempting."""
    prof = constant_profile(**{**PROF, "kv_tokens": 6000})
    rng = np.random.default_rng(2)
    n = 120
    w = Workload.from_arrays(np.sort(rng.uniform(0, 20, n)), rng.integers(50, 600, n), rng.integers(20, 200, n),
                             rng.integers(0, 12, n), np.full(n, 8))
    res = simulate(w, prof, EngineConfig(max_loras=2, max_num_seqs=32, max_model_len=2048), policy="chameleon",
                   check_invariants=True, system="vllm")  # the vLLM engine's unified-pool extension
    s = res.summary
    assert s["adapter_memory"] == "unified" and s["reclaimed_blocks"] > 0
    e = res.engine
    # the pool: KV blocks + adapter blocks add up to the whole pool at the end
    assert e.total_blocks + e.adapters.placement.adapter_blocks == e.pool_blocks


def test_async_prefetch_hides_load_sync_does_not():
    """S-LoRA prefetches the adapter of a queued request while the batch runs: its load no
    longer sits on a step's critical path. r0 (adapter 0) runs 40 decode steps; r1 (adapter 1,
    arriving just after) is admitted in the same step... so use max_num_seqs=1: r1 waits in
    the queue while r0 runs, its adapter is prefetched, and r1 starts with no load wait."""
    prof = constant_profile(c0=0.01, disk_s=0.05, cpu_s=0.02, kv_tokens=40_000)
    w = Workload.from_arrays([0.0, 0.001], [10, 10], [40, 2], [0, 1], [8, 8])
    cfg = EngineConfig(max_loras=2, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=2048)
    base = simulate(w, prof, cfg, scheduler="fcfs", cache="none", check_invariants=True).requests
    pre = simulate(w, prof, cfg, policy="slora", check_invariants=True, system="vllm")  # the vLLM engine's prefetch
    r = pre.requests
    assert base.loc[1, "load_wait_s"] == pytest.approx(0.07)  # disk 0.05 + copy 0.02 on the critical path
    assert r.loc[1, "load_wait_s"] == 0.0 and pre.summary["prefetches"] >= 1
    assert r.loc[1, "ttft_s"] < base.loc[1, "ttft_s"] - 0.06


def test_request_admitted_while_its_adapter_loads_waits_for_the_rest():
    """A request whose adapter is still being prefetched makes its step wait only for the
    remaining part of the copy (late hit)."""
    prof = constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.2, kv_tokens=40_000)
    # r0 (adapter 0) runs 8 steps (max_num_seqs=1); r1 (adapter 1) waits in the queue
    w = Workload.from_arrays([0.0, 0.001], [10, 10], [8, 2], [0, 1], [8, 8])
    cfg = EngineConfig(max_loras=2, max_num_seqs=1, max_num_batched_tokens=64, max_model_len=2048)
    res = simulate(w, prof, cfg, policy="slora", check_invariants=True, system="vllm")  # the vLLM engine's prefetch
    assert res.summary["prefetch_late_hits"] == 1
    r = res.requests
    assert 0.05 < r.loc[1, "load_wait_s"] < 0.15
    # r0's own (synchronous) load makes its first step end at 0.21; r1, arrived meanwhile,
    # is prefetched from 0.21 (copy until 0.41); r0 finishes at 0.28, r1 joins and waits for
    # the copy, then its prefill step: first token at 0.42
    assert r.loc[1, "first_token_s"] == pytest.approx(0.42, abs=1e-9)


def test_ema_sync_prefetch_raises_tail_latency():
    """The adaptive-caching result: synchronous prefetching puts copies on the critical
    path of steps, so the P99 TTFT is no better than with asynchronous prefetching."""
    prof = constant_profile(c0=0.01, c_prefill=2e-5, c_decode=1e-4, disk_s=0.1, cpu_s=0.05, kv_tokens=60_000)
    rng = np.random.default_rng(4)
    n = 300
    pop = rng.zipf(1.4, n) % 16
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.1, n)), rng.integers(20, 300, n), rng.integers(5, 60, n),
                             pop, np.full(n, 8))
    cfg = EngineConfig(max_loras=4, max_num_seqs=32, max_model_len=2048)
    a = simulate(w, prof, cfg, policy="ema-prefetch", check_invariants=True).summary
    s = simulate(w, prof, cfg, policy="ema-prefetch-sync", check_invariants=True).summary
    assert a["prefetch_mode"] == "async" and s["prefetch_mode"] == "sync"
    assert s["ttft_ms_p99"] >= a["ttft_ms_p99"]


def test_prefix_reuse_serves_later_turns_from_history_kv():
    """Turn 1 of a conversation re-sends turn 0 (prefix_tokens): with history KV kept
    (FastLibra, vLLM prefix caching) its prefill starts after the cached prefix; S-LoRA drops
    history KV and recomputes it."""
    prof = constant_profile(c0=0.01, c_prefill=1e-4, kv_tokens=40_000, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 5.0], [1000, 1500], [11, 5], [0, 0], [8, 8], conversation_id=[7, 7],
                             turn=[0, 1], prefix_tokens=[0, 1011])
    cfg = EngineConfig(max_loras=2, max_num_seqs=8, max_model_len=4096)
    drop = simulate(w, prof, cfg, policy="slora", check_invariants=True, system="vllm")
    # the profile's own LoRA compute (none here), not the paged Punica estimate: times by hand
    keep = simulate(w, prof, cfg, policy="fastlibra", cache_obj=make_cache("fastlibra", lora_compute="profile"),
                    check_invariants=True)
    assert keep.summary["prefix_hits"] == 1 and keep.summary["prefix_hit_tokens"] == 1010  # 1000 + 11 - 1 computed
    # turn 1 prefills 1500 tokens without reuse (2048-token budget: one step), 490 with it
    assert drop.requests.loc[1, "ttft_s"] == pytest.approx(0.01 + 1500e-4, abs=1e-9)
    assert keep.requests.loc[1, "ttft_s"] == pytest.approx(0.01 + 490e-4, abs=1e-9)


def test_contiguous_placement_fragments_paged_does_not():
    """Seed write-up: adapters of mixed ranks placed contiguously in the slots' memory fail
    to allocate after many load/evict cycles although enough bytes are free (external
    fragmentation); 2 MB pages never fail, waste a little of each last page and load slightly slower."""
    prof = constant_profile(c0=0.005, kv_tokens=60_000, disk_s=0.0, cpu_s=0.001)
    rng = np.random.default_rng(0)
    n = 400
    ad = rng.integers(0, 30, n)
    ranks = np.array([8, 16, 32, 64, 128])[ad % 5]
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), rng.integers(5, 50, n), rng.integers(1, 10, n),
                             ad, ranks)
    cfg = EngineConfig(max_loras=3, max_num_seqs=8, max_model_len=2048)
    c = simulate(w, prof, cfg, policy="vllm-contiguous", check_invariants=True).summary
    p = simulate(w, prof, cfg, policy="vllm-paged", check_invariants=True).summary
    assert c["adapter_placement"] == "contiguous" and c["adapter_alloc_failures"] > 0
    assert p["adapter_placement"] == "paged" and p["adapter_alloc_failures"] == 0
    # Llama adapters are whole numbers of 2 MB pages: no internal fragmentation here (see
    # test_policies_cache.py for odd sizes)
    assert 0 <= p["adapter_internal_fragmentation"] < 0.05
    assert c["adapter_fragmentation_evictions"] > 0


def test_tensor_parallel_shrinks_compute_not_the_load_fixed_cost():
    """Chameleon Fig. 5: with TP each GPU loads 1/TP of the adapter but the fixed cost stays,
    while the step's compute shrinks by ~1/TP: loading grows relative to compute."""
    from twin.perf.profile import DEFAULT_PROFILE, Profile
    from twin.tensor_parallel import tp_profile

    prof = Profile.from_dict(DEFAULT_PROFILE)
    p2 = tp_profile(prof, 2)
    assert tp_profile(prof, 1) is prof
    c0 = DEFAULT_PROFILE["components"]["backbone"]["params"]["c0"]
    big1, big2 = prof.backbone_s(2000, 64, 0), p2.backbone_s(2000, 64, 0)
    assert big2 < big1 and big2 > c0 + (big1 - c0) / 2  # halved variable part + all-reduce cost
    nb = prof.adapter_bytes(64)
    lp = DEFAULT_PROFILE["components"]["load"]["params"]
    assert prof.load_s(64, "cpu", 2) == pytest.approx(lp["cpu_fixed_s"] + nb / 2 / (lp["cpu_gbps"] * 1e9))
    ratio1 = prof.load_s(64, "cpu", 1) / big1
    ratio2 = prof.load_s(64, "cpu", 2) / big2
    assert ratio2 > ratio1 * 0.9  # the load does not shrink as much as the compute
    # the engine applies it
    w = Workload.from_arrays([0.0], [2000], [2], [0], [8])
    t1 = simulate(w, prof, EngineConfig(max_loras=1)).requests.loc[0, "ttft_s"]
    t2 = simulate(w, prof, EngineConfig(max_loras=1, tensor_parallel=2)).requests.loc[0, "ttft_s"]
    assert t2 < t1


def test_compare_command_writes_table_and_figure(tmp_path, capsys):
    from twin.cli import main
    from twin.compare import sustained_rps

    assert sustained_rps([6, 8, 9], [500.0, 900.0, 3000.0], 1.0) == pytest.approx(8 + (1000 - 900) / (3000 - 900))
    assert sustained_rps([6, 8], [2000.0, 3000.0], 1.0) == 0.0
    assert sustained_rps([6, 8], [100.0, 300.0], 1.0) == 8
    from twin.compare import format_sustained, sustained_bound

    assert sustained_bound([6, 8, 9], [500.0, 900.0, 3000.0], 1.0) == "="
    assert sustained_bound([6, 8], [100.0, 300.0], 1.0) == ">="  # the knee lies above the sweep: a bound
    assert sustained_bound([6, 8], [2000.0, 3000.0], 1.0) == "<"
    # a rate whose every request was rejected has no P99: the last rate that met the SLO is a lower bound, not an
    # interpolation (the knee lies somewhere before the unmeasured rate)
    assert sustained_rps([6, 8, 9], [500.0, None, 300.0], 1.0) == 6
    assert sustained_bound([6, 8, 9], [500.0, None, 300.0], 1.0) == ">="
    assert sustained_bound([6, 8], [None, 300.0], 1.0) == "<"
    gap = format_sustained({"a": 6.0}, {"a": ">="}, [6, 8, 9])
    assert "every request rejected" in gap[0] and "sweep higher" not in gap[0]
    lines = format_sustained({"a": 8.0, "b": 8.0, "c": 7.0}, {"a": ">=", "b": ">=", "c": "="}, [6, 8])
    assert ">=" in lines[0] and "x a" not in "".join(lines)  # no ratio to a bound
    lines = format_sustained({"a": 7.0, "b": 7.5}, {"a": "=", "b": "="}, [6, 8])
    assert "(1.07x a)" in lines[1]
    rc = main(["compare", "--trace", "synthetic", "--policies", "vllm,slora", "--rps", "1,2", "--duration", "20",
               "--adapters", "10", "--profile", "embedded", "--slo", "2.0", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "TTFT p99 ms" in out and "slora" in out and "sustained throughput" in out
    df = pd.read_csv(tmp_path / "compare.csv")
    assert len(df) == 4 and set(df["policy"]) == {"vllm", "slora"}
    assert (tmp_path / "compare.png").stat().st_size > 1000


@pytest.mark.parametrize("capped", [False, True])
def test_fcfs_lazy_head_heap_is_exact(capped):
    """FCFS's head heap, rebuilt only when every slot is taken (``lazy_heap``), gives exactly the
    results of pushing every admitted adapter's next head; slots alternate between full and free,
    with preemptions and (``fcfs+client-cap``) arrivals that fail at the client."""
    from policies.client_cap import ClientCappedFCFS
    from policies.fcfs import FCFSScheduler
    from tests.helpers import random_workload

    prof = constant_profile(**{**PROF, "kv_tokens": 12_000})
    w = random_workload(n=500, rps=7.0, adapters=16, seed=11)
    cfg = EngineConfig(max_loras=4, max_num_seqs=24, max_model_len=4096)
    out = []
    for lazy in (True, False):
        sched = ClientCappedFCFS(client_cap=40, preload_cpu=False) if capped else FCFSScheduler()
        sched.lazy_heap = lazy
        rebuilds = []
        sched._rebuild_heap = (lambda f: lambda: (rebuilds.append(1), f())[1])(sched._rebuild_heap)
        res = simulate(w, prof, cfg, scheduler_obj=sched, cache_obj=make_cache("lru"), check_invariants=True)
        out.append((res, sched, len(rebuilds)))
    (a, sa, na), (b, sb, nb) = out
    assert a.summary["preemptions"] > 0, "the scenario must exercise preemption"
    assert not capped or sa.n_dropped > 0, "the scenario must drop arrivals at the client"
    assert na > 0 and nb == 0, "the lazy heap must have been rebuilt (and only the lazy one)"
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    for k, v in a.summary.items():
        if k not in ("wall_s", "x_realtime"):
            assert b.summary[k] == v, k


def test_client_cap_drops_are_the_same_as_stepping_one_iteration_at_a_time():
    """Which arrivals fail at the client depends on the requests in flight when each arrives; a run of decode
    steps took arrivals in only at its end, after its finishes, so it dropped fewer requests than stepping
    (here 1 of the 6 where stepping drops 3; with a scheduler term, every finish time moved too)."""
    from policies.client_cap import ClientCappedFCFS
    from tests.helpers import random_workload

    w = Workload.from_arrays([0.0, 0.0, 0.0, 0.3, 0.4, 0.5], [10] * 6, [100, 100, 5, 5, 5, 5], [0] * 6, [8] * 6)
    cfg = EngineConfig(max_loras=2, max_num_seqs=2, max_model_len=2048)
    for prof in (constant_profile(c0=0.01, kv_tokens=40_000), constant_profile(c0=0.01, sched=1e-4, k2=1e-3,
                                                                                kv_tokens=40_000)):
        runs = [simulate(w, prof, cfg, scheduler_obj=ClientCappedFCFS(client_cap=3), cache="lru", max_run_steps=k)
                for k in (None, 1)]
        assert list(runs[1].requests["outcome"]) == ["finished"] * 3 + ["unfinished"] * 3  # as stepping drops them
        pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    # an overloaded random workload: drops, preemptions, runs cut at the arrival that may fail
    prof = constant_profile(**{**PROF, "kv_tokens": 12_000})
    w = random_workload(n=500, rps=7.0, adapters=16, seed=11)
    cfg = EngineConfig(max_loras=4, max_num_seqs=24, max_model_len=4096)
    runs = [simulate(w, prof, cfg, scheduler_obj=ClientCappedFCFS(client_cap=40, preload_cpu=False), cache="lru",
                     max_run_steps=k) for k in (None, 1)]
    assert runs[0].summary["preemptions"] > 0 and (runs[0].requests["outcome"] == "unfinished").sum() > 0
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)


def test_sjf_capped_at_its_skips_runs_decode_steps_exactly():
    """Once ``max_skips`` requests were skipped for a slot, SJF re-planned every step (next_change_time -inf);
    the skipped requests stay refused until a finish, an admission or a load's end, which end a run anyway,
    so runs of decode steps give exactly the results of stepping one iteration at a time."""
    from policies.sjf import SJFScheduler
    from tests.helpers import random_workload

    prof = constant_profile(**{**PROF, "kv_tokens": 12_000})
    w = random_workload(n=600, rps=9.0, adapters=120, seed=0)
    cfg = EngineConfig(max_loras=2, max_num_seqs=24, max_model_len=4096)
    capped = []

    class Watched(SJFScheduler):
        name = "t-sjf-watched"

        def schedule_waiting(self, ctx):
            stop = super().schedule_waiting(ctx)
            capped.append(self._capped)
            return stop

    runs = [simulate(w, prof, cfg, scheduler_obj=Watched(max_skips=4), cache_obj=make_cache("lru"),
                     max_run_steps=k) for k in (None, 1)]
    assert sum(capped) > 100, "the scenario must reach the skip cap"
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests, check_exact=True)
    assert runs[0].summary["step_segments"] < runs[0].summary["engine_steps"] / 5  # decode steps run together
