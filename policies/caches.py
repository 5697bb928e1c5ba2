"""Classic adapter-cache policies: LFU, GDSF, EMA popularity with prefetching, and the vLLM
slot cache placed in a byte region (contiguous or paged).

All of them choose a victim among the *idle* resident adapters (no running request, not
loading); the engine never offers an adapter in use.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from policies.common import ArrivalStats
from policies.lru import LRUCache
from twin.registry import Preset, register_cache, register_preset
from twin.interfaces import AdapterCachePolicy, EngineView, unpinned

INF = math.inf


class IdleTracking(AdapterCachePolicy):
    """Keeps the idle resident adapters with the time each went idle (for LRU tie-breaks)."""

    def __init__(self, **memory) -> None:
        super().__init__(**memory)
        self.idle: dict[int, float] = {}

    def on_active(self, a: int, now: float) -> None:
        self.idle.pop(a, None)

    def on_idle(self, a: int, now: float) -> None:
        self.idle[a] = now

    def on_evict(self, a: int, now: float) -> None:
        self.idle.pop(a, None)


@register_cache
class LFUCache(IdleTracking):
    """Least frequently used: evict the idle adapter with the fewest requests so far
    (ties: the one idle the longest). The frequency counts every arrived request of the
    adapter (perfect LFU), not only the requests seen while resident."""

    name = "lfu"
    description = "evict the idle adapter with the fewest requests so far (ties: least recently used)"
    citation = "classic LFU; baseline in Chameleon (MICRO'25) §6.4"

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.stats_ = ArrivalStats(engine)

    def victim(self, now: float) -> int:
        self.stats_.update()
        cnt = self.stats_.count
        return min(unpinned(self.idle, self.reclaim_pin), key=lambda a: (cnt[a], self.idle[a], a))


@register_cache
class GDSFCache(IdleTracking):
    """Greedy-Dual-Size-Frequency (Cherkasova, HP Labs TR HPL-98-69, 1998).

    Every resident adapter ``a`` has the priority ``H(a) = L + Frequency(a) * Cost(a) / Size(a)``,
    set when it is loaded (``Frequency = 1``) and raised at each later use (``Frequency += 1``,
    with the current ``L``). The victim is the idle adapter with the smallest ``H``, and the
    inflation value ``L`` becomes that ``H`` -- so adapters that were valuable long ago age out.
    ``Cost`` is the time to bring the adapter back (CPU->GPU copy, plus the disk read when it
    is not in the CPU tier) and ``Size`` its bytes: a small, often used, expensive-to-load
    adapter is kept. Frequency restarts at 1 after an eviction (the policy's in-cache count).
    """

    name = "gdsf"
    description = "Greedy-Dual-Size-Frequency: evict min L + Frequency*Cost/Size, L inflates to the victim's value"
    citation = "Cherkasova, HPL-98-69 (1998); GDSF"

    def __init__(self, **memory) -> None:
        super().__init__(**memory)
        self.L = 0.0
        self.H: dict[int, float] = {}
        self.freq: dict[int, int] = {}

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        mem = engine.adapters
        self.size = list(mem.bytes)
        self._cpu = [mem.cpu_load_s[r] for r in mem.ranks_l]
        self._disk = [mem.disk_load_s[r] for r in mem.ranks_l]

    def cost(self, a: int) -> float:
        return self._cpu[a] + (0.0 if a in self.engine.adapters.cpu else self._disk[a])

    def priority(self, a: int) -> float:
        return self.L + self.freq[a] * self.cost(a) / self.size[a]

    def on_active(self, a: int, now: float) -> None:
        super().on_active(a, now)
        if a in self.freq:  # a hit: one more use
            self.freq[a] += 1
            self.H[a] = self.priority(a)

    def on_load(self, a: int, now: float) -> None:
        self.freq[a] = 1
        self.H[a] = self.priority(a)

    def on_evict(self, a: int, now: float) -> None:
        super().on_evict(a, now)
        self.freq.pop(a, None)
        self.H.pop(a, None)

    def victim(self, now: float) -> int:
        v = min(unpinned(self.idle, self.reclaim_pin), key=lambda a: (self.H[a], self.idle[a], a))
        self.L = self.H[v]
        return v


@register_cache
class EMAPrefetchCache(IdleTracking):
    """Popularity by exponential moving average, with prefetching of the most popular adapters.

    Two clocks for the average (the adaptive-caching study gives neither the update rule nor
    alpha, ``shared/refs/adaptive-caching.md`` §2):

    * **time** (default): every ``interval_s`` the request rate of each adapter over the last
      interval updates ``ema = alpha * rate + (1 - alpha) * ema``; the ``top_k`` adapters with the
      highest EMA (above ``min_rate`` req/s) are the prefetch set until the next tick, and a
      step's prefetch loads those not resident.
    * **requests** (``every_requests = N``): the study's request-driven testbed, in the
      conventional form the reference names as an assumption: on each request, for every adapter
      ``a``, ``ema_a = alpha * [a requested] + (1 - alpha) * ema_a``; every ``N`` requests the
      ``top_k`` adapters with the highest EMA not resident are prefetched once (the study's
      "every N requests, load any of the top-K adapters not already cached"). Applied lazily
      from the engine's arrival pointer in closed form: after ``k`` requests
      ``ema = (1 - alpha)^k ema + sum_j alpha (1 - alpha)^(k - j) [a_j = a]``.

    The victim is the idle adapter with the lowest EMA (ties: least recently used; the study
    does not say, the natural reading). A prefetch goes only into a free slot or in place of
    an idle adapter with a lower EMA. ``ema-prefetch`` copies in the background over the host
    link (asynchronous); ``ema-prefetch-sync`` puts the copies on the critical path of the
    deciding step, which is what makes the tail latency worse in the adaptive-caching study
    (§5 finding 5: sync prefetch raises P99 latency). ``top_k`` defaults to the GPU slots.
    """

    name = "ema-prefetch"
    description = "EMA request-rate popularity; evict the least popular idle adapter; async prefetch of the top ones"
    citation = "adaptive LoRA caching study (EMA popularity, sync vs async prefetch), as in the project issue"

    def __init__(self, alpha: float = 0.5, interval_s: float = 1.0, top_k: int | None = None,
                 min_rate: float = 0.05, every_requests: int | None = None, **memory) -> None:
        super().__init__(**memory)
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"ema-prefetch: alpha must be in (0, 1], got {alpha!r}")
        if every_requests is not None and (isinstance(every_requests, bool) or int(every_requests) != every_requests
                                           or every_requests < 1):
            raise ValueError(f"ema-prefetch: every_requests must be a whole number of requests >= 1 (or None for "
                             f"the time clock), got {every_requests!r}")
        self.alpha = alpha
        self.interval_s = interval_s
        self.top_k = top_k
        self.min_rate = min_rate
        self.every_requests = None if every_requests is None else int(every_requests)
        self.wanted: list[int] = []

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.ema = np.zeros(engine.n_adapters)
        self.ptr = 0
        self.k = self.top_k or max(1, engine.adapters.gpu_slots)
        self.decisions = 0

    tick_option = "interval_s"

    @property
    def tick_interval(self) -> float | None:
        return None if self.every_requests else self.interval_s

    def on_tick(self, now: float) -> None:
        e = self.engine
        hi = e.arr_ptr
        ad = e.adapter[self.ptr:hi]
        ad = ad[ad >= 0]
        rate = np.bincount(ad, minlength=e.n_adapters) / self.interval_s
        self.ptr = hi
        self.ema = self.alpha * rate + (1 - self.alpha) * self.ema
        self._rank(self.min_rate)

    def _rank(self, floor: float) -> None:
        order = np.argsort(-self.ema, kind="stable")[: self.k]
        self.wanted = [int(a) for a in order if self.ema[a] > floor]
        self.decisions += 1

    def _catch_up(self) -> None:
        """Requests clock: apply the per-request update to the requests that arrived since the
        last call, and take the prefetch decision when an N-th request is among them."""
        e = self.engine
        lo, hi = self.ptr, e.arr_ptr
        if hi == lo:
            return
        ad = np.asarray(e.adapter[lo:hi])
        k = hi - lo
        keep = 1.0 - self.alpha
        weights = self.alpha * keep ** np.arange(k - 1, -1, -1, dtype=float)
        mine = ad >= 0  # a request without an adapter only decays the averages
        self.ema = self.ema * keep ** k + np.bincount(ad[mine], weights=weights[mine], minlength=e.n_adapters)
        self.ptr = hi
        n = self.every_requests
        if hi // n > lo // n:
            self._rank(0.0)

    def victim(self, now: float) -> int:
        if self.every_requests:
            self._catch_up()
        ema = self.ema
        return min(unpinned(self.idle, self.reclaim_pin), key=lambda a: (ema[a], self.idle[a], a))

    def prefetch(self, now: float) -> Iterable[int]:
        if self.every_requests:  # a decision is taken once, at the first step after it falls due
            self._catch_up()
            wanted, self.wanted = self.wanted, []
            return self._loadable(wanted)
        return self._loadable(self.wanted)

    def _loadable(self, wanted: list[int]) -> Iterable[int]:
        mem = self.engine.adapters
        ema = self.ema
        for a in wanted:
            if mem.resident[a]:
                continue
            if mem.placement is None and mem.n_resident >= mem.gpu_slots:
                if not self.idle or min(ema[v] for v in self.idle) >= ema[a]:
                    continue
            yield a

    def stats(self) -> dict[str, Any]:
        """The requests clock's prefetch decisions (the time clock's ticks are the run's length
        over ``interval_s``)."""
        return {"ema_decisions": self.decisions} if self.every_requests else {}


@register_cache
class EMAPrefetchSyncCache(EMAPrefetchCache):
    name = "ema-prefetch-sync"
    description = "ema-prefetch with synchronous prefetching (loads on the next step's critical path)"
    citation = EMAPrefetchCache.citation
    prefetch_sync = True


register_preset(Preset("vllm-contiguous", "fcfs", "lru", "vLLM FCFS + LRU, adapters placed contiguously (first fit) "
                       "in the slots' memory at their real size: fragmentation and allocation failures",
                       "seed write-up; S-LoRA MLSys'24 §4.1", cache_opts={"adapter_memory": "region",
                                                                           "adapter_placement": "contiguous"}))
register_preset(Preset("vllm-paged", "fcfs", "lru", "vLLM FCFS + LRU, adapters in 2 MB pages in the slots' memory "
                       "(S-LoRA-style paging: no failures, small internal fragmentation, slightly slower loads)",
                       "seed write-up; S-LoRA MLSys'24 §4.1", cache_opts={"adapter_memory": "region",
                                                                           "adapter_placement": "paged"}))
register_preset(Preset("ema-prefetch", "fcfs", "ema-prefetch", "vLLM FCFS + EMA popularity cache with asynchronous "
                       "prefetching", EMAPrefetchCache.citation))
register_preset(Preset("ema-prefetch-sync", "fcfs", "ema-prefetch-sync", "vLLM FCFS + EMA popularity cache with "
                       "synchronous prefetching", EMAPrefetchCache.citation))

#: the adaptive-caching study's EMA on its request clock (assumptions: the study gives neither):
#: alpha per request (an average over about the last 1 / alpha = 20 requests) and a prefetch
#: decision every N requests (its "every N requests", N unspecified); top-K = the GPU slots
STUDY_EMA_ALPHA = 0.05
STUDY_EMA_EVERY_REQUESTS = 10
_STUDY_EMA = {"alpha": STUDY_EMA_ALPHA, "every_requests": STUDY_EMA_EVERY_REQUESTS}
register_preset(Preset("ema-per-request", "fcfs", "ema-prefetch", "vLLM FCFS + EMA popularity updated per request "
                       f"(alpha {STUDY_EMA_ALPHA}), asynchronous prefetch of the top adapters every "
                       f"{STUDY_EMA_EVERY_REQUESTS} requests (the adaptive-caching study's clock)",
                       EMAPrefetchCache.citation, cache_opts=dict(_STUDY_EMA)))
register_preset(Preset("ema-per-request-sync", "fcfs", "ema-prefetch-sync", "ema-per-request with synchronous "
                       "prefetching (the copies on the deciding step's critical path, as the study evaluated it)",
                       EMAPrefetchCache.citation, cache_opts=dict(_STUDY_EMA)))

__all__ = ["LFUCache", "GDSFCache", "EMAPrefetchCache", "EMAPrefetchSyncCache", "LRUCache"]
