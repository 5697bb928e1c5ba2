"""The two pluggable decisions of the engine: which waiting requests join the batch
(:class:`Scheduler`) and which adapters stay on the GPU (:class:`AdapterCachePolicy`).

Both see the engine through :class:`twin.engine.Engine`'s read-only attributes
(``now``, ``n_waiting``, ``running``, ``free_blocks``, ``adapters``, ``link``, the workload
arrays ``arrival``, ``prompt``, ``output``, ``adapter``, ``rank``). ``policies/`` implements
them; ``twin.registry`` finds them by name.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

if TYPE_CHECKING:  # pragma: no cover
    from twin.engine import Engine, StepContext


class Admit(IntEnum):
    """Outcome of :meth:`StepContext.try_admit` (mirrors the checks of vLLM v1's scheduler)."""

    OK = 0
    NO_BUDGET = 1   # token budget of the step is spent
    NO_SEQ = 2      # max_num_seqs running already
    NO_SLOT = 3     # adapter not in the batch and max_loras distinct adapters already are
    NO_KV = 4       # not enough free KV blocks for the first chunk
    NOT_READY = 5   # policy-specific: adapter not resident yet (async loading)


class Scheduler:
    """Decides, each engine step, which waiting requests join the batch.

    The engine schedules the running requests first (decodes, then continuing prefill
    chunks, preempting by recompute when KV blocks run out, as vLLM v1 does) and then,
    if nothing was preempted, calls :meth:`schedule_waiting`, which offers candidates to
    ``ctx.try_admit(rid)`` in the policy's order.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    citation: ClassVar[str] = ""

    def bind(self, engine: "Engine") -> None:
        """Called once before the run; keep a reference to the engine (read-only use)."""
        self.engine = engine

    def on_arrivals(self, lo: int, hi: int) -> None:
        """Requests with arrival index ``lo <= i < hi`` (in ``engine.order``) arrived."""

    def on_preempt(self, rid: int) -> None:
        """``rid`` was preempted (recompute) and is waiting again."""
        raise NotImplementedError

    def on_finish(self, rid: int) -> None:
        """``rid`` finished."""

    def schedule_waiting(self, ctx: "StepContext") -> Admit | None:
        """Offer waiting requests to ``ctx.try_admit``; return why admission stopped
        (an :class:`Admit` value) or None when no waiting request was eligible."""
        raise NotImplementedError

    def next_change_time(self, stop: Admit | None) -> float:
        """Earliest time an arrival could let :meth:`schedule_waiting` admit something,
        given that during a run of pure decode steps free KV only shrinks and the running
        set is fixed. Returning a time too early is always safe (it only splits a run);
        too late is a bug. The default is the next arrival."""
        return self.engine.next_arrival_time()

    @property
    def tick_interval(self) -> float | None:
        """Seconds between periodic :meth:`on_tick` calls (None: never)."""
        return None

    def on_tick(self, now: float) -> None:
        """Periodic background decision (e.g. Chameleon's queue refresh)."""

    #: True when the scheduler uses timed events (``engine._ext.push_event``), e.g. deadlines.
    uses_events: ClassVar[bool] = False

    def prefetch(self, now: float) -> Iterable[int]:
        """Adapters to prefetch now, in priority order (S-LoRA: those of queued requests).

        Asked after each step's admissions and at arrivals; it must depend only on the
        engine's state (not on how often it is asked). Overriding it turns prefetching on
        (:mod:`twin.prefetch`)."""
        return ()


class AdapterCachePolicy:
    """Decides which adapters stay resident in the GPU adapter slots.

    The engine calls :meth:`on_active` when an adapter gets its first running request,
    :meth:`on_idle` when its last running request leaves, and :meth:`victim` when a load
    needs a slot. An adapter with running requests is never offered as a victim.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    citation: ClassVar[str] = ""
    #: adapter memory this policy needs: None (the engine configuration decides), 'slots',
    #: 'region' or 'unified' (see :mod:`twin.adapter_placement`)
    adapter_memory: str | None = None
    #: keep conversations' history KV for prefix reuse (None: ``EngineConfig.prefix_caching``)
    prefix_kv: bool | None = None
    #: prefetches go on the critical path of the deciding step instead of the background
    prefetch_sync: bool = False
    #: vLLM's worker activates the batch's adapters one by one in set (hash) order, so an LRU
    #: eviction can hit an adapter of the batch not yet touched in this step, which is then
    #: reloaded (see :meth:`twin.adapters.AdapterMemory.activation_reloads`)
    activation_order_reloads: ClassVar[bool] = False
    uses_events: ClassVar[bool] = False

    def bind(self, engine: "Engine") -> None:
        self.engine = engine

    def on_active(self, a: int, now: float) -> None:
        """Adapter ``a`` got its first running request."""

    def on_idle(self, a: int, now: float) -> None:
        """Adapter ``a`` has no running request any more (it stays resident)."""

    def on_load(self, a: int, now: float) -> None:
        """Adapter ``a`` became resident."""

    def on_evict(self, a: int, now: float) -> None:
        """Adapter ``a`` left the GPU."""

    def victim(self, now: float) -> int:
        """An idle resident adapter to evict (called only when one exists)."""
        raise NotImplementedError

    def evict_when_idle(self, a: int) -> bool:
        """True to discard ``a`` as soon as it is idle (S-LoRA without a cache)."""
        return False

    def prefetch(self, now: float) -> Iterable[int]:
        """Adapters to load now, in priority order (default: none). Overriding it turns
        prefetching on (:mod:`twin.prefetch`): asynchronous over the host link, or on the
        deciding step's critical path when ``prefetch_sync``. Asked after each step's
        admissions and at arrivals; it must depend only on the engine's state."""
        return ()

    @property
    def tick_interval(self) -> float | None:
        return None

    def on_tick(self, now: float) -> None:
        """Periodic background decision (e.g. FastLibra's swapper)."""

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}
