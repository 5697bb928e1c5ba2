"""FastLibra's swaps as ``shared/refs/fastlibra.md`` §2 and §5 describe them (audit F): a node swapped in on
demand for a waiting query stays in HBM until that query runs, the swapper's idle swap-in brings in every
LoRA (also when nothing runs, without an in-flight cap), and its 100 ms ticks stay on their grid. Every case
runs with the invariant checks and gives the same results stepping one iteration at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

import policies  # noqa: F401
from policies.fastlibra import FastLibraCache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.interfaces import check_capabilities
from twin.registry import make_cache, make_scheduler

#: the profile's own LoRA term (none in the constant profile): step times stay c0
HAND = {"lora_compute": "profile"}


def _both(w, prof, cfg, cache, push=None, horizon_s=None):
    """The run with decode-run skipping and stepping one iteration at a time: identical; returns the first."""
    out = []
    for mrs in (None, 1):
        c = cache()
        e = Engine(w, prof, cfg, make_scheduler("fcfs"), c, horizon_s=horizon_s, max_run_steps=mrs,
                   check_invariants=True)
        if push is not None:
            push(e)
        e.run()
        out.append(e)
    a, b = out
    for col in ("first_token", "finish", "load_wait", "first_sched"):
        assert np.array_equal(getattr(a, col), getattr(b, col), equal_nan=True), col
    assert a.extensions.stats() == b.extensions.stats()
    return a


# ---------------------------------------------------------------------------------------------- holds
def _landed_lora_workload():
    """Request 0 (adapter 0) decodes for 5 steps of 0.1 s; request 1 (adapter 1, a 720-token prompt: 45 blocks)
    and request 2 (adapter 2, 16 tokens) arrive during its first step, so both adapters are copied in during
    the next one (0.02 s each) and have landed at the same step boundary (0.22 s). Request 1 comes first; its
    prompt fits only if adapter 2's 20 blocks leave the 100-block pool."""
    return Workload.from_arrays([0.0, 0.05, 0.06], [16, 720, 16], [5, 2, 2], [0, 1, 2], [8, 8, 8])


@pytest.mark.parametrize("variant", ["fastlibra", "fastlibra-wom"])
def test_a_lora_swapped_in_for_a_waiting_request_stays_until_it_runs(variant):
    """FastLibra §2/§5: a query waits for its swap-in and then runs; only cold nodes are evicted. Adapter 2,
    landed for request 2, has no running request: it was idle for the swap-out, and request 1's admission
    (first in FCFS order, same step) evicted it, so request 2 had it copied in a second time. Held until
    request 2 runs, it is copied once; request 1 waits for request 0's memory instead (its adapter 0 goes)."""
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.02)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    e = _both(_landed_lora_workload(), prof, cfg, lambda: make_cache(variant, idle=0.0, **HAND))
    s = e.extensions.stats()
    assert s["swap_in_adapters"] == 3          # adapters 0, 1, 2: none twice
    assert e.adapters.evictions == 1           # adapter 0, idle after request 0 finished
    assert e.first_sched[2] == e.first_sched[1] and e.first_sched[1] >= e.finish[0]
    assert not e.extensions._holds and not e.extensions.held_adapters
    assert e.n_finished == 3


def test_a_kv_node_swapped_in_for_a_waiting_request_stays_until_it_runs():
    """The same for a history KV node under the tree: conversation 7's turn 1 (request 3) has its history
    copied back from host memory while request 2 waits for its adapter; at the next step request 2 (first in
    FCFS order) needed blocks, and the landed KV node (an HBM leaf) was swapped out for them before turn 1
    could take it, so it was copied in twice. Held, it stays; request 2 waits for request 1's blocks."""
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.02)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    # request 0: conversation 7's turn 0 (adapter 0); request 1: a base-model request (10 blocks of prompt) that
    # keeps the batch running; request 2: adapter 1, 45 blocks of prompt; request 3: turn 1 of conversation 7
    w = Workload.from_arrays([0.0, 1.5, 1.95, 1.96], [160, 160, 720, 200], [2, 50, 2, 2], [0, -1, 1, 0], [8, 8, 8, 8],
                             conversation_id=[7, -1, -1, 7], turn=[0, 0, 0, 1], prefix_tokens=[0, 0, 0, 161])

    def to_host(e):  # at 1 s the swapper would have swapped the idle conversation out
        e.push_event(1.0, lambda t: [e.history.swap_out(n, t) for n in list(e.history.hbm_nodes())])
    e = _both(w, prof, cfg, lambda: make_cache("fastlibra", idle=0.0, **HAND), push=to_host)
    s = e.extensions.stats()
    assert s["swap_in_kv"] == 1 and s["prefix_hits"] == 1 and s["prefix_host_hits"] == 0
    assert e.first_sched[3] == e.first_sched[2] >= e.finish[1]  # request 2 waited for request 1's blocks
    assert e.extensions.hold_releases == 0
    assert e.n_finished == 4 and e.history.held_hbm_blocks == 0


def test_held_nodes_are_not_swap_out_candidates_nor_reclaimable():
    """While a request waits, its adapter and KV node are out of the swapper's candidates and of the memory an
    admission may reclaim; admitted, they are ordinary nodes again."""
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.02)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    e = Engine(_landed_lora_workload(), prof, cfg, make_scheduler("fcfs"),
               make_cache("fastlibra-wom", idle=0.0, **HAND), check_invariants=True)
    seen = []

    def probe(t):
        ext, c = e.extensions, e.cache
        seen.append((dict(e.held_adapters), [x for k, x in c.swap_out_candidates() if k == "lora"],
                     ext.reclaimable()))
    e.push_event(0.2, probe)  # at 0.22: adapters 1 and 2 landed, requests 1 and 2 not admitted yet
    e.run()
    held, loras, reclaimable = seen[0]
    assert held == {1: 1, 2: 1} and 1 not in loras and 2 not in loras and reclaimable == 0
    assert e.held_adapters == {} and e.n_finished == 3


def test_holds_never_deadlock_admission():
    """Nothing runs; request 0 (adapter 1, 61 blocks) and request 1 (adapter 2) both wait for their adapters.
    When both have landed, request 0 (FCFS's head) needs the blocks request 1's adapter holds, and FCFS stops
    at it: with the holds alone no request would ever run. The engine, idle with requests waiting and held
    nodes landed, releases those holds and plans again: request 0 runs, request 1 copies its adapter again
    after it."""
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.02)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    w = Workload.from_arrays([0.0, 0.0], [61 * 16, 16], [2, 2], [1, 2], [8, 8])
    e = _both(w, prof, cfg, lambda: make_cache("fastlibra", idle=0.0, **HAND))
    assert e.n_finished == 2 and e.extensions.hold_releases >= 1
    assert e.first_token[0] < e.first_token[1]
    assert e.extensions.stats()["swap_in_adapters"] == 3  # adapter 2 twice: its hold was released



#: stop 67's audit (fuzz seed 231): FCFS's head (request 0, adapter 3 of rank 64: 160 of the 205-block pool) waits
#: for its adapter while request 1, scanned past it, swaps in adapter 1 (40 blocks). Adapter 3 lands first, and the
#: head's 32 KV blocks no longer fit beside the adapter request 1 holds, still copying.
LIVELOCK = dict(arrival=[0.018970, 0.064979, 0.105895, 0.124043, 0.129064, 0.302970, 0.314595, 0.334976, 0.460851,
                         0.470438, 0.538124, 0.660375],
                prompt=[511, 47, 556, 91, 348, 782, 300, 615, 1092, 1072, 1351, 1165],
                output=[46, 31, 51, 35, 26, 49, 21, 39, 2, 24, 57, 21], adapter=[3, 1, 1, 2, 0, 0, 2, 2, 0, 2, 2, 1],
                rank=[64, 16, 16, 32, 8, 8, 32, 32, 8, 32, 32, 16], conversation_id=[-1, -1, 1, -1, 0, 0, 2, 2, 0, 2, 2, 1],
                turn=[0, 0, 0, 0, 0, 1, 0, 1, 2, 2, 3, 1], prefix_tokens=[0, 0, 0, 0, 0, 374, 0, 321, 831, 654, 1096, 607])


def test_holds_are_released_only_once_every_held_copy_has_landed():
    """The engine idles with the head refused (NO_KV) while request 1's adapter is still copying. Releasing the
    landed holds alone freed the head's own adapter, the busy swapper (usage 0.976 > 0.95) swapped it out at its
    next tick, the head swapped it in again, evicting the others, and so on: zero steps and the link busy forever
    (a run without a horizon never ended). Held until every held copy lands, then all released, the head runs."""
    L = LIVELOCK
    w = Workload.from_arrays(L["arrival"], L["prompt"], L["output"], L["adapter"], L["rank"],
                             conversation_id=L["conversation_id"], turn=L["turn"], prefix_tokens=L["prefix_tokens"])
    prof = constant_profile(c0=0.0412, disk_s=0.0, cpu_s=0.0746, kv_tokens=3291)
    cfg = EngineConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_loras=4, max_model_len=1600)
    a = _both(w, prof, cfg, lambda: make_cache("fastlibra", interval_s=0.03), horizon_s=60.0)
    assert a.n_finished == 12 and a.extensions.hold_releases >= 1
    assert a.extensions.stats()["swap_in_adapters"] < 20  # (the livelock: 20,108 by 10,000 s, 122 by 60 s)


def test_a_hold_on_a_history_node_replaced_while_loading_does_not_block_the_release():
    """A held history node that a later turn replaced while it was being copied in keeps ``tier == "loading"`` for
    ever (it never lands: ``HistoryKV._swapped_in`` ignores a node no longer in the store), so the release rule counts
    such a node as in flight only while it is in the store (``release_ready_holds``: ``and p.in_store(node)``).

    Pool of 100 blocks, adapters of rank 8 take 20 blocks, rank 16 40; every adapter copy takes 0.049 s, steps 0.1 s.
    Conversation 7's turns 0 and 1 (requests 0, 1; turn 1 arrived before turn 0 finished, so it found no history)
    run on adapter 0 from 0.049; turn 0 finishes at 0.249 and its history (17 tokens) is swapped out to host. At
    0.349, with turn 1 still running, FCFS tries request 2 (adapter 1, 30 blocks of prompt), then request 3 (adapter
    2, rank 16) and request 4 (conversation 7's turn 2): all three wait for copies queued on the FIFO link (adapter 1
    lands at 0.398, adapter 2 at 0.447, turn 0's history at 0.4511) and hold what they wait for; request 4 holds
    adapter 0 and the history node. At 0.449 turn 1 finishes: its history replaces turn 0's node, still loading,
    which leaves the store with ``tier == "loading"``. Request 2 (FCFS's head) is refused for KV blocks (adapters 0,
    1, 2 take 80 blocks, turn 1's history 2: 18 free + 2 reclaimable < 30) and the scan stops there, so request 4 is
    not tried again and keeps its hold on the replaced node; nothing runs. Released at once, adapters 0 and 2 become
    evictable and request 2 runs at 0.449. Counting the replaced node as in flight, nothing was ever released:
    request 2 never ran, the run stopped after its idle ticks with requests 2-4 unfinished."""
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.049)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    w = Workload.from_arrays([0.0, 0.0, 0.3, 0.3, 0.3], [16, 16, 480, 16, 40], [2, 4, 2, 2, 2], [0, 0, 1, 2, 0],
                             [8, 8, 8, 16, 8], conversation_id=[7, 7, -1, -1, 7], turn=[0, 1, 0, 0, 2],
                             prefix_tokens=[0, 17, 0, 0, 17])
    seen = []

    def setup(e):
        # at 0.26 (fired at 0.349, before the plan) turn 0's history goes to host, as the swapper would have done
        e.push_event(0.26, lambda t: [e.history.swap_out(n, t) for n in list(e.history.hbm_nodes())])
        ext, release = e.extensions, e._release_holds

        def probe(now):  # the holds each time the idle engine asks for the release
            seen.append((now, {rid: (a, None if n is None else (n.conv, n.turn, n.tier, ext.prefix.in_store(n)))
                               for rid, (a, n) in ext._holds.items()}))
            return release(now)
        e._release_holds = probe

    a = _both(w, prof, cfg, lambda: make_cache("fastlibra", idle=0.0, **HAND), push=setup, horizon_s=30.0)
    # the idle engine found request 4 holding conversation 7's turn-0 node, replaced while loading
    stale = [(t, h) for t, h in seen if h.get(4, (0, None))[1] == (7, 0, "loading", False)]
    assert stale and stale[0][0] == a.finish[1]
    assert a.n_finished == 5 and a.extensions.hold_releases == 1
    assert a.first_sched[2] == a.finish[1]  # the head ran as soon as turn 1 finished
    assert not a.extensions._holds and not a.extensions.held_adapters and a.history.held_hbm_blocks == 0


@pytest.mark.parametrize("idle, busy", [(0.95, 0.8), (0.7, 0.7), (1.0, 0.0)])
def test_swapper_thresholds_out_of_order_are_refused(idle, busy):
    """§4.2's swapper swaps in under ``idle`` and out over ``busy``: with idle >= busy it would swap the same nodes in
    and out at every tick (a fuzz case with idle 0.95, busy 0.8 ran no step before its horizon). (Each outside [0, 1]
    is refused by the options' range check, test_policies.py.)"""
    with pytest.raises(ValueError, match="0 <= idle < busy <= 1"):
        FastLibraCache(idle=idle, busy=busy)


def test_a_dropped_request_releases_its_holds():
    prof = constant_profile(c0=0.1, kv_tokens=1600, disk_s=0.0, cpu_s=0.02)
    cfg = EngineConfig(max_loras=4, max_model_len=1600)
    e = Engine(_landed_lora_workload(), prof, cfg, make_scheduler("fcfs"),
               make_cache("fastlibra", idle=0.0, **HAND), check_invariants=True)

    def drop(t):
        assert 2 in e.extensions._holds
        e.drop_arrivals([2], "test")
        assert 2 not in e.extensions._holds and 2 not in e.held_adapters
    e.push_event(0.2, drop)
    e.run()
    assert e.n_finished == 2


# ---------------------------------------------------------------------------------------------- idle swap-in
def test_swapper_swaps_in_every_lora_also_when_nothing_runs():
    """§5: below 70 % HBM the swapper swaps in the top-most host nodes by descending Eval, "effectively
    prefetching; at low load every LoRA gets loaded". Request 0 (adapter 0) runs and finishes; the server is
    then idle. The swapper's next ticks bring in adapters 1 and 2, which no request has used (Eval 0, last
    in the order), with nothing running, so requests 1 and 2 at 5 s find them in HBM: no cold start."""
    prof = constant_profile(c0=0.01, kv_tokens=20_000, disk_s=0.0, cpu_s=0.05)
    cfg = EngineConfig(max_loras=4, max_model_len=4096)
    w = Workload.from_arrays([0.0, 5.0, 5.0], [16, 16, 16], [2, 2, 2], [0, 1, 2], [8, 8, 8])
    e = _both(w, prof, cfg, lambda: make_cache("fastlibra", **HAND))
    s = e.extensions.stats()
    assert s["swap_in_adapters"] == 1 and s["lora_cold_starts"] == 1   # request 0 only
    assert s["prefetches"] == 2
    assert e.load_wait[1] == 0.0 and e.load_wait[2] == 0.0
    assert list(e.adapter_hit_code) == [2, 1, 1]
    assert e.first_token[1] - 5.0 == pytest.approx(0.01, abs=1e-9)


def test_swap_in_candidates_include_loras_without_requests():
    prof = constant_profile(c0=0.01, kv_tokens=20_000, disk_s=0.0, cpu_s=0.05)
    w = Workload.from_arrays([0.0, 1.0], [16, 16], [2, 2], [0, 1], [8, 8])
    e = Engine(w, prof, EngineConfig(max_loras=4, max_model_len=4096), make_scheduler("fcfs"),
               make_cache("fastlibra", **HAND))
    e.arr_ptr = 1  # only adapter 0's request arrived: adapter 1's prob is 0
    c = e.cache
    assert c.probs(0.5)[1] == 0.0
    assert ("lora", 1) in c.swap_in_candidates(0.5) and ("lora", 0) in c.swap_in_candidates(0.5)


def test_swapper_lora_swap_ins_are_not_capped_at_four_in_flight():
    """The swapper starts every LoRA swap-in its tick decides, not at most 4 copies in flight (the loader's
    default for a cache's predictive prefetch): §5 names only the idle threshold."""
    assert FastLibraCache.max_inflight is None
    check_capabilities(FastLibraCache())
    prof = constant_profile(c0=0.01, kv_tokens=40_000, disk_s=0.0, cpu_s=0.05)
    w10 = Workload.from_arrays([5.0 + 0.001 * i for i in range(10)], [16] * 10, [2] * 10, list(range(10)), [8] * 10)
    e = Engine(w10, prof, EngineConfig(max_loras=4, max_model_len=4096), make_scheduler("fcfs"),
               make_cache("fastlibra", **HAND), check_invariants=True)
    seen = []  # ten adapters, none requested before 5 s: all ten copies start at the first tick (0.1 s)
    e.push_event(0.1, lambda t: seen.append(len(e.adapters.loading)))
    e.run()
    assert seen == [10]
    assert e.extensions.stats()["lora_cold_starts"] == 0


# ---------------------------------------------------------------------------------------------- the tick grid
class _Ticks(FastLibraCache):
    name = "test-fastlibra-ticks"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.times: list[float] = []

    def on_tick(self, now: float) -> None:
        self.times.append(now)
        super().on_tick(now)


@pytest.mark.parametrize("c0", [0.03, 0.25])
def test_swapper_ticks_stay_on_the_100_ms_grid(c0):
    """fastlibra.md §5: "every monitor interval of 100 ms". Each tick runs at the first step boundary at or
    after its due time k * 0.1 s, the next due time is the grid's (not the boundary's plus 0.1 s, which drifted:
    with steps of 30 ms the swapper ran every 120 ms); a step that spans several due times runs one tick at its
    end and skips the due times it spanned (steps of 250 ms: ticks at 0.25, 0.5, 0.75, ...)."""
    prof = constant_profile(c0=c0, kv_tokens=20_000, disk_s=0.0, cpu_s=0.0)
    n = 1
    w = Workload.from_arrays([0.0] * n, [16] * n, [400] * n, [0] * n, [8] * n)
    caches = []

    def make():
        caches.append(_Ticks(**HAND))
        return caches[-1]
    _both(w, prof, EngineConfig(max_loras=4, max_model_len=4096), make)
    times = caches[0].times
    assert times == caches[1].times and len(times) > 20
    k_prev = 0
    for t in times:  # the tick of the first due time after the previous tick's: at the first boundary at/after it
        due = (k_prev + 1) * 0.1
        assert due <= t + 1e-9 and t - c0 < due + 1e-9, (t, due)
        k_prev = int(math.floor(t / 0.1 + 1e-9))
    if c0 < 0.1:
        assert np.diff(times).mean() == pytest.approx(0.1, abs=0.005)  # 120 ms with the drift
        assert len(times) == int(math.floor(times[-1] / 0.1 + 1e-9))   # no due time skipped
    else:
        assert times[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_fastlibra_refuses_memory_other_than_its_unified_pool():
    """FastLibra's adapters and history KV share one pool (§4); with ``adapter_memory="region"`` its swapper
    failed mid-run (its tick read the unified pool's per-adapter pages), so the cache refuses it when built."""
    with pytest.raises(ValueError, match="unified pool"):
        FastLibraCache(adapter_memory="region")
    assert FastLibraCache().adapter_memory == "unified"


def test_a_tick_prefetcher_beside_a_synchronous_one_is_refused():
    """One loader serves every prefetching policy of an engine, synchronous if any is (``AsyncLoader.sync``); a
    policy that prefetches at its tick (FastLibra's swapper) beside a scheduler with ``prefetch_sync`` had its
    background swap-ins routed to the synchronous path with no step to put them on (a crash at the first tick)."""
    from policies.slora import SLoRAScheduler
    from twin.simulate import simulate

    class SyncQueued(SLoRAScheduler):
        name = "test-sync-queued"
        prefetch_sync = True

    prof = constant_profile(c0=0.01, kv_tokens=20_000)
    w = Workload.from_arrays([0.0, 0.1], [16, 16], [8, 8], [0, 1], [8, 8])
    with pytest.raises(Exception, match="prefetches in the background at its tick"):
        simulate(w, prof, EngineConfig(max_loras=4, max_model_len=4096), scheduler_obj=SyncQueued(),
                 cache_obj=FastLibraCache())
