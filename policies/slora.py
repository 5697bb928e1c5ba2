"""S-LoRA: FIFO iteration-level scheduling, unified paging, prefetch of queued requests' adapters.

Sheng et al., *S-LoRA: Serving Thousands of Concurrent LoRA Adapters*, MLSys 2024:

* §4.1 **Unified paging**: adapter weights and KV caches share one memory pool (here
  ``adapter_memory="unified"``, :class:`twin.adapter_placement.UnifiedPool`);
* §4.2 **prefetching**: "while running the current decoding batch, we predict the adapters
  required for the next batch based on the current waiting queue" and load them
  asynchronously, overlapping the copy with computation (:class:`SLoRAScheduler.prefetch`);
* §5 / §7 baseline behaviour: adapters stay in GPU memory only while requests use them;
  they are swapped out when no running request needs them (the ``none`` cache,
  :class:`NoCache`) -- there is no adapter cache, which is what Chameleon adds;
* admission is first-come-first-served at iteration level (as in vLLM/Orca), limited by
  the memory pool rather than by a number of adapter slots.

The iteration-level FIFO admission is vLLM v1's (``fcfs``); in the unified pool a request
whose adapter cannot be placed blocks the queue head (FIFO, no skipping), as in S-LoRA.
"""

from __future__ import annotations

import math
from typing import Iterable

from policies.common import adapters_of
from policies.fcfs import FCFSScheduler
from twin.registry import Preset, register_cache, register_preset, register_scheduler
from twin.interfaces import Admit, AdapterCachePolicy, unpinned

INF = math.inf


@register_scheduler
class SLoRAScheduler(FCFSScheduler):
    name = "slora"
    description = ("FIFO iteration-level scheduling + async prefetch of the adapters of queued requests (S-LoRA; "
                   "on --system slora with --slora-prefetch, always on --system vllm)")
    citation = "Sheng et al., S-LoRA, MLSys'24, §4.1-4.2"

    prefetch_evicts = False  # prefetch into free pool memory only

    def __init__(self, lookahead_tokens: int | None = None, max_lookahead: int | None = None) -> None:
        super().__init__()
        #: the "next batch": waiting requests (FIFO) whose prompts fill one step's token budget
        self.lookahead_tokens = lookahead_tokens
        #: at most this many requests in it (None: no cap, as S-LoRA's ``next_batch``)
        self.max_lookahead = max_lookahead

    def _next_batch(self) -> Iterable[int]:
        """The FIFO prefix of the waiting requests whose prompts fit in one step's token budget
        (S-LoRA's ``next_batch()``, ``manager.py``; §4.2): it stops at the first request that does
        not fit, which is not part of it."""
        e = self.engine
        budget = self.lookahead_tokens or e.config.max_num_batched_tokens
        cap = self.max_lookahead if self.max_lookahead is not None else math.inf
        n = 0
        for rid in self.front:
            budget -= e.tokens_known(rid)
            if budget < 0 or n >= cap:
                return
            yield rid
            n += 1
        vl, adm, arrived = self.valid_list, self.admitted, e.arr_ptr
        p = self.gptr
        while p < len(vl) and n < cap:
            rid = vl[p]
            if rid >= arrived:
                return
            if not adm[rid]:
                budget -= int(e.prompt_a[rid])
                if budget < 0:
                    return
                yield rid
                n += 1
            p += 1

    def prefetch(self, now: float) -> Iterable[int]:
        return adapters_of(self.engine, self._next_batch())

    def next_change_time(self, stop: Admit | None) -> float:
        if stop == Admit.NO_SLOT and not self._slots_full():
            return INF  # the head's adapter lacks memory: only a finish or an event can change that
        return super().next_change_time(stop)


@register_cache
class NoCache(AdapterCachePolicy):
    """No adapter cache: discard an adapter when its last running request leaves (S-LoRA).

    A prefetched adapter that is not used yet is idle; when memory is needed the oldest
    such adapter is discarded first (:meth:`victim`)."""

    name = "none"
    description = "no adapter cache: discard an adapter as soon as no running request uses it (S-LoRA)"
    citation = "Sheng et al., S-LoRA, MLSys'24, §4.2"

    def __init__(self, **memory) -> None:
        super().__init__(**memory)
        self.idle: dict[int, None] = {}

    def evict_when_idle(self, a: int) -> bool:
        return True

    def on_active(self, a: int, now: float) -> None:
        self.idle.pop(a, None)

    def on_idle(self, a: int, now: float) -> None:
        self.idle[a] = None  # only prefetched adapters stay idle (others are discarded at once)

    def on_evict(self, a: int, now: float) -> None:
        self.idle.pop(a, None)

    def victim(self, now: float) -> int:
        return next(iter(unpinned(self.idle, self.reclaim_pin) if self.reclaim_pin >= 0 else self.idle))


UNIFIED = {"adapter_memory": "unified"}

register_preset(Preset("slora", "slora", "none", "S-LoRA: FIFO with head-of-line stop, reservation admission, unified "
                       "memory pool, no adapter cache; queued-request prefetch with --slora-prefetch (S-LoRA's "
                       "--prefetch, off by default as in S-LoRA's paper runs)",
                       "Sheng et al., MLSys'24", cache_opts=dict(UNIFIED), system="slora"))
