"""The two pluggable decisions of the engine -- which waiting requests join the batch
(:class:`Scheduler`) and which adapters stay on the GPU (:class:`AdapterCachePolicy`) -- and
the engine as they see it (:class:`EngineView`).

Policies use only :class:`EngineView` (the engine's read-only state and the few actions a
policy may take) and declare what they need from the engine through the capabilities of
these base classes (``adapter_memory``, ``prefix_kv``, ``max_inflight``, ``reclaim_blocks``,
...), each with its default here. ``policies/`` implements them; ``twin.registry`` finds
them by name. Policies keep their constructor arguments under the same names and
:meth:`Policy.get_params` returns them (scikit-learn's convention), so
``type(p)(**p.get_params())`` rebuilds an equal policy.
"""

from __future__ import annotations

import inspect
import itertools
import json
import math
import numbers
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Collection, Iterable, Mapping, Protocol

from traces.arguments import is_flag, is_real_number, is_whole_number

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import simpy

    from twin.config import EngineConfig
    from twin.perf.profile import Profile

INF = math.inf


class Admit(IntEnum):
    """Outcome of :meth:`StepContextView.try_admit` (mirrors the checks of vLLM v1's scheduler)."""

    OK = 0
    NO_BUDGET = 1   # token budget of the step is spent
    NO_SEQ = 2      # max_num_seqs running already
    NO_SLOT = 3     # adapter not in the batch and max_loras distinct adapters already are
    NO_KV = 4       # not enough free KV blocks for the first chunk
    NOT_READY = 5   # adapter or history KV still being copied in (async loading / async_swap_in): skip it


class StepContextView(Protocol):
    """What :meth:`Scheduler.schedule_waiting` may use during one step (``twin.engine.StepContext``)."""

    budget: int                       # tokens left in this step
    admitted: list[int]               # requests admitted so far in this step
    loads: list[Any]                  # adapter/KV loads on this step's critical path (twin.adapters.Load)
    load_rids: list[int]

    def try_admit(self, rid: int) -> Admit:
        """Apply vLLM's checks to waiting request ``rid`` and admit it when they pass."""


class EngineView(Protocol):
    """The engine as a policy sees it: read-only state, plus the few actions a policy may take.

    Request columns are numpy arrays over all requests in arrival order (``adapter`` is the
    dense adapter index, -1 for the base model; ``adapter_ids[i]`` the workload's id of index ``i``);
    the workload's columns are read-only views (writing one raises), the outcome columns (``state``,
    ``reject_reason``, ...) are the engine's own, which a policy reads and never writes; the ``*_a``
    twins are the same columns as memoryviews (the same memory) for fast scalar reads in Python loops. ``state`` holds
    :class:`twin.requests.RequestState` values. ``running`` maps the running requests in
    admission order (values unused); :meth:`waiting_ids` lists the waiting ones.
    """

    config: "EngineConfig"
    profile: "Profile"
    env: "simpy.Environment"
    n: int
    n_adapters: int
    arrival: "np.ndarray"
    prompt: "np.ndarray"
    output: "np.ndarray"
    adapter: "np.ndarray"
    rank: "np.ndarray"
    arrival_a: memoryview
    prompt_a: memoryview
    output_a: memoryview
    adapter_a: memoryview
    adapter_rank: "np.ndarray"       # rank of each dense adapter
    state: "np.ndarray"
    reject_reason: "np.ndarray"
    ok_cum: "range | memoryview"     # ok_cum[i]: requests before index i not rejected at arrival
    running: dict[int, None]
    n_waiting: int
    arr_ptr: int                     # requests with index < arr_ptr have arrived
    block_size: int
    total_blocks: int                # KV blocks available to requests now
    used_blocks: int
    kv_tokens: int
    max_lora_rank: int
    adapters: Any                    # twin.adapters.AdapterMemory: resident, active, loading, evictable(), ...
    link: Any                        # twin.adapters.HostLink
    scheduler: "Scheduler"
    cache: "AdapterCachePolicy"

    @property
    def now(self) -> float: ...

    @property
    def free_blocks(self) -> int: ...

    @property
    def pool_blocks(self) -> int:
        """KV blocks of the whole pool (with adapter memory extensions: KV + adapters + history KV)."""

    @property
    def history(self) -> Any:
        """The history-KV store of prefix reuse (``twin.prefix_kv.HistoryKV``), or None."""

    @property
    def held_adapters(self) -> "Mapping[int, int]":
        """Adapters held in GPU memory for waiting requests that wait for their asynchronous swap-ins (adapter ->
        holders; empty without ``async_swap_in``): a cache policy's ``reclaim_blocks`` and ``victim`` leave them,
        as they leave history nodes with ``held`` (``twin.extensions.Extensions._await_swaps``)."""

    def memory_in_use(self) -> float:
        """The share of the server's KV and adapter memory in use now (running KV, history KV in GPU
        memory, resident adapters over the KV pool plus the adapters' memory)."""
        ...

    @property
    def steps_run(self) -> int: ...

    def next_arrival_time(self) -> float: ...

    def tokens_known(self, rid: int) -> int: ...

    def emitted_now(self, rid: int) -> int: ...

    def is_decoding(self, rid: int) -> bool: ...

    def kv_blocks_held(self, rid: int) -> int: ...

    def adapter_tokens(self, a: int) -> int:
        """Memory of adapter ``a`` in KV-token units (S-LoRA's unified-pool slots: ``4 * rank``
        for a q,k,v,o adapter); 0 for the base model (``a < 0``)."""

    def waiting_ids(self) -> "np.ndarray": ...

    def waiting_adapter_counts(self) -> "np.ndarray":
        """Waiting requests per adapter (``np.bincount`` of the adapters of :meth:`waiting_ids`, kept by the
        engine: read it, never change it)."""

    def unloaded_service_s(self, mean_in: float, mean_out: float, rank: int) -> float:
        """A request's execution time on this engine with nothing else running: its prefill of ``mean_in`` tokens,
        then ``mean_out`` decode steps at the context's midpoint, its adapter of ``rank`` resident, each step priced
        as this engine prices it (e.g. Chameleon's "low-load execution time", §6.1)."""

    def reclaimable_blocks(self) -> int: ...

    def drop_arrivals(self, rids: "np.ndarray | range", reason: str = ...) -> None:
        """Requests ``rids``, which just arrived, fail before the queue for ``reason`` (the requests
        table's ``drop_reason``); they stay unfinished and are never offered."""

    def squash(self, rid: int) -> None: ...

    def push_event(self, t: float, cb: Callable[[float], None] | None) -> None: ...


class EngineCore(EngineView, Protocol):
    """What the engine's own extensions (``twin.extensions``) use besides :class:`EngineView`."""

    n_adapters: int
    max_model_len: int
    #: the running batch waits for copies in flight into the KV pool to land (``Engine._wait_for_landing``): no new
    #: background copy may take pool blocks meanwhile
    memory_stall: bool

    def background_reserve(self) -> int: ...

    def resize_kv_pool(self, kv_tokens: int, max_loras: int) -> None: ...

    def recheck_admission(self, adapter_blocks: list[int] | None = None) -> None: ...

    def lend_blocks(self, n: int) -> None: ...

    def return_blocks(self, n: int) -> None: ...


class Policy:
    """What schedulers and cache policies share: identity, binding, ticks, prefetch, parameters."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    citation: ClassVar[str] = ""
    #: True when the policy uses timed events (``engine.push_event``), e.g. deadlines; it then
    #: gets the engine's extensions (and their counters in the summary)
    uses_events: ClassVar[bool] = False
    #: a prefetch may evict an idle adapter to make room (False: into free memory only)
    prefetch_evicts: bool = True
    #: prefetches go on the critical path of the deciding step instead of the background
    prefetch_sync: bool = False
    #: asynchronous prefetches in flight at most, for a cache's own predictive prefetch (twin/prefetch.py); None: no
    #: bound, on the vLLM engine (FastLibra's swapper, ``fastlibra.md`` §5: it swaps in while HBM stays under its idle
    #: threshold; FastLibra runs on the vLLM engine only). S-LoRA's
    #: queued-request prefetch has no such bound (slora.md §4 "Prefetch": it stops at the first adapter that does not
    #: fit), and Chameleon's scheduler keeps that loader (twin/slora_engine.py ``SLoRAPrefetcher``). On the vLLM engine a
    #: scheduler and a cache that both prefetch share its one loader, whose bound is the larger of theirs (none when
    #: either has none: a scheduler beside FastLibra prefetches without its own bound; twin/extensions.py); on S-LoRA
    #: each keeps its own
    max_inflight: int | None = 4
    #: the prefetch decisions are the policy's :meth:`on_tick`'s and start at its tick, whether or not a batch runs
    #: (asynchronous prefetch on the vLLM engine; FastLibra's swapper is a monitor independent of the batch), instead of
    #: after each step's admissions
    prefetch_at_tick: bool = False

    engine: EngineView

    def bind(self, engine: EngineView) -> None:
        """Called once before the run; keep a reference to the engine (read-only use)."""
        self.engine = engine

    #: the constructor option :attr:`tick_interval` reads, named when its value is refused (None: none)
    tick_option: ClassVar[str | None] = None

    @property
    def tick_interval(self) -> float | None:
        """Seconds between periodic :meth:`on_tick` calls (None: never)."""
        return None

    def on_tick(self, now: float) -> None:
        """Periodic background decision (e.g. Chameleon's queue refresh, FastLibra's swapper)."""

    def prefetch(self, now: float) -> Iterable[int]:
        """Adapters to load now, in priority order (default: none). Overriding it turns
        prefetching on (:mod:`twin.prefetch`): asynchronous over the host link, or on the
        deciding step's critical path when ``prefetch_sync``. Asked after each step's
        admissions (with ``prefetch_at_tick``: right after each :meth:`on_tick` instead); it must
        depend only on the engine's state (not on how often it is asked)."""
        return ()

    def stats(self) -> dict[str, Any]:
        """Counters for the run summary: a dict of names (prefixed with the policy's, so they clash
        with no summary field) to numbers, merged into the summary at the end of the run."""
        return {}

    @classmethod
    def _param_names(cls) -> list[str]:
        """Named constructor arguments along the MRO (a class whose ``__init__`` takes
        ``**kwargs`` passes them on to its base)."""
        names: list[str] = []
        for klass in cls.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None:
                continue
            if klass is object:
                break
            more = False
            for p in inspect.signature(init).parameters.values():
                if p.kind == p.VAR_KEYWORD:
                    more = True
                elif p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names:
                    names.append(p.name)
            if not more:
                break
        return names

    def get_params(self) -> dict[str, Any]:
        """The constructor arguments, read from the attributes of the same names."""
        return {k: getattr(self, k) for k in self._param_names()}


class Scheduler(Policy):
    """Decides, each engine step, which waiting requests join the batch.

    The engine schedules the running requests first (in admission order, preempting the last
    by recompute when KV blocks run out, as vLLM v1's ``Scheduler.schedule`` does; at most one of
    them is part-way through its prefill, and it is the last, so this is decodes, then that
    chunk) and then,
    if nothing was preempted, calls :meth:`schedule_waiting`, which offers candidates to
    ``ctx.try_admit(rid)`` in the policy's order.
    """

    def __init__(self) -> None:
        pass

    def on_arrivals(self, lo: int, hi: int) -> None:
        """Requests ``lo <= rid < hi`` (indices in arrival order) arrived."""

    def on_preempt(self, rid: int) -> None:
        """``rid`` was preempted (recompute) and is waiting again."""
        raise NotImplementedError

    def on_finish(self, rid: int) -> None:
        """``rid`` finished."""

    def schedule_waiting(self, ctx: StepContextView) -> Admit | None:
        """Offer waiting requests to ``ctx.try_admit``; return why admission stopped
        (an :class:`Admit` value) or None when no waiting request was eligible."""
        raise NotImplementedError

    def next_change_time(self, stop: Admit | None) -> float:
        """Earliest time an arrival could let :meth:`schedule_waiting` admit something,
        given that during a run of pure decode steps free KV only shrinks and the running
        set is fixed. Returning a time too early is always safe (it only splits a run);
        too late is a bug. The default is the next arrival."""
        return self.engine.next_arrival_time()


class AdapterCachePolicy(Policy):
    """Decides which adapters stay resident in GPU memory.

    The engine calls :meth:`on_active` when an adapter gets its first running request,
    :meth:`on_idle` when its last running request leaves, and :meth:`victim` when a load
    needs room. An adapter with running requests is never offered as a victim.

    The constructor takes the engine-memory options (``twin.registry.MEMORY_OPTS``); None
    keeps the class's default (e.g. FastLibra's unified pool with prefix-KV reuse). A
    subclass with its own ``__init__`` takes ``**memory`` and passes it on::

        def __init__(self, alpha: float = 0.5, **memory) -> None:
            super().__init__(**memory)
            self.alpha = alpha          # stored under its own name: get_params() returns it
    """

    #: adapter memory this policy needs: None (the engine configuration decides), 'slots',
    #: 'region' or 'unified' (see :mod:`twin.adapter_placement`)
    adapter_memory: str | None = None
    #: allocator of the 'region' memory: 'contiguous' or 'paged' (None: the engine configuration)
    adapter_placement: str | None = None
    #: share of the pool given to the adapter region (None: ``EngineConfig.adapter_region_bytes``
    #: or the memory of vLLM's slots)
    lora_share: float | None = None
    #: keep conversations' history KV for prefix reuse (None: ``EngineConfig.prefix_caching``)
    prefix_kv: bool | None = None
    #: under memory pressure, history KV is swapped to host memory (True) or dropped (False)
    history_to_host: bool = False
    #: host memory for swapped history KV, in tokens
    host_kv_tokens: float = INF
    #: a waiting request whose adapter or history KV is not in GPU memory has them copied in the
    #: background and waits (``Admit.NOT_READY``) while ready requests run (FastLibra §2);
    #: False: the copies are synchronous loads of the admitting step (vLLM)
    async_swap_in: bool = False
    #: an adapter leaves GPU memory only after its history-KV nodes there (FastLibra's dependency tree, §4.1): the
    #: engine counts an idle adapter as reclaimable only when every node of its in the pool can leave first (none
    #: still being copied in, none held for a waiting request)
    kv_before_adapter: bool = False
    #: tokens per KV block this system uses (e.g. 32 for FastLibra's vLLM baseline, §6); None:
    #: ``EngineConfig.block_size``
    kv_block_size: int | None = None
    #: the LoRA compute the vLLM engine charges: None or ``"profile"`` (the profile's form, vLLM's
    #: kernel grid over its slots for the fitted profiles) or ``"paged"`` (adapter weights paged in the KV pool, computed as S-LoRA does:
    #: :class:`twin.perf.slora_forms.PagedLora`; FastLibra §2)
    lora_compute: str | None = None
    #: the slots are vLLM's own LRU manager (``LRUCacheLoRAModelManager``): its worker activates the
    #: batch's adapters one by one in set (hash) order, so an LRU eviction can hit an adapter of the
    #: batch not yet touched in this step, which is then reloaded (see
    #: :meth:`twin.adapters.AdapterMemory.activation_reloads`); and an adapter dropped from the CPU tier
    #: leaves its slot (:meth:`~twin.adapters.AdapterMemory.fetch`)
    activation_order_reloads: ClassVar[bool] = False
    #: ``reclaim_blocks(n, now, pin) -> freed``: free at least ``n`` pool blocks, never evicting
    #: adapter ``pin``. None (not provided): the engine's order -- history KV least recently
    #: used first, then idle adapters in :meth:`victim` order (``twin.extensions.Extensions.reclaim``)
    reclaim_blocks: Callable[[int, float, int], int] | None = None
    #: set by the engine while an admission reclaims pool memory in the engine's order
    #: (``twin.extensions.Extensions.reclaim``): the admitting request's own adapter, resident and idle, which
    #: :meth:`victim` should not return while another idle adapter exists (-1 otherwise; :func:`unpinned`). A
    #: victim that returns it anyway has it evicted and its blocks reclaimed again, as before stop 69, when the
    #: request then reloaded its just-evicted adapter synchronously at its admitting step
    reclaim_pin: int = -1

    def __init__(self, adapter_memory: str | None = None, adapter_placement: str | None = None,
                 prefix_kv: bool | None = None, lora_share: float | None = None,
                 history_to_host: bool | None = None, prefetch_sync: bool | None = None) -> None:
        for k, v in (("adapter_memory", adapter_memory), ("adapter_placement", adapter_placement),
                     ("prefix_kv", prefix_kv), ("lora_share", lora_share), ("history_to_host", history_to_host),
                     ("prefetch_sync", prefetch_sync)):
            if v is not None:
                setattr(self, k, v)

    def on_active(self, a: int, now: float) -> None:
        """Adapter ``a`` got its first running request."""

    def on_idle(self, a: int, now: float) -> None:
        """Adapter ``a`` has no running request any more (it stays resident)."""

    def on_load(self, a: int, now: float) -> None:
        """Adapter ``a`` became resident."""

    def on_evict(self, a: int, now: float) -> None:
        """Adapter ``a`` left the GPU."""

    def victim(self, now: float) -> int:
        """An idle resident adapter to evict (called only when one exists); not :attr:`reclaim_pin` while another
        idle adapter exists (``min(unpinned(self.idle, self.reclaim_pin), key=...)``)."""
        raise NotImplementedError

    def evict_when_idle(self, a: int) -> bool:
        """True to discard ``a`` as soon as it is idle (S-LoRA without a cache)."""
        return False

    def history_tier(self, node: Any, now: float) -> str | None:
        """Where a finished turn's history KV (``twin.prefix_kv.HistoryNode``) goes: 'hbm'
        (when free blocks allow, else host), 'host', or None/anything else to drop it."""
        return "hbm"

    def on_history(self, node: Any, what: str, now: float) -> None:
        """A history node was stored, taken, dropped, swapped out or swapped in (``what``)."""


# -- plug-in validation (at registration and when an engine starts; never in the step loop) --

class PolicyError(ValueError):
    """A scheduler or cache policy that breaks its protocol: a missing or malformed hook, a bad
    name, an object that is not a policy, or a hook that failed during the run (named with its
    policy; the original exception is chained)."""


#: every hook the engine calls, with the positional arguments it passes (besides ``self``)
POLICY_HOOKS: dict[str, tuple[str, ...]] = {"bind": ("engine",), "on_tick": ("now",), "prefetch": ("now",),
                                            "stats": ()}
SCHEDULER_HOOKS: dict[str, tuple[str, ...]] = {
    **POLICY_HOOKS, "on_arrivals": ("lo", "hi"), "on_preempt": ("rid",), "on_finish": ("rid",),
    "schedule_waiting": ("ctx",), "next_change_time": ("stop",)}
CACHE_HOOKS: dict[str, tuple[str, ...]] = {
    **POLICY_HOOKS, "on_active": ("a", "now"), "on_idle": ("a", "now"), "on_load": ("a", "now"),
    "on_evict": ("a", "now"), "victim": ("now",), "evict_when_idle": ("a",), "history_tier": ("node", "now"),
    "on_history": ("node", "what", "now")}
#: hooks a policy must implement (the base class's raises NotImplementedError)
REQUIRED_HOOKS = {"scheduler": ("schedule_waiting", "on_preempt"), "cache": ("victim",)}
_BASES: dict[str, type] = {"scheduler": Scheduler, "cache": AdapterCachePolicy}
_HOOKS = {"scheduler": SCHEDULER_HOOKS, "cache": CACHE_HOOKS}
_PROTOCOL = {"scheduler": "twin.interfaces.Scheduler", "cache": "twin.interfaces.AdapterCachePolicy"}
_checked: dict[tuple[type, str], None] = {}  # classes already validated (once per class)


def unpinned(idle: "Collection[int]", pin: int) -> "Collection[int]":
    """A cache's idle adapters to choose a :meth:`~AdapterCachePolicy.victim` from: ``idle`` without ``pin`` (the
    admitting request's adapter, :attr:`AdapterCachePolicy.reclaim_pin`), unless it is the only one; ``idle``
    itself (in its order) when ``pin`` is not in it."""
    if pin < 0 or len(idle) < 2 or pin not in idle:
        return idle
    return [a for a in idle if a != pin]


def policy_label(policy: Any) -> str:
    """``scheduler 'fcfs' (FCFSScheduler)``: how errors name a policy."""
    cls = policy if isinstance(policy, type) else type(policy)
    kind = "scheduler" if issubclass(cls, Scheduler) else "cache policy" if issubclass(cls, AdapterCachePolicy) \
        else "policy"
    name = getattr(cls, "name", "")
    return f"{kind} {name!r} ({cls.__qualname__})" if isinstance(name, str) and name else f"{kind} {cls.__qualname__}"


def is_builtin(policy: Any) -> bool:
    """Whether ``policy`` (a class or an instance) comes from the project's own ``policies`` package."""
    cls = policy if isinstance(policy, type) else type(policy)
    return cls.__module__.split(".")[0] == "policies"


def name_unusable(name: str) -> bool:
    """Whether a command line (``--policy``, ``--scheduler``, ``--policies a,b``) cannot name ``name``:
    spaces, commas, ``=`` or unprintable characters."""
    return any(ch.isspace() or ch in ",=" for ch in name) or not name.isprintable()


def check_policy_name(cls: type) -> str:
    """The registry name of ``cls``: a non-empty string without spaces, commas or ``=``."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{cls.__qualname__} needs a class attribute `name` (a non-empty string) to be "
                          f"registered, e.g. name = \"my-policy\"")
    if name_unusable(name):
        raise PolicyError(f"{cls.__qualname__}: policy name {name!r} has spaces, commas or '='; command lines "
                          f"(--scheduler, --cache, --policies a,b) cannot name it; use letters, digits, '-', '_'")
    return name


def check_policy_class(cls: Any, kind: str) -> None:
    """Refuse a class that does not implement the ``kind`` ('scheduler' or 'cache') protocol:
    not a subclass of its base, a required hook not implemented, a hook that is not a method or
    cannot take the arguments the engine passes, a ``reclaim_blocks`` that is not a method of
    ``(n, now, pin)``. Raises :class:`PolicyError` naming the hook and the fix; validated once per class."""
    base = _BASES[kind]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        other = next((k for k, b in _BASES.items() if isinstance(cls, type) and issubclass(cls, b)), None)
        hint = f" (it is a {other}: pass it as the {other})" if other else ""
        raise PolicyError(f"{cls!r} is not a {kind}{hint}; a {kind} subclasses {_PROTOCOL[kind]}")
    if (cls, kind) in _checked:
        return
    who = policy_label(cls)
    for hook in REQUIRED_HOOKS[kind]:
        if getattr(cls, hook, None) is getattr(base, hook):
            raise PolicyError(f"{who} does not implement the required hook {hook}"
                              f"({', '.join(_HOOKS[kind][hook])}) of {_PROTOCOL[kind]}; define it")
    hooks = dict(_HOOKS[kind])
    if kind == "cache" and getattr(cls, "reclaim_blocks", None) is not None:
        hooks["reclaim_blocks"] = ("n", "now", "pin")
    for hook, args in hooks.items():
        fn = inspect.getattr_static(cls, hook, None)
        if isinstance(fn, (staticmethod, classmethod)):
            fn = fn.__func__
            bound_args: tuple = () if isinstance(inspect.getattr_static(cls, hook), staticmethod) else (None,)
        else:
            bound_args = (None,)
        if not callable(fn):
            raise PolicyError(f"{who}: hook {hook} is {fn!r}, not a method; define {hook}(self"
                              f"{''.join(', ' + a for a in args)}) (protocol {_PROTOCOL[kind]})")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to check
            continue
        try:
            sig.bind(*bound_args, *args)
        except TypeError:
            raise PolicyError(f"{who}: hook {hook}{sig} cannot be called as {hook}(self"
                              f"{''.join(', ' + a for a in args)}) by the engine; give it that signature "
                              f"(protocol {_PROTOCOL[kind]})") from None
    _checked[(cls, kind)] = None


def check_policy_object(obj: Any, kind: str, arg: str) -> None:
    """``obj`` (passed as ``arg``) is an instance of a ``kind`` ('scheduler' or 'cache') implementing
    its protocol (not a class, a name or the other kind of policy); else :class:`PolicyError`."""
    by_name = "scheduler" if kind == "scheduler" else "cache"
    if isinstance(obj, type):
        raise PolicyError(f"{arg}: got the class {obj.__qualname__}, not an instance; pass "
                          f"{obj.__qualname__}() (or its registered name as {by_name}=)")
    if isinstance(obj, str):
        raise PolicyError(f"{arg}: got the string {obj!r}, not a policy instance; pass the name as "
                          f"{by_name}={obj!r}")
    if not isinstance(obj, _BASES[kind]):
        other = next((k for k, b in _BASES.items() if isinstance(obj, b)), None)
        what = f"a {other}" if other else f"a {type(obj).__name__}"
        raise PolicyError(f"{arg}: got {what} ({type(obj).__qualname__}), not a {kind}; a {kind} is an instance of "
                          f"a subclass of {_PROTOCOL[kind]}")
    check_policy_class(type(obj), kind)
    missing = [k for k in type(obj)._param_names() if not hasattr(obj, k)]
    if missing:  # (get_params() failed as a bare AttributeError in `twin run`, and rebuilt policies lost it)
        raise PolicyError(f"{policy_label(obj)}: constructor argument(s) {', '.join(missing)} are not stored under "
                          f"their own names; store each as self.<name> (e.g. self.{missing[0]} = {missing[0]}), "
                          f"which get_params() reads (scikit-learn's convention)")


def check_policy_objects(scheduler: Any, cache: Any) -> None:
    """What an engine checks before any work: ``scheduler`` and ``cache`` are policy instances
    implementing their protocols (:func:`check_policy_object`), their declared capabilities of the
    right type and range (:func:`check_capabilities`), a built-in one with options in range
    (:func:`check_builtin_options`)."""
    check_policy_object(scheduler, "scheduler", "scheduler_obj")
    check_policy_object(cache, "cache", "cache_obj")
    check_capabilities(scheduler)
    check_capabilities(cache)
    check_builtin_options(scheduler)
    check_builtin_options(cache)


def claim_for_run(policy: Any, kind: str) -> None:
    """Mark ``policy`` as serving the run that binds it, refusing one that already served a run: a policy keeps its
    state (queues, cache contents, counters) in the instance from :meth:`Policy.bind` on, so a second run with the
    same instance started from the first one's end state (a built-in LRU cache then named a victim the new engine
    had never loaded; a prefetching cache silently changed the run's results)."""
    if getattr(policy, "_twin_claimed", False):
        raise PolicyError(f"{policy_label(policy)}: this instance was bound to an earlier run's engine, and a policy "
                          f"keeps its state in the instance; pass a new one to each run (e.g. twin.registry.make_{kind}("
                          f"{getattr(policy, 'name', '...')!r}, ...), or {type(policy).__name__}(...))")
    try:
        policy._twin_claimed = True
    except AttributeError:  # (a policy class with __slots__ and no room for the mark: not checked)
        pass


#: the adapter memories and allocators a cache policy may ask for (``twin.extensions``, ``twin.adapter_placement``)
ADAPTER_MEMORIES = ("slots", "region", "unified")
ADAPTER_PLACEMENTS = ("contiguous", "paged")
#: the LoRA compute a cache policy may ask the vLLM engine to charge
LORA_COMPUTES = ("profile", "paged")


def _is_number(v: Any) -> bool:
    """A real number that is not NaN (:func:`traces.arguments.is_real_number`)."""
    return is_real_number(v) and v == v


def check_capabilities(policy: Any) -> None:
    """The capabilities a policy declares (the class attributes of :class:`Policy` and
    :class:`AdapterCachePolicy`, or the same names set by its constructor) have the type and
    range the engine reads them with; else a :class:`PolicyError` naming the attribute, its value
    and what to give, before any work. Unchecked, ``max_inflight = 0`` never prefetched,
    ``lora_share = 1.5`` gave the KV cache a negative size, ``kv_block_size = 0.5`` a zero block
    size and a misspelt ``adapter_memory`` or ``lora_compute`` silently ran vLLM's slots or the
    profile's LoRA cost."""
    who = policy_label(policy)

    def fail(attr: str, want: str) -> None:
        raise PolicyError(f"{who}: {attr} = {getattr(policy, attr)!r}; give {want} (see {_where(attr)})")

    for attr in ("prefetch_evicts", "prefetch_sync", "uses_events", "prefetch_at_tick"):
        if not is_flag(getattr(policy, attr, False)):
            fail(attr, "True or False")
    n = getattr(policy, "max_inflight", 4)
    if n is not None and not (isinstance(n, (int, numbers.Integral)) and not is_flag(n) and n >= 1):
        fail("max_inflight", "the asynchronous prefetches in flight at most, an integer >= 1 (None: no bound)")
    if not isinstance(policy, AdapterCachePolicy):
        return
    for attr, allowed in (("adapter_memory", ADAPTER_MEMORIES), ("adapter_placement", ADAPTER_PLACEMENTS),
                          ("lora_compute", LORA_COMPUTES)):
        v = getattr(policy, attr)
        if v is not None and v not in allowed:
            fail(attr, f"one of {', '.join(map(repr, allowed))} or None (the engine configuration decides)")
    share = policy.lora_share
    if share is not None and not (_is_number(share) and 0 <= share < 1):
        fail("lora_share", "the share of the pool given to the adapter region, a number >= 0 and < 1, or None")
    if policy.prefix_kv is not None and not is_flag(policy.prefix_kv):
        fail("prefix_kv", "True, False or None (EngineConfig.prefix_caching decides)")
    for attr in ("history_to_host", "async_swap_in", "kv_before_adapter"):
        if not is_flag(getattr(policy, attr)):
            fail(attr, "True or False")
    host = policy.host_kv_tokens
    if not (_is_number(host) and host >= 0):
        fail("host_kv_tokens", "the host memory for swapped history KV in tokens, a number >= 0 (math.inf: unbounded)")
    bs = policy.kv_block_size
    if bs is not None and not (isinstance(bs, numbers.Integral) and not is_flag(bs) and bs >= 1):
        fail("kv_block_size", "tokens per KV block, an integer >= 1 (vLLM uses 8, 16, 32, 64, 128), or None "
                              "(EngineConfig.block_size)")


def checked_next_change_time(scheduler: Scheduler) -> Callable[[Admit | None], float]:
    """The scheduler's ``next_change_time`` as the engine calls it: a built-in's own method, a plug-in's
    wrapped so that a return value that is not a number of seconds -- None, text, NaN (which ran on and
    changed the results, taken as never) -- is a :class:`PolicyError` naming the hook, not a bare
    ``TypeError`` inside the engine. Any number is safe otherwise: a time too early (even in the past)
    only splits a run of decode steps."""
    hook = scheduler.next_change_time
    if is_builtin(scheduler):
        return hook
    who = policy_label(scheduler)

    def next_change_time(stop: Admit | None) -> float:
        t = hook(stop)
        if not _is_number(t):
            raise PolicyError(f"{who}: next_change_time returned {t!r}; return the earliest time (s) an arrival "
                              f"could let schedule_waiting admit something, a number (math.inf: none; too early is "
                              f"always safe), e.g. self.engine.next_arrival_time()")
        return t

    return next_change_time


def checked_schedule_waiting(scheduler: Scheduler, engine: Any = None) -> Callable[[Any], Admit | None]:
    """The scheduler's ``schedule_waiting`` as the engine calls it: a built-in's own method, a plug-in's
    wrapped so that a return value other than None or an :class:`Admit` (its integer value is taken) is a
    :class:`PolicyError` naming the hook ("OK", NaN or a list were taken silently and only misled the
    run's end, ``next_change_time``). While a plug-in's call runs, ``engine._offer_ctx`` holds its step
    context (None otherwise): the engine's checked ``try_admit`` refuses an offer outside the call or
    through another step's context (:meth:`twin.engine_state.EngineState.check_offer`)."""
    hook = scheduler.schedule_waiting
    if is_builtin(scheduler):
        return hook
    who = policy_label(scheduler)
    values = {int(a) for a in Admit}

    def schedule_waiting(ctx: Any) -> Admit | None:
        if engine is None:
            stop = hook(ctx)
        else:
            engine._offer_ctx = ctx
            try:
                stop = hook(ctx)
            finally:
                engine._offer_ctx = None
        if stop is None or isinstance(stop, Admit):
            return stop
        if isinstance(stop, numbers.Integral) and not is_flag(stop) and int(stop) in values:
            return Admit(int(stop))
        raise PolicyError(f"{who}: schedule_waiting returned {stop!r}; return why admission stopped, an Admit "
                          f"(the ctx.try_admit outcome that stopped it, e.g. Admit.NO_KV), or None when no waiting "
                          f"request was eligible")

    return schedule_waiting


def checked_evict_when_idle(policy: AdapterCachePolicy) -> Callable[[int], bool]:
    """The cache policy's ``evict_when_idle`` as the engines call it: a built-in's own method, a plug-in's
    wrapped so that anything but True or False is a :class:`PolicyError` (``"no"`` is truthy: it discarded
    every idle adapter)."""
    hook = policy.evict_when_idle
    if is_builtin(policy):
        return hook
    who = policy_label(policy)

    def evict_when_idle(a: int) -> bool:
        got = hook(a)
        if not is_flag(got):
            raise PolicyError(f"{who}: evict_when_idle({a}) returned {got!r}; return True (discard the adapter as "
                              f"soon as it is idle) or False (keep it cached)")
        return bool(got)

    return evict_when_idle


def policy_stats(policy: Policy) -> dict[str, Any]:
    """The policy's :meth:`Policy.stats` for the run summary: a mapping of counter names (strings) to
    values; anything else is a :class:`PolicyError` naming the hook (a list failed as a bare
    ``ValueError`` after the run)."""
    got = policy.stats()
    if not isinstance(got, Mapping) or not all(isinstance(k, str) for k in got):
        raise PolicyError(f"{policy_label(policy)}: stats() returned {got!r}; return a dict of counter names "
                          f"(strings) to numbers for the run summary, e.g. {{'my_policy_skips': 3}} ({{}}: none)")
    for k, v in got.items():  # (summary.json holds them: a set was written as its text)
        try:
            json.dumps(v, allow_nan=True, default=lambda o: o.item() if hasattr(o, "item") else _unjsonable(o))
        except (TypeError, ValueError):
            raise PolicyError(f"{policy_label(policy)}: stats() entry {k!r} = {v!r} is not a number, text, or a list "
                              f"or dict of them; the run summary is JSON") from None
    return dict(got)


def _unjsonable(o: Any) -> Any:
    raise TypeError(type(o).__name__)


#: the most adapter ids one ``prefetch`` call may return per adapter (repeats allowed, an endless generator refused)
PREFETCH_IDS_PER_ADAPTER = 16


def checked_prefetch(policy: Policy, n_adapters: int) -> Callable[[float], Iterable[int]]:
    """The policy's ``prefetch`` as the engine calls it: a built-in's own method, a plug-in's wrapped so
    that anything but an iterable of adapter ids below ``n_adapters`` is a :class:`PolicyError` naming the
    hook (None and text failed as bare ``TypeError``, an id past the last adapter as ``IndexError``, a
    float id as numpy's indexing error). Negative ids (a base-model request's -1) are skipped."""
    hook = policy.prefetch
    if is_builtin(policy):
        return hook
    who = policy_label(policy)

    def prefetch(now: float) -> Iterable[int]:
        got = hook(now)
        if isinstance(got, (str, bytes)) or not isinstance(got, Iterable):
            raise PolicyError(f"{who}: prefetch returned {got!r}; return the adapter ids to load, in priority "
                              f"order, as a list or another iterable of ints (empty: none)")
        cap = PREFETCH_IDS_PER_ADAPTER * n_adapters + 1024
        ids = list(itertools.islice(got, cap + 1))  # (an endless generator filled the memory until the run was killed)
        if len(ids) > cap:
            raise PolicyError(f"{who}: prefetch returned more than {cap} adapter ids for {n_adapters} adapters (an "
                              f"endless generator?); return each adapter to load once, in priority order, as a list "
                              f"or a finite iterable of ints")
        for a in ids:
            if not (isinstance(a, numbers.Integral) and not is_flag(a) and a < n_adapters):
                raise PolicyError(f"{who}: prefetch returned adapter {a!r} in {ids[:8]!r}"
                                  f"{' ...' if len(ids) > 8 else ''}; adapter ids are the engine's dense indices, ints "
                                  f"from 0 to {n_adapters - 1} (engine.adapter_ids[i] is the workload's adapter_id of "
                                  f"index i; negative ids are skipped)")
        return ids

    return prefetch


def _where(attr: str) -> str:
    """Where a capability is documented."""
    base = "AdapterCachePolicy" if attr in AdapterCachePolicy.__dict__ else "Policy"
    return f"twin.interfaces.{base}.{attr}"


#: built-in policy options that are shares or percentages, and their largest value
OPTION_MAXIMA = {"busy": 1.0, "idle": 1.0, "alpha": 1.0, "accuracy": 1.0, "head_pct": 100.0, "tail_pct": 100.0}


def _annotated_kind(annotation: Any) -> str | None:
    """``"flag"``, ``"int"`` or ``"real"`` for a constructor parameter annotated ``bool``, ``int`` or ``float``
    (``| None`` allowed; ``float | int`` is real), else None (text, lists, the memory layout: checked where read)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    parts = {t for t in text.replace(" ", "").split("|") if t and t != "None"}
    if parts == {"bool"}:
        return "flag"
    if parts == {"int"}:
        return "int"
    if parts and parts <= {"int", "float"}:
        return "real"
    return None


def _declared_options(cls: type) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The constructor options along ``cls``'s MRO: their defaults, and the kind their annotation declares
    (:func:`_annotated_kind`: ``flag``, ``int``, ``real`` or None)."""
    defaults: dict[str, Any] = {}
    kinds: dict[str, str | None] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name not in defaults and p.default is not p.empty:
                defaults[p.name] = p.default
                kinds[p.name] = _annotated_kind(p.annotation) if p.annotation is not p.empty else None
    return defaults, kinds


def check_option_kinds(cls: type, options: dict[str, Any], who: str) -> None:
    """A built-in policy's ``options`` have the kind its constructor declares (a ``bool`` True or False, an ``int``
    a whole number, a ``float`` a number); else a :class:`PolicyError` naming the option. Run on the given options
    before the constructor (whose own range checks compared ``'nan' <= 1``: a TypeError) and on the built policy's
    parameters (:func:`check_builtin_options`)."""
    if not is_builtin(cls):
        return
    defaults, kinds = _declared_options(cls)
    for name, v in options.items():
        kind = kinds.get(name)
        if v is not None and kind is not None:
            ok = is_flag(v) if kind == "flag" else is_whole_number(v) if kind == "int" else is_real_number(v)
            if not ok:
                want = {"flag": "True or False", "int": "a whole number", "real": "a number"}[kind]
                raise PolicyError(f"{who}: option {name} = {v!r}: give {want} (default {defaults[name]!r})")


def check_builtin_options(policy: Any) -> None:
    """A built-in policy's options have the kind their constructor declares (a ``bool`` True or False, an
    ``int`` a whole number, a ``float`` a number: ``max_scan=2.5``, ``bypass='maybe'`` and ``slo_s='abc'`` ran
    or failed later inside a hook), and its numeric options (the constructor arguments whose default is a
    number, or None for "derived") are finite numbers >= 0, shares at most 1 and percentages at most 100
    (:data:`OPTION_MAXIMA`); else a :class:`PolicyError` naming the option, before any work. Every such option
    of the shipped policies is a count, a time, a rate or a share; unchecked, ``client_cap=-1`` dropped every
    request and a NaN time or a negative count ran. A user's plug-in keeps its own conventions (its hooks are
    checked as they run)."""
    if not is_builtin(policy):
        return
    defaults, _ = _declared_options(type(policy))
    who = policy_label(policy)
    params = policy.get_params()
    check_option_kinds(type(policy), params, who)
    for name, v in params.items():
        d = defaults.get(name, inspect.Parameter.empty)
        numeric_default = isinstance(d, numbers.Real) and not isinstance(d, bool)
        given_number = isinstance(v, numbers.Real) and not isinstance(v, bool)
        if v is None or not (numeric_default or (d is None and given_number)):
            continue  # (flags, text options and the memory layout are checked where they are read)
        top = OPTION_MAXIMA.get(name, INF)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0 <= v <= top) or v == INF:
            bound = f">= 0 and <= {top:g}" if top < INF else ">= 0 and finite"
            raise PolicyError(f"{who}: option {name} = {v!r}: give a number {bound} (default "
                              f"{d!r}{': derived' if d is None else ''})")


#: the shortest tick a policy may ask for (s): a finer one makes a run of millions of ticks per simulated
#: hour (1e-7 s hung a run); vLLM's own scheduler steps are milliseconds long
MIN_TICK_S = 1e-3


def check_tick_interval(policy: Policy) -> float | None:
    """A policy's ``tick_interval``: None or a finite number of seconds >= :data:`MIN_TICK_S`."""
    t = policy.tick_interval
    if t is not None and not (isinstance(t, numbers.Real) and not isinstance(t, bool) and MIN_TICK_S <= t < INF):
        option = getattr(policy, "tick_option", None)  # (the option it reads: chameleon's refresh_s, ...)
        what = f"option {option} = {t!r} (its tick interval)" if option else f"tick_interval is {t!r}"
        raise PolicyError(f"{policy_label(policy)}: {what}; give seconds between on_tick calls, "
                          f">= {MIN_TICK_S:g} and finite, or None (no ticks)")
    return t


def callback_label(cb: Any) -> str:
    """A callable as an error names it: its qualified name and where it is defined (``file:line``), e.g.
    ``MyScheduler.on_tick.<locals>.<lambda> (my_policy.py:42)``."""
    fn = getattr(cb, "__func__", cb)
    name = getattr(fn, "__qualname__", None) or repr(cb)
    code = getattr(fn, "__code__", None)
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})" if code is not None else name


def explain_policy_failure(exc: BaseException, policies: Iterable[Any]) -> PolicyError | None:
    """A :class:`PolicyError` naming the policy and the hook when ``exc`` was raised inside one of
    ``policies``' methods during a run (found in its traceback: the engine's hot loop has no
    wrapper), else None. The outermost policy frame is the hook the engine called."""
    if isinstance(exc, PolicyError) or not isinstance(exc, Exception):
        return None
    pols = list(policies)
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if any(owner is p for p in pols):
            frames.append((owner, tb.tb_frame.f_code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    if not frames:
        return None
    owner, inner, line = frames[-1]  # the policy that raised, and the hook the engine called on it
    hook = next(name for o, name, _ in frames if o is owner)
    where = f" (in {inner}, line {line})" if inner != hook else f" (line {line})"
    detail = str(exc) or "no message"
    return PolicyError(f"{policy_label(owner)} failed in its hook {hook}{where}: {type(exc).__name__}: {detail}; "
                       f"fix the policy (the chained traceback shows where)")
