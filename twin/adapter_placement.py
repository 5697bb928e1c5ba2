"""Where adapter weights live in GPU memory: fixed slots, a byte region, or a pool shared with KV.

vLLM 0.8.5 gives every adapter a *slot* padded to ``max_lora_rank`` (``max_loras`` slots):
no fragmentation, but a rank-8 adapter costs as much memory as a rank-128 one. That is the
engine's default and needs nothing from this module. Two other layouts:

* **Region** (:class:`RegionPlacement`): a fixed adapter region of ``capacity`` bytes in which
  each adapter takes its *actual* size. Two allocators:

  - :class:`ContiguousAllocator` -- one contiguous range per adapter, first fit. After many
    load/evict cycles of adapters of different ranks the free space is split into holes, and
    an adapter can fail to allocate although the free bytes would hold it (external
    fragmentation). The seed write-up's observation: failures appear after many cycles.
  - :class:`PagedAllocator` -- S-LoRA's paging (Sheng et al., MLSys'24, §4.1 "Unified
    Paging"), here with 2 MB pages: an adapter takes ``ceil(bytes/page)`` pages anywhere, so
    there is no external fragmentation and no allocation failure while free pages suffice;
    the cost is internal fragmentation (the unused tail of the last page) and a slightly
    slower load (one gather/copy descriptor per page, ``page_overhead_s`` each).

* **Unified** (:class:`UnifiedPool`): S-LoRA's unified memory pool, which Chameleon
  (Iliakopoulou et al., MICRO'25, §4.2) and FastLibra (§4) build on: adapter weights and KV
  caches share one pool of KV blocks. An adapter takes ``ceil(bytes/block_bytes)`` blocks
  (``block_bytes = 16 tokens * KV bytes per token``); the KV capacity the engine sees
  (``engine.total_blocks``) is the pool minus the resident adapters (and minus history KV
  kept for prefix reuse, :mod:`twin.prefix_kv`). The adapter cache therefore lives in
  otherwise idle memory: when the batch needs blocks, idle adapters are evicted
  (:meth:`twin.extensions.Extensions.reclaim`) -- the cache is resized every step against the
  batch's needs.

A placement exposes ``allocate(a, now, evict=True) -> bool``, ``free(a)``,
``can_place(a, extra_blocks=0) -> bool`` (possible after evicting every evictable adapter),
``load_extra_s(a)``, ``check()`` and ``stats()``.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import EngineCore

PAGE_BYTES = 2 * 1024 * 1024


class ContiguousAllocator:
    """First-fit contiguous allocation in ``[0, capacity)`` (address-ordered free list)."""

    kind = "contiguous"

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.blocks: list[tuple[int, int, int]] = []  # (start, size, owner), sorted by start
        self.used = 0

    def _holes(self, skip: set[int] | None = None) -> list[tuple[int, int]]:
        holes, pos = [], 0
        for start, size, owner in self.blocks:
            if skip and owner in skip:
                continue
            if start > pos:
                holes.append((pos, start - pos))
            pos = start + size
        if pos < self.capacity:
            holes.append((pos, self.capacity - pos))
        return holes

    def try_alloc(self, owner: int, size: int) -> bool:
        for start, length in self._holes():
            if length >= size:
                bisect.insort(self.blocks, (start, size, owner))
                self.used += size
                return True
        return False

    def free(self, owner: int) -> None:
        for i, (start, size, o) in enumerate(self.blocks):
            if o == owner:
                del self.blocks[i]
                self.used -= size
                return

    def fits_if_freed(self, size: int, freeable: set[int]) -> bool:
        return any(length >= size for _, length in self._holes(freeable))

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    def largest_hole(self) -> int:
        return max((length for _, length in self._holes()), default=0)

    def footprint(self, size: int) -> int:
        return size

    def check(self) -> None:
        pos = 0
        for start, size, _ in self.blocks:
            assert start >= pos, "contiguous allocator: overlapping allocations"
            pos = start + size
        assert pos <= self.capacity, "contiguous allocator: allocation beyond the region"
        assert self.used == sum(s for _, s, _ in self.blocks)


class PagedAllocator:
    """Fixed-size pages (S-LoRA unified paging, 2 MB pages by default): no external fragmentation."""

    kind = "paged"

    def __init__(self, capacity: int, page_bytes: int = PAGE_BYTES) -> None:
        self.page = int(page_bytes)
        self.capacity = int(capacity)
        self.n_pages = self.capacity // self.page
        self.pages: dict[int, int] = {}
        self.used_pages = 0
        self.used = 0  # bytes actually stored

    def pages_for(self, size: int) -> int:
        return -(-size // self.page)

    def try_alloc(self, owner: int, size: int) -> bool:
        p = self.pages_for(size)
        if self.used_pages + p > self.n_pages:
            return False
        self.pages[owner] = p
        self.used_pages += p
        self.used += size
        return True

    def free(self, owner: int, size: int | None = None) -> None:
        p = self.pages.pop(owner)
        self.used_pages -= p
        self.used -= size if size is not None else 0

    def fits_if_freed(self, size: int, freeable_pages: int) -> bool:
        return self.used_pages - freeable_pages + self.pages_for(size) <= self.n_pages

    @property
    def free_bytes(self) -> int:
        return (self.n_pages - self.used_pages) * self.page

    def footprint(self, size: int) -> int:
        return self.pages_for(size) * self.page

    def check(self) -> None:
        assert self.used_pages == sum(self.pages.values()) <= self.n_pages, "paged allocator: page count"


class RegionPlacement:
    """A fixed adapter region with a contiguous or paged allocator (see the module docstring).

    ``alloc_failures`` counts allocations that failed although the free bytes would have
    held the adapter (external fragmentation): the allocator then evicts more adapters
    than the bytes require (``fragmentation_evictions``), or the request waits when the idle
    adapters do not free a large enough hole (the extensions' ``requests_blocked_by_adapter_memory``).
    A prefetch retried at every step counts at every step (the engine counts a run's steps alike).
    """

    def __init__(self, engine: "EngineCore", capacity_bytes: int, allocator: str = "contiguous",
                 page_bytes: int = PAGE_BYTES, page_overhead_s: float = 2e-6) -> None:
        self.e = engine
        self.mem = engine.adapters
        self.size = list(self.mem.bytes)
        if allocator == "contiguous":
            self.alloc: Any = ContiguousAllocator(capacity_bytes)
        elif allocator == "paged":
            self.alloc = PagedAllocator(capacity_bytes, page_bytes)
        else:
            raise ValueError(f"adapter placement must be 'contiguous' or 'paged', got {allocator!r}")
        self.page_overhead_s = page_overhead_s if allocator == "paged" else 0.0
        too_big = [a for a, s in enumerate(self.size) if self.alloc.footprint(s) > self.alloc.capacity]
        if too_big:
            raise ValueError(f"adapter region of {capacity_bytes / 2**20:.0f} MiB cannot hold adapter {too_big[0]} "
                             f"({self.size[too_big[0]] / 2**20:.0f} MiB)")
        self.alloc_failures = 0
        self.fragmentation_evictions = 0
        self.allocations = 0
        self._int_frag_sum = 0.0
        self._int_frag_n = 0

    def need_blocks(self, a: int) -> int:
        return 0  # the region is separate from the KV pool

    def can_place(self, a: int, extra_blocks: int = 0) -> bool:
        s = self.size[a]
        ev = self.mem.evictable()
        if isinstance(self.alloc, ContiguousAllocator):
            return self.alloc.fits_if_freed(s, set(ev))
        return self.alloc.fits_if_freed(s, sum(self.alloc.pages[v] for v in ev))

    def allocate(self, a: int, now: float, evict: bool = True) -> bool:
        s = self.size[a]
        if self.alloc.try_alloc(a, s):
            self._allocated(a)
            return True
        frag = self.alloc.free_bytes >= s
        if frag:
            self.alloc_failures += 1
        if not evict or not self.can_place(a):
            return False
        while True:
            if self.alloc.free_bytes >= s:
                self.fragmentation_evictions += 1
            self.mem.evict_victim(now)
            if self.alloc.try_alloc(a, s):
                self._allocated(a)
                return True

    def _allocated(self, a: int) -> None:
        self.allocations += 1
        if isinstance(self.alloc, PagedAllocator):
            self._int_frag_sum += (self.alloc.footprint(self.size[a]) - self.size[a]) / self.alloc.footprint(self.size[a])
            self._int_frag_n += 1

    def free(self, a: int) -> None:
        if isinstance(self.alloc, PagedAllocator):
            self.alloc.free(a, self.size[a])
        else:
            self.alloc.free(a)

    def load_extra_s(self, a: int) -> float:
        if not self.page_overhead_s:
            return 0.0
        return self.alloc.pages_for(self.size[a]) * self.page_overhead_s

    def check(self) -> None:
        self.alloc.check()
        owners = set(self.alloc.pages) if isinstance(self.alloc, PagedAllocator) else {o for _, _, o in self.alloc.blocks}
        resident = {a for a, r in enumerate(self.mem.resident) if r}
        assert owners == resident, "adapter region: allocations differ from the resident adapters"

    def stats(self) -> dict[str, Any]:
        out = {"adapter_placement": self.alloc.kind, "adapter_region_bytes": self.alloc.capacity,
               "adapter_alloc_failures": self.alloc_failures,
               "adapter_fragmentation_evictions": self.fragmentation_evictions}
        if isinstance(self.alloc, PagedAllocator):
            out["adapter_internal_fragmentation"] = self._int_frag_sum / self._int_frag_n if self._int_frag_n else 0.0
        return out


class UnifiedPool:
    """S-LoRA unified paging: adapters take KV blocks from the engine's pool (see the module docstring)."""

    def __init__(self, engine: "EngineCore", ext: Any) -> None:
        self.e = engine
        self.ext = ext
        self.mem = engine.adapters
        kvp = engine.profile.components["kv"].params
        per_tok = int(kvp.get("kv_bytes_per_token") or engine.profile.model.kv_bytes_per_token)
        self.block_bytes = per_tok * engine.block_size
        self.ab = [-(-b // self.block_bytes) for b in self.mem.bytes]
        self.adapter_blocks = 0
        self.pool_blocks = engine.total_blocks  # set by install before adapters are placed
        self.allocations = 0

    def need_blocks(self, a: int) -> int:
        return self.ab[a]

    def reclaimable_adapters(self) -> int:
        ab = self.ab
        return sum(ab[v] for v in self.mem.evictable())

    def can_place(self, a: int, extra_blocks: int = 0) -> bool:
        e = self.e
        free = e.total_blocks - e.used_blocks
        need = self.ab[a] + extra_blocks
        return need <= free or need <= free + self.ext.reclaimable()

    def allocate(self, a: int, now: float, evict: bool = True, reserve: int = 0) -> bool:
        """Pool blocks for adapter ``a`` (evicting idle adapters and history KV when ``evict``), leaving ``reserve``
        blocks free (a background copy leaves the running prefills' blocks: ``Engine.background_reserve``)."""
        e = self.e
        need = self.ab[a]
        free = e.total_blocks - e.used_blocks - reserve
        if need > free:
            if not evict or need > free + self.ext.reclaimable():
                return False
            self.ext.reclaim(need - free, now)
        e.lend_blocks(need)
        self.adapter_blocks += need
        self.allocations += 1
        return True

    def free(self, a: int) -> None:
        self.e.return_blocks(self.ab[a])
        self.adapter_blocks -= self.ab[a]

    def load_extra_s(self, a: int) -> float:
        return 0.0

    def check(self) -> None:
        want = sum(self.ab[a] for a, r in enumerate(self.mem.resident) if r)
        assert want == self.adapter_blocks, "unified pool: adapter blocks out of sync"

    def stats(self) -> dict[str, Any]:
        return {"adapter_placement": "unified", "pool_blocks": self.pool_blocks}
