"""Adapter memory: GPU slots, the CPU tier with disk behind it, and the host-to-GPU link.

vLLM 0.8.5 (``LRUCacheWorkerLoRAManager``): when a step's batch names an adapter that is
not in a GPU slot, the worker loads it *synchronously inside that step*: from disk into
the CPU cache (``max_cpu_loras`` entries, LRU) if it is not there, then a copy into a GPU
slot (``max_loras`` slots, LRU over adapters not in the batch). Both transfers happen
before the step's forward pass, so they lengthen that step.

The link is a SimPy resource of capacity 1: every host-to-GPU transfer (a synchronous
activation or an asynchronous prefetch started by a cache policy) holds it for its
duration, so concurrent loads queue behind each other -- the PCIe contention that
Chameleon §3.2 documents.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generator

import numpy as np
import simpy

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import AdapterCachePolicy
    from twin.profile import Profile


class HostLink:
    """The host-to-GPU link: a FIFO SimPy resource plus byte and busy-time counters."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.resource = simpy.Resource(env, capacity=1)
        self.bytes_moved = 0
        self.busy_s = 0.0
        self.transfers = 0

    @property
    def busy(self) -> bool:
        return self.resource.count > 0

    @property
    def queued(self) -> int:
        return len(self.resource.queue)

    def transfer(self, nbytes: int, duration_s: float) -> Generator:
        """SimPy process body: hold the link for ``duration_s`` (waiting for it if busy)."""
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


class AdapterMemory:
    """Which adapters are on the GPU, in the CPU tier, or only on disk.

    ``active[a]`` counts the running requests of adapter ``a``; ``resident[a]`` says it
    holds a GPU slot. Invariants (checked by tests): ``resident.sum() <= gpu_slots`` and
    an adapter with ``active[a] > 0`` is resident.
    """

    def __init__(self, ranks: np.ndarray, profile: "Profile", gpu_slots: int, cpu_slots: int,
                 policy: "AdapterCachePolicy", link: HostLink, tp: int = 1) -> None:
        n = len(ranks)
        self.ranks = ranks
        self.gpu_slots = gpu_slots
        self.cpu_slots = cpu_slots
        self.policy = policy
        self.link = link
        self.active: list[int] = [0] * n       # running requests per adapter
        self.resident: list[bool] = [False] * n
        self.n_resident = 0
        self.n_active = 0
        self.cpu: OrderedDict[int, None] = OrderedDict()  # LRU order, most recent last
        self.ranks_l: list[int] = [int(r) for r in ranks]
        self.bytes: list[int] = [profile.adapter_bytes(r) for r in self.ranks_l]
        self._rank_counts: dict[int, int] = {}
        self.resident_bytes = 0
        # per-rank load times, looked up once
        self._disk_s = {int(r): profile.load_s(int(r), "disk", tp) for r in set(ranks.tolist())}
        self._cpu_s = {int(r): profile.load_s(int(r), "cpu", tp) for r in set(ranks.tolist())}
        # counters
        self.activations = 0
        self.hits = 0
        self.loads_cpu = 0
        self.loads_disk = 0
        self.evictions = 0

    @property
    def max_active_rank(self) -> int:
        return max(self._rank_counts) if self._rank_counts else 0

    def acquire(self, a: int, now: float) -> Load | None:
        """A request of adapter ``a`` joins the batch; returns the load it needs, if any."""
        if self.active[a] == 0:
            self.n_active += 1
            r = self.ranks_l[a]
            self._rank_counts[r] = self._rank_counts.get(r, 0) + 1
            self.active[a] = 1
            self.activations += 1
            self.policy.on_active(a, now)
            if self.resident[a]:
                self.hits += 1
                if a in self.cpu:
                    self.cpu.move_to_end(a)
                return None
            return self._load(a, now)
        self.active[a] += 1
        return None

    def release(self, a: int, now: float) -> None:
        """A request of adapter ``a`` left the batch (finished or preempted)."""
        self.active[a] -= 1
        if self.active[a] == 0:
            self.n_active -= 1
            r = self.ranks_l[a]
            c = self._rank_counts[r] - 1
            if c:
                self._rank_counts[r] = c
            else:
                del self._rank_counts[r]
            if a in self.cpu:
                self.cpu.move_to_end(a)
            self.policy.on_idle(a, now)
            if self.policy.evict_when_idle(a):
                self._evict(a, now)

    def _evict(self, a: int, now: float) -> None:
        self.resident[a] = False
        self.n_resident -= 1
        self.resident_bytes -= self.bytes[a]
        self.evictions += 1
        self.policy.on_evict(a, now)

    def _load(self, a: int, now: float) -> Load:
        if self.n_resident >= self.gpu_slots:
            v = self.policy.victim(now)
            if self.active[v] > 0 or not self.resident[v]:
                raise RuntimeError(f"cache policy {self.policy.name!r} chose adapter {v} as victim, "
                                   f"but it is {'in use' if self.active[v] else 'not resident'}")
            self._evict(v, now)
        r = self.ranks_l[a]
        if a in self.cpu:
            self.cpu.move_to_end(a)
            source, disk_s = "cpu", 0.0
            self.loads_cpu += 1
        else:
            if len(self.cpu) >= self.cpu_slots:
                self.cpu.popitem(last=False)
            self.cpu[a] = None
            source, disk_s = "disk", self._disk_s[r]
            self.loads_disk += 1
        self.resident[a] = True
        self.n_resident += 1
        self.resident_bytes += self.bytes[a]
        self.policy.on_load(a, now)
        return Load(a, source, disk_s, self._cpu_s[r], self.bytes[a])
