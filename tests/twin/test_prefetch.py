"""The contract of :mod:`twin.prefetch` (:class:`~twin.prefetch.AsyncLoader`): adapter prefetches a policy decides
before a request needs the adapter (S-LoRA §4.2, Chameleon §4.2).

* asynchronous: from its start a prefetched adapter holds its memory and is *loading* -- neither evictable nor usable;
  a request admitted meanwhile waits for the rest of the copy (a late hit); when the copy lands the policy sees
  ``on_load`` then ``on_idle``. Disk reads do not hold the host link; the copies queue on it in FIFO order;
* at most ``max_inflight`` copies in flight (an asynchronous swap-in for a waiting request, ``demand``, is neither
  bounded nor counted); a prefetch without room, or whose placement fails, starts nothing;
* synchronous (``prefetch_sync``): the copy is a load of the deciding step, charged to the requests whose first token
  that step computes;
* a tick prefetcher (``prefetch_at_tick``) starts its copies at its ticks, whether or not a batch runs;
* at the horizon a copy still in flight never lands.

Small hand-computed scenarios on the constant profile: a disk read takes 0.5 s and a copy 0.1 s (rank-8 adapters,
40 MiB), a step 10 ms; every expected time is derived from those.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable

import numpy as np
import pytest

from policies.lru import LRUCache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.prefetch import AsyncLoader
from twin.registry import make_scheduler
from twin.simulate import simulate

DISK_S, COPY_S, STEP_S = 0.5, 0.1, 0.01


class _Prefetcher(LRUCache):
    """vLLM's LRU slots plus a fixed prefetch list (the adapters to load, in priority order), recording the cache
    callbacks the loader makes."""

    name = "t-fixed-prefetch"

    def __init__(self, wants: Iterable[int] = (), max_inflight: int | None = 4, prefetch_evicts: bool = True,
                 prefetch_sync: bool = False, **memory: Any) -> None:
        super().__init__(prefetch_sync=prefetch_sync, **memory)
        self.wants = list(wants)
        self.max_inflight = max_inflight
        self.prefetch_evicts = prefetch_evicts
        self.calls: list[tuple[str, int, float]] = []

    def prefetch(self, now: float) -> list[int]:
        return self.wants

    def on_load(self, a: int, now: float) -> None:
        self.calls.append(("load", a, now))

    def on_idle(self, a: int, now: float) -> None:
        super().on_idle(a, now)
        self.calls.append(("idle", a, now))


def _engine(cache: LRUCache, arrivals: list[float], adapters: list[int], ranks: list[int] | None = None,
            outputs: list[int] | None = None, cfg: EngineConfig | None = None, disk_s: float = DISK_S,
            copy_s: float = COPY_S, **kw: Any) -> Engine:
    n = len(arrivals)
    prof = constant_profile(c0=STEP_S, disk_s=disk_s, cpu_s=copy_s, kv_tokens=200_000, ranks=(8, 16))
    w = Workload.from_arrays(arrivals, [16] * n, outputs or [2] * n, adapters, ranks or [8] * n)
    cfg = cfg or EngineConfig(max_loras=4, max_model_len=4096)
    return Engine(w, prof, cfg, make_scheduler("fcfs"), cache, check_invariants=True, **kw)


def _loader(e: Engine) -> AsyncLoader:
    """The engine's loader (installed by the prefetching cache)."""
    ld = e.extensions.loader
    assert isinstance(ld, AsyncLoader)
    return ld


def _at(e: Engine, t: float, fn) -> None:
    """Call ``fn(now)`` at the engine's first step boundary at or after ``t`` (an idle engine wakes at ``t``)."""
    e.push_event(t, fn)


def test_a_prefetched_adapter_holds_memory_but_is_loading_neither_evictable_nor_idle_until_its_copy_lands() -> None:
    """Adapter 1 prefetched at 0 from disk: read until 0.5, copy until 0.6. Meanwhile it is resident (its memory is
    held) and loading: not evictable, and the cache has not been told it loaded; at 0.6 the cache sees on_load then
    on_idle, and it is an ordinary idle adapter. Its request at 5 s finds it resident (a hit, no load wait)."""
    cache = _Prefetcher()
    e = _engine(cache, [5.0, 5.0], [0, 1])
    mem, ld = e.adapters, _loader(e)
    assert ld.start(1, 0.0) is True
    seen: dict[float, tuple] = {}

    def look(now: float) -> None:
        seen[now] = (mem.resident[1], 1 in mem.loading, mem.evictable(), mem.any_evictable(), list(cache.calls),
                     e.link.bytes_moved)

    assert (mem.resident[1], mem.n_resident, 1 in mem.loading, mem.evictable(), ld.started) == (True, 1, True, [], 1)
    for t in (0.3, 0.55, 0.7):
        _at(e, t, look)
    e.run()
    assert seen[0.3] == (True, True, [], False, [], 0)
    assert seen[0.55] == (True, True, [], False, [], 0)  # (its copy is on the link from 0.5)
    t_land = DISK_S + COPY_S
    assert seen[0.7] == (True, False, [1], True, [("load", 1, t_land), ("idle", 1, t_land)], mem.bytes[1])
    assert list(e.adapter_hit_code) == [2, 1] and e.load_wait[1] == 0.0
    assert ld.stats() == {"prefetch_mode": "async", "prefetches": 1, "prefetch_late_hits": 0}


def test_a_request_admitted_while_its_adapter_loads_waits_for_the_rest_of_the_copy_and_is_a_late_hit() -> None:
    """Adapter 1's copy (started at 0) lands at 0.6; its request arrives at 0.2 and is admitted at once: the step
    waits 0.4 s for the copy, then computes 10 ms -- first token at 0.61, load wait 0.4, not a hit."""
    cache = _Prefetcher()
    e = _engine(cache, [0.2, 5.0], [1, 0], outputs=[1, 1])
    ld = _loader(e)
    ld.start(1, 0.0)
    e.run()
    t_land = DISK_S + COPY_S
    assert e.first_token[0] == pytest.approx(t_land + STEP_S, abs=1e-12)
    assert e.load_wait[0] == pytest.approx(t_land - 0.2, abs=1e-12)
    assert e.adapters.late_hits == 1 and e.adapter_hit_code[0] == 2
    assert ld.stats()["prefetch_late_hits"] == 1


def test_disk_reads_do_not_hold_the_link_and_copies_queue_on_it_first_come_first_served() -> None:
    """Three prefetches started at 0: adapters 1 and 3 from disk, adapter 2 from the CPU tier. 2's copy takes the
    idle link at once (lands at 0.1); the disk reads one adapter at a time, in the order they were started: 1's
    read ends at 0.5 (lands at 0.6), 3's at 1.0 (lands at 1.1). Had a read held the link, 2 would wait for 1's read
    and copy; had the reads shared nothing, 3 would land at 0.7."""
    cache = _Prefetcher(max_inflight=None)
    e = _engine(cache, [5.0] * 4, [0, 1, 2, 3])
    e.adapters.preload_cpu([2])
    ld = _loader(e)
    assert [ld.start(a, 0.0) for a in (1, 2, 3)] == [True, True, True]
    e.run()
    loads = [(a, t) for what, a, t in cache.calls if what == "load" and t < 5.0]
    assert loads == [(2, pytest.approx(COPY_S)), (1, pytest.approx(DISK_S + COPY_S)),
                     (3, pytest.approx(2 * DISK_S + COPY_S))]
    assert e.adapters.disk.queued_s == pytest.approx(DISK_S)  # (3's read waited for 1's)
    assert e.adapters.loads_disk >= 2 and e.link.busy_s >= 3 * COPY_S - 1e-12


def test_decisions_stop_at_the_in_flight_cap_and_a_demand_swap_in_is_neither_capped_nor_counted() -> None:
    """max_inflight 2, the policy asks for adapters 1, 2, 3: the first two start, then the decisions stop (3 is not
    even placed); a further start of 3 is refused while both are in flight, but an asynchronous swap-in for a
    waiting request (``demand``) starts and is not counted as a prefetch."""
    cache = _Prefetcher(wants=[1, 2, 3], max_inflight=2)
    e = _engine(cache, [5.0] * 4, [0, 1, 2, 3])
    mem, ld = e.adapters, _loader(e)
    ld.decide(0.0, None)
    assert sorted(mem.loading) == [1, 2] and ld.started == 2 and not mem.resident[3]
    assert ld.start(3, 0.0) is False and not mem.resident[3] and ld.started == 2
    assert ld.start(3, 0.0, demand=True) is True
    assert sorted(mem.loading) == [1, 2, 3] and ld.started == 2
    assert ld.start(1, 0.0) is False and ld.start(-1, 0.0) is False  # already resident (loading); no adapter


def test_no_room_while_every_slot_is_loading_refuses_the_prefetch() -> None:
    """Two slots, both taken by copies in flight: a third prefetch (no cap) finds no evictable adapter -- a loading
    adapter is never a victim -- and starts nothing."""
    cache = _Prefetcher(max_inflight=None)
    e = _engine(cache, [5.0] * 4, [0, 1, 2, 3], cfg=EngineConfig(max_loras=2, max_model_len=4096))
    mem, ld = e.adapters, _loader(e)
    assert ld.start(1, 0.0) and ld.start(2, 0.0)
    assert ld.start(3, 0.0) is False
    assert (mem.resident[3], mem.evictions, ld.started, sorted(mem.loading)) == (False, 0, 2, [1, 2])


@pytest.mark.parametrize("evicts", [True, False])
def test_a_full_cache_makes_room_by_evicting_its_victim_only_when_the_policy_lets_prefetches_evict(
        evicts: bool) -> None:
    """Two slots, adapters 1 and 2 landed (idle since 0.6 and 1.1: the disk reads one at a time); at 1.5 the policy
    asks for adapter 3. With
    ``prefetch_evicts`` the loader evicts the cache's victim (LRU: 1, idle first) and starts 3; without it a prefetch
    goes into free memory only, and there is none."""
    cache = _Prefetcher(max_inflight=None, prefetch_evicts=evicts)
    e = _engine(cache, [5.0] * 4, [0, 1, 2, 3], cfg=EngineConfig(max_loras=2, max_model_len=4096))
    mem, ld = e.adapters, _loader(e)
    ld.start(1, 0.0)
    ld.start(2, 0.0)
    out: dict[str, Any] = {}

    def decide(now: float) -> None:
        cache.wants = [3]
        ld.decide(now, None)
        cache.wants = []
        out.update(resident=[mem.resident[a] for a in (1, 2, 3)], evictions=mem.evictions, started=ld.started,
                   loading=sorted(mem.loading))

    _at(e, 1.5, decide)
    e.run()
    if evicts:
        assert out == dict(resident=[False, True, True], evictions=1, started=3, loading=[3])
    else:
        assert out == dict(resident=[True, True, False], evictions=0, started=2, loading=[])


def test_a_prefetch_whose_placement_fails_starts_nothing_and_the_failure_is_counted() -> None:
    """A contiguous adapter region of 160 MiB: adapters 0, 1, 2 (rank 8, 40 MiB) land at [0, 40), [40, 80) and
    [80, 120); adapter 1 is evicted. 80 MiB are free, in two 40-MiB holes: adapter 3 (rank 16, 80 MiB) does not
    fit. Without eviction the prefetch fails, changes nothing, and the region counts the failure (the free bytes
    would have held it); with eviction the victim (0, idle first) goes and 3 takes [0, 80)."""
    mib = 2 ** 20
    cache = _Prefetcher(max_inflight=None)
    cfg = EngineConfig(max_loras=4, max_model_len=4096, adapter_memory="region", adapter_region_bytes=160 * mib)
    e = _engine(cache, [5.0] * 4, [0, 1, 2, 3], ranks=[8, 8, 8, 16], cfg=cfg, disk_s=0.0)
    mem, ld = e.adapters, _loader(e)
    pl = mem.placement
    assert mem.bytes[:4] == [40 * mib] * 3 + [80 * mib]
    out: dict[str, Any] = {}

    def place(now: float) -> None:
        for a in (0, 1, 2):
            assert ld.start(a, now)

    def after(now: float) -> None:
        mem.evict(1, now)
        out["no_evict"] = ld.start(3, now, evict=False)
        out["state"] = (mem.resident[3], 3 in mem.loading, ld.started, pl.alloc_failures, pl.alloc.free_bytes)
        out["evict"] = ld.start(3, now, evict=True)
        out["after"] = (mem.resident[:4], pl.fragmentation_evictions, sorted(pl.alloc.blocks))

    _at(e, 0.0, place)
    _at(e, 1.0, after)
    e.run()
    assert out["no_evict"] is False
    assert out["state"] == (False, False, 3, 1, 80 * mib)
    assert out["evict"] is True
    assert out["after"] == ([False, False, True, True], 1, [(0, 80 * mib, 3), (80 * mib, 40 * mib, 2)])


def test_a_synchronous_prefetch_is_a_load_of_the_deciding_step_charged_to_its_first_token_requests() -> None:
    """``prefetch_sync``: the copy (disk read 0.5 s, copy 0.1 s) is appended to the deciding step's loads, the
    adapter is loaded and idle at once (never in the loading state), and the step's prefill chunks of requests
    without a first token wait for it -- each once; request 1, which already has its first token, does not."""
    cache = _Prefetcher(prefetch_sync=True)
    e = _engine(cache, [0.0, 0.0, 0.0], [0, 0, 1])
    ld = _loader(e)
    assert ld.sync and ld.stats()["prefetch_mode"] == "sync"
    e.first_token[1] = 0.25
    ctx = SimpleNamespace(loads=[], load_rids=[2], chunks=[(0, 16), (1, 16), (2, 5), (0, 3)])
    assert ld.start(1, 0.0, ctx) is True
    assert len(ctx.loads) == 1
    load = ctx.loads[0]
    assert (load.adapter, load.source, load.disk_s, load.link_s, load.nbytes, load.wait) == (
        1, "disk", DISK_S, COPY_S, e.adapters.bytes[1], None)
    assert ctx.load_rids == [2, 0]
    assert not e.adapters.loading and e.adapters.evictable() == [1]
    assert cache.calls == [("load", 1, 0.0), ("idle", 1, 0.0)] and ld.started == 1


class _TickPrefetcher(_Prefetcher):
    """Prefetches at its own tick (every 0.25 s), recording what is in flight when each tick starts."""

    name = "t-tick-prefetch"
    prefetch_at_tick = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.ticks: list[tuple[float, list[int]]] = []
        self.asked: list[float] = []

    @property
    def tick_interval(self) -> float:
        return 0.25

    def on_tick(self, now: float) -> None:
        self.ticks.append((now, sorted(self.engine.adapters.loading)))

    def prefetch(self, now: float) -> list[int]:
        self.asked.append(now)
        return self.wants


def test_a_tick_prefetcher_starts_its_copies_at_its_ticks_within_its_cap_while_nothing_runs() -> None:
    """Copies of 0.5 s (from the CPU tier), ticks every 0.25 s, cap 2, the policy asks for adapters 1, 2, 3; no
    request before 3 s. Tick 0.25 starts 1 (lands 0.75) and 2 (queued on the link: lands 1.25); the ticks at 0.5 and
    0.75 find two in flight (0.75's tick runs before the copy's end is handled) and start nothing; tick 1.0 starts 3,
    which queues behind 2: lands 1.75. The policy is asked at its ticks only, never after a step's admissions."""
    cache = _TickPrefetcher(wants=[1, 2, 3], max_inflight=2)
    e = _engine(cache, [3.0] * 4, [0, 1, 2, 3], disk_s=0.0, copy_s=0.5)
    ld = _loader(e)
    assert ld.asks_per_step is False and e._prefetch_on is False
    e.run()
    ticks = dict(cache.ticks)
    assert [ticks[t] for t in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)] == [
        [], [1, 2], [1, 2], [2], [2, 3], [3], [3], []]
    assert [(a, t) for what, a, t in cache.calls if what == "load" and t < 3.0] == [(1, 0.75), (2, 1.25), (3, 1.75)]
    assert ld.started == 3
    assert cache.asked == [t for t, _ in cache.ticks]


@pytest.mark.parametrize("horizon", [0.3, 0.55, 0.65])
def test_a_copy_still_in_flight_at_the_horizon_never_lands(horizon: float) -> None:
    """Adapter 1's copy lands at 0.6 (read until 0.5, then 0.1 s on the link). A run that ends at 0.3 (in the read)
    or at 0.55 (on the link) leaves it loading: the cache is never told, no bytes are counted as moved -- but it
    counts as a prefetch; from the read's end on, the link knows when the copy ends. With 0.65 s it has landed."""
    cache = _Prefetcher()
    e = _engine(cache, [5.0, 5.0], [0, 1], horizon_s=horizon)
    ld = _loader(e)
    ld.start(1, 0.0)
    e.run()
    mem = e.adapters
    t_land = DISK_S + COPY_S
    assert ld.stats()["prefetches"] == 1 and e.env.now <= horizon
    if horizon < t_land:
        assert 1 in mem.loading and cache.calls == [] and e.link.bytes_moved == 0
        assert mem.loading_copy[1].end == (None if horizon < DISK_S else pytest.approx(t_land))
    else:
        assert not mem.loading and cache.calls == [("load", 1, t_land), ("idle", 1, t_land)]
        assert e.link.bytes_moved == mem.bytes[1]
    assert np.isnan(e.first_token).all()  # (the requests at 5 s never arrived)


def test_a_full_cpu_tier_does_not_drop_an_adapter_a_prefetch_is_copying():
    """vLLM's LRU manager keeps every adapter in a GPU slot in the CPU tier (the CPU cache's removal callback
    deactivates it). A full CPU tier dropped its least recently used idle adapter even while a prefetch was copying
    it to a slot (the adapter-aware scheduler's lookahead), which then landed in a slot outside the CPU tier (stop
    67's fuzz: check_invariants failed). The tier now drops an idle adapter that is not loading."""
    from twin.simulate import simulate

    w = Workload.from_arrays(np.array([9.0, 10.0, 10.0, 10.0, 10.0, 11.0]), np.array([21, 236, 39, 97, 123, 269]),
                             np.ones(6, np.int64), np.array([1, 1, 0, 19, 39, 39]), np.array([16, 16, 8, 64, 64, 64]))
    cfg = EngineConfig(max_num_seqs=1, max_num_batched_tokens=512, max_loras=3, max_cpu_loras=3, max_model_len=2048)
    runs = [simulate(w, None, cfg, policy="adapter-aware", max_run_steps=k, check_invariants=True) for k in (None, 1)]
    assert runs[0].summary["prefetches"] >= 1 and runs[0].summary["requests_finished"] == 6
    assert runs[0].requests.equals(runs[1].requests)


def test_a_request_that_waited_for_a_prefetch_leaving_the_batch_does_not_evict_the_loading_adapter():
    """A request admitted while its adapter's prefetch copy was in flight (Chameleon's scheduler prefetches its
    queues' heads) can finish in the step that waited for the copy, before the copy's end event clears ``loading``;
    a cache that evicts idle adapters (``none``) then evicted an adapter still listed as loading (stop 67's liveness
    fuzz: check_invariants failed, 'a loading adapter holds no memory'). It stays, as a landed prefetch does."""
    from twin.simulate import simulate

    arr = [0.019592] * 5 + [0.028872] * 2 + [1.258465] * 4 + [1.32021] * 5 + [2.123499] * 7 + [2.355889] * 4 + [
        2.552917] + [2.634119] * 4 + [2.79313] * 3 + [3.091765] * 8
    prompt = [139, 284, 188, 193, 101, 41, 53, 11, 99, 25, 163, 47, 254, 227, 130, 275, 154, 112, 247, 17, 128, 45, 55,
              132, 284, 268, 130, 67, 42, 147, 204, 225, 41, 9, 21, 45, 238, 187, 293, 268, 195, 42, 73]
    adapter = [3, 0, 3, -1, 3, -1, 3, 1, -1, 0, 3, -1, 3, 0, 0, 3, -1, 3, 3, 2, 3, 2, 3, 3, 3, 3, 3, 2, 0, 3, -1, 3, -1,
               0, 3, 3, 3, 3, 1, 0, -1, -1, -1]
    rank_of = {-1: 0, 0: 8, 1: 16, 2: 32, 3: 64}
    w = Workload.from_arrays(arr, prompt, [1] * 43, adapter, [rank_of[a] for a in adapter])
    cfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=512, max_loras=2, block_size=32, max_model_len=384,
                       tensor_parallel=2, kv_capacity_tokens=384)
    r = simulate(w, "llama-2-7b_a40_vidur", cfg, scheduler="chameleon-output-only", cache="none", system="vllm",
                 check_invariants=True)
    assert r.summary["requests_finished"] == 43 and r.summary["prefetches"] >= 1


def _starved_batch_case(seed: int = 484, **kw):
    """Stop 67's liveness fuzz case: the adapter-aware scheduler's lookahead and FastLibra's swapper prefetch into a
    tight unified pool with one adapter slot; a request needs 94 of the pool's 152 blocks, its adapter 39, and two
    prefetched adapters of 20 each are in flight whenever its next chunk asks for blocks."""
    from traces.registry import get_workload
    from twin.simulate import simulate

    w = get_workload("fastlibra-chatbot", rps=8.0, duration=5.0, adapters=8, seed=seed)
    cfg = EngineConfig(kv_capacity_tokens=2432, max_model_len=2432, max_num_seqs=4, max_num_batched_tokens=512,
                       block_size=16, max_loras=1, max_cpu_loras=1)
    return simulate(w, "llama-2-7b_a100-80gb_vidur", cfg, scheduler="adapter-aware", cache="fastlibra-wos",
                    system="vllm", cache_opts={"interval_s": 0.125, "bs_window_s": 0.2}, **kw)


def test_prefetches_in_flight_do_not_starve_the_running_batch():
    """Prefetches in flight hold blocks the only running request's next chunk needs: it waits for them to land
    (``Engine._wait_for_landing``) instead of being preempted and recomputed at every swapper tick, so the run ends
    by itself with every request finished (before stop 68: 8 of 34 by 50 s and by 400 s alike, never ending)."""
    s = _starved_batch_case(check_invariants=True).summary
    assert s["requests_finished"] == s["requests_arrived"] == 34
    assert s["memory_stalls"] >= 1 and s["memory_stall_s"] > 0


def test_without_the_two_rules_the_batch_is_starved(monkeypatch):
    """The same set-up (another seed: since the disk reads one adapter at a time, seed 484's prefetches no longer
    starve it without the rules) with both rules switched off -- the wait for copies in flight
    (``Engine._wait_for_landing``) and the running prefills' reserve (``Engine.background_reserve``) -- preempts for
    ever: 2 of 35 requests by 200 s, 1,557 preemptions. What they fix: with both, all 35 finish by themselves; each
    alone finishes every request here too."""
    from twin.engine import Engine

    monkeypatch.setattr(Engine, "_wait_for_landing", lambda self, need: False)
    monkeypatch.setattr(Engine, "background_reserve", lambda self: 0)
    s = _starved_batch_case(seed=216, horizon_s=200.0).summary
    assert s["requests_finished"] < 10 and s["preemptions"] > 1000
    for off in ("_wait_for_landing", "background_reserve"):
        monkeypatch.undo()
        monkeypatch.setattr(Engine, off, (lambda self, need: False) if off == "_wait_for_landing" else (lambda self: 0))
        assert _starved_batch_case(seed=216, horizon_s=400.0).summary["requests_finished"] == 35
    monkeypatch.undo()
    s = _starved_batch_case(seed=216, check_invariants=True).summary
    assert s["requests_finished"] == s["requests_arrived"] == 35 and s["memory_stalls"] >= 1


def _prefetch_case(**kw):
    """Stop 68's audit case: the adapter-aware scheduler (lookahead 1) and Chameleon's predictive prefetch copy
    adapters of waiting requests into a 3000-token unified pool while a request prefills its prompt in 256-token
    chunks beside one other."""
    from traces.registry import get_workload
    from twin.simulate import simulate

    w = get_workload("synthetic", rps=8.0, duration=5.0, adapters=20, seed=555)
    df = w.df.copy()
    df["arrival_s"] = np.round(df["arrival_s"].to_numpy() * 32) / 32
    df = df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
    prof = constant_profile(c0=2 ** -7, c_prefill=0.0, c_decode=0.0, disk_s=0.0, cpu_s=0.125, sched=2 ** -10)
    cfg = EngineConfig(kv_capacity_tokens=3000, max_model_len=3000, max_num_seqs=2, max_num_batched_tokens=256,
                       block_size=16, max_loras=2, max_cpu_loras=2)
    return simulate(df, prof, cfg, scheduler="adapter-aware", cache="chameleon+prefetch", system="vllm",
                    scheduler_opts={"lookahead": 1}, cache_opts={"bin_s": 0.0625, "min_samples": 5, "prefix_kv": True},
                    **kw)


def test_a_prefetch_leaves_the_running_prefills_blocks(monkeypatch):
    """A background copy for a waiting request never takes the blocks the running prefills still need for their
    prompts (``Engine.background_reserve``): without the reserve the prefill's next chunk found them taken, waited
    for the copy, then was preempted anyway while the landed copy was reclaimed and prefetched again (stop 68's
    fuzz: 28 s of a 118 s run stalled)."""
    from twin.adapter_placement import UnifiedPool
    from twin.engine import Engine

    checked = []
    allocate = UnifiedPool.allocate

    def checked_allocate(self, a, now, evict=True, reserve=0):
        e = self.e
        ok = allocate(self, a, now, evict, reserve)
        if ok and not e._admitting_now:
            checked.append(e.total_blocks - e.used_blocks >= e.background_reserve())
        return ok

    monkeypatch.setattr(Engine, "_admitting_now", False, raising=False)
    try_admit = Engine._try_admit

    def admitting(self, rid):
        self._admitting_now = True
        try:
            return try_admit(self, rid)
        finally:
            self._admitting_now = False

    monkeypatch.setattr(UnifiedPool, "allocate", checked_allocate)
    monkeypatch.setattr(Engine, "_try_admit", admitting)
    with_reserve = _prefetch_case(check_invariants=True)
    assert checked and all(checked)  # (every prefetch left the reserve free)
    monkeypatch.undo()
    monkeypatch.setattr(Engine, "background_reserve", lambda self: 0)
    without = _prefetch_case()
    a, b = with_reserve.summary, without.summary
    assert a["requests_finished"] == b["requests_finished"]
    assert b["memory_stall_s"] > 10 * max(a["memory_stall_s"], 0.1)
    assert with_reserve.engine.env.now < 0.85 * without.engine.env.now


def test_no_background_copy_starts_while_the_batch_waits(monkeypatch):
    """While the running batch waits for copies in flight (``memory_stall``), no prefetch and no history swap-in
    takes pool blocks, so the copies in flight only land and every stall ends; each stall lasts until a copy
    lands, a tick or an arrival (never zero time for ever)."""
    from twin.engine import Engine
    from twin.prefetch import AsyncLoader
    from twin.prefix_kv import HistoryKV

    started_in_stall = []
    start, swap_in = AsyncLoader.start, HistoryKV.swap_in

    def checked_start(self, a, now, ctx=None, evict=True, demand=False):
        ok = start(self, a, now, ctx, evict, demand)
        if ok and self.e.memory_stall:
            started_in_stall.append(("prefetch", a, now))
        return ok

    def checked_swap_in(self, node, now, demand=False):
        ok = swap_in(self, node, now, demand)
        if ok and self.e.memory_stall:
            started_in_stall.append(("history", node.conv, now))
        return ok

    stalls = []
    wait = Engine._wait_for_landing

    def recorded_wait(self, need):
        out = wait(self, need)
        if out:
            stalls.append((self.env.now, need, self.total_blocks - self.used_blocks, self.extensions.landing_blocks()))
        return out

    monkeypatch.setattr(AsyncLoader, "start", checked_start)
    monkeypatch.setattr(HistoryKV, "swap_in", checked_swap_in)
    monkeypatch.setattr(Engine, "_wait_for_landing", recorded_wait)
    s = _starved_batch_case(check_invariants=True).summary
    assert started_in_stall == []
    assert len(stalls) >= s["memory_stalls"] >= 1  # (planning again within a wait is the same wait)
    for _, need, free, landing in stalls:  # (a stall only when the landed copies would cover the step's need)
        assert free < need <= free + landing


def test_memory_stalls_step_exactly():
    """Run skipping gives what stepping one iteration at a time gives, stalls included."""
    a = _starved_batch_case(horizon_s=120.0)
    b = _starved_batch_case(horizon_s=120.0, max_run_steps=1)
    assert a.summary["memory_stalls"] >= 1
    import pandas as pd

    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    wall = ("wall_s", "x_realtime", "step_segments")
    assert {k: repr(v) for k, v in a.summary.items() if k not in wall} == \
        {k: repr(v) for k, v in b.summary.items() if k not in wall}


def test_prefetches_read_from_disk_one_at_a_time():
    """The disk behind the CPU tier reads one adapter at a time (``twin.adapters.AdapterDisk``): the four prefetches
    S-LoRA's policy starts at 0.61 s (the waiting requests' adapters, none in the CPU tier) read at 0.61-1.11,
    1.11-1.61, 1.61-2.11 and 2.11-2.61 s, each copied over the link after its read (0.1 s). r0 decodes until 1.60 s,
    and each later request (one at a time, ``max_num_seqs = 1``) waits for its adapter's copy: r2 until 1.71 s, r3
    until 2.21 s, r4 until 2.71 s. Every read ran at full bandwidth at the same time before (34 adapters, 8.7 GB, read
    in 0.88 s by FastLibra's swapper at 2.3 GB/s), so all four had landed by 1.51 s and nothing waited."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 0.001, 0.002, 0.003, 0.004], [16] * 5, [100, 5, 5, 5, 5], [0, 1, 2, 3, 4], [8] * 5)
    cfg = EngineConfig(max_loras=5, max_num_seqs=1, max_model_len=512, kv_capacity_tokens=6000)
    res = simulate(w, prof, cfg, policy="slora", system="vllm", check_invariants=True)
    r = res.requests
    assert res.summary["prefetches"] == 4
    assert r["first_token_s"].tolist() == pytest.approx([0.61, 1.61, 1.72, 2.22, 2.72])
    assert r["load_wait_s"].tolist() == pytest.approx([0.6, 0.0, 0.06, 0.45, 0.45])
    disk = res.engine.adapters.disk
    assert disk.reads == 5 and disk.queued_s == pytest.approx(0.5 + 1.0 + 1.5)
    # the disk read for 2.5 s (r0's own read, then the four prefetches' from 0.61 s); cut at 1.5 s, for 0.5 + 0.89 s
    assert res.summary["disk_utilization"] == pytest.approx(2.5 / res.summary["simulated_s"])
    cut = simulate(w, prof, cfg, policy="slora", system="vllm", horizon_s=1.5).summary
    assert cut["disk_utilization"] == pytest.approx((0.5 + 0.89) / 1.5)


def test_a_steps_own_disk_read_queues_behind_the_prefetches_reads():
    """A step's synchronous load reads from disk after the prefetches' reads asked for before it: r1 (adapter 1) joins
    at 0.61 s, where the prefetch of r2's adapter, decided at that step's admissions, is read first (0.61-1.11 s); r1's
    read follows (1.11-1.61 s), then its copy (1.61-1.71 s), so its first token is at 1.72 s. For reads of one size
    that is when it would end if the two shared the disk's bandwidth. ``check_invariants`` asserts that the step's
    loads end where ``HostLink.loads_end`` (the horizon's check) says."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 0.001, 0.002], [16, 16, 16], [30, 5, 5], [0, 1, 2], [8, 8, 8])
    cfg = EngineConfig(max_loras=3, max_num_seqs=2, max_model_len=512, kv_capacity_tokens=6000)
    for horizon in (None, 1.7, 1.72):
        res = simulate(w, prof, cfg, policy="slora", system="vllm", check_invariants=True, horizon_s=horizon)
        ft = res.requests.loc[1, "first_token_s"]
        if horizon is None or horizon >= 1.72:
            assert ft == pytest.approx(1.72) and res.requests.loc[1, "load_wait_s"] == pytest.approx(1.1)
        else:  # the step is in flight at the horizon: it never started its loads
            assert ft != ft and res.engine.env.now <= horizon
