"""Adapter-cache policies and memory placement, each on a worked example: vLLM's LRU order,
LFU, GDSF's priorities and inflation, Chameleon's score (and FairShare), FastLibra's
formulas and dependency tree, contiguous vs paged allocation."""

from __future__ import annotations

import numpy as np
import pytest

import policies  # noqa: F401
from policies.fastlibra import lora_eval, low_lora, node_eval
from twin.registry import make_cache, make_scheduler
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.adapter_placement import ContiguousAllocator, PagedAllocator
from twin.config import EngineConfig
from twin.engine import Engine
from twin.prefix_kv import HistoryNode


def engine_with(cache: str, ranks, slots=3, scheduler="fcfs", workload=None, **cfg):
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.5, cpu_s=0.1)
    n = len(ranks)
    w = workload or Workload.from_arrays(np.arange(n) * 0.1, [10] * n, [2] * n, list(range(n)), list(ranks))
    return Engine(w, prof, EngineConfig(max_loras=slots, max_model_len=4096, **cfg), make_scheduler(scheduler),
                  make_cache(cache))


def request_adapters(e) -> np.ndarray:
    """The engine's per-request adapter column, writable: these tests rewrite which adapter the requests ask
    for after the engine is built (a policy sees the column read-only)."""
    return np.frombuffer(e.adapter_a, np.int64)


def use(mem, a, t):
    """One request of adapter ``a`` runs and leaves at time ``t``; returns its load (None: hit)."""
    ld = mem.acquire(a, t)
    mem.release(a, t)
    return ld


def test_vllm_lru_order():
    """Two slots; 0 then 1 used; 2 evicts 0 (least recently used); 0 again evicts 1."""
    e = engine_with("lru", [8, 8, 8], slots=2)
    m = e.adapters
    use(m, 0, 0.0)
    use(m, 1, 1.0)
    assert use(m, 2, 2.0).source == "disk" and m.resident == [False, True, True]
    assert use(m, 1, 3.0) is None  # hit, now most recent
    assert use(m, 0, 4.0).source == "cpu" and m.resident == [True, True, False]
    assert m.evictions == 2


def test_lfu_order_with_lru_ties():
    e = engine_with("lfu", [8, 8, 8, 8], slots=3)
    m = e.adapters
    # arrivals so far: adapter 0 x3, 1 x1, 2 x1 (LFU counts requests)
    e.arr_ptr = 0
    request_adapters(e)[:] = 0
    for a, t in ((0, 0.0), (1, 1.0), (2, 2.0)):
        use(m, a, t)
    cache = e.cache
    request_adapters(e)[:4] = [0, 0, 0, 1]
    e.arr_ptr = 4
    # counts: a0 = 3, a1 = 1, a2 = 0 -> victim a2
    assert cache.victim(3.0) == 2
    request_adapters(e)[:4] = [0, 0, 2, 1]
    cache.stats_.ptr = 0
    cache.stats_.count[:] = 0
    # counts: a0 = 2, a1 = 1, a2 = 1 -> tie between 1 and 2: least recently idle (1, at t=1)
    assert cache.victim(3.0) == 1


def test_gdsf_priorities_and_inflation():
    """H = L + F*C/S with the same copy cost C for all and sizes B, 2B, 4B (ranks 8, 16, 32):
    uses a0 x1, a1 x3, a2 x2 give H = C/B, 1.5 C/B, 0.5 C/B -> a2 is evicted and L = 0.5 C/B;
    a3 (rank 8) enters with H = L + C/B = 1.5 C/B; the next victim is a0 (C/B) and L = C/B."""
    e = engine_with("gdsf", [8, 16, 32, 8], slots=3)
    m, g = e.adapters, e.cache
    use(m, 0, 0.0)
    for t in (1.0, 1.1, 1.2):
        use(m, 1, t)
    for t in (2.0, 2.1):
        use(m, 2, t)
    B, C = m.bytes[0], 0.1
    assert m.bytes[1] == 2 * B and m.bytes[2] == 4 * B
    assert [g.H[a] * B / C for a in (0, 1, 2)] == pytest.approx([1.0, 1.5, 0.5])
    use(m, 3, 3.0)  # evicts a2
    assert m.resident == [True, True, False, True]
    assert g.L * B / C == pytest.approx(0.5) and g.H[3] * B / C == pytest.approx(1.5)
    assert g.victim(4.0) == 0 and g.L * B / C == pytest.approx(1.0)


def test_chameleon_score_and_queued_adapters():
    """Score = 0.45 F + 0.10 R + 0.45 S over normalised features. Idle a0 (10 requests, used
    at t=5, rank 8), a1 (2, t=9, rank 128), a2 (4, t=1, rank 32): F = 1, .2, .4; R = .5, 1, 0;
    S = 1/16, 1, 1/4 -> scores .528, .64, .2925: a2 is the victim; with a request of a2
    queued, a0 is; FairShare (1/3 each): .521, .733, .217 -> a2."""
    for cache, want in (("chameleon", [0.528125, 0.64, 0.2925]), ("fairshare", [0.5208333, 0.7333333, 0.2166667])):
        e = engine_with(cache, [8, 128, 32], slots=3)
        m, c = e.adapters, e.cache
        for a, t in ((0, 5.0), (1, 9.0), (2, 1.0)):
            use(m, a, t)
        c.stats_.update = lambda: None
        c.stats_.count[:] = [10, 2, 4]
        assert c.scores([0, 1, 2], 10.0) == pytest.approx(want, abs=1e-6)
        assert c.victim(10.0) == 2
    # a request of adapter 2 waits: its adapter is kept unless memory forces it
    e = engine_with("chameleon", [8, 128, 32, 32], slots=3)
    m, c = e.adapters, e.cache
    for a, t in ((0, 5.0), (1, 9.0), (2, 1.0)):
        use(m, a, t)
    c.stats_.update = lambda: None
    c.stats_.count[:] = [10, 2, 4, 0]
    e.arr_ptr = 4
    e.drop_arrivals(np.array([0, 1, 2]), "left the queue")  # requests 0-2 do not wait (through the engine's API:
    request_adapters(e)[3] = 2  # it keeps the waiting requests per adapter); request 3 (waiting) uses adapter 2
    assert c.victim(10.0) == 0


def test_fastlibra_formulas_worked_example():
    """prob = (.5, .3, .2), BS = 4: Low_lora = (1-.5^4) + (1-.7^4) + (1-.8^4) = 2.2878.
    One adapter in HBM: LoRA_Eval = 2.2878; three: max(1, .7626) = 1. A node with cost
    10 ms, prob .5, just used (t = 0): Eval = LoRA_Eval * .01 * .5 * (1 - 1/2)."""
    p = np.array([0.5, 0.3, 0.2])
    assert low_lora(p, 4) == pytest.approx(0.9375 + 0.7599 + 0.5904)
    assert lora_eval(p, 4, 1) == pytest.approx(2.2878)
    assert lora_eval(p, 4, 3) == 1.0
    assert node_eval(2.2878, 0.01, 0.5, 0.0) == pytest.approx(2.2878 * 0.01 * 0.5 * 0.5)
    assert node_eval(1.0, 0.01, 0.5, 50.0) < 1e-20  # long unused: worthless


def _fastlibra_tree(cache):
    """Adapters 0, 1 resident and idle; a KV node of adapter 0 in HBM; a KV node of adapter 2
    (not resident) in host memory."""
    n = 4
    w = Workload.from_arrays(np.arange(n) * 0.1, [100] * n, [10] * n, [0, 1, 2, 0], [8, 8, 8, 8],
                             conversation_id=[0, 1, 2, 0], turn=[0, 0, 0, 1], prefix_tokens=[0, 0, 0, 109])
    e = engine_with(cache, [8, 8, 8], workload=w)
    m = e.adapters
    use(m, 0, 0.0)
    use(m, 1, 0.0)
    store = e.history
    kv0 = HistoryNode(conv=0, adapter=0, tokens=160, blocks=10, turn=0, created=0.0, last_access=0.0)
    kv2 = HistoryNode(conv=2, adapter=2, tokens=160, blocks=10, turn=0, created=0.0, last_access=0.0, tier="host")
    store.insert(kv0)
    store.insert(kv2)
    return e, kv0, kv2


def test_fastlibra_dependency_tree_leaves_and_roots():
    e, kv0, kv2 = _fastlibra_tree("fastlibra")
    c = e.cache
    out = c.swap_out_candidates()
    assert ("kv", kv0) in out and ("lora", 1) in out and ("lora", 0) not in out  # adapter 0 has a KV child in HBM
    e.arr_ptr = 3
    inn = c.swap_in_candidates(1.0)
    assert ("lora", 2) in inn and ("kv", kv2) not in inn  # kv2's adapter is not in HBM
    e.check_invariants = True
    e.extensions.check()
    # WoM: no tree -- any node may go, KV may come back without its adapter
    e, kv0, kv2 = _fastlibra_tree("fastlibra-wom")
    e.arr_ptr = 3
    assert ("lora", 0) in e.cache.swap_out_candidates()
    assert ("kv", kv2) in e.cache.swap_in_candidates(1.0)


def test_fastlibra_swapper_thresholds():
    """Above 95% of HBM the swapper swaps leaves out down to 95%; below 70% it swaps roots in."""
    e, kv0, kv2 = _fastlibra_tree("fastlibra")
    c = e.cache
    pool = e.pool_blocks
    e.arr_ptr = 3
    ab = e.adapters.placement.ab
    e.used_blocks = e.total_blocks - 1  # almost full (the running batch): swap everything swappable
    assert c.usage() > 0.95
    c.on_tick(1.0)
    assert kv0.tier == "host" and e.adapters.resident[:2] == [False, False] and c.swaps_out == 3
    assert e.total_blocks - e.used_blocks == 1 + 10 + ab[0] + ab[1]
    # with room to spare, it stops at 95%: only the lowest-valued leaf goes
    e, kv0, kv2 = _fastlibra_tree("fastlibra")
    c = e.cache
    e.arr_ptr = 3
    e.used_blocks = e.total_blocks - (int(np.ceil(0.05 * pool)) - 5)
    c.on_tick(1.0)
    assert c.swaps_out == 1 and e.total_blocks - e.used_blocks >= int(np.ceil(0.05 * pool))
    e, kv0, kv2 = _fastlibra_tree("fastlibra")
    e.arr_ptr = 3
    c = e.cache
    assert c.usage() < 0.7
    c.on_tick(1.0)
    assert 2 in c._swapin_loras  # adapter 2 (requested recently) is brought back


def test_contiguous_fragmentation_worked_example():
    """Capacity 10: A(3)@0, B(3)@3, C(3)@6; free A and C: 7 units free but the largest hole
    is 4 (6..10), so D(5) fails contiguously; with pages of 1 unit it fits."""
    al = ContiguousAllocator(10)
    for o, s in ((0, 3), (1, 3), (2, 3)):
        assert al.try_alloc(o, s)
    al.free(0)
    al.free(2)
    assert al.free_bytes == 7 and al.largest_hole() == 4
    assert not al.try_alloc(3, 5)
    assert al.fits_if_freed(5, {1})  # evicting B makes room
    pg = PagedAllocator(10, page_bytes=1)
    for o, s in ((0, 3), (1, 3), (2, 3)):
        assert pg.try_alloc(o, s)
    pg.free(0, 3)
    pg.free(2, 3)
    assert pg.try_alloc(3, 5)
    # internal fragmentation: a 5 MiB + 1 byte adapter in 2 MiB pages takes 3 pages
    pg2 = PagedAllocator(64 << 20)
    assert pg2.footprint((5 << 20) + 1) == 6 << 20


def test_paged_loads_slightly_slower():
    e = engine_with("lru", [8, 16, 32], slots=3, adapter_memory="region", adapter_placement="paged")
    pl = e.adapters.placement
    assert pl.alloc.kind == "paged"
    ld = e.adapters.acquire(0, 0.0)
    assert ld.link_s == pytest.approx(0.1 + pl.alloc.pages_for(e.adapters.bytes[0]) * 2e-6)
    e2 = engine_with("lru", [8, 16, 32], slots=3, adapter_memory="region", adapter_placement="contiguous")
    assert e2.adapters.acquire(0, 0.0).link_s == pytest.approx(0.1)


def test_fastlibra_ablations_change_the_swap_out_choice():
    """Each ablation reaches its own ranking (no code path makes it the full policy): a KV node
    of adapter 0 and the idle adapter 1 compete for one swap-out. prob = (.4, .3, .3), BS = 8:
    Low_lora = 2.867 with 2 adapters in HBM, LoRA_Eval = 1.43. The KV node is worth 1.2x adapter
    1 without the LoRA term: FastLibra (term on) swaps the KV node out; WoL (term off) swaps
    adapter 1 out; WoS (LRU) swaps adapter 1 out, used at 0 s, before the KV node, used at 0.5 s."""
    prob = np.array([0.4, 0.3, 0.3])
    victims = {}
    for cache in ("fastlibra", "fastlibra-wol", "fastlibra-wos"):
        e, kv0, _ = _fastlibra_tree(cache)
        c = e.cache
        kv0.last_access = 0.5
        c.probs = lambda now: prob
        c.recent_batch_size = lambda: 8.0
        now = 1.0
        lora1 = ("lora", 1)
        c.lora_term = False  # adapter 1's value without the LoRA term (instance attribute, removed below)
        base = c.values(now, [lora1])[0] if c.cost_model else 1.0
        del c.lora_term
        store = e.history
        decay = node_eval(1.0, store.transfer_s(kv0.tokens), 1.0, (now - kv0.last_access) / c.decay_unit_s)
        c.node_prob = lambda node, t, p=1.2 * base / decay: p
        cands = [("kv", kv0), lora1]
        out = c.swap_out_candidates()
        assert all(x in out for x in cands)
        vals = c.values(now, cands)
        victims[cache] = cands[int(np.argmin(vals))]
    assert lora_eval(prob, 8.0, 2) == pytest.approx(1.0 + 0.4334, abs=1e-3)
    assert victims["fastlibra"][0] == "kv"
    assert victims["fastlibra-wol"] == ("lora", 1)
    assert victims["fastlibra-wos"] == ("lora", 1)


def test_fastlibra_invalid_kv_share_counts_hbm_kv_without_its_adapter():
    """WoM may swap adapter 0 out while its KV node stays in HBM: that node is invalid (FastLibra
    §1; the paper measures 48.6 % invalid KVs under WoM). With the tree, adapter 0 is not a
    swap-out candidate while the node is in HBM, so every sample finds 0 invalid blocks."""
    e, kv0, _ = _fastlibra_tree("fastlibra-wom")
    c = e.cache
    c.sample_memory()
    e.adapters.evict(0, 1.0)
    c.sample_memory()
    s = c.stats()
    assert s["fastlibra_invalid_kv_share"] == pytest.approx(10 / 20)  # 0 of 10 blocks, then 10 of 10
    assert s["fastlibra_hbm_usage_mean"] == pytest.approx(np.mean([c.usage() + e.adapters.placement.ab[0] /
                                                                    e.pool_blocks, c.usage()]))
    e, kv0, _ = _fastlibra_tree("fastlibra")
    c = e.cache
    e.used_blocks = e.total_blocks - 1  # busy: the swapper swaps every leaf out, the KV node before adapter 0
    c.on_tick(1.0)
    assert kv0.tier == "host" and not e.adapters.resident[0]
    s = c.stats()
    assert s["fastlibra_busy_tick_share"] == 1.0 and s["fastlibra_invalid_kv_share"] == 0.0


def test_ema_requests_clock_is_the_per_request_update_in_closed_form():
    """``every_requests``: the lazy closed form after any number of arrivals equals applying
    ``ema_a = alpha [a requested] + (1 - alpha) ema_a`` request by request (requests without an
    adapter only decay), and a prefetch decision falls due once per N-th request."""
    ids = [0, 2, 2, -1, 1, 2, 0, 3, 3, 3, 1, 2]
    w = Workload.from_arrays(np.arange(len(ids)) * 0.1, [10] * len(ids), [2] * len(ids), ids, [8] * len(ids))
    e = Engine(w, constant_profile(c0=0.01, kv_tokens=200_000), EngineConfig(max_loras=2, max_model_len=4096),
               make_scheduler("fcfs"), make_cache("ema-prefetch", alpha=0.3, every_requests=4))
    cache = e.cache
    assert cache.tick_interval is None  # no time ticks on the requests clock
    for hi in (1, 2, 7, 8, 12):  # catch up in uneven chunks
        e.arr_ptr = hi
        cache._catch_up()
    want = np.zeros(4)
    for a in ids:
        want *= 0.7
        if a >= 0:
            want[a] += 0.3
    np.testing.assert_allclose(cache.ema, want, rtol=1e-12, atol=1e-15)
    # decisions at the chunks that contain a 4th, 8th, 12th request: 7 (4th), 8 (8th), 12 (12th)
    assert cache.decisions == 3
    assert cache.wanted == [int(a) for a in np.argsort(-want, kind="stable")[:2]]


def test_ema_requests_clock_prefetches_once_per_decision():
    """A decision's top-K are offered to the loader once (the study's "every N requests, load
    any of the top-K not cached"); asking again before the next N-th request offers nothing."""
    ids = [1, 1, 1, 0]
    w = Workload.from_arrays(np.arange(4) * 0.1, [10] * 4, [2] * 4, ids, [8] * 4)
    e = Engine(w, constant_profile(c0=0.01, kv_tokens=200_000), EngineConfig(max_loras=2, max_model_len=4096),
               make_scheduler("fcfs"), make_cache("ema-prefetch", alpha=0.5, every_requests=2))
    cache = e.cache
    e.arr_ptr = 2
    assert list(cache.prefetch(0.0)) == [1]  # adapter 1 is top; adapter 0 never requested (EMA 0: not wanted)
    assert list(cache.prefetch(0.0)) == []
    e.arr_ptr = 3  # no new decision before the 4th request
    assert list(cache.prefetch(0.0)) == []
    e.arr_ptr = 4  # EMA: adapter 0 = 0.5 (just requested), adapter 1 = 0.875 * 0.5 = 0.4375
    assert list(cache.prefetch(0.0)) == [0, 1]


@pytest.mark.parametrize("opts", [{"alpha": 0.0}, {"alpha": 1.5}, {"every_requests": 0}, {"every_requests": 2.5},
                                  {"every_requests": True}])
def test_ema_refuses_impossible_parameters(opts):
    with pytest.raises(ValueError, match="ema-prefetch"):
        make_cache("ema-prefetch", **opts)
