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

import heapq
import math
from collections import deque
from typing import Iterable, Iterator

from twin.registry import Preset, register_preset, register_scheduler
from twin.interfaces import Admit, EngineView, Scheduler

INF = math.inf
#: the class of a group in the incremental order: its adapter resident (tiers 0 and 1, or the base
#: model), in the CPU tier (tier 2), on disk only (tier 3)
RESIDENT, CPU, DISK = 0, 2, 3


@register_scheduler
class AdapterAwareScheduler(Scheduler):
    """The admission order is kept incrementally, so that a plan costs what it visits rather than a
    sort of every adapter group with waiting requests: the groups of non-resident adapters sit in
    one heap per tier (CPU, disk) keyed by their head request (rids are in arrival order), updated
    from the groups whose head changed and the adapters whose tier changed
    (``AdapterMemory.tier_changes``); the resident ones (at most the GPU's slots with slot memory; as
    many as the adapter region or the unified pool holds with a placement) are sorted per plan. A plan walks these in order (:meth:`_walk`), taking entries off the heaps only as far as
    it goes; each entry carries its group's version, so an outdated one is dropped when met."""

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
        self.base = A
        self.cap = self.max_adapters or engine.config.max_loras
        engine.adapters.tier_changes = []
        # per group, as of the last _refresh: head request (-1: none waiting), class, version
        self._head = [-1] * (A + 1)
        self._cls = [DISK] * A + [RESIDENT]
        self._ver = [0] * (A + 1)
        self._heaps: dict[int, list[tuple[int, int, int]]] = {CPU: [], DISK: []}  # (head, group, version)
        self._live = {CPU: 0, DISK: 0}  # entries of each heap that are current
        self._dirty: set[int] = set()   # groups whose queue changed since the last _refresh
        self._popped: list[tuple[int, int, int]] = []  # current entries the last walk took off the heaps
        self._ages: list[tuple[int, int]] = []  # (head, group): heads that may still age (next_change_time)
        self._snap: list[tuple[tuple[int, int], int]] = []  # the last walk's resident groups, keyed and sorted

    def on_arrivals(self, lo: int, hi: int) -> None:
        ok, q, ad, base, dirty = self.ok, self.q, self.engine.adapter_a, self.base, self._dirty
        for rid in range(lo, hi):
            if ok[rid]:
                a = ad[rid]
                g = a if a >= 0 else base
                q[g].append(rid)
                dirty.add(g)

    def on_preempt(self, rid: int) -> None:
        a = self.engine.adapter_a[rid]
        g = a if a >= 0 else self.base
        self.q[g].appendleft(rid)
        self._dirty.add(g)

    def tier(self, g: int) -> int:
        """The tier of group ``g``'s adapter now (module docstring)."""
        if g == self.base:
            return 0
        mem = self.engine.adapters
        if mem.resident[g]:
            return 1 if g in mem.loading else 0
        return 2 if g in mem.cpu else 3

    def _refresh(self) -> None:
        """Bring the heaps up to date: the entries the last walk took are put back, then every group
        whose queue or adapter tier changed since gets a new version (and entry) if its head or class did."""
        heaps, ver, cls, head, live = self._heaps, self._ver, self._cls, self._head, self._live
        for ent in self._popped:
            if ent[2] == ver[ent[1]]:
                heapq.heappush(heaps[cls[ent[1]]], ent)
        self._popped = []
        todo = self._dirty
        mem = self.engine.adapters
        if mem.tier_changes:
            todo.update(mem.tier_changes)
            mem.tier_changes.clear()
        if not todo:
            return
        q, base, resident, cpu, ages = self.q, self.base, mem.resident, mem.cpu, self._ages
        for g in todo:
            qg = q[g]
            h = qg[0] if qg else -1
            c = RESIDENT if g == base or resident[g] else CPU if g in cpu else DISK
            h0, c0 = head[g], cls[g]
            if h == h0 and c == c0:
                continue
            ver[g] += 1
            if h0 >= 0 and c0 != RESIDENT:
                live[c0] -= 1
            if h >= 0:
                if c != RESIDENT:
                    heapq.heappush(heaps[c], (h, g, ver[g]))
                    live[c] += 1
                if h != h0:
                    heapq.heappush(ages, (h, g))
            head[g] = h
            cls[g] = c
        todo.clear()
        for c, heap in heaps.items():  # drop the outdated entries once they outnumber the current ones
            if len(heap) > 2 * live[c] + 64:
                heap[:] = [ent for ent in heap if ent[2] == ver[ent[1]]]
                heapq.heapify(heap)

    def _take(self, c: int) -> Iterator[tuple[int, int]]:
        """``(head, group)`` of class ``c``'s heap in head order, taken off it as far as they are read
        (:meth:`_refresh` puts the current ones back)."""
        heap, ver, popped = self._heaps[c], self._ver, self._popped
        while heap:
            ent = heapq.heappop(heap)
            if ent[2] == ver[ent[1]]:
                popped.append(ent)
                yield ent[0], ent[1]

    def _walk(self) -> Iterator[tuple[tuple[int, int], int]]:
        """``(key, group)`` of the adapter groups with waiting requests, in admission priority order:
        ``key`` = ``(-1 if the head request waited max_wait_s else the tier, head rid)``, ascending.
        The state is the one at the first ``next()``: tiers do not move under a walk (changes reach
        the heaps at the next one). Since arrival times grow with the rid, the aged groups of each
        tier are the first ones in head order: they are merged first, then the tiers follow."""
        self._refresh()
        e = self.engine
        now, arr, w, q, base = e.now, e.arrival_a, self.max_wait_s, self.q, self.base
        snap = []
        for g in (*e.adapters.resident_ids, base):
            if q[g]:
                h = q[g][0]
                snap.append(((-1 if now - arr[h] >= w else self.tier(g), h), g))
        snap.sort()
        self._snap = snap
        cpu, disk = self._take(CPU), self._take(DISK)
        c, d = next(cpu, None), next(disk, None)
        i, n = 0, len(snap)
        while True:  # the aged groups, oldest head first
            h = INF
            if i < n and snap[i][0][0] < 0:
                h, src = snap[i][0][1], 0
            if c is not None and c[0] < h and now - arr[c[0]] >= w:
                h, src = c[0], 1
            if d is not None and d[0] < h and now - arr[d[0]] >= w:
                h, src = d[0], 2
            if h == INF:
                break
            if src == 0:
                g = snap[i][1]
                i += 1
            elif src == 1:
                g = c[1]
                c = next(cpu, None)
            else:
                g = d[1]
                d = next(disk, None)
            yield (-1, h), g
        yield from snap[i:]
        while c is not None:
            yield (CPU, c[0]), c[1]
            c = next(cpu, None)
        while d is not None:
            yield (DISK, d[0]), d[1]
            d = next(disk, None)

    def _groups(self) -> Iterator[int]:
        """The groups :meth:`schedule_waiting` offers, in :meth:`_walk`'s order. Once the batch holds
        ``cap`` adapters, a group whose adapter is not in it is skipped; the adapters in it were
        resident when the walk began (an admission only adds to the batch), so the rest of the walk
        is the walk's resident groups after that point, not every group left."""
        mem, base, cap = self.engine.adapters, self.base, self.cap
        for key, g in self._walk():
            if g != base and not mem.active[g] and mem.n_active >= cap:
                yield from (g for k, g in self._snap if k > key)
                return
            yield g

    def schedule_waiting(self, ctx) -> Admit | None:
        mem = self.engine.adapters
        base, dirty = self.base, self._dirty
        for g in self._groups():
            q = self.q[g]
            if g != base and not mem.active[g] and mem.n_active >= self.cap:
                continue  # a new adapter would exceed the cap: skip (the request keeps its place)
            while q:
                r = ctx.try_admit(q[0])
                if r == Admit.OK:
                    q.popleft()
                    dirty.add(g)
                    continue
                if r == Admit.NO_SLOT:
                    break
                return r
        return None

    def prefetch(self, now: float) -> Iterable[int]:
        """The adapters of the next ``lookahead`` waiting requests, in admission order (taken before
        the first is prefetched: a prefetch changes tiers)."""
        n = 0
        base = self.base
        groups = []
        for _, g in self._walk():
            if n >= self.lookahead:
                break
            n += len(self.q[g])
            if g != base:
                groups.append(g)
        yield from groups

    def next_change_time(self, stop: Admit | None) -> float:
        # NO_SEQ: no admission can pass before a running request finishes (which ends a run), but aging still
        # reorders the walk that :meth:`prefetch` follows at every step, so the run ends at the next aging too
        # (an arrival ends it in the engine when prefetching)
        # aging moves a request to the front max_wait_s after it arrived: the first head (smallest
        # rid, so earliest arrival) not aged by now; the heads aged by now leave the heap for good
        self._refresh()
        e = self.engine
        arr, now, w, q, ages = e.arrival_a, e.now, self.max_wait_s, self.q, self._ages
        while ages:
            h, g = ages[0]
            if q[g] and q[g][0] == h and arr[h] + w > now:
                break
            heapq.heappop(ages)
        t_age = arr[ages[0][0]] + w if ages else INF
        if stop == Admit.NO_SEQ:
            return t_age
        return min(e.next_arrival_time(), t_age)


register_preset(Preset("adapter-aware", "adapter-aware", "lru", "vLLM v1 + adapter-aware ordering, lookahead "
                       "prefetch and a per-batch adapter cap, LRU slots", "multi-LoRA serving write-up"))
