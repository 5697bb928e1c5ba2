"""Chameleon: adaptive caching and scheduling for many-adapter LLM inference.

Iliakopoulou et al., *Chameleon: Adaptive Caching and Scheduling for Many-Adapter LLM
Inference Environments*, MICRO 2025 (the project's summary: ``shared/refs/chameleon.md``).
Chameleon extends S-LoRA (unified memory pool of KV and adapter weights, iteration-level
batching) with a scheduler and a cache. Each rule below follows the paper as written; where
the paper leaves a choice open or where we depart from it, the choice is a named constructor
argument (listed by ``get_params()``) with its reason here.

**The scheduler** (§4.3, :class:`ChameleonScheduler`):

1. *Weighted request size* (WRS)::

       WRS = (A * in/max_in + B * out_pred/max_out) * rank/max_rank,   A = 0.4, B = 0.6

   (``in``: prompt tokens, ``out_pred``: predicted output tokens, ``rank``: the adapter's rank;
   the maxima -- whose source the paper does not give -- are those seen so far). ``wrs="output"``
   (the ``chameleon-output-only`` variant) ranks by ``out_pred/max_out`` alone.
2. *Output predictor*: ``accuracy=0.8`` by default, the paper's BERT proxy model's ~80 %
   (:class:`policies.common.OutputPredictor`: a wrong guess is another request's length).
3. *Queues*: K-means over the WRS of the requests of the last ``refresh_s`` with K in 1..4;
   the cut-offs are the midpoints between consecutive sorted centroids; queue 1 holds the
   smallest WRS. **Departure** ``k_rule="elbow"`` (default): the paper picks "the K with
   minimal WCSS", which is always the largest K since WCSS never grows with K; the elbow
   takes the smallest K whose next queue would cut the WCSS by less than ``elbow`` (10 %) of
   the one-queue WCSS. ``k_rule="min-wcss"`` is the literal rule, ``k=`` forces a K.
   ``static=True`` (``chameleon-static``): 4 equal-population queues with equal quotas.
4. *Request size in quota tokens*: a request borrows ``in + out_pred`` tokens at admission and
   returns them at completion, plus its adapter's memory in KV-token units
   (:meth:`twin.interfaces.EngineView.adapter_tokens`: S-LoRA's ``4 * rank`` slots).
   ``adapter_charge`` (the paper says quotas "count the adapter's memory" but not how shared
   adapters count): ``"queue"`` (default) charges an adapter once per queue while any running
   request of that queue uses it -- S-LoRA's admission counts ``4r`` per *distinct* adapter of
   the batch (``slora.md`` §2) --; ``"request"`` charges it to every request; ``"none"``
   leaves adapters out (the twin's earlier reading).
5. *Quotas*: every queue gets at least the tokens an M/M/1 queue needs to meet the SLO::

       Tok_min_i = S_i * D_i * (1/SLO + lambda_i)

   with ``S_i`` the **largest** request size of the queue over the refresh window (tokens:
   prompt + predicted output + adapter tokens; ``size_stat="mean"`` is the twin's earlier
   reading), ``D_i`` the mean predicted service time of its requests (predicted output x the
   measured time per engine step) and ``lambda_i`` its arrival rate over the window. ``SLO``
   is ``slo_s`` or 5x an unloaded request's estimated execution time, its prefill and its
   predicted output's decode steps, priced by the engine it runs on (the paper: "5x the mean low-load
   execution time"; :meth:`twin.interfaces.EngineView.unloaded_service_s`: on the S-LoRA engine its Punica
   LoRA cost, until stop 56 the vLLM profile's kernel grid). ``twin run --ttft-slo`` only scores SLO
   attainment; Chameleon's quota SLO is this option (``twin run --scheduler-opt slo_s=5``; ``ChameleonScheduler(slo_s=5)``).
   The capacity ``Tok_total`` is the KV pool in tokens (adapters included, as in S-LoRA's
   unified pool). The paper splits the remainder ``Tok_total - sum(Tok_min)`` "in proportion to initial weights", which it does not define:
   ``remainder="demand"`` (default) weighs each queue by its token demand ``lambda_i * S_i``,
   ``remainder="equal"`` splits it evenly. When the minima exceed the capacity (unspecified)
   they are scaled down proportionally. This is not a corner case: at the reproductions' loads
   (``twin reproduce chameleon-*``) the minima (the largest request of each queue times its
   service time and its rate) add up to several times ``Tok_total``, so the quotas there come
   from this scale-down and the ``remainder`` option does not act. The run summary counts the
   refreshes where it happened (``chameleon_quota_scaled_refreshes``) and gives the last one's
   sum of minima over the pool (``chameleon_quota_min_over_pool``).
6. *Batch formation* (Algorithm 1), every step: ``put_batch(q, budget)`` scans a queue in
   FIFO order and **stops** at the first request whose size exceeds the budget left (no
   skipping); it also stops at a request the engine refuses for memory. Quotas bound
   occupancy, so a queue's phase-1 budget is ``quota - tokens it holds``.
   *Phase 1*: from the smallest queue to the largest, ``put_batch(q, quota_q - used_q)``; if
   ``q`` is now **empty**, its unused quota joins ``leftover``; a queue blocked by a request
   that does not fit contributes nothing. *Phase 2*: from the smallest queue, while
   ``leftover > 0``, ``put_batch(q, leftover)`` and subtract what it took.
   Options: ``leftover_from="emptied"`` (Algorithm 1; ``"all"``: the spare quota of every
   queue, the twin's earlier reading); ``leftover_charge`` -- the paper does not say which
   queue is charged for tokens taken from the leftover: ``"lender"`` (default) charges the
   queues that gave them (the emptied queue with the most spare left; its quota is occupied
   until they return), ``"queue"`` (the twin's earlier default) charges the request's own
   queue (it may then sit above its quota until they return), ``"pool"`` charges a separate
   borrowing account, so the queue's own quota stays free. *Why* ``"lender"``: the paper's
   quotas are token budgets that requests **borrow** at admission and **return** at
   completion, so that a quota bounds its queue's occupancy, and the quotas split
   ``Tok_total`` (each queue an M/M/1 server with its own ``Tok`` tokens). The leftover *is*
   the emptied queues' unused quota (``quota_q - consumed``), so tokens taken from it are
   those queues' tokens; charging them to the lender keeps every token of the pool counted
   against exactly one quota (the occupancy summed over queues never exceeds ``Tok_total``,
   up to one request's overshoot of a lender's spare). Under ``"queue"`` and ``"pool"`` the
   lender's quota still counts as free while its tokens are lent, so the quotas together
   promise more memory than the pool holds and a queue within its quota can find the memory
   gone (``results/policies/chameleon-as-written.md``: the middle queue's starvation at the
   knee). At a refresh, running requests are re-charged to their own (new) queues;
   ``oversize_head="wait"`` (Algorithm 1: a head larger than its queue's remaining quota waits
   for leftover; ``"admit-alone"``: a queue with nothing running may admit its head whatever
   its size, the twin's earlier rule). **Departure** ``idle_admit=True``: when nothing at all
   runs and Algorithm 1 admits nothing (every non-empty queue's head exceeds its quota and no
   queue is empty), the head of the smallest non-empty queue is admitted -- otherwise the
   server would stay idle for ever (a deadlock the paper's rules allow when ``Tok_min_i <
   S_i``).
7. *Opportunistic bypass* (``bypass=True``): the trigger is a queue head R1 that fits its
   quota but that the engine refuses for memory (``NO_SLOT`` or ``NO_KV``: the pool is full
   after every idle cached adapter was counted as evictable) while its adapter is not
   resident. A younger R2 of the **same queue** (within the queue's quota, scanning at most
   ``max_scan`` requests) goes first when R1's predicted wait for memory exceeds R2's
   predicted execution time; the engine decides whether R2 (cached adapter, or one that
   fits) can run. *Squash*: at every finish while R2 runs, if the memory R1 needs is there
   once R2's own memory (its KV, and its adapter when it is the last user) is counted, R2 is
   squashed (its progress lost) and queued right behind R1; the same test runs once more at
   R1's predicted wait (memory may have appeared without a finish, e.g. an eviction). A
   bypasser that outlives the prediction while R1's memory is still missing runs on: the paper
   squashes only when R1's memory appears (before stop 51 the twin squashed it at the
   predicted wait regardless). The paper's "at most 5 % of requests are squashed" is read as
   its observation, not a cap. Predicted times: ``predicted output x time per step``; R1's wait
   frees running requests in predicted finish order until its adapter and first prompt chunk
   fit. On the S-LoRA engine "R1's memory" is S-LoRA's admission test (``slora.md`` section 2:
   reservations of every running request's peak KV, ``4r`` slots per distinct adapter), not free
   memory: the squash test and R1's predicted wait ask the engine's own test whether R1 would be
   admitted were R2 (or the requests predicted to finish first) gone (``SLoRAEngine.admits_without``);
   the free-memory reading squashed bypassers while S-LoRA still refused R1.
8. Queues, cut-offs and quotas are recomputed every ``T_refresh = refresh_s = 300`` s.
9. *Queued-request prefetch* (the paper keeps S-LoRA's: ``chameleon.md`` sections 1-2, checklist 1;
   on with S-LoRA's ``--prefetch``, ``EngineConfig.slora_prefetch``, as in ``twin reproduce chameleon-*``):
   the adapters of the first ``prefetch_heads = 2`` waiting requests of each queue (the twin's
   choice: the paper does not say which requests; S-LoRA's own ``next_batch`` prefix,
   :class:`policies.slora.SLoRAScheduler`, can name more), into free pool memory only
   (``prefetch_evicts = False``), loaded as S-LoRA's loader loads them
   (:class:`twin.slora_engine.SLoRAPrefetcher`): in order, with no bound on the copies in flight,
   stopping at the first adapter whose slots exceed the free ones (``slora.md`` section 4; the twin
   earlier bounded them at 4 in flight and skipped an adapter that did not fit).

**The cache** (§4.2, :class:`ChameleonCache`): adapters stay in otherwise idle GPU memory of
the unified pool, resized every step against the batch's memory needs (the engine evicts
idle adapters before it would refuse or preempt, :meth:`twin.extensions.Extensions.reclaim`);
an adapter with running requests is never evicted; the adapters of queued requests are kept
unless memory forces it; among the others the victim has the lowest::

    Score = F * Frequency + R * Recency + S * Size,   F = 0.45, R = 0.10, S = 0.45

over features normalised to [0, 1] among the candidates (the paper gives no normalisation):
frequency = the adapter's requests that arrived within the last ``freq_window_s`` (the paper's
"specific time frame", unspecified; default 300 s, the scheduler's refresh period, the
paper's other notion of "recent"; ``None`` counts every request so far, the twin's earlier
reading) divided by the largest such count; recency = 1 for the most recently used, 0 for
the least (linear in the last-use time); size = bytes / the largest (a larger adapter costs
more to bring back). ``fairshare`` weighs the three equally. ``chameleon+prefetch`` adds the
optional predictive prefetch: a histogram of each adapter's request inter-arrival times (as in
Shahrad et al., "Serverless in the Wild", ATC'20) gives a pre-warm time (the 5th percentile):
when an adapter has been idle that long it is prefetched into free memory.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Iterable

import numpy as np

from policies.caches import IdleTracking
from policies.common import OutputPredictor, WindowedArrivalCounts, kmeans_1d
from twin.interfaces import Admit, EngineView, Scheduler
from twin.registry import Preset, register_cache, register_preset, register_scheduler
from twin.requests import RequestState

INF = math.inf
A_IN, B_OUT = 0.4, 0.6
_MEMORY_REFUSALS = (Admit.NO_SLOT, Admit.NO_KV)
_GLOBAL_STOPS = (Admit.NO_BUDGET, Admit.NO_SEQ)



def weighted_request_size(prompt, output, rank, max_in, max_out, max_rank):
    """Chameleon's weighted request size (WRS, §4.3): ``(A*In/MaxIn + B*Out/MaxOut) * (Adapter/MaxAdapter)``
    with A = 0.4, B = 0.6 and the adapter's rank (at least 1) as its size; numbers or numpy arrays
    alike (the same operations in the same order). The scheduler passes the predicted output and the
    maxima seen so far; a measurement of the requests' true sizes passes the true lengths and the
    workload's maxima (``twin.reproduce.chameleon``)."""
    return (A_IN * prompt / max_in + B_OUT * (output / max_out)) * rank / max_rank


_CHOICES = {"k_rule": ("elbow", "min-wcss"), "wrs": ("full", "output"), "size_stat": ("max", "mean"),
            "adapter_charge": ("queue", "request", "none"), "leftover_from": ("emptied", "all"),
            "leftover_charge": ("lender", "queue", "pool"), "oversize_head": ("wait", "admit-alone"),
            "remainder": ("demand", "equal")}


@register_scheduler
class ChameleonScheduler(Scheduler):
    name = "chameleon"
    description = "WRS-based multi-queue scheduler with M/M/1 token quotas, two-phase batching and bypass (Chameleon)"
    citation = "Iliakopoulou et al., Chameleon, MICRO'25, §4.3, Algorithm 1"
    uses_events = True
    prefetch_evicts = False

    def __init__(self, k: int | None = None, k_rule: str = "elbow", elbow: float = 0.1, refresh_s: float = 300.0,
                 slo_s: float | None = None, accuracy: float = 0.8, seed: int = 0, min_samples: int = 100,
                 bypass: bool = True, static: bool = False, wrs: str = "full", max_scan: int = 16,
                 prefetch_heads: int = 2, size_stat: str = "max", adapter_charge: str = "queue",
                 leftover_from: str = "emptied", leftover_charge: str = "lender", oversize_head: str = "wait",
                 idle_admit: bool = True, remainder: str = "demand") -> None:
        if k is not None and not 1 <= k <= 4:
            raise ValueError(f"Chameleon uses 1 to 4 queues, got k={k}")
        for key, val in (("k_rule", k_rule), ("wrs", wrs), ("size_stat", size_stat),
                         ("adapter_charge", adapter_charge), ("leftover_from", leftover_from),
                         ("leftover_charge", leftover_charge), ("oversize_head", oversize_head),
                         ("remainder", remainder)):
            if val not in _CHOICES[key]:
                raise ValueError(f"chameleon: {key} must be one of {_CHOICES[key]}, got {val!r}")
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"chameleon: accuracy must be in [0, 1], got {accuracy}")
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
        self.size_stat = size_stat
        self.adapter_charge = adapter_charge
        self.leftover_from = leftover_from
        self.leftover_charge = leftover_charge
        self.oversize_head = oversize_head
        self.idle_admit = idle_admit
        self.remainder = remainder

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
        self.used: list[float] = [0.0, 0.0]    # per queue, then the phase-2 borrowing account
        self.ad_users: list[dict[int, int]] = [{}, {}]  # per account: running requests per adapter
        self.qof: dict[int, int] = {}          # queue of each waiting or running request
        self.acct: dict[int, int] = {}         # account charged for each running request
        self.arrived: list[int] = []           # valid arrivals, in order (statistics window)
        self.initialized = False
        self.n_queues = 1
        self.refreshes = 0
        self.scaled_refreshes = 0      # refreshes whose M/M/1 minima exceeded the pool (scaled down)
        self.min_over_total = math.nan  # the last refresh's sum of minima / Tok_total
        self.bypasses = 0
        self.squashes = 0
        self.idle_admits = 0
        self.admitted_tokens = [[0.0], [0.0]]  # per phase (1, 2), per queue: tokens admitted so far
        #: why put_batch stopped, per (phase, queue, reason): "quota" or the engine's refusal (a diagnostic)
        self.stop_counts: dict[tuple[int, int, str], int] = {}
        self.pending_bypass: dict[int, int] = {}  # bypasser -> head it went before
        self._squashed_for: dict[int, int] = {}   # squashed bypasser -> its head (re-queued behind it)
        self._last_steps = 0
        self._last_t = 0.0
        self._t_step: float | None = None
        self._time_dependent = False
        self.slo_target_s = self.slo_s
        if self.slo_target_s is None:  # 5x the mean low-load execution time (the paper's SLO, §6.1)
            self.slo_target_s = 5.0 * self.mean_low_load_execution_s()

    def mean_low_load_execution_s(self) -> float:
        """The mean low-load execution time over the workload's requests (§6.1's SLO base): a request of the mean
        prompt and mean predicted output alone on the engine, at each request's own adapter rank (1 for a
        base-model request), averaged over the requests (the rank of the slots, the largest, overstated it)."""
        e = self.engine
        if not e.n:
            return e.unloaded_service_s(512.0, 128.0, max(int(e.max_lora_rank), 1))
        mean_in, mean_out = float(e.prompt.mean()), float(self.pred.pred.mean())
        ranks, counts = np.unique(np.where(e.adapter >= 0, e.rank, 1), return_counts=True)
        return float(sum(int(c) * e.unloaded_service_s(mean_in, mean_out, int(r))
                         for r, c in zip(ranks.tolist(), counts.tolist())) / e.n)

    tick_option = "refresh_s"

    @property
    def tick_interval(self) -> float | None:
        return self.refresh_s

    def capacity_tokens(self) -> int:
        """``Tok_total``: the pool in tokens (KV and, in a unified pool, adapters)."""
        e = self.engine
        return int(e.pool_blocks * e.block_size)

    @property
    def pool_account(self) -> int:
        """Index of the account charged for phase-2 admissions under ``leftover_charge="pool"``."""
        return len(self.queues)

    # ------------------------------------------------------------------ WRS and queues
    def weighted_size(self, rid: int) -> float:
        """The request's WRS (§4.3; output-only when ``wrs='output'``)."""
        e = self.engine
        if self.wrs == "output":
            return self.pred[rid] / self.max_out
        r = int(e.rank[rid]) if e.adapter[rid] >= 0 else 0
        return weighted_request_size(float(e.prompt_a[rid]), self.pred[rid], max(r, 1), self.max_in, self.max_out,
                                     self.max_rank)

    def queue_of(self, rid: int) -> int:
        return bisect.bisect_right(self.cuts, self.weighted_size(rid))

    def request_tokens(self, rid: int) -> int:
        """A request's size in quota tokens when it brings its adapter: prompt + predicted
        output + the adapter's memory in KV-token units (the paper's S in tokens)."""
        return self.tok[rid] + (self.engine.adapter_tokens(self.engine.adapter_a[rid])
                                if self.adapter_charge != "none" else 0)

    def need(self, rid: int, acct: int) -> int:
        """Quota tokens ``rid`` would borrow from account ``acct`` (its adapter counted unless
        a running request charged to the same account already brought it)."""
        s = self.tok[rid]
        ch = self.adapter_charge
        if ch == "none":
            return s
        a = self.engine.adapter_a[rid]
        if a < 0 or (ch == "queue" and self.ad_users[acct].get(a, 0)):
            return s
        return s + self.engine.adapter_tokens(a)

    def charge(self, rid: int, acct: int) -> None:
        self.used[acct] += self.need(rid, acct)
        self.acct[rid] = acct
        a = self.engine.adapter_a[rid]
        if a >= 0:
            u = self.ad_users[acct]
            u[a] = u.get(a, 0) + 1

    def release(self, rid: int) -> None:
        acct = self.acct.pop(rid, None)
        if acct is None or acct >= len(self.used):
            return
        a = self.engine.adapter_a[rid]
        back = self.tok[rid]
        if a >= 0:
            u = self.ad_users[acct]
            u[a] -= 1
            if u[a] == 0:
                del u[a]
                if self.adapter_charge == "queue":
                    back += self.engine.adapter_tokens(a)
            if self.adapter_charge == "request":
                back += self.engine.adapter_tokens(a)
        self.used[acct] -= back

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

    def queue_minimum(self, sizes: np.ndarray, outs: np.ndarray, lam: float, t_step: float) -> float:
        """``Tok_min = S * D * (1/SLO + lambda)`` of one queue (§4.3) from its recent requests'
        sizes in tokens and predicted outputs; ``S`` their maximum (``size_stat="max"``) or mean."""
        S = float(sizes.max() if self.size_stat == "max" else sizes.mean())
        D = float(outs.mean()) * t_step
        return S * D * (1.0 / self.slo_target_s + lam)

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
            size = np.array([self.request_tokens(r) for r in recent], float)
            out = np.array([self.pred[r] for r in recent], float)
            tok_min = np.zeros(k)
            demand = np.zeros(k)
            for i in range(k):
                m = lab == i
                if not m.any():
                    continue
                lam = m.sum() / span
                tok_min[i] = self.queue_minimum(size[m], out[m], lam, t_step)
                demand[i] = lam * size[m].mean()
            quota = self.split_quotas(tok_min, demand if self.remainder == "demand" else np.ones(k), total)
            need = float(tok_min.sum())
            if need >= total and need > 0:  # the minima alone exceed the pool: scaled down (unspecified)
                self.scaled_refreshes += 1
            self.min_over_total = need / total if total > 0 else math.inf
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
        requeued = set(waiting)
        for r in list(self._squashed_for):  # a squashed bypasser stays right behind its head
            if r not in requeued:  # (admitted again since: its qof may still name a queue of the previous k)
                continue
            h = self._squashed_for[r]
            q = self.queues[self.qof[r]]
            if h in self.qof and self.qof[h] == self.qof[r] and r in q and h in q:
                q.remove(r)
                q.insert(q.index(h) + 1, r)
        old_pool = self.acct
        pool = len(self.used) - 1
        self.used = [0.0] * (k + 1)
        self.ad_users = [{} for _ in range(k + 1)]
        self.acct = {}
        self.admitted_tokens = [self._resize(self.admitted_tokens[0], k), self._resize(self.admitted_tokens[1], k)]
        for r in e.running:
            if r in self.qof:
                q = self.queue_of(r)
                self.qof[r] = q
                self.charge(r, k if old_pool.get(r) == pool else q)

    def _count(self, phase: int, i: int, tokens: float) -> None:
        """Tokens admitted in ``phase`` (1 or 2) from queue ``i`` (a diagnostic counter)."""
        xs = self.admitted_tokens[phase - 1]
        if i >= len(xs):
            xs.extend([0.0] * (i + 1 - len(xs)))
        xs[i] += tokens

    @staticmethod
    def _resize(xs: list[float], k: int) -> list[float]:
        return (xs + [0.0] * k)[:k]

    @staticmethod
    def split_quotas(tok_min: np.ndarray, weights: np.ndarray, total: float) -> list[float]:
        """Per-queue token quotas: the M/M/1 minima, then the remainder in proportion to
        ``weights`` (the paper's undefined "initial weights"); minima above the capacity
        are scaled down proportionally (unspecified in the paper)."""
        s = float(tok_min.sum())
        if s >= total and s > 0:
            return (total * tok_min / s).tolist()
        rem = total - s
        d = float(weights.sum())
        share = weights / d if d > 0 else np.full(len(tok_min), 1.0 / max(len(tok_min), 1))
        return (tok_min + rem * share).tolist()

    # ------------------------------------------------------------------ batch formation (Algorithm 1)
    def put_batch(self, ctx, i: int, budget: float, acct: int, phase: int,
                  lenders: dict[int, float] | None = None) -> tuple[float, Admit | None]:
        """Admit queue ``i``'s requests in FIFO order while they fit ``budget`` (charged to
        ``acct``); stop at the first that does not fit or that the engine refuses. Returns
        the tokens consumed and the engine's refusal (None: the budget or the queue ran out).
        ``lenders`` (phase 2 under ``leftover_charge="lender"``): the spare quota of each queue
        that gave to the leftover; each admission is charged to the lender with the most spare
        left (the smaller queue on a tie) and reduces its spare."""
        q = self.queues[i]
        consumed = 0.0
        alone = phase == 1 and self.oversize_head == "admit-alone"
        while q:
            rid = q[0]
            if lenders:
                acct = max(lenders, key=lambda j: (lenders[j], -j))
            s = self.need(rid, acct)
            if consumed + s > budget and not (alone and self.used[acct] <= 0 and not consumed):
                key = (phase, i, "quota")
                self.stop_counts[key] = self.stop_counts.get(key, 0) + 1
                return consumed, None
            r = ctx.try_admit(rid)
            if r == Admit.OK:
                q.popleft()
                self.charge(rid, acct)
                consumed += s
                self._count(phase, i, s)
                if lenders:
                    lenders[acct] -= s
                continue
            key = (phase, i, r.name)
            self.stop_counts[key] = self.stop_counts.get(key, 0) + 1
            if phase == 1 and self.bypass and r in _MEMORY_REFUSALS and self._adapter_missing(rid):
                took, stop = self._bypass(ctx, i, rid, budget - consumed, acct)
                consumed += took
                if stop in _GLOBAL_STOPS:
                    return consumed, stop
            return consumed, r
        return consumed, None

    def schedule_waiting(self, ctx) -> Admit | None:
        """Algorithm 1 (see the module docstring, item 6)."""
        self._time_dependent = False
        n_before = len(ctx.admitted)
        stop: Admit | None = None
        leftover = 0.0
        spare: dict[int, float] = {}  # what each queue gave to the leftover
        for i, q in enumerate(self.queues):  # phase 1: smallest queue first, each within its quota
            took, r = self.put_batch(ctx, i, self.quota[i] - self.used[i], i, 1)
            if r in _GLOBAL_STOPS:
                return r
            stop = r or stop
            if not q or self.leftover_from == "all":
                gave = max(self.quota[i] - self.used[i], 0.0)
                leftover += gave
                if gave > 0:
                    spare[i] = gave
        charge = self.leftover_charge
        for i, q in enumerate(self.queues):  # phase 2: the pooled leftover, smallest queue first
            if leftover <= 0:
                break
            if not q:
                continue
            acct = self.pool_account if charge == "pool" else i
            took, r = self.put_batch(ctx, i, leftover, acct, 2, spare if charge == "lender" else None)
            leftover -= took
            if r in _GLOBAL_STOPS:
                return r
            stop = r or stop
        if self.idle_admit and len(ctx.admitted) == n_before and not self.engine.running:
            for i, q in enumerate(self.queues):  # nothing runs, nothing fits a quota: avoid a deadlock
                if q:
                    rid = q[0]
                    r = ctx.try_admit(rid)
                    if r == Admit.OK:
                        q.popleft()
                        self._count(1, i, self.need(rid, i))
                        self.charge(rid, i)
                        self.idle_admits += 1
                        return None
                    return r
        return stop

    def _adapter_missing(self, rid: int) -> bool:
        """``rid``'s adapter is not (yet) usable in GPU memory."""
        a = self.engine.adapter_a[rid]
        mem = self.engine.adapters
        return a >= 0 and (not mem.resident[a] or a in mem.loading)

    def remaining_s(self, rid: int, t_step: float) -> float:
        """Predicted time until running request ``rid`` finishes."""
        e = self.engine
        emitted = e.emitted_now(rid) if e.is_decoding(rid) else 0
        return max(self.pred[rid] - emitted, 1) * t_step

    def head_need_tokens(self, head: int) -> int:
        """Pool tokens the head needs to be admitted: its adapter and its first prompt chunk."""
        e = self.engine
        return e.adapter_tokens(e.adapter_a[head]) + min(e.tokens_known(head), e.config.max_num_batched_tokens)

    def predicted_wait(self, head: int) -> float:
        """When the head's adapter is predicted to fit: running requests finish in predicted
        order, freeing their KV (and their adapter's memory, when they are its last user),
        until the head's adapter and first chunk fit in the pool (free + reclaimable). On the
        S-LoRA engine, until S-LoRA's admission test admits the head with those requests gone
        (``SLoRAEngine.admits_without``; see :meth:`head_fits_without`)."""
        e = self.engine
        t_step = self._t_step or float(e.profile.backbone_s(0, 1, 0))
        runs = sorted(e.running, key=lambda r: self.remaining_s(r, t_step))
        if not runs:
            return 0.0
        admits = getattr(e, "admits_without", None)
        if admits is not None:
            # the fewest predicted finishes after which the engine admits the head: fewer running requests only
            # lower S-LoRA's need and free slots, so the answer is monotone in the count -- a bisection
            if not admits(head, runs):
                return self.remaining_s(runs[-1], t_step)
            lo, hi = 1, len(runs)
            while lo < hi:
                mid = (lo + hi) // 2
                if admits(head, runs[:mid]):
                    hi = mid
                else:
                    lo = mid + 1
            return self.remaining_s(runs[lo - 1], t_step)
        users: dict[int, int] = {}
        for r in runs:
            b = e.adapter_a[r]
            users[b] = users.get(b, 0) + 1
        if getattr(e.adapters, "placement", None) is None:  # vLLM slots: the first adapter whose last request ends
            for r in runs:
                b = e.adapter_a[r]
                users[b] -= 1
                if b >= 0 and users[b] == 0:
                    return self.remaining_s(r, t_step)
            return self.remaining_s(runs[-1], t_step)
        bs = e.block_size
        deficit = self.head_need_tokens(head) - (e.free_blocks + e.reclaimable_blocks()) * bs
        for r in runs:
            deficit -= e.kv_blocks_held(r) * bs
            b = e.adapter_a[r]
            if b >= 0:
                users[b] -= 1
                if users[b] == 0:
                    deficit -= e.adapter_tokens(b)
            if deficit <= 0:
                return self.remaining_s(r, t_step)
        return self.remaining_s(runs[-1], t_step)

    def _bypass(self, ctx, i: int, head: int, budget: float, acct: int) -> tuple[float, Admit | None]:
        """§4.3 opportunistic bypass: younger requests of queue ``i`` that fit its quota and are
        predicted to finish before the head's memory frees go first."""
        e = self.engine
        q = self.queues[i]
        wait = self.predicted_wait(head)
        t_step = self._t_step or float(e.profile.backbone_s(0, 1, 0))
        now = e.now
        consumed = 0.0
        j = 1
        scanned = 0
        while j < len(q) and scanned < self.max_scan:
            rid = q[j]
            scanned += 1
            s = self.need(rid, acct)
            if consumed + s > budget:
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
                self.charge(rid, acct)
                consumed += s
                self._count(1, i, s)
                self.bypasses += 1
                self.pending_bypass[rid] = head
                e.push_event(now + wait, lambda t, b=rid, h=head: self._check_squash(b, h))
                continue
            if r in _GLOBAL_STOPS:
                return consumed, r
            j += 1
        return consumed, None

    def _head_waiting(self, head: int) -> bool:
        e = self.engine
        return head not in e.running and e.state[head] == RequestState.PENDING and head in self.qof

    def head_fits_without(self, head: int, bypasser: int) -> bool:
        """The head's memory is there once the bypasser's own (its KV, and its adapter when it
        is that adapter's last running request) is counted as free.

        On the S-LoRA engine the head gets in only by S-LoRA's admission test (``slora.md`` section 2: the peak
        future KV of every running request, ``4r`` slots per distinct adapter), which free memory does not
        decide: the engine's own test answers, with the bypasser gone (``SLoRAEngine.admits_without``, exact and
        without side effects), and only a bypasser the engine can squash counts (``SLoRAEngine.squashable``).
        Actually-free memory covering the head's adapter and first chunk (vLLM's notion, below) squashed
        bypassers while S-LoRA still refused the head."""
        e = self.engine
        admits = getattr(e, "admits_without", None)
        if admits is not None:  # S-LoRA's engine: its admission test decides
            return e.squashable(bypasser) and admits(head, (bypasser,))
        bs = e.block_size
        b = e.adapter_a[bypasser]
        last_user = b >= 0 and b != e.adapter_a[head] and sum(1 for r in e.running if e.adapter_a[r] == b) == 1
        if getattr(e.adapters, "placement", None) is None:  # vLLM slots: a slot for the head's adapter
            return e.adapters.n_active - last_user < e.config.max_loras
        free = (e.free_blocks + e.reclaimable_blocks() + e.kv_blocks_held(bypasser)) * bs
        if last_user:
            free += e.adapter_tokens(b)
        need = self.head_need_tokens(head)
        if e.adapter_a[head] >= 0 and not self._adapter_missing(head):
            need -= e.adapter_tokens(e.adapter_a[head])
        return need <= free

    def _check_squash(self, bypasser: int, head: int) -> None:
        """Squash the bypasser when the head's memory appeared before it finished (§4.3: "if memory
        for R1 (counting R2's own) appears before R2 finishes")."""
        e = self.engine
        if self.pending_bypass.get(bypasser) != head:
            return
        if bypasser not in e.running or not self._head_waiting(head):
            self.pending_bypass.pop(bypasser, None)
            return
        if self.head_fits_without(head, bypasser):
            self.pending_bypass.pop(bypasser, None)
            self.squashes += 1
            self._squashed_for[bypasser] = head
            e.squash(bypasser)

    # ------------------------------------------------------------------ events
    def on_preempt(self, rid: int) -> None:
        self.release(rid)
        q = self.qof.get(rid, 0)
        if q >= len(self.queues):
            q = self.queue_of(rid)
        self.qof[rid] = q
        dq = self.queues[q]
        head = self._squashed_for.get(rid)
        if head is not None and dq and dq[0] == head:
            dq.insert(1, rid)  # a squashed bypasser waits right behind the head it bypassed
        else:
            dq.appendleft(rid)

    def on_finish(self, rid: int) -> None:
        self.qof.pop(rid, None)
        self.release(rid)
        self._squashed_for.pop(rid, None)
        self.pending_bypass.pop(rid, None)
        if self.pending_bypass:  # memory appeared: is a bypassed head now able to run?
            now = self.engine.now
            for b, h in list(self.pending_bypass.items()):
                self.engine.push_event(now, lambda t, b=b, h=h: self._check_squash(b, h))

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
                "chameleon_refreshes": self.refreshes, "chameleon_quota_scaled_refreshes": self.scaled_refreshes,
                "chameleon_quota_min_over_pool": (round(self.min_over_total, 3) if math.isfinite(self.min_over_total)
                                                  else None),
                "chameleon_bypasses": self.bypasses,
                "chameleon_squashes": self.squashes, "chameleon_idle_admits": self.idle_admits,
                "chameleon_phase2_tokens": [round(x) for x in self.admitted_tokens[1]]}


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

    def __init__(self, F: float | None = None, R: float | None = None, S: float | None = None,
                 freq_window_s: float | None = 300.0, **memory) -> None:
        super().__init__(**memory)
        if freq_window_s is not None and not freq_window_s > 0:
            raise ValueError(f"{self.name}: freq_window_s must be positive seconds or None, got {freq_window_s}")
        #: the time frame of the frequency feature (the paper's is unspecified; see the module docstring)
        self.freq_window_s = freq_window_s
        if F is not None:
            self.F = F
        if R is not None:
            self.R = R
        if S is not None:
            self.S = S

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.stats_ = WindowedArrivalCounts(engine, self.freq_window_s)
        self.size = np.asarray(engine.adapters.bytes, float)
        #: each adapter's last use (its first request, or its last request's end; 0.0 before any), indexed
        #: by adapter: a victim reads the candidates' at once (a dict read per candidate cost O(idle) Python steps)
        self.last_use = np.zeros(engine.n_adapters)

    def on_active(self, a: int, now: float) -> None:
        super().on_active(a, now)
        self.last_use[a] = now

    def on_idle(self, a: int, now: float) -> None:
        super().on_idle(a, now)
        self.last_use[a] = now

    def scores(self, cands: "list[int] | np.ndarray", now: float) -> np.ndarray:
        """``F*Frequency + R*Recency + S*Size`` over features normalised among ``cands``
        (frequency: requests within the last ``freq_window_s``)."""
        self.stats_.update()
        c = np.asarray(cands, np.int64)
        freq = self.stats_.count[c].astype(float)
        last = self.last_use[c]
        size = self.size[c]
        fmax = freq.max() if len(freq) else 0.0
        f_n = freq / fmax if fmax > 0 else np.zeros(len(c))
        lo, hi = (last.min(), last.max()) if len(last) else (0.0, 0.0)
        r_n = (last - lo) / (hi - lo) if hi > lo else np.zeros(len(c))
        s_n = size / size.max() if len(size) and size.max() > 0 else np.zeros(len(c))
        return self.F * f_n + self.R * r_n + self.S * s_n

    def victim(self, now: float) -> int:
        """The idle adapter with the lowest score (§4.2), among those no queued request uses unless every
        idle one is (the queued requests per adapter are the engine's, kept as requests arrive, start and
        wait again: :meth:`twin.engine_state.EngineState.waiting_adapter_counts`; a scan of the waiting
        requests per victim cost O(waiting), most of an overloaded run)."""
        cands = np.fromiter(self.idle, np.int64, len(self.idle))
        cands.sort()  # (ascending: the first lowest score wins a tie)
        pin = self.reclaim_pin  # (the admitting request's own adapter, kept while another can go)
        if pin >= 0 and len(cands) > 1:
            cands = cands[cands != pin]
        queued = self.engine.waiting_adapter_counts()
        free = cands[queued[cands] == 0]
        group = free if len(free) else cands  # adapters of queued requests only when memory forces it
        sc = self.scores(group, now)
        return int(group[int(np.argmin(sc))])


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
        self._windowed: set[int] = set()  # the adapters with a window (a tick reads only them, not all adapters)

    tick_option = "bin_s"

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
                self._windowed.add(a)
        want = []
        window = self.window
        for a in self._windowed:  # (any order: the sort below orders by (-samples, adapter))
            head, tail = window[a]
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
                       "idle memory (on S-LoRA's unified pool); its queues' heads prefetched with --slora-prefetch "
                       "(S-LoRA's --prefetch, off by default; twin reproduce turns it on)", "Iliakopoulou et al., MICRO'25"))
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
