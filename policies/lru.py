"""Least recently used adapter slots: vLLM's ``LRUCacheWorkerLoRAManager``.

vLLM touches every adapter of the batch at every step, so among adapters not in the
batch the least recently used one is the one that left the batch first. Recording the
moment an adapter goes idle is therefore enough (no per-step work).

vLLM 0.8.5 touches them one at a time, in the order of a Python set of ``LoRARequest``
(hashed by name, rebuilt every step), activating new adapters as it meets them; an eviction
made for a new adapter can therefore take an adapter of the batch that this step has not
touched yet, which is reloaded when the loop reaches it (``activation_order_reloads``, see
:meth:`twin.adapters.AdapterMemory.activation_reloads`; ``twin calibrate replay`` checks the
resulting load counts against the published serving runs).
"""

from __future__ import annotations

from collections import OrderedDict

from twin.registry import register_cache
from twin.interfaces import AdapterCachePolicy, unpinned


@register_cache
class LRUCache(AdapterCachePolicy):
    name = "lru"
    description = "evict the idle adapter used least recently (vLLM default)"
    citation = "vLLM LRUCacheWorkerLoRAManager"
    activation_order_reloads = True

    def __init__(self, **memory) -> None:
        super().__init__(**memory)
        self.idle: OrderedDict[int, None] = OrderedDict()

    def on_active(self, a: int, now: float) -> None:
        self.idle.pop(a, None)

    def on_idle(self, a: int, now: float) -> None:
        self.idle[a] = None

    def on_evict(self, a: int, now: float) -> None:
        self.idle.pop(a, None)

    def victim(self, now: float) -> int:
        return next(iter(unpinned(self.idle, self.reclaim_pin) if self.reclaim_pin >= 0 else self.idle))
