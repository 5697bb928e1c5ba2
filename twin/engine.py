"""The engine: a SimPy process that runs vLLM 0.8.5 v1-style continuous batching.

One engine step (``Engine._plan_step`` then ``Engine._complete_step``), as in vLLM v1's
``Scheduler.schedule``:

1. **Running requests first**, in admission order: every decoding request gets one token,
   a request still in (chunked) prefill gets ``min(remaining, budget)`` tokens. Each needs
   KV blocks for the tokens it computes (``ceil(tokens/16)``); when the pool is empty the
   *last* running request is preempted (recompute: its blocks are freed and it goes back
   to the front of the waiting queue), until the allocation fits or the request itself
   was preempted. Before preempting, policies' caches in the KV pool give back what they can
   (idle adapters, history KV: ``Extensions.reclaim_for_step``), and when copies in flight
   into the pool (prefetched adapters, history KV) would cover the rest once landed, the
   batch waits for them instead (``Engine._wait_for_landing``); such background copies
   leave the blocks the running prefills still need free (``Engine.background_reserve``).
2. **Waiting requests next**, only if nothing was preempted: the scheduler policy offers
   them to :meth:`StepContext.try_admit`, which applies vLLM's checks (token budget,
   ``max_num_seqs``, ``max_loras`` distinct adapters, KV blocks for the first chunk).
3. **Adapter loads**: adapters that joined the batch and are not in a GPU slot are
   loaded synchronously (disk -> CPU -> GPU), holding the host link (and the disk, one read at a
   time: ``twin.adapters.AdapterDisk``).
4. **Duration** = scheduler overhead + backbone(prefill tokens, decode sequences, context)
   + LoRA overhead (+ the loads), all from the :class:`~twin.perf.profile.Profile`.
5. **At the end of the step** every request that computed its last pending token emits a
   token. *A request's TTFT is decided here*: the first token is emitted at the end of the
   step that computes the last prompt token (``Engine._emit_after_prefill``, called from
   ``Engine._complete_step``).

The per-request columns, states, rejection rules and the start-up check live in
:mod:`twin.requests`; the state a step works on, its set-up and the read-only view that
policies use in :mod:`twin.engine_state`; the extensions some policies need (adapter memory layouts, prefetch,
prefix-KV reuse) in :mod:`twin.extensions`, called at the hook points this module declares.

Speed: the cost follows the events that change the batch, not the steps. Decoding
requests are kept in aggregate: a global step counter ``g`` (each decoding request's
computed length is ``base + g``), a heap of finish steps (``(step, rid)`` encoded as the int
``step * n + rid``: the same order, int comparisons), and per-residue counts of
which requests need a new KV block at which step (a request needs one when its length
is a multiple of the block size). A run of pure-decode steps in which nothing can change
(no finish, no KV exhaustion, no admissible arrival, no policy tick) is advanced as one
SimPy timeout; its step durations are summed one by one by :meth:`Profile.decode_run`
(a Python loop, in the same order as single steps) and recorded as a segment.
``max_run_steps=1`` disables this; a test checks both give identical results.

Other exact shortcuts, each with a switch and a test against the plain way: the walk over
the running requests when KV runs out goes in bulk between the positions where something
happens (``bulk_preempt_walk``); a wait with no other SimPy event pending moves the clock
directly instead of scheduling a timeout (``direct_clock``); a decode run's step durations
are a few float operations on the run's constants when the profile's forms allow it
(:meth:`Profile._decode_run_fast`, compared with ``max_run_steps=1``); a run that a finish
ends after its first step is that step's :meth:`Profile.step_s`, without the run machinery
(compared with ``max_run_steps=1``); a step that no waiting request can join builds no
:class:`StepContext`; the bulk walk reads the running order from columns kept per admission
(``Engine._running_order``, checked against the running dict by ``assert_invariants``).
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np

from twin.adapters import Load
from twin.config import EngineConfig
from twin.engine_state import EngineState
from twin.preemption import PreemptionWalk
from twin.interfaces import AdapterCachePolicy, Admit, Scheduler, is_builtin
from twin.requests import FINISHED, REJECTED, zeros_column
from twin.requests import StartupError, check_startup  # noqa: F401  (re-exported for twin.validate)

if TYPE_CHECKING:  # pragma: no cover
    from traces.workload import Workload
    from twin.perf.profile import Profile

INF = math.inf
_FINISHED = int(FINISHED)
# the outcomes as plain names (an enum member looked up on its class costs half a microsecond)
OK, NO_BUDGET, NO_SEQ, NO_SLOT, NO_KV = Admit.OK, Admit.NO_BUDGET, Admit.NO_SEQ, Admit.NO_SLOT, Admit.NO_KV
_NO_LOADS: tuple = ()  # the loads (and their requests) of a step that admits no one
#: :meth:`Engine._plan_step`'s answer when the running batch waits for copies in flight to land (``memory_stall``)
_STALL = object()


class StepContext:
    """What :meth:`Scheduler.schedule_waiting` may use during one step: the token ``budget``
    left, the requests ``admitted``, the prefill ``chunks`` ``(rid, tokens)``, the adapter
    ``loads`` the step waits for and the requests ``load_rids`` that wait with them, ``now``,
    and ``try_admit(rid)``, vLLM's checks for one waiting request (the engine's
    :meth:`Engine._try_admit` itself: the context is the engine's current one, so a policy's
    offer costs one call)."""

    __slots__ = ("engine", "budget", "admitted", "chunks", "loads", "load_rids", "now", "try_admit")

    def __init__(self, engine: "Engine", budget: int, chunks: list[tuple[int, int]], now: float) -> None:
        self.engine = engine
        self.budget = budget
        self.admitted: list[int] = []
        self.chunks = chunks
        self.loads: list[Load] = []
        self.load_rids: list[int] = []
        self.now = now
        engine._ctx = self
        self.try_admit = engine._try_admit_bound


class Engine(PreemptionWalk, EngineState):
    """Simulates one vLLM-like server over a workload: the step loop over an
    :class:`~twin.engine_state.EngineState`. Use :func:`twin.simulate.simulate`.
    Policies see the engine through :class:`twin.interfaces.EngineView`.
    """

    #: move SimPy's clock directly when no other event is pending (False: a timeout event per wait)
    direct_clock = True
    #: departed entries the running-order columns may hold beyond 4x the running ones before
    #: they are compacted (``_running_order``)
    run_columns_slack = 1024

    def __init__(self, workload: "Workload", profile: "Profile", config: EngineConfig, scheduler: Scheduler,
                 cache: AdapterCachePolicy, horizon_s: float | None = None, max_run_steps: int | None = None,
                 progress: bool = False, record_steps: bool = True, check_invariants: bool = False) -> None:
        super().__init__(workload, profile, config, scheduler, cache, horizon_s, max_run_steps, progress,
                         record_steps, check_invariants)
        # per-request columns of the running set for the bulk preemption walk: 1 while the
        # request is prefilling; a decoder's ``base`` (computed tokens = base + g)
        self._pref_flag = bytearray(self.n)
        self._pref_np = np.frombuffer(self._pref_flag, np.uint8) if self.n else np.zeros(0, np.uint8)
        self._base_a = zeros_column(self.n)
        self._base_np = np.frombuffer(self._base_a, np.int64) if self.n else np.zeros(0, np.int64)
        # the running requests in admission order as columns, for the bulk walk: every admission
        # appends its request and a 1 (alive); leaving the batch clears the 1 (``_rid_seq``: a
        # request's position); the order is the alive entries from ``_run_lo`` on (_running_order)
        self._run_seq_rid = array("q")
        self._run_alive = bytearray()
        self._rid_seq = zeros_column(self.n)
        self._run_lo = 0
        #: the finish heap's entries are ``finish step * _fin_m + rid`` (ordered as ``(step, rid)``)
        self._fin_m = max(self.n, 1)
        self._ctx: StepContext | None = None  # the step context of the step being planned
        self._try_admit_bound = self._try_admit  # (StepContext.try_admit; bound once)
        if not is_builtin(scheduler):  # a user's scheduler: its offers are checked
            self._try_admit_bound = self._try_admit_checked
        # the scheduler's on_finish, None when it is Scheduler's no-op (a finish then calls nothing)
        on_finish = scheduler.on_finish
        self._on_finish = None if getattr(on_finish, "__func__", None) is Scheduler.on_finish else on_finish
        self.proc = self.env.process(self._run())
        #: per request: 0 never admitted (or no adapter), 1 its adapter was resident (in a GPU slot,
        #: not still loading, not loaded by the admitting step) when the request was first admitted,
        #: 2 it was not (twin/metrics.py)
        self.adapter_hit_code = bytearray(self.n)
        # the state column written through a memoryview (a numpy item assignment costs twice as much)
        self._state_mv = memoryview(self.state) if self.n else None
        if progress:  # the bar counts finished requests of those not rejected up front (twin/recorder.py)
            self.rec.progress_requests = int(np.count_nonzero(self.state != REJECTED))

    # ------------------------------------------------------------------ SimPy process
    def _run(self):
        env = self.env
        horizon = self.horizon
        timed = horizon < INF
        check = self.check_invariants
        progress = self.progress
        idle_ticks = idle_g = 0
        stalled = False
        # SimPy's queue: when it is empty, nothing else can happen while the engine waits, and
        # the wait is the clock moving to ``now + delay`` (what ``env.timeout`` followed by
        # ``env.step`` would do: the same float addition), without an event
        queue = env._queue if self.direct_clock else None
        while True:
            now = env._now
            if now >= horizon:
                break
            if now >= self._next_arr_t:
                self._ingest(now)
            if now >= self._next_tick:
                self._tick(now)
            if now >= self._async_until:
                self._fire_events(now)
            if stalled:  # (the ticks and landings at the end of a memory stall saw it: new copies waited)
                self.memory_stall = False
            plan = self._plan_step(now)
            if plan is _STALL:  # the running batch waits for copies in flight to land (_wait_for_landing)
                ext = self.extensions
                if not stalled:  # (a new wait; planning again after a landing, tick or arrival is the same wait)
                    ext.memory_stalls += 1
                stalled = True
                t_next = min(self._next_arr_t, self._async_until, self._next_tick, horizon)
                yield env.timeout(max(t_next - now, 0.0))  # (a copy in flight is a SimPy process: never direct)
                ext.memory_stall_s += env._now - now
                continue
            stalled = False
            if plan is None:  # idle: sleep until something can happen
                if self._release_holds is not None and self.n_waiting and self._release_holds(now):
                    # nothing runs and no waiting request was admitted while nodes held for waiting requests had
                    # landed: they may be what blocks every admission, and nothing running will free memory;
                    # released, the step is planned again (twin/extensions.py, Extensions.release_ready_holds)
                    continue
                # (the next arrival, timed event or policy tick: a tick acts on an idle server too, e.g. FastLibra's
                # swapper swaps in at its ticks, prefetch_at_tick)
                t_next = min(self._next_arr_t, self._async_until, self._next_tick, horizon)
                if t_next == INF:
                    break
                if self._next_arr_t == INF and self._async_until == INF and t_next == self._next_tick:
                    # only policy ticks are left: stop when nothing waits, or after 16 ticks in a row that admit
                    # nothing (counted since the last step: a scheduler that admits at its ticks makes progress)
                    if self.g != idle_g:
                        idle_ticks, idle_g = 0, self.g
                    idle_ticks = idle_ticks + 1 if self.n_waiting else 1 << 30
                    if idle_ticks > 16:
                        break
                if queue is not None and not queue:
                    env._now = env._now + max(t_next - now, 0.0)
                else:
                    yield env.timeout(max(t_next - now, 0.0))
                continue
            load_s = 0.0
            if plan.loads:  # synchronous loads, on the step's critical path
                # when they end, from the link's FIFO state (the copies in flight or announced, then these behind
                # them: HostLink.loads_end, exact): a step that would end after the horizon does not start them
                end = self.link.loads_end(now, plan.loads, self.adapters.disk) if timed or check else 0.0
                if timed and end + plan.total_s > horizon:
                    break  # in flight at the horizon
                for ld in plan.loads:
                    if ld.wait is not None:  # an asynchronous load still in flight (twin/prefetch.py)
                        yield ld.wait
                        continue
                    if ld.disk_s:  # (behind the prefetches' reads: AdapterDisk)
                        yield env.timeout(self.adapters.disk.read_delay(env._now, ld.disk_s))
                    yield env.process(self.link.transfer(ld.nbytes, ld.link_s))
                if check:
                    assert env.now == end, f"the loads ended at {env.now}, not when the link's schedule says ({end})"
                load_s = env.now - now
                lw = self.load_wait_d
                for rid in plan.load_rids:
                    lw[rid] = lw.get(rid, 0.0) + load_s
            if timed and (plan.end if plan.end is not None else env._now + plan.total_s) > horizon:
                # the step ends after the horizon: it is in flight there, and its tokens, first tokens and finishes
                # come after the window (its requests stay unfinished); a run ends before it (_decode_run)
                break
            if check:
                self.assert_invariants(mid_step=True)
            if plan.end is not None:  # a run of decode steps: the clock lands on their summed end
                if (wait := self._clock_until(plan.end)) is not None:
                    yield wait
            elif queue is not None and not queue:
                env._now = env._now + plan.total_s
            else:
                yield env.timeout(plan.total_s)
            self._complete_step(plan, now, load_s)
            if check:
                self.assert_invariants()
            if progress:
                self.rec.progress(env.now, horizon, self.n_finished)
        self.rec.close_progress()

    def _ingest(self, now: float) -> None:
        """Requests that arrived by ``now`` join the waiting queue (rejected ones are counted)."""
        lo = hi = self.arr_ptr
        arr, n = self.arrival_a, self.n
        while hi < n and hi - lo < 8 and arr[hi] <= now:
            hi += 1
        if hi < n and arr[hi] <= now:
            hi = bisect_right(arr, now, hi)
        self.arr_ptr = hi
        self._next_arr_t = arr[hi] if hi < n else INF
        ok = self.ok_cum
        self.n_waiting += ok[hi] - ok[lo]
        self.scheduler.on_arrivals(lo, hi)

    # ------------------------------------------------------------------ one step
    def _plan_step(self, now: float) -> "StepPlan | None":
        g = self.g
        bs = self.block_size
        preempted = False
        # 1. running requests: decodes (1 token each) then prefill chunks, KV allocation
        budget = self._max_batched - self.n_dec
        need = self.res_cnt[g % bs]
        chunks: list[tuple[int, int]] = []
        prefilling = self.prefilling
        if prefilling:
            T, c, held = self.T, self.c, self.held
            for rid in prefilling:
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
            if self._reclaim is not None and self._wait_for_landing(need):
                return _STALL
            preempted = True
            budget, chunks, need = self._preempt_until_fits(now)
        self.used_blocks += need
        if chunks:
            held, c = self.held, self.c
            for rid, k in chunks:
                held[rid] = -(-(c[rid] + k) // bs)
        # 2. waiting requests (vLLM: only when nothing was preempted this step)
        admit = not preempted and self.n_waiting and budget > 0
        if not admit and not self._prefetch_on:  # no step context needed: no one can join
            if not self.running:
                return None
            if chunks or preempted or self.max_run_steps == 1:
                return self._single_step(chunks, _NO_LOADS, _NO_LOADS)
            return self._decode_run(now, None)
        ctx = StepContext(self, budget, chunks, now)
        stop: Admit | None = None
        if admit:
            stop = self._schedule_waiting(ctx)
        if not self.running:
            return None
        # 3./4. duration: one step, or a run of identical decode steps
        # (the prefetch decisions first: every step makes them, and a synchronous prefetch adds to ctx.loads)
        if ((self._prefetch_on and self._prefetch_changed(ctx, now))
                or ctx.chunks or ctx.loads or preempted or self.max_run_steps == 1):
            return self._single_step(ctx.chunks, ctx.loads, ctx.load_rids)
        plan = self._decode_run(now, stop)
        if self._prefetch_failed and plan.k > 1:
            # stepping retries the failed prefetch placements before every step of the run, failing alike (a failure
            # changes nothing, and nothing that would change it happens within a run): the per-attempt counter
            # counts them all
            self.adapters.placement.alloc_failures += self._prefetch_failed * (plan.k - 1)
        return plan

    def _wait_for_landing(self, need: int) -> bool:
        """Whether the running batch, short of KV blocks after the caches gave what they could, waits for copies
        in flight to land instead of preempting (True: ``memory_stall`` is set, and the step is planned again at
        the next timed event, tick or arrival).

        A prefetched adapter or a history-KV node being copied into the pool holds its blocks until its copy ends:
        the copy writes into them, so they can be freed only then (a real engine would synchronise the copy stream
        before handing the blocks to the batch). When the free blocks plus those of the copies in flight that
        nothing will hold once landed (:meth:`twin.extensions.Extensions.landing_blocks`: no running request's
        adapter, no waiting request's hold) cover the step's ``need``, preempting -- and recomputing the victim's
        tokens later -- is the worse choice: the batch waits the rest of the copies, and the landed copies are
        reclaimed at the next plan. While it waits (``memory_stall``), no new background copy takes pool blocks
        (:meth:`twin.prefetch.AsyncLoader.start`, :meth:`twin.prefix_kv.HistoryKV.swap_in`), so the copies in
        flight only land and a stall always ends: in a step, or in the preemption vLLM's order makes once
        nothing in flight can help. Before this rule (stop 68), a policy that prefetched into the freed pool at
        every tick could preempt the only running request for ever
        (``tests/twin/test_prefetch.py::test_prefetches_in_flight_do_not_starve_the_running_batch``)."""
        if self._async_until == INF:  # (no copy can land: nothing to wait for)
            return False
        if self.total_blocks - self.used_blocks + self.extensions.landing_blocks() < need:
            return False
        self.memory_stall = True
        return True

    def background_reserve(self) -> int:
        """KV blocks the running batch's prefills still need to compute their prompts: a background copy into the
        pool (a policy's prefetch, a history-KV swap-in; not a waiting request's own swap-in) leaves them free
        (:meth:`twin.adapter_placement.UnifiedPool.allocate`, :meth:`twin.prefix_kv.HistoryKV.swap_in`).

        vLLM allocates a prefill's blocks chunk by chunk, so the pool's free blocks overstate what a copy for a
        *waiting* request may take: a prefetch into them starves the next chunk, which then waits for the copy
        to land (:meth:`_wait_for_landing`) or preempts the prefill -- and the landed copy, idle, is reclaimed and
        prefetched again at the next step (stop 68's fuzz: a prefill stalled and preempted every 0.14 s, the run
        30 % longer). The decoders' growth, a block per request every ``block_size`` steps, is not reserved."""
        prefilling = self.prefilling
        if not prefilling:
            return 0
        T, held, bs = self.T, self.held, self.block_size
        return sum(-(-T[rid] // bs) - held[rid] for rid in prefilling)

    def _prefetch_changed(self, ctx: StepContext, now: float) -> bool:
        """The prefetch decisions after a step's admissions (twin/extensions.py, twin/prefetch.py); True when one
        started (or an eviction made room for one): the outcome that stopped the admissions may no longer hold --
        its slot now held by a load in flight, a NO_KV head turns NO_SLOT, which FCFS skips -- so the next step
        must try again, as stepping does, and this one is a single step."""
        ext, mem = self.extensions, self.adapters
        loader = ext.loader
        before = (loader.started, mem.evictions, len(mem.loading))
        fails = getattr(mem.placement, "alloc_failures", 0)
        ext.after_schedule(ctx, now)
        self._prefetch_failed = getattr(mem.placement, "alloc_failures", 0) - fails  # (placements it tried in vain)
        return (loader.started, mem.evictions, len(mem.loading)) != before

    def _single_step(self, chunks: list[tuple[int, int]], loads: "list[Load]", load_rids: list[int]) -> "StepPlan":
        """One step of the current batch: the decoders' tokens plus the prefill ``chunks``."""
        n_dec = self.n_dec
        prefill = 0
        ctx_tok = self.dec_base_sum + n_dec * self.g
        c = self.c
        for rid, k in chunks:
            prefill += k
            ctx_tok += c[rid]
        rank_sums = None
        own = self._own_rank
        if own is not None:  # the requests' own ranks: over the requests, and over the LoRA tokens
            rank_req = rank_tok = self.dec_rank_sum
            for rid, k in chunks:
                r = own[rid]
                rank_req += r
                rank_tok += k * r
            rank_sums = (rank_req, rank_tok)
        d = self._price_step(prefill, n_dec, ctx_tok, n_dec + len(chunks), self.adapters.n_active,
                             self.max_lora_rank, self._max_loras, len(self.running), self.n_waiting, self.served,
                             rank_sums, self._registered())
        return StepPlan(chunks, loads, load_rids, 1, d, None, d, prefill, n_dec)

    def _decode_run(self, now: float, stop: Admit | None) -> "StepPlan":
        """A run of pure-decode steps that ends at the first step after which anything can
        change: a finish, a KV block shortage (preemption), an admissible arrival, a policy
        tick, an async load, the horizon. Step durations are summed one by one in the same
        order as single steps, so the clock is bit-identical to stepping one at a time."""
        g = self.g
        bs = self.block_size
        n_dec = self.n_dec
        rank_sums = None if self._own_rank is None else (self.dec_rank_sum, self.dec_rank_sum)
        # next finish
        heap = self.fin_heap
        dec = self.dec
        m = self._fin_m
        while heap:
            fg, rid = divmod(heap[0], m)
            dd = dec.get(rid)
            if dd is not None and dd[1] == fg:
                break
            heapq.heappop(heap)
        if heap and heap[0] // m - g == 1:
            # a decoder finishes after the next step: the run is that one step, whatever the
            # KV pool and the external events (what :meth:`Profile.decode_run` returns for
            # ``k_max == 1``: its one duration is :meth:`Profile.step_s` of the batch)
            d = self._price_step(0, n_dec, self.dec_base_sum + n_dec * g, n_dec, self.adapters.n_active,
                                 self.max_lora_rank, self._max_loras, len(self.running), self.n_waiting, self.served,
                                 rank_sums, self._registered())
            varying = self._ctx_matters or (self._waiting_matters and self._next_arr_t < INF)
            return StepPlan(_NO_LOADS, _NO_LOADS, _NO_LOADS, 1, d, [d] if varying else None, d, 0, n_dec)
        k_max = min(self.max_run_steps, heap[0] // m - g) if heap else self.max_run_steps
        # KV: cumulative block needs of steps 1.. must stay within the free pool
        free = self.total_blocks - self.used_blocks
        if n_dec and free // n_dec * bs < k_max:  # (else the pool lasts beyond k_max steps whatever j is)
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
        t_evt = min(self._next_change_time(stop), self._async_until, self._next_tick, self._observe_t)
        if self._prefetch_on and self._next_arr_t < t_evt:  # an arrival can start a prefetch
            t_evt = self._next_arr_t
        # sum the steps (the profile's decode-run entry point; same arithmetic as single steps)
        varying = self._ctx_matters or (self._waiting_matters and self._next_arr_t < INF)
        k, end, d, durs = self._price_decode_run(
            now, k_max, t_evt, n_dec, self.dec_base_sum + n_dec * g, self.adapters.n_active, self.max_lora_rank,
            self._max_loras, len(self.running), self.served, self.n_waiting, varying,
            self.arrival_a, self.ok_cum, self.arr_ptr, self._next_arr_t, rank_sums, self._registered())
        if k > 1 and end > self._observe_t:  # the last step crosses the horizon or a check: the run ends before it
            k, end, d, durs = self._price_decode_run(  # (the same steps, one fewer: nothing changed in between)
                now, k - 1, t_evt, n_dec, self.dec_base_sum + n_dec * g, self.adapters.n_active, self.max_lora_rank,
                self._max_loras, len(self.running), self.served, self.n_waiting, varying,
                self.arrival_a, self.ok_cum, self.arr_ptr, self._next_arr_t, rank_sums, self._registered())
        if k == 1:  # (the clock adds the one duration, as a single step's)
            return StepPlan(_NO_LOADS, _NO_LOADS, _NO_LOADS, 1, d, durs, d, 0, n_dec)
        plan = StepPlan(_NO_LOADS, _NO_LOADS, _NO_LOADS, k, d, durs, end - now, 0, n_dec)
        plan.end = end  # the clock lands on the summed end (EngineState._clock_until)
        return plan

    def _preempt(self, rid: int, now: float) -> int:
        """Recompute preemption: free the blocks, back to the front of the waiting queue."""
        bs = self.block_size
        del self.running[rid]
        self._run_alive[self._rid_seq[rid]] = 0
        if rid in self.prefilling:
            del self.prefilling[rid]
            self._pref_flag[rid] = 0
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
            if self._own_rank is not None:
                self.dec_rank_sum -= self._own_rank[rid]
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
        a = self.adapter_a[rid]
        if a >= 0:
            if self._wad is not None:  # (kept once a policy asked: waiting_adapter_counts)
                self._wad[a] += 1
            self.adapters.release(a, now)
        self.scheduler.on_preempt(rid)
        return freed

    def squash(self, rid: int) -> None:
        """Preempt running request ``rid`` between steps (recompute), for a policy's timed
        event (e.g. Chameleon's squash of a bypassing request, ``policies/chameleon.py``)."""
        if rid in self.running:
            self._preempt(rid, self.env.now)

    def _try_admit_checked(self, rid: int) -> Admit:
        """``ctx.try_admit`` for a scheduler that is not built in: an offer of a request that is not
        waiting is refused (:meth:`EngineState.check_offer`), then :meth:`_try_admit`."""
        self.check_offer(rid)
        return self._try_admit(int(rid))

    def _try_admit(self, rid: int) -> Admit:
        """vLLM v1's checks for one waiting request (see :class:`~twin.interfaces.Admit`), in the
        current step context ``self._ctx``; ``ctx.try_admit`` is this method. The refusals that
        need no arithmetic come first; an admission writes the request's state and nothing is
        built for a refused one."""
        ctx = self._ctx
        budget = ctx.budget
        if budget <= 0:
            return NO_BUDGET
        running = self.running
        if len(running) >= self._max_seqs:
            return NO_SEQ
        a = self.adapter_a[rid]
        ad = self.adapters
        if a >= 0 and not ad.active[a] and (ad.n_active >= self._max_loras
                                             or (ad.loading and ad.slot_blocked_by_loads(a))):
            return NO_SLOT  # (or every free slot is taken by a prefetch still in flight)
        resume = self.resume_T  # (a preempted request's entry leaves it only when it is admitted)
        T = (resume.get(rid) if resume else None) or self.prompt_a[rid]
        k = T if T < budget else budget
        bs = self.block_size
        nb = -(-k // bs)
        h = 0
        if self._admit_hook is not None:  # adapter memory, prefix-KV reuse (twin/extensions.py)
            h = self._admit_hook(ctx, rid, a, T, nb)
            if h.__class__ is Admit:
                return h
            if h:  # h prompt tokens served from history KV: prefill starts there
                k = min(T - h, budget)
                nb = -(-(h + k) // bs)
        used = self.used_blocks
        if nb > self.total_blocks - used:
            return NO_KV
        if resume:
            resume.pop(rid, None)
        self.used_blocks = used + nb
        self.T[rid] = T
        self.c[rid] = h
        self.held[rid] = nb
        ctx.budget = budget - k
        ctx.chunks.append((rid, k))
        ctx.admitted.append(rid)
        running[rid] = None
        alive = self._run_alive
        self._rid_seq[rid] = len(alive)
        alive.append(1)
        self._run_seq_rid.append(rid)
        self.prefilling[rid] = None
        self._pref_flag[rid] = 1
        self.n_waiting -= 1
        seen = self._seen
        if a >= 0:
            if self._wad is not None:  # (kept once a policy asked: waiting_adapter_counts)
                self._wad[a] -= 1
            now = ctx.now
            if not seen[rid]:
                seen[rid] = 1
                self._first_sched_a[rid] = now
                # resident: in a slot, not loading, and not placed there by this step's own loads
                self.adapter_hit_code[rid] = 1 if ad.resident[a] and ad.loaded_at[a] != now and a not in ad.loading else 2
            act = ad.active
            if act[a]:  # already in the batch: AdapterMemory.acquire only counts the request
                act[a] += 1
            else:
                ld = ad.acquire(a, now)
                if ld is not None:
                    ctx.loads.append(ld)
                    ctx.load_rids.append(rid)
        elif not seen[rid]:
            seen[rid] = 1
            self._first_sched_a[rid] = ctx.now
        return OK

    def _complete_step(self, plan: "StepPlan", t0: float, load_s: float) -> None:
        """End of a step (or run of steps): emit tokens, record TTFTs and finishes."""
        now = self.env._now
        k = plan.k
        g0 = self.g
        self.g = g1 = g0 + k
        if k > 1:  # allocations of steps 1..k-1 of the run
            bs = self.block_size
            full, part = divmod(k - 1, bs)
            extra = full * self.n_dec
            if part:
                cnt = self.res_cnt
                for j in range(1, part + 1):
                    extra += cnt[(g0 + j) % bs]
            self.used_blocks += extra
        # the batch during the segment's last step, recorded before anyone leaves it. (vLLM 0.8.5's gauges
        # are taken after the step's finishers left, Scheduler.update_from_output -> make_stats, and hold
        # during the next step: per request one step fewer, its admitting step. Measured on four dt_modelling
        # re-creations from 3 to 560 running: time means 0.55-0.71 % below these, KV per running request
        # 0.04-0.14 %: not modelled; README, "Fidelity")
        ad = self.adapters
        batch, active, kv_blocks, mem = len(self.running), ad.n_active, self.used_blocks, ad.resident_bytes
        # prefill chunks: emit a token when a request has computed all its known tokens
        chunks = plan.chunks
        if chunks:
            self._emit_after_prefill(chunks, now)
        # decoding requests that finish at g1
        heap = self.fin_heap
        if heap and heap[0] < (g1 + 1) * self._fin_m:  # a decoder finishes at g1
            self._finish_decoders(g1, now)
        loads = plan.loads
        self.rec.step(t0, now, k, plan.d, plan.durs, plan.total_s + load_s, batch, plan.prefill_tokens,
                      plan.n_dec, active, kv_blocks, mem, sum(ld.copies for ld in loads) if loads else 0,
                      sum(ld.nbytes for ld in loads) if loads else 0)

    def _emit_after_prefill(self, chunks: list[tuple[int, int]], now: float) -> None:
        """The step's prefill ``chunks`` are computed: a request that computed all its known
        tokens emits one now -- *its first token (TTFT) is decided here* -- and joins the decode
        aggregate (computed = base + g; it finishes after ``output - emitted`` more steps), or
        finishes when that was its last token.

        One pass over the chunks with the engine's counters in locals; they are written back
        before anything outside the engine can run (an adapter going idle, a finish hook, the
        scheduler's ``on_finish``), so every callback sees the state of request-by-request
        processing."""
        c, T = self.c, self.T
        fta = None
        for rid, kk in chunks:
            cr = c[rid] + kk
            c[rid] = cr
            if cr != T[rid]:
                continue
            if fta is None:  # the first emit of the step: the columns and counters as locals
                fta, preempt_d, output_a, prompt_a = self._first_token_a, self.preempt_d, self.output_a, self.prompt_a
                held, prefilling, pref_flag = self.held, self.prefilling, self._pref_flag
                dec, base_a, res_cnt, heap = self.dec, self._base_a, self.res_cnt, self.fin_heap
                own = self._own_rank
                g, bs, m = self.g, self.block_size, self._fin_m
                used, n_dec, base_sum = self.used_blocks, self.n_dec, self.dec_base_sum
            if rid not in preempt_d or fta[rid] != fta[rid]:
                fta[rid] = now          # <- TTFT is decided here
            else:
                self.gap_itl.append(now - self.last_token_d[rid])  # resumed after a preemption
            out = output_a[rid]
            del c[rid]
            h = held.pop(rid)
            del prefilling[rid]
            pref_flag[rid] = 0
            e = cr + 1 - prompt_a[rid]  # tokens emitted so far (prompt + emitted = T = cr)
            if e >= out:
                used -= h
                del T[rid]
                self.used_blocks, self.n_dec, self.dec_base_sum = used, n_dec, base_sum
                self._finished(rid, now)
                used, n_dec, base_sum = self.used_blocks, self.n_dec, self.dec_base_sum
                continue
            # join the decode aggregate: computed = base + g; finishes after out - e more steps
            T[rid] = cr + 1
            base = cr - g
            fg = g + out - e
            dec[rid] = (base, fg)
            base_a[rid] = base
            base_sum += base
            if own is not None:
                self.dec_rank_sum += own[rid]
            n_dec += 1
            res_cnt[(-base) % bs] += 1
            heapq.heappush(heap, fg * m + rid)
        if fta is not None:
            self.used_blocks, self.n_dec, self.dec_base_sum = used, n_dec, base_sum

    def _finish_decoders(self, g1: int, now: float) -> None:
        """Decoding requests whose last token is emitted at step ``g1`` leave the decode aggregate
        (then the batch, :meth:`_finished`), in finish-heap order; entries of requests preempted
        since they were pushed are stale and skipped."""
        heap, dec, T, res_cnt = self.fin_heap, self.dec, self.T, self.res_cnt
        pop = heapq.heappop
        m = self._fin_m
        own = self._own_rank
        lim = (g1 + 1) * m  # entries below it finish at or before g1
        bs = self.block_size
        while heap and heap[0] < lim:
            fg, rid = divmod(pop(heap), m)
            dd = dec.get(rid)
            if dd is None or dd[1] != fg:
                continue
            base = dd[0]
            del dec[rid]
            self.n_dec -= 1
            self.dec_base_sum -= base
            if own is not None:
                self.dec_rank_sum -= own[rid]
            res_cnt[(-base) % bs] -= 1
            self.used_blocks -= -(-(base + g1) // bs)
            del T[rid]
            self._finished(rid, now)

    def _finished(self, rid: int, now: float) -> None:
        """``rid`` emitted its last token: it leaves the batch."""
        del self.running[rid]
        self._run_alive[self._rid_seq[rid]] = 0
        self._state_mv[rid] = _FINISHED
        self._finish_a[rid] = now
        self.n_finished += 1
        a = self.adapter_a[rid]
        if a >= 0:
            act = self.adapters.active
            if act[a] > 1:  # other requests of the adapter stay: AdapterMemory.release only counts it
                act[a] -= 1
            else:
                self.adapters.release(a, now)
        if self._finish_hook is not None:  # keep history KV (twin/prefix_kv.py)
            self._finish_hook(rid, now)
        if self._on_finish is not None:  # (None: the scheduler keeps Scheduler's no-op)
            self._on_finish(rid)

    def _running_order(self) -> np.ndarray:
        """The running requests in admission order (``list(self.running)``) as an int64 array,
        from the admission columns: a vectorised mask instead of converting the dict's keys."""
        alive = self._run_alive
        lo, n = self._run_lo, len(alive)
        while lo < n and not alive[lo]:  # a low-water mark past requests that left the batch
            lo += 1
        self._run_lo = lo
        if lo == n:
            return np.zeros(0, np.int64)
        seq = np.frombuffer(self._run_seq_rid, np.int64)[lo:]
        mask = np.frombuffer(alive, np.bool_)[lo:]
        order = seq[mask]
        del seq, mask  # (release the buffers: the columns grow at the next admission)
        if n - lo > 4 * len(order) + self.run_columns_slack:  # mostly departed entries: keep the running ones
            self._run_seq_rid = array("q", order.tobytes())
            self._run_alive = bytearray(b"\x01") * len(order)
            pos = np.frombuffer(self._rid_seq, np.int64)
            pos[order] = np.arange(len(order), dtype=np.int64)
            del pos
            self._run_lo = 0
        return order

    def assert_invariants(self, mid_step: bool = False) -> None:
        super().assert_invariants(mid_step)
        assert self._running_order().tolist() == list(self.running), "running-order columns out of sync"

    def run(self) -> None:
        self.env.run(until=self.proc)
        self.finalize()


class StepPlan:
    """What one step (``k == 1``) or run of ``k`` identical decode steps does: its prefill
    ``chunks`` ``(rid, tokens)``, the adapter ``loads`` it waits for and the requests
    ``load_rids`` that wait with them, the duration ``d`` of its first (or only) step, the
    per-step durations ``durs`` of a run whose steps differ (else None), the total
    ``total_s``, its ``prefill_tokens`` and decoding requests ``n_dec``; a run of ``k > 1`` steps also its
    ``end``, the clock summed step by step, which the clock is moved to (a delay cannot always land on it)."""

    __slots__ = ("chunks", "loads", "load_rids", "k", "d", "durs", "total_s", "prefill_tokens", "n_dec", "end")

    def __init__(self, chunks: list[tuple[int, int]], loads: "list[Load] | tuple", load_rids: "list[int] | tuple",
                 k: int, d: float, durs: list[float] | None, total_s: float, prefill_tokens: int, n_dec: int) -> None:
        self.chunks = chunks
        self.loads = loads
        self.load_rids = load_rids
        self.k = k
        self.d = d
        self.durs = durs
        self.total_s = total_s
        self.prefill_tokens = prefill_tokens
        self.n_dec = n_dec
        self.end: float | None = None  # a run of k > 1 decode steps: its end, summed step by step
