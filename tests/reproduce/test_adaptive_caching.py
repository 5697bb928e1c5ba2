"""``twin reproduce adaptive-caching``'s set-up: the EMA on the study's request clock, and the
static top-C hit rate in hindsight that bounds a cache under a stationary law."""

from __future__ import annotations

import dataclasses

import numpy as np

import policies  # noqa: F401
from policies.caches import STUDY_EMA_ALPHA, STUDY_EMA_EVERY_REQUESTS
from twin.registry import resolve_policy
from twin.reproduce import adaptive_caching as ac
from twin.scenario import build_workload


def test_ema_labels_run_on_the_request_clock():
    for label in ("EMA", "EMA-async"):
        preset = ac.POLICIES[label][0]
        _, cache, _ = resolve_policy(preset)
        assert cache.every_requests == STUDY_EMA_EVERY_REQUESTS and cache.alpha == STUDY_EMA_ALPHA
        assert cache.tick_interval is None
        assert cache.prefetch_sync is (label == "EMA")


def test_static_top_c_counts_the_most_requested_adapters():
    run = dataclasses.replace(ac.base_run("zipf", 4, 300, {}), rps=1.0)
    ids = build_workload(run).df["adapter_id"].to_numpy()
    counts = np.bincount(ids, minlength=ac.N_ADAPTERS)
    tops = [ac.static_top_c(run, c) for c in range(1, ac.N_ADAPTERS + 1)]
    assert tops[0] == counts.max() / counts.sum()
    assert tops[3] == np.sort(counts)[-4:].sum() / counts.sum()
    assert all(a <= b for a, b in zip(tops, tops[1:])) and tops[-1] == 1.0


def test_cumulative_hits_count_in_arrival_order_at_each_tenth():
    """Finding 4's figure: hits counted in arrival order (not table order) at each tenth of the
    requests; a request without an adapter-hit record (NA: never admitted) is no hit."""
    import pandas as pd

    n = 50
    hit = pd.array([True, False, None, True, True] * 10, dtype="boolean")
    arrival = np.arange(n, dtype=float)[::-1]  # the table lists the last arrival first
    got = ac.cumulative_hits(pd.DataFrame({"arrival_s": arrival, "adapter_hit": hit}))["cumulative_hits"]
    in_order = np.cumsum(np.asarray(hit.fillna(False), bool)[::-1])
    assert got == [int(in_order[5 * k - 1]) for k in range(1, 11)]
    assert got[-1] == 30 and got == sorted(got)
    assert ac.cumulative_hits(pd.DataFrame({"arrival_s": [], "adapter_hit": pd.array([], dtype="boolean")})) == {
        "cumulative_hits": []}
