"""The adapter-aware scheduler's incremental admission order (``policies/adapter_aware.py``) equals the
sort of every adapter group it replaced: at every plan (the walk against a full sort of the groups
by ``(-1 if aged else tier, head)``, the next aging time against a scan), and in whole runs (request
tables identical to the sorting scheduler's), with tiers moving under it (few GPU and CPU slots,
prefetches, the base model, the adapter cap, a unified adapter/KV pool)."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pandas as pd
import pytest

from policies.adapter_aware import AdapterAwareScheduler
from policies.lru import LRUCache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.interfaces import Admit
from twin.simulate import simulate

INF = math.inf


class SortingAdapterAware(AdapterAwareScheduler):
    """The scheduler as it was before the incremental order: every plan sorts every group with
    waiting requests (the reference)."""

    def bind(self, engine) -> None:
        super().bind(engine)
        engine.adapters.tier_changes = None  # (nothing reads them here)
        self.ref_q = [deque() for _ in range(engine.n_adapters + 1)]
        self.nonempty: set[int] = set()

    def _grp(self, rid: int) -> int:
        a = self.engine.adapter_a[rid]
        return a if a >= 0 else self.base

    def on_arrivals(self, lo: int, hi: int) -> None:
        for rid in range(lo, hi):
            if self.ok[rid]:
                self.ref_q[self._grp(rid)].append(rid)
                self.nonempty.add(self._grp(rid))

    def on_preempt(self, rid: int) -> None:
        self.ref_q[self._grp(rid)].appendleft(rid)
        self.nonempty.add(self._grp(rid))

    def order(self) -> list[int]:
        return sorted_order(self, self.ref_q, self.nonempty)

    def schedule_waiting(self, ctx) -> Admit | None:
        mem = self.engine.adapters
        for g in self.order():
            q = self.ref_q[g]
            if g != self.base and not mem.active[g] and mem.n_active >= self.cap:
                continue
            while q:
                r = ctx.try_admit(q[0])
                if r == Admit.OK:
                    q.popleft()
                    continue
                if r == Admit.NO_SLOT:
                    break
                self.nonempty = {g for g in self.nonempty if self.ref_q[g]}
                return r
        self.nonempty = {g for g in self.nonempty if self.ref_q[g]}
        return None

    def prefetch(self, now: float):
        n = 0
        for g in self.order():
            if n >= self.lookahead:
                return
            n += len(self.ref_q[g])
            if g != self.base:
                yield g

    def next_change_time(self, stop: Admit | None) -> float:
        if stop == Admit.NO_SEQ:  # (no admission before a finish; the aging still reorders prefetch's walk)
            return next_age(self, self.ref_q)
        return min(self.engine.next_arrival_time(), next_age(self, self.ref_q))


def sorted_order(s: AdapterAwareScheduler, q: list[deque], groups) -> list[int]:
    e = s.engine
    keys = []
    for g in groups:
        if q[g]:
            head = q[g][0]
            aged = e.now - e.arrival_a[head] >= s.max_wait_s
            keys.append(((-1 if aged else s.tier(g)), head, g))
    return [g for _, _, g in sorted(keys)]


def next_age(s: AdapterAwareScheduler, q: list[deque]) -> float:
    arr, now, w = s.engine.arrival_a, s.engine.now, s.max_wait_s
    return min((arr[qg[0]] + w for qg in q if qg and arr[qg[0]] + w > now), default=INF)


class CheckedAdapterAware(AdapterAwareScheduler):
    """The incremental scheduler, checked against the full sort at every plan, prefetch and
    next-change query; counts the plans checked."""

    plans = 0

    def schedule_waiting(self, ctx) -> Admit | None:
        self._refresh()
        for c, heap in self._heaps.items():  # outdated entries are dropped in time
            assert len(heap) <= 2 * self._live[c] + 64
        walk = [g for _, g in self._walk()]
        assert walk == sorted_order(self, self.q, range(len(self.q)))
        CheckedAdapterAware.plans += 1
        return super().schedule_waiting(ctx)

    def prefetch(self, now: float):
        want = sorted_order(self, self.q, range(len(self.q)))
        got = list(super().prefetch(now))
        n, exp = 0, []
        for g in want:
            if n >= self.lookahead:
                break
            n += len(self.q[g])
            if g != self.base:
                exp.append(g)
        assert got == exp
        yield from got

    def next_change_time(self, stop: Admit | None) -> float:
        t = super().next_change_time(stop)
        # NO_SEQ: only the aging (it reorders the walk prefetch follows); else the next arrival too
        assert t == (next_age(self, self.q) if stop == Admit.NO_SEQ
                     else min(self.engine.next_arrival_time(), next_age(self, self.q)))
        return t


def workload(seed: int, n: int, adapters: int, rps: float) -> Workload:
    """Zipf-popular adapters (a few hot, many cold) and some base-model requests."""
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rps, n))
    arr[rng.random(n) < 0.1] = 0.0  # ties: requests arriving at the same time
    arr = np.sort(arr)
    ad = np.minimum(rng.zipf(1.3, n) - 1, adapters - 1)
    ad[rng.random(n) < 0.1] = -1
    rk = np.where(ad >= 0, np.asarray([8, 16, 64])[np.abs(ad) % 3], 0)
    return Workload.from_arrays(arr, rng.integers(20, 800, n), rng.integers(1, 120, n), ad, rk)


CASES = [  # seed, requests, adapters, rps, scheduler options, engine options, cache options
    (0, 400, 60, 30.0, {}, {"max_loras": 4, "max_cpu_loras": 8}, {}),
    (1, 400, 200, 60.0, {"max_wait_s": 0.5, "lookahead": 8}, {"max_loras": 8, "max_cpu_loras": 16}, {}),
    (2, 300, 40, 20.0, {"max_adapters": 2, "max_wait_s": 1.0}, {"max_loras": 6, "max_cpu_loras": 6}, {}),
    (3, 300, 120, 3.0, {"lookahead": 0}, {"max_loras": 4}, {}),
    (4, 400, 80, 40.0, {"max_wait_s": 0.2}, {"max_loras": 4, "max_cpu_loras": 4},
     {"adapter_memory": "unified"}),
]


@pytest.mark.parametrize("seed,n,adapters,rps,sopts,eopts,copts", CASES)
def test_incremental_order_equals_the_sort(seed, n, adapters, rps, sopts, eopts, copts):
    w = workload(seed, n, adapters, rps)
    prof = constant_profile(c0=0.02, c_prefill=1e-5, disk_s=0.3, cpu_s=0.05, kv_tokens=30_000)
    cfg = EngineConfig(max_num_seqs=16, max_model_len=2048, **eopts)
    CheckedAdapterAware.plans = 0
    got = simulate(w, prof, cfg, scheduler_obj=CheckedAdapterAware(**sopts), cache_obj=LRUCache(**copts),
                   check_invariants=True)
    assert CheckedAdapterAware.plans > 50
    ref = simulate(w, prof, cfg, scheduler_obj=SortingAdapterAware(**sopts), cache_obj=LRUCache(**copts))
    pd.testing.assert_frame_equal(got.requests, ref.requests)
    pd.testing.assert_frame_equal(got.steps, ref.steps)
    assert got.summary["preemptions"] == ref.summary["preemptions"]
