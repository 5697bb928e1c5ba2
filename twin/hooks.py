"""Engine extensions that only some policies need, installed once at engine start.

The default system (vLLM: fixed adapter slots, no prefetch, no prefix reuse) installs
nothing: :func:`install_extensions` returns None and the engine's hooks stay ``None``/
``False``, each tested once per admission, finish or KV shortage -- never per decode step.
Otherwise :class:`Extensions` wires:

* **adapter memory** (:mod:`twin.adapter_placement`): ``unified`` (S-LoRA / Chameleon /
  FastLibra: adapters take blocks of the KV pool, the cache lives in idle memory and shrinks
  when the batch needs blocks) or ``region`` (a fixed adapter region, contiguous or paged).
  Chosen by the cache policy's ``adapter_memory`` attribute, else ``EngineConfig.adapter_memory``;
* **prefetching** (:mod:`twin.prefetch`): when the scheduler or the cache policy overrides
  ``prefetch``; asynchronous over the host link, or synchronous when the policy sets
  ``prefetch_sync = True``;
* **prefix-KV reuse** (:mod:`twin.prefix_kv`): when the cache policy sets ``prefix_kv = True``
  (or ``EngineConfig.prefix_caching``) and the workload has conversations;
* **timed events**: a heap of ``(time, callback)`` fired at step boundaries; the engine's
  ``_async_until`` is its earliest time, so decode runs end there (exactness of run
  skipping). Prefetch completions, swap-ins and a scheduler's deadlines (Chameleon's squash)
  use it through :meth:`Extensions.push_event`.

Engine hooks (``twin/engine.py``): ``_admit_hook`` in ``_try_admit`` (memory for the adapter
and the first chunk, prefix hit), ``_reclaim`` when the running batch lacks KV blocks (evict
idle cached adapters / history KV before preempting), ``_finish_hook`` (store history KV),
``_prefetch_on`` (prefetch decisions after admissions; arrivals end decode runs), the event
check at each step start, and :meth:`Extensions.check` in ``assert_invariants``.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from twin.interfaces import Admit, AdapterCachePolicy, Scheduler

if TYPE_CHECKING:  # pragma: no cover
    from twin.engine import Engine, StepContext

INF = float("inf")
MEMORY_MODES = ("slots", "region", "unified")


def _overrides(obj: Any, name: str, base: type) -> bool:
    return getattr(type(obj), name, None) is not getattr(base, name, None)


def install_extensions(engine: "Engine", workload: Any) -> "Extensions | None":
    """Install what the policies and the configuration need (None: nothing, the default path)."""
    cfg = engine.config
    cache, sched = engine.cache, engine.scheduler
    memory = getattr(cache, "adapter_memory", None) or getattr(cfg, "adapter_memory", "slots") or "slots"
    if memory not in MEMORY_MODES:
        raise ValueError(f"adapter memory must be one of {MEMORY_MODES}, got {memory!r}")
    prefix = getattr(cache, "prefix_kv", None)
    if prefix is None:
        prefix = bool(getattr(cfg, "prefix_caching", False))
    conv = _column(workload, "conversation_id", engine.n)
    if prefix and (conv is None or not (conv >= 0).any()):
        prefix = False
    sources = [o for o, base in ((sched, Scheduler), (cache, AdapterCachePolicy)) if _overrides(o, "prefetch", base)]
    events = bool(getattr(sched, "uses_events", False) or getattr(cache, "uses_events", False))
    if memory == "slots" and not prefix and not sources and not events:
        return None
    return Extensions(engine, workload, memory, prefix, sources)


def _column(workload: Any, name: str, n: int) -> np.ndarray | None:
    if hasattr(workload, "df"):
        return workload.df[name].to_numpy() if name in workload.df.columns else None
    try:
        v = workload[name]
    except (KeyError, TypeError):
        return None
    return np.asarray(v) if len(v) == n else None


class Extensions:
    """The installed extensions of one engine (see the module docstring)."""

    def __init__(self, engine: "Engine", workload: Any, memory: str, prefix: bool, sources: list) -> None:
        from twin.adapter_placement import RegionPlacement, UnifiedPool

        self.e = e = engine
        self.mem = mem = engine.adapters
        self.cache = engine.cache
        self.memory = memory
        self.events: list[tuple[float, int, Callable | None]] = []
        self._seq = itertools.count()
        self.prefetch_sources = sources
        self.blocked = 0
        self.reclaimed_blocks = 0
        cfg = e.config
        bs = e.block_size
        # ---- adapter memory
        if memory != "slots":
            n_ad = max(e.n_adapters, 1)
            slots0 = cfg.max_loras
            e.config = cfg = dataclasses.replace(cfg, max_loras=max(cfg.max_loras, n_ad))
            mem.gpu_slots = n_ad
            pool_tokens = cfg.kv_capacity_tokens or e.profile.kv_capacity_tokens(0, 0)
            if memory == "unified":
                e.kv_tokens = pool_tokens
                e.total_blocks = pool_tokens // bs
                mem.placement = UnifiedPool(e, self)
            else:
                share = getattr(self.cache, "lora_share", None)
                per_tok = int(e.profile.components["kv"].params.get("kv_bytes_per_token")
                              or e.profile.model.kv_bytes_per_token)
                if getattr(cfg, "adapter_region_bytes", None):
                    region = int(cfg.adapter_region_bytes)
                    e.kv_tokens = max(pool_tokens - region // per_tok, 0) // bs * bs
                elif share:
                    region = int(pool_tokens * per_tok * share)
                    e.kv_tokens = int(pool_tokens * (1 - share)) // bs * bs
                else:  # the memory vLLM gives its slots (already left out of the KV capacity)
                    region = slots0 * e.profile.adapter_bytes(max(e.max_lora_rank, 1))
                e.total_blocks = e.kv_tokens // bs
                placement = getattr(self.cache, "adapter_placement", None) or getattr(cfg, "adapter_placement",
                                                                                    "contiguous")
                mem.placement = RegionPlacement(e, region, placement)
            from twin.engine import REJECTED, check_startup

            check_startup(e.kv_tokens, e.max_model_len, 0, 0)
            e.state[:] = 0
            e._reject_at_arrival()
            if memory == "unified" and e.n:  # the request and its adapter must fit in the pool together
                ab = np.asarray(mem.placement.ab + [0], np.int64)[np.where(e.adapter >= 0, e.adapter, -1)]
                need = -(-(e.prompt + e.output - 1) // bs) + ab
                e.reject_reason[(e.reject_reason == 0) & (need > e.total_blocks)] = 2
                e.state[e.reject_reason > 0] = REJECTED
            e._ok_cum = type(e._ok_cum)("q", np.concatenate(([0], np.cumsum(e.reject_reason == 0))).astype(
                np.int64).tobytes())
        self.pool_blocks = e.total_blocks
        # ---- prefix-KV reuse
        self.prefix = None
        if prefix:
            from twin.prefix_kv import HistoryKV

            self.prefix = HistoryKV(e, self, _column(workload, "conversation_id", e.n),
                                    _column(workload, "turn", e.n), _column(workload, "prefix_tokens", e.n),
                                    getattr(self.cache, "host_kv_tokens", INF))
            e._finish_hook = self.prefix.on_finish
        # ---- prefetching
        self.loader = None
        if sources:
            from twin.prefetch import AsyncLoader

            sync = any(getattr(s, "prefetch_sync", False) for s in sources)
            self.loader = AsyncLoader(e, self, sync=sync,
                                      max_inflight=max(getattr(s, "max_inflight", 4) for s in sources))
            e._prefetch_on = True
        if mem.placement is not None or self.prefix is not None:
            e._admit_hook = self.admit
            e._reclaim = self.reclaim_for_step

    # ------------------------------------------------------------------ timed events
    def push_event(self, t: float, cb: Callable[[float], None] | None) -> None:
        """Call ``cb(now)`` at the first step boundary at or after ``t`` (None: only end a decode run there)."""
        heapq.heappush(self.events, (t, next(self._seq), cb))
        if t < self.e._async_until:
            self.e._async_until = t

    def fire(self, now: float) -> None:
        ev = self.events
        while ev and ev[0][0] <= now:
            _, _, cb = heapq.heappop(ev)
            if cb is not None:
                cb(now)
        self.e._async_until = ev[0][0] if ev else INF

    # ------------------------------------------------------------------ prefetch
    def after_schedule(self, ctx: "StepContext", now: float) -> None:
        self.loader.decide(now, ctx)

    # ------------------------------------------------------------------ memory
    def history_reclaimable(self, exclude: Any = None) -> int:
        p = self.prefix
        if p is None:
            return 0
        return p.hbm_blocks - (p.hbm_blocks_of(exclude) if exclude is not None else 0) - sum(
            n.blocks for n in p.nodes.values() if n.tier == "loading" and n is not exclude)

    def reclaimable(self, exclude_node: Any = None, exclude_adapter: int = -1) -> int:
        """Pool blocks that evicting idle adapters (unified pool) and history KV would free."""
        r = self.history_reclaimable(exclude_node)
        pl = self.mem.placement
        if self.memory == "unified":
            ab = pl.ab
            r += sum(ab[v] for v in self.mem.evictable() if v != exclude_adapter)
        return r

    def reclaim(self, n: int, now: float, pin: int = -1) -> int:
        """Free at least ``n`` pool blocks if possible; returns the blocks freed.

        The cache policy decides the order when it implements ``reclaim_blocks(n, now)``;
        otherwise history KV goes first (least recently used; swapped to host when the
        policy sets ``history_to_host``), then idle adapters in the policy's victim order.
        ``pin`` is the adapter of the request being admitted: a policy's ``reclaim_blocks``
        must not evict it; if the victim order evicts it here, its blocks are reclaimed again.
        """
        cache = self.cache
        if hasattr(cache, "reclaim_blocks"):
            freed = cache.reclaim_blocks(n, now, pin)
        else:
            freed = 0
            p = self.prefix
            if p is not None and p.hbm_blocks:
                to_host = getattr(cache, "history_to_host", False)
                for node in sorted(p.hbm_nodes(), key=lambda x: x.last_access):
                    if freed >= n:
                        break
                    freed += p.swap_out(node, now) if to_host else p.drop(node, now)
            if self.memory == "unified":
                mem, ab = self.mem, self.mem.placement.ab
                while freed < n and mem.evictable():
                    v = mem.evict_victim(now)
                    freed += ab[v]
                    if v == pin:
                        n += ab[v]
        self.reclaimed_blocks += freed
        return freed

    def reclaim_for_step(self, n: int) -> bool:
        """The running batch lacks ``n`` blocks: shrink the caches before preempting."""
        return self.reclaim(n, self.e.env.now) >= n

    def admit(self, ctx: "StepContext", rid: int, a: int, T: int, nb: int) -> "Admit | int":
        """Memory for the adapter and the first chunk, and the prefix hit; returns an
        :class:`Admit` failure, or the number of prompt tokens served from history KV."""
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
                self.blocked += 1
                return Admit.NO_SLOT
        node_blocks = self.prefix.hbm_blocks_of(node) if node is not None else 0
        free = e.total_blocks - e.used_blocks + node_blocks
        need = nb + need_ad
        if need > free:
            avail = free + self.reclaimable(node, a)
            if need > avail:
                if need_ad and nb <= avail:
                    self.blocked += 1
                    return Admit.NO_SLOT
                return Admit.NO_KV
        now = e.env.now
        if node is not None:
            self.prefix.take(node, h, rid, ctx, now)
        short = need - (e.total_blocks - e.used_blocks)
        if short > 0:
            self.reclaim(short, now, pin=a)
        return h

    # ------------------------------------------------------------------ cache-policy callbacks
    def cache_history_tier(self, node: Any, now: float) -> str | None:
        f = getattr(self.cache, "history_tier", None)
        return f(node, now) if f is not None else "hbm"

    def cache_on_history(self, node: Any, what: str, now: float) -> None:
        f = getattr(self.cache, "on_history", None)
        if f is not None:
            f(node, what, now)

    # ------------------------------------------------------------------ checks and stats
    def check(self) -> None:
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

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"adapter_memory": self.memory, "reclaimed_blocks": self.reclaimed_blocks,
                               "admissions_blocked_by_adapter_memory": self.blocked}
        if self.mem.placement is not None:
            out.update(self.mem.placement.stats())
        if self.prefix is not None:
            out.update(self.prefix.stats())
        if self.loader is not None:
            out.update(self.loader.stats())
        f = getattr(self.cache, "stats", None)
        if f is not None:
            out.update(f())
        f = getattr(self.e.scheduler, "stats", None)
        if f is not None:
            out.update(f())
        return out
