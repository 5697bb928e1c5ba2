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
   + LoRA overhead (+ the loads), all from the :class:`~twin.perf.profile.Profile`.
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
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from twin.adapters import AdapterMemory, HostLink, Load
from twin.config import ConfigError, EngineConfig
from twin.hooks import install_extensions
from twin.interfaces import Admit, AdapterCachePolicy, Scheduler
from twin.metrics import Recorder

if TYPE_CHECKING:  # pragma: no cover
    from traces.workload import Workload
    from twin.perf.profile import Profile

INF = math.inf

# request states
# request states kept in ``Engine.state`` (waiting and running are derived from the queues)
PENDING, FINISHED, REJECTED = 0, 3, 4

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
    """Simulates one vLLM-like server over a workload. Use :func:`twin.simulate.simulate`.

    ``workload`` is a :class:`traces.workload.Workload` or a mapping of numpy columns of the
    same schema (the latter keeps pandas out of long benchmark runs).
    """

    def __init__(self, workload: "Workload", profile: "Profile", config: EngineConfig, scheduler: Scheduler,
                 cache: AdapterCachePolicy, horizon_s: float | None = None, max_run_steps: int | None = None,
                 progress: bool = False, record_steps: bool = True, check_invariants: bool = False) -> None:
        config.validate()
        self.config = config
        if config.tensor_parallel > 1:  # each GPU computes 1/TP of the step (twin/tensor_parallel.py)
            from twin.tensor_parallel import tp_profile

            profile = tp_profile(profile, config.tensor_parallel)
        self.profile = profile
        self.env = simpy.Environment()
        cols = workload_columns(workload)
        self.n = n = len(cols["arrival_s"])
        # inputs: compact array.array storage (fast scalar reads) with numpy views
        self._arrival_a = _as_array("d", cols["arrival_s"])
        self._prompt_a = _as_array("q", cols["prompt_tokens"])
        self._output_a = _as_array("q", cols["output_tokens"])
        self.arrival = np.frombuffer(self._arrival_a, np.float64) if n else np.zeros(0)
        self.prompt = np.frombuffer(self._prompt_a, np.int64) if n else np.zeros(0, np.int64)
        self.output = np.frombuffer(self._output_a, np.int64) if n else np.zeros(0, np.int64)
        self.request_id = np.asarray(cols["request_id"], np.int64)
        raw_adapter = np.asarray(cols["adapter_id"], np.int64)
        raw_rank = np.asarray(cols["adapter_rank"], np.int64)
        self.horizon = INF if horizon_s is None else float(horizon_s)
        self.max_run_steps = max_run_steps or (1 << 62)
        self.progress = progress
        self.check_invariants = check_invariants

        # ---- adapters: dense ids 0..A-1 for the adapters the workload uses
        used = np.unique(raw_adapter[raw_adapter >= 0])
        self.adapter_ids = used
        dense = np.where(raw_adapter >= 0, np.searchsorted(used, raw_adapter), -1).astype(np.int64)
        self._adapter_a = _as_array("q", dense)
        self.adapter = np.frombuffer(self._adapter_a, np.int64) if n else np.zeros(0, np.int64)
        ranks = np.zeros(len(used), np.int64)
        if len(used):
            ranks[dense[raw_adapter >= 0]] = raw_rank[raw_adapter >= 0]
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

        # ---- per-request outcome arrays (written once per event; array.array with numpy views)
        self.state = np.zeros(n, np.int8)   # PENDING / FINISHED / REJECTED (running and waiting are derived)
        self.reject_reason = np.zeros(n, np.int8)
        self._reject_at_arrival()
        nan = np.full(n, np.nan)
        self._first_sched_a = _as_array("d", nan)
        self._first_token_a = _as_array("d", nan)
        self._finish_a = _as_array("d", nan)
        del nan
        view = (lambda a, dt: np.frombuffer(a, dt) if n else np.zeros(0, dt))
        self.first_sched = view(self._first_sched_a, np.float64)
        self.first_token = view(self._first_token_a, np.float64)
        self.finish = view(self._finish_a, np.float64)
        # sparse per-request facts (few requests have them)
        self.load_wait_d: dict[int, float] = {}     # adapter-load wait on the critical path
        self.preempt_d: dict[int, int] = {}         # preemption counts
        self.last_token_d: dict[int, float] = {}    # last token time of preempted requests
        self._seen = bytearray(n)           # admitted at least once
        # prefix counts of requests that join the waiting queue (not rejected)
        self._ok_cum = _as_array("q", np.concatenate(([0], np.cumsum(self.reject_reason == 0))))

        # ---- hot state of the running requests only (dicts keyed by request index)
        self.g = 0                                  # global step counter
        self.running: dict[int, None] = {}          # admission order
        self.prefilling: dict[int, None] = {}       # subset of running still in prefill
        self.T: dict[int, int] = {}                 # known tokens (prompt + emitted), running requests
        self.c: dict[int, int] = {}                 # computed tokens of prefilling requests
        self.held: dict[int, int] = {}              # KV blocks of prefilling requests
        self.dec: dict[int, tuple[int, int]] = {}   # decoding: (base, finish step); computed = base + g
        self.resume_T: dict[int, int] = {}          # preempted requests: tokens to recompute
        self.n_dec = 0
        self.dec_base_sum = 0
        self.res_cnt = [0] * bs         # decoders needing a block at steps with g % bs == r
        self.fin_heap: list[tuple[int, int]] = []  # (finish step, rid)
        self.used_blocks = 0
        self.n_waiting = 0
        self.arr_ptr = 0                # requests with index < arr_ptr have arrived
        self._next_arr_t = self._arrival_a[0] if n else INF
        self.n_finished = 0
        self.gap_itl: list[float] = []  # ITL samples after a preemption gap

        self.link = HostLink(self.env)
        cpu_slots = config.max_cpu_loras if config.max_cpu_loras is not None else max(self.n_adapters, 1)
        self.cache = cache
        self.scheduler = scheduler
        self.adapters = AdapterMemory(ranks, profile, slots, cpu_slots, cache, self.link, config.tensor_parallel,
                                      self.max_lora_rank)
        # extensions some policies need (twin/hooks.py): all None/False on the default path
        self._admit_hook = self._reclaim = self._finish_hook = None
        self._prefetch_on = False
        self._async_until = INF
        self._ext = install_extensions(self, workload)
        cache.bind(self)
        scheduler.bind(self)
        self.rec = Recorder(record_steps)
        self._sched_ticks = scheduler.tick_interval
        self._cache_ticks = cache.tick_interval
        self._next_tick = min(t for t in (self._sched_ticks, self._cache_ticks, INF) if t is not None)
        if self._ext is None:
            self._async_until = INF  # time of the earliest extension event (async transfer, deadline)
        # the step-time model, looked up once
        sch = profile.components["scheduler"]
        wp = sch.waiting_params if sch.waiting_params is not None else tuple(sch.params)
        self._waiting_matters = any(isinstance(sch.params.get(k), (int, float)) and sch.params[k] != 0.0 for k in wp)
        bb = profile.components["backbone"].params
        self._ctx_matters = any(v != 0.0 for k, v in bb.items() if "ctx" in k and isinstance(v, (int, float)))
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
        return self._next_arr_t

    def tokens_known(self, rid: int) -> int:
        """Prompt + emitted tokens of a request (what a (re)admission must compute)."""
        return self.resume_T.get(rid) or int(self._prompt_a[rid])

    # ------------------------------------------------------------------ set-up helpers
    def _reject_at_arrival(self) -> None:
        """Requests vLLM would refuse, marked once (they are counted when they arrive)."""
        reason = np.zeros(self.n, np.int8)
        reason[self.prompt + self.output > self.max_model_len] = 1
        need_blocks = -(-(self.prompt + self.output - 1) // self.block_size)
        reason[(reason == 0) & (need_blocks > self.total_blocks)] = 2
        has = self.adapter >= 0
        if self.config.served_adapters is not None:
            raw = np.where(has, self.adapter_ids[np.maximum(self.adapter, 0)] if self.n_adapters else -1, -1)
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
        check = self.check_invariants
        progress = self.progress
        idle_ticks = 0
        while True:
            now = env.now
            if now >= horizon:
                break
            if now >= self._next_arr_t:
                self._ingest(now)
            if now >= self._next_tick:
                self._tick(now)
            if now >= self._async_until:
                self._ext.fire(now)
            plan = self._plan_step(now)
            if plan is None:  # idle: sleep until something can happen
                t_next = min(self._next_arr_t, self._async_until, self._next_tick, horizon)
                if t_next == INF:
                    break
                if self._next_arr_t == INF and self._async_until == INF and t_next == self._next_tick:
                    # only policy ticks are left: stop when nothing waits, or after ticks that admit nothing
                    idle_ticks = idle_ticks + 1 if self.n_waiting else 1 << 30
                    if idle_ticks > 16:
                        break
                yield env.timeout(max(t_next - now, 0.0))
                continue
            load_s = 0.0
            if plan.loads:  # synchronous loads, on the step's critical path
                for ld in plan.loads:
                    if ld.wait is not None:  # an asynchronous load still in flight (twin/prefetch.py)
                        yield ld.wait
                        continue
                    if ld.disk_s:
                        yield env.timeout(ld.disk_s)
                    yield env.process(self.link.transfer(ld.nbytes, ld.link_s))
                load_s = env.now - now
                lw = self.load_wait_d
                for rid in plan.load_rids:
                    lw[rid] = lw.get(rid, 0.0) + load_s
            if check:
                self.assert_invariants(mid_step=True)
            yield env.timeout(plan.total_s)
            self._complete_step(plan, now, load_s)
            if check:
                self.assert_invariants()
            if progress:
                self.rec.progress(env.now, horizon if horizon < INF else float(self.arrival[-1]) if self.n else 1.0)
        self.rec.close_progress()

    def _tick(self, now: float) -> None:
        for interval, obj in ((self._sched_ticks, self.scheduler), (self._cache_ticks, self.cache)):
            if interval is not None:
                obj.on_tick(now)
        self._next_tick = now + min(t for t in (self._sched_ticks, self._cache_ticks) if t is not None)

    def _ingest(self, now: float) -> None:
        """Requests that arrived by ``now`` join the waiting queue (rejected ones are counted)."""
        lo = hi = self.arr_ptr
        arr, n = self._arrival_a, self.n
        while hi < n and hi - lo < 8 and arr[hi] <= now:
            hi += 1
        if hi < n and arr[hi] <= now:
            hi = int(np.searchsorted(self.arrival, now, side="right"))
        self.arr_ptr = hi
        self._next_arr_t = arr[hi] if hi < n else INF
        ok = self._ok_cum
        self.n_waiting += ok[hi] - ok[lo]
        self.scheduler.on_arrivals(lo, hi)

    # ------------------------------------------------------------------ one step
    def _plan_step(self, now: float) -> "StepPlan | None":
        g = self.g
        bs = self.block_size
        preempted = False
        # 1. running requests: decodes (1 token each) then prefill chunks, KV allocation
        budget = self.config.max_num_batched_tokens - self.n_dec
        need = self.res_cnt[g % bs]
        chunks: list[tuple[int, int]] = []
        if self.prefilling:
            T, c, held = self.T, self.c, self.held
            for rid in self.prefilling:
                if budget <= 0:
                    break
                cr = c[rid]
                k = T[rid] - cr
                if k > budget:
                    k = budget
                chunks.append((rid, k))
                need += -(-(cr + k) // bs) - held[rid]
                budget -= k
        if need > self.total_blocks - self.used_blocks and (
                self._reclaim is None or not self._reclaim(need - (self.total_blocks - self.used_blocks))):
            preempted = True
            budget, chunks, need = self._preempt_until_fits(now)
        self.used_blocks += need
        for rid, k in chunks:
            self.held[rid] = -(-(self.c[rid] + k) // bs)
        # 2. waiting requests (vLLM: only when nothing was preempted this step)
        ctx = StepContext(self, budget, chunks=chunks)
        stop: Admit | None = None
        if not preempted and self.n_waiting and budget > 0:
            stop = self.scheduler.schedule_waiting(ctx)
        if not self.running:
            return None
        if self._prefetch_on:  # prefetch decisions (twin/prefetch.py)
            self._ext.after_schedule(ctx, now)
        # 3./4. duration: one step, or a run of identical decode steps
        if ctx.chunks or ctx.loads or preempted or self.max_run_steps == 1:
            return self._single_step(now, ctx, preempted)
        return self._decode_run(now, stop)

    def _step_time(self, prefill_tokens: int, n_dec: int, ctx_tok: int, waiting: int, n_req: int) -> float:
        """Duration of one step at the engine's current batch (see :meth:`Profile.step_s`)."""
        return self.profile.step_s(prefill_tokens, n_dec, ctx_tok, n_req, self.adapters.n_active, self.max_lora_rank,
                                   self.config.max_loras, len(self.running), waiting, self.served)

    def _single_step(self, now: float, ctx: StepContext, preempted: bool) -> "StepPlan":
        prefill = 0
        ctx_tok = self.dec_base_sum + self.n_dec * self.g
        for rid, k in ctx.chunks:
            prefill += k
            ctx_tok += self.c[rid]
        d = self._step_time(prefill, self.n_dec, ctx_tok, self.n_waiting, self.n_dec + len(ctx.chunks))
        return StepPlan(ctx.chunks, ctx.loads, ctx.load_rids, 1, d, None, d, prefill, self.n_dec)

    def _decode_run(self, now: float, stop: Admit | None) -> "StepPlan":
        """A run of pure-decode steps that ends at the first step after which anything can
        change: a finish, a KV block shortage (preemption), an admissible arrival, a policy
        tick, an async load, the horizon. Step durations are summed one by one in the same
        order as single steps, so the clock is bit-identical to stepping one at a time."""
        g = self.g
        bs = self.block_size
        n_dec = self.n_dec
        # next finish
        heap = self.fin_heap
        dec = self.dec
        while heap:
            fg, rid = heap[0]
            dd = dec.get(rid)
            if dd is not None and dd[1] == fg:
                break
            heapq.heappop(heap)
        k_max = min(self.max_run_steps, heap[0][0] - g) if heap else self.max_run_steps
        # KV: cumulative block needs of steps 1.. must stay within the free pool
        free = self.total_blocks - self.used_blocks
        if n_dec:
            full = free // n_dec
            rem = free - full * n_dec
            cnt = self.res_cnt
            j = 1
            while j <= bs:
                cj = cnt[(g + j) % bs]
                if cj > rem:
                    break
                rem -= cj
                j += 1
            k_max = min(k_max, full * bs + j)
        # external events
        t_evt = min(self.scheduler.next_change_time(stop), self._async_until, self._next_tick, self.horizon)
        if self._prefetch_on and self._next_arr_t < t_evt:  # an arrival can start a prefetch
            t_evt = self._next_arr_t
        # sum the steps (the profile's decode-run entry point; same arithmetic as single steps)
        varying = self._ctx_matters or (self._waiting_matters and self._next_arr_t < INF)
        k, end, d, durs = self.profile.decode_run(
            now, k_max, t_evt, n_dec, self.dec_base_sum + n_dec * g, self.adapters.n_active, self.max_lora_rank,
            self.config.max_loras, len(self.running), self.served, self.n_waiting, varying,
            self._arrival_a, self._ok_cum, self.arr_ptr, self._next_arr_t)
        total = end - now
        # SimPy adds the delay to the clock: pick the delay that lands exactly on `end`
        while now + total < end:
            total = math.nextafter(total, INF)
        while now + total > end:
            total = math.nextafter(total, -INF)
        return StepPlan([], [], [], k, d, durs, total, 0, n_dec)

    def _preempt_until_fits(self, now: float) -> tuple[int, list[tuple[int, int]], int]:
        """vLLM v1's running loop when KV runs out: preempt the last running request
        until the allocation of the current one fits (exact order)."""
        bs = self.block_size
        g = self.g
        order = list(self.running)
        free = self.total_blocks - self.used_blocks
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[int, int]] = []
        need_total = 0
        i = 0
        while i < len(order) and budget > 0:
            rid = order[i]
            if rid in self.prefilling:
                k = min(self.T[rid] - self.c[rid], budget)
                nd = -(-(self.c[rid] + k) // bs) - self.held[rid]
            else:
                k = 1
                nd = 1 if (self.dec[rid][0] + g) % bs == 0 else 0
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
            freed = self.held.pop(rid)
            self.c.pop(rid)
            self.resume_T[rid] = self.T.pop(rid)  # prompt (+ tokens emitted before an earlier preemption)
        else:
            base, _ = self.dec.pop(rid)
            self.last_token_d[rid] = now  # a decoding request emitted at the end of the last step
            comp = base + self.g
            freed = -(-comp // bs)
            self.n_dec -= 1
            self.dec_base_sum -= base
            self.res_cnt[(-base) % bs] -= 1
            # vLLM v1 keeps the output tokens and recomputes prompt + all of them
            # (``num_computed_tokens = 0``; resumed with ``num_tokens``): the computed tokens
            # plus the last emitted one. ``T`` of a decoding request is stale (set when it
            # joined the decode aggregate), so it must not be used here.
            self.T.pop(rid)
            self.resume_T[rid] = comp + 1
        self.used_blocks -= freed
        self.n_waiting += 1
        self.preempt_d[rid] = self.preempt_d.get(rid, 0) + 1
        self.rec.preemptions += 1
        a = self._adapter_a[rid]
        if a >= 0:
            self.adapters.release(a, now)
        self.scheduler.on_preempt(rid)
        return freed

    def squash(self, rid: int) -> None:
        """Preempt running request ``rid`` between steps (recompute), for a policy's timed
        event (e.g. Chameleon's squash of a bypassing request, ``policies/chameleon.py``)."""
        if rid in self.running:
            self._preempt(rid, self.env.now)

    def _try_admit(self, ctx: StepContext, rid: int) -> Admit:
        """vLLM v1's checks for one waiting request (see :class:`~twin.interfaces.Admit`)."""
        budget = ctx.budget
        if budget <= 0:
            return Admit.NO_BUDGET
        if len(self.running) >= self.config.max_num_seqs:
            return Admit.NO_SEQ
        a = self._adapter_a[rid]
        ad = self.adapters
        if a >= 0 and not ad.active[a] and ad.n_active >= self.config.max_loras:
            return Admit.NO_SLOT
        T = self.resume_T.pop(rid, None) or self._prompt_a[rid]
        k = T if T < budget else budget
        nb = -(-k // self.block_size)
        h = 0
        if self._admit_hook is not None:  # adapter memory, prefix-KV reuse (twin/hooks.py)
            h = self._admit_hook(ctx, rid, a, T, nb)
            if h.__class__ is Admit:
                if T != self._prompt_a[rid]:
                    self.resume_T[rid] = T
                return h
            if h:  # h prompt tokens served from history KV: prefill starts there
                k = min(T - h, budget)
                nb = -(-(h + k) // self.block_size)
        if nb > self.total_blocks - self.used_blocks:
            if T != self._prompt_a[rid]:
                self.resume_T[rid] = T
            return Admit.NO_KV
        self.used_blocks += nb
        self.T[rid] = T
        self.c[rid] = h
        self.held[rid] = nb
        ctx.budget = budget - k
        ctx.chunks.append((rid, k))
        ctx.admitted.append(rid)
        self.running[rid] = None
        self.prefilling[rid] = None
        self.n_waiting -= 1
        now = self.env.now
        if not self._seen[rid]:
            self._seen[rid] = 1
            self._first_sched_a[rid] = now
        if a >= 0:
            ld = ad.acquire(a, now)
            if ld is not None:
                ctx.loads.append(ld)
                ctx.load_rids.append(rid)
        return Admit.OK

    def _complete_step(self, plan: "StepPlan", t0: float, load_s: float) -> None:
        """End of a step (or run of steps): emit tokens, record TTFTs and finishes."""
        now = self.env.now
        bs = self.block_size
        k = plan.k
        g0 = self.g
        self.g = g1 = g0 + k
        if k > 1:  # allocations of steps 1..k-1 of the run
            full, part = divmod(k - 1, bs)
            cnt = self.res_cnt
            extra = full * self.n_dec
            for j in range(1, part + 1):
                extra += cnt[(g0 + j) % bs]
            self.used_blocks += extra
        # prefill chunks: emit a token when a request has computed all its known tokens
        if plan.chunks:
            c, T = self.c, self.T
            for rid, kk in plan.chunks:
                cr = c[rid] + kk
                c[rid] = cr
                if cr == T[rid]:
                    self._emit_after_prefill(rid, now)
        # decoding requests that finish at g1
        heap = self.fin_heap
        if heap and heap[0][0] <= g1:
            dec = self.dec
            while heap and heap[0][0] <= g1:
                fg, rid = heapq.heappop(heap)
                dd = dec.get(rid)
                if dd is not None and dd[1] == fg:
                    self._finish_decoder(rid, now)
        self.rec.step(t0, now, k, plan.d, plan.durs, plan.total_s + load_s, len(self.running), plan.prefill_tokens,
                      plan.n_dec, self.adapters.n_active, self.used_blocks, self.adapters.resident_bytes,
                      len(plan.loads), sum(ld.nbytes for ld in plan.loads) if plan.loads else 0)

    def _emit_after_prefill(self, rid: int, now: float) -> None:
        if rid not in self.preempt_d or self._first_token_a[rid] != self._first_token_a[rid]:
            self._first_token_a[rid] = now          # <- TTFT is decided here
        else:
            self.gap_itl.append(now - self.last_token_d[rid])  # resumed after a preemption
        out = self._output_a[rid]
        cr = self.c.pop(rid)
        held = self.held.pop(rid)
        del self.prefilling[rid]
        e = cr + 1 - self._prompt_a[rid]  # tokens emitted so far (prompt + emitted = T = cr)
        if e >= out:
            self.used_blocks -= held
            self.T.pop(rid)
            self._finished(rid, now)
            return
        # join the decode aggregate: computed = base + g; finishes after out - e more steps
        self.T[rid] = cr + 1
        base = cr - self.g
        fg = self.g + out - e
        self.dec[rid] = (base, fg)
        self.dec_base_sum += base
        self.n_dec += 1
        self.res_cnt[(-base) % self.block_size] += 1
        heapq.heappush(self.fin_heap, (fg, rid))

    def _finish_decoder(self, rid: int, now: float) -> None:
        base, _ = self.dec.pop(rid)
        comp = base + self.g
        self.n_dec -= 1
        self.dec_base_sum -= base
        self.res_cnt[(-base) % self.block_size] -= 1
        self.used_blocks -= -(-comp // self.block_size)
        self.T.pop(rid)
        self._finished(rid, now)

    def _finished(self, rid: int, now: float) -> None:
        del self.running[rid]
        self.state[rid] = FINISHED
        self._finish_a[rid] = now
        self.n_finished += 1
        a = self._adapter_a[rid]
        if a >= 0:
            self.adapters.release(a, now)
        if self._finish_hook is not None:  # keep history KV (twin/prefix_kv.py)
            self._finish_hook(rid, now)
        self.scheduler.on_finish(rid)

    def emitted_now(self, rid: int) -> int:
        """Tokens emitted so far by ``rid`` (for reports on unfinished requests)."""
        if self.state[rid] == FINISHED:
            return int(self._output_a[rid])
        p = int(self._prompt_a[rid])
        if rid in self.dec:
            return self.dec[rid][0] + self.g + 1 - p
        if rid in self.T:
            return self.T[rid] - p
        if rid in self.resume_T:
            return self.resume_T[rid] - p
        return 0

    def finalize(self) -> None:
        """Per-request arrays of the sparse facts, after the run."""
        n = self.n
        self.emitted = np.where(self.state == FINISHED, self.output, 0)
        for rid in list(self.running) + list(self.resume_T):
            self.emitted[rid] = self.emitted_now(rid)
        self.load_wait = np.zeros(n)
        if self.load_wait_d:
            k = np.fromiter(self.load_wait_d.keys(), np.int64)
            self.load_wait[k] = np.fromiter(self.load_wait_d.values(), np.float64)
        self.preemptions = np.zeros(n, np.int64)
        if self.preempt_d:
            k = np.fromiter(self.preempt_d.keys(), np.int64)
            self.preemptions[k] = np.fromiter(self.preempt_d.values(), np.int64)

    # ------------------------------------------------------------------ checks
    def assert_invariants(self, mid_step: bool = False) -> None:
        """The engine's invariants (tests run with ``check_invariants=True``). Between
        steps the block count must match the requests' lengths exactly; during a step it
        also covers the blocks allocated for the tokens being computed."""
        bs = self.block_size
        held = 0
        for rid in self.running:
            if rid in self.prefilling:
                held += self.held[rid]
            else:
                held += -(-(self.dec[rid][0] + self.g + mid_step) // bs)
        assert held == self.used_blocks, f"KV accounting: held {held} != used {self.used_blocks}"
        assert 0 <= self.used_blocks <= self.total_blocks, "KV blocks exceed capacity"
        assert len(self.running) <= self.config.max_num_seqs, "more running requests than max_num_seqs"
        ad = self.adapters
        res = np.asarray(ad.resident, bool)
        act = np.asarray(ad.active, np.int64)
        assert ad.n_resident == int(res.sum()) <= max(ad.gpu_slots, 0), "resident adapters exceed slots"
        assert bool(np.all(res[act > 0])), "an adapter in use is not resident"
        assert ad.n_active == int((act > 0).sum()) <= self.config.max_loras, "too many adapters in the batch"
        assert len(self.dec) == self.n_dec == sum(1 for r in self.running if r not in self.prefilling), \
            "decode aggregate out of sync"
        arrived = self.state[: self.arr_ptr]
        waiting = int((arrived == PENDING).sum()) - sum(1 for r in self.running if r < self.arr_ptr)
        assert waiting == self.n_waiting, f"waiting count out of sync ({waiting} != {self.n_waiting})"
        assert all(self.state[r] == PENDING for r in self.running), "running set out of sync"
        if self._ext is not None:
            self._ext.check()

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        self.env.run(until=self.proc)
        self.finalize()


@dataclass
class StepPlan:
    """What one step (``k == 1``) or run of ``k`` identical decode steps does."""

    chunks: list[tuple[int, int]]
    loads: list[Load]
    load_rids: list[int]
    k: int
    d: float                    # duration of the first (or only) step
    durs: list[float] | None    # per-step durations of a run whose steps differ
    total_s: float
    prefill_tokens: int
    n_dec: int


def _as_array(code: str, values) -> array:
    """A compact ``array.array`` copy of a numpy column (fast scalar reads from Python)."""
    out = array(code)
    out.frombytes(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
    return out


def workload_columns(workload) -> dict[str, np.ndarray]:
    """Numpy columns of a :class:`~traces.workload.Workload` or of a mapping of columns."""
    if hasattr(workload, "df"):
        df = workload.df
        return {c: df[c].to_numpy() for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens",
                                               "adapter_id", "adapter_rank")}
    cols = dict(workload)
    n = len(cols["arrival_s"])
    cols.setdefault("request_id", np.arange(n, dtype=np.int64))
    cols.setdefault("adapter_id", np.full(n, -1, np.int64))
    cols.setdefault("adapter_rank", np.zeros(n, np.int64))
    arr = np.asarray(cols["arrival_s"], np.float64)
    if n and np.any(np.diff(arr) < 0):
        raise ValueError("workload arrays must be sorted by arrival_s")
    return cols


def check_startup(kv_tokens: int, max_model_len: int, slots: int, max_rank: int) -> None:
    """vLLM refuses to start when the KV cache cannot hold one ``max_model_len`` request."""
    if kv_tokens < max_model_len:
        raise StartupError(
            f"the KV cache left after the weights and {slots} LoRA slots of max rank {max_rank} holds "
            f"{kv_tokens} tokens, less than one max_model_len={max_model_len} request; vLLM would refuse to "
            f"start. Lower --slots or the max LoRA rank, lower max_model_len, or use a GPU with more memory")
