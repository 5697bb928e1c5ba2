"""Adapter prefetching: loads that a policy starts before a request needs the adapter.

S-LoRA (Sheng et al., MLSys'24, §4.2 "prefetching and overlapping adapter loading with
computation") and Chameleon (MICRO'25, §4.2 predictive prefetch) copy adapters to the GPU
*while the current batch runs*. Two modes:

* **asynchronous** (default): the copy runs in the background on the host link (a SimPy
  process holding :class:`~twin.adapters.HostLink`, so synchronous loads queue behind it --
  the PCIe contention of Chameleon §3.2). From its start the adapter holds its memory and
  is in the **loading** state (``AdapterMemory.loading``): not evictable, not usable yet. A
  request admitted while its adapter is loading makes its step wait for the rest of the copy
  (``Load(..., wait=process)``), and counts as a late hit. When the copy ends (an engine
  event at the exact end time, so decode runs stop there), the adapter becomes an ordinary
  idle resident adapter (``policy.on_load`` then ``policy.on_idle``).
* **synchronous**: the copy is added to the loads of the step that decided it, i.e. on the
  critical path (the adaptive-caching study's "sync prefetch", which raises the P99 TTFT).

Disk reads (adapter not in the CPU tier) happen first and do not hold the link; they queue on
the disk, one read at a time (:class:`twin.adapters.AdapterDisk`: many prefetches started at once
share its bandwidth), so a read's end is known when it is asked for; the link
is reserved when the read ends, so the completion time is known from then on (until then
a lower bound splits decode runs, which is always exact, see ``Scheduler.next_change_time``).
When the read ends is known from the start, so the link expects the copy
(:meth:`twin.adapters.HostLink.announce`) and a step that waits for it, or queues a copy of its
own behind it, knows when its loads end (:meth:`twin.adapters.HostLink.loads_end`: the horizon's
check; each copy's place on the link is ``AdapterMemory.loading_copy``).

Decisions come from ``scheduler.prefetch(now)`` and ``cache.prefetch(now)`` (adapter ids in
priority order), asked after each step's admissions
(:meth:`twin.extensions.Extensions.after_schedule`); to keep decode-run skipping exact, a
decode run ends at the next arrival, so the question is asked again after it. A policy with
``prefetch_at_tick`` (FastLibra's swapper, a monitor independent of the batch, ``fastlibra.md`` §5) is asked
right after each of its ``on_tick`` instead (:meth:`AsyncLoader.decide_at_tick`): its copies start
at the tick, also when nothing runs; a policy's ``max_inflight = None`` sets no bound on the
copies in flight.

A synchronous prefetch delays the step that decided it: its load time counts as load wait
(``load_wait_s``) of the requests whose first token that step is computing (the step's prefill
chunks of requests without a first token yet), as it counts for a request's own synchronous load --
the adaptive-caching study's triggering request "waits for every load" (``adaptive-caching.md`` §2). Requests that only
decode in that step see it in their inter-token time, not as load wait.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

from twin.adapter_placement import UnifiedPool
from twin.adapters import LinkCopy, Load
from twin.interfaces import checked_prefetch

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import EngineCore, StepContextView

INF = math.inf


class AsyncLoader:
    """Starts and completes prefetches (see the module docstring).

    ``sources`` are the policies (scheduler and/or cache) whose ``prefetch`` is asked."""

    def __init__(self, engine: "EngineCore", sources: Sequence[Any], sync: bool = False,
                 max_inflight: int | None = 4) -> None:
        self.e = engine
        self.sources = list(sources)
        #: each source's prefetch as the engine calls it (a plug-in's answer checked) and whether it may evict
        self._asks = [(checked_prefetch(src, engine.n_adapters), src.prefetch_evicts) for src in self.sources]
        #: the sources asked after each step's admissions, and those asked at their own tick (``prefetch_at_tick``)
        at_tick = [bool(getattr(src, "prefetch_at_tick", False)) for src in self.sources]
        self._step_asks = [x for t, x in zip(at_tick, self._asks) if not t]
        self._tick_asks = {id(src): x for src, t, x in zip(self.sources, at_tick, self._asks) if t}
        #: whether any source is asked after each step's admissions (the engine's per-step prefetch path)
        self.asks_per_step = bool(self._step_asks)
        self.mem = engine.adapters
        self.sync = sync
        self.max_inflight = INF if max_inflight is None else max_inflight
        self.started = 0

    def _room(self, a: int, now: float, evict: bool, demand: bool = False) -> bool:
        mem = self.mem
        if mem.placement is not None:
            if not demand and isinstance(mem.placement, UnifiedPool):  # (a prefetch leaves the prefills' blocks)
                return mem.placement.allocate(a, now, evict, reserve=self.e.background_reserve())
            return mem.placement.allocate(a, now, evict)
        if mem.n_resident < mem.gpu_slots:
            return True
        if not evict or not mem.any_evictable():
            return False
        mem.evict_victim(now)
        return True

    def start(self, a: int, now: float, ctx: "StepContextView | None" = None, evict: bool = True,
              demand: bool = False) -> bool:
        """Prefetch adapter ``a`` (False when resident, loading, or there is no room).

        ``demand``: an asynchronous swap-in for a waiting request
        (:meth:`twin.extensions.Extensions.admit` with ``async_swap_in``): not limited by
        ``max_inflight`` and not counted as a prefetch."""
        mem = self.mem
        if a < 0 or mem.resident[a]:
            return False
        if not demand and not self.sync and len(mem.loading) >= self.max_inflight:
            return False
        if self.e.memory_stall:  # the running batch waits for the copies in flight to land (Engine._wait_for_landing)
            return False
        if not self._room(a, now, evict, demand):
            return False
        source, disk_s = mem.fetch(a, now)
        mem.mark_resident(a)
        link_s = mem.cpu_load_s[mem.ranks_l[a]]
        if mem.placement is not None:
            link_s += mem.placement.load_extra_s(a)
        if demand:
            return self._background(a, now, disk_s, link_s)
        self.started += 1
        pol = mem.policy
        if self.sync:
            ctx.loads.append(Load(a, source, disk_s, link_s, mem.bytes[a]))
            self._charge_prefills(ctx)
            pol.on_load(a, now)
            if not mem.active[a]:
                pol.on_idle(a, now)
            return True
        return self._background(a, now, disk_s, link_s)

    def _background(self, a: int, now: float, disk_s: float, link_s: float, nbytes: int | None = None) -> bool:
        """The copy of adapter ``a`` (memory already held) in the background; ``loading`` until it ends.
        ``nbytes``: the bytes the copy moves (default the adapter's; S-LoRA's loader moves twice them)."""
        mem = self.mem
        env = self.e.env
        link = self.e.link
        nbytes = mem.bytes[a] if nbytes is None else nbytes
        if disk_s:  # the link is requested when the disk read ends (behind the reads queued before it), known from now
            read_s = mem.disk.read_delay(now, disk_s)
            copy = link.announce(now + read_s, link_s)  # (now + read_s: SimPy's timeout)
            proc = env.process(self._after_disk(a, read_s, link_s, nbytes, copy))
            self.e.push_event(now + read_s + link_s, None)  # lower bound of the end
        else:
            copy = LinkCopy(now, link_s)
            gen = link.transfer(nbytes, link_s, copy)
            self.e.push_event(link.free_at, lambda t, a=a: self._done(a, t))
            proc = env.process(gen)
        mem.loading[a] = proc
        mem.loading_copy[a] = copy
        return True

    def _after_disk(self, a: int, read_s: float, link_s: float, nbytes: int, copy: LinkCopy):
        """The copy of a background load after its disk read, which ends ``read_s`` from now (its wait for the
        disk included: :meth:`twin.adapters.AdapterDisk.read_delay`)."""
        env = self.e.env
        timeout = env.timeout(read_s)
        copy.armed = True  # (its read's end is scheduled: HostLink.loads_end orders same-instant requests by it)
        yield timeout
        gen = self.e.link.transfer(nbytes, link_s, copy)
        self.e.push_event(self.e.link.free_at, lambda t, a=a: self._done(a, t))
        yield env.process(gen)

    def _done(self, a: int, now: float) -> None:
        mem = self.mem
        mem.loading_copy.pop(a, None)
        if mem.loading.pop(a, None) is None or not mem.resident[a]:
            return
        mem.policy.on_load(a, now)
        if not mem.active[a]:
            mem.policy.on_idle(a, now)

    def _charge_prefills(self, ctx: "StepContextView") -> None:
        """A synchronous prefetch on ``ctx``'s step: the requests whose first token the step computes wait for it
        (``load_rids``: the engine adds the step's load time to their load wait, once per request)."""
        fta = self.e.first_token
        rids = ctx.load_rids
        for rid, _ in ctx.chunks:
            if fta[rid] != fta[rid] and rid not in rids:  # (no first token yet: NaN)
                rids.append(rid)

    def decide(self, now: float, ctx: "StepContextView | None") -> None:
        """The per-step sources' decisions, after a step's admissions."""
        for ask, evicts in self._step_asks:
            for a in ask(now):
                if not self.sync and len(self.mem.loading) >= self.max_inflight:
                    return
                self.start(a, now, ctx, evict=evicts)

    def decide_at_tick(self, src: Any, now: float) -> None:
        """``src``'s decisions right after its ``on_tick`` when it prefetches at its tick (``prefetch_at_tick``;
        asynchronous only, whether or not a batch runs)."""
        x = self._tick_asks.get(id(src))
        if x is None:
            return
        ask, evicts = x
        for a in ask(now):
            if len(self.mem.loading) >= self.max_inflight:
                return
            self.start(a, now, None, evict=evicts)

    def stats(self) -> dict[str, Any]:
        return {"prefetch_mode": "sync" if self.sync else "async", "prefetches": self.started,
                "prefetch_late_hits": self.mem.late_hits}
