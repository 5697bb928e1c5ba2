"""First come, first served: vLLM 0.8.5 v1's default scheduler (``vllm/v1/core/sched/scheduler.py``).

Waiting requests are tried in queue order -- preempted requests at the front (the most
recently preempted first), then arrivals in arrival order. A request whose adapter would
exceed ``max_loras`` distinct adapters in the batch is *skipped* and keeps its place;
the scan stops at the first request that fails for any other reason (no KV blocks for
its first chunk, ``max_num_seqs`` reached, token budget spent). A request whose adapter or
history KV is still being swapped in (``Admit.NOT_READY``, caches with ``async_swap_in`` such
as FastLibra's) is skipped too and keeps its place, as vLLM 0.8.5 v1 skips a request it cannot
start yet and keeps its place (``skipped_waiting_requests``, as for one whose grammar is still compiling,
``WAITING_FOR_FSM``; later versions do the same for KV still arriving, ``WAITING_FOR_REMOTE_KVS``): the scan goes on past it
in arrival order (:meth:`FCFSScheduler._scan_past_not_ready`), so ready requests run while it waits.

Data structures follow the events, not the queue length: requests sit in per-adapter
FIFO arrays (a pointer per adapter), the oldest arrived request is a pointer into the
arrival order, and when all slots are taken a heap of the heads of the adapters in the
batch yields the first eligible request in O(log n). The heap holds the heads' request
indices (a request's adapter group is ``grp[rid]``: ordering by index is ordering by
``(index, group)``, with int comparisons instead of tuple ones). It is read only while every
slot is taken: an admission that leaves a slot free pushes nothing and marks it stale, and
the next read rebuilds it from the heads of the adapters in the batch
(:meth:`FCFSScheduler._rebuild_heap`) -- the same eligible heads, without a push per
admission on servers whose slots are rarely all taken.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from twin.registry import Preset, register_preset, register_scheduler
from twin.interfaces import Admit, EngineView, Scheduler
from twin.requests import as_column

INF = math.inf
OK, NO_SLOT, NOT_READY = Admit.OK, Admit.NO_SLOT, Admit.NOT_READY  # plain names (an enum member lookup is slow)
#: outcomes after which the blocked head stays blocked until a finish ends the run
_STAYS_BLOCKED = frozenset((Admit.NO_KV, Admit.NO_SEQ, Admit.NO_BUDGET))


@register_scheduler
class FCFSScheduler(Scheduler):
    name = "fcfs"
    description = "first come first served with adapter-slot skipping (vLLM 0.8.5 v1 default)"
    citation = "Kwon et al., SOSP'23 (vLLM); vLLM v1 scheduler"

    #: skip the head heap's pushes while a slot is free and rebuild it when every slot is taken
    #: (False: a push per admission; a test checks both give identical results)
    lazy_heap = True

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        e = engine
        A = e.n_adapters
        self.base_group = A  # requests without an adapter
        grp = np.asarray(e.adapter, np.int64).copy()
        grp[grp < 0] = A
        accepted = e.reject_reason == 0
        # (every request accepted, the usual case: no gathers through the index)
        self.valid = np.arange(e.n, dtype=np.int64) if accepted.all() else np.flatnonzero(accepted)
        keys = grp if len(self.valid) == e.n else grp[self.valid]
        counts = np.bincount(keys, minlength=A + 1)
        if A < np.iinfo(np.int16).max:  # the same stable order; numpy radix-sorts 16-bit keys
            keys = keys.astype(np.int16)
        order = np.argsort(keys, kind="stable")
        if len(self.valid) != e.n:
            order = self.valid[order]
        starts = np.concatenate(([0], np.cumsum(counts)))
        self.q = as_column("q", order)
        self.qptr = starts[:-1].tolist()
        self.qend = starts[1:].tolist()
        self.grp = as_column("q", grp)
        self.admitted = bytearray(e.n)
        self.gptr = 0
        self.valid_list = as_column("q", self.valid)
        self.n_valid = len(self.valid_list)
        self.front: deque[int] = deque()
        self.heap: list[int] = []  # heads (request indices) of adapter queues; stale ones are skipped
        self._heap_stale = False   # True: heads were not pushed; rebuild before reading
        self._push_head(A)
        self.max_loras = e.config.max_loras
        self.lora = e.config.enable_lora

    # -- queue helpers
    def _push_head(self, a: int) -> None:
        p = self.qptr[a]
        if p < self.qend[a]:
            heapq.heappush(self.heap, self.q[p])

    def _global_head(self) -> int:
        vl, adm, n = self.valid_list, self.admitted, self.n_valid
        p = self.gptr
        while p < n and adm[vl[p]]:
            p += 1
        self.gptr = p
        return vl[p] if p < n else -1

    def _rebuild_heap(self) -> None:
        """The heap anew (in place): the current head of every adapter in the batch and of the
        base model, the entries :meth:`_eligible_head` would find valid in the maintained heap."""
        q, qptr, qend, heap = self.q, self.qptr, self.qend, self.heap
        heap.clear()
        for a in (*self.engine.adapters.batch, self.base_group):
            p = qptr[a]
            if p < qend[a]:
                heap.append(q[p])
        heapq.heapify(heap)
        self._heap_stale = False

    def _eligible_head(self) -> int:
        """First request (arrival order) of an adapter in the batch, or of the base model."""
        if self._heap_stale:
            self._rebuild_heap()
        heap, active, q, qptr, qend = self.heap, self.engine.adapters.active, self.q, self.qptr, self.qend
        grp, base = self.grp, self.base_group
        while heap:
            idx = heap[0]
            a = grp[idx]
            if (a == base or active[a] > 0) and qptr[a] < qend[a] and q[qptr[a]] == idx:
                return idx
            heapq.heappop(heap)
        return -1

    def _admitted(self, rid: int) -> None:
        a = self.grp[rid]
        adm = self.admitted
        adm[rid] = 1
        q, p = self.q, self.qptr[a]
        if q[p] != rid:  # admitted past a skipped (not ready) head of its adapter's queue
            return
        p += 1
        end = self.qend[a]
        while p < end and adm[q[p]]:
            p += 1
        self.qptr[a] = p
        if self.lazy_heap and not self._slots_full():  # a slot is free: the heap is not read
            self._heap_stale = True
        elif not self._heap_stale:  # (a stale heap is rebuilt before it is read)
            self._push_head(a)

    def _slots_full(self) -> bool:
        return self.lora and self.engine.adapters.n_active >= self.max_loras

    # -- Scheduler API
    def on_preempt(self, rid: int) -> None:
        self.front.appendleft(rid)

    def schedule_waiting(self, ctx) -> Admit | None:
        e = self.engine
        if self.front:
            kept: deque[int] = deque()
            stop = None
            while self.front:
                rid = self.front.popleft()
                r = ctx.try_admit(rid)
                if r == OK:
                    self._push_head(self.grp[rid])
                    continue
                kept.append(rid)
                if r != NO_SLOT and r != NOT_READY:
                    stop = r
                    break
            kept.extend(self.front)
            self.front = kept
            if stop is not None:
                return stop
        arrived = e.arr_ptr
        lora, max_loras, ad = self.lora, self.max_loras, e.adapters
        try_admit = ctx.try_admit
        while True:
            rid = self._eligible_head() if lora and ad.n_active >= max_loras else self._global_head()
            if rid < 0 or rid >= arrived:
                return None
            r = try_admit(rid)
            if r != OK:
                return self._scan_past_not_ready(ctx, rid) if r == NOT_READY else r
            self._admitted(rid)

    def _scan_past_not_ready(self, ctx, first: int) -> Admit:
        """The rest of the scan after ``first`` was not ready (its swap-in is in flight): the
        waiting requests after it in arrival order, skipping the not-ready ones, stopping at the
        first other failure. Only caches with ``async_swap_in`` get here."""
        e = self.engine
        skipped = {first}
        vl, adm, grp, arrived = self.valid_list, self.admitted, self.grp, e.arr_ptr
        lora, max_loras, ad, base = self.lora, self.max_loras, e.adapters, self.base_group
        p = self.gptr
        while p < len(vl):
            rid = vl[p]
            p += 1
            if rid >= arrived:
                break
            if adm[rid] or rid in skipped:
                continue
            if lora and ad.n_active >= max_loras and grp[rid] != base and not ad.active[grp[rid]]:
                continue  # a new adapter with every slot taken: skipped, as in the heap path
            r = ctx.try_admit(rid)
            if r == OK:
                self._admitted(rid)
            elif r == NOT_READY:
                skipped.add(rid)
            else:
                return r
        return NOT_READY

    def next_change_time(self, stop: Admit | None) -> float:
        if stop in _STAYS_BLOCKED:
            return INF  # the blocked head stays blocked until a finish ends the run
        if stop == NOT_READY:  # skipped requests become ready at their swap's event (it ends the run)
            return self.engine.next_arrival_time()
        rid = self._eligible_head() if self._slots_full() else self._global_head()
        return self.engine.arrival_a[rid] if rid >= 0 else INF


register_preset(Preset("vllm", "fcfs", "lru", "vLLM 0.8.5 defaults: FCFS scheduler, LRU adapter slots",
                       "Kwon et al., SOSP'23"))
