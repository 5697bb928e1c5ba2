"""The engine: a SimPy process that runs vLLM 0.8.5 v1-style continuous batching.

One engine step (``Engine._plan_step`` then ``Engine._complete_step``), as in vLLM v1's
``Scheduler.schedule``:

1. **Running requests first**, in admission order: every decoding request gets one token,
   a request still in (chunked) prefill gets ``min(remaining, budget)`` tokens. Each needs
   KV blocks for the tokens it computes (``ceil(tokens/16)``); when the pool is empty the
   *last* running request is preempted (recompute: its blocks are freed and it goes back
   to the front of the waiting queue), until the allocation fits or the request itself
   was preempted.
2. **Waiting requests next**, only if nothing was preempted: the scheduler policy offers
   them to :meth:`StepContext.try_admit`, which applies vLLM's checks (token budget,
   ``max_num_seqs``, ``max_loras`` distinct adapters, KV blocks for the first chunk).
3. **Adapter loads**: adapters that joined the batch and are not in a GPU slot are
   loaded synchronously (disk -> CPU -> GPU), holding the host link.
4. **Duration** = scheduler overhead + backbone(prefill tokens, decode sequences, context)
   + LoRA overhead (+ the loads), all from the :class:`~twin.profile.Profile`.
5. **At the end of the step** every request that computed its last pending token emits a
   token. *A request's TTFT is decided here*: the first token is emitted at the end of the
   step that computes the last prompt token (``Engine._complete_step``).

Speed: the cost follows the events that change the batch, not the steps. Decoding
requests are kept in aggregate: a global step counter ``g`` (each decoding request's
computed length is ``base + g``), a heap of finish steps, and per-residue counts of
which requests need a new KV block at which step (a request needs one when its length
is a multiple of the block size). A run of pure-decode steps in which nothing can change
(no finish, no KV exhaustion, no admissible arrival, no policy tick) is advanced as one
SimPy timeout; its step durations are evaluated with numpy and recorded as a segment.
``max_run_steps=1`` disables this; a test checks both give identical results.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from twin.adapters import AdapterMemory, HostLink, Load
from twin.config import ConfigError, EngineConfig
from twin.interfaces import Admit, AdapterCachePolicy, Scheduler
from twin.metrics import Recorder

if TYPE_CHECKING:  # pragma: no cover
    from traces.workload import Workload
    from twin.profile import Profile

INF = math.inf

# request states
PENDING, WAITING, RUNNING, FINISHED, REJECTED = 0, 1, 2, 3, 4

REJECT_REASONS = ("", "prompt + output exceed max_model_len", "request can never fit in the KV cache",
                  "unknown adapter (not served)", "adapter rank exceeds max_lora_rank",
                  "LoRA request but LoRA is disabled")


class StartupError(ConfigError):
    """The server would refuse to start with this configuration (as vLLM does)."""


@dataclass
class StepContext:
    """What :meth:`Scheduler.schedule_waiting` may use during one step."""

    engine: "Engine"
    budget: int
    admitted: list[int] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (rid, tokens) of prefill work
    loads: list[Load] = field(default_factory=list)
    load_rids: list[int] = field(default_factory=list)

    def try_admit(self, rid: int) -> Admit:
        return self.engine._try_admit(self, rid)


class Engine:
    """Simulates one vLLM-like server over a workload. Use :func:`twin.simulate.simulate`."""

    def __init__(self, workload: "Workload", profile: "Profile", config: EngineConfig, scheduler: Scheduler,
                 cache: AdapterCachePolicy, horizon_s: float | None = None, max_run_steps: int | None = None,
                 progress: bool = False, record_steps: bool = True, check_invariants: bool = False) -> None:
        config.validate()
        self.config = config
        self.profile = profile
        self.env = simpy.Environment()
        df = workload.df
        self.n = n = len(df)
        self.arrival = df["arrival_s"].to_numpy(np.float64)
        self.prompt = df["prompt_tokens"].to_numpy(np.int64)
        self.output = df["output_tokens"].to_numpy(np.int64)
        self.request_id = df["request_id"].to_numpy(np.int64)
        raw_adapter = df["adapter_id"].to_numpy(np.int64)
        raw_rank = df["adapter_rank"].to_numpy(np.int64)
        self.horizon = INF if horizon_s is None else float(horizon_s)
        self.max_run_steps = max_run_steps or (1 << 62)
        self.progress = progress
        self.check_invariants = check_invariants

        # ---- adapters: dense ids 0..A-1 for the adapters the workload uses
        used = np.unique(raw_adapter[raw_adapter >= 0])
        self.adapter_ids = used
        self.adapter = np.where(raw_adapter >= 0, np.searchsorted(used, raw_adapter), -1).astype(np.int64)
        ranks = np.zeros(len(used), np.int64)
        if len(used):
            ranks[self.adapter[raw_adapter >= 0]] = raw_rank[raw_adapter >= 0]
        self.adapter_rank = ranks
        self.rank = raw_rank
        self.n_adapters = len(used)
        self.served = config.served_adapters if config.served_adapters is not None else len(used)

        # ---- start-up check (vLLM: KV for one max_model_len request after weights and LoRA buffers)
        model = profile.model
        self.max_model_len = config.max_model_len or model.max_model_len
        self.max_lora_rank = config.max_lora_rank or (int(ranks.max()) if len(ranks) else 0)
        slots = config.max_loras if config.enable_lora else 0
        self.kv_tokens = config.kv_capacity_tokens or profile.kv_capacity_tokens(slots, self.max_lora_rank if slots else 0)
        bs = config.block_size
        self.block_size = bs
        self.total_blocks = self.kv_tokens // bs
        check_startup(self.kv_tokens, self.max_model_len, slots, self.max_lora_rank)

        # ---- per-request state (numpy arrays; no per-request Python objects)
        self.state = np.zeros(n, np.int8)
        self.reject_reason = np.zeros(n, np.int8)
        self.T = self.prompt.copy()          # known tokens (prompt + emitted)
        self.c = np.zeros(n, np.int64)       # computed tokens (for prefilling requests)
        self.held = np.zeros(n, np.int64)    # KV blocks (for prefilling requests)
        self.emitted = np.zeros(n, np.int64)
        self.dec_base = np.zeros(n, np.int64)  # decoding: computed = dec_base + g
        self.version = np.zeros(n, np.int64)   # invalidates heap entries on preemption
        self.first_sched = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.last_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.preemptions = np.zeros(n, np.int64)
        self.load_wait = np.zeros(n, np.float64)
        self._reject_at_arrival()

        # ---- engine state
        self.g = 0                      # global step counter
        self.running: dict[int, None] = {}     # admission order
        self.prefilling: dict[int, None] = {}  # subset of running still in prefill
        self.n_dec = 0
        self.dec_base_sum = 0
        self.res_cnt = [0] * bs         # decoders needing a block at steps with g % bs == r
        self.fin_heap: list[tuple[int, int, int]] = []  # (finish g, rid, version)
        self.used_blocks = 0
        self.n_waiting = 0
        self.arr_ptr = 0                # requests with index < arr_ptr have arrived
        self.n_finished = 0
        self.gap_itl: list[float] = []  # ITL samples after a preemption gap

        self.link = HostLink(self.env)
        cpu_slots = config.max_cpu_loras if config.max_cpu_loras is not None else max(self.n_adapters, 1)
        self.cache = cache
        self.scheduler = scheduler
        self.adapters = AdapterMemory(ranks, profile, slots, cpu_slots, cache, self.link, config.tensor_parallel)
        cache.bind(self)
        scheduler.bind(self)
        self.rec = Recorder(record_steps)
        self._sched_ticks = scheduler.tick_interval
        self._cache_ticks = cache.tick_interval
        self._next_tick = min(t for t in (self._sched_ticks, self._cache_ticks, INF) if t is not None)
        self._async_until = INF  # completion time of the earliest async transfer
        self._run_limit_time = INF
        self.proc = self.env.process(self._run())

    # ------------------------------------------------------------------ read-only view
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    def next_arrival_time(self) -> float:
        """Arrival time of the next request that has not arrived yet (inf if none)."""
        i = self.arr_ptr
        return float(self.arrival[i]) if i < self.n else INF

    def next_arrival_after(self, t: float) -> float:
        i = int(np.searchsorted(self.arrival, t, side="right"))
        return float(self.arrival[i]) if i < self.n else INF

    # ------------------------------------------------------------------ set-up helpers
    def _reject_at_arrival(self) -> None:
        """Requests vLLM would refuse, marked once (they are counted when they arrive)."""
        reason = np.zeros(self.n, np.int8)
        reason[self.prompt + self.output > self.max_model_len] = 1
        need_blocks = -(-(self.prompt + self.output - 1) // self.block_size)
        reason[(reason == 0) & (need_blocks > self.total_blocks)] = 2
        has = self.adapter >= 0
        if self.config.served_adapters is not None:
            raw = np.where(has, self.adapter_ids[np.maximum(self.adapter, 0)], -1)
            reason[(reason == 0) & has & (raw >= self.config.served_adapters)] = 3
        if self.config.enable_lora:
            reason[(reason == 0) & has & (self.rank > self.max_lora_rank)] = 4
        else:
            reason[(reason == 0) & has] = 5
        self.reject_reason = reason
        self.state[reason > 0] = REJECTED

    # ------------------------------------------------------------------ SimPy process
    def _run(self):
        env = self.env
        horizon = self.horizon
        while True:
            now = env.now
            if now >= horizon:
                break
            self._ingest(now)
            if now >= self._next_tick:
                self._tick(now)
            plan = self._plan_step(now)
            if plan is None:  # idle: sleep until something can happen
                t_next = min(self.next_arrival_time(), self._async_until, self._next_tick, horizon)
                if t_next == INF:
                    break
                yield env.timeout(max(t_next - now, 0.0))
                continue
            for ld in plan.loads:  # synchronous loads, on the step's critical path
                if ld.disk_s:
                    yield env.timeout(ld.disk_s)
                yield env.process(self.link.transfer(ld.nbytes, ld.link_s))
            load_s = env.now - now
            if load_s:
                self.load_wait[plan.load_rids] += load_s
            if self.check_invariants:
                self.assert_invariants(mid_step=True)
            yield env.timeout(plan.total_s)
            self._complete_step(plan, now, load_s)
            if self.check_invariants:
                self.assert_invariants()
            if self.progress:
                self.rec.progress(env.now, horizon if horizon < INF else self.arrival[-1] if self.n else 1.0)
        self.rec.close_progress()

    def _tick(self, now: float) -> None:
        for interval, obj in ((self._sched_ticks, self.scheduler), (self._cache_ticks, self.cache)):
            if interval is not None:
                obj.on_tick(now)
        self._next_tick = now + min(t for t in (self._sched_ticks, self._cache_ticks) if t is not None)

    def _ingest(self, now: float) -> None:
        lo = self.arr_ptr
        hi = int(np.searchsorted(self.arrival, now, side="right"))
        if hi > lo:
            self.arr_ptr = hi
            st = self.state[lo:hi]
            ok = st == PENDING
            st[ok] = WAITING
            self.n_waiting += int(ok.sum())
            self.scheduler.on_arrivals(lo, hi)

    # ------------------------------------------------------------------ one step
    def _plan_step(self, now: float) -> "StepPlan | None":
        cfg = self.config
        g = self.g
        bs = self.block_size
        preempted = False
        # 1. running requests: decodes (1 token each) then prefill chunks, KV allocation
        budget = cfg.max_num_batched_tokens - self.n_dec
        need = self.res_cnt[g % bs]
        chunks: list[tuple[int, int]] = []
        for rid in self.prefilling:
            if budget <= 0:
                break
            k = min(int(self.T[rid] - self.c[rid]), budget)
            chunks.append((rid, k))
            need += -(-(int(self.c[rid]) + k) // bs) - int(self.held[rid])
            budget -= k
        if need > self.total_blocks - self.used_blocks:
            preempted = True
            budget, chunks, need = self._preempt_until_fits(now)
        self.used_blocks += need
        for rid, k in chunks:
            self.held[rid] = -(-(int(self.c[rid]) + k) // bs)
        # 2. waiting requests (vLLM: only when nothing was preempted this step)
        ctx = StepContext(self, budget, chunks=chunks)
        stop: Admit | None = None
        if not preempted and self.n_waiting and budget > 0:
            stop = self.scheduler.schedule_waiting(ctx)
        if not self.running:
            return None
        # 3. synchronous loads of the adapters that joined the batch (acquired at admission)
        loads = ctx.loads
        load_rids = ctx.load_rids
        # 4. duration: one step, or a run of identical decode steps
        prefill_tokens = sum(k for _, k in ctx.chunks)
        k_steps = 1
        if not ctx.chunks and not loads and not preempted and self.max_run_steps > 1:
            k_steps = self._run_length(now, stop)
        return self._make_plan(now, ctx, prefill_tokens, loads, load_rids, k_steps, preempted)

    def _make_plan(self, now, ctx, prefill_tokens, loads, load_rids, k_steps, preempted) -> "StepPlan":
        prof = self.profile
        n_dec = self.n_dec
        ctx_tok = self.dec_base_sum + n_dec * self.g + sum(int(self.c[rid]) for rid, _ in ctx.chunks)
        A = self.adapters.n_active
        max_rank = self.adapters.max_active_rank
        running = len(self.running)
        slots = self.config.max_loras
        served = self.served
        if k_steps == 1:
            base = prof.backbone_s(prefill_tokens, n_dec, ctx_tok)
            comp = base + prof.lora_s(base, A, max_rank, prefill_tokens + n_dec)
            total = float(prof.scheduler_s(running, self.n_waiting, slots, served) + comp)
            durs = None
            end = now + total
        else:
            j = np.arange(k_steps, dtype=np.int64)
            base = prof.backbone_s(0, n_dec, ctx_tok + n_dec * j)
            comp = base + prof.lora_s(base, A, max_rank, n_dec)
            waiting = np.full(k_steps, self.n_waiting, np.int64)
            durs = prof.scheduler_s(running, waiting, slots, served) + comp
            k2_dependent = self._waiting_matters()
            if k2_dependent and self.arr_ptr < self.n:
                # waiting grows with arrivals during the run: iterate to the fixed point
                # t_{j+1} = t_j + d(W(t_j)) (monotone; exact with discrete arrivals)
                for _ in range(64):
                    starts = np.cumsum(np.concatenate(([now], durs[:-1])))
                    arrived = np.searchsorted(self.arrival, starts, side="right") - self.arr_ptr
                    w = self.n_waiting + self._waiting_arrivals(arrived)
                    if np.array_equal(w, waiting):
                        break
                    waiting = w
                    durs = prof.scheduler_s(running, waiting, slots, served) + comp
            ends = np.cumsum(np.concatenate(([now], durs)))[1:]
            # the run must not cross the next event time except by its last step
            t_evt = self._run_limit_time
            if t_evt < INF:
                cut = int(np.searchsorted(ends[:-1], t_evt, side="left")) + 1
                if cut < k_steps:
                    k_steps = cut
                    durs = durs[:k_steps]
                    ends = ends[:k_steps]
            end = float(ends[-1])
            total = end - now
            # SimPy adds the delay to the clock: pick the delay that lands exactly on `end`
            while now + total < end:
                total = float(np.nextafter(total, INF))
            while now + total > end:
                total = float(np.nextafter(total, -INF))
        return StepPlan(ctx.chunks, ctx.admitted, loads, load_rids, k_steps, durs, total, prefill_tokens, preempted)

    def _waiting_matters(self) -> bool:
        sch = self.profile.components["scheduler"].params
        return any(sch.get(k, 0.0) != 0.0 for k in ("k2", "k3")) or any(
            v != 0.0 for k, v in sch.items() if k.startswith("w"))

    def _waiting_arrivals(self, arrived: np.ndarray) -> np.ndarray:
        """Arrivals among the next ``arrived`` that join the waiting queue (not rejected)."""
        if not hasattr(self, "_ok_cum"):
            self._ok_cum = np.concatenate(([0], np.cumsum(self.reject_reason == 0)))
        base = self._ok_cum[self.arr_ptr]
        return self._ok_cum[self.arr_ptr + arrived] - base

    def _run_length(self, now: float, stop: Admit | None) -> int:
        """How many identical pure-decode steps can run before anything changes."""
        g = self.g
        bs = self.block_size
        k = self.max_run_steps
        # next finish
        heap = self.fin_heap
        while heap and self.version[heap[0][1]] != heap[0][2]:
            heapq.heappop(heap)
        if heap:
            k = min(k, heap[0][0] - g)
        # KV: cumulative block needs must stay within the free pool
        free = self.total_blocks - self.used_blocks
        cnt = self.res_cnt
        per_cycle = self.n_dec
        if per_cycle:
            full = free // per_cycle
            k_kv = full * bs
            rem = free - full * per_cycle
            # step 0's need is already allocated; steps 1.. need cnt[(g+j) % bs]
            j = 1
            while True:
                c = cnt[(g + j) % bs]
                if c > rem:
                    break
                rem -= c
                j += 1
                if j > bs:
                    break
            k = min(k, k_kv + j)
        # external events: admissible arrivals, async loads, policy ticks, the horizon
        t_evt = min(self.scheduler.next_change_time(stop), self._async_until, self._next_tick, self.horizon)
        self._run_limit_time = t_evt
        return max(int(k), 1)

    def _preempt_until_fits(self, now: float) -> tuple[int, list[tuple[int, int]], int]:
        """vLLM v1's running loop when KV runs out: preempt the last running request
        until the allocation of the current one fits (exact order)."""
        cfg = self.config
        bs = self.block_size
        g = self.g
        order = list(self.running)
        free = self.total_blocks - self.used_blocks
        budget = cfg.max_num_batched_tokens
        chunks: list[tuple[int, int]] = []
        need_total = 0
        i = 0
        while i < len(order) and budget > 0:
            rid = order[i]
            if rid in self.prefilling:
                k = min(int(self.T[rid] - self.c[rid]), budget)
                nd = -(-(int(self.c[rid]) + k) // bs) - int(self.held[rid])
            else:
                k = 1
                nd = 1 if (int(self.dec_base[rid]) + g) % bs == 0 else 0
            self_preempted = False
            while nd > free:
                victim = order.pop()
                free += self._preempt(victim, now)
                if victim == rid:
                    self_preempted = True
                    break
            if self_preempted:
                break
            free -= nd
            need_total += nd
            budget -= k
            if rid in self.prefilling:
                chunks.append((rid, k))
            i += 1
        return budget, chunks, need_total

    def _preempt(self, rid: int, now: float) -> int:
        """Recompute preemption: free the blocks, back to the front of the waiting queue."""
        bs = self.block_size
        del self.running[rid]
        if rid in self.prefilling:
            del self.prefilling[rid]
            freed = int(self.held[rid])
        else:
            comp = int(self.dec_base[rid]) + self.g
            freed = -(-comp // bs)
            self.n_dec -= 1
            self.dec_base_sum -= int(self.dec_base[rid])
            self.res_cnt[(-int(self.dec_base[rid])) % bs] -= 1
        self.version[rid] += 1
        self.used_blocks -= freed
        self.held[rid] = 0
        self.c[rid] = 0
        self.state[rid] = WAITING
        self.n_waiting += 1
        self.preemptions[rid] += 1
        self.rec.preemptions += 1
        a = int(self.adapter[rid])
        if a >= 0:
            self.adapters.release(a, now)
        self.scheduler.on_preempt(rid)
        return freed

    def _try_admit(self, ctx: StepContext, rid: int) -> Admit:
        """vLLM v1's checks for one waiting request (see :class:`~twin.interfaces.Admit`)."""
        if ctx.budget <= 0:
            return Admit.NO_BUDGET
        if len(self.running) >= self.config.max_num_seqs:
            return Admit.NO_SEQ
        a = int(self.adapter[rid])
        ad = self.adapters
        if a >= 0 and ad.active[a] == 0 and ad.n_active >= self.config.max_loras:
            return Admit.NO_SLOT
        k = min(int(self.T[rid]), ctx.budget)
        nb = -(-k // self.block_size)
        if nb > self.total_blocks - self.used_blocks:
            return Admit.NO_KV
        self.used_blocks += nb
        self.held[rid] = nb
        self.c[rid] = 0
        ctx.budget -= k
        ctx.chunks.append((rid, k))
        ctx.admitted.append(rid)
        self.running[rid] = None
        self.prefilling[rid] = None
        self.state[rid] = RUNNING
        self.n_waiting -= 1
        if self.first_sched[rid] != self.first_sched[rid]:  # NaN
            self.first_sched[rid] = self.env.now
        if a >= 0:
            ld = ad.acquire(a, self.env.now)
            if ld is not None:
                ctx.loads.append(ld)
                ctx.load_rids.append(rid)
        return Admit.OK

    def _complete_step(self, plan: "StepPlan", t0: float, load_s: float) -> None:
        """End of a step (or run of steps): emit tokens, record TTFTs and finishes."""
        now = self.env.now
        bs = self.block_size
        k = plan.k
        n_dec = self.n_dec
        g0 = self.g
        self.g = g1 = g0 + k
        if k > 1:
            # allocations of steps 1..k-1 of the run
            cnt = self.res_cnt
            full, part = divmod(k - 1, bs)
            extra = full * n_dec + sum(cnt[(g0 + j) % bs] for j in range(1, part + 1))
            self.used_blocks += extra
        # prefill chunks: emit a token when a request has computed all its known tokens
        for rid, kk in plan.chunks:
            c = int(self.c[rid]) + kk
            self.c[rid] = c
            if c == self.T[rid]:
                self._emit_after_prefill(rid, now)
        # decoding requests that finish at g1
        heap = self.fin_heap
        while heap and heap[0][0] <= g1:
            fg, rid, ver = heapq.heappop(heap)
            if self.version[rid] != ver:
                continue
            self._finish_decoder(rid, now)
        # record
        self.rec.step(t0, now, k, plan.durs, plan.total_s + load_s, len(self.running) + 0, plan.prefill_tokens,
                      n_dec, self.adapters.n_active, self.used_blocks, self.adapters.resident_bytes,
                      len(plan.loads), sum(ld.nbytes for ld in plan.loads))

    def _emit_after_prefill(self, rid: int, now: float) -> None:
        if self.first_token[rid] != self.first_token[rid]:
            self.first_token[rid] = now          # <- TTFT is decided here
        else:
            self.gap_itl.append(now - float(self.last_token[rid]))  # resumed after preemption
        self.last_token[rid] = now
        e = int(self.emitted[rid]) + 1
        self.emitted[rid] = e
        del self.prefilling[rid]
        c = int(self.c[rid])
        if e >= self.output[rid]:
            self.used_blocks -= int(self.held[rid])
            self.held[rid] = 0
            self._finished(rid, now)
            return
        # join the decode aggregate: computed = base + g
        self.T[rid] = c + 1
        base = c - self.g
        self.dec_base[rid] = base
        self.dec_base_sum += base
        self.n_dec += 1
        self.res_cnt[(-base) % self.block_size] += 1
        self.held[rid] = 0
        heapq.heappush(self.fin_heap, (self.g + int(self.output[rid]) - e, rid, int(self.version[rid])))

    def _finish_decoder(self, rid: int, now: float) -> None:
        base = int(self.dec_base[rid])
        comp = base + self.g
        self.n_dec -= 1
        self.dec_base_sum -= base
        self.res_cnt[(-base) % self.block_size] -= 1
        self.used_blocks -= -(-comp // self.block_size)
        self.emitted[rid] = self.output[rid]
        self.T[rid] = comp + 1
        self.last_token[rid] = now
        self._finished(rid, now)

    def _finished(self, rid: int, now: float) -> None:
        del self.running[rid]
        self.state[rid] = FINISHED
        self.finish[rid] = now
        self.n_finished += 1
        a = int(self.adapter[rid])
        if a >= 0:
            self.adapters.release(a, now)
        self.scheduler.on_finish(rid)

    # ------------------------------------------------------------------ checks
    def assert_invariants(self, mid_step: bool = False) -> None:
        """The engine's invariants (tests run with ``check_invariants=True``). Between
        steps the block count must match the requests' lengths exactly; during a step it
        also covers the blocks allocated for the tokens being computed."""
        bs = self.block_size
        held = 0
        for rid in self.running:
            if rid in self.prefilling:
                held += int(self.held[rid])
            else:
                held += -(-(int(self.dec_base[rid]) + self.g + mid_step) // bs)
        assert held == self.used_blocks, f"KV accounting: held {held} != used {self.used_blocks}"
        assert 0 <= self.used_blocks <= self.total_blocks, "KV blocks exceed capacity"
        assert len(self.running) <= self.config.max_num_seqs, "more running requests than max_num_seqs"
        ad = self.adapters
        assert ad.n_resident == int(ad.resident.sum()) <= max(ad.gpu_slots, 0), "resident adapters exceed slots"
        assert bool(np.all(ad.resident[ad.active > 0])), "an adapter in use is not resident"
        assert ad.n_active == int((ad.active > 0).sum()) <= self.config.max_loras, "too many adapters in the batch"
        n_dec = sum(1 for r in self.running if r not in self.prefilling)
        assert n_dec == self.n_dec, "decode aggregate out of sync"
        arrived = self.state[: self.arr_ptr]
        assert int((arrived == WAITING).sum()) == self.n_waiting, "waiting count out of sync"
        assert int((self.state == RUNNING).sum()) == len(self.running), "running set out of sync"

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        self.env.run(until=self.proc)


@dataclass
class StepPlan:
    chunks: list[tuple[int, int]]
    admitted: list[int]
    loads: list[Load]
    load_rids: list[int]
    k: int
    durs: np.ndarray | None
    total_s: float
    prefill_tokens: int
    preempted: bool


def check_startup(kv_tokens: int, max_model_len: int, slots: int, max_rank: int) -> None:
    """vLLM refuses to start when the KV cache cannot hold one ``max_model_len`` request."""
    if kv_tokens < max_model_len:
        raise StartupError(
            f"the KV cache left after the weights and {slots} LoRA slots of max rank {max_rank} holds "
            f"{kv_tokens} tokens, less than one max_model_len={max_model_len} request; vLLM would refuse to "
            f"start. Lower --slots or the max LoRA rank, lower max_model_len, or use a GPU with more memory")
