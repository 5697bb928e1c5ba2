"""Chameleon: adaptive caching and scheduling for many-adapter LLM inference.

Iliakopoulou et al., *Chameleon: Adaptive Caching and Scheduling for Many-Adapter LLM
Inference Environments*, MICRO 2025. Chameleon extends S-LoRA (unified memory pool,
iteration-level batching) with

**a scheduler** (§4.3, :class:`ChameleonScheduler`):

1. *Weighted request size* (WRS)::

       WRS = (A * in/max_in + B * out_pred/max_out) * rank/max_rank,   A = 0.4, B = 0.6

   (``in``: prompt tokens, ``out_pred``: predicted output tokens, ``rank``: the adapter's rank;
   the maxima are those seen so far). The ``chameleon-output-only`` variant uses
   ``WRS = out_pred/max_out``.
2. *Queues*: K-means over the WRS of recent requests with ``K`` in 1..4; the cut-offs between
   queues are the midpoints between consecutive centroids. The paper picks "the K with
   minimal WCSS", which is always the largest K (WCSS never grows with K); here the default
   rule is the **elbow**: the smallest K whose next queue would reduce the WCSS by less than
   ``elbow`` (10%) of the one-queue WCSS (``k_rule="min-wcss"`` gives the paper's literal rule,
   ``k=`` forces a K). ``chameleon-static``: 4 equal-population queues with equal quotas.
3. *Quotas*: every queue gets at least the tokens an M/M/1 queue needs to meet the SLO::

       Tok_min_i >= S_i * D_i * (1/SLO + lambda_i)

   with ``S_i`` the mean request size in tokens (prompt + predicted output), ``D_i`` the mean
   service time of its requests (predicted output x measured iteration time) and
   ``lambda_i`` its arrival rate over the refresh window. The rest of the token capacity
   (the KV pool) is split in proportion to the queues' token demand ``lambda_i * S_i``; if
   the minima exceed the capacity they are scaled down proportionally.
4. *Batch formation* (Algorithm 1): phase 1 admits each queue's requests in FIFO order
   while the queue's running tokens stay within its quota; phase 2 pools the spare quota
   and hands it to the queues from the smallest downwards. (A queue with nothing running
   may always admit its head, so a request larger than its quota cannot starve.)
5. *Opportunistic bypass*: when a queue's head cannot run because its adapter does not fit
   in memory, a younger request of the same queue whose adapter is resident may go first,
   but only when the head's predicted wait exceeds the bypasser's predicted run time. If
   the prediction proves wrong -- the bypasser still runs when the head's predicted wait has
   elapsed and the head still waits -- the bypasser is squashed (preempted, recomputed
   later).
6. Queues, cut-offs and quotas are recomputed every ``T_refresh = 5 min``.

**a cache** (§4.2, :class:`ChameleonCache`): adapters stay in otherwise idle GPU memory of
the unified pool, resized every step against the batch's memory needs (the engine evicts
idle adapters before it would preempt, :meth:`twin.extensions.Extensions.reclaim`); an adapter
with running requests is never evicted; the adapters of queued requests are kept unless
memory forces it; among the others the victim has the lowest::

    Score = F * Frequency + R * Recency + S * Size,   F = 0.45, R = 0.10, S = 0.45

over features normalised to [0, 1] among the candidates (frequency: requests so far;
recency: 1 for the most recently used, 0 for the least; size: bytes, since a larger adapter
costs more to bring back). ``fairshare`` weighs the three equally. ``chameleon+prefetch`` adds
the optional predictive prefetch: a histogram of each adapter's request inter-arrival times
(as in Shahrad et al., "Serverless in the Wild", ATC'20) gives a pre-warm time (the 5th
percentile): when an adapter has been idle that long it is prefetched into free memory.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Iterable

import numpy as np

from policies.caches import IdleTracking
from policies.common import ArrivalStats, OutputPredictor, kmeans_1d, waiting_adapter_counts
from twin.adapter_placement import UnifiedPool
from twin.interfaces import Admit, EngineView, Scheduler
from twin.registry import Preset, register_cache, register_preset, register_scheduler
from twin.requests import RequestState

INF = math.inf
A_IN, B_OUT = 0.4, 0.6


@register_scheduler
class ChameleonScheduler(Scheduler):
    name = "chameleon"
    description = "WRS-based multi-queue scheduler with M/M/1 token quotas, two-phase batching and bypass (Chameleon)"
    citation = "Iliakopoulou et al., Chameleon, MICRO'25, §4.3, Algorithm 1"
    uses_events = True
    prefetch_evicts = False

    def __init__(self, k: int | None = None, k_rule: str = "elbow", elbow: float = 0.1, refresh_s: float = 300.0,
                 slo_s: float | None = None, accuracy: float = 1.0, seed: int = 0, min_samples: int = 100,
                 bypass: bool = True, static: bool = False, wrs: str = "full", max_scan: int = 16,
                 prefetch_heads: int = 2) -> None:
        if k is not None and not 1 <= k <= 4:
            raise ValueError("Chameleon uses 1 to 4 queues")
        if k_rule not in ("elbow", "min-wcss"):
            raise ValueError("k_rule must be 'elbow' or 'min-wcss'")
        if wrs not in ("full", "output"):
            raise ValueError("wrs must be 'full' or 'output'")
        super().__init__()
        self.k, self.k_rule, self.elbow = k, k_rule, elbow
        self.refresh_s = refresh_s
        self.slo_s = slo_s
        self.accuracy, self.seed = accuracy, seed
        self.min_samples = min_samples
        self.bypass = bypass
        self.static = static
        self.wrs = wrs
        self.max_scan = max_scan
        self.prefetch_heads = prefetch_heads

    # ------------------------------------------------------------------ set-up
    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        e = engine
        self.pred = OutputPredictor(e, self.accuracy, self.seed)
        self.ok = (e.reject_reason == 0).tolist()
        self.tok = (e.prompt + self.pred.pred).tolist()  # request size: prompt + predicted output
        self.max_in = self.max_out = self.max_rank = 1
        self.cuts: list[float] = []
        self.queues: list[deque[int]] = [deque()]
        self.quota: list[float] = [INF]
        self.used: list[int] = [0]
        self.qof: dict[int, int] = {}          # queue of each waiting or running request
        self.arrived: list[int] = []           # valid arrivals, in order (statistics window)
        self.initialized = False
        self.n_queues = 1
        self.refreshes = 0
        self.bypasses = 0
        self.squashes = 0
        self._last_steps = 0
        self._last_t = 0.0
        self._t_step = None
        self._time_dependent = False
        self.slo_target_s = self.slo_s
        if self.slo_target_s is None:  # 5x an unloaded request's service estimate (the paper's SLO)
            p = e.profile
            mean_in = float(e.prompt.mean()) if e.n else 512.0
            self.slo_target_s = 5.0 * float(p.backbone_s(mean_in, 0, 0) + p.scheduler_s(1, 0, 1, 1))

    @property
    def tick_interval(self) -> float | None:
        return self.refresh_s

    def capacity_tokens(self) -> int:
        e = self.engine
        return int(e.pool_blocks * e.block_size)

    # ------------------------------------------------------------------ WRS and queues
    def weighted_size(self, rid: int) -> float:
        """The request's WRS (§4.3; output-only when ``wrs='output'``)."""
        e = self.engine
        out = self.pred[rid] / self.max_out
        if self.wrs == "output":
            return out
        size = A_IN * float(e.prompt_a[rid]) / self.max_in + B_OUT * out
        r = int(e.rank[rid]) if e.adapter[rid] >= 0 else 0
        return size * max(r, 1) / self.max_rank

    def queue_of(self, rid: int) -> int:
        return bisect.bisect_right(self.cuts, self.weighted_size(rid))

    def on_arrivals(self, lo: int, hi: int) -> None:
        e = self.engine
        ok = self.ok
        for rid in range(lo, hi):
            if not ok[rid]:
                continue
            self.max_in = max(self.max_in, int(e.prompt_a[rid]))
            self.max_out = max(self.max_out, self.pred[rid])
            if e.adapter[rid] >= 0:
                self.max_rank = max(self.max_rank, int(e.rank[rid]))
            self.arrived.append(rid)
            q = self.queue_of(rid) if self.initialized else 0
            self.qof[rid] = q
            self.queues[q].append(rid)
        if not self.initialized and len(self.arrived) >= self.min_samples:
            self.refresh(e.now)

    def on_tick(self, now: float) -> None:
        if self.arrived:
            self.refresh(now)

    def _iteration_time(self, now: float) -> float:
        e = self.engine
        steps = e.steps_run
        if steps > self._last_steps and now > self._last_t:
            self._t_step = (now - self._last_t) / (steps - self._last_steps)
        self._last_steps, self._last_t = steps, now
        if self._t_step is None:
            self._t_step = float(e.profile.backbone_s(0, 1, 0))
        return self._t_step

    def choose_k(self, w: np.ndarray) -> tuple[int, np.ndarray]:
        if self.k is not None:
            return self.k, kmeans_1d(w, self.k)[0]
        fits = [kmeans_1d(w, k) for k in (1, 2, 3, 4)]
        wcss = [f[1] for f in fits]
        if self.k_rule == "min-wcss":
            k = int(np.argmin(wcss)) + 1
            return len(fits[k - 1][0]), fits[k - 1][0]
        k = 4
        for i in range(3):
            if wcss[0] <= 0 or (wcss[i] - wcss[i + 1]) < self.elbow * wcss[0]:
                k = i + 1
                break
        cents = fits[k - 1][0]
        return len(cents), cents

    def refresh(self, now: float) -> None:
        """Recompute queues, cut-offs and quotas from the recent requests (§4.3)."""
        e = self.engine
        t_step = self._iteration_time(now)
        arr = e.arrival
        recent = [r for r in self.arrived if arr[r] >= now - self.refresh_s]
        if len(recent) < self.min_samples:
            recent = self.arrived[-self.min_samples:]
        self.arrived = self.arrived[-max(self.min_samples, len(recent)):]  # bound the memory
        w = np.array([self.weighted_size(r) for r in recent])
        total = self.capacity_tokens()
        if self.static:
            k = 4
            self.cuts = np.quantile(w, [0.25, 0.5, 0.75]).tolist() if len(w) else [0.0] * 3
            quota = [total / 4.0] * 4
        else:
            k, cents = self.choose_k(w)
            self.cuts = ((cents[1:] + cents[:-1]) / 2).tolist()
            lab = np.searchsorted(np.asarray(self.cuts), w, side="right")
            span = max(now - float(arr[recent[0]]), 1e-9) if recent else 1.0
            tok = np.array([self.tok[r] for r in recent], float)
            out = np.array([self.pred[r] for r in recent], float)
            tok_min = np.zeros(k)
            demand = np.zeros(k)
            for i in range(k):
                m = lab == i
                if not m.any():
                    continue
                lam = m.sum() / span
                S = tok[m].mean()
                D = out[m].mean() * t_step
                tok_min[i] = S * D * (1.0 / self.slo_target_s + lam)
                demand[i] = lam * S
            quota = self.split_quotas(tok_min, demand, total)
        self.n_queues = k
        self.quota = list(quota)
        self.initialized = True
        self.refreshes += 1
        # re-queue the waiting requests (arrival order, preempted ones first) and recount usage
        waiting = [r for q in self.queues for r in q]
        waiting.sort(key=lambda r: (0 if e.tokens_known(r) != e.prompt_a[r] else 1, r))
        self.queues = [deque() for _ in range(k)]
        for r in waiting:
            q = self.queue_of(r)
            self.qof[r] = q
            self.queues[q].append(r)
        self.used = [0] * k
        for r in e.running:
            if r in self.qof:
                q = self.queue_of(r)
                self.qof[r] = q
                self.used[q] += self.tok[r]

    @staticmethod
    def split_quotas(tok_min: np.ndarray, demand: np.ndarray, total: float) -> list[float]:
        """Per-queue token quotas: the M/M/1 minima, then the remainder by token demand."""
        s = float(tok_min.sum())
        if s >= total and s > 0:
            return (total * tok_min / s).tolist()
        rem = total - s
        d = float(demand.sum())
        share = demand / d if d > 0 else np.full(len(tok_min), 1.0 / max(len(tok_min), 1))
        return (tok_min + rem * share).tolist()

    # ------------------------------------------------------------------ batch formation
    def schedule_waiting(self, ctx) -> Admit | None:
        """Algorithm 1: quota admission per queue, then the pooled spare quota from the
        small queue downwards; bypass when a queue head's adapter does not fit."""
        self._time_dependent = False
        for phase in (1, 2):
            spare = sum(max(q - u, 0) for q, u in zip(self.quota, self.used)) if phase == 2 else 0.0
            for i, q in enumerate(self.queues):
                while q:
                    rid = q[0]
                    s = self.tok[rid]
                    if phase == 1:
                        if self.used[i] + s > self.quota[i] and self.used[i] > 0:
                            break
                    elif s > spare:
                        break
                    r = ctx.try_admit(rid)
                    if r == Admit.OK:
                        q.popleft()
                        self.used[i] += s
                        if phase == 2:
                            spare -= s
                        continue
                    if r == Admit.NO_SLOT:
                        if phase == 1 and self.bypass:
                            r2 = self._bypass(ctx, i, rid)
                            if r2 is not None:
                                return r2
                        break
                    return r
        return None

    def remaining_s(self, rid: int, t_step: float) -> float:
        """Predicted time until running request ``rid`` finishes."""
        e = self.engine
        emitted = e.emitted_now(rid) if e.is_decoding(rid) else 0
        return max(self.pred[rid] - emitted, 1) * t_step

    def predicted_wait(self, head: int) -> float:
        """When the head's adapter is predicted to fit: running requests finish in predicted
        order, freeing their KV blocks (and their adapter's, when they are its last user),
        until the deficit of the pool is covered."""
        e = self.engine
        t_step = self._t_step or float(e.profile.backbone_s(0, 1, 0))
        mem = e.adapters
        runs = sorted(e.running, key=lambda r: self.remaining_s(r, t_step))
        if not runs:
            return 0.0
        pl = mem.placement
        if not isinstance(pl, UnifiedPool):  # slots: the first adapter whose last request ends
            left = {}
            for r in runs:
                a = e.adapter_a[r]
                left[a] = left.get(a, 0) + 1
            for r in runs:
                a = e.adapter_a[r]
                left[a] -= 1
                if a >= 0 and left[a] == 0:
                    return self.remaining_s(r, t_step)
            return self.remaining_s(runs[-1], t_step)
        a = e.adapter_a[head]
        need = pl.ab[a] + -(-min(e.tokens_known(head), e.config.max_num_batched_tokens) // e.block_size)
        deficit = need - (e.total_blocks - e.used_blocks) - e.reclaimable_blocks()
        users = {}
        for r in runs:
            b = e.adapter_a[r]
            users[b] = users.get(b, 0) + 1
        bs = e.block_size
        for r in runs:
            deficit -= e.kv_blocks_held(r)
            b = e.adapter_a[r]
            if b >= 0:
                users[b] -= 1
                if users[b] == 0:
                    deficit -= pl.ab[b]
            if deficit <= 0:
                return self.remaining_s(r, t_step)
        return self.remaining_s(runs[-1], t_step)

    def _bypass(self, ctx, i: int, head: int) -> Admit | None:
        e = self.engine
        mem = e.adapters
        q = self.queues[i]
        wait = self.predicted_wait(head)
        t_step = self._t_step or float(e.profile.backbone_s(0, 1, 0))
        now = e.now
        j = 1
        scanned = 0
        while j < len(q) and scanned < self.max_scan:
            rid = q[j]
            scanned += 1
            a = e.adapter_a[rid]
            s = self.tok[rid]
            fits = a < 0 or (mem.resident[a] and a not in mem.loading)
            if not fits or (self.used[i] + s > self.quota[i] and self.used[i] > 0):
                j += 1
                continue
            # the head's predicted wait changes from step to step (running requests progress,
            # free memory shrinks): a decision that compared against it is re-taken every step
            self._time_dependent = True
            if self.pred[rid] * t_step >= wait:
                j += 1
                continue
            r = ctx.try_admit(rid)
            if r == Admit.OK:
                del q[j]
                self.used[i] += s
                self.bypasses += 1
                e.push_event(now + wait, lambda t, b=rid, h=head: self._check_squash(b, h))
                continue
            if r == Admit.NO_SLOT:
                j += 1
                continue
            return r
        return None

    def _check_squash(self, bypasser: int, head: int) -> None:
        """The prediction proved wrong: the bypasser outlived the head's predicted wait."""
        e = self.engine
        if bypasser in e.running and head not in e.running and e.state[head] == RequestState.PENDING and head in self.qof:
            self.squashes += 1
            e.squash(bypasser)

    # ------------------------------------------------------------------ events
    def on_preempt(self, rid: int) -> None:
        q = self.qof.get(rid, 0)
        if q >= len(self.queues):
            q = self.queue_of(rid)
        self.qof[rid] = q
        self.used[q] -= self.tok[rid]
        self.queues[q].appendleft(rid)

    def on_finish(self, rid: int) -> None:
        q = self.qof.pop(rid, None)
        if q is not None and q < len(self.used):
            self.used[q] -= self.tok[rid]

    def prefetch(self, now: float) -> Iterable[int]:
        """S-LoRA's prefetch, for the requests at the heads of Chameleon's queues."""
        ad = self.engine.adapter_a
        for q in self.queues:
            for j, rid in enumerate(q):
                if j >= self.prefetch_heads:
                    break
                if ad[rid] >= 0:
                    yield ad[rid]

    def next_change_time(self, stop: Admit | None) -> float:
        if stop == Admit.NO_SEQ:
            return INF
        if self._time_dependent:
            return -INF
        return self.engine.next_arrival_time()

    def stats(self) -> dict:
        return {"chameleon_queues": self.n_queues, "chameleon_cutoffs": [round(c, 4) for c in self.cuts],
                "chameleon_quotas": [round(q) if q < INF else None for q in self.quota],
                "chameleon_refreshes": self.refreshes, "chameleon_bypasses": self.bypasses,
                "chameleon_squashes": self.squashes}


@register_scheduler
class ChameleonStaticScheduler(ChameleonScheduler):
    name = "chameleon-static"
    description = "Chameleon with 4 static equal-population queues and equal quotas (the paper's static variant)"
    citation = ChameleonScheduler.citation

    def __init__(self, **kw) -> None:
        kw.setdefault("static", True)
        super().__init__(**kw)


@register_scheduler
class ChameleonOutputOnlyScheduler(ChameleonScheduler):
    name = "chameleon-output-only"
    description = "Chameleon with WRS = predicted output / max output (no input or rank term)"
    citation = ChameleonScheduler.citation

    def __init__(self, **kw) -> None:
        kw.setdefault("wrs", "output")
        super().__init__(**kw)


# ---------------------------------------------------------------------- the cache
@register_cache
class ChameleonCache(IdleTracking):
    name = "chameleon"
    description = "adapter cache in idle GPU memory; keep queued requests' adapters; evict min F*Freq+R*Rec+S*Size"
    citation = "Iliakopoulou et al., Chameleon, MICRO'25, §4.2"
    adapter_memory = "unified"
    F, R, S = 0.45, 0.10, 0.45

    def __init__(self, F: float | None = None, R: float | None = None, S: float | None = None, **memory) -> None:
        super().__init__(**memory)
        if F is not None:
            self.F = F
        if R is not None:
            self.R = R
        if S is not None:
            self.S = S
        self.last_use: dict[int, float] = {}

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.stats_ = ArrivalStats(engine)
        self.size = np.asarray(engine.adapters.bytes, float)

    def on_active(self, a: int, now: float) -> None:
        super().on_active(a, now)
        self.last_use[a] = now

    def on_idle(self, a: int, now: float) -> None:
        super().on_idle(a, now)
        self.last_use[a] = now

    def scores(self, cands: list[int], now: float) -> np.ndarray:
        """``F*Frequency + R*Recency + S*Size`` over features normalised among ``cands``."""
        self.stats_.update()
        c = np.asarray(cands, np.int64)
        freq = self.stats_.count[c].astype(float)
        last = np.array([self.last_use.get(int(a), 0.0) for a in c])
        size = self.size[c]
        fmax = freq.max() if len(freq) else 0.0
        f_n = freq / fmax if fmax > 0 else np.zeros(len(c))
        lo, hi = (last.min(), last.max()) if len(last) else (0.0, 0.0)
        r_n = (last - lo) / (hi - lo) if hi > lo else np.zeros(len(c))
        s_n = size / size.max() if len(size) and size.max() > 0 else np.zeros(len(c))
        return self.F * f_n + self.R * r_n + self.S * s_n

    def victim(self, now: float) -> int:
        cands = sorted(self.idle)
        queued = waiting_adapter_counts(self.engine)
        free = [a for a in cands if queued[a] == 0]
        group = free or cands  # adapters of queued requests only when memory forces it
        sc = self.scores(group, now)
        return group[int(np.argmin(sc))]


@register_cache
class FairShareCache(ChameleonCache):
    name = "fairshare"
    description = "Chameleon's cache with equal weights F = R = S = 1/3"
    citation = "Chameleon MICRO'25 §6 (FairShare baseline)"
    F = R = S = 1.0 / 3.0


@register_cache
class ChameleonPrefetchCache(ChameleonCache):
    """Chameleon's cache plus histogram-based predictive prefetch (see the module docstring).

    Every ``bin_s`` the inter-arrival times of each adapter's requests so far form a
    histogram (bins of ``bin_s``); an adapter idle for at least its ``head_pct`` percentile
    inter-arrival time, and not longer than its ``tail_pct`` percentile, is about to be
    requested again and is prefetched into free memory (no eviction for a prefetch).
    """

    name = "chameleon+prefetch"
    description = "Chameleon cache + histogram (inter-arrival) predictive prefetch into free memory"
    citation = "Chameleon MICRO'25 §4.2; histogram pre-warming as in Shahrad et al., ATC'20"
    prefetch_evicts = False

    def __init__(self, bin_s: float = 1.0, head_pct: float = 5.0, tail_pct: float = 99.0, min_samples: int = 5,
                 **kw) -> None:
        super().__init__(**kw)
        self.bin_s = bin_s
        self.head_pct, self.tail_pct = head_pct, tail_pct
        self.min_samples = min_samples
        self.wanted: list[int] = []

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.iat: list[list[float]] = [[] for _ in range(engine.n_adapters)]
        self.window: list[tuple[float, float] | None] = [None] * engine.n_adapters  # (head, tail) percentiles
        self.prev = np.full(engine.n_adapters, -INF)
        self.ptr = 0

    @property
    def tick_interval(self) -> float | None:
        return self.bin_s

    def on_tick(self, now: float) -> None:
        e = self.engine
        hi = e.arr_ptr
        changed = set()
        for rid in range(self.ptr, hi):
            a = e.adapter_a[rid]
            if a < 0:
                continue
            t = e.arrival_a[rid]
            if self.prev[a] > -INF:
                self.iat[a].append(math.floor((t - self.prev[a]) / self.bin_s) * self.bin_s)
                changed.add(a)
            self.prev[a] = t
        self.ptr = hi
        for a in changed:
            xs = self.iat[a]
            if len(xs) >= self.min_samples:
                h = np.asarray(xs[-1000:])
                self.window[a] = (float(np.percentile(h, self.head_pct)), float(np.percentile(h, self.tail_pct)))
        want = []
        for a, win in enumerate(self.window):
            if win is None:
                continue
            head, tail = win
            xs = self.iat[a]
            idle = now - self.prev[a]
            if head <= idle <= tail + self.bin_s:
                want.append((-len(xs), a))
        want.sort()
        self.wanted = [a for _, a in want]

    def prefetch(self, now: float) -> Iterable[int]:
        res = self.engine.adapters.resident
        return [a for a in self.wanted if not res[a]]


register_preset(Preset("chameleon", "chameleon", "chameleon", "Chameleon: WRS multi-queue scheduler + adapter cache in "
                       "idle memory (on S-LoRA's unified pool)", "Iliakopoulou et al., MICRO'25"))
register_preset(Preset("chameleon-nocache", "chameleon", "none", "Chameleon's scheduler without its cache "
                       "(S-LoRA discards idle adapters)", "Chameleon MICRO'25 §6", cache_opts={"adapter_memory": "unified"}))
register_preset(Preset("chameleon-nosched", "slora", "chameleon", "Chameleon's cache with S-LoRA's FIFO scheduler",
                       "Chameleon MICRO'25 §6"))
register_preset(Preset("chameleon-lru", "chameleon", "lru", "Chameleon's scheduler with an LRU adapter cache in idle "
                       "memory", "Chameleon MICRO'25 §6", cache_opts={"adapter_memory": "unified"}))
register_preset(Preset("chameleon-fairshare", "chameleon", "fairshare", "Chameleon's scheduler with the FairShare "
                       "cache (equal weights)", "Chameleon MICRO'25 §6"))
register_preset(Preset("chameleon+prefetch", "chameleon", "chameleon+prefetch", "Chameleon with histogram-based "
                       "predictive prefetch", "Chameleon MICRO'25 §4.2"))
register_preset(Preset("chameleon-static", "chameleon-static", "chameleon", "Chameleon with 4 static equal queues "
                       "and equal quotas", "Chameleon MICRO'25 §6"))
register_preset(Preset("chameleon-output-only", "chameleon-output-only", "chameleon", "Chameleon with an "
                       "output-only WRS", "Chameleon MICRO'25 §6"))
