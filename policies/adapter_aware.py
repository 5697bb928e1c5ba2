"""Adapter-aware scheduling: the vLLM v1 extension of the multi-LoRA serving write-up.

vLLM v1's FCFS scheduler ignores where a request's adapter is, so a request whose adapter
must come from disk can hold up the step while requests whose adapters are already on the
GPU wait. The extension (the project's multi-LoRA serving write-up) orders the waiting
requests by the *state of their adapter*:

    tier 0: resident on the GPU (or the base model)   tier 1: loading (prefetch in flight)
    tier 2: in the CPU tier                           tier 3: on disk only

oldest first within a tier; a request that has waited longer than ``max_wait_s`` moves to
the front (aging, so cold adapters cannot starve). It prefetches, asynchronously, the
adapters of the next ``lookahead`` waiting requests in that order, and caps the distinct
adapters of a batch at ``max_adapters`` (default: the engine's ``max_loras``), skipping
requests whose adapter would exceed the cap (as vLLM skips on ``max_loras``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable

from twin.registry import Preset, register_preset, register_scheduler
from twin.interfaces import Admit, EngineView, Scheduler

INF = math.inf


@register_scheduler
class AdapterAwareScheduler(Scheduler):
    name = "adapter-aware"
    description = "prefer requests whose adapter is resident, then loading, CPU, disk; prefetch lookahead; cap adapters"
    citation = "multi-LoRA serving write-up (vLLM v1 extension)"
    prefetch_evicts = True

    def __init__(self, lookahead: int = 4, max_adapters: int | None = None, max_wait_s: float = 5.0) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.max_adapters = max_adapters
        self.max_wait_s = max_wait_s

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.ok = (engine.reject_reason == 0).tolist()
        A = engine.n_adapters
        self.q: list[deque[int]] = [deque() for _ in range(A + 1)]  # per adapter; index A = base model
        self.nonempty: set[int] = set()
        self.cap = self.max_adapters or engine.config.max_loras
        self._stop_time = INF

    def _grp(self, rid: int) -> int:
        a = self.engine.adapter_a[rid]
        return a if a >= 0 else len(self.q) - 1

    def on_arrivals(self, lo: int, hi: int) -> None:
        ok = self.ok
        for rid in range(lo, hi):
            if ok[rid]:
                g = self._grp(rid)
                self.q[g].append(rid)
                self.nonempty.add(g)

    def on_preempt(self, rid: int) -> None:
        g = self._grp(rid)
        self.q[g].appendleft(rid)
        self.nonempty.add(g)

    def tier(self, g: int) -> int:
        e = self.engine
        if g == len(self.q) - 1:
            return 0
        mem = e.adapters
        if mem.resident[g]:
            return 1 if g in mem.loading else 0
        return 2 if g in mem.cpu else 3

    def order(self) -> list[int]:
        """Adapter groups with waiting requests, in admission priority order."""
        e = self.engine
        now = e.now
        arr = e.arrival_a
        keys = []
        for g in self.nonempty:
            head = self.q[g][0]
            aged = now - arr[head] >= self.max_wait_s
            keys.append(((-1 if aged else self.tier(g)), head, g))
        keys.sort()
        return [g for _, _, g in keys]

    def schedule_waiting(self, ctx) -> Admit | None:
        e = self.engine
        mem = e.adapters
        base = len(self.q) - 1
        for g in self.order():
            q = self.q[g]
            if g != base and not mem.active[g] and mem.n_active >= self.cap:
                continue  # a new adapter would exceed the cap: skip (the request keeps its place)
            while q:
                r = ctx.try_admit(q[0])
                if r == Admit.OK:
                    q.popleft()
                    continue
                if r == Admit.NO_SLOT:
                    break
                if not q:
                    self.nonempty.discard(g)
                self._gc()
                return r
        self._gc()
        return None

    def _gc(self) -> None:
        self.nonempty = {g for g in self.nonempty if self.q[g]}

    def prefetch(self, now: float) -> Iterable[int]:
        """The adapters of the next ``lookahead`` waiting requests, in admission order."""
        n = 0
        base = len(self.q) - 1
        for g in self.order():
            if n >= self.lookahead:
                return
            n += len(self.q[g])
            if g != base:
                yield g

    def next_change_time(self, stop: Admit | None) -> float:
        e = self.engine
        if stop == Admit.NO_SEQ:
            return INF
        # aging moves a request to the front max_wait_s after it arrived
        arr = e.arrival_a
        now = e.now
        t_age = min((arr[self.q[g][0]] + self.max_wait_s for g in self.nonempty
                     if arr[self.q[g][0]] + self.max_wait_s > now), default=INF)
        return min(e.next_arrival_time(), t_age)


register_preset(Preset("adapter-aware", "adapter-aware", "lru", "vLLM v1 + adapter-aware ordering, lookahead "
                       "prefetch and a per-batch adapter cap, LRU slots", "multi-LoRA serving write-up"))
