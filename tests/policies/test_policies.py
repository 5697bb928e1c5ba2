"""Registry (entry points, presets, mixing), schedulers' worked examples (Chameleon's WRS,
K choice, quotas, Algorithm 1, bypass/squash; SJF with aging; adapter-aware; S-LoRA), the
output-length predictor, and every preset from the CLI on ``splitwise``."""

from __future__ import annotations

import heapq
import math
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import policies  # noqa: F401
from twin import registry
from policies.adapter_aware import AdapterAwareScheduler
from policies.chameleon import ChameleonScheduler
from policies.common import OutputPredictor, kmeans_1d
from policies.lru import LRUCache
from policies.sjf import SJFScheduler
from twin.registry import PRESETS, Preset, describe_all, make_cache, make_scheduler, resolve_policy
from tests.helpers import FakeCtx, ListQueueScheduler, constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.interfaces import Admit, AdapterCachePolicy, PolicyError, Scheduler
from twin.simulate import simulate

REQUIRED_PRESETS = ["slora", "chameleon", "chameleon-nocache", "chameleon-nosched", "slora+sjf", "chameleon-lru",
                    "chameleon-fairshare", "vllm", "fastlibra", "fastlibra-wom", "fastlibra-wos", "fastlibra-wol"]


# ---------------------------------------------------------------------- registry
def test_required_presets_and_descriptions():
    for p in REQUIRED_PRESETS:
        assert p in PRESETS, p
    rows = describe_all()
    for r in rows:
        assert r["description"], r
        assert r["kind"] == "preset" or r["citation"], r  # every policy cites its source
    names = {(r["kind"], r["name"]) for r in rows}
    for s in ("fcfs", "slora", "sjf", "chameleon", "chameleon-static", "chameleon-output-only", "adapter-aware"):
        assert ("scheduler", s) in names
    for c in ("none", "lru", "lfu", "ema-prefetch", "ema-prefetch-sync", "gdsf", "fairshare", "chameleon",
              "chameleon+prefetch", "fastlibra", "fastlibra-wom", "fastlibra-wos", "fastlibra-wol", "partition-lru"):
        assert ("cache", c) in names


def test_mix_scheduler_and_cache_keeps_the_memory_setup():
    s, c, label = resolve_policy("slora", cache="lru")
    assert s.name == "slora" and c.name == "lru" and label == "slora+lru"
    assert c.adapter_memory == "unified"  # S-LoRA's unified pool stays
    s, c, label = resolve_policy(scheduler="sjf", cache="gdsf")
    assert (s.name, c.name, label) == ("sjf", "gdsf", "sjf+gdsf")
    assert make_cache("lru", adapter_memory="region", adapter_placement="paged").adapter_placement == "paged"
    with pytest.raises(KeyError, match="available"):
        make_scheduler("nope")


def test_entry_point_group_registers_third_party_policies(monkeypatch):
    """A third-party distribution declares ``lora_twin.policies`` entry points: a Scheduler
    class, and a callable that registers a cache and a preset."""

    class FakeSched(SJFScheduler):  # (a scheduler implements the required hooks; a malformed one is refused)
        name = "ep-sched"
        description = "third-party scheduler"
        citation = "nobody"

    class FakeCache(LRUCache):
        name = "ep-cache"
        description = "third-party cache"
        citation = "nobody"

    def register():
        registry.register_cache(FakeCache)
        registry.register_preset(Preset("ep-preset", "fcfs", "ep-cache", "third-party preset"))

    class EP:
        def __init__(self, name, obj):
            self.name, self._obj = name, obj

        def load(self):
            if isinstance(self._obj, Exception):
                raise self._obj
            return self._obj

    seen = {}

    def fake_entry_points(group=None):
        seen["group"] = group
        return [EP("sched", FakeSched), EP("reg", register), EP("broken", ImportError("missing dependency"))]

    monkeypatch.setattr(registry.metadata, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        with pytest.warns(UserWarning, match="broken"):
            s = make_scheduler("ep-sched")
        assert seen["group"] == "lora_twin.policies" and isinstance(s, FakeSched)
        s2, c2, _ = resolve_policy("ep-preset")
        assert c2.name == "ep-cache"
        assert {"ep-sched", "ep-cache", "ep-preset"} <= {r["name"] for r in describe_all()}
    finally:
        registry.SCHEDULERS.pop("ep-sched", None)
        registry.CACHES.pop("ep-cache", None)
        registry.PRESETS.pop("ep-preset", None)


def test_twin_policies_lists_citations(capsys):
    from twin.cli import main

    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "chameleon" in out and "MICRO'25" in out and "FastLibra" in out and "S-LoRA" in out


# ---------------------------------------------------------------------- predictor
def test_output_predictor_accuracy():
    n = 20000
    rng = np.random.default_rng(0)
    e = types.SimpleNamespace(output=rng.integers(1, 2000, n))
    for acc in (1.0, 0.8, 0.6):
        p = OutputPredictor(e, acc, seed=1)
        frac = float(np.mean(p.pred == e.output))
        assert abs(frac - acc) < 0.02  # (+ a coincidental match now and then)
    a, b = OutputPredictor(e, 0.6, seed=3).pred, OutputPredictor(e, 0.6, seed=3).pred
    assert np.array_equal(a, b)


# ---------------------------------------------------------------------- Chameleon scheduler
def _chameleon_engine(**kw):
    prof = constant_profile(c0=0.01, kv_tokens=40_000)
    w = Workload.from_arrays(np.arange(6) * 0.1, [512, 100, 100, 100, 600, 50], [100, 10, 10, 10, 50, 5],
                             [0, 1, 1, 1, 2, 3], [32, 8, 8, 8, 128, 8])
    s = ChameleonScheduler(**kw)
    e = Engine(w, prof, EngineConfig(max_loras=4, max_model_len=4096), s, make_cache("chameleon"))
    return e, s


def test_wrs_formula():
    """WRS = (0.4 in/max_in + 0.6 out/max_out) * rank/max_rank: in 512 of 1024, out 100 of
    200, rank 32 of 128 -> (0.2 + 0.3) * 0.25 = 0.125; output-only: 100/200 = 0.5."""
    e, s = _chameleon_engine()
    s.max_in, s.max_out, s.max_rank = 1024, 200, 128
    assert s.weighted_size(0) == pytest.approx(0.125)
    e2, s2 = _chameleon_engine(wrs="output")
    s2.max_in, s2.max_out, s2.max_rank = 1024, 200, 128
    assert s2.weighted_size(0) == pytest.approx(0.5)


def test_k_choice_elbow_vs_min_wcss():
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.normal(0.1, 0.01, 300), rng.normal(0.8, 0.02, 100)])
    wcss = [kmeans_1d(w, k)[1] for k in (1, 2, 3, 4)]
    assert all(a >= b for a, b in zip(wcss, wcss[1:]))  # WCSS never grows with K ...
    _, s = _chameleon_engine()
    assert s.choose_k(w)[0] == 2  # ... so the elbow picks the two real clusters
    _, s = _chameleon_engine(k_rule="min-wcss")
    assert s.choose_k(w)[0] == 4  # ... and the paper's literal rule always the largest K
    _, s = _chameleon_engine(k=3)
    k, cents = s.choose_k(w)
    assert k == 3 and len(cents) == 3


def test_quota_split_mm1_minimum_then_demand():
    """Tok_min = S*D*(1/SLO + lambda) per queue; the rest of the capacity by token demand."""
    q = ChameleonScheduler.split_quotas(np.array([100.0, 200.0]), np.array([1.0, 3.0]), 1000)
    assert q == pytest.approx([100 + 700 * 0.25, 200 + 700 * 0.75])
    q = ChameleonScheduler.split_quotas(np.array([600.0, 600.0]), np.array([1.0, 1.0]), 1000)
    assert q == pytest.approx([500, 500])  # over-subscribed minima scale down
    # the minimum itself: S = 600 tokens, D = 100 tokens * 0.05 s, SLO 2 s, lambda 3/s
    S, D, slo, lam = 600.0, 100 * 0.05, 2.0, 3.0
    assert S * D * (1 / slo + lam) == pytest.approx(10500.0)


def _two_queues(s, quotas, used):
    from collections import deque

    s.queues = [deque([1, 2]), deque([4])]
    s.tok = {1: 100, 2: 100, 4: 600}
    s.qof = {1: 0, 2: 0, 4: 1}
    s.quota, s.used = list(quotas), list(used) + [0]
    s.ad_users = [{}, {}, {}]
    s.n_queues = 2


def test_algorithm1_two_cases():
    """Algorithm 1, the two cases of Figure 10 (numbers ours). Small queue: two requests of
    100 tokens; large queue: one of 600 with 100 tokens already running there. Adapters are
    left out of the quota here (``adapter_charge="none"``; tests/policies/test_chameleon.py
    counts them).

    Case 1 -- quotas (300, 500): phase 1 admits both small requests (200 <= 300) and not the
    large one (100 + 600 > 500); the emptied small queue leaves 100: the large request waits.
    Case 2 -- quotas (400, 500): the emptied small queue leaves 200 < 600: the large request
    still waits (Algorithm 1 pools only emptied queues' quota); pooling every queue's spare
    (``leftover_from="all"``, the twin's earlier reading) gives 200 + 400 = 600 and admits it."""
    e, s = _chameleon_engine(adapter_charge="none")
    _two_queues(s, (300, 500), (0, 100))
    ctx = FakeCtx()
    s.schedule_waiting(ctx)
    assert ctx.admitted == [1, 2] and list(s.queues[1]) == [4] and s.used == [200, 100, 0]
    _two_queues(s, (400, 500), (0, 100))
    ctx = FakeCtx()
    s.schedule_waiting(ctx)
    assert ctx.admitted == [1, 2] and s.used == [200, 100, 0]
    e, s = _chameleon_engine(adapter_charge="none", leftover_from="all")
    _two_queues(s, (400, 500), (0, 100))
    ctx = FakeCtx()
    s.schedule_waiting(ctx)
    assert ctx.admitted == [1, 2, 4] and s.used == [200, 700, 0]


def test_bypass_only_when_wait_exceeds_run_time_and_squash_when_wrong():
    from collections import deque

    e, s = _chameleon_engine(adapter_charge="none", accuracy=1.0)
    mem = e.adapters
    mem.resident[1] = True  # request 1..3 use adapter 1 (resident); request 4 (adapter 2) does not fit
    s.queues = [deque([4, 1, 5])]
    s.tok = {1: 110, 4: 650, 5: 55}
    s.quota, s.used, s.qof = [10_000], [0, 0], {1: 0, 4: 0, 5: 0}
    s._t_step = 0.05  # request 1: 10 predicted tokens -> 0.5 s; request 5 (adapter 3) does not fit either
    s.predicted_wait = lambda head: 0.3  # shorter than request 1's run: no bypass
    ctx = FakeCtx(refuse={4: Admit.NO_SLOT, 5: Admit.NO_SLOT})
    s.schedule_waiting(ctx)
    assert ctx.admitted == [] and s.bypasses == 0
    s.predicted_wait = lambda head: 2.0  # longer: request 1 goes first
    ctx = FakeCtx(refuse={4: Admit.NO_SLOT, 5: Admit.NO_SLOT})
    s.schedule_waiting(ctx)
    assert ctx.admitted == [1] and s.bypasses == 1 and list(s.queues[0]) == [4, 5]
    assert e.next_event_time == pytest.approx(2.0)  # the squash check at the predicted wait
    # the prediction proves wrong: at that time the bypasser still runs and the head still waits;
    # the head's memory is still missing, so the bypasser runs on (§4.3 squashes only when it appears)
    squashed = []
    e.squash = squashed.append
    e.running[1] = None
    s.head_fits_without = lambda head, bypasser: False
    s._check_squash(1, 4)
    assert squashed == [] and s.squashes == 0 and s.pending_bypass == {1: 4}
    s.head_fits_without = lambda head, bypasser: True  # the head's memory appeared: squash
    s._check_squash(1, 4)
    assert squashed == [1] and s.squashes == 1
    del e.running[1]
    s.pending_bypass[1] = 4
    s._check_squash(1, 4)  # finished in time: nothing to do
    assert squashed == [1]


def test_chameleon_refresh_builds_queues_and_quotas():
    prof = constant_profile(c0=0.01, c_prefill=1e-5, c_decode=1e-4, kv_tokens=60_000)
    rng = np.random.default_rng(5)
    n = 400
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), rng.integers(10, 800, n),
                             np.where(rng.random(n) < 0.7, rng.integers(5, 30, n), rng.integers(300, 600, n)),
                             (ad := rng.integers(0, 8, n)), np.array([8, 16, 32, 64, 128])[ad % 5])
    res = simulate(w, prof, EngineConfig(max_loras=4, max_model_len=4096), policy="chameleon",
                   check_invariants=True)
    s = res.summary
    assert s["chameleon_refreshes"] >= 1 and 1 <= s["chameleon_queues"] <= 4
    assert len(s["chameleon_cutoffs"]) == s["chameleon_queues"] - 1
    # the summary rounds each quota to a token: their sum is the pool within half a token per queue
    assert sum(s["chameleon_quotas"]) == pytest.approx(res.engine.pool_blocks * res.engine.block_size,
                                                       abs=0.5 * len(s["chameleon_quotas"]))
    st = simulate(w, prof, EngineConfig(max_loras=4, max_model_len=4096), policy="chameleon-static").summary
    assert st["chameleon_queues"] == 4 and len(set(st["chameleon_quotas"])) == 1


# ---------------------------------------------------------------------- SJF, adapter-aware
def test_sjf_orders_by_predicted_output_and_aging_restores_fifo():
    """max_num_seqs=1: while r0 runs, r1 (100 tokens), r2 (5), r3 (50) queue up. SJF with a
    perfect predictor runs r2, r3, r1; with strong aging the waiting time dominates: FIFO."""
    prof = constant_profile(c0=0.01, kv_tokens=40_000)
    w = Workload.from_arrays([0.0, 0.01, 0.02, 0.03], [10] * 4, [20, 100, 5, 50])
    cfg = EngineConfig(max_loras=1, max_num_seqs=1, enable_lora=False, max_model_len=2048)
    order = lambda r: list(r.requests.sort_values("first_scheduled_s")["request_id"])  # noqa: E731
    assert order(simulate(w, prof, cfg, scheduler_obj=make_scheduler("sjf", aging=0.0),
                          cache_obj=LRUCache(), check_invariants=True)) == [0, 2, 3, 1]
    assert order(simulate(w, prof, cfg, scheduler_obj=make_scheduler("sjf", aging=1e6),
                          cache_obj=LRUCache())) == [0, 1, 2, 3]
    assert order(simulate(w, prof, cfg, policy="vllm")) == [0, 1, 2, 3]


def test_slora_sjf_prefetches_the_next_batch_in_sjf_order():
    """S-LoRA+SJF's queued-request prefetch names the adapters of the waiting requests with the
    smallest SJF keys whose prompts fill one batch (each adapter once), not the FIFO prefix; plain
    ``sjf`` prefetches nothing, and with ``slora_prefetch`` on the S-LoRA engine the preset copies
    adapters ahead (as ``slora`` does)."""
    from types import SimpleNamespace

    from policies.sjf import SJFScheduler, SLoRASJFScheduler
    from twin.interfaces import Policy

    assert type(SJFScheduler()).prefetch is Policy.prefetch  # plain SJF: no prefetch source
    s = make_scheduler("slora-sjf", max_lookahead=3)
    prompts = [300, 200, 600, 100, 400]
    s.engine = SimpleNamespace(config=SimpleNamespace(max_num_batched_tokens=700),
                               tokens_known=lambda rid: prompts[rid], adapter_a=[0, 1, 1, 2, 3])
    s.heap = [(50.0, 0), (10.0, 2), (30.0, 1), (5.0, 3), (70.0, 4)]
    heapq.heapify(s.heap)  # (the scheduler's queue is a heap)
    # SJF order 3, 2, 1 (keys 5, 10, 30): 100 + 600 tokens fill the 700-token batch after two requests
    assert list(s.prefetch(0.0)) == [2, 1]
    s.engine.config.max_num_batched_tokens = 10_000
    assert list(s.prefetch(0.0)) == [2, 1]  # three requests (max_lookahead), adapters 2, 1, 1
    assert isinstance(s, SLoRASJFScheduler) and s.get_params()["max_lookahead"] == 3
    from twin.scenario import RunConfig, build_engine_config, build_workload
    from twin.compare import load_compare_profile

    run = RunConfig(trace="synthetic", duration=30.0, rps=3.0, adapters=40, seed=0, slora_prefetch=True)
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    got = {p: simulate(w, prof, build_engine_config(run, w, prof), policy=p).summary for p in ("slora+sjf", "slora")}
    assert got["slora+sjf"]["scheduler"] == "slora-sjf"
    assert got["slora+sjf"].get("prefetches", 0) > 0 and got["slora"].get("prefetches", 0) > 0


def next_batch_by_sorting(heap, tokens, budget, cap):
    """S-LoRA+SJF's prefetch set as it was taken before: the smallest entries of the whole heap, in key
    order, until the budget runs out (at most ``cap``)."""
    out = []
    for _, rid in sorted(heap)[:cap]:
        budget -= tokens[rid]
        if budget < 0:
            break
        out.append(rid)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 400)), max_size=300), st.integers(0, 6000),
       st.one_of(st.none(), st.integers(0, 80)))
def test_slora_sjf_next_batch_reads_the_heap_in_order(entries, budget, cap):
    """The prefetch set read from the heap's root (a frontier) is the sorted prefix of the whole queue,
    ties of the key broken by rid, and it reads no more than its entries and their children."""
    from types import SimpleNamespace

    s = make_scheduler("slora-sjf", max_lookahead=cap, lookahead_tokens=budget or None)
    tokens = [t for _, t in entries]
    s.engine = SimpleNamespace(config=SimpleNamespace(max_num_batched_tokens=3000), tokens_known=tokens.__getitem__)
    heap: list = []
    for rid, (key, _) in enumerate(entries):
        heapq.heappush(heap, (float(key), rid))

    class CountedReads(list):
        reads = 0

        def __getitem__(self, i):
            CountedReads.reads += 1
            return list.__getitem__(self, i)

    s.heap = CountedReads(heap)
    got = list(s._next_batch())
    assert got == next_batch_by_sorting(heap, tokens, budget or 3000, cap)
    assert CountedReads.reads <= 1 + 2 * len(got)


def test_adapter_aware_prefers_resident_adapters():
    """r0 (adapter 0) runs; r1 (adapter 1, on disk) and then r2 (adapter 0, resident) wait.
    FCFS admits r1 first; adapter-aware admits r2 first (resident tier), unless r1 aged."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1, kv_tokens=40_000)
    w = Workload.from_arrays([0.0, 0.01, 0.02], [10] * 3, [20, 5, 5], [0, 1, 0], [8, 8, 8])
    cfg = EngineConfig(max_loras=2, max_num_seqs=1, max_model_len=2048)
    order = lambda r: list(r.requests.sort_values("first_scheduled_s")["request_id"])  # noqa: E731
    assert order(simulate(w, prof, cfg, policy="vllm")) == [0, 1, 2]
    aware = simulate(w, prof, cfg, scheduler_obj=AdapterAwareScheduler(lookahead=0), cache_obj=LRUCache(),
                     check_invariants=True)
    assert order(aware) == [0, 2, 1]
    aged = simulate(w, prof, cfg, scheduler_obj=AdapterAwareScheduler(lookahead=0, max_wait_s=0.05),
                    cache_obj=LRUCache())
    assert order(aged) == [0, 1, 2]
    # lookahead prefetch: r1's adapter is copied while r0 runs
    pre = simulate(w, prof, cfg, policy="adapter-aware", check_invariants=True)
    assert pre.summary["prefetches"] >= 1


def test_adapter_cap_per_batch():
    prof = constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.0, kv_tokens=40_000)
    w = Workload.from_arrays(np.zeros(6), [10] * 6, [5] * 6, [0, 1, 2, 3, 4, 5], [8] * 6)
    cfg = EngineConfig(max_loras=6, max_num_seqs=8, max_model_len=2048)
    res = simulate(w, prof, cfg, scheduler_obj=AdapterAwareScheduler(max_adapters=2, lookahead=0),
                   cache_obj=LRUCache(), check_invariants=True)
    assert res.steps["distinct_adapters"].max() == 2


# ---------------------------------------------------------------------- CLI on splitwise
@pytest.mark.data
@pytest.mark.parametrize("preset", REQUIRED_PRESETS + ["chameleon+prefetch", "vllm-partition", "adapter-aware"])
def test_every_preset_runs_on_splitwise_from_the_cli(preset, real_data, capsys, monkeypatch):
    from twin.cli import main

    monkeypatch.setenv("TWIN_DATA_DIR", str(real_data))
    rc = main(["run", "--trace", "splitwise", "--policy", preset, "--profile", "llama-2-7b_a40_vidur",
               "--adapters", "20", "--ranks", "8,16,32,64,128", "--popularity", "powerlaw", "--rps", "1",
               "--duration", "20", "--no-progress", "--json"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f'"policy": "{preset}"' in out


def test_unknown_interfaces_raise_helpfully():
    class Bad(AdapterCachePolicy):
        pass

    with pytest.raises(ValueError, match=r"needs a class attribute `name` \(a non-empty string\)"):
        registry.register_cache(Bad)


def test_get_params_rebuilds_every_policy():
    """scikit-learn's convention: constructor arguments are stored under their own names,
    ``get_params`` returns them and ``type(p)(**p.get_params())`` rebuilds an equal policy."""
    from twin.registry import CACHES, SCHEDULERS, make_cache, make_scheduler

    for reg, make in ((SCHEDULERS, make_scheduler), (CACHES, make_cache)):
        for name in reg:
            p = make(name)
            params = p.get_params()
            q = type(p)(**params)
            assert q.get_params() == params, name
            assert type(q) is type(p)


def test_memory_options_are_constructor_arguments():
    """The registry passes the engine-memory options to the cache's constructor (no setattr)."""
    from twin.registry import make_cache

    c = make_cache("lru", adapter_memory="region", adapter_placement="paged", lora_share=0.3)
    assert (c.adapter_memory, c.adapter_placement, c.lora_share) == ("region", "paged", 0.3)
    assert c.get_params()["adapter_memory"] == "region"
    f = make_cache("fastlibra")
    assert f.adapter_memory == "unified" and f.prefix_kv is True and f.history_to_host is True
    assert make_cache("fastlibra", busy=0.9).get_params()["busy"] == 0.9


# -- plug-ins validated at registration and at engine start; hook failures named ----------------

def _tiny_run(scheduler=None, cache=None, **kw):
    from policies.fcfs import FCFSScheduler
    from twin.config import EngineConfig
    from twin.simulate import simulate

    rng = np.random.default_rng(0)
    n = 30
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.2, n)), rng.integers(10, 200, n), rng.integers(5, 40, n),
                             rng.integers(0, 6, n), np.full(n, 8))
    return simulate(w, None, EngineConfig(max_loras=2, kv_capacity_tokens=4000, max_model_len=2048),
                    scheduler_obj=scheduler or FCFSScheduler(), cache_obj=cache or LRUCache(), **kw)


def test_malformed_plugins_are_refused_at_registration():
    from twin.interfaces import PolicyError

    class NoHook(Scheduler):
        name = "t-nohook"
    with pytest.raises(PolicyError, match=r"required hook schedule_waiting\(ctx\)"):
        registry.register_scheduler(NoHook)

    class NoPreempt(Scheduler):
        name = "t-nopreempt"

        def schedule_waiting(self, ctx):
            return None
    with pytest.raises(PolicyError, match=r"required hook on_preempt\(rid\)"):
        registry.register_scheduler(NoPreempt)

    class NoVictim(AdapterCachePolicy):
        name = "t-novictim"
    with pytest.raises(PolicyError, match=r"required hook victim\(now\)"):
        registry.register_cache(NoVictim)

    class WrongSig(LRUCache):
        name = "t-wrongsig"

        def victim(self):
            return 0
    with pytest.raises(PolicyError, match=r"hook victim\(self\) cannot be called as victim\(self, now\)"):
        registry.register_cache(WrongSig)

    class NotAMethod(LRUCache):
        name = "t-notmethod"
        on_idle = 3
    with pytest.raises(PolicyError, match="hook on_idle is 3, not a method"):
        registry.register_cache(NotAMethod)

    class Spaced(LRUCache):
        name = "my cache"
    with pytest.raises(PolicyError, match="spaces"):
        registry.register_cache(Spaced)

    class Clash(LRUCache):
        name = "fcfs"  # a cache may share a scheduler's name, not another cache's
    registry.register_cache(Clash)
    registry.CACHES.pop("fcfs")

    class Taken(LRUCache):
        name = "lru"
    with pytest.raises(PolicyError, match=r"'lru' .*already registered by policies.lru.LRUCache \(built in\)"):
        registry.register_cache(Taken)
    assert registry.CACHES["lru"] is LRUCache

    with pytest.raises(PolicyError, match="is not a scheduler .*it is a cache"):
        registry.register_scheduler(LRUCache)
    with pytest.raises(PolicyError, match="preset name 'my preset'"):
        registry.register_preset(Preset("my preset", "fcfs", "lru"))
    with pytest.raises(PolicyError, match="already registered"):
        registry.register_preset(Preset("vllm", "sjf", "lru"))
    assert not {"t-nohook", "t-nopreempt"} & set(registry.SCHEDULERS)
    assert not {"t-novictim", "t-wrongsig", "t-notmethod", "my cache"} & set(registry.CACHES)


def test_malformed_entry_point_is_refused_with_a_warning(monkeypatch):
    class BadEP(Scheduler):
        name = "ep-bad"

    class EP:
        name = "bad"

        def load(self):
            return BadEP

    monkeypatch.setattr(registry.metadata, "entry_points", lambda group=None: [EP()])
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    with pytest.warns(UserWarning, match=r"'bad' .*refused: .*required hook schedule_waiting"):
        registry.load_entry_points()
    assert "ep-bad" not in registry.SCHEDULERS


def test_policy_objects_are_checked_before_the_run():
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    with pytest.raises(PolicyError, match=r"got the class FCFSScheduler, not an instance; pass FCFSScheduler\(\)"):
        _tiny_run(scheduler=FCFSScheduler)
    with pytest.raises(PolicyError, match="got the string 'fcfs'.*scheduler='fcfs'"):
        _tiny_run(scheduler="fcfs")
    with pytest.raises(PolicyError, match="cache_obj: got a scheduler"):
        _tiny_run(cache=FCFSScheduler())

    class Unregistered(FCFSScheduler):  # never registered: checked when the engine starts
        name = "t-unreg"

        def on_finish(self):
            pass
    with pytest.raises(PolicyError, match=r"hook on_finish\(self\) cannot be called as on_finish\(self, rid\)"):
        _tiny_run(scheduler=Unregistered())

    class BadTick(FCFSScheduler):
        name = "t-badtick"
        tick_interval = 0.0
    with pytest.raises(PolicyError, match="tick_interval is 0.0"):
        _tiny_run(scheduler=BadTick())


def test_scheduler_offering_a_request_that_is_not_waiting_is_named():
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Twice(FCFSScheduler):
        name = "t-twice"

        def schedule_waiting(self, ctx):
            w = self.engine.waiting_ids()
            if len(w):
                ctx.try_admit(int(w[0]))
                return ctx.try_admit(int(w[0]))
            return None

    class Future(FCFSScheduler):
        name = "t-future"

        def schedule_waiting(self, ctx):
            return ctx.try_admit(self.engine.n - 1)

    class Floaty(FCFSScheduler):
        name = "t-float"

        def schedule_waiting(self, ctx):
            return ctx.try_admit(float(self.engine.waiting_ids()[0]))

    for cls, why in ((Twice, "running"), (Future, "not arrived yet"), (Floaty, "a float, not a request index")):
        with pytest.raises(PolicyError, match=rf"scheduler '{cls.name}' .*offered request .* but it is {why}"):
            _tiny_run(scheduler=cls())
    for cls, why in ((Twice, "running"), (Future, "not arrived yet")):  # the S-LoRA engine checks them too
        with pytest.raises(PolicyError, match=rf"scheduler '{cls.name}' .*offered request .* but it is {why}"):
            _tiny_run(scheduler=cls(), system="slora")


def test_scheduler_offering_through_a_kept_step_context_is_named():
    """A context kept after schedule_waiting and used from another hook (nothing is being planned then)
    admitted into whatever step came next (vLLM) or crashed on a None context; S-LoRA's context of an
    earlier call admitted against that call's stale budget and batch."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Keeper(FCFSScheduler):
        name = "t-keeper"
        kept = None

        def schedule_waiting(self, ctx):
            self.kept = ctx
            return super().schedule_waiting(ctx)

        def on_finish(self, rid):
            w = self.engine.waiting_ids()
            if self.kept is not None and len(w):
                self.kept.try_admit(int(w[0]))

    class Stale(FCFSScheduler):
        name = "t-stale"
        kept = None

        def schedule_waiting(self, ctx):
            old, self.kept = self.kept, ctx
            w = self.engine.waiting_ids()
            if old is not None and len(w):
                return old.try_admit(int(w[0]))
            return super().schedule_waiting(ctx)

    for system in ("vllm", "slora"):
        with pytest.raises(PolicyError, match=r"scheduler 't-keeper' .*called ctx.try_admit\(\d+\) outside "
                                              r"schedule_waiting"):
            _tiny_run(scheduler=Keeper(), system=system)
    with pytest.raises(PolicyError, match=r"scheduler 't-stale' .*offered request \d+ through the step context of an "
                                          r"earlier schedule_waiting call"):
        _tiny_run(scheduler=Stale(), system="slora")
    # the same hooks offering only inside the call, through its own context, run as FCFS does
    ref = _tiny_run()

    class Polite(FCFSScheduler):
        name = "t-polite"

        def schedule_waiting(self, ctx):
            return super().schedule_waiting(ctx)
    got = _tiny_run(scheduler=Polite())
    assert got.requests.equals(ref.requests)


def test_cache_victim_that_is_not_evictable_is_named():
    from twin.interfaces import PolicyError

    for ret, why in ((None, "a NoneType"), (999, "not an adapter index"), (-1, "not an adapter index"),
                     ("busy", "in use")):
        class Bad(LRUCache):
            name = "t-badvictim"

            def victim(self, now, ret=ret):
                return next(iter(self.engine.adapters.batch)) if ret == "busy" else ret
        with pytest.raises(PolicyError, match=rf"cache policy 't-badvictim' .*chose adapter .* {why}"):
            _tiny_run(cache=Bad())


def test_hook_that_raises_is_named_with_its_policy():
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Boom(LRUCache):
        name = "t-boom"

        def victim(self, now):
            raise ZeroDivisionError("boom")

    class Arr(FCFSScheduler):
        name = "t-arr"

        def on_arrivals(self, lo, hi):
            raise KeyError("x")

    with pytest.raises(PolicyError, match="cache policy 't-boom' .*failed in its hook victim .*ZeroDivisionError: boom") as e:
        _tiny_run(cache=Boom())
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    with pytest.raises(PolicyError, match="scheduler 't-arr' .*failed in its hook on_arrivals"):
        _tiny_run(scheduler=Arr(), stop_when=lambda eng: False)


@pytest.mark.parametrize("preset, message", [
    (Preset("odd-sched", 5, "lru"), "scheduler 5 is not a scheduler name"),
    (Preset("odd-opts", "fcfs", "lru", cache_opts=[1]), r"cache_opts \[1\] is not a dict"),
    (Preset("odd-desc", "fcfs", "lru", description=5), "description 5 is not a string"),
])
def test_register_preset_checks_its_fields(preset, message):
    with pytest.raises(registry.PolicyError, match=message):
        registry.register_preset(preset)
    assert preset.name not in PRESETS


def test_an_option_a_policy_does_not_take_names_the_policy():
    """Was Python's bare ``Scheduler.__init__() got an unexpected keyword argument 'bogus'``."""
    with pytest.raises(registry.PolicyError, match="scheduler 'fcfs' takes no option"):
        make_scheduler("fcfs", bogus=1)
    with pytest.raises(registry.PolicyError, match="adapter-cache policy 'lru'.*bogus"):
        make_cache("lru", bogus=1)


@pytest.mark.parametrize("kind, name, opts, message", [
    ("scheduler", "fcfs+client-cap", {"client_cap": -1}, "option client_cap = -1: give a number >= 0"),  # dropped all
    ("scheduler", "adapter-aware", {"max_wait_s": float("nan")}, "option max_wait_s = nan"),
    ("scheduler", "adapter-aware", {"lookahead": -3}, "option lookahead = -3"),
    ("scheduler", "sjf", {"aging": "x"}, "option aging = 'x'"),                     # failed mid-run
    ("scheduler", "slora", {"lookahead_tokens": -5}, "option lookahead_tokens = -5"),
    ("scheduler", "chameleon", {"slo_s": -1}, "option slo_s = -1"),
    ("cache", "ema-prefetch", {"top_k": -2}, "option top_k = -2: give a number >= 0 and finite (default None: derived)"),
    ("cache", "ema-prefetch", {"min_rate": -1}, "option min_rate = -1"),
    ("cache", "fastlibra", {"busy": 2}, "option busy = 2: give a number >= 0 and <= 1"),
    ("cache", "chameleon", {"F": float("nan")}, "option F = nan"),
    ("cache", "chameleon+prefetch", {"head_pct": 200}, "option head_pct = 200: give a number >= 0 and <= 100"),
])
def test_a_built_in_policy_s_options_are_checked_before_any_work(kind, name, opts, message):
    """Negative counts, NaN times and shares above 1 were accepted (client_cap=-1 left every request unfinished);
    the engine checks a built-in policy's numeric options before any work."""
    from traces.workload import Workload
    from twin.interfaces import PolicyError
    from twin.simulate import simulate

    w = Workload.from_arrays(np.arange(10.0), [100] * 10, [20] * 10, adapter_id=np.arange(10) % 3,
                             adapter_rank=[8] * 10)
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")):
        # (an option of the wrong kind is refused as the registry builds the policy; a value out of range as the
        # engine checks the policy)
        sched = make_scheduler(name, **opts) if kind == "scheduler" else make_scheduler("fcfs")
        cache = make_cache(name, **opts) if kind == "cache" else make_cache("lru")
        simulate(w, scheduler_obj=sched, cache_obj=cache)


@pytest.mark.parametrize("ret", [None, "1", float("nan")])
def test_next_change_time_that_is_not_a_time_is_named(ret):
    """None and text failed as a bare TypeError inside the engine; NaN ran on and changed the results."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Bad(FCFSScheduler):
        name = "t-nct"

        def next_change_time(self, stop, ret=ret):
            return ret
    with pytest.raises(PolicyError, match=r"scheduler 't-nct' .*next_change_time returned"):
        _tiny_run(scheduler=Bad())


def test_next_change_time_too_early_only_splits_runs():
    """A time in the past is safe (the docstring's promise): the same requests table as the built-in."""
    from policies.fcfs import FCFSScheduler

    class Early(FCFSScheduler):
        name = "t-early"

        def next_change_time(self, stop):
            return -5.0
    a, b = _tiny_run(scheduler=Early()), _tiny_run()
    pd_cols = ["first_token_s", "finish_s"]
    assert a.requests[pd_cols].equals(b.requests[pd_cols]) and a.summary["engine_steps"] == b.summary["engine_steps"]


@pytest.mark.parametrize("ret, named", [
    (None, "prefetch returned None"), ("0", "prefetch returned '0'"), (5, "prefetch returned 5"),
    ([0, 999], "prefetch returned adapter 999"), ([1.5], "prefetch returned adapter 1.5"),
    ([True], "prefetch returned adapter True")])
def test_prefetch_that_names_no_adapter_is_named(ret, named):
    """None, text and ints failed as bare TypeErrors, an id past the last adapter as an IndexError."""
    from twin.interfaces import PolicyError

    class Bad(LRUCache):
        name = "t-prefetch"

        def prefetch(self, now, ret=ret):
            return ret
    with pytest.raises(PolicyError, match=rf"cache policy 't-prefetch' .*{named}"):
        _tiny_run(cache=Bad())


def test_prefetch_that_never_ends_is_named():
    """An endless generator filled the memory until the process was killed: it is cut and named."""
    import itertools

    from twin.interfaces import PolicyError

    class Endless(LRUCache):
        name = "t-prefetch-endless"

        def prefetch(self, now):
            return itertools.repeat(0)
    with pytest.raises(PolicyError, match=r"prefetch returned more than \d+ adapter ids .*endless generator"):
        _tiny_run(cache=Endless())


def test_prefetch_of_valid_ids_runs_and_skips_negative_ids():
    class Good(LRUCache):
        name = "t-prefetch-ok"

        def prefetch(self, now):
            return (a for a in (-1, 0, 1))  # a generator; -1 (the base model) is skipped
    r = _tiny_run(cache=Good())
    assert r.summary["prefetches"] >= 1 and r.summary["requests_finished"] == 30


@pytest.mark.parametrize("attr, value, message", [
    ("max_inflight", 0, "max_inflight = 0; give the asynchronous prefetches in flight at most, an integer >= 1"),
    ("max_inflight", 2.5, "max_inflight = 2.5"),
    ("prefetch_sync", "yes", "prefetch_sync = 'yes'; give True or False"),
    ("lora_share", 1.5, "lora_share = 1.5; give the share of the pool"),
    ("lora_share", float("nan"), "lora_share = nan"),
    ("adapter_memory", "unifed", "adapter_memory = 'unifed'; give one of 'slots', 'region', 'unified' or None"),
    ("adapter_placement", "pages", "adapter_placement = 'pages'"),
    ("lora_compute", "pagd", "lora_compute = 'pagd'; give one of 'profile', 'paged' or None"),
    ("kv_block_size", 0.5, "kv_block_size = 0.5; give tokens per KV block, an integer >= 1"),
    ("kv_block_size", 0, "kv_block_size = 0"),
    ("host_kv_tokens", -1, "host_kv_tokens = -1"),
    ("prefix_kv", "on", "prefix_kv = 'on'"),
    ("async_swap_in", None, "async_swap_in = None"),
])
def test_cache_capabilities_are_checked_before_any_work(attr, value, message):
    """A misspelt adapter_memory or lora_compute ran vLLM's slots or the profile's LoRA cost silently;
    lora_share 1.5 sized the KV cache negative; max_inflight 0 never prefetched."""
    from twin.interfaces import PolicyError

    cache = LRUCache()
    setattr(cache, attr, value)
    with pytest.raises(PolicyError, match=r"cache policy 'lru' .*" + message.replace("(", r"\(").replace(")", r"\)")):
        _tiny_run(cache=cache)


def test_scheduler_capabilities_are_checked_too():
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    s = FCFSScheduler()
    s.uses_events = 1
    with pytest.raises(PolicyError, match="scheduler 'fcfs' .*uses_events = 1; give True or False"):
        _tiny_run(scheduler=s)


def test_slora_next_batch_stops_before_the_first_request_that_does_not_fit():
    """S-LoRA's ``next_batch()`` (slora.md: "the FIFO prefix of waiting requests whose prompts fit in
    batch_max_tokens"): with 100 tokens and prompts of 60, only the first; the twin took the second as
    well (it counted a request after naming it) and capped the set at 32 requests, which S-LoRA does not."""
    from types import SimpleNamespace

    from policies.sjf import SLoRASJFScheduler
    from policies.slora import SLoRAScheduler

    prompts = [60, 60, 60, 30]
    eng = SimpleNamespace(config=SimpleNamespace(max_num_batched_tokens=100), tokens_known=lambda rid: prompts[rid],
                          prompt_a=prompts, arr_ptr=4)
    s = SLoRAScheduler()
    s.engine, s.front, s.valid_list, s.admitted, s.gptr = eng, [], [0, 1, 2, 3], [False] * 4, 0
    assert list(s._next_batch()) == [0]
    eng.config.max_num_batched_tokens = 120  # exactly two prompts fit
    assert list(s._next_batch()) == [0, 1]
    s.front = [2]  # a preempted request is first in line
    assert list(s._next_batch()) == [2, 0]
    eng.config.max_num_batched_tokens = 10_000
    s.front, s.valid_list, s.admitted = [], list(range(4)), [False] * 4
    assert list(s._next_batch()) == [0, 1, 2, 3]
    s.max_lookahead = 2
    assert list(s._next_batch()) == [0, 1]
    j = SLoRASJFScheduler()
    j.engine = eng
    eng.config.max_num_batched_tokens = 100
    j.heap = [(float(k), rid) for k, rid in ((3, 0), (1, 1), (2, 2), (4, 3))]
    heapq.heapify(j.heap)  # (the scheduler's queue is a heap)
    assert list(j._next_batch()) == [1]
    eng.config.max_num_batched_tokens = 10_000
    j.heap = [(float(k), k) for k in range(100)]  # more than the first widening (32) of the SJF order
    eng.tokens_known = lambda rid: 1
    assert list(j._next_batch()) == list(range(100))


@pytest.mark.parametrize("ret", ["OK", float("nan"), [1, 2], 99])
def test_schedule_waiting_that_returns_no_admit_outcome_is_named(ret):
    """Taken silently before (it only reached next_change_time)."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Bad(FCFSScheduler):
        name = "t-sw"

        def schedule_waiting(self, ctx, ret=ret):
            super().schedule_waiting(ctx)
            return ret
    with pytest.raises(PolicyError, match=r"scheduler 't-sw' .*schedule_waiting returned"):
        _tiny_run(scheduler=Bad())


def test_schedule_waiting_may_return_an_admit_value_as_an_int():
    from policies.fcfs import FCFSScheduler

    class IntStop(FCFSScheduler):
        name = "t-sw-int"

        def schedule_waiting(self, ctx):
            stop = super().schedule_waiting(ctx)
            return None if stop is None else int(stop)
    a, b = _tiny_run(scheduler=IntStop()), _tiny_run()
    assert a.requests["finish_s"].equals(b.requests["finish_s"])


@pytest.mark.parametrize("system", ["vllm", "slora"])
def test_evict_when_idle_that_is_no_flag_is_named(system):
    """"no" is truthy: every idle adapter was discarded (evictions equal to loads), silently."""
    from twin.interfaces import PolicyError

    class Bad(LRUCache):
        name = "t-ewi"

        def evict_when_idle(self, a):
            return "no"
    kw = {"system": system} if system == "slora" else {}
    with pytest.raises(PolicyError, match=r"cache policy 't-ewi' .*evict_when_idle\(\d+\) returned 'no'"):
        _tiny_run(cache=Bad(), **kw)


def test_a_plug_in_s_stats_reach_the_summary_and_must_be_a_dict():
    """A plain cache's counters were dropped (the summary took stats() only with extensions); a list failed
    as a bare ValueError after the run."""
    from twin.interfaces import PolicyError

    class Counting(LRUCache):
        name = "t-stats"

        def __init__(self, **memory):
            super().__init__(**memory)
            self.victims = 0

        def victim(self, now):
            self.victims += 1
            return super().victim(now)

        def stats(self):
            return {"t_stats_victims": self.victims}
    r = _tiny_run(cache=Counting())
    assert 0 < r.summary["t_stats_victims"] <= r.summary["adapter_evictions"]

    class Bad(LRUCache):
        name = "t-stats-bad"

        def stats(self):
            return [("a", 1, 2)]
    with pytest.raises(PolicyError, match=r"cache policy 't-stats-bad' .*stats\(\) returned \[\('a', 1, 2\)\]"):
        _tiny_run(cache=Bad())

    class SetStats(LRUCache):
        name = "t-stats-set"

        def stats(self):
            return {"t_stats_set": {1, 2}}  # (written to summary.json as the text "{1, 2}")
    with pytest.raises(PolicyError, match=r"stats\(\) entry 't_stats_set' = \{1, 2\} is not a number"):
        _tiny_run(cache=SetStats())


def test_a_tick_finer_than_a_millisecond_is_refused():
    """1e-7 s passed the check and hung the run."""
    from twin.interfaces import PolicyError

    class Fine(LRUCache):
        name = "t-tick"

        @property
        def tick_interval(self):
            return 1e-7
    with pytest.raises(PolicyError, match=r"tick_interval is 1e-07; give seconds between on_tick calls, >= 0.001"):
        _tiny_run(cache=Fine())


def test_an_event_at_nan_is_named_with_the_policy_that_pushed_it():
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Nan(FCFSScheduler):
        name = "t-nan-event"
        uses_events = True

        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            self.engine.push_event(float("nan"), None)
    with pytest.raises(PolicyError, match=r"scheduler 't-nan-event' .*on_arrivals.*push_event\(nan\)"):
        _tiny_run(scheduler=Nan())


def test_a_constructor_argument_stored_under_another_name_is_refused_before_the_run():
    """`twin run` failed with a bare AttributeError from get_params(); simulate() ran and a rebuilt policy
    (the battery, a sweep's worker) lost the option."""
    from twin.interfaces import PolicyError

    class NotStored(LRUCache):
        name = "t-notstored"

        def __init__(self, weight: float = 1.0, **memory):
            super().__init__(**memory)
            self.w = weight
    with pytest.raises(PolicyError, match=r"constructor argument\(s\) weight are not stored under their own names; "
                                          r"store each as self.<name> \(e.g. self.weight = weight\)"):
        _tiny_run(cache=NotStored())


def test_the_workload_columns_a_policy_sees_are_read_only():
    """`engine.adapter[lo:hi] = 0` sent every request to adapter 0 and ran on silently; the caller's
    own arrays keep their flags."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Writes(FCFSScheduler):
        name = "t-writes"

        def on_arrivals(self, lo, hi):
            self.engine.adapter[lo:hi] = 0
    with pytest.raises(PolicyError, match=r"scheduler 't-writes' .*on_arrivals.*read-only"):
        _tiny_run(scheduler=Writes())
    ranks = np.full(4, 8)
    w = Workload.from_arrays(np.arange(4.0), np.full(4, 10), np.full(4, 5), np.zeros(4, int), ranks)
    e = Engine(w, constant_profile(), EngineConfig(max_loras=2), make_scheduler("fcfs"), make_cache("lru"))
    for col in ("arrival", "prompt", "output", "adapter", "rank", "adapter_rank", "adapter_ids", "request_id"):
        assert not getattr(e, col).flags.writeable, col
    assert ranks.flags.writeable


def test_requests_a_scheduler_stops_offering_are_named_in_a_note():
    """A scheduler that loses requests (an on_preempt or on_arrivals that does not queue them) left them
    unfinished in a run without a horizon, silently."""
    from twin.simulate import NothingAdmittedWarning

    class Loses(ListQueueScheduler):
        name = "t-loses"

        def on_arrivals(self, lo, hi):  # loses every third arrival
            self.queue += [r for r in range(lo, hi) if self.engine.reject_reason[r] == 0 and r % 3]
    with pytest.warns(NothingAdmittedWarning, match=r"10 request\(s\) never finished although the run had no "
                                                    r"horizon.*scheduler 't-loses'"):
        r = _tiny_run(scheduler=Loses())
    assert r.summary["requests_unfinished"] == 10 and "never finished" in r.summary["note"]
    assert "note" not in _tiny_run().summary and "note" not in _tiny_run(horizon_s=1.0).summary
    capped = _tiny_run(scheduler=make_scheduler("fcfs+client-cap", client_cap=2))  # drops arrivals on purpose
    assert capped.summary["requests_unfinished"] > 0 and "note" not in capped.summary


def test_options_given_with_an_instance_are_refused_and_preset_options_are_copied():
    from policies.fcfs import FCFSScheduler

    with pytest.raises(ValueError, match=r"scheduler_opts \{'aging': 5\} with scheduler_obj"):
        _tiny_run(scheduler=FCFSScheduler(), scheduler_opts={"aging": 5})  # (silently dropped)

    class Keeps(LRUCache):
        name = "t-keeps"

        def __init__(self, seen: list | None = None, **memory):
            super().__init__(**memory)
            self.seen = seen

        def on_load(self, a, now):
            self.seen.append(a)
    registry.register_cache(Keeps)
    registry.register_preset(Preset("t-keeps-p", "fcfs", "t-keeps", cache_opts={"seen": []}))
    try:
        first = len(registry.resolve_policy("t-keeps-p")[1].seen)
        s, c, _ = registry.resolve_policy("t-keeps-p")
        c.seen.append(1)  # a policy changing the list it was given leaves the preset's alone
        assert registry.PRESETS["t-keeps-p"].cache_opts["seen"] == [] and first == 0
    finally:
        registry.CACHES.pop("t-keeps", None)
        registry.PRESETS.pop("t-keeps-p", None)


@pytest.mark.parametrize("system", ["vllm", "slora"])
def test_a_lora_share_without_an_adapter_region_is_refused(system):
    """lora_share sizes the 'region' adapter memory; with vLLM's slots (or S-LoRA's pool) it was recorded and
    silently not read."""
    cache = LRUCache(lora_share=0.5)
    kw = {"system": system} if system == "slora" else {}
    with pytest.raises(ValueError, match="lora_share 0.5 sizes"):
        _tiny_run(cache=cache, **kw)
    if system == "vllm":
        r = _tiny_run(cache=LRUCache(lora_share=0.2, adapter_memory="region"))
        assert r.summary["requests_finished"] == 30


def test_a_callback_that_keeps_pushing_events_at_the_same_time_is_stopped():
    """It looped for ever (the clock never moved)."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Loop(FCFSScheduler):
        name = "t-event-loop"
        uses_events = True

        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            self.engine.push_event(self.engine.now, self.again)

        def again(self, now):
            self.engine.push_event(now, self.again)
    with pytest.raises(PolicyError, match=r"timed events fired at t = .* a callback keeps pushing events"):
        _tiny_run(scheduler=Loop())


def test_a_timed_event_callback_that_raises_is_named():
    """A lambda (no policy frame in the traceback) raised a bare exception out of the run; a policy's own
    method pushed as the callback names the policy and the method, as its other hooks do."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class Lam(FCFSScheduler):
        name = "t-event-lambda"
        uses_events = True

        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            self.engine.push_event(self.engine.now + 0.5, lambda now: {}["missing"])

    class Meth(Lam):
        name = "t-event-method"

        def on_arrivals(self, lo, hi):
            FCFSScheduler.on_arrivals(self, lo, hi)
            self.engine.push_event(self.engine.now + 0.5, self.fire)

        def fire(self, now):
            raise ZeroDivisionError("tick")

    for system in ("vllm", "slora"):
        with pytest.raises(PolicyError, match=r"the timed-event callback .*Lam\.on_arrivals\.<locals>\.<lambda> "
                                              r"\(test_policies\.py:\d+\) \(engine\.push_event\) raised at t = .* s: "
                                              r"KeyError: 'missing'") as e:
            _tiny_run(scheduler=Lam(), system=system)
        assert isinstance(e.value.__cause__, KeyError)
        with pytest.raises(PolicyError, match=r"scheduler 't-event-method' .*failed in its hook fire .*"
                                              r"ZeroDivisionError: tick"):
            _tiny_run(scheduler=Meth(), system=system)


@pytest.mark.parametrize("system", ["vllm", "slora"])
def test_each_policy_ticks_at_its_own_interval(system):
    """A scheduler and a cache policy that both tick: each on_tick comes every its own tick_interval (both
    came at the shorter one: chameleon+prefetch's 300 s quota refresh ran every second, its cache's interval)."""
    from policies.fcfs import FCFSScheduler

    calls = {"sched": [], "cache": []}

    class SlowTick(FCFSScheduler):
        name = "t-slow-tick"
        tick_interval = 2.0

        def on_tick(self, now):
            calls["sched"].append(now)

    class FastTick(LRUCache):
        name = "t-fast-tick"
        tick_interval = 0.5

        def on_tick(self, now):
            calls["cache"].append(now)

    res = _tiny_run(scheduler=SlowTick(), cache=FastTick(), system=system)
    end = res.summary["simulated_s"]
    s, c = np.array(calls["sched"]), np.array(calls["cache"])
    assert len(c) >= 8 and len(s) >= 2, (len(s), len(c), end)
    # each on its own grid k * interval: a tick at the first step boundary at or after its due time (within one
    # step, shorter than 0.5 s here), the next due time the grid's (a tick late by a step does not delay the next)
    for ticks, interval in ((s, 2.0), (c, 0.5)):
        k = 0
        for t in ticks:
            due = (k + 1) * interval
            assert due - 1e-9 <= t < due + 0.5, (t, due)
            k = int(math.floor(t / interval + 1e-9))
    assert len(c) > 3 * len(s)


@pytest.mark.parametrize("kind, name", [("cache", "lru"), ("cache", "ema-prefetch"), ("scheduler", "fcfs")])
def test_a_policy_instance_serves_one_run(kind, name):
    """A second run with the same instance is refused before it starts (an LRU cache reused named a victim the new
    engine never loaded; a prefetching cache silently changed the run): a fresh instance runs as the first did."""
    from tests.helpers import random_workload

    make = make_cache if kind == "cache" else make_scheduler
    w = random_workload(60, seed=3)
    p = make(name)
    first = simulate(w, **{f"{kind}_obj": p}).summary
    with pytest.raises(PolicyError, match="was bound to an earlier run's engine.*pass a new one to each run"):
        simulate(w, **{f"{kind}_obj": p})
    again = simulate(w, **{f"{kind}_obj": make(name)}).summary
    timing = ("wall_s", "x_realtime")  # (the host's)
    assert {k: v for k, v in again.items() if k not in timing} == {k: v for k, v in first.items() if k not in timing}
