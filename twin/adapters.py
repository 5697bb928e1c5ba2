"""Adapter memory: GPU slots, the CPU tier with disk behind it, and the host-to-GPU link.

vLLM 0.8.5 (``LRUCacheWorkerLoRAManager``): when a step's batch names an adapter that is
not in a GPU slot, the worker loads it *synchronously inside that step*: from disk into
the CPU cache (``max_cpu_loras`` entries, LRU) if it is not there, then a copy into a GPU
slot (``max_loras`` slots, LRU over adapters not in the batch). Both transfers happen
before the step's forward pass, so they lengthen that step.

The link is a SimPy resource of capacity 1: every host-to-GPU transfer (a synchronous
activation or an asynchronous prefetch started by a cache policy) holds it for its
duration, so concurrent loads queue behind each other -- the PCIe contention that
Chameleon §3.2 documents. The disk behind the CPU tier reads one adapter at a time as well
(:class:`AdapterDisk`): background reads of prefetches queue behind each other and a step's
own reads queue behind them, at the fitted per-read bandwidth.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generator

import numpy as np
import simpy

from twin.interfaces import AdapterCachePolicy, PolicyError, checked_evict_when_idle, policy_label

if TYPE_CHECKING:  # pragma: no cover
    from twin.perf.profile import Profile


#: ``(i + 1).bit_length()`` for every index ``i`` of a shuffle (grown on demand)
_SHUFFLE_BITS: list[int] = [(i + 1).bit_length() for i in range(1024)]


def shuffle(rng: random.Random, x: list) -> None:
    """``rng.shuffle(x)``, with the same draws and the same result (CPython's algorithm with its
    ``_randbelow`` written inline: a Python call less per element, the bit counts from a table;
    a test compares them)."""
    getrandbits = rng.getrandbits
    n = len(x)
    if n < 2:
        return
    bits = _SHUFFLE_BITS
    if n > len(bits):
        bits.extend((i + 1).bit_length() for i in range(len(bits), n))
    for i, k in zip(range(n - 1, 0, -1), bits[n - 1:0:-1]):
        j = getrandbits(k)
        while j > i:  # (j >= i + 1: out of range, draw again)
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]


class LinkCopy:
    """A background copy over the host link (an asynchronous prefetch or swap-in): when it requests the
    link (``request_t``) and for how long it holds it (``duration_s``); ``end``, when it leaves the link,
    is known from its request on (the link is FIFO with known durations: :meth:`HostLink.transfer`
    sets it), None while the copy is still in its disk read (:meth:`HostLink.announce`; ``armed``: the
    read's timeout is scheduled, :meth:`twin.prefetch.AsyncLoader._after_disk`). A step that waits for the
    copy (``Load.wait``) carries it (``Load.copy``), so :meth:`HostLink.loads_end` knows when the wait ends."""

    __slots__ = ("request_t", "duration_s", "end", "armed")

    def __init__(self, request_t: float, duration_s: float) -> None:
        self.request_t = request_t
        self.duration_s = duration_s
        self.end: float | None = None
        self.armed = False


class AdapterDisk:
    """The disk the CPU tier reads adapters from: one read at a time, in the order they are asked for.

    The profile's disk load time (``Profile.load_s(rank, "disk")``) is fitted on loads made one at a time
    (vLLM's worker reads an adapter's safetensors inside the step that needs it,
    ``WorkerLoRAManager._load_adapter``), so it is the time of one read with the disk to itself. A policy
    that prefetches (:mod:`twin.prefetch`) may start many reads at once -- FastLibra's swapper at each tick,
    with no bound on the copies in flight (``fastlibra.md`` §5) -- and they share that bandwidth: here they
    queue (FIFO with known durations, like :class:`HostLink`), so each read's end is known when it is asked
    for. Reads are asked for only by the engine's process (a step's synchronous loads, run one after the
    other, and the prefetches it starts at step boundaries), so a step's loads find every background read
    already queued (:meth:`HostLink.loads_end`)."""

    __slots__ = ("free_at", "reads", "queued_s", "busy_s")

    def __init__(self) -> None:
        self.free_at = 0.0  # when every read asked for so far will have ended
        self.reads = 0
        self.queued_s = 0.0  # seconds reads waited for the disk behind earlier reads
        self.busy_s = 0.0  # seconds of reading asked for so far (some may end after the horizon: busy_by)

    def read_delay(self, now: float, disk_s: float) -> float:
        """Seconds from ``now`` until a read of ``disk_s`` seconds asked for at ``now`` ends (behind the reads
        asked for before it); the disk is busy until then. The delay is what SimPy's timeout adds to ``now``,
        so ``now + read_delay(...)`` is the exact end (:meth:`HostLink.loads_end` makes the same operations)."""
        free = self.free_at
        wait = free - now if free > now else 0.0
        d = wait + disk_s
        self.free_at = now + d
        self.reads += 1
        self.queued_s += wait
        self.busy_s += disk_s
        return d

    def busy_by(self, t: float) -> float:
        """Seconds the disk read by time ``t``, when every read was asked for by ``t`` (the runs' horizon: nothing
        is asked for after it). A read that started after ``t`` started when the one before it ended (it was asked
        for earlier), so what lies after ``t`` is one busy stretch, ``free_at - t``."""
        return self.busy_s - max(0.0, self.free_at - t)


class HostLink:
    """The host-to-GPU link: a FIFO SimPy resource plus byte and busy-time counters."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.resource = simpy.Resource(env, capacity=1)
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.transfers = 0
        self.free_at = 0.0  # when every transfer requested so far will have ended (FIFO)
        #: background copies still in their disk read: each requests the link at its ``request_t``
        #: (:meth:`announce`; it leaves this list when it does, :meth:`transfer`)
        self.later: list[LinkCopy] = []

    def transfer(self, nbytes: int, duration_s: float, copy: LinkCopy | None = None) -> Generator:
        """SimPy process body: hold the link for ``duration_s`` (waiting for it if busy).

        The end time is fixed when the transfer is requested (the link is FIFO with known
        durations): ``free_at`` then holds it, so an asynchronous load knows when it ends
        (``copy``: the background copy this transfer is, whose ``end`` it sets)."""
        self.free_at = max(self.env.now, self.free_at) + duration_s
        if copy is not None:
            copy.end = self.free_at
            if copy.armed:  # (an announced copy, armed in its disk read: the only kind ``later`` holds)
                self.later.remove(copy)
        return self._hold(nbytes, duration_s)

    def announce(self, request_t: float, duration_s: float) -> LinkCopy:
        """A background copy that will request the link at ``request_t`` for ``duration_s`` (after its disk
        read: :meth:`twin.prefetch.AsyncLoader._after_disk`), so that :meth:`loads_end` queues it where the link
        will; it passes the record to :meth:`transfer` when it requests the link."""
        copy = LinkCopy(request_t, duration_s)
        self.later.append(copy)
        return copy

    def loads_end(self, now: float, loads: "list[Load] | tuple", disk: AdapterDisk | None = None) -> float:
        """When a step's ``loads``, started at ``now``, end -- as the engines run them (``Engine._run``,
        ``SLoRAEngine._prefill``): one after the other, a wait for a background copy (``Load.wait``) until
        that copy's end, a synchronous load's disk read and then its copy, which the FIFO link starts once
        every copy requested before it has ended. Computed from the link's state now, with the float
        operations SimPy then makes (``max(request, link free) + duration``, in the link's order), so the end
        is exact: the horizon's check of a step with loads (nothing ends after the horizon: a step whose
        loads and compute would end after it does not start them, ``tests/twin/test_run_skipping.py``).

        The copies already requested end by ``free_at`` (each in flight knows its end, ``LinkCopy.end``); a
        background copy still in its disk read (:meth:`announce`) requests the link at its known ``request_t``:
        before a synchronous copy requested later, after one requested earlier, and a wait for it ends where
        the link then puts it. At the same instant SimPy's event order decides, which follows from when each
        side's triggering event was scheduled: a synchronous copy the engine requests in the activation that
        starts the loads (nothing yielded yet) goes first (its start event is urgent); one after its own disk
        read goes first only when that read was the first event the loads yielded and the announced copy's
        read was not scheduled yet (``LinkCopy.armed``: the copy was started in this same activation); any
        other synchronous copy goes after it (the event that resumes the engine is scheduled at that instant,
        after the copy's read ended). A synchronous load's disk read queues behind the background reads on
        ``disk`` (:class:`AdapterDisk`: every one was asked for before the step's loads start), so it ends
        after them all."""
        free = self.free_at
        dfree = disk.free_at if disk is not None else 0.0
        later = sorted(self.later, key=lambda c: (c.request_t, not c.armed)) if self.later else ()
        placed: dict[int, float] = {}
        i = 0
        t = now
        first = True  # still in the engine's activation that starts the loads (no event yielded yet)
        for ld in loads:
            if ld.wait is not None:
                c = ld.copy
                if c is None:
                    raise RuntimeError(f"a step waits for a background copy (adapter {ld.adapter}) with no record of "
                                       f"it on the link (Load.copy): its end is unknown")
                e = c.end
                if e is None:
                    e = placed.get(id(c))
                    while e is None and i < len(later):  # the announced copies up to it take the link in turn
                        x = later[i]
                        i += 1
                        free = (x.request_t if x.request_t > free else free) + x.duration_s
                        placed[id(x)] = free
                        if x is c:
                            e = free
                    if e is None:
                        raise RuntimeError(f"a step waits for a background copy (adapter {ld.adapter}) that the link "
                                           f"neither carries nor expects")
                if first and ld.wait.processed:  # (a copy that has ended: the engine goes on without yielding)
                    continue
                first = False
                if e > t:
                    t = e
                continue
            if ld.disk_s:
                t = t + ((dfree - t if dfree > t else 0.0) + ld.disk_s)  # (AdapterDisk.read_delay's operations)
                dfree = t
                ahead_unarmed = first  # its read's timeout precedes the reads not scheduled yet
                ahead = False
            else:
                ahead_unarmed = ahead = first
            first = False
            while i < len(later):  # announced copies that request the link before this one
                x = later[i]
                r = x.request_t
                if r > t or (r == t and (ahead or (ahead_unarmed and not x.armed))):
                    break
                i += 1
                free = (r if r > free else free) + x.duration_s
                placed[id(x)] = free
            t = (free if free > t else t) + ld.link_s
            free = t
        return t

    def _hold(self, nbytes: int, duration_s: float) -> Generator:
        with self.resource.request() as req:
            yield req
            yield self.env.timeout(duration_s)
        self.bytes_moved += nbytes
        self.busy_s += duration_s
        self.transfers += 1


@dataclass
class Load:
    """One adapter load on a step's critical path."""

    adapter: int
    source: str  # 'disk' (disk -> CPU -> GPU) or 'cpu' (CPU -> GPU)
    disk_s: float
    link_s: float
    nbytes: int
    wait: Any = None  # an asynchronous load still in flight (SimPy process): the step waits for it
    #: copies over the host link this load starts (the steps' ``loads_started``): 1, plus the adapters of the
    #: batch vLLM's activation order evicts and copies back with it; 0 for a wait on a copy already started
    copies: int = 1
    #: the background copy a wait is for (its place on the link: :meth:`HostLink.loads_end`)
    copy: LinkCopy | None = None


class AdapterMemory:
    """Which adapters are on the GPU, in the CPU tier, or only on disk.

    ``active[a]`` counts the running requests of adapter ``a``; ``resident[a]`` says it
    holds a GPU slot. ``policy`` is the :class:`twin.interfaces.AdapterCachePolicy` whose
    callbacks (``on_active``, ``on_idle``, ``on_load``, ``on_evict``, ``victim``) this calls. Invariants (checked by tests): ``resident.sum() <= gpu_slots`` and
    an adapter with ``active[a] > 0`` is resident.
    """

    def __init__(self, ranks: np.ndarray, profile: "Profile", gpu_slots: int, cpu_slots: int,
                 policy: Any, link: HostLink, tp: int = 1, max_rank: int | None = None) -> None:
        n = len(ranks)
        self.ranks = ranks
        self.gpu_slots = gpu_slots
        self.cpu_slots = cpu_slots
        self.policy = policy
        #: the policy's ``evict_when_idle`` (a plug-in's answer checked, :func:`twin.interfaces.checked_evict_when_idle`)
        self.evict_when_idle = checked_evict_when_idle(policy)
        #: the policy keeps every idle adapter (its ``evict_when_idle`` is the base's, always False): an
        #: offload of idle adapters has nothing to evict and need not ask it about each one
        self.keeps_idle = getattr(policy.evict_when_idle, "__func__", None) is AdapterCachePolicy.evict_when_idle
        self.link = link
        #: the disk behind the CPU tier (one read at a time): a step's reads and the prefetches' queue on it
        self.disk = AdapterDisk()
        self.active: list[int] = [0] * n       # running requests per adapter
        self.resident: list[bool] = [False] * n
        self.n_resident = 0
        self._resident_ids: set[int] = set()  # the adapters with resident[a] (evictable() reads them, not all n)
        self.n_active = 0
        self.cpu: OrderedDict[int, None] = OrderedDict()  # LRU order, most recent last
        #: served adapters registered at start-up that no request names (:meth:`preload_cpu`): never touched,
        #: so a server's CPU cache that holds them all keeps them; the twin's tier leaves them out
        self.registered_unused = 0
        #: the adapters whose GPU residency or CPU-tier membership changed, appended while not None (a
        #: scheduler that keeps its own per-tier order sets a list and empties it: policies/adapter_aware.py).
        #: One owner: the run's scheduler; a second reader would take the first's changes when it empties it
        self.tier_changes: list[int] | None = None
        self.ranks_l: list[int] = [int(r) for r in ranks]
        self.bytes: list[int] = [profile.adapter_bytes(r) for r in self.ranks_l]
        self.resident_bytes = 0
        # per-rank load times (disk -> GPU, CPU -> GPU), looked up once
        self.disk_load_s = {int(r): profile.load_s(int(r), "disk", tp, max_rank) for r in set(ranks.tolist())}
        self.cpu_load_s = {int(r): profile.load_s(int(r), "cpu", tp, max_rank) for r in set(ranks.tolist())}
        # extensions (twin/extensions.py): asynchronous loads in flight and a byte/page placement
        self.loading: dict[int, Any] = {}  # adapter -> its SimPy load process (state "loading")
        self.loading_copy: dict[int, LinkCopy] = {}  # adapter -> that copy's place on the link (HostLink.loads_end)
        self.placement: Any = None          # None: vLLM's fixed slots (gpu_slots)
        # counters
        self.activations = 0
        self.hits = 0
        self.late_hits = 0  # the first request found its adapter still loading (prefetch too late)
        self.loads_cpu = 0
        self.loads_disk = 0
        self.evictions = 0
        self.reloads = 0  # adapters of the batch evicted and reloaded within a step (vLLM activation order)
        # vLLM activation order (activation_reloads): the worker walks the batch's adapters in
        # Python-set order, drawn as a random order per walk from a seeded generator
        self.order_reloads = bool(policy.activation_order_reloads)
        self.batch: set[int] = set()       # adapters with running requests
        self.idle_at: list[float] = [-1.0] * n
        self.loaded_at: list[float] = [-1.0] * n
        self._order_rng = random.Random(0x10AD)
        self._idle_now_t = -1.0
        self._idle_now: list[int] = []     # adapters that left the batch at that time

    def use_placement(self, placement: Any, gpu_slots: int) -> None:
        """Adapter memory of an extension (:mod:`twin.adapter_placement`) instead of vLLM's slots."""
        self.placement = placement
        self.gpu_slots = gpu_slots

    def preload_cpu(self, adapters, unused: int = 0) -> None:
        """Adapters already in the CPU tier when serving starts (at most ``cpu_slots``, LRU order
        as given). The real runs' server (the peer fork of vLLM 0.8.5, ``--dummy-lora-modules``)
        creates and loads its ``--max-cpu-loras`` adapters from disk during start-up
        (``adapter_load.csv``: every disk->CPU load is a ``startup`` load), so no request of
        those runs waits for a disk load. Stock vLLM 0.8.5's OpenAI server likewise loads the adapters its
        ``--lora-modules`` names at start-up (``OpenAIServingModels.init_static_loras`` -> ``add_lora``), while
        offline ``LLM.generate`` loads an adapter from disk at its first request
        (``LRUCacheWorkerLoRAManager.add_adapter``), which is the default here. ``unused``: the served
        adapters the server also registers at start-up that no request of the workload names (the tier holds
        only the workload's adapters; these count in :attr:`registered_unused`, the registry's size beside it)."""
        self.registered_unused = max(int(unused), 0)
        for a in adapters:
            if len(self.cpu) >= self.cpu_slots:
                break
            self.cpu[int(a)] = None
            if self.tier_changes is not None:
                self.tier_changes.append(int(a))

    def preload_gpu(self, adapters, now: float = 0.0) -> None:
        """Adapters already in GPU slots (and the CPU tier) when serving starts, at most
        ``gpu_slots``, idle in the order given (the least recently used first). The calibration's
        offline LoRA servers pre-load the adapters they use during start-up (``lora_pre_loading``
        in ``adapter_overhead.csv``), so their requests find them resident; start-up loads are
        not part of the run's time. The cache policy sees each as loaded, then idle; for vLLM's
        activation order they left the batch before any step (no reload cascade from them)."""
        if self.placement is not None:
            raise ValueError("preload_gpu fills vLLM's fixed adapter slots; this engine places adapters in a "
                             "shared memory pool (an adapter-placement extension): leave preload_gpu off")
        for a in adapters:
            a = int(a)
            if self.n_resident >= self.gpu_slots:
                break
            if self.resident[a]:
                continue
            if a not in self.cpu and len(self.cpu) < self.cpu_slots:
                self.cpu[a] = None  # (mark_resident notes a's change of tier)
            self.mark_resident(a)
            self.policy.on_load(a, now)
            self.policy.on_idle(a, now)

    def acquire(self, a: int, now: float) -> Load | None:
        """A request of adapter ``a`` joins the batch; returns the load it needs, if any."""
        if self.active[a] == 0:
            self.n_active += 1
            self.batch.add(a)
            self.active[a] = 1
            self.activations += 1
            self.policy.on_active(a, now)
            if self.resident[a]:
                if self.loading and a in self.loading:  # prefetch in flight: the step waits for it
                    self.late_hits += 1
                    return Load(a, "wait", 0.0, 0.0, 0, wait=self.loading[a], copies=0, copy=self.loading_copy.get(a))
                self.hits += 1
                if a in self.cpu:
                    self.cpu.move_to_end(a)
                return None
            return self._load(a, now)
        self.active[a] += 1
        return None

    def release(self, a: int, now: float, evict_idle: bool = True) -> None:
        """A request of adapter ``a`` left the batch (finished or preempted). ``evict_idle=False``
        defers the policy's ``evict_when_idle`` to the caller (S-LoRA offloads idle adapters only
        after a decode in which a request finished, ``twin/slora_engine.py``)."""
        self.active[a] -= 1
        if self.active[a] == 0:
            self.n_active -= 1
            self.batch.discard(a)
            self.idle_at[a] = now
            if now != self._idle_now_t:
                self._idle_now_t = now
                self._idle_now = []
            self._idle_now.append(a)
            if a in self.cpu:
                self.cpu.move_to_end(a)
            self.policy.on_idle(a, now)
            # (not while its prefetch copy is still listed as loading: a request that waited for the copy can leave
            # the batch before the copy's end event clears it; the adapter then stays, as a landed prefetch does)
            if evict_idle and self.evict_when_idle(a) and a not in self.loading:
                self.evict(a, now)

    def evict(self, a: int, now: float) -> None:
        """Adapter ``a`` leaves the GPU (the caller chose it; see :meth:`evict_victim`)."""
        self.resident[a] = False
        self._resident_ids.discard(a)
        self.n_resident -= 1
        self.resident_bytes -= self.bytes[a]
        self.evictions += 1
        if self.tier_changes is not None:
            self.tier_changes.append(a)
        if self.placement is not None:
            self.placement.free(a)
        self.policy.on_evict(a, now)

    def evict_victim(self, now: float) -> int:
        """Evict the cache policy's victim (an idle resident adapter must exist)."""
        v = self.policy.victim(now)
        try:
            bad = v < 0 or self.active[v] > 0 or not self.resident[v] or v in self.loading
        except (TypeError, IndexError):  # not an int, or past the adapters
            bad = True
        if bad:
            n = len(self.resident)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                state = f"a {type(v).__name__}, not an adapter index (an int)"
            elif not 0 <= v < n:
                state = f"not an adapter index (0 <= a < {n})"
            else:
                state = "in use" if self.active[v] else "not resident" if not self.resident[v] else "loading"
            raise PolicyError(f"{policy_label(self.policy)} chose adapter {v!r} as victim, but it is {state}; "
                              f"victim(now) must return an idle resident adapter (one of "
                              f"engine.adapters.evictable())")
        self.evict(v, now)
        return v

    def evictable(self) -> list[int]:
        """The adapters a load may evict: resident, idle and not loading, in ascending order (from the
        resident ones: a scan of every adapter cost O(adapters) per call)."""
        act, loading = self.active, self.loading
        return sorted(a for a in self._resident_ids if not act[a] and a not in loading)

    def any_evictable(self) -> bool:
        """``bool(evictable())``, stopping at the first evictable adapter."""
        act, loading = self.active, self.loading
        return any(not act[a] and a not in loading for a in self._resident_ids)

    def slot_blocked_by_loads(self, a: int) -> bool:
        """True when adapter ``a`` needs a fixed slot but every slot is held by an adapter in
        use or by an asynchronous load still in flight (nothing is evictable): ``a`` must wait
        for the load to finish (:mod:`twin.prefetch`). Only possible while loads are in flight."""
        return (self.placement is None and not self.resident[a] and self.n_resident >= self.gpu_slots
                and not self.any_evictable())

    def _load(self, a: int, now: float) -> Load:
        if self.placement is not None:  # evicts through the policy until the adapter fits
            if not self.placement.allocate(a, now):
                raise RuntimeError(f"adapter {a} admitted but its memory could not be freed")
        reloads: list[int] = []
        # the CPU tier first: vLLM registers a new adapter (making room in its CPU cache, which can free a slot,
        # fetch) before it activates it in a slot (LRUCacheWorkerLoRAManager.add_adapter: add, then activate)
        source, disk_s = self.fetch(a, now)
        if self.placement is None and self.n_resident >= self.gpu_slots:
            v = self.evict_victim(now)
            if self.order_reloads:
                reloads = self.activation_reloads(a, v, now)
        self.mark_resident(a)
        self.loaded_at[a] = now
        self.policy.on_load(a, now)
        link_s = self.cpu_load_s[self.ranks_l[a]]
        if self.placement is not None:
            link_s += self.placement.load_extra_s(a)
        nbytes = self.bytes[a]
        for b in reloads:  # copied again, one after the other, on the same critical path
            link_s += self.cpu_load_s[self.ranks_l[b]]
            nbytes += self.bytes[b]
        return Load(a, source, disk_s, link_s, nbytes, copies=1 + len(reloads))

    def mark_resident(self, a: int) -> None:
        """Adapter ``a`` holds GPU memory from now on (its copy may still be in flight)."""
        self.resident[a] = True
        self._resident_ids.add(a)
        self.n_resident += 1
        self.resident_bytes += self.bytes[a]
        if self.tier_changes is not None:
            self.tier_changes.append(a)

    @property
    def resident_ids(self) -> set[int]:
        """The adapters with ``resident[a]`` (the engine's own set: read it, never change it)."""
        return self._resident_ids

    def activation_reloads(self, a: int, victim: int, now: float) -> list[int]:
        """Adapters of the batch that vLLM evicts and reloads while it activates ``a`` (whose slot
        came from ``victim``, the least recently used idle adapter).

        ``LRUCacheWorkerLoRAManager._apply_adapters`` walks the batch's adapters in the iteration
        order of a Python set of ``LoRARequest`` (hashed by adapter name), touching each; a new
        adapter evicts the least recently used one *at that moment*. An adapter that left the
        batch before the previous step is older than every adapter touched since, so it goes and
        nothing else happens (``idle_at != now``). When the victim left after the previous step,
        the batch's adapters and the adapters that left then were all touched in the previous
        walk: the oldest of them not yet reached by this walk is evicted -- possibly an adapter
        of the batch, copied back when the walk reaches it, evicting the next oldest, until an
        idle adapter goes. The set's order follows the adapters' name hashes (``LoRARequest.__hash__``,
        fixed within a server process) in a table whose size, and whose collisions (resolved in
        insertion order), change as adapters come and go; two consecutive walks over a similar batch
        mostly agree. The twin draws both walks as independent random orders (seeded, so runs are
        reproducible): a modelling choice, not a property of the set, kept because it reproduces the
        real serving runs' load counts (median 0.97x; 0.98x on the calibrated profile) where one fixed order made 1.2x, up to 3x at 64-128
        slots (``results/calibration/serving_replay.md``). Adapters loaded in this step are not candidates
        (the walk loads them at their own position). Each reload is a CPU->GPU copy of that adapter."""
        if self.idle_at[victim] != now:
            return []
        la, res, act = self.loaded_at, self.resident, self.active
        batch = [b for b in self.batch if b != a and la[b] != now and res[b]]
        if not batch:
            return []
        n_idle = 1
        if self._idle_now_t == now:
            n_idle += sum(1 for d in self._idle_now if d != victim and res[d] and not act[d])
        rng = self._order_rng
        # this walk: a's position among the batch is uniform; the adapters after it are untouched
        shuffle(rng, batch)
        untouched = batch[rng.randrange(len(batch) + 1):]
        if not untouched:
            return []
        # ages from the previous walk: a random order of the untouched and the idle adapters
        ages = list(range(len(untouched) + n_idle))
        shuffle(rng, ages)
        idle_oldest = min(ages[len(untouched):])
        out: list[int] = []
        i = 0
        while i < len(untouched):
            j = min(range(i, len(untouched)), key=ages.__getitem__)
            if ages[j] > idle_oldest:
                break
            out.append(untouched[j])  # evicted now, copied back when the walk reaches it
            i = j + 1                 # everything up to it is touched by then
        if out:
            self.reloads += len(out)
            self.evictions += len(out)  # (each is evicted, then copied back)
            self.loads_cpu += len(out)
            for b in out:
                if b in self.cpu:
                    self.cpu.move_to_end(b)
        return out

    def fetch(self, a: int, now: float) -> tuple[str, float]:
        """Where the copy to the GPU starts: the CPU tier, or disk (it then enters the CPU tier).

        A full CPU tier drops its least recently used adapter *not in the batch*: vLLM 0.8.5 touches every
        adapter of the batch in its CPU cache each step (``LRUCacheWorkerLoRAManager.add_adapter``:
        ``get_adapter``), so they are always newer than any idle one, while this tier is touched when an
        adapter joins or leaves the batch (the touch times of idle adapters agree). On vLLM's fixed slots the
        dropped adapter also leaves its GPU slot when the slots are vLLM's own LRU manager (``lru``: the
        policy's ``activation_order_reloads``): the CPU cache's removal callback is ``deactivate_adapter``
        (``LRUCacheLoRAModelManager.__init__``, ``vllm/lora/models.py``), so its next request loads it from
        disk, and every adapter in a slot is in the CPU tier. Another cache policy decides its slots itself.
        Only with fewer CPU slots than adapters (``--cpu-slots``; vLLM's own default is ``max_loras``)."""
        r = self.ranks_l[a]
        cpu = self.cpu
        if a in cpu:
            cpu.move_to_end(a)
            source, disk_s = "cpu", 0.0
            self.loads_cpu += 1
        else:
            if len(cpu) >= self.cpu_slots:
                act, loading = self.active, self.loading
                # (nor one a prefetch is copying to its slot (twin/prefetch.py): dropped, it would land in a slot
                # outside the CPU tier, which vLLM's removal callback never leaves -- stop 67's fuzz)
                dropped = next((b for b in cpu if not act[b] and b not in loading), None)
                if dropped is None:
                    dropped = next((b for b in cpu if not act[b]), None)
                if dropped is None:  # (every CPU adapter in the batch: more active adapters than CPU slots)
                    dropped = next(iter(cpu))
                del cpu[dropped]
                if self.tier_changes is not None:
                    self.tier_changes.append(dropped)
                if (self.order_reloads and self.placement is None and self.resident[dropped] and not act[dropped]
                        and dropped not in self.loading):
                    self.evict(dropped, now)  # (deactivate_adapter: its slot is free)
            cpu[a] = None  # (a becomes resident: mark_resident notes it)
            source, disk_s = "disk", self.disk_load_s[r]
            self.loads_disk += 1
        return source, disk_s
