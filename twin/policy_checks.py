"""A conformance battery for schedulers and adapter-cache policies, in the manner of
scikit-learn's :mod:`sklearn.utils.estimator_checks` (``check_estimator``,
``parametrize_with_checks``).

Each check runs a policy through the engine on small seeded workloads (built here, so a
third-party package needs nothing from this project's tests) and fails with an
``AssertionError`` naming the policy and the check:

* ``check_names``: ``name``, ``description`` and ``citation`` are set;
* ``check_get_params``: ``get_params()`` returns the constructor arguments by name, stored
  under the same names, and ``type(p)(**p.get_params())`` rebuilds an equal policy;
* ``check_rebuilt_simulates_identically``: that rebuilt policy gives the same per-request table;
* ``check_invariants_and_accounting``: the engine's invariants hold at every step
  (``check_invariants=True``) under KV pressure, few adapter slots, many adapters,
  conversations with prefix KV and a horizon, and every request is finished, rejected
  with a reason, unfinished at the horizon or not yet arrived (the counts add up);
* ``check_deterministic``: two runs of fresh instances give identical per-request tables;
* ``check_exact_run_skipping``: advancing runs of decode steps at once
  (the default) gives exactly the results of stepping one step at a time (``max_run_steps=1``).
* ``check_victim_keeps_reclaim_pin``: a cache's ``victim`` leaves the adapter an admission pins
  (``reclaim_pin``) while another idle adapter can go.

A scheduler is checked with the ``lru`` cache, a cache with the ``fcfs`` scheduler, and a
:class:`twin.registry.Preset` as its pair, on the preset's serving system (``vllm`` for a
scheduler or cache alone); :func:`on_system` checks a policy on another system (e.g.
``on_system(MyScheduler, "slora")``: S-LoRA's engine, ``twin/slora_engine.py``). A third-party package checks its policies in its
own tests like this::

    from twin.policy_checks import check_cache, check_scheduler, parametrize_with_checks

    from mypkg.mypolicy import MyCache, MyScheduler

    @parametrize_with_checks([MyScheduler, MyCache(alpha=0.3)])
    def test_conformance(policy, check):
        check(policy)

    # or all checks at once, e.g. in a notebook:
    check_scheduler(MyScheduler)
    check_cache(MyCache(alpha=0.3))
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from traces.workload import Workload
from twin.config import EngineConfig
from twin.interfaces import AdapterCachePolicy, Scheduler
from twin.perf.profile import DEFAULT_PROFILE, Profile
from twin.registry import CACHES, PRESETS, SCHEDULERS, Preset, load_entry_points, make_cache, make_scheduler
from twin.simulate import SimResult, simulate

#: the partner a policy is checked with: a scheduler runs with this cache, a cache with this scheduler
PARTNER_CACHE = "lru"
PARTNER_SCHEDULER = "fcfs"
#: summary keys that measure the host, not the simulated system
WALL_CLOCK_KEYS = ("wall_s", "x_realtime")

Policy = Scheduler | AdapterCachePolicy


# -- the workloads, configurations and profile of the battery ------------------------------

def battery_profile() -> Profile:
    """The embedded default profile (Llama-3.1-8B on an H100, hand-set)."""
    return Profile.from_dict(copy.deepcopy(DEFAULT_PROFILE))


def pressure_workload(n: int = 100, rps: float = 6.0, adapters: int = 16, seed: int = 0) -> Workload:
    """Poisson arrivals over many Zipf-popular adapters with long prompts; a few requests exceed the
    battery's ``max_model_len`` (rejected) and one asks for an adapter that is not served."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rps, n))
    prompt = rng.integers(1, 1800, n)
    output = rng.integers(1, 250, n)
    prompt[rng.choice(n, 3, replace=False)] = 2100  # > max_model_len 2048: rejected
    popularity = 1.0 / np.arange(1, adapters + 1)  # Zipf: a few hot adapters, a long tail
    adapter = rng.choice(adapters, n, p=popularity / popularity.sum())
    adapter[rng.choice(n, n // 10, replace=False)] = -1  # base-model requests
    adapter[n // 2] = adapters  # not among the served adapters: rejected
    rank = np.where(adapter >= 0, np.array([8, 16, 32])[np.maximum(adapter, 0) % 3], 0)
    return Workload.from_arrays(arrival, prompt, output, adapter, rank)


def conversation_workload(n_conv: int = 45, turns: int = 3, adapters: int = 10, seed: int = 1,
                          gap_s: float = 2.0, rps: float = 6.0) -> Workload:
    """Multi-turn conversations: turn k re-sends turn k-1's prompt and output as its prefix."""
    rng = np.random.default_rng(seed)
    rows = []
    starts = np.cumsum(rng.exponential(1.0 / rps, n_conv))
    for c in range(n_conv):
        a = int(rng.integers(0, adapters))
        t, prefix = float(starts[c]), 0
        for k in range(int(rng.integers(1, turns + 1))):
            new, out = int(rng.integers(20, 400)), int(rng.integers(5, 120))
            rows.append((t, prefix + new, out, a, (8, 16, 32)[a % 3], c, k, prefix))
            prefix += new + out
            t += gap_s + float(rng.exponential(gap_s))
    rows.sort()
    arr = np.array(rows, dtype=float)
    return Workload.from_arrays(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], arr[:, 4], conversation_id=arr[:, 5],
                                turn=arr[:, 6], prefix_tokens=arr[:, 7])


@dataclass(frozen=True)
class Scenario:
    """A workload, an engine configuration and a horizon the battery runs a policy on."""

    name: str
    workload: Callable[[], Workload]
    config: Callable[[], EngineConfig]
    horizon_s: float | None = None
    #: the workload holds requests the engine must reject (too long, unknown adapter)
    rejects: bool = True


SCENARIOS: tuple[Scenario, ...] = (
    # few KV blocks (preemption by recompute), few slots and sequences, 16 adapters, rejections
    Scenario("pressure", pressure_workload,
             lambda: EngineConfig(kv_capacity_tokens=12_000, max_model_len=2048, max_loras=4, max_num_seqs=16,
                                  max_num_batched_tokens=1024, served_adapters=16)),
    # conversations with history KV kept for the next turn
    Scenario("conversations", conversation_workload,
             lambda: EngineConfig(kv_capacity_tokens=20_000, max_model_len=4096, max_loras=3, max_num_seqs=32,
                                  prefix_caching=True),
             rejects=False),
    # stopped while requests are in flight and others have not arrived
    Scenario("horizon", functools.partial(pressure_workload, seed=2),
             lambda: EngineConfig(kv_capacity_tokens=12_000, max_model_len=2048, max_loras=2, max_num_seqs=16,
                                  served_adapters=16),
             horizon_s=8.0),
)
SCENARIO_BY_NAME = {s.name: s for s in SCENARIOS}


# -- what is checked: a policy with its partner --------------------------------------------

@dataclass(frozen=True)
class Subject:
    """A policy under test and how to make fresh instances of it and of its partner."""

    label: str
    kind: str  # 'scheduler', 'cache' or 'preset'
    make_scheduler: Callable[[], Scheduler]
    make_cache: Callable[[], AdapterCachePolicy]
    #: the serving system the checks run on (``twin.registry.SYSTEMS``; a preset's own by default)
    system: str = "vllm"

    def under_test(self) -> list[Policy]:
        """Fresh instances of the policies whose parameters are checked."""
        if self.kind == "scheduler":
            return [self.make_scheduler()]
        if self.kind == "cache":
            return [self.make_cache()]
        return [self.make_scheduler(), self.make_cache()]


def _factory(policy: Any) -> Callable[[], Any]:
    if isinstance(policy, type):
        return policy
    template = copy.deepcopy(policy)  # before any run binds it to an engine
    return lambda: copy.deepcopy(template)


def as_subject(policy: Any) -> Subject:
    """A scheduler or cache (class or instance), a :class:`Preset` or a ``Subject``."""
    if isinstance(policy, Subject):
        return policy
    load_entry_points()
    if isinstance(policy, Preset):
        p = policy
        return Subject(f"preset {p.name}", "preset", lambda: make_scheduler(p.scheduler, **p.scheduler_opts),
                       lambda: make_cache(p.cache, **dict(p.cache_opts)), p.system)
    cls = policy if isinstance(policy, type) else type(policy)
    if issubclass(cls, Scheduler):
        return Subject(f"scheduler {cls.name or cls.__name__}", "scheduler", _factory(policy),
                       lambda: make_cache(PARTNER_CACHE))
    if issubclass(cls, AdapterCachePolicy):
        return Subject(f"cache {cls.name or cls.__name__}", "cache", lambda: make_scheduler(PARTNER_SCHEDULER),
                       _factory(policy))
    raise TypeError(f"{policy!r} is neither a Scheduler, an AdapterCachePolicy nor a Preset")


def on_system(policy: Any, system: str) -> Subject:
    """``policy`` (as :func:`as_subject` takes it) checked on serving system ``system``."""
    subject = as_subject(policy)
    return dataclasses.replace(subject, label=f"{subject.label} on {system}", system=system)


def run_scenario(subject: Subject, scenario: Scenario, check_invariants: bool = False,
                 max_run_steps: int | None = None, scheduler: Scheduler | None = None,
                 cache: AdapterCachePolicy | None = None) -> SimResult:
    """One run of ``subject`` (fresh instances unless given) on ``scenario``, on the subject's
    system (S-LoRA has no prefix-KV reuse: the conversations run without it there)."""
    cfg = scenario.config()
    if subject.system == "slora":
        cfg = dataclasses.replace(cfg, prefix_caching=False)
    return simulate(scenario.workload(), battery_profile(), cfg,
                    scheduler_obj=subject.make_scheduler() if scheduler is None else scheduler,
                    cache_obj=subject.make_cache() if cache is None else cache,
                    horizon_s=scenario.horizon_s, max_run_steps=max_run_steps, check_invariants=check_invariants,
                    system=subject.system)


def _assert_same_requests(a: SimResult, b: SimResult, what: str, label: str) -> None:
    try:
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    except AssertionError as e:
        raise AssertionError(f"{label}: {what}: per-request tables differ: {e}") from None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        eq = a == b
        return bool(np.all(eq)) if not isinstance(eq, bool) else eq
    except Exception:  # objects without a usable equality
        return a is b


# -- the checks ------------------------------------------------------------------------------

def check_names(subject: Subject) -> None:
    """``name``, ``description`` and ``citation`` are non-empty strings."""
    for p in subject.under_test():
        for attr in ("name", "description", "citation"):
            v = getattr(p, attr, None)
            assert isinstance(v, str) and v.strip(), f"{subject.label}: {type(p).__name__}.{attr} is not set"


def _init_parameters(cls: type) -> tuple[list[str], bool]:
    """The named constructor parameters of ``cls`` and whether it also takes ``**kwargs``."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return named, any(p.kind == p.VAR_KEYWORD for p in params)


def check_get_params(subject: Subject) -> None:
    """scikit-learn's parameter contract: ``get_params()`` maps every constructor argument
    to its value, the value is stored under the same name, and ``type(p)(**p.get_params())``
    rebuilds a policy with equal parameters."""
    for p in subject.under_test():
        cls = type(p)
        assert callable(getattr(p, "get_params", None)), f"{subject.label}: {cls.__name__} has no get_params()"
        params = p.get_params()
        assert isinstance(params, dict), f"{subject.label}: get_params() returned {type(params).__name__}, not dict"
        named, var_kw = _init_parameters(cls)
        missing = [k for k in named if k not in params]
        assert not missing, f"{subject.label}: get_params() lacks constructor arguments {missing}"
        if not var_kw:
            extra = [k for k in params if k not in named]
            assert not extra, f"{subject.label}: get_params() returns {extra}, which {cls.__name__}() does not take"
        for k, v in params.items():
            if hasattr(p, k):
                assert _same(getattr(p, k), v), \
                    f"{subject.label}: get_params()[{k!r}] = {v!r} but the policy stores {getattr(p, k)!r}"
        rebuilt = cls(**params)
        again = rebuilt.get_params()
        assert sorted(again) == sorted(params) and all(_same(again[k], params[k]) for k in params), \
            f"{subject.label}: {cls.__name__}(**get_params()).get_params() = {again!r} != {params!r}"


def check_rebuilt_simulates_identically(subject: Subject, scenario: str = "pressure") -> None:
    """A policy rebuilt from ``get_params()`` gives the same per-request table."""
    sc = SCENARIO_BY_NAME[scenario]

    def rebuilt(p: Policy) -> Policy:
        assert callable(getattr(p, "get_params", None)), f"{subject.label}: {type(p).__name__} has no get_params()"
        return type(p)(**p.get_params())

    ref = run_scenario(subject, sc)
    s, c = subject.make_scheduler(), subject.make_cache()
    if subject.kind in ("scheduler", "preset"):
        s = rebuilt(s)
    if subject.kind in ("cache", "preset"):
        c = rebuilt(c)
    _assert_same_requests(ref, run_scenario(subject, sc, scheduler=s, cache=c),
                          "a policy rebuilt from get_params()", subject.label)


def check_invariants_and_accounting(subject: Subject) -> None:
    """Invariants at every step (the engine asserts them) on every scenario; every request is
    accounted for once; finished requests emitted their whole output after their first token."""
    for sc in SCENARIOS:
        label = f"{subject.label} [{sc.name}]"
        try:
            res = run_scenario(subject, sc, check_invariants=True)
        except AssertionError as e:
            raise AssertionError(f"{label}: engine invariant broken: {e}") from None
        s, r = res.summary, res.requests
        n = len(r)
        counts = r["outcome"].value_counts().to_dict()
        fin, rej = counts.get("finished", 0), counts.get("rejected", 0)
        unf, not_arr = counts.get("unfinished", 0), counts.get("not_arrived", 0)
        assert fin + rej + unf + not_arr == n, f"{label}: outcomes {counts} do not cover the {n} requests"
        assert (s["requests_finished"], s["requests_rejected"], s["requests_unfinished"]) == (fin, rej, unf), \
            f"{label}: summary counts disagree with the per-request table ({counts})"
        assert s["requests_arrived"] == n - not_arr, f"{label}: requests_arrived {s['requests_arrived']} != {n - not_arr}"
        if sc.horizon_s is None:
            assert unf == 0 and not_arr == 0, f"{label}: {unf} requests unfinished without a horizon"
        assert rej >= 1 or not sc.rejects, f"{label}: the scenario's oversized requests were not rejected"
        rejected = r[r["outcome"] == "rejected"]
        assert (rejected["reject_reason"].str.len() > 0).all(), f"{label}: a rejected request has no reason"
        assert (r.loc[r["outcome"] != "rejected", "reject_reason"] == "").all(), \
            f"{label}: a request that was not rejected carries a rejection reason"
        done = r[r["outcome"] == "finished"]
        assert (done["tokens_emitted"] == done["output_tokens"]).all(), \
            f"{label}: a finished request did not emit its whole output"
        assert (done["arrival_s"] <= done["first_scheduled_s"]).all() and \
               (done["first_scheduled_s"] < done["first_token_s"]).all() and \
               (done["first_token_s"] <= done["finish_s"]).all(), \
            f"{label}: a finished request's arrival <= scheduled < first token <= finish does not hold"
        if sc.horizon_s is not None:
            started = r[np.isfinite(r["first_scheduled_s"])]
            assert (started["first_scheduled_s"] < sc.horizon_s).all(), \
                f"{label}: a request was scheduled at or after the horizon"
            open_ = r[r["outcome"] == "unfinished"]
            assert (open_["tokens_emitted"] < open_["output_tokens"]).all(), \
                f"{label}: an unfinished request emitted its whole output"


def check_deterministic(subject: Subject, scenarios: tuple[str, ...] = ("pressure", "conversations")) -> None:
    """Two runs of fresh instances give identical per-request tables and summaries."""
    for sc in (SCENARIO_BY_NAME[n] for n in scenarios):
        a, b = run_scenario(subject, sc), run_scenario(subject, sc)
        _assert_same_requests(a, b, f"two runs of fresh instances on {sc.name!r}", subject.label)
        sa = {k: v for k, v in a.summary.items() if k not in WALL_CLOCK_KEYS}
        sb = {k: v for k, v in b.summary.items() if k not in WALL_CLOCK_KEYS}
        diff = sorted(k for k in sa.keys() | sb.keys() if not _same(sa.get(k), sb.get(k)))
        assert not diff, f"{subject.label}: two runs on {sc.name!r} differ in summary keys {diff}"


def check_exact_run_skipping(subject: Subject) -> None:
    """Runs of decode steps advanced at once give exactly the step-by-step results."""
    for sc in SCENARIOS:
        fast, slow = run_scenario(subject, sc), run_scenario(subject, sc, max_run_steps=1)
        _assert_same_requests(fast, slow, f"run-skipping vs max_run_steps=1 on {sc.name!r} (when they differ, a "
                              f"scheduler's next_change_time returns a time later than an admission that "
                              f"stepping one by one makes, or a policy's decisions depend on how often it is "
                              f"asked: return an earlier time, e.g. self.engine.next_arrival_time(), or -math.inf "
                              f"to re-plan every step)", subject.label)
        assert fast.summary["step_segments"] <= slow.summary["step_segments"], \
            f"{subject.label}: run-skipping recorded more step segments than stepping one by one"


def idle_adapters_workload() -> Workload:
    """Three requests of adapters 0, 1 and 2 (ranks 8, 16, 32), one after the other: each adapter is left resident
    and idle."""
    return Workload.from_arrays([0.0, 1.0, 2.0], [64, 64, 64], [4, 4, 4], [0, 1, 2], [8, 16, 32])


def check_victim_keeps_reclaim_pin(subject: Subject) -> None:
    """A cache's :meth:`~twin.interfaces.AdapterCachePolicy.victim` does not name ``reclaim_pin`` -- the admitting
    request's own adapter while its admission reclaims pool memory (``twin.extensions.Extensions.reclaim``) --
    while another idle adapter can go (:func:`twin.interfaces.unpinned`). Each run leaves adapters 0, 1 and 2
    resident and idle; the victim the cache names with nothing pinned is then pinned in a fresh run, and the
    victim named there must be another evictable adapter. A scheduler alone is not checked, nor a cache that
    reclaims in its own order (``reclaim_blocks``, told the pin) or keeps no idle adapter."""
    if subject.kind == "scheduler":
        return
    sc = Scenario("idle adapters", idle_adapters_workload,
                  lambda: EngineConfig(kv_capacity_tokens=20_000, max_model_len=2048, max_loras=3, served_adapters=3),
                  rejects=False)

    def settled() -> tuple[AdapterCachePolicy, Any]:
        res = run_scenario(subject, sc)
        return res.engine.cache, res.engine

    cache, e = settled()
    if cache.reclaim_blocks is not None:
        return
    idle = e.adapters.evictable()
    if len(idle) < 2:
        return
    first = cache.victim(e.now)
    cache, e = settled()
    cache.reclaim_pin = first
    try:
        v = cache.victim(e.now)
    finally:
        cache.reclaim_pin = -1
    assert v != first and v in e.adapters.evictable(), \
        (f"{subject.label}: victim() named adapter {v!r} with reclaim_pin = {first} and adapters {idle} idle: it "
         f"must name another evictable adapter (the admitting request's own adapter is kept while another can go; "
         f"choose from twin.interfaces.unpinned(idle, self.reclaim_pin))")


CHECKS: tuple[Callable[[Subject], None], ...] = (
    check_names, check_get_params, check_rebuilt_simulates_identically, check_invariants_and_accounting,
    check_deterministic, check_exact_run_skipping, check_victim_keeps_reclaim_pin,
)


# -- running the battery ---------------------------------------------------------------------

def policy_checks(policy: Any) -> Iterator[tuple[Subject, Callable[[Any], None]]]:
    """The named checks of ``policy``: ``(subject, check)`` pairs where ``check(subject)``
    runs one check (``check.__name__`` names it)."""
    subject = as_subject(policy)
    for chk in CHECKS:
        yield subject, chk


def _run_all(policy: Any) -> None:
    for subject, chk in policy_checks(policy):
        chk(subject)


def check_scheduler(scheduler: type[Scheduler] | Scheduler) -> None:
    """Every check on ``scheduler`` (class or instance), paired with the ``lru`` cache."""
    if not (isinstance(scheduler, Scheduler) or (isinstance(scheduler, type) and issubclass(scheduler, Scheduler))):
        raise TypeError(f"{scheduler!r} is not a Scheduler")
    _run_all(scheduler)


def check_cache(cache: type[AdapterCachePolicy] | AdapterCachePolicy) -> None:
    """Every check on ``cache`` (class or instance), paired with the ``fcfs`` scheduler."""
    if not (isinstance(cache, AdapterCachePolicy) or (isinstance(cache, type) and
                                                     issubclass(cache, AdapterCachePolicy))):
        raise TypeError(f"{cache!r} is not an AdapterCachePolicy")
    _run_all(cache)


def check_preset(preset: Preset | str) -> None:
    """Every check on a preset's scheduler and cache as a pair."""
    load_entry_points()
    _run_all(PRESETS[preset] if isinstance(preset, str) else preset)


def check_policy(policy: Any) -> None:
    """Every check on a scheduler, a cache or a preset."""
    _run_all(policy)


def parametrize_with_checks(policies: Iterable[Any]):
    """A ``pytest.mark.parametrize`` over ``(policy, check)`` for every check of every policy,
    with ids ``'<kind>:<name>-<check>'``; the test body calls ``check(policy)``."""
    import pytest  # an optional dependency: only the test suites that use this need it

    params, ids = [], []
    for p in policies:
        for subject, chk in policy_checks(p):
            params.append((subject, chk))
            ids.append(f"{subject.label.replace(' ', ':')}-{chk.__name__}")
    return pytest.mark.parametrize("policy, check", params, ids=ids)


def registered_policies() -> list[Any]:
    """Every registered scheduler class, cache class and preset (after loading the entry points)."""
    load_entry_points()
    return ([SCHEDULERS[n] for n in sorted(SCHEDULERS)] + [CACHES[n] for n in sorted(CACHES)]
            + [PRESETS[n] for n in sorted(PRESETS)])
