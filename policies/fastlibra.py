"""FastLibra: dependency-aware management of LoRA adapters and history KV caches.

Zhang et al., *Improving the Serving Performance of Multi-LoRA Large Language Models via
Efficient LoRA and KV Cache Management* (FastLibra), 2025:

* **One pool** in HBM holds adapters and history KV caches (prefix reuse across the turns
  of a conversation), with host memory as the second tier (``adapter_memory="unified"``,
  ``prefix_kv=True``; :mod:`twin.prefix_kv`, :mod:`twin.adapter_placement`).
* **Dependency tree** (§4.1): the root, the LoRA adapters at the second level, the history
  KV nodes of each adapter's conversations below it. A KV node is only useful when its
  adapter is in HBM too, so the tree is kept *HBM-closed upwards*: swap-out takes **leaves**
  in HBM (KV nodes, or adapters with no KV child in HBM), swap-in takes **roots** in host
  memory (adapters, or KV nodes whose adapter is in HBM).
* **Swapper** (§4.2) every 100 ms: when the HBM usage exceeds the *busy* threshold (95%),
  leaves with the lowest value are swapped out until it is back under; when it is below the
  *idle* threshold (70%), roots with the highest value are swapped in while it stays under.
  The same order serves the on-demand evictions when a batch needs memory.
* **Cost model** (§4.3) -- the value of node ``n``::

      Eval(n)   = LoRA_Eval * cost(n) * prob(n) * (1 - sigmoid(t(n)))
      LoRA_Eval = max(1, Low_lora / Now_lora)      (for adapter nodes; 1 for KV nodes)
      Low_lora  = sum_i (1 - (1 - prob_i)^BS)

  ``prob_i`` is adapter ``i``'s share of the recent requests (sliding ``window_s``), so
  ``Low_lora`` is the expected number of distinct adapters in a batch of ``BS`` requests
  (``BS``: the running batch size); ``Now_lora`` is the number of adapters in HBM -- with
  fewer adapters in HBM than a batch is expected to need, adapters are worth more than KV.
  ``cost`` is the time to bring the node back (adapter: CPU->GPU copy, plus the disk read
  when not in the CPU tier; KV node: its host->GPU copy). A KV node's ``prob`` is its
  adapter's ``prob_i`` divided by the number of live conversations of that adapter (the
  chance that the adapter's next request continues this conversation). ``t`` is the time
  since the node was last used, in units of ``t_scale_s``.

Ablations (§6): ``fastlibra-wom`` no dependency tree (any node may be swapped, KV may stay
in HBM without its adapter), ``fastlibra-wos`` LRU instead of the cost model,
``fastlibra-wol`` without the LoRA quantity term (``LoRA_Eval = 1``). Baselines: vLLM with a
static partition (adapters 20% of the pool, KV 80%, LRU in each: :class:`PartitionLRUCache`)
and S-LoRA, which drops history KV (the ``slora`` preset).
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from policies.lru import LRUCache
from twin.registry import Preset, register_cache, register_preset
from twin.interfaces import AdapterCachePolicy, EngineView

INF = math.inf


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def low_lora(prob: np.ndarray, bs: int) -> float:
    """Expected distinct adapters in a batch of ``bs`` requests: sum_i 1 - (1 - p_i)^bs."""
    return float(np.sum(1.0 - (1.0 - np.asarray(prob, float)) ** bs))


def lora_eval(prob: np.ndarray, bs: int, now_lora: int) -> float:
    """FastLibra's LoRA quantity term ``max(1, Low_lora / Now_lora)``."""
    return max(1.0, low_lora(prob, bs) / max(now_lora, 1))


def node_eval(lora_term: float, cost: float, prob: float, t: float) -> float:
    """``Eval = LoRA_Eval * cost * prob * (1 - sigmoid(t))``."""
    return lora_term * cost * prob * (1.0 - sigmoid(t))


@register_cache
class FastLibraCache(AdapterCachePolicy):
    name = "fastlibra"
    description = "adapters + history KV in one pool, dependency tree, 100 ms swapper (95%/70%), cost-model values"
    citation = "Zhang et al., FastLibra, 2025, §4.1-4.3"
    adapter_memory = "unified"
    prefix_kv = True
    history_to_host = True
    dependency = True
    cost_model = True
    lora_term = True

    def __init__(self, busy: float = 0.95, idle: float = 0.70, interval_s: float = 0.1, window_s: float = 60.0,
                 t_scale_s: float = 1.0, **memory) -> None:
        super().__init__(**memory)
        self.busy, self.idle = busy, idle
        self.interval_s = interval_s
        self.window_s = window_s
        self.t_scale_s = t_scale_s
        self.last_use: dict[int, float] = {}
        self.swaps_out = 0
        self.swaps_in = 0
        self._swapin_loras: list[int] = []

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        e = engine
        self.count = np.zeros(e.n_adapters)
        self.hi = 0
        self.lo = 0
        mem = e.adapters
        self._cpu = [mem.cpu_load_s[r] for r in mem.ranks_l]
        self._disk = [mem.disk_load_s[r] for r in mem.ranks_l]

    @property
    def tick_interval(self) -> float | None:
        return self.interval_s

    # ------------------------------------------------------------------ statistics
    def _window(self, now: float) -> None:
        e = self.engine
        hi = e.arr_ptr
        if hi > self.hi:
            ad = e.adapter[self.hi:hi]
            ad = ad[ad >= 0]
            self.count += np.bincount(ad, minlength=len(self.count))
            self.hi = hi
        lo = int(np.searchsorted(e.arrival, now - self.window_s, side="left"))
        lo = min(lo, self.hi)
        if lo > self.lo:
            ad = e.adapter[self.lo:lo]
            ad = ad[ad >= 0]
            self.count -= np.bincount(ad, minlength=len(self.count))
            self.lo = lo

    def probs(self, now: float) -> np.ndarray:
        self._window(now)
        s = self.count.sum()
        return self.count / s if s > 0 else np.zeros_like(self.count)

    def on_active(self, a: int, now: float) -> None:
        self.last_use[a] = now

    def on_idle(self, a: int, now: float) -> None:
        self.last_use[a] = now

    # ------------------------------------------------------------------ the tree and values
    def _store(self):
        return self.engine.history

    def values(self, now: float, nodes: list) -> list[float]:
        """Values of tree nodes: ``('lora', a)`` or ``('kv', HistoryNode)``."""
        e = self.engine
        mem = e.adapters
        if not self.cost_model:  # WoS: LRU -- the value is the last use time
            return [self.last_use.get(x, -INF) if k == "lora" else x.last_access for k, x in nodes]
        prob = self.probs(now)
        bs = max(len(e.running), 1)
        term = lora_eval(prob, bs, mem.n_resident) if self.lora_term else 1.0
        store = self._store()
        convs: dict[int, int] = {}
        if store is not None:
            for n in store.nodes.values():
                convs[n.adapter] = convs.get(n.adapter, 0) + 1
        out = []
        for k, x in nodes:
            if k == "lora":
                cost = self._cpu[x] + (0.0 if x in mem.cpu else self._disk[x])
                t = (now - self.last_use.get(x, 0.0)) / self.t_scale_s
                out.append(node_eval(term, cost, float(prob[x]), t))
            else:
                p = float(prob[x.adapter]) / max(convs.get(x.adapter, 1), 1) if x.adapter >= 0 else 0.0
                t = (now - x.last_access) / self.t_scale_s
                out.append(node_eval(1.0, store.transfer_s(x.tokens), p, t))
        return out

    def swap_out_candidates(self, pin: int = -1) -> list:
        """Leaves in HBM (with the dependency tree) or any HBM node (WoM)."""
        mem = self.engine.adapters
        store = self._store()
        kv = store.hbm_nodes() if store is not None else []
        with_children = {n.adapter for n in store.nodes.values() if n.tier in ("hbm", "loading")} \
            if (store is not None and self.dependency) else set()
        loras = [a for a in mem.evictable() if a != pin and a not in with_children]
        return [("kv", n) for n in kv] + [("lora", a) for a in loras]

    def swap_in_candidates(self, now: float) -> list:
        """Roots in host memory: adapters, and KV nodes whose adapter is in HBM (all KV with WoM)."""
        mem = self.engine.adapters
        store = self._store()
        prob = self.probs(now)
        loras = [a for a in range(len(mem.resident)) if not mem.resident[a] and prob[a] > 0]
        kv = []
        if store is not None:
            kv = [n for n in store.host_nodes() if not self.dependency or n.adapter < 0 or
                  (mem.resident[n.adapter] and n.adapter not in mem.loading)]
        return [("lora", a) for a in loras] + [("kv", n) for n in kv]

    def _swap_out_one(self, now: float, pin: int = -1) -> int:
        cands = self.swap_out_candidates(pin)
        if not cands:
            return 0
        vals = self.values(now, cands)
        k, x = cands[int(np.argmin(vals))]
        self.swaps_out += 1
        if k == "kv":
            return self._store().swap_out(x, now)
        mem = self.engine.adapters
        mem.evict(x, now)
        return mem.placement.ab[x]

    # ------------------------------------------------------------------ engine callbacks
    def reclaim_blocks(self, n: int, now: float, pin: int = -1) -> int:
        """On-demand eviction: swap out the lowest-valued leaves until ``n`` blocks are free."""
        freed = 0
        while freed < n:
            f = self._swap_out_one(now, pin)
            if f == 0 and not self.swap_out_candidates(pin):
                break
            freed += f
        return freed

    def victim(self, now: float) -> int:
        mem = self.engine.adapters
        store = self._store()
        cands = [("lora", a) for a in mem.evictable()]
        vals = self.values(now, cands)
        a = cands[int(np.argmin(vals))][1]
        if self.dependency and store is not None:  # its KV children leave HBM first
            for n in list(store.nodes.values()):
                if n.adapter == a and n.tier == "hbm":
                    store.swap_out(n, now)
        return a

    def usage(self) -> float:
        e = self.engine
        pool = e.pool_blocks
        return 1.0 - (e.total_blocks - e.used_blocks) / pool if pool else 0.0

    def on_tick(self, now: float) -> None:
        """The swapper (every 100 ms): busy -> swap out leaves, idle -> swap in roots."""
        e = self.engine
        pool = e.pool_blocks
        self._swapin_loras = []
        if self.usage() > self.busy:
            target = int(math.ceil((1 - self.busy) * pool))
            need = target - (e.total_blocks - e.used_blocks)
            if need > 0:
                self.reclaim_blocks(need, now)
            return
        if self.usage() >= self.idle:
            return
        cands = self.swap_in_candidates(now)
        if not cands:
            return
        vals = self.values(now, cands)
        order = np.argsort(-np.asarray(vals), kind="stable")
        budget = int(self.idle * pool) - (pool - (e.total_blocks - e.used_blocks))
        store = self._store()
        ab = e.adapters.placement.ab
        for i in order:
            k, x = cands[int(i)]
            size = ab[x] if k == "lora" else x.blocks
            if size > budget:
                continue
            if k == "lora":
                self._swapin_loras.append(x)
                budget -= size
            elif store.swap_in(x, now):
                self.swaps_in += 1
                budget -= size

    def prefetch(self, now: float) -> Iterable[int]:
        """Adapters the swapper decided to swap in (copied in the background)."""
        res = self.engine.adapters.resident
        return [a for a in self._swapin_loras if not res[a]]

    prefetch_evicts = False

    def history_tier(self, node, now: float) -> str:
        return "hbm"

    def stats(self) -> dict:
        return {"fastlibra_swaps_out": self.swaps_out, "fastlibra_kv_swaps_in": self.swaps_in}


@register_cache
class FastLibraWoM(FastLibraCache):
    name = "fastlibra-wom"
    description = "FastLibra without the dependency tree (adapters and KV swapped independently)"
    citation = "FastLibra §6 ablation (WoM)"
    dependency = False


@register_cache
class FastLibraWoS(FastLibraCache):
    name = "fastlibra-wos"
    description = "FastLibra with LRU values instead of the cost model"
    citation = "FastLibra §6 ablation (WoS)"
    cost_model = False


@register_cache
class FastLibraWoL(FastLibraCache):
    name = "fastlibra-wol"
    description = "FastLibra without the LoRA quantity term (LoRA_Eval = 1)"
    citation = "FastLibra §6 ablation (WoL)"
    lora_term = False


@register_cache
class PartitionLRUCache(LRUCache):
    """vLLM baseline of FastLibra: a static partition of the pool (adapters ``lora_share`` =
    20%, KV the rest), LRU among the idle adapters of the adapter part and LRU among the
    history KV of the KV part (dropped when the KV part runs short; vLLM 0.8.5 has no host
    KV tier)."""

    name = "partition-lru"
    description = "static LoRA/KV partition (LoRA share 0.2), LRU in each part (FastLibra's vLLM baseline)"
    citation = "FastLibra §6 baseline (vLLM with prefix caching)"
    adapter_memory = "region"
    adapter_placement = "paged"
    lora_share = 0.2
    prefix_kv = True
    history_to_host = False


register_preset(Preset("fastlibra", "fcfs", "fastlibra", "FastLibra: unified pool of adapters and history KV, "
                       "dependency tree, swapper, cost model", "Zhang et al., FastLibra, 2025"))
register_preset(Preset("fastlibra-wom", "fcfs", "fastlibra-wom", "FastLibra without the dependency tree",
                       "FastLibra §6"))
register_preset(Preset("fastlibra-wos", "fcfs", "fastlibra-wos", "FastLibra with LRU instead of the cost model",
                       "FastLibra §6"))
register_preset(Preset("fastlibra-wol", "fcfs", "fastlibra-wol", "FastLibra without the LoRA quantity term",
                       "FastLibra §6"))
register_preset(Preset("vllm-partition", "fcfs", "partition-lru", "vLLM with prefix caching and a static LoRA/KV "
                       "partition (0.2), LRU in each part (FastLibra's baseline)", "FastLibra §6"))
