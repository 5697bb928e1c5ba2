"""A synchronous prefetch (the adaptive-caching study's EMA, ``shared/refs/adaptive-caching.md`` §2: "the request
that triggers the prefetch waits for every load") delays the step that decided it: its load time is the load wait
of the requests whose first token that step computes, once per request, and not of the requests that only decode
in it. TTFT - queueing - load wait is then the forward pass alone (finding 6, §4-5)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import policies  # noqa: F401
from policies.lru import LRUCache
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.registry import make_scheduler
from twin.reproduce.base import _request_metrics
from twin.simulate import simulate


class _SyncPrefetch(LRUCache):
    """LRU slots with a synchronous prefetch of adapter 2 from 1 s on, of adapter 3 from 2 s on."""

    name = "test-sync-prefetch-schedule"
    prefetch_sync = True

    def prefetch(self, now: float):
        return [3] if now >= 2.0 else [2] if now >= 1.0 else []


def _run(mrs):
    prof = constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.1)
    # 0: adapter 0 at 0 s (its own load); 1: a long decoder of adapter 0 from 0.5 s; 2: adapter 0 at 1 s (a hit:
    # its step carries the prefetch of adapter 2); 3: adapter 1 at 2 s (a miss: its own load and the prefetch of 3);
    # 4, 5: adapters 2 and 3 at 5 s (hits)
    w = Workload.from_arrays([0.0, 0.5, 1.0, 2.0, 5.0, 5.0], [16] * 6, [2, 300, 2, 2, 2, 2], [0, 0, 0, 1, 2, 3], [8] * 6)
    return simulate(w, prof, EngineConfig(max_loras=4, max_model_len=4096), scheduler_obj=make_scheduler("fcfs"),
                    cache_obj=_SyncPrefetch(), check_invariants=True, max_run_steps=mrs)


def test_sync_prefetch_load_is_the_load_wait_of_the_requests_it_delays():
    res = _run(None)
    r = res.requests
    assert r["load_wait_s"].tolist() == pytest.approx([0.1, 0.0, 0.1, 0.2, 0.0, 0.0], abs=1e-9)
    # the TTFT less queueing and load wait is one step of compute for each
    fwd = (r["ttft_s"] - r["queue_s"] - r["load_wait_s"]).to_numpy()
    assert fwd == pytest.approx([0.01] * 6, abs=1e-9)
    assert r["adapter_hit"].tolist() == [False, True, True, False, True, True]
    assert res.summary["prefetches"] == 2
    step = _run(1).requests
    assert np.array_equal(step["load_wait_s"].to_numpy(), r["load_wait_s"].to_numpy())
    assert np.array_equal(step["ttft_s"].to_numpy(), r["ttft_s"].to_numpy())


def test_forward_time_is_ttft_less_queueing_and_load_wait():
    """The reproductions' per-request split (twin/reproduce/base.py): the study's "inference time" is the
    forward pass, not the TTFT less the load wait alone (which kept the queueing in it)."""
    df = pd.DataFrame({"outcome": ["finished", "finished", "rejected"], "ttft_s": [0.05, 0.08, np.nan],
                       "queue_s": [0.01, 0.0, np.nan], "load_wait_s": [0.0, 0.04, 0.0],
                       "adapter_hit": pd.array([True, False, None], dtype="boolean"), "adapter_rank": [8, 8, 8]})
    out = _request_metrics(type("R", (), {"requests": df})())
    assert out["forward_ms_mean"] == pytest.approx(40.0)
    assert out["queue_ms_mean"] == pytest.approx(5.0) and out["load_wait_ms_mean"] == pytest.approx(20.0)
    assert "exec_ms_mean" not in out
