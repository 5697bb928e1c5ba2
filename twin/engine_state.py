"""The engine's state: its set-up, the read-only view policies use, timed events, checks.

:class:`EngineState` holds what one engine step works on -- the request table
(:mod:`twin.requests`), the KV pool, the running batch with its decode aggregate, the
adapter memory, the policies and the extensions -- and implements
:class:`twin.interfaces.EngineView` over it. The step loop that changes it is
:class:`twin.engine.Engine`.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import simpy
from simpy.events import NORMAL

from twin.adapters import AdapterMemory, HostLink
from twin.config import MAX_SIM_SECONDS, EngineConfig
from twin.extensions import install_extensions
from twin.interfaces import (AdapterCachePolicy, PolicyError, Scheduler, check_policy_objects, check_tick_interval,
                             callback_label, checked_next_change_time, claim_for_run, checked_schedule_waiting,
                             explain_policy_failure, policy_label)
from twin.recorder import Recorder
from twin.requests import DEFAULT_DROP_REASON, FINISHED, PENDING, REJECTED, RequestTable, StartupError, check_startup
from twin.tensor_parallel import calibrated_degree, load_split, tp_profile

if TYPE_CHECKING:  # pragma: no cover
    from traces.workload import Workload
    from twin.perf.profile import Profile
    from twin.prefix_kv import HistoryKV

INF = math.inf
_NO_HOLDS: "Mapping[int, int]" = MappingProxyType({})


def engine_setup(config: EngineConfig, profile: "Profile", cache: AdapterCachePolicy) -> tuple[EngineConfig, "Profile"]:
    """The configuration and profile an engine runs with (validated): the cache policy's own KV block size, and the
    profile priced for tensor parallelism (each GPU computes 1/TP of the step, :mod:`twin.tensor_parallel`) and for
    adapters paged in the KV pool (FastLibra §2). A sweep's start-up check and early-stop bound read the same."""
    if cache.kv_block_size and cache.kv_block_size != config.block_size:  # the system's block size
        config = dataclasses.replace(config, block_size=int(cache.kv_block_size))
    config.validate()
    if config.tensor_parallel > 1 or calibrated_degree(profile) != 1:
        profile = tp_profile(profile, config.tensor_parallel)
    if cache.lora_compute == "paged":
        profile = profile.with_paged_lora()
    return config, profile


def kv_capacity(cfg: EngineConfig, profile: "Profile", max_lora_rank: int) -> int:
    """The KV cache's tokens left after the weights and the LoRA buffers of ``cfg``'s slots at ``max_lora_rank``
    (or ``kv_capacity_tokens``; ``profile``: :func:`engine_setup`'s)."""
    slots = cfg.max_loras if cfg.enable_lora else 0
    return int(cfg.kv_capacity_tokens or profile.kv_capacity_tokens(slots, max_lora_rank if slots else 0))


def kv_at_startup(cfg: EngineConfig, profile: "Profile", max_lora_rank: int) -> int:
    """vLLM's start-up: :func:`kv_capacity`, refused with a :class:`StartupError` naming the fix when it cannot
    hold one block or one ``max_model_len`` request."""
    slots = cfg.max_loras if cfg.enable_lora else 0
    kv = kv_capacity(cfg, profile, max_lora_rank)
    if kv // cfg.block_size < 1 and not cfg.kv_capacity_tokens and slots and max_lora_rank:
        # the slots' LoRA buffers took the memory the KV cache would have had (vLLM: no blocks left)
        raise StartupError(f"{slots} adapter slots of max rank {max_lora_rank} leave no memory for the KV "
                           f"cache on {profile.name}'s GPU (their LoRA buffers take what the weights leave); vLLM "
                           f"would refuse to start: give fewer slots (max_loras) or a lower max_lora_rank")
    if kv // cfg.block_size < 1:  # (and a per-block-offset table of block_size entries would not fit either)
        raise StartupError(f"block_size {cfg.block_size} exceeds the KV cache's {kv} tokens: not one "
                           f"block fits; use vLLM's block sizes (8, 16, 32, 64, 128; default 16)")
    check_startup(kv, cfg.max_model_len or profile.model.max_model_len, slots, max_lora_rank)
    return kv


def check_run_arguments(config: EngineConfig, scheduler: Scheduler, cache: AdapterCachePolicy,
                        horizon_s: float | None, max_run_steps: int | None) -> None:
    """What an engine refuses before any work: a configuration that is not an :class:`EngineConfig`,
    policies that break their protocols (:func:`twin.interfaces.check_policy_objects`), a horizon
    that is not a number of seconds >= 0, a ``max_run_steps`` that is not a positive integer."""
    if not isinstance(config, EngineConfig):
        raise TypeError(f"config: got {type(config).__name__}, not a twin.config.EngineConfig; build one, e.g. "
                        f"EngineConfig(max_loras=8)")
    check_policy_objects(scheduler, cache)
    if horizon_s is not None and not (isinstance(horizon_s, (int, float, np.integer, np.floating))
                                      and not isinstance(horizon_s, bool) and 0 < horizon_s <= MAX_SIM_SECONDS):
        raise ValueError(f"horizon_s {horizon_s!r}: give the simulated seconds to stop at, above 0 and up to "
                         f"{MAX_SIM_SECONDS:g} (about 3 years, the longest a run may simulate; None: run until every "
                         f"request has finished)")
    if max_run_steps is not None and not (isinstance(max_run_steps, (int, np.integer))
                                          and not isinstance(max_run_steps, bool) and max_run_steps >= 0):
        raise ValueError(f"max_run_steps {max_run_steps!r}: give the most decode steps advanced at once, an "
                         f"integer >= 1 (1: step by step; None or 0: no limit)")


#: the most timed events (:meth:`EngineState.push_event`) one step boundary fires: a policy's callback that
#: keeps pushing events at the time already reached would otherwise never let the clock move
MAX_EVENTS_AT_ONCE = 100_000


class EngineState:
    """The state of one simulated server and its read-only view (see the module docstring).

    ``workload`` is a :class:`traces.workload.Workload` or a mapping of numpy columns of the
    same schema (the latter keeps pandas out of long benchmark runs).
    """

    #: the requests' front-end path outside the engine (s): added to the client-observed first
    #: token and finish by :mod:`twin.metrics`, never to the engine's own clock
    #: (:func:`twin.simulate.simulate`'s ``frontend_s``)
    frontend_s: float = 0.0
    #: the metrics scrape's stall of the client-observed path (:mod:`twin.scrape_stall`): seconds
    #: per label series (0: none) and the client's scrape period; :mod:`twin.metrics` only
    scrape_s_per_label: float = 0.0
    scrape_period_s: float = 2.0
    #: the extensions' release of held nodes that block every admission when the engine is idle (None: no
    #: asynchronous swap-in; set by :meth:`_attach_policies`)
    _release_holds: "Callable[[float], bool] | None" = None
    #: the extensions' prefetch decisions after a policy's tick (None: no policy prefetches at its tick)
    _after_tick: "Callable[[Any, float], None] | None" = None
    #: the running batch waits for copies in flight to land (``Engine._wait_for_landing``): no new background copy
    #: takes pool blocks meanwhile (:meth:`twin.prefetch.AsyncLoader.start`, :meth:`twin.prefix_kv.HistoryKV.swap_in`)
    memory_stall: bool = False

    def background_reserve(self) -> int:
        """KV blocks a background copy into the pool leaves free for the running batch (the vLLM engine's
        :meth:`twin.engine.Engine.background_reserve`; none here)."""
        return 0

    def __init__(self, workload: "Workload", profile: "Profile", config: EngineConfig, scheduler: Scheduler,
                 cache: AdapterCachePolicy, horizon_s: float | None = None, max_run_steps: int | None = None,
                 progress: bool = False, record_steps: bool = True, check_invariants: bool = False) -> None:
        check_run_arguments(config, scheduler, cache, horizon_s, max_run_steps)
        config, profile = engine_setup(config, profile, cache)
        self.config = config
        self._cache_limits()
        self.profile = profile
        self.env = simpy.Environment()
        self.horizon = INF if horizon_s is None else float(horizon_s)
        #: the next time the engine's state may be looked at (the horizon, or a ``simulate(stop_when=...)`` check): a
        #: run of decode steps ends at its last step that ends by then, so the state there is the one stepping one
        #: iteration at a time shows (the step that crosses it starts a segment of its own)
        self._observe_t = self.horizon
        self._prefetch_failed = 0  # adapter placements the last step's prefetch decisions tried in vain (Engine)
        self.max_run_steps = max_run_steps or (1 << 62)
        self.progress = progress
        self.check_invariants = check_invariants
        self._load_requests(workload)
        self._size_kv_cache()
        self._init_step_state()
        self.rec = Recorder(record_steps)
        self._attach_policies(workload, scheduler, cache)
        self._read_step_model()

    # ------------------------------------------------------------------ set-up steps
    def _cache_limits(self) -> None:
        """The config's per-step limits as plain attributes (read every step; refreshed
        whenever ``self.config`` is replaced)."""
        cfg = self.config
        self._max_batched = cfg.max_num_batched_tokens
        self._max_seqs = cfg.max_num_seqs
        self._max_loras = cfg.max_loras

    def _load_requests(self, workload: "Workload") -> None:
        """The request table, and the engine's direct references to its columns."""
        t = self.requests = RequestTable(workload)
        self.n = t.n
        self.arrival, self.prompt, self.output = t.arrival, t.prompt, t.output
        self.arrival_a, self.prompt_a, self.output_a = t.arrival_a, t.prompt_a, t.output_a
        self.request_id = t.request_id
        self.adapter_ids, self.adapter, self.adapter_a = t.adapter_ids, t.adapter, t.adapter_a
        self.adapter_rank, self.rank, self.n_adapters = t.adapter_rank, t.rank, t.n_adapters
        self.state, self.reject_reason = t.state, t.reject_reason
        self.first_sched, self.first_token, self.finish = t.first_sched, t.first_token, t.finish
        self._first_sched_a, self._first_token_a, self._finish_a = t.first_sched_a, t.first_token_a, t.finish_a
        self.load_wait_d, self.preempt_d, self.last_token_d = t.load_wait_d, t.preempt_d, t.last_token_d
        self._seen = t.seen
        #: requests that failed before the queue (drop_arrivals), each with why: an index into
        #: :attr:`drop_reason_names` (0: not dropped); None while none was dropped
        self._drop_code: np.ndarray | None = None
        self.drop_reason_names: list[str] = [""]
        cfg = self.config
        self.served = cfg.served_adapters if cfg.served_adapters is not None else t.n_adapters

    def _size_kv_cache(self) -> None:
        """vLLM's start-up: KV for one max_model_len request after the weights and the LoRA buffers
        (:func:`kv_at_startup`)."""
        cfg, ranks = self.config, self.adapter_rank
        self.max_model_len = cfg.max_model_len or self.profile.model.max_model_len
        self.max_lora_rank = cfg.max_lora_rank or (int(ranks.max()) if len(ranks) else 0)
        self.kv_tokens = kv_at_startup(cfg, self.profile, self.max_lora_rank)
        self.block_size = cfg.block_size
        self.total_blocks = self.kv_tokens // self.block_size
        self._apply_rejection_rules()

    def _apply_rejection_rules(self, adapter_blocks: list[int] | None = None) -> None:
        cfg = self.config
        self.requests.apply_rejection_rules(self.max_model_len, self.block_size, self.total_blocks,
                                            cfg.served_adapters, cfg.enable_lora, self.max_lora_rank, adapter_blocks)
        self.ok_cum = self.requests.ok_cum

    def _init_step_state(self) -> None:
        """Hot state of the running requests only (dicts keyed by request index)."""
        bs = self.block_size
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
        # decoders' own adapter ranks, summed, and each request's rank (0: no adapter), kept only
        # when the LoRA form prices requests at their own rank (``Profile.lora_own_ranks``)
        self.dec_rank_sum = 0
        self._own_rank: list[int] | None = (np.where(self.adapter >= 0, self.rank, 0).tolist()
                                            if self.profile.lora_own_ranks else None)
        self.res_cnt = [0] * bs         # decoders needing a block at steps with g % bs == r
        self.fin_heap: list = []        # (finish step, rid) (Engine: encoded as one int, see Engine._fin_m)
        self.used_blocks = 0
        self.n_waiting = 0
        # waiting requests per adapter (waiting_adapter_counts), kept on the events that change them once a
        # policy first asks (None until then: no cost on the engine's path for the policies that never do); the
        # arrivals before _wad_ptr counted
        self._wad: np.ndarray | None = None
        self._wad_ptr = 0
        self.arr_ptr = 0                # requests with index < arr_ptr have arrived
        self._next_arr_t = self.arrival_a[0] if self.n else INF
        self._waiting_lo = 0            # no request below this index can wait again
        self.n_finished = 0
        self.gap_itl: list[float] = []  # ITL samples after a preemption gap
        # timed events (prefetch completions, swap-ins, a scheduler's deadlines): a heap of
        # (time, seq, callback) fired at step boundaries; decode runs end at the earliest one
        self._events: list[tuple[float, int, Callable[[float], None] | None]] = []
        self._event_seq = itertools.count()
        self._async_until = INF

    def _attach_policies(self, workload: "Workload", scheduler: Scheduler, cache: AdapterCachePolicy) -> None:
        """Adapter memory, the extensions the policies need, then the policies themselves."""
        cfg = self.config
        self.link = HostLink(self.env)
        slots = cfg.max_loras if cfg.enable_lora else 0
        cpu_slots = cfg.max_cpu_loras if cfg.max_cpu_loras is not None else max(self.n_adapters, 1)
        self.cache = cache
        self.scheduler = scheduler
        self.adapters = AdapterMemory(self.adapter_rank, self.profile, slots, cpu_slots, cache, self.link,
                                      load_split(self.profile, cfg.tensor_parallel), self.max_lora_rank)
        #: the step-time entry points the engine calls (:meth:`twin.perf.profile.Profile.step_s`, ``decode_run``),
        #: always given the adapters registered at the step (:meth:`_registered`) as their last argument: a profile
        #: with an ``adapter_check`` component prices them, the others ignore it
        self._price_step, self._price_decode_run = self.profile.step_s, self.profile.decode_run
        # the hook points of the extensions: all None/False on the default path, each tested
        # once per admission, finish or KV shortage -- never per decode step
        ext = self.extensions = install_extensions(self, workload)
        self._admit_hook = ext.admit if ext is not None and ext.handles_admission else None
        self._reclaim = ext.reclaim_for_step if ext is not None and ext.handles_admission else None
        self._finish_hook = ext.on_finish if ext is not None and ext.prefix is not None else None
        self._prefetch_on = ext is not None and ext.loader is not None and ext.loader.asks_per_step
        #: asynchronous swap-in: the release of held nodes that block every admission when the engine is idle
        #: (:meth:`twin.extensions.Extensions.release_ready_holds`); None otherwise
        self._release_holds = ext.release_ready_holds if ext is not None and ext.async_swap else None
        #: the prefetch decisions of a policy that makes them at its tick (``prefetch_at_tick``), None when none does
        self._after_tick = (ext.after_tick if ext is not None and ext.loader is not None
                            and any(p.prefetch_at_tick for p in ext.prefetch_sources) else None)
        self._bind_policies(scheduler, cache)

    def _bind_policies(self, scheduler: Scheduler, cache: AdapterCachePolicy) -> None:
        """The policies' :meth:`bind` (they see the engine from now on), the scheduler's hooks as the step
        loop calls them, and the tick timers; the last step of every engine's ``_attach_policies``. A policy
        instance serves one run (:func:`twin.interfaces.claim_for_run`)."""
        claim_for_run(cache, "cache")
        claim_for_run(scheduler, "scheduler")
        try:
            cache.bind(self)
            scheduler.bind(self)
        except Exception as e:  # a policy's bind that raised: name the policy and the hook, as for the run's hooks
            err = explain_policy_failure(e, (cache, scheduler))
            if err is None:
                raise
            raise err from e
        # the scheduler's hooks the step loop calls (a plug-in's answers checked, twin.interfaces.checked_*)
        self._next_change_time = checked_next_change_time(scheduler)
        self._offer_ctx: Any = None  # the step context of a plug-in's schedule_waiting call in progress
        self._schedule_waiting = checked_schedule_waiting(scheduler, self)
        self._sched_ticks = check_tick_interval(scheduler)
        self._cache_ticks = check_tick_interval(cache)
        # each policy's next on_tick (INF: it does not tick) as the index k of its due time k * tick_interval on
        # the policy's grid; the step loop looks at the earlier one
        self._sched_tick_k = self._cache_tick_k = 1
        self._sched_tick_due = self._sched_ticks if self._sched_ticks is not None else INF
        self._cache_tick_due = self._cache_ticks if self._cache_ticks is not None else INF
        self._next_tick = min(self._sched_tick_due, self._cache_tick_due)

    @staticmethod
    def _next_due(k: int, interval: float, now: float) -> tuple[int, float]:
        """The first tick of the grid ``j * interval`` (``j > k``) due after ``now``, as ``(j, j * interval)``."""
        k += 1
        if k * interval <= now:  # the step spanned several due times: they are skipped
            k = max(k, int(now // interval) - 1)
            while k * interval <= now:
                k += 1
        return k, k * interval

    def _tick(self, now: float) -> None:
        """The policies' ``on_tick`` that are due at the step boundary ``now`` (scheduler first), each
        every its own ``tick_interval``. (Both used to tick at the shorter of the two intervals:
        ``chameleon+prefetch``'s 300 s quota refresh ran every second, at its cache's interval.)

        A policy's ticks are due on its grid, ``k * tick_interval`` (k = 1, 2, ...), and each runs at the first
        step boundary at or after its due time: the engine is iteration-level, so a tick waits for the step in
        flight, as a periodic monitor's wake-up sees the state a step boundary leaves (FastLibra's swapper "every
        monitor interval of 100 ms", ``fastlibra.md`` §5). The next due time is the grid's, not the boundary's plus
        the interval (which drifted: FastLibra's 100 ms swapper ticked every 118 ms on average on its chatbot at
        7 req/s, 169 ms on its agent at 80 req/s).
        When a step spans several due times the policy ticks once, at its end, and the due times it spanned are
        skipped (a second ``on_tick`` at the same instant would see the same state). A policy that prefetches at
        its tick (``prefetch_at_tick``) starts its prefetches right after it."""
        if now >= self._sched_tick_due:
            self.scheduler.on_tick(now)
            self._sched_tick_k, self._sched_tick_due = self._next_due(self._sched_tick_k, self._sched_ticks, now)
            if self._after_tick is not None:
                self._after_tick(self.scheduler, now)
        if now >= self._cache_tick_due:
            self.cache.on_tick(now)
            self._cache_tick_k, self._cache_tick_due = self._next_due(self._cache_tick_k, self._cache_ticks, now)
            if self._after_tick is not None:
                self._after_tick(self.cache, now)
        self._next_tick = min(self._sched_tick_due, self._cache_tick_due)

    def check_offer(self, rid: Any, ctx: Any = None) -> None:
        """Refuse (:class:`~twin.interfaces.PolicyError`, naming the scheduler) an offer to
        ``ctx.try_admit`` made outside the scheduler's ``schedule_waiting`` call (a context kept
        for later: nothing is being planned then), through the context of another step (``ctx``,
        when the engine's contexts are distinct objects: S-LoRA's), or of a request that is not
        waiting: not a request index, not arrived yet, rejected, finished, running, or dropped.
        Engines call it only for schedulers that are not built in (the built-in ones offer waiting
        requests by construction; the hot path stays free)."""
        who = policy_label(self.scheduler)
        if self._offer_ctx is None:
            raise PolicyError(f"{who} called ctx.try_admit({rid!r}) outside schedule_waiting (a step context kept "
                              f"after the call, used from another hook); offer waiting requests only inside "
                              f"schedule_waiting, through the ctx it is given")
        if ctx is not None and ctx is not self._offer_ctx:
            raise PolicyError(f"{who} offered request {rid!r} through the step context of an earlier "
                              f"schedule_waiting call; use the ctx of the current call")
        why = None
        if not isinstance(rid, (int, np.integer)) or isinstance(rid, bool):
            why = f"a {type(rid).__name__}, not a request index (an int)"
        elif not 0 <= rid < self.n:
            why = f"not a request index (0 <= rid < {self.n})"
        elif rid >= self.arr_ptr:
            why = "not arrived yet"
        elif self.state[rid] == REJECTED:
            why = "rejected"
        elif self.state[rid] == FINISHED:
            why = "finished"
        elif rid in self.running:
            why = "running (admitted already)"
        elif self._drop_code is not None and self._drop_code[rid]:
            why = "dropped (drop_arrivals)"
        if why is not None:
            raise PolicyError(f"{who} offered request {rid!r} to ctx.try_admit in "
                              f"schedule_waiting, but it is {why}; offer only waiting requests "
                              f"(engine.waiting_ids()), each at most once")

    def _assert_queue_accounting(self) -> None:
        """The waiting count and the running set agree with the request states (both engines'
        ``assert_invariants``)."""
        arrived = self.state[: self.arr_ptr] == PENDING
        if self._drop_code is not None:
            arrived &= self._drop_code[: self.arr_ptr] == 0
        waiting = int(arrived.sum()) - sum(1 for r in self.running if r < self.arr_ptr)
        assert waiting == self.n_waiting, f"waiting count out of sync ({waiting} != {self.n_waiting})"
        ad = self.adapter[self.waiting_ids()]
        assert np.array_equal(self.waiting_adapter_counts(), np.bincount(ad[ad >= 0], minlength=self.n_adapters)), \
            "waiting requests per adapter out of sync"
        assert all(self.state[r] == PENDING for r in self.running), "running set out of sync"

    def _clock_wait(self, d: float):
        """Let ``d`` seconds pass: :meth:`_clock_until` ``now + d`` (the float addition ``env.timeout(d)``
        makes, and the same queue entry)."""
        return self._clock_until(self.env._now + d)

    def _clock_until(self, t: float):
        """Let the clock reach ``t`` exactly (e.g. the end of a run of decode steps, summed step by step as
        stepping one iteration at a time sums it). With ``direct_clock`` and SimPy's queue empty nothing
        else can happen meanwhile, so the clock moves directly and None is returned; otherwise the event
        at ``t`` to yield. (A delay ``t - now`` cannot always land on ``t``: ``now + (t - now)`` may
        round to either neighbour of ``t``, and no delay may give ``t`` itself; the clock then ended a
        run one ulp early.) The event is what ``env.timeout`` queues, at an absolute time."""
        env = self.env
        if self.direct_clock and not env._queue:
            env._now = t
            return None
        ev = env.event()
        ev._ok = True
        ev._value = None
        heapq.heappush(env._queue, (t, NORMAL, next(env._eid), ev))
        return ev

    def _read_step_model(self) -> None:
        """Which inputs of the step-time model can change during a decode run (looked up once)."""
        profile = self.profile
        sch = profile.components["scheduler"]
        wp = sch.waiting_params if sch.waiting_params is not None else tuple(sch.params)
        self._waiting_matters = any(isinstance(sch.params.get(k), (int, float)) and sch.params[k] != 0.0 for k in wp)
        bb = profile.components["backbone"].params
        self._ctx_matters = any(v != 0.0 for k, v in bb.items() if "ctx" in k and isinstance(v, (int, float)))

    # ------------------------------------------------------------------ memory set-up of the extensions
    def resize_kv_pool(self, kv_tokens: int, max_loras: int) -> None:
        """An extension's adapter memory replaces vLLM's slots: the KV pool becomes
        ``kv_tokens`` and up to ``max_loras`` distinct adapters may join a batch."""
        self.config = dataclasses.replace(self.config, max_loras=max_loras)
        self._cache_limits()
        self.kv_tokens = kv_tokens
        self.total_blocks = kv_tokens // self.block_size

    def lend_blocks(self, n: int) -> None:
        """``n`` blocks of the pool leave the KV capacity (an adapter or history KV holds them)."""
        self.total_blocks -= n

    def return_blocks(self, n: int) -> None:
        """``n`` blocks lent with :meth:`lend_blocks` come back to the KV capacity."""
        self.total_blocks += n

    def recheck_admission(self, adapter_blocks: list[int] | None = None) -> None:
        """The start-up check and the rejection rules again, for the resized pool
        (``adapter_blocks``: a request and its adapter must fit in a unified pool together)."""
        check_startup(self.kv_tokens, self.max_model_len, 0, 0)
        self._apply_rejection_rules(adapter_blocks)

    # ------------------------------------------------------------------ read-only view (twin.interfaces.EngineView)
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def pool_blocks(self) -> int:
        """Blocks of the whole pool: KV plus, with extensions, the adapters and history KV it holds."""
        return self.extensions.pool_blocks if self.extensions is not None else self.total_blocks

    @property
    def history(self) -> "HistoryKV | None":
        """The history-KV store of prefix reuse (None when not installed)."""
        return self.extensions.prefix if self.extensions is not None else None

    @property
    def held_adapters(self) -> "Mapping[int, int]":
        """Adapters held in GPU memory for waiting requests that wait for their swap-ins (asynchronous swap-in,
        :meth:`twin.extensions.Extensions._await_swaps`), each with its number of holders: not to be evicted
        (empty without asynchronous swap-in). Read it, never change it."""
        return getattr(self.extensions, "held_adapters", None) or _NO_HOLDS

    @property
    def next_event_time(self) -> float:
        """Time of the earliest pending timed event (inf if none)."""
        return self._async_until

    @property
    def steps_run(self) -> int:
        """Engine steps completed so far."""
        return self.rec.n_steps

    def next_arrival_time(self) -> float:
        """Arrival time of the next request that has not arrived yet (inf if none)."""
        return self._next_arr_t

    def tokens_known(self, rid: int) -> int:
        """Prompt + emitted tokens of a request (what a (re)admission must compute)."""
        return self.resume_T.get(rid) or int(self.prompt_a[rid])

    def is_decoding(self, rid: int) -> bool:
        """``rid`` runs and has computed its prompt (it emits one token per step)."""
        return rid in self.dec

    def kv_blocks_held(self, rid: int) -> int:
        """KV blocks a running request holds now (0 for a request that does not run)."""
        d = self.dec.get(rid)
        if d is not None:
            return -(-(d[0] + self.g) // self.block_size)
        return self.held.get(rid, 0)

    def adapter_tokens(self, a: int) -> int:
        """Memory of adapter ``a`` in KV-token units: ``ceil(bytes / KV bytes per token)``, which is
        S-LoRA's ``4 * rank`` pool slots for a q,k,v,o adapter (``slora.md`` §3: a slot holds one
        hidden-size vector per layer in the key and in the value buffer; an adapter's A and B
        take 4r of them); 0 for the base model (``a < 0``). Independent of where the adapter
        lives, so schedulers can count adapters in the units of the KV pool (Chameleon's quotas)."""
        if a < 0:
            return 0
        toks = self.__dict__.get("_adapter_tokens")
        if toks is None:
            per_tok = self.kv_bytes_per_token
            toks = self._adapter_tokens = [-(-int(b) // per_tok) for b in self.adapters.bytes]
        return toks[a]

    @property
    def kv_bytes_per_token(self) -> int:
        """GPU memory of one token's KV cache (the profile's ``kv`` component, else the model's)."""
        p = self.profile
        return int(p.components["kv"].params.get("kv_bytes_per_token") or p.model.kv_bytes_per_token)

    def memory_in_use(self) -> float:
        """The share of the server's KV and adapter memory in use now -- FastLibra's "HBM utilisation"
        (§10, ``shared/refs/fastlibra.md``) for any system: the KV of running requests, history KV
        kept in GPU memory and resident adapters, over the KV pool plus the adapters' memory, in
        KV-token units. A unified pool (S-LoRA, FastLibra) holds adapters and history in its own
        blocks (``pool_blocks - total_blocks`` lent out); vLLM's adapter slots (``max_loras`` slots
        padded to ``max_lora_rank``) and a fixed adapter region are memory of their own, in use as
        far as adapters are resident."""
        bs = self.block_size
        pool = self.pool_blocks
        tokens = float((pool - self.total_blocks + self.used_blocks) * bs)
        capacity = float(pool * bs)
        ext = self.extensions
        if ext is None or ext.memory != "unified":  # the adapters' memory is apart from the KV pool
            mem = self.adapters
            per_tok = self.kv_bytes_per_token
            region = (mem.placement.alloc.capacity if mem.placement is not None
                      else mem.gpu_slots * self.profile.adapter_bytes(max(self.max_lora_rank, 1)))
            tokens += mem.resident_bytes / per_tok
            capacity += region / per_tok
        return tokens / capacity if capacity > 0 else 0.0

    def waiting_ids(self) -> np.ndarray:
        """Indices of the requests waiting now (arrived, not finished/rejected/dropped, not running)."""
        hi = self.arr_ptr
        lo = self._waiting_lo
        st = self.state
        dropped = self._drop_code
        while lo < hi and (st[lo] != PENDING or (dropped is not None and dropped[lo])):
            lo += 1  # a low-water mark past requests that can never wait again
        self._waiting_lo = lo
        pending = st[lo:hi] == PENDING
        if dropped is not None:
            pending &= dropped[lo:hi] == 0
        run = self.running
        if run:  # (running requests arrived and are PENDING: lo <= rid < hi; a mask, not a sorted set difference)
            pending[np.fromiter(run.keys(), np.int64, len(run)) - lo] = False
        return lo + np.flatnonzero(pending)

    def unloaded_service_s(self, mean_in: float, mean_out: float, rank: int) -> float:
        """A request's execution time with the engine to itself (:meth:`twin.interfaces.EngineView.unloaded_service_s`):
        its prefill, then ``mean_out`` decode steps of a batch of one attending to the context at the midpoint,
        each priced by the profile's step-time entry point (:meth:`twin.perf.profile.Profile.step_s`: scheduler,
        backbone and the LoRA term of one adapter of ``rank`` among the engine's slots; another engine prices the
        steps its own way, :meth:`_lone_step_s`)."""
        n_in = max(int(round(mean_in)), 1)
        ctx = int(round(mean_in + mean_out / 2.0))
        rank = max(int(rank), 1)
        return self._lone_step_s(n_in, 0, rank) + mean_out * self._lone_step_s(0, ctx, rank)

    def _registered(self) -> int:
        """The adapters registered with the server at this step: the ``N`` of vLLM 0.8.5's per-step adapter check
        (``LRUCacheWorkerLoRAManager._apply_adapters`` walks ``list_adapters()``, its CPU cache;
        :class:`twin.perf.forms.RegistryPairsAdapterCheck`). That is the CPU tier: the adapters requested so far,
        at most ``max_cpu_loras`` (an adapter is added at its first request, ``add_adapter``), plus the served
        adapters a pre-loading server registered at start-up that the workload never requests
        (:meth:`twin.adapters.AdapterMemory.preload_cpu`). A server that pre-loads every served adapter into a tier
        that holds them all (the validation runs, the sweeps) registers ``served`` on every step."""
        return len(self.adapters.cpu) + self.adapters.registered_unused

    def _lone_step_s(self, prefill: int, ctx: int, rank: int) -> float:
        """One step of a lone request of adapter ``rank``: its prefill of ``prefill`` tokens, or (``prefill`` 0)
        one decode attending to ``ctx`` tokens, priced by the profile's step time on the engine's slots."""
        prof = self.profile
        n_dec = 0 if prefill else 1
        sums = (rank, rank * (prefill + n_dec)) if prof.lora_own_ranks else None
        return float(prof.step_s(prefill, n_dec, ctx, 1, 1, rank, max(int(self.config.max_loras), 1), 1, 0,
                                 max(int(self.served), 1), sums))

    def waiting_adapter_counts(self) -> np.ndarray:
        """Waiting requests per adapter (the engine's array: read it, never change it), as
        ``np.bincount`` of the adapters of :meth:`waiting_ids` (the base model's left out) would give, without
        a pass over the waiting requests: an admission takes one off its adapter, a preemption puts it back,
        :meth:`drop_arrivals` takes the dropped ones off, and the arrivals since the last call (those not
        rejected at start-up) are added here -- the events of one that came in between were counted already.
        (Chameleon's cache keeps the adapters of queued requests, :class:`policies.chameleon.ChameleonCache`:
        a scan of the waiting requests per victim cost O(waiting), most of an overloaded run.)"""
        if self._wad is None:  # the first call: counted from the waiting requests, kept from here on
            ad = self.adapter[self.waiting_ids()]
            self._wad = np.bincount(ad[ad >= 0], minlength=self.n_adapters).astype(np.int64)
            self._wad_ptr = self.arr_ptr
            return self._wad
        lo, hi = self._wad_ptr, self.arr_ptr
        if hi > lo:
            ad = self.adapter[lo:hi]
            ad = ad[(ad >= 0) & (self.reject_reason[lo:hi] == 0)]
            if len(ad):
                np.add.at(self._wad, ad, 1)
            self._wad_ptr = hi
        return self._wad

    def drop_arrivals(self, rids: "np.ndarray | range", reason: str = DEFAULT_DROP_REASON) -> None:
        """Requests ``rids``, which just arrived, failed before the server's queue (e.g. at a
        client with an in-flight cap) because of ``reason``: they leave the waiting count (the
        scheduler must not offer them) and stay unfinished in the tables, whose ``drop_reason``
        column and the summary's ``drop_reasons`` give the reason. ``rids`` may be a ``range`` of
        step 1 (marked as a slice)."""
        if self._drop_code is None:  # a bytearray seen as a numpy array (a slice of it is set without numpy)
            self._drop_code_b = bytearray(self.n)
            self._drop_code = np.frombuffer(self._drop_code_b, np.uint8)
        if not isinstance(reason, str) or not reason.strip():
            raise PolicyError(f"drop_arrivals(..., reason={reason!r}): give why the requests failed before the queue, "
                              f"a non-empty string (it fills the requests table's drop_reason column)")
        names = self.drop_reason_names
        if reason not in names:
            if len(names) == 256:
                raise PolicyError(f"drop_arrivals: more than 255 distinct reasons (the last: {reason!r}); "
                                  f"give a reason per cause, not per request")
            names.append(reason)
        code = names.index(reason)
        if self._release_holds is not None:  # a dropped request holds nothing any more (asynchronous swap-in)
            self.extensions.release_holds_of(rids)
        if rids.__class__ is range and rids.step == 1:
            n = len(rids)
            self._drop_code_b[rids.start:rids.stop] = bytes((code,)) * n
            self.n_waiting -= n
            self._unwait(self.adapter[rids.start:rids.stop])
            return
        rids = np.asarray(rids, np.int64)
        self._drop_code[rids] = code
        self.n_waiting -= len(rids)
        self._unwait(self.adapter[rids])

    def _unwait(self, ad: np.ndarray) -> None:
        """Requests of adapters ``ad`` left the waiting queue without an admission (dropped)."""
        if self._wad is None:
            return
        ad = ad[ad >= 0]
        if len(ad):
            np.subtract.at(self._wad, ad, 1)

    def reclaimable_blocks(self) -> int:
        """Pool blocks that evicting idle adapters (unified pool) and history KV would free."""
        return self.extensions.reclaimable() if self.extensions is not None else 0

    # ------------------------------------------------------------------ timed events
    def push_event(self, t: float, cb: Callable[[float], None] | None) -> None:
        """Call ``cb(now)`` at the first step boundary at or after ``t`` (None: only end a decode run there;
        a time already past fires at the next boundary)."""
        if t != t:  # NaN: never fired and never ordered (it ran silently)
            raise ValueError("push_event(nan): give the time (s) to call back at, a number")
        heapq.heappush(self._events, (t, next(self._event_seq), cb))
        if t < self._async_until:
            self._async_until = t

    def _fire_events(self, now: float) -> None:
        ev = self._events
        fired = 0
        while ev and ev[0][0] <= now:
            _, _, cb = heapq.heappop(ev)
            if cb is not None:
                try:
                    cb(now)
                except PolicyError:
                    raise
                except Exception as e:  # (a policy's method names its hook; a bare callback is named here)
                    raise (explain_policy_failure(e, (self.scheduler, self.cache))
                           or PolicyError(f"the timed-event callback {callback_label(cb)} (engine.push_event) raised "
                                          f"at t = {now:g} s: {type(e).__name__}: {e or 'no message'}; fix the "
                                          f"callback (the chained traceback shows where)")) from e
                fired += 1
                if fired > MAX_EVENTS_AT_ONCE:  # (a callback that pushes itself at the same time looped for ever)
                    raise PolicyError(f"more than {MAX_EVENTS_AT_ONCE:,} timed events fired at t = {now:g} s: a "
                                      f"callback keeps pushing events at a time already reached (push_event(now, ...) "
                                      f"from inside a callback); push a later time, e.g. now + the period it waits")
        self._async_until = ev[0][0] if ev else INF

    def emitted_now(self, rid: int) -> int:
        """Tokens emitted so far by ``rid`` (for reports on unfinished requests)."""
        if self.state[rid] == FINISHED:
            return int(self.output_a[rid])
        p = int(self.prompt_a[rid])
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
        assert ad._resident_ids == set(np.flatnonzero(res).tolist()), "resident-adapter set out of sync"
        assert bool(np.all(res[act > 0])), "an adapter in use is not resident"
        assert ad.n_active == int((act > 0).sum()) <= self.config.max_loras, "too many adapters in the batch"
        if ad.order_reloads and ad.placement is None and not ad.loading:  # vLLM's LRU manager: slots within CPU
            assert ad._resident_ids <= set(ad.cpu), "an adapter in a GPU slot is not in the CPU tier"
        assert len(self.dec) == self.n_dec == sum(1 for r in self.running if r not in self.prefilling), \
            "decode aggregate out of sync"
        if self._own_rank is not None:
            assert self.dec_rank_sum == sum(self._own_rank[r] for r in self.dec), "decoders' rank sum out of sync"
        self._assert_queue_accounting()
        if self.extensions is not None:
            self.extensions.check()

    # ------------------------------------------------------------------ run
