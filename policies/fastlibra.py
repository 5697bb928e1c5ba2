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
* **Swapper** (§4.2; ``fastlibra.md`` §5) every 100 ms: when the HBM usage exceeds the *busy*
  threshold (95%), leaves with the lowest value are swapped out until it is back under; when it is below the
  *idle* threshold (70%), roots with the highest value are swapped in while it stays under --
  every adapter in host memory is a root, also one without a request in the window (value 0,
  last in the order): "effectively prefetching; at low load every LoRA gets loaded". The same
  order serves the on-demand evictions when a batch needs memory. The swapper is a monitor
  independent of the batch: its ticks are due every ``interval_s`` on a fixed grid and run at the
  first step boundary at or after the due time (the engine is iteration-level;
  :meth:`twin.engine_state.EngineState._tick`), and its swap-ins start at the tick whether or
  not a batch runs (``prefetch_at_tick``; KV nodes first, inside :meth:`FastLibraCache.on_tick`,
  then the LoRAs, :meth:`FastLibraCache.prefetch`). Its LoRA swap-ins have no bound on the copies
  in flight (``max_inflight = None``): the swapper swaps in "greedily one at a time" while HBM
  stays under the idle threshold and names no other bound (the twin's host link is FIFO, so the
  copies run one after the other; the loader's default cap of 4, which counted the demand copies
  too, used to hold the swapper back).
* **Blocks** (``shared/refs/fastlibra.md`` §2): one pool of equal blocks for adapters and KV.
  FastLibra's own block size is unspecified; the twin uses the engine's
  (``EngineConfig.block_size``, 16 tokens by default), an adapter taking
  ``ceil(bytes / block bytes)`` blocks.
* **Demand path** (``fastlibra.md`` §2, §5): a query whose LoRA or KV is in host memory has it
  swapped in (cold nodes evicted in the swapper's order when HBM is full) and waits; what it waits
  for is held in HBM until it is admitted (never a swap-out candidate), the twin's reading of "a
  query waits for its swap and then runs" (:meth:`twin.extensions.Extensions._await_swaps`).
* **Cost model** (§4.3) -- the value of node ``n``::

      Eval(n)   = LoRA_Eval * cost(n) * prob(n) * (1 - sigmoid(t(n)))
      LoRA_Eval = max(1, Low_lora / Now_lora)      (for adapter nodes; 1 for KV nodes)
      Low_lora  = sum_i (1 - (1 - prob_i)^BS)

  ``prob_i`` is adapter ``i``'s share of the requests that arrived in the last ``window_s``
  (the counting window is unspecified in the paper; ours is a sliding 60 s), so ``Low_lora``
  is the expected number of distinct adapters in a batch of ``BS`` requests; ``Now_lora`` is
  the number of adapters in HBM -- with fewer adapters in HBM than a batch is expected to need,
  adapters are worth more than KV (with none in HBM the paper's ``Low_lora / 0`` is undefined;
  the twin divides by 1 there, so ``LoRA_Eval = max(1, Low_lora)``: :func:`lora_eval`). ``BS`` is
  the batch size "observed over the last 5 s": our reading is the **mean** of the running batch
  size sampled at every swapper tick (100 ms) in the last ``bs_window_s`` = 5 s (the paper does not say mean, last or maximum;
  :meth:`FastLibraCache.recent_batch_size`).
  ``cost`` is the time to bring the node back (adapter: CPU->GPU copy, plus the disk read
  when not in the CPU tier; KV node: its host->GPU copy). A KV node's ``prob`` is **its own
  visit frequency** from the tree: the requests in the window that created or matched the
  node's history path, over the requests that arrived in the window (the same denominator as
  the adapters', so both are "the chance that a query visits this node";
  :meth:`twin.prefix_kv.HistoryKV.visits_since`).
  ``t`` is the time since the node was last used in units of ``decay_unit_s`` (default 60 s, see
  :data:`DEFAULT_DECAY_UNIT_S` for the reason; the paper does not give the unit).
* **Asynchronous swap-in** (§2): a query whose LoRA or history KV is in host memory has them
  copied in the background and waits while ready queries run (``async_swap_in``,
  :meth:`twin.extensions.Extensions._await_swaps`); the swapper's own swap-ins are background
  copies too.

Ablations (§6): ``fastlibra-wom`` no dependency tree (any node may be swapped, KV may stay
in HBM without its adapter), ``fastlibra-wos`` LRU instead of the cost model,
``fastlibra-wol`` without the LoRA quantity term (``LoRA_Eval = 1``). Baselines (§6): vLLM
with a static partition (adapters 20% of the pool, KV 80%), block size 32, prefix caching of
history KV, LRU in each part with swap-out of history KV and adapters to host memory and
synchronous swap-in on reuse (:class:`PartitionLRUCache`, preset ``vllm-partition``); S-LoRA,
which drops history KV and frees an adapter when no running request uses it (the ``slora``
preset).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable

import numpy as np

from policies.lru import LRUCache
from twin.registry import Preset, register_cache, register_preset
from twin.interfaces import AdapterCachePolicy, EngineView

INF = math.inf
#: Unit of ``t`` in the decay ``1 - sigmoid(t)`` (FastLibra §4.3 leaves it unspecified). The decay
#: falls from 0.5 at t = 0 to 0.27 at one unit and 0.0067 at five. In seconds, a node idle for 10 s
#: keeps 4.5e-5 of a fresh node's value, so the other factors (cost: ~2x between ranks; prob: a
#: few x between nodes) can never reorder two nodes idle a few seconds apart -- the ranking is
#: pure recency (``tests/policies/test_fastlibra.py::test_decay_unit_changes_the_ranking``). The
#: reuse distances of the paper's workloads are tens of seconds (a chat user's think time between
#: turns; an adapter's requests a few seconds apart at 20-100 LoRAs), so we take one minute: over
#: a typical reuse gap the decay halves a node's value instead of erasing it, and frequency and
#: cost still count. A choice, not a fitted constant: ``decay_unit_s`` changes it.
DEFAULT_DECAY_UNIT_S = 60.0
#: BS is the batch size "observed over the last 5 s" (§4.3)
BS_WINDOW_S = 5.0
#: above any history node's tokens (a request's prompt plus output, int64 columns)
MAX_NODE_TOKENS = 2 ** 63
#: FastLibra's LoRA compute: ``paged`` (the default, §2) or ``profile`` (the profile's own form: vLLM's kernel grid over its slots for the fitted profiles)
LORA_COMPUTE = ("paged", "profile")


def sigmoid(x: float) -> float:
    """The logistic function (0 below x = -700, where ``exp`` would overflow)."""
    return 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0


def low_lora(prob: np.ndarray, bs: float) -> float:
    """Expected distinct adapters in a batch of ``bs`` requests: sum_i 1 - (1 - p_i)^bs."""
    return float(np.sum(1.0 - (1.0 - np.asarray(prob, float)) ** bs))


def lora_eval(prob: np.ndarray, bs: float, now_lora: int) -> float:
    """FastLibra's LoRA quantity term ``max(1, Low_lora / Now_lora)`` (§4.3; ``fastlibra.md`` §4).
    ``Now_lora = 0`` (no adapter in HBM), which the paper leaves undefined, counts as 1: the term is then
    ``max(1, Low_lora)``, the largest it gets for these probabilities (the twin's choice)."""
    return max(1.0, low_lora(prob, bs) / max(now_lora, 1))


def kv_copy_times_valid(store) -> bool:
    """Whether the store's KV copy time (linear in the tokens) is finite and >= 0 for every node
    size (0 to ``MAX_NODE_TOKENS``): then a KV node with ``prob`` = 0 has the value 0 exactly."""
    lo, hi = store.transfer_s(0), store.transfer_s(MAX_NODE_TOKENS)
    return 0.0 <= lo < INF and 0.0 <= hi < INF


def node_eval(lora_term: float, cost: float, prob: float, t: float) -> float:
    """``Eval = LoRA_Eval * cost * prob * (1 - sigmoid(t))``, the decay computed as ``sigmoid(-t)``
    (equal, without the rounding of ``1 - sigmoid(t)`` to 0 beyond t = 37 that would tie old nodes)."""
    return lora_term * cost * prob * sigmoid(-t)


@register_cache
class FastLibraCache(AdapterCachePolicy):
    name = "fastlibra"
    description = "adapters + history KV in one pool, dependency tree, 100 ms swapper (95%/70%), cost-model values"
    citation = "Zhang et al., FastLibra, 2025, §4.1-4.3"
    adapter_memory = "unified"
    prefix_kv = True
    history_to_host = True
    dependency = True
    #: (twin.interfaces.AdapterCachePolicy) the tree: a LoRA leaves HBM after its KV nodes, so the engine's reclaimable
    #: count leaves out a LoRA whose node is still being copied in or held (with_children, swap_out_candidates)
    kv_before_adapter = True
    cost_model = True
    lora_term = True

    async_swap_in = True
    #: the swapper's LoRA swap-ins start at its tick, whether or not a batch runs (§4.2, ``fastlibra.md`` §5:
    #: a 100 ms monitor)
    prefetch_at_tick = True
    #: no bound on its copies in flight: the swapper swaps in while HBM stays under the idle threshold
    #: (``fastlibra.md`` §5)
    max_inflight = None
    #: LoRA compute over adapter weights paged in the pool (§2: "LoRA weights are split into blocks
    #: along the rank dimension", following S-LoRA's unified paging), not vLLM's slot kernels; see
    #: :class:`twin.perf.slora_forms.PagedLora`
    lora_compute = "paged"

    def __init__(self, busy: float = 0.95, idle: float = 0.70, interval_s: float = 0.1, window_s: float = 60.0,
                 decay_unit_s: float = DEFAULT_DECAY_UNIT_S, bs_window_s: float = BS_WINDOW_S,
                 lora_compute: str = "paged", **memory) -> None:
        super().__init__(**memory)
        if self.adapter_memory != "unified":  # (its cost model and swapper read the pool's pages, §4)
            raise ValueError(f"fastlibra: adapter_memory {self.adapter_memory!r} is not FastLibra's: its adapters "
                             f"and history KV share one unified pool (FastLibra §4); leave adapter_memory out, or use "
                             f"the partition-lru cache (vllm-partition preset) for a separate adapter region")
        if decay_unit_s <= 0 or bs_window_s <= 0 or window_s <= 0:
            raise ValueError("fastlibra: decay_unit_s, bs_window_s and window_s must be > 0 "
                             f"(got {decay_unit_s}, {bs_window_s}, {window_s})")
        if idle >= busy:  # (§4.2: swap in below idle, out above busy; each in [0, 1]: twin.interfaces.OPTION_MAXIMA)
            raise ValueError(f"fastlibra: the swapper's thresholds need 0 <= idle < busy <= 1 (got idle {idle}, busy "
                             f"{busy}): it swaps in while HBM usage is under idle and out while it is over busy, so "
                             f"idle >= busy swaps the same nodes in and out at every tick; e.g. idle=0.7, busy=0.95")
        if lora_compute not in LORA_COMPUTE:
            raise ValueError(f"fastlibra: lora_compute {lora_compute!r} is not one of {', '.join(LORA_COMPUTE)} "
                             "('paged': adapter weights paged in the pool, S-LoRA's kernels; 'profile': the "
                             "profile's own LoRA form, vLLM's slot kernels for the fitted profiles)")
        #: named departure ``profile``: the reading before (the profile's form; for the fitted
        #: profiles vLLM's Triton kernels over max(32, adapters) slots padded to the largest rank)
        self.lora_compute = lora_compute
        self.busy, self.idle = busy, idle
        self.interval_s = interval_s
        self.window_s = window_s
        self.decay_unit_s = decay_unit_s
        self.bs_window_s = bs_window_s
        self._bs_samples: deque[tuple[float, int]] = deque()
        self._bs_sum = 0
        self.last_use: dict[int, float] = {}
        self.swaps_out = 0
        self.swaps_in = 0
        # what each design element (tree §4.1, swapper §4.2, cost model §4.3) decided, the ablations' evidence (§6): LoRA swap-outs
        # (the rest of ``swaps_out`` are KV nodes); LoRAs swapped out while a KV node of theirs stayed
        # in HBM (each leaves invalid KVs: impossible with the tree, WoM only); swap-out decisions the
        # tree changed (the lowest-valued node was a LoRA with a KV child in HBM, which the tree holds
        # back); swap-out decisions LoRA_Eval changed (with the cost model: the choice with the term
        # differs from the choice without it -- for WoL, would have differed); swapper ticks with
        # LoRA_Eval > 1 (fewer LoRAs in HBM than a batch is expected to need)
        self.swaps_out_lora = 0
        self.lora_out_with_kv = 0
        self.dependency_decisions = 0
        self.lora_eval_decisions = 0
        self.lora_eval_above_1_ticks = 0
        self._swapin_loras: list[int] = []
        # sampled at every swapper tick: HBM usage, busy ticks, and the HBM history-KV blocks that
        # are invalid (their adapter not in HBM; FastLibra §1, the WoM ablation's 48.6 %, §6)
        self.ticks = 0
        self._usage_sum = 0.0
        self.busy_ticks = 0
        self._kv_blocks_sum = 0
        self._invalid_blocks_sum = 0

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        e = engine
        self.count = np.zeros(e.n_adapters)
        self.hi = 0
        self.lo = 0
        self._win_now = -INF
        self._total = self.count.sum()
        mem = e.adapters
        self._cpu = [mem.cpu_load_s[r] for r in mem.ranks_l]
        self._disk = [mem.disk_load_s[r] for r in mem.ranks_l]

    tick_option = "interval_s"

    @property
    def tick_interval(self) -> float | None:
        return self.interval_s

    # ------------------------------------------------------------------ statistics
    def _window(self, now: float) -> None:
        """Move the counting window to ``(now - window_s, now]`` (requests arrived by now). A
        repeated call at the same ``now`` with no new arrival changes nothing and returns at once
        (a swap-out computes one probability per node at one ``now``)."""
        e = self.engine
        hi = e.arr_ptr
        if now == self._win_now and hi == self.hi:
            return
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
        self._win_now = now
        self._total = self.count.sum()

    def probs(self, now: float) -> np.ndarray:
        self._window(now)
        s = self.count.sum()
        return self.count / s if s > 0 else np.zeros_like(self.count)

    def sample_batch_size(self, now: float) -> None:
        """Record the running batch size (every swapper tick) and drop samples older than ``bs_window_s``."""
        b = len(self.engine.running)
        q = self._bs_samples
        q.append((now, b))
        self._bs_sum += b
        lo = now - self.bs_window_s
        while q and q[0][0] <= lo:
            self._bs_sum -= q.popleft()[1]

    def recent_batch_size(self) -> float:
        """BS of ``Low_lora``: the mean running batch size over the last ``bs_window_s`` (at
        least 1; the current batch before the first sample)."""
        q = self._bs_samples
        bs = self._bs_sum / len(q) if q else float(len(self.engine.running))
        return max(bs, 1.0)

    def node_prob(self, node, now: float) -> float:
        """A KV node's own visit frequency: visits of its history path in the window over the
        requests that arrived in the window."""
        self._window(now)
        total = self._total  # the window's count.sum(), kept by _window
        if total <= 0:
            return 0.0
        return self._store().visits_since(node, now - self.window_s) / float(total)

    def on_active(self, a: int, now: float) -> None:
        self.last_use[a] = now

    def on_idle(self, a: int, now: float) -> None:
        self.last_use[a] = now

    def on_load(self, a: int, now: float) -> None:
        """A swap-in ends: the node's last-used time is updated (§4.1: "created, matched or swapped")."""
        self.last_use[a] = now

    def on_evict(self, a: int, now: float) -> None:
        """A LoRA node is swapped out: its last-used time is updated (§4.1: "swapped")."""
        self.last_use[a] = now

    def on_history(self, node, what: str, now: float) -> None:
        """A KV node is swapped out or its swap-in ends: its last-used time is updated (§4.1: a
        node's metadata updates when it is "created, matched or swapped"; creation and matching
        set it in :mod:`twin.prefix_kv`)."""
        if what in ("swap_out", "swap_in"):
            node.last_access = now

    # ------------------------------------------------------------------ the tree and values
    def _store(self):
        return self.engine.history

    def lora_eval_now(self, now: float) -> float:
        """``LoRA_Eval`` at ``now`` (computed whether or not this variant applies it)."""
        return lora_eval(self.probs(now), self.recent_batch_size(), self.engine.adapters.n_resident)

    def values(self, now: float, nodes: list, lora_term: float | None = None) -> list[float]:
        """Values of tree nodes: ``('lora', a)`` or ``('kv', HistoryNode)``; ``lora_term``
        replaces this variant's LoRA_Eval (the audit of :meth:`_audit_swap_out`)."""
        e = self.engine
        mem = e.adapters
        if not self.cost_model:  # WoS: LRU -- the value is the last use time
            return [self.last_use.get(x, -INF) if k == "lora" else x.last_access for k, x in nodes]
        prob = self.probs(now)
        if lora_term is not None:
            term = lora_term
        else:
            term = lora_eval(prob, self.recent_batch_size(), mem.n_resident) if self.lora_term else 1.0
        store = self._store()
        unit = self.decay_unit_s
        out = []
        for k, x in nodes:
            if k == "lora":
                cost = self._cpu[x] + (0.0 if x in mem.cpu else self._disk[x])
                t = (now - self.last_use.get(x, 0.0)) / unit
                out.append(node_eval(term, cost, float(prob[x]), t))
            else:
                out.append(self._kv_value(store, x, now))
        return out

    def _kv_value(self, store, node, now: float) -> float:
        """A KV node's value (``LoRA_Eval`` = 1): its copy time, its own visit frequency, its decay."""
        return node_eval(1.0, store.transfer_s(node.tokens), self.node_prob(node, now),
                         (now - node.last_access) / self.decay_unit_s)

    def _argmin(self, now: float, cands: list, lora_term: float | None = None) -> tuple[int, float]:
        """The index of the lowest of all the candidates' values (``np.argmin``) and that value."""
        vals = self.values(now, cands, lora_term)
        i = int(np.argmin(vals))
        return i, vals[i]

    def _lowest(self, now: float, cands: list, lora_term: float | None = None) -> tuple[int, float]:
        """The index of the lowest-valued candidate, ``np.argmin(self.values(now, cands, lora_term))``,
        and its value, without the values of the KV nodes after the first one with no visit in the
        window. Such a node's value is exactly 0 (``prob`` = 0); when no value is NaN or negative,
        the first 0 is the lowest value's first index, ``np.argmin``'s choice, so the nodes after it
        cannot change the choice. That holds when the LoRA values (all computed) are >= 0 and the KV
        copy times are finite and >= 0 for any node size; otherwise, and for WoS's LRU values, all
        values are computed. (The swapper swaps out one leaf at a time over all the HBM nodes, most of
        them, under a steady load, the unvisited histories of finished conversations.)"""
        store = self._store()
        if not self.cost_model or store is None or not kv_copy_times_valid(store):
            return self._argmin(now, cands, lora_term)
        at = [j for j, (k, _) in enumerate(cands) if k == "lora"]
        lora_vals = dict(zip(at, self.values(now, [cands[j] for j in at], lora_term)))
        if not all(v >= 0.0 for v in lora_vals.values()):  # a NaN or a negative value: argmin over all
            return self._argmin(now, cands, lora_term)
        self._window(now)
        t0 = now - self.window_s
        total = self._total
        unit = self.decay_unit_s
        visits = store.visits_since
        best, low = -1, INF
        for j, (k, x) in enumerate(cands):
            if k == "lora":
                v = lora_vals[j]
            elif total <= 0 or (n := visits(x, t0)) == 0:
                v = 0.0  # node_prob is 0
            else:  # :meth:`_kv_value` with its node_prob (n / total: the window is current) written out
                v = node_eval(1.0, store.transfer_s(x.tokens), n / float(total), (now - x.last_access) / unit)
            if v == 0.0:
                return j, v
            if best < 0 or v < low:
                best, low = j, v
        return best, low

    def adapters_with_hbm_kv(self) -> set[int]:
        """Adapters with a KV node in HBM (or being copied there): not leaves of the tree (the store's
        per-adapter counts, no walk over the nodes)."""
        store = self._store()
        return set(store.pool_nodes_of) if store is not None else set()

    def swap_out_candidates(self, pin: int = -1) -> list:
        """Leaves in HBM (with the dependency tree) or any HBM node (WoM), less the nodes held for waiting
        requests: a LoRA or KV node swapped in on demand for a query stays in HBM until that query is
        admitted (``engine.held_adapters``, ``node.held``; ``fastlibra.md`` §2, §5: a query waits for its
        swap-in and then runs, and only "cold" nodes are evicted -- how a node that just landed for a
        waiting query is kept is the twin's reading, :meth:`twin.extensions.Extensions._await_swaps`)."""
        e = self.engine
        mem = e.adapters
        store = self._store()
        kv = [n for n in store.hbm_nodes() if not n.held] if store is not None else []
        with_children = self.adapters_with_hbm_kv() if self.dependency else set()
        held = e.held_adapters
        loras = [a for a in mem.evictable() if a != pin and a not in with_children and a not in held]
        return [("kv", n) for n in kv] + [("lora", a) for a in loras]

    def swap_in_candidates(self, now: float) -> list:
        """Roots in host memory: every adapter not in HBM (nor being copied there), and KV nodes whose adapter
        is in HBM (all KV with WoM). The swapper takes "the top-most host-memory node of each path"
        (``fastlibra.md`` §5): an adapter without a request in the window is one too (its value is 0, so it
        comes last)."""
        mem = self.engine.adapters
        store = self._store()
        loras = [a for a in range(len(mem.resident)) if not mem.resident[a]]
        kv = []
        if store is not None:
            kv = [n for n in store.host_nodes() if not self.dependency or n.adapter < 0 or
                  (mem.resident[n.adapter] and n.adapter not in mem.loading)]
        return [("lora", a) for a in loras] + [("kv", n) for n in kv]

    def _choose(self, now: float, pin: int = -1) -> tuple[list, float, int]:
        """The swap-out candidates, the lowest value and its index (-1: none; :meth:`_lowest`)."""
        cands = self.swap_out_candidates(pin)
        if not cands:
            return cands, INF, -1
        i, v = self._lowest(now, cands)
        return cands, v, i

    def swap_out_choice(self, now: float, pin: int = -1):
        """The node the swapper would swap out next, ``('lora', a)`` or ``('kv', node)`` (None: none)."""
        cands, _, i = self._choose(now, pin)
        return cands[i] if i >= 0 else None

    def _swap_out_one(self, now: float, pin: int = -1) -> int:
        cands, v, i = self._choose(now, pin)
        if i < 0:
            return 0
        k, x = cands[i]
        self._audit_swap_out(now, cands, v, i, pin)
        self.swaps_out += 1
        if k == "kv":
            return self._store().swap_out(x, now)
        self.swaps_out_lora += 1
        if x in self.adapters_with_hbm_kv():
            self.lora_out_with_kv += 1
        mem = self.engine.adapters
        mem.evict(x, now)
        return mem.placement.ab[x]

    def _audit_swap_out(self, now: float, cands: list, v: float, i: int, pin: int) -> None:
        """Count whether LoRA_Eval and the tree changed this swap-out decision (the counters of
        :meth:`stats`; they read the state and change nothing). LoRA_Eval: the choice under the
        other setting of the term (FastLibra without it, WoL with it) differs. The tree: an
        evictable LoRA it holds back (a KV node of its in HBM) has a lower value than the choice."""
        if self.cost_model and any(k == "lora" for k, _ in cands):
            term = self.lora_eval_now(now)
            if term > 1.0 and self._lowest(now, cands, 1.0 if self.lora_term else term)[0] != i:
                self.lora_eval_decisions += 1
        if self.dependency:
            kept = self.adapters_with_hbm_kv()
            waiting = self.engine.held_adapters
            kept = [("lora", a) for a in self.engine.adapters.evictable()
                    if a != pin and a in kept and a not in waiting]
            if kept and min(self.values(now, kept)) < v:
                self.dependency_decisions += 1

    # ------------------------------------------------------------------ engine callbacks
    def reclaim_blocks(self, n: int, now: float, pin: int = -1) -> int:
        """On-demand eviction (and the busy swapper's): swap out the lowest-valued leaves until ``n`` blocks
        are free. The candidates and their values are computed again after every swap-out, so a LoRA whose
        last HBM child just left becomes a leaf at once and LoRA_Eval sees the new ``Now_lora``; the paper
        does not say whether the candidate set is refreshed mid-loop (the twin's choice)."""
        freed = 0
        while freed < n:
            f = self._swap_out_one(now, pin)
            if f == 0 and not self.swap_out_candidates(pin):
                break
            freed += f
        return freed

    def victim(self, now: float) -> int:
        """The lowest-valued idle adapter not held for a waiting request (any idle one when all are held)."""
        mem = self.engine.adapters
        store = self._store()
        held = self.engine.held_adapters
        ev = mem.evictable()
        cands = [("lora", a) for a in ev if a not in held] or [("lora", a) for a in ev]
        vals = self.values(now, cands)
        a = cands[int(np.argmin(vals))][1]
        if self.dependency and store is not None:  # its KV children leave HBM first
            for n in store.hbm_nodes():
                if n.adapter == a and not n.held:
                    store.swap_out(n, now)
        return a

    def usage(self) -> float:
        e = self.engine
        pool = e.pool_blocks
        return 1.0 - (e.total_blocks - e.used_blocks) / pool if pool else 0.0

    def sample_memory(self) -> None:
        """Record the HBM usage and the history-KV blocks in HBM (or being copied there), and those
        of them that are invalid: their adapter is not in HBM (nor being copied there), so they hold
        blocks no query can use until it comes back (summed per adapter: the store's counts, no walk
        over the nodes, which host memory keeps growing)."""
        u = self.usage()
        self.ticks += 1
        self._usage_sum += u
        self.busy_ticks += u > self.busy
        store = self._store()
        if store is None or not store.hbm_blocks:
            return
        res = self.engine.adapters.resident
        self._kv_blocks_sum += store.hbm_blocks
        self._invalid_blocks_sum += sum(b for a, b in store.pool_blocks_of.items() if a >= 0 and not res[a])

    def on_tick(self, now: float) -> None:
        """The swapper (every 100 ms): busy -> swap out leaves, idle -> swap in roots."""
        e = self.engine
        pool = e.pool_blocks
        self._swapin_loras = []
        self.sample_batch_size(now)
        self.sample_memory()
        if self.cost_model and self.lora_eval_now(now) > 1.0:
            self.lora_eval_above_1_ticks += 1
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
        """Adapters the swapper decided to swap in (copied in the background), asked right after each tick
        (``prefetch_at_tick``)."""
        res = self.engine.adapters.resident
        return [a for a in self._swapin_loras if not res[a]]

    prefetch_evicts = False

    def history_tier(self, node, now: float) -> str:
        return "hbm"

    def stats(self) -> dict:
        t = self.ticks
        return {"fastlibra_swaps_out": self.swaps_out, "fastlibra_kv_swaps_in": self.swaps_in,
                "fastlibra_hbm_usage_mean": self._usage_sum / t if t else None,
                "fastlibra_busy_tick_share": self.busy_ticks / t if t else None,
                "fastlibra_invalid_kv_share": (self._invalid_blocks_sum / self._kv_blocks_sum
                                               if self._kv_blocks_sum else None),
                "fastlibra_swaps_out_lora": self.swaps_out_lora,
                "fastlibra_lora_swaps_out_with_kv": self.lora_out_with_kv,
                "fastlibra_dependency_decisions": self.dependency_decisions,
                "fastlibra_lora_eval_decisions": self.lora_eval_decisions,
                "fastlibra_lora_eval_above_1_share": (self.lora_eval_above_1_ticks / t
                                                      if t and self.cost_model else None)}


@register_cache
class FastLibraWoM(FastLibraCache):
    name = "fastlibra-wom"
    description = "FastLibra without the dependency tree (adapters and KV swapped independently)"
    citation = "FastLibra §6 ablation (WoM)"
    dependency = False
    kv_before_adapter = False


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
    """vLLM baseline of FastLibra (§6, as the authors configured it): a static partition of the
    pool (adapters ``lora_share`` = 20%, KV the rest), KV blocks of 32 tokens, prefix caching
    that reuses conversations' history KV, and LRU in each part with swap-out to host memory
    instead of discarding (the authors added it to vLLM): the least recently used idle adapter
    leaves the adapter part for the CPU tier, the least recently used history KV leaves the KV
    part for host memory (:meth:`twin.extensions.Extensions.reclaim`). Reuse swaps them back
    synchronously on the admitting step's critical path, as vLLM loads a LoRA (and swaps KV)
    inside the step."""

    name = "partition-lru"
    description = ("static LoRA/KV partition (LoRA share 0.2), block 32, prefix caching, LRU swap-out of history KV "
                   "and adapters to host memory (FastLibra's vLLM baseline)")
    citation = "FastLibra §6 baseline (vLLM with prefix caching and host swapping)"
    adapter_memory = "region"
    adapter_placement = "paged"
    lora_share = 0.2
    prefix_kv = True
    history_to_host = True
    kv_block_size = 32


register_preset(Preset("fastlibra", "fcfs", "fastlibra", "FastLibra: unified pool of adapters and history KV, "
                       "dependency tree, swapper, cost model", "Zhang et al., FastLibra, 2025"))
register_preset(Preset("fastlibra-wom", "fcfs", "fastlibra-wom", "FastLibra without the dependency tree",
                       "FastLibra §6"))
register_preset(Preset("fastlibra-wos", "fcfs", "fastlibra-wos", "FastLibra with LRU instead of the cost model",
                       "FastLibra §6"))
register_preset(Preset("fastlibra-wol", "fcfs", "fastlibra-wol", "FastLibra without the LoRA quantity term",
                       "FastLibra §6"))
register_preset(Preset("vllm-partition", "fcfs", "partition-lru", "vLLM with prefix caching, a static LoRA/KV "
                       "partition (0.2), block 32, LRU swap-out of history KV and adapters to host memory "
                       "(FastLibra's baseline)", "FastLibra §6"))
