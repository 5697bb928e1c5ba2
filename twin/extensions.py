"""Engine extensions that only some policies need, installed once at engine start.

The default system (vLLM: fixed adapter slots, no prefetch, no prefix reuse) installs
nothing: :func:`install_extensions` returns None and the engine's hook points stay ``None``/
``False``, each tested once per admission, finish or KV shortage -- never per decode step.
Otherwise :class:`Extensions` provides:

* **adapter memory** (:mod:`twin.adapter_placement`): ``unified`` (S-LoRA / Chameleon /
  FastLibra: adapters take blocks of the KV pool, the cache lives in idle memory and shrinks
  when the batch needs blocks) or ``region`` (a fixed adapter region, contiguous or paged).
  Chosen by the cache policy's ``adapter_memory``, else ``EngineConfig.adapter_memory``;
* **prefetching** (:mod:`twin.prefetch`): when the scheduler or the cache policy overrides
  ``prefetch``; asynchronous over the host link, or synchronous when the policy sets
  ``prefetch_sync = True``;
* **prefix-KV reuse** (:mod:`twin.prefix_kv`): when the cache policy sets ``prefix_kv = True``
  (or ``EngineConfig.prefix_caching``) and the workload has conversations;
* **asynchronous swap-in** (FastLibra §2/§4: "a query whose LoRA/KVs are not yet in HBM waits
  while other ready queries run", the copies on separate torch streams): when the cache policy
  sets ``async_swap_in = True``, a waiting request whose adapter or matched history KV is not in
  HBM starts their copies in the background over the host link (:meth:`Extensions._await_swaps`)
  and is refused with ``Admit.NOT_READY``; the scheduler skips it (``policies/fcfs.py``) and
  admits it at the first step after the copies end. Without it (vLLM), such copies are
  synchronous loads on the admitting step's critical path, stalling the whole batch.

The engine declares the hook points and calls them (as SimPy's ``BaseResource`` calls
``_do_put``/``_do_get``): :meth:`Extensions.admit` in ``Engine._try_admit`` (memory for the
adapter and the first chunk, prefix hit), :meth:`Extensions.reclaim_for_step` when the
running batch lacks KV blocks (evict idle cached adapters / history KV before preempting),
:meth:`Extensions.on_finish` (store history KV), :meth:`Extensions.after_schedule`
(prefetch decisions after admissions; arrivals end decode runs), :meth:`Extensions.check`
in ``Engine.assert_invariants`` and :meth:`Extensions.stats` in the summary. Timed events
(prefetch completions, swap-ins, a scheduler's deadlines such as Chameleon's squash) go
through the engine's ``push_event``; the memory set-up resizes the pool through
``Engine.resize_kv_pool`` and ``Engine.recheck_admission``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twin.adapter_placement import RegionPlacement, UnifiedPool
from twin.interfaces import Admit, Policy, PolicyError, policy_label, policy_stats
from twin.prefetch import AsyncLoader
from twin.prefix_kv import HistoryKV
from twin.requests import workload_column

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import EngineCore, StepContextView

INF = float("inf")
MEMORY_MODES = ("slots", "region", "unified")


def _prefetches(policy: Policy) -> bool:
    """The policy overrides :meth:`Policy.prefetch` (which turns prefetching on)."""
    return type(policy).prefetch is not Policy.prefetch


def install_extensions(engine: "EngineCore", workload: Any) -> "Extensions | None":
    """Install what the policies and the configuration need (None: nothing, the default path)."""
    cfg = engine.config
    cache, sched = engine.cache, engine.scheduler
    memory = cache.adapter_memory or cfg.adapter_memory or "slots"
    if memory not in MEMORY_MODES:
        src = f"cache policy {cache.name!r}'s adapter_memory" if cache.adapter_memory else "adapter_memory"
        raise ValueError(f"{src} must be one of {MEMORY_MODES}, got {memory!r}")
    prefix = cache.prefix_kv
    if prefix is None:
        prefix = bool(cfg.prefix_caching)
    conv = workload_column(workload, "conversation_id", engine.n)
    if prefix and (conv is None or not (conv >= 0).any()):
        prefix = False
    sources = [p for p in (sched, cache) if _prefetches(p)]
    events = sched.uses_events or cache.uses_events
    if cache.lora_share and memory != "region":  # (it sizes the region; vLLM's slots and a unified pool have none)
        raise ValueError(f"cache policy {cache.name!r}: lora_share {cache.lora_share} sizes an adapter region, but the "
                         f"adapter memory is {memory!r}; add adapter_memory=region (e.g. --cache-opt "
                         f"adapter_memory=region) or leave lora_share out")
    for p in sources:
        if p.prefetch_at_tick and (p.prefetch_sync or p.tick_interval is None):
            raise ValueError(f"{policy_label(p)}: prefetch_at_tick starts its prefetches at its on_tick, in the "
                             "background: it needs asynchronous prefetch (prefetch_sync False) and a tick_interval")
        sync = [q for q in sources if q is not p and q.prefetch_sync]
        if p.prefetch_at_tick and sync:  # (one loader serves both, synchronous if either is: AsyncLoader.sync)
            raise ValueError(f"{policy_label(p)} prefetches in the background at its tick, and "
                             f"{policy_label(sync[0])} prefetches synchronously on the step's path; one engine's "
                             "prefetches are either kind, not both: pair it with a policy without prefetch_sync")
    if cache.async_swap_in and memory == "slots":
        raise ValueError(f"cache policy {cache.name!r} swaps in asynchronously (async_swap_in), which needs adapter "
                         "memory 'unified' or 'region' (vLLM's slots load in the step)")
    if memory == "slots" and not prefix and not sources and not events:
        return None
    return Extensions(engine, workload, memory, prefix, sources)


class Extensions:
    """The installed extensions of one engine (see the module docstring)."""

    def __init__(self, engine: "EngineCore", workload: Any, memory: str, prefix: bool, sources: list) -> None:
        self.e = e = engine
        self.mem = engine.adapters
        self.cache = engine.cache
        self.memory = memory
        self.prefetch_sources = sources
        #: requests refused admission at least once because their adapter could not get memory (a region hole, pool
        #: blocks, or a swap-in that could not start). Requests, not attempts: a scheduler retries a refused request at
        #: every step, so attempts count the steps (and a run of decode steps priced at once makes one attempt)
        self.blocked = 0
        self._blocked_rid = bytearray(e.n)
        self.reclaimed_blocks = 0
        if memory != "slots":
            self._place_adapters(memory)
        self.pool_blocks = e.total_blocks
        # ---- prefix-KV reuse
        self.prefix: HistoryKV | None = None
        if prefix:
            n = e.n
            self.prefix = HistoryKV(e, workload_column(workload, "conversation_id", n),
                                    workload_column(workload, "turn", n), workload_column(workload, "prefix_tokens", n),
                                    self.cache.host_kv_tokens)
        # ---- prefetching
        self.loader: AsyncLoader | None = None
        if sources:
            caps = [s.max_inflight for s in sources]
            self.loader = AsyncLoader(e, sources, sync=any(s.prefetch_sync for s in sources),
                                      max_inflight=None if None in caps else max(caps))
        # ---- asynchronous swap-in of waiting requests' adapters and history KV
        self.async_swap = bool(self.cache.async_swap_in)
        self._swapper = (self.loader if self.loader is not None else AsyncLoader(e, [])) if self.async_swap else None
        self._swap_wait_since: dict[int, float] = {}   # waiting request -> when its first swap started
        self._swap_adapter_for: dict[int, int] = {}    # waiting request -> adapter swapped in for it
        #: what each waiting request that waits for its swap-ins holds in GPU memory until it is admitted or leaves
        #: the queue: ``rid -> (adapter or -1, history node or None)`` (:meth:`_hold`); and per held adapter the
        #: number of its holders (the engine's :attr:`~twin.engine_state.EngineState.held_adapters`)
        self._holds: dict[int, tuple[int, Any]] = {}
        self.held_adapters: dict[int, int] = {}
        #: times the engine went idle with waiting requests refused while held nodes had landed, and released them
        #: (:meth:`release_ready_holds`; not in the summary)
        self.hold_releases = 0
        self._released_at = -INF
        self.swap_in_adapters = 0
        self.swap_in_kv = 0
        self.swap_waits = 0
        #: FastLibra §8's TTFT breakdown (queueing / LoRA cold start / KV cold start): per waiting
        #: request, whether it waited for its adapter and for its history KV; at admission its wait
        #: counts as a LoRA cold start when it waited for its adapter (its KV copy, queued behind the
        #: adapter's on the FIFO link, overlaps it), else as a KV cold start
        self._swap_waited_for: dict[int, list[bool]] = {}
        self.lora_cold_starts = 0
        self.lora_cold_start_s = 0.0
        self.kv_cold_starts = 0
        self.kv_cold_start_s = 0.0
        #: the engine calls :meth:`admit` and :meth:`reclaim_for_step`
        self.handles_admission = self.mem.placement is not None or self.prefix is not None
        #: times the running batch, short of blocks, waited for copies in flight to land instead of preempting, and
        #: the seconds it waited (``Engine._wait_for_landing``)
        self.memory_stalls = 0
        self.memory_stall_s = 0.0

    def _place_adapters(self, memory: str) -> None:
        """Adapter memory instead of vLLM's slots: resize the KV pool, place the adapters,
        re-apply the start-up check and the rejection rules."""
        e, mem = self.e, self.mem
        cfg = e.config
        bs = e.block_size
        n_ad = max(e.n_adapters, 1)
        slots0 = cfg.max_loras
        pool_tokens = cfg.kv_capacity_tokens or e.profile.kv_capacity_tokens(0, 0)
        if memory == "unified":
            e.resize_kv_pool(pool_tokens, max(slots0, n_ad))
            mem.use_placement(UnifiedPool(e, self), n_ad)
            e.recheck_admission(mem.placement.ab)
            return
        share = self.cache.lora_share
        per_tok = int(e.profile.components["kv"].params.get("kv_bytes_per_token")
                      or e.profile.model.kv_bytes_per_token)
        kv_tokens = e.kv_tokens
        max_loras = max(slots0, n_ad)
        if cfg.adapter_region_bytes:
            region = int(cfg.adapter_region_bytes)
            kv_tokens = max(pool_tokens - region // per_tok, 0) // bs * bs
        elif share:
            region = int(pool_tokens * per_tok * share)
            kv_tokens = int(pool_tokens * (1 - share)) // bs * bs
            # a static LoRA share in vLLM is its LoRA slots (``max_loras``, each padded to
            # ``max_lora_rank``): as many as the share holds, and vLLM's scheduler skips a request
            # whose adapter would exceed them (policies/fcfs.py) instead of blocking the queue
            max_loras = max(1, region // e.profile.adapter_bytes(max(e.max_lora_rank, 1)))
        else:  # the memory vLLM gives its slots (already left out of the KV capacity)
            region = slots0 * e.profile.adapter_bytes(max(e.max_lora_rank, 1))
        e.resize_kv_pool(kv_tokens, max_loras)
        placement = self.cache.adapter_placement or cfg.adapter_placement or "contiguous"
        mem.use_placement(RegionPlacement(e, region, placement), n_ad)
        e.recheck_admission()

    # ------------------------------------------------------------------ prefetch
    def after_schedule(self, ctx: "StepContextView", now: float) -> None:
        """Hook point after each step's admissions: the prefetch decisions."""
        self.loader.decide(now, ctx)

    def after_tick(self, policy: Policy, now: float) -> None:
        """Hook point after ``policy``'s ``on_tick``: its prefetch decisions when it makes them at its tick
        (``prefetch_at_tick``; they start now, whether or not a batch runs)."""
        self.loader.decide_at_tick(policy, now)

    # ------------------------------------------------------------------ history KV
    def on_finish(self, rid: int, now: float) -> None:
        """Hook point when a request finishes: keep its KV as its conversation's history."""
        self.prefix.on_finish(rid, now)

    # ------------------------------------------------------------------ memory
    def history_reclaimable(self, exclude: Any = None) -> int:
        p = self.prefix
        if p is None:
            return 0
        # HBM history blocks not being copied in (``loading_blocks``) nor held for a waiting request
        # (``held_hbm_blocks``; both counts kept by HistoryKV, not a walk over the nodes), less the excluded node's
        # when it is one of them (the node a request is about to take; a node still loading or held is already left
        # out, one in host memory holds none)
        excluded = exclude.blocks if exclude is not None and exclude.tier == "hbm" and not exclude.held else 0
        return p.hbm_blocks - p.loading_blocks - p.held_hbm_blocks - excluded

    def reclaimable(self, exclude_node: Any = None, exclude_adapter: int = -1) -> int:
        """Pool blocks that evicting idle adapters (unified pool) and history KV would free (never those held for a
        waiting request, :meth:`_hold`)."""
        r = self.history_reclaimable(exclude_node)
        pl = self.mem.placement
        if self.memory == "unified":
            ab = pl.ab
            held = self.held_adapters.keys() | self._adapters_behind_kv()  # (neither can leave now)
            if held:
                r += sum(ab[v] for v in self.mem.evictable() if v != exclude_adapter and v not in held)
            else:  # (no request holds an adapter: no lookup per evictable adapter)
                r += sum(ab[v] for v in self.mem.evictable() if v != exclude_adapter)
        return r

    def landing_blocks(self) -> int:
        """Pool blocks of the copies in flight -- prefetched adapters (unified pool) and history KV swapped in --
        that nothing will hold once they land: no running request's adapter (a request admitted while its adapter
        was loading), no waiting request's hold (:meth:`_hold`). Landed, they are idle and reclaimable
        (``Engine._wait_for_landing``)."""
        r = 0
        p = self.prefix
        if p is not None and p.loading_blocks:
            r += sum(n.blocks for n in p.loading_nodes() if not n.held)
        mem = self.mem
        if self.memory == "unified" and mem.loading:
            ab, held, active = mem.placement.ab, self.held_adapters, mem.active
            r += sum(ab[a] for a in mem.loading if not active[a] and a not in held)
        return r

    def _adapters_behind_kv(self) -> set[int]:
        """With a cache whose adapters leave after their history KV (``kv_before_adapter``, FastLibra's tree): the
        adapters with a node in the pool that cannot leave now -- still being copied in, or held for a waiting
        request -- so they cannot leave either. Counting them made :meth:`reclaimable` promise blocks the cache's
        reclaim could not free: a waiting request's demand swap-in reclaimed part of its need (the adapter's
        landed nodes), failed, and the swapper's idle swap-in refilled the blocks, at every tick, forever (stop
        67's fuzz: FastLibra-WoS with 3 requests waiting and no step for 145 s). Empty without such a cache, or
        with every pool node landed and free (no walk over the nodes then)."""
        p = self.prefix
        if p is None or not self.cache.kv_before_adapter or not (p.loading_blocks or p.held_hbm_blocks):
            return set()
        out = {n.adapter for n in p.loading_nodes()}
        if p.held_hbm_blocks:
            out.update(n.adapter for n in p.hbm_nodes() if n.held)
        return out

    def reclaim(self, n: int, now: float, pin: int = -1) -> int:
        """Free at least ``n`` pool blocks if possible; returns the blocks freed.

        The cache policy decides the order when it implements ``reclaim_blocks(n, now)``;
        otherwise history KV goes first (least recently used; swapped to host when the
        policy sets ``history_to_host``), then idle adapters in the policy's victim order.
        ``pin`` is the adapter of the request being admitted: a policy's ``reclaim_blocks``
        must not evict it, and the victim order is told to keep it (``cache.reclaim_pin``, :func:`twin.interfaces.unpinned`)
        while another idle adapter can go; a victim that evicts it anyway has its blocks reclaimed again.
        Nodes held for waiting requests (:meth:`_hold`) are never taken: a policy's ``reclaim_blocks``
        leaves the adapters in ``engine.held_adapters`` and the history nodes with ``held``, and so does
        the engine's order (a ``victim`` that names a held adapter is a policy error).
        """
        cache = self.cache
        if cache.reclaim_blocks is not None:
            freed = cache.reclaim_blocks(n, now, pin)
        else:
            freed = 0
            p = self.prefix
            if p is not None and p.hbm_blocks:
                to_host = cache.history_to_host
                for node in sorted(p.hbm_nodes(), key=lambda x: x.last_access):
                    if freed >= n:
                        break
                    if node.held:
                        continue
                    freed += p.swap_out(node, now) if to_host else p.drop(node, now)
            if self.memory == "unified" and freed < n:
                ab = self.mem.placement.ab
                if pin >= 0:  # (the victim order keeps the admitting request's adapter while others are idle)
                    cache.reclaim_pin = pin
                try:
                    while freed < n and self._any_unheld_evictable():
                        v = self._evict_victim(now)
                        freed += ab[v]
                        if v == pin:  # (a victim that ignored reclaim_pin: the adapter must come back)
                            n += ab[v]
                finally:
                    if pin >= 0:
                        cache.reclaim_pin = -1
        self.reclaimed_blocks += freed
        return freed

    def _any_unheld_evictable(self) -> bool:
        held = self.held_adapters
        if not held:
            return self.mem.any_evictable()
        return any(v not in held for v in self.mem.evictable())

    def _evict_victim(self, now: float) -> int:
        """The cache policy's victim evicted (``AdapterMemory.evict_victim``), which must not be held for a waiting
        request."""
        mem, held = self.mem, self.held_adapters
        if not held:
            return mem.evict_victim(now)
        v = self.cache.victim(now)
        if v in held or v not in mem.evictable():
            why = "held for a waiting request (engine.held_adapters)" if v in held else "not evictable"
            raise PolicyError(f"{policy_label(self.cache)} chose adapter {v!r} as victim, but it is {why}; victim(now) "
                              f"must return one of engine.adapters.evictable() not in engine.held_adapters")
        mem.evict(v, now)
        return v

    def reclaim_for_step(self, n: int) -> bool:
        """Hook point when the running batch lacks ``n`` blocks: shrink the caches before preempting."""
        return self.reclaim(n, self.e.now) >= n

    def admit(self, ctx: "StepContextView", rid: int, a: int, T: int, nb: int) -> "Admit | int":
        """Hook point of ``Engine._try_admit``: memory for the adapter and the first chunk,
        and the prefix hit; returns an :class:`Admit` failure, or the number of prompt
        tokens served from history KV."""
        e, mem = self.e, self.mem
        h, node = (self.prefix.match(rid, T) if self.prefix is not None else (0, None))
        if h:
            k = min(T - h, ctx.budget)
            nb = -(-(h + k) // e.block_size)
        pl = mem.placement
        need_ad = 0
        if pl is not None and a >= 0 and not mem.resident[a]:
            if self.memory == "unified":
                need_ad = pl.ab[a]
            elif not pl.can_place(a):
                self._refused_for_memory(rid)
                return Admit.NO_SLOT
        node_blocks = self.prefix.hbm_blocks_of(node) if node is not None else 0
        free = e.total_blocks - e.used_blocks + node_blocks
        need = nb + need_ad
        if need > free:
            avail = free + self.reclaimable(node, a)
            if need > avail:
                if need_ad and nb <= avail:
                    self._refused_for_memory(rid)
                    return Admit.NO_SLOT
                return Admit.NO_KV
        now = e.now
        if self.async_swap:
            r = self._await_swaps(rid, a, node, need_ad, now)
            if r is not None:
                return r
        if node is not None:
            self.prefix.take(node, h, rid, ctx, now)
        short = need - (e.total_blocks - e.used_blocks)
        if short > 0:
            self.reclaim(short, now, pin=a)
        return h

    def _reclaim_keeping(self, node: Any, n: int, now: float, pin: int) -> int:
        """:meth:`reclaim` for a waiting request's own swap-in, keeping its matched history ``node`` in the pool:
        the admission check counted the node's blocks as the request's own (``reclaimable(node, a)`` leaves it out),
        so the reclaim must not take it -- it is held while the reclaim runs (held nodes are never taken). Before
        (stop 68's audit), FastLibra-WoM's reclaim for the request's adapter swapped that very node out as its
        lowest-valued one, and the request then copied it straight back in and waited for it."""
        p = self.prefix
        keep = node is not None and node.tier == "hbm"
        if keep:
            p.hold(node)
        try:
            return self.reclaim(n, now, pin=pin)
        finally:
            if keep:
                p.unhold(node)

    def _await_swaps(self, rid: int, a: int, node: Any, need_ad: int, now: float) -> "Admit | None":
        """Asynchronous swap-in (FastLibra §2, §4.1 steps 1-2): start the background copies of
        ``rid``'s adapter (if not in HBM) and of its matched history node (if in host memory),
        and return ``Admit.NOT_READY`` while any of them is in flight; None when both are in HBM.

        Memory for them is reclaimed now in the cache policy's order, never from running
        requests (the admission check before this made sure it is reclaimable). The adapter's
        copy is queued first on the FIFO host link, so a KV node never lands before its parent
        LoRA (FastLibra's dependency tree). When ``rid`` is admitted, the time it waited counts
        as its load wait, and an activation it waited for counts as a miss.

        **Held until used.** From the first refusal with ``NOT_READY`` until ``rid`` is admitted (or leaves the
        queue), ``rid`` holds its adapter and its matched history node in GPU memory (:meth:`_hold`): no reclaim
        -- another request's admission, the running batch's KV, a cache policy's swapper -- swaps them out
        before ``rid`` uses them. FastLibra says a query waits for its swap-in and then runs, and that only
        "cold" nodes are evicted (``fastlibra.md`` §2, §5); it does not say how a node that just landed for a
        waiting query is kept, so this is the twin's reading. Without it a LoRA that landed for a waiting request had no running
        request, counted as idle and was evicted by an earlier request's admission in the same step (or by the
        swapper) before its request could run, which then swapped it in again. It holds the adapter and node
        it will use whichever of them it waits for (a resident adapter while its KV is copied in). A hold that
        can never be used is released: when the engine goes idle with requests waiting and none admitted while
        held nodes have landed (:meth:`release_ready_holds`), so holds cannot deadlock admission."""
        e, mem = self.e, self.mem
        waiting = False
        if a >= 0:
            if not mem.resident[a]:
                short = need_ad - (e.total_blocks - e.used_blocks)
                if short > 0:
                    self._reclaim_keeping(node, short, now, a)
                # unified pool: only into the blocks just reclaimed (a policy's reclaim may free
                # fewer than asked, e.g. an adapter whose KV child is still loading stays);
                # a region evicts idle adapters inside it
                if not self._swapper.start(a, now, evict=self.memory != "unified", demand=True):
                    self._refused_for_memory(rid)
                    return Admit.NO_SLOT
                self.swap_in_adapters += 1
                self._swap_adapter_for[rid] = a
                waiting = True
            elif a in mem.loading:
                self._swap_adapter_for[rid] = a
                waiting = True
        if node is not None and node.tier != "hbm":
            if node.tier == "host":
                short = node.blocks - (e.total_blocks - e.used_blocks)
                if short > 0:
                    self.reclaim(short, now, pin=a)
                if not self.prefix.swap_in(node, now, demand=True):
                    if waiting:  # its adapter's copy is in flight for it: held (its node is not in the pool)
                        self._hold(rid, a, None)
                    return Admit.NO_KV
                self.swap_in_kv += 1
            waiting = True
        if waiting:
            self._hold(rid, a, node)
            self._swap_wait_since.setdefault(rid, now)
            why = self._swap_waited_for.setdefault(rid, [False, False])
            why[0] = why[0] or rid in self._swap_adapter_for
            why[1] = why[1] or (node is not None and node.tier != "hbm")
            return Admit.NOT_READY
        if rid in self._holds:  # admitted now: its adapter and node are its own from here on
            self._unhold(rid)
        t0 = self._swap_wait_since.pop(rid, None)
        if t0 is not None:  # admitted after waiting for its swaps
            self.swap_waits += 1
            lw = e.load_wait_d
            lw[rid] = lw.get(rid, 0.0) + (now - t0)
            for_lora, for_kv = self._swap_waited_for.pop(rid, (False, False))
            if for_lora:
                self.lora_cold_starts += 1
                self.lora_cold_start_s += now - t0
            elif for_kv:
                self.kv_cold_starts += 1
                self.kv_cold_start_s += now - t0
            if self._swap_adapter_for.pop(rid, -1) == a:  # it waited for its adapter: a miss
                mem.loaded_at[a] = now  # (twin/engine.py: adapter_hit_code; "loaded by the admitting step")
                if not mem.active[a]:
                    mem.hits -= 1       # (AdapterMemory.acquire counts the activation as a hit next)
        return None

    # ------------------------------------------------------------------ nodes held for waiting requests
    def _hold(self, rid: int, a: int, node: Any) -> None:
        """``rid`` (waiting for its swap-ins) holds adapter ``a`` (when in GPU memory or being copied there) and
        history ``node`` (when in the pool) until :meth:`_unhold`: what it held before is replaced."""
        mem, p = self.mem, self.prefix
        a = a if a >= 0 and mem.resident[a] else -1
        if node is not None and (node.tier == "host" or not p.in_store(node)):
            node = None
        old = self._holds.get(rid)
        if old is not None:
            if old[0] == a and old[1] is node:
                return
            self._unhold(rid)
        if a < 0 and node is None:
            return
        self._holds[rid] = (a, node)
        if a >= 0:
            self.held_adapters[a] = self.held_adapters.get(a, 0) + 1
        if node is not None:
            p.hold(node)

    def _unhold(self, rid: int) -> None:
        """``rid`` was admitted or left the queue: it holds nothing any more."""
        a, node = self._holds.pop(rid)
        if a >= 0:
            k = self.held_adapters[a] - 1
            if k:
                self.held_adapters[a] = k
            else:
                del self.held_adapters[a]
        if node is not None:
            self.prefix.unhold(node)

    def release_ready_holds(self, now: float) -> bool:
        """The engine is idle (nothing runs after a step's admissions) with requests waiting: once every held
        copy has landed, all holds are released and True is returned (the engine then plans again at ``now``).
        A held node that landed and whose request still was not admitted with the engine idle cannot be waited
        for: nothing running will finish and free memory, so the memory the holds keep may be what blocks every
        admission (e.g. FCFS's head refused for KV blocks held for a request behind it); its request swaps it in
        again when it is tried and the node was evicted meanwhile.

        All or nothing: while a held copy is still in flight nothing is released (its landing wakes the engine,
        and the release comes then). Releasing the landed holds alone freed the very request that waits for
        the copy still in flight -- typically the queue's head, held back by the memory a request behind it
        is swapping in -- and the swapper then swapped the head's unheld LoRA out before the other copy
        landed, forever (a livelock of zero steps found by stop 67's audit). A held history node that left
        the store while being copied in (a later turn replaced it) never lands and does not count as in
        flight. Once per instant."""
        if not self._holds or now == self._released_at:
            return False
        loading, p = self.mem.loading, self.prefix
        for a, node in self._holds.values():
            if (a >= 0 and a in loading) or (node is not None and node.tier == "loading" and p.in_store(node)):
                return False
        self._released_at = now
        for rid in list(self._holds):
            self._unhold(rid)
        self.hold_releases += 1
        return True

    def release_holds_of(self, rids: Any) -> None:
        """Requests ``rids`` left the queue without being admitted (dropped): what they held is released."""
        if self._holds:
            for rid in list(rids):
                if int(rid) in self._holds:
                    self._unhold(int(rid))

    # ------------------------------------------------------------------ checks and stats
    def check(self) -> None:
        """Hook point of ``Engine.assert_invariants``: memory placement, history KV, pool accounting."""
        e, mem = self.e, self.mem
        if mem.placement is not None:
            mem.placement.check()
        if self.prefix is not None:
            self.prefix.check()
        ad_blocks = mem.placement.adapter_blocks if self.memory == "unified" else 0
        hist = self.prefix.hbm_blocks if self.prefix is not None else 0
        assert e.total_blocks + ad_blocks + hist == self.pool_blocks, \
            f"pool accounting: KV {e.total_blocks} + adapters {ad_blocks} + history {hist} != {self.pool_blocks}"
        for a in mem.loading:
            assert mem.resident[a], "a loading adapter holds no memory"
        counts: dict[int, int] = {}
        for rid, (a, node) in self._holds.items():
            assert e.state[rid] == 0 and rid not in e.running, f"request {rid} holds nodes but is not waiting"
            if a >= 0:
                counts[a] = counts.get(a, 0) + 1
                assert mem.resident[a], f"adapter {a}, held for waiting request {rid}, left GPU memory"
            if node is not None and self.prefix.in_store(node):
                assert node.tier != "host", f"a history node held for waiting request {rid} left the pool"
        assert counts == self.held_adapters, "held adapters out of sync with the holds"

    def _refused_for_memory(self, rid: int) -> None:
        """Request ``rid`` was refused admission because its adapter could not get memory (:attr:`blocked`)."""
        if not self._blocked_rid[rid]:
            self._blocked_rid[rid] = 1
            self.blocked += 1

    def stats(self) -> dict[str, Any]:
        """The extensions' counters, then the policies' :meth:`stats` (for the run summary)."""
        out: dict[str, Any] = {"adapter_memory": self.memory, "reclaimed_blocks": self.reclaimed_blocks,
                               "requests_blocked_by_adapter_memory": self.blocked}
        if self.memory == "unified" or self.prefix is not None:  # (where copies land in the KV pool)
            out.update({"memory_stalls": self.memory_stalls, "memory_stall_s": self.memory_stall_s})
        if self.cache.kv_block_size:  # the system's own block size replaced EngineConfig.block_size
            out["kv_block_size"] = self.e.block_size
        if self.memory == "region" and self.cache.lora_share:
            out["lora_slots"] = self.e.config.max_loras
        if self.mem.placement is not None:
            out.update(self.mem.placement.stats())
        if self.prefix is not None:
            out.update(self.prefix.stats())
        if self.loader is not None:
            out.update(self.loader.stats())
        if self.async_swap:
            out.update({"swap_in_adapters": self.swap_in_adapters, "swap_in_kv": self.swap_in_kv,
                        "swap_waits": self.swap_waits, "lora_cold_starts": self.lora_cold_starts,
                        "lora_cold_start_s": self.lora_cold_start_s, "kv_cold_starts": self.kv_cold_starts,
                        "kv_cold_start_s": self.kv_cold_start_s})
        out.update(policy_stats(self.cache))
        out.update(policy_stats(self.e.scheduler))
        return out
