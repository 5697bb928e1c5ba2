"""The contract of :mod:`twin.extensions`: what :func:`~twin.extensions.install_extensions` installs or refuses at
start-up, and the hook points of :class:`~twin.extensions.Extensions`.

* installation: nothing on vLLM's default path; one loader for every prefetching policy (the largest in-flight cap,
  none when any policy sets none; synchronous when any policy is); the start-up refusals, with their messages;
* memory reclaim (S-LoRA's unified pool, FastLibra's history KV): history KV goes first, least recently used first
  (dropped, or swapped to host with ``history_to_host``), then idle adapters in the cache's victim order, stopping
  as soon as enough is freed; the adapter of the request being admitted (``pin``) is kept by the built-in victim
  orders while another idle adapter can go (``reclaim_pin``), and reclaimed again when an order takes it; adapters and nodes held for waiting requests are never taken, and a victim that names a held adapter is
  a policy error; a cache's own ``reclaim_blocks`` replaces the order; :meth:`~Extensions.reclaimable` is exactly
  what :meth:`~Extensions.reclaim` can free;
* admission (:meth:`~Extensions.admit`): a request whose blocks cannot be found even by reclaiming is refused for
  its adapter's memory (counted once per request) when the adapter is what does not fit, else for KV.

The reclaim scenario, built by a short run: a unified pool of 74 blocks of 16 tokens; rank-8 adapters take
40 MiB / 2 MiB = 20 blocks each. Conversations 0, 1, 2 (adapters 0, 1, 2; prompts 32, 48, 16 tokens, 2 output
tokens) run one after the other, at 0, 1 and 2 s: each leaves its history (33, 49, 17 tokens: 3, 4, 2 blocks) and
its idle adapter. Settled: 9 history blocks, 60 adapter blocks, 5 free; the oldest history and the least recently
used adapter are conversation 0's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import policies  # noqa: F401  (registers the built-in policies)
from policies.fcfs import FCFSScheduler
from policies.lru import LRUCache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.extensions import install_extensions
from twin.interfaces import Admit, PolicyError
from twin.registry import make_cache, make_scheduler

NODE_BLOCKS = {0: 3, 1: 4, 2: 2}  # conversation -> its history's blocks: ceil((prompt + 2 - 1) / 16)
AB = 20                           # blocks of a rank-8 adapter: 40 MiB in 2-MiB blocks
POOL = 74


class _UnifiedLRU(LRUCache):
    """LRU order in a unified pool with history KV; ``victim`` skips adapters held for waiting requests (a cache
    policy must, ``Extensions.reclaim``) unless ``blind``."""

    name = "t-unified-lru"

    def __init__(self, blind: bool = False, **memory: Any) -> None:
        memory.setdefault("adapter_memory", "unified")
        memory.setdefault("prefix_kv", True)
        super().__init__(**memory)
        self.blind = blind
        self.history_events: list[tuple[str, int]] = []

    def victim(self, now: float) -> int:
        held = self.engine.held_adapters
        return next(a for a in self.idle if self.blind or a not in held)

    def on_history(self, node: Any, what: str, now: float) -> None:
        self.history_events.append((what, node.conv))


class _PrefetchingUnifiedLRU(_UnifiedLRU):
    """The same with a prefetch hook (which installs the loader); it decides nothing by itself."""

    name = "t-unified-lru-prefetch"

    def prefetch(self, now: float) -> list[int]:
        return []


def _settled(cache: _UnifiedLRU | None = None) -> Engine:
    """The reclaim scenario of the module docstring, run to its end (every request finished)."""
    cache = cache if cache is not None else _UnifiedLRU()
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1, kv_tokens=POOL * 16)
    w = Workload.from_arrays([0.0, 1.0, 2.0], [32, 48, 16], [2, 2, 2], [0, 1, 2], [8, 8, 8],
                             conversation_id=[0, 1, 2], turn=[0, 0, 0], prefix_tokens=[0, 0, 0])
    cfg = EngineConfig(max_loras=4, max_model_len=1024, kv_capacity_tokens=POOL * 16)
    e = Engine(w, prof, cfg, make_scheduler("fcfs"), cache, check_invariants=True)
    e.run()
    return e


def _hbm_convs(e: Engine) -> list[int]:
    return sorted(n.conv for n in e.history.hbm_nodes())


def _resident(e: Engine) -> list[int]:
    return [a for a in range(3) if e.adapters.resident[a]]


def test_the_settled_scenario_is_the_one_the_tests_reason_about() -> None:
    """(The premises of the reclaim tests, from the module docstring.)"""
    e = _settled()
    ext = e.extensions
    assert e.n_finished == 3 and ext.memory == "unified"
    assert e.adapters.placement.ab[:3] == [AB] * 3
    assert {n.conv: n.blocks for n in e.history.hbm_nodes()} == NODE_BLOCKS
    assert [n.conv for n in sorted(e.history.hbm_nodes(), key=lambda n: n.last_access)] == [0, 1, 2]
    assert list(e.cache.idle) == [0, 1, 2]
    assert ext.pool_blocks == POOL and e.total_blocks == POOL - 9 - 3 * AB == 5 and e.used_blocks == 0


@pytest.mark.parametrize("n, pin, freed, convs_left, adapters_left", [
    (1, -1, 3, [1, 2], [0, 1, 2]),             # the oldest history node covers it
    (4, -1, 3 + 4, [2], [0, 1, 2]),            # history in LRU order, stopping as soon as it is enough
    (9, -1, 9, [], [0, 1, 2]),                 # all history before any adapter
    (10, -1, 9 + AB, [], [1, 2]),              # then the cache's victim: adapter 0 (idle first)
    (10, 0, 9 + 2 * AB, [], [2]),              # the pinned adapter taken: its blocks are reclaimed again
    (10, 1, 9 + AB, [], [1, 2]),               # a pin the order does not reach changes nothing
    (10 ** 6, -1, 9 + 3 * AB, [], []),         # everything reclaimable, then it stops
], ids=["oldest-node", "nodes-lru", "all-nodes", "then-victim", "pin-taken", "pin-not-reached", "everything"])
def test_reclaim_takes_history_kv_first_least_recently_used_then_idle_adapters_in_victim_order(
        n: int, pin: int, freed: int, convs_left: list[int], adapters_left: list[int]) -> None:
    e = _settled()
    ext = e.extensions
    total0 = e.total_blocks
    assert ext.reclaim(n, 10.0, pin=pin) == freed
    assert _hbm_convs(e) == convs_left and _resident(e) == adapters_left
    assert e.total_blocks == total0 + freed and ext.reclaimed_blocks == freed
    assert all(what == "drop" for what, _ in e.cache.history_events if what != "store")
    ext.check()  # pool accounting: KV + adapters + history == the pool


BUILT_IN_VICTIM_ORDERS = ["lru", "lfu", "gdsf", "ema-prefetch", "chameleon", "fairshare", "chameleon+prefetch"]


@pytest.mark.parametrize("name", BUILT_IN_VICTIM_ORDERS)
def test_the_built_in_victim_orders_keep_the_admitting_request_s_adapter(name: str) -> None:
    """An admission short of 10 blocks (the history's 9 and one adapter) pins its own adapter, the very one the
    cache would evict first: the cache names another (``reclaim_pin``), so one adapter goes, not the pinned one and
    then another. Before stop 69 every built-in order evicted the pinned adapter, the reclaim compensated (two
    adapters' blocks for one short), and the request reloaded its adapter at its admitting step (the audit found
    it in 50 of 315 fuzz cases with Chameleon's cache). ``reclaim_pin`` is back to -1 afterwards."""
    def settled() -> Engine:
        return _settled(make_cache(name, adapter_memory="unified", prefix_kv=True))
    first = settled().cache.victim(10.0)  # (the order's first victim with nothing pinned)
    e = settled()
    ext = e.extensions
    assert ext.reclaim(10, 10.0, pin=first) == 9 + AB
    assert e.adapters.resident[first] and len(_resident(e)) == 2
    assert e.cache.reclaim_pin == -1 and ext.reclaimed_blocks == 9 + AB
    ext.check()


@pytest.mark.parametrize("name", BUILT_IN_VICTIM_ORDERS)
def test_a_pinned_adapter_is_taken_when_it_is_the_only_idle_one(name: str) -> None:
    """With adapters 1 and 2 gone, the pinned adapter 0 is the only idle one: the order may name it (``unpinned``
    keeps a lone pin), and its blocks are reclaimed again, as for a victim order that ignores the pin."""
    e = _settled(make_cache(name, adapter_memory="unified", prefix_kv=True))
    e.adapters.evict(1, e.now)
    e.adapters.evict(2, e.now)
    assert e.extensions.reclaim(e.total_blocks + 10, 10.0, pin=0) == 9 + AB
    assert _resident(e) == []


def test_reclaim_swaps_history_to_host_when_the_policy_keeps_it() -> None:
    """``history_to_host``: the reclaimed node is swapped out (host tier), not dropped; its blocks are freed."""
    e = _settled(_UnifiedLRU(history_to_host=True))
    assert e.extensions.reclaim(1, 10.0) == NODE_BLOCKS[0]
    assert e.history.nodes[0].tier == "host" and _hbm_convs(e) == [1, 2]
    assert e.cache.history_events[-1] == ("swap_out", 0)


def test_held_adapters_and_history_nodes_are_never_reclaimed() -> None:
    """A waiting request holds adapter 0 (the LRU victim) and conversation 1's node: everything else can go
    (3 + 2 history blocks, adapters 1 and 2), the held ones stay, and the reclaim stops when only they are left."""
    e = _settled()
    ext = e.extensions
    ext._hold(7, 0, e.history.nodes[1])
    assert dict(e.held_adapters) == {0: 1} and e.history.nodes[1].held == 1
    want = NODE_BLOCKS[0] + NODE_BLOCKS[2] + 2 * AB
    assert ext.reclaimable() == want
    assert ext.reclaim(10 ** 6, 10.0) == want
    assert _hbm_convs(e) == [1] and _resident(e) == [0]


def test_a_victim_that_names_a_held_adapter_is_a_policy_error() -> None:
    e = _settled(_UnifiedLRU(blind=True))
    ext = e.extensions
    ext._hold(7, 0, None)
    with pytest.raises(PolicyError, match=r"chose adapter 0 as victim, but it is held for a waiting request"):
        ext.reclaim(10, 10.0)


@pytest.mark.parametrize("state", ["plain", "held", "loading", "excluded"])
def test_reclaimable_is_exactly_what_reclaim_can_free(state: str) -> None:
    """In each state the blocks :meth:`reclaimable` counts are those an unbounded reclaim frees: plain (all 69),
    with holds (adapter 0 and conversation 2's node left out), with an adapter whose copy is still in flight (a
    loading adapter is not evictable), and with the exclusions an admission makes (the node it is about to take,
    the adapter it needs: both left out of the count)."""
    e = _settled(_PrefetchingUnifiedLRU())
    ext, mem = e.extensions, e.adapters
    kw: dict[str, Any] = {}
    expected = 9 + 3 * AB
    if state == "held":
        ext._hold(7, 0, e.history.nodes[2])
        expected -= AB + NODE_BLOCKS[2]
    elif state == "loading":
        mem.evict(2, e.now)
        assert ext.loader.start(2, e.now) and 2 in mem.loading
        expected -= AB
    elif state == "excluded":
        kw = dict(exclude_node=e.history.nodes[1], exclude_adapter=1)
        expected -= NODE_BLOCKS[1] + AB
    assert ext.reclaimable(**kw) == expected
    if state == "excluded":  # (an admission takes the node and pins the adapter: what is left for others)
        assert ext.reclaimable() == 9 + 3 * AB
        return
    assert ext.reclaim(10 ** 6, 10.0) == expected
    assert ext.reclaimable() == 0


def test_reclaim_for_step_frees_what_it_can_and_says_whether_the_shortage_is_covered() -> None:
    e = _settled()
    assert e.extensions.reclaim_for_step(NODE_BLOCKS[0]) is True and _hbm_convs(e) == [1, 2]  # (exactly covered)
    e = _settled()
    assert e.extensions.reclaim_for_step(9 + 3 * AB + 1) is False
    assert _hbm_convs(e) == [] and _resident(e) == []  # (the caches are shrunk anyway, before any preemption)


class _OwnReclaim(_UnifiedLRU):
    name = "t-own-reclaim"

    def __init__(self, **memory: Any) -> None:
        super().__init__(**memory)
        self.asked: list[tuple[int, float, int]] = []

    def reclaim_blocks(self, n: int, now: float, pin: int) -> int:
        self.asked.append((n, now, pin))
        freed = self.engine.history.drop(self.engine.history.nodes[2], now)  # the newest node, its own choice
        return freed


def test_a_cache_s_own_reclaim_blocks_replaces_the_engine_order() -> None:
    e = _settled(_OwnReclaim())
    ext = e.extensions
    assert ext.reclaim(5, 10.0, pin=1) == NODE_BLOCKS[2]
    assert e.cache.asked == [(5, 10.0, 1)]
    assert _hbm_convs(e) == [0, 1] and _resident(e) == [0, 1, 2] and ext.reclaimed_blocks == NODE_BLOCKS[2]


# ---------------------------------------------------------------------------------------------- admission
def test_admission_reclaims_the_shortfall_with_the_admitted_adapter_pinned() -> None:
    """A request of resident adapter 1 needs 7 blocks, 5 are free: the 2 missing are reclaimed (conversation 0's
    3-block node, the oldest); nothing else, and no prefix hit (h = 0)."""
    e = _settled()
    ext = e.extensions
    ctx = SimpleNamespace(budget=2048, chunks=[], loads=[], load_rids=[])
    assert ext.admit(ctx, 1, 1, 100, 7) == 0
    assert _hbm_convs(e) == [1, 2] and _resident(e) == [0, 1, 2] and e.total_blocks == 5 + NODE_BLOCKS[0]


@pytest.mark.parametrize("nb, outcome, blocked", [(60, Admit.NO_SLOT, 1), (80, Admit.NO_KV, 0)])
def test_a_request_that_cannot_get_its_blocks_is_refused_for_its_adapter_or_for_kv(
        nb: int, outcome: Admit, blocked: int) -> None:
    """Adapter 2 evicted (25 blocks free; 9 history + 40 adapter blocks reclaimable: 74). A request of adapter 2
    needs its 20 adapter blocks and ``nb`` for its first chunk: 60 + 20 > 74 but 60 alone fits -- its adapter's
    memory refuses it (counted once, however often it is tried); 80 cannot fit at all -- refused for KV. Nothing
    is reclaimed for a refused request."""
    e = _settled()
    ext = e.extensions
    e.adapters.evict(2, e.now)
    assert e.total_blocks == 25 and ext.reclaimable() == 9 + 2 * AB
    ctx = SimpleNamespace(budget=4096, chunks=[], loads=[], load_rids=[])
    for _ in range(3):
        assert ext.admit(ctx, 2, 2, 2000, nb) == outcome
    assert ext.blocked == blocked and ext.stats()["requests_blocked_by_adapter_memory"] == blocked
    assert _hbm_convs(e) == [0, 1, 2] and _resident(e) == [0, 1] and ext.reclaimed_blocks == 0


# ---------------------------------------------------------------------------------------------- installation
class _QueuePrefetch(FCFSScheduler):
    name = "t-queue-prefetch"

    def __init__(self, max_inflight: int | None = 2, prefetch_sync: bool = False, prefetch_at_tick: bool = False,
                 interval: float | None = 0.5) -> None:
        super().__init__()
        self.max_inflight = max_inflight
        self.prefetch_sync = prefetch_sync
        self.prefetch_at_tick = prefetch_at_tick
        self.interval = interval

    @property
    def tick_interval(self) -> float | None:
        return self.interval

    def prefetch(self, now: float) -> list[int]:
        return []


class _CachePrefetch(LRUCache):
    name = "t-cache-prefetch"

    def __init__(self, max_inflight: int | None = 6, **memory: Any) -> None:
        super().__init__(**memory)
        self.max_inflight = max_inflight

    def prefetch(self, now: float) -> list[int]:
        return []


def _build(scheduler: Any, cache: Any) -> Engine:
    prof = constant_profile(c0=0.01, kv_tokens=4096)
    w = Workload.from_arrays([0.0, 0.1], [16, 16], [2, 2], [0, 1], [8, 8])
    return Engine(w, prof, EngineConfig(max_loras=2, max_model_len=1024), scheduler, cache)


@pytest.mark.parametrize("sched_kw, cache_kw, cap, sync", [
    (dict(max_inflight=2), dict(max_inflight=6), 6, False),                  # the largest cap
    (dict(max_inflight=None), dict(max_inflight=6), float("inf"), False),    # a policy without a bound: none
    (dict(max_inflight=3), dict(max_inflight=1, prefetch_sync=True), 3, True),  # synchronous when either is
], ids=["largest-cap", "no-bound", "sync"])
def test_one_loader_serves_every_prefetching_policy(sched_kw: dict, cache_kw: dict, cap: float, sync: bool) -> None:
    e = _build(_QueuePrefetch(**sched_kw), _CachePrefetch(**cache_kw))
    ext = e.extensions
    ld = ext.loader
    assert ext.prefetch_sources == [e.scheduler, e.cache] and ld.sources == [e.scheduler, e.cache]
    assert (ld.max_inflight, ld.sync, ld.asks_per_step) == (cap, sync, True)
    # vLLM's slots, no prefix reuse: the admission and reclaim hooks stay off
    assert ext.memory == "slots" and not ext.handles_admission and e._admit_hook is None and e._reclaim is None


def test_the_default_path_installs_nothing_and_a_prefetch_alone_installs_only_the_loader() -> None:
    assert _build(FCFSScheduler(), LRUCache()).extensions is None
    e = _build(FCFSScheduler(), _CachePrefetch())
    assert e.extensions.prefetch_sources == [e.cache] and e._prefetch_on and e.extensions.prefix is None


@pytest.mark.parametrize("make, message", [
    (lambda: (_QueuePrefetch(prefetch_at_tick=True, prefetch_sync=True), LRUCache()),
     "scheduler 't-queue-prefetch' (_QueuePrefetch): prefetch_at_tick starts its prefetches at its on_tick, in the "
     "background: it needs asynchronous prefetch (prefetch_sync False) and a tick_interval"),
    (lambda: (_QueuePrefetch(prefetch_at_tick=True, interval=None), LRUCache()),
     "prefetch_at_tick starts its prefetches at its on_tick, in the background: it needs asynchronous prefetch"),
    (lambda: (_QueuePrefetch(prefetch_at_tick=True), _CachePrefetch(prefetch_sync=True)),
     "scheduler 't-queue-prefetch' (_QueuePrefetch) prefetches in the background at its tick, and cache policy "
     "'t-cache-prefetch' (_CachePrefetch) prefetches synchronously on the step's path; one engine's prefetches are "
     "either kind, not both"),
    (lambda: (FCFSScheduler(), type("AsyncSlots", (LRUCache,), {"name": "t-async-slots", "async_swap_in": True})()),
     "cache policy 't-async-slots' swaps in asynchronously (async_swap_in), which needs adapter memory 'unified' or "
     "'region' (vLLM's slots load in the step)"),
], ids=["tick-and-sync", "tick-without-interval", "tick-beside-sync", "async-swap-in-on-slots"])
def test_start_up_refuses_what_cannot_run_and_says_why(make, message: str) -> None:
    sched, cache = make()
    with pytest.raises(ValueError) as err:
        _build(sched, cache)
    assert message in str(err.value)


def test_an_unknown_adapter_memory_is_refused_naming_its_source() -> None:
    """(The engine's configuration and the policy checks refuse it first; the installer still names the source.)"""
    def engine(cache_memory: str | None, cfg_memory: str) -> SimpleNamespace:
        cache = LRUCache()
        cache.adapter_memory = cache_memory
        return SimpleNamespace(config=SimpleNamespace(adapter_memory=cfg_memory, prefix_caching=False),
                               cache=cache, scheduler=FCFSScheduler(), n=0)

    with pytest.raises(ValueError, match=r"^cache policy 'lru''s adapter_memory must be one of "
                                         r"\('slots', 'region', 'unified'\), got 'pooled'$"):
        install_extensions(engine("pooled", "slots"), {})
    with pytest.raises(ValueError, match=r"^adapter_memory must be one of \('slots', 'region', 'unified'\), "
                                         r"got 'pooled'$"):
        install_extensions(engine(None, "pooled"), {})


# ---------------------------------------------------------------------------------------------- stop 67's fuzz
def test_an_adapter_whose_kv_node_cannot_leave_is_not_reclaimable():
    """FastLibra's tree (``kv_before_adapter``): a LoRA leaves after its history-KV nodes, so one with a node still
    being copied in cannot be reclaimed. Counting it promised blocks the cache's reclaim could not free: the head's
    demand swap-in reclaimed part of its need, failed (NO_SLOT), and the idle swapper refilled the blocks with the
    same nodes at every tick; 3 requests waited with no step for 145 s, and without a horizon the run never ended.
    Now every request finishes or is dropped by the client cap, and the link idles once they are done."""
    from traces.registry import get_workload
    from twin.simulate import simulate

    w = get_workload("fastlibra-agent", rps=16.0, duration=40.0, adapters=8, seed=921)
    prof = constant_profile(c0=2 ** -6, c_prefill=2 ** -14, disk_s=0.25, cpu_s=0.125)
    cfg = EngineConfig(kv_capacity_tokens=2500, max_model_len=2500, max_num_seqs=32, max_num_batched_tokens=8192,
                       block_size=16, max_loras=4)
    s = simulate(w, prof, cfg, scheduler="fcfs+client-cap", scheduler_opts={"client_cap": 3}, cache="fastlibra-wos",
                 cache_opts={"interval_s": 2 ** -7}, horizon_s=200.0).summary
    # (the livelock: 87 finished, 3 still waiting at the horizon, 564 GB of history KV swapped in by then)
    assert s["requests_finished"] + s["requests_dropped"] + s["requests_rejected"] == s["requests_arrived"]
    assert s["kv_swapped_in_gb"] < 10.0


def test_a_waiting_requests_swap_in_keeps_its_own_history_node(monkeypatch):
    """FastLibra-WoM: the reclaim for a waiting request's adapter swap-in must not swap out that request's own
    matched history node -- the admission counted its blocks as the request's -- to copy it straight back in
    (stop 68's audit: the node, lowest-valued once its adapter had left, went out and came back at t = 9.79 s)."""
    from traces.registry import get_workload
    from twin.extensions import Extensions
    from twin.simulate import simulate

    lost = []
    await_swaps = Extensions._await_swaps

    def watched(self, rid, a, node, need_ad, now):
        in_hbm = node is not None and node.tier == "hbm"
        out = await_swaps(self, rid, a, node, need_ad, now)
        if in_hbm and node.tier != "hbm":
            lost.append((now, rid, node.tier))
        return out

    monkeypatch.setattr(Extensions, "_await_swaps", watched)
    w = get_workload("fastlibra-agent", rps=2.0, duration=10.0, adapters=50, seed=106)
    cfg = EngineConfig(kv_capacity_tokens=6000, max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192,
                       block_size=32, max_loras=1)
    s = simulate(w, "embedded", cfg, scheduler="adapter-aware", cache="fastlibra-wom", system="vllm",
                 scheduler_opts={"lookahead": 4}, cache_opts={"interval_s": 0.412958537290096, "busy": 0.8,
                                                              "idle": 0.79}, check_invariants=True).summary
    assert lost == []
    assert s["requests_finished"] == s["requests_arrived"] == 25 and s["swap_in_kv"] == 4
