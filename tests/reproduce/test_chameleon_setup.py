"""The Chameleon reproduction's set-up rules (``twin/reproduce/chameleon.py``): the length scale
from the paper's rule "scaled down so that peak memory equals GPU capacity", searched at
Chameleon's knee (default) or S-LoRA's, the pool's peak use counting adapter weights, and the
pool's use split into the requests' own memory and cached adapters."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from twin.config import ConfigError
from twin.reproduce import chameleon
from twin.reproduce.base import Runner
from twin.scenario import RunConfig

BOUNDARY = 0.2  # the fake workload fills the pool at its knee from this scale up


class FakeRunner:
    """Summaries of a made-up server: mean E2E 4 s x scale, P99 TTFT within 5 x E2E up to
    1/scale req/s, and a pool whose peak use at any load is min(1, scale / BOUNDARY)."""

    def __init__(self) -> None:
        self.calls = 0

    def point(self, run: RunConfig, policy, rps=None, *, slo_s=None, memory=False, **_):
        self.calls += 1
        scale = dict(run.trace_options).get("length_scale", 1.0)
        e2e = 4000.0 * scale
        out = {"e2e_ms_mean": e2e, "rps": rps, "ttft_ms_p99": 5.0 * e2e * rps * scale}
        if memory:
            out["kv_use_peak"] = 0.8 * min(1.0, scale / BOUNDARY)
            out["mem_use_peak"] = min(1.0, scale / BOUNDARY)
        return out


RUN = RunConfig(trace="chameleon", duration=60.0, trace_options=[("length_scale", 0.5), ("other", 1)])


@pytest.mark.parametrize("start", [0.5, 0.05, 0.2])
def test_scale_search_finds_the_smallest_scale_that_fills_the_pool(start):
    """From above (halving), from below (doubling) or at the boundary: the result fills the pool
    and lies within one bisection step (a factor 2**(1/2**b)) above the true boundary."""
    effort = chameleon.Effort(60.0, 2, 20, scale_bisections=4)
    found = chameleon.length_scale_search(FakeRunner(), RUN, "slora", effort, start)
    assert BOUNDARY <= found.scale <= BOUNDARY * 2 ** (1 / 16) + 1e-12
    assert all(p >= chameleon.FULL_SHARE for s, p, _ in found.probes if s >= found.scale)
    assert all(p < chameleon.FULL_SHARE for s, p, _ in found.probes if s < found.scale)
    # the knee of every probe is S-LoRA's at that scale (1/scale req/s in the fake), not a fixed load
    assert all(k <= 1.0 / s + 1e-9 and k > 0.5 / s for s, _, k in found.probes)


def test_scale_search_keeps_the_unscaled_trace_when_it_never_fills_the_pool():
    class Roomy(FakeRunner):
        def point(self, run, policy, rps=None, *, slo_s=None, memory=False, **kw):
            out = super().point(run, policy, rps, slo_s=slo_s, memory=memory, **kw)
            if memory:
                out["mem_use_peak"] = 0.5
            return out

    found = chameleon.length_scale_search(Roomy(), RUN, "slora", chameleon.QUICK, 0.5)
    assert found.scale == 1.0 and [s for s, _, _ in found.probes] == [0.5, 1.0]


def test_at_scale_replaces_only_the_length_scale():
    r = chameleon.at_scale(RUN, 0.125)
    assert r.trace_options == [("other", 1), ("length_scale", 0.125)]
    assert RUN.trace_options[0] == ("length_scale", 0.5)  # the original is untouched
    assert chameleon.workload_length_scale("chameleon") == 0.5
    assert chameleon.workload_length_scale("no-such-trace") == 1.0


def test_experiment_uses_the_searched_scale_or_the_workload_one(monkeypatch):
    monkeypatch.setattr(chameleon, "low_load_reference",
                        lambda runner, run, base, n: runner.point(run, base, 0.01))
    e = chameleon.experiment(FakeRunner(), quick=True)
    assert e["length_rule"] == chameleon.LENGTH_RULE == "peak-memory-top" and e["scale_probes"]
    assert dict(e["run"].trace_options)["length_scale"] == e["length_scale"] >= BOUNDARY
    assert e["mem_use_peak_at_knee"] >= chameleon.FULL_SHARE
    assert e["run"].slora_prefetch is chameleon.QUEUED_PREFETCH is True  # the paper's queued-request prefetch
    w = chameleon.experiment(FakeRunner(), quick=True, length_rule="workload")
    assert w["length_scale"] == 0.5 and w["scale_probes"] == []
    with pytest.raises(ConfigError, match="length rule"):
        chameleon.experiment(FakeRunner(), quick=True, length_rule="guess")


def test_pool_use_peak_counts_adapters(monkeypatch):
    """On the S-LoRA engine the pool's peak use counts adapter weights (4r slots each) as well as
    KV, so it is at least the KV share and at most the pool."""
    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)
    run = RunConfig(trace="chameleon", profile=chameleon.PROFILE, adapters=100, ranks=list(chameleon.RANKS),
                    popularity="U-P", duration=20.0, seed=0)
    s = Runner(cache=False).point(run, "slora", 4.0, memory=True)
    assert 0 < s["kv_use_peak"] < s["mem_use_peak"] <= 1.0
    assert not math.isnan(s["mem_use_peak"])
    v = Runner(cache=False).point(dataclasses.replace(run, duration=10.0), "vllm", 1.0, memory=True)
    assert v["mem_use_peak"] is None  # adapters in vLLM's own slots: no unified pool to fill


CHAMELEON_BOUNDARY = 0.1  # the fake Chameleon serves twice S-LoRA's knee and fills the pool from this scale up


class FakeRunnerTwoSystems(FakeRunner):
    """As :class:`FakeRunner` for S-LoRA; the fake Chameleon meets the SLO up to 2/scale req/s and
    its pool peaks at min(1, scale / CHAMELEON_BOUNDARY)."""

    def point(self, run: RunConfig, policy, rps=None, *, slo_s=None, memory=False, **kw):
        out = super().point(run, policy, rps, slo_s=slo_s, memory=memory, **kw)
        if policy == "chameleon":
            scale = dict(run.trace_options).get("length_scale", 1.0)
            out["ttft_ms_p99"] /= 2.0
            if memory:
                out["mem_use_peak"] = min(1.0, scale / CHAMELEON_BOUNDARY)
        return out


def test_scale_search_measures_the_named_system_at_its_own_knee():
    """``system=`` measures that system's peak at that system's knee (the SLO still from S-LoRA's
    low-load run): here Chameleon's boundary, not S-LoRA's, and Chameleon's knees in the probes."""
    effort = chameleon.Effort(60.0, 2, 20, scale_bisections=4)
    found = chameleon.length_scale_search(FakeRunnerTwoSystems(), RUN, "slora", effort, 0.5, system="chameleon")
    assert CHAMELEON_BOUNDARY <= found.scale <= CHAMELEON_BOUNDARY * 2 ** (1 / 16) + 1e-12
    assert all(k <= 2.0 / s + 1e-9 and k > 1.0 / s for s, _, k in found.probes)
    default = chameleon.length_scale_search(FakeRunnerTwoSystems(), RUN, "slora", effort, 0.5)
    assert BOUNDARY <= default.scale <= BOUNDARY * 2 ** (1 / 16) + 1e-12  # S-LoRA's, as before


def test_experiment_top_rule_fills_chameleons_pool_at_chameleons_knee(monkeypatch):
    monkeypatch.setattr(chameleon, "low_load_reference",
                        lambda runner, run, base, n: runner.point(run, base, 0.01))
    e = chameleon.experiment(FakeRunnerTwoSystems(), quick=True, length_rule="peak-memory-top")
    assert e["length_rule"] == "peak-memory-top" and e["length_rule_system"] == "chameleon"
    assert CHAMELEON_BOUNDARY <= e["length_scale"] < BOUNDARY
    assert min(p for s, p, _ in e["scale_probes"] if s >= e["length_scale"]) >= chameleon.FULL_SHARE
    # at that scale S-LoRA's knee leaves its pool short of full (the paper's facts, chameleon.md §5)
    assert e["mem_use_peak_at_knee"] < chameleon.FULL_SHARE
    s = chameleon.experiment(FakeRunnerTwoSystems(), quick=True, length_rule="peak-memory")
    assert s["length_rule_system"] == "slora" and BOUNDARY <= s["length_scale"]


@pytest.mark.parametrize("preset", ["slora", "chameleon"])
def test_running_adapter_bytes_match_the_engine(preset):
    """The adapters of running requests, rebuilt after the run from admission and finish times,
    equal the engine's own count of active adapters at every sampled instant (timed engine events
    only split runs of decode steps, so the run is the unsampled one)."""
    from twin.metrics import summarize
    from twin.registry import resolve_policy
    from twin.reproduce.base import running_adapter_bytes
    from twin.scenario import build_engine_config, build_workload
    from twin.compare import load_compare_profile
    from twin.simulate import ENGINES, SimResult

    run = RunConfig(trace="chameleon", profile=chameleon.PROFILE, adapters=100, ranks=list(chameleon.RANKS),
                    popularity="U-P", duration=20.0, seed=0, slora_prefetch=True,
                    trace_options=[("length_scale", 0.13)], rps=22.0)
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    sched, cache, _ = resolve_policy(preset, None, None)
    eng = ENGINES["slora"](w, prof, build_engine_config(run, w, prof), sched, cache, record_steps=True)
    seen: list[tuple[float, int]] = []

    def sample(now: float) -> None:
        m = eng.adapters
        seen.append((now, sum(b for b, k in zip(m.bytes, m.active) if k > 0)))
        if eng.arr_ptr < eng.n or eng.n_waiting or eng.running:
            eng.push_event(now + 0.237, sample)

    eng.push_event(0.237, sample)
    eng.run()
    res = SimResult(summarize(eng, 0.0, None, None), eng)
    t = np.array([s[0] for s in seen])
    assert len(t) > 50 and any(s[1] > 0 for s in seen)
    assert running_adapter_bytes(res, t, during=False).tolist() == [float(s[1]) for s in seen]
    if preset == "slora":  # (Chameleon squashes: a squashed request counts as running in between)
        # during each recorded step: the adapters of its batch, as the step records count them
        eng.adapters.bytes = [1] * len(eng.adapters.bytes)
        st = res.steps
        n = running_adapter_bytes(res, st["t_end"].to_numpy(float))
        assert n.tolist() == st["distinct_adapters"].astype(float).tolist()


def test_pool_shares_split_requests_from_the_cache(monkeypatch):
    """Chameleon keeps idle adapters (a cache share > 0, the requests' own peak below the pool's);
    the shares are None where adapters live outside a unified pool (vLLM)."""
    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)
    run = RunConfig(trace="chameleon", profile=chameleon.PROFILE, adapters=100, ranks=list(chameleon.RANKS),
                    popularity="U-P", duration=30.0, seed=0, slora_prefetch=True,
                    trace_options=[("length_scale", 0.13)])
    c = Runner(cache=False).point(run, "chameleon", 22.0, memory=True)
    assert 0 < c["mem_demand_peak"] < c["mem_use_peak"] <= 1.0
    assert 0 < c["mem_demand_mean"] < c["mem_use_mean"] and c["cache_share_mean"] > 0.05
    assert 0 <= c["cache_empty_time"] < 1
    v = Runner(cache=False).point(dataclasses.replace(run, duration=10.0), "vllm", 1.0, memory=True)
    assert v["mem_demand_peak"] is None and v["cache_share_mean"] is None


def _requests(n: int = 400, seed: int = 3):
    """A made-up per-request table: lengths, ranks, outcomes and times (the columns the size classes read)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    queue = rng.uniform(0.0, 2.0, n)
    e2e = queue + rng.uniform(0.5, 6.0, n)
    outcome = np.where(rng.random(n) < 0.9, "finished", "rejected")
    return pd.DataFrame({"prompt_tokens": rng.integers(4, 1024, n), "output_tokens": rng.integers(1, 512, n),
                         "adapter_rank": rng.choice([8, 16, 32, 64, 128], n), "outcome": outcome,
                         "queue_s": queue, "e2e_s": e2e, "ttft_s": queue + 0.1,
                         "arrival_s": np.sort(rng.uniform(0.0, 100.0, n))})


def test_size_classes_follow_chameleons_rule_and_measure_queueing():
    """Chameleon's WRS of the true sizes, K-means into 4 classes with midpoint cut-offs; per class the
    queued share is the class's total queue time over its total E2E (finished requests only)."""
    from policies.chameleon import weighted_request_size
    from policies.common import kmeans_1d

    df = _requests()
    got = chameleon.size_class_figures(df)
    p, o, r = (df[c].to_numpy(float) for c in ("prompt_tokens", "output_tokens", "adapter_rank"))
    w = weighted_request_size(p, o, r, p.max(), o.max(), r.max())
    # by hand: (0.4 In/MaxIn + 0.6 Out/MaxOut) x rank/MaxRank
    assert w == pytest.approx((0.4 * p / p.max() + 0.6 * o / o.max()) * r / r.max())
    c, _ = kmeans_1d(w, 4)
    cuts = (c[1:] + c[:-1]) / 2
    assert got["size_class_cuts"] == pytest.approx(cuts.tolist()) and len(cuts) == 3
    cls = np.searchsorted(cuts, w, side="right")
    fin = (df["outcome"] == "finished").to_numpy()
    for j in range(4):
        m = fin & (cls == j)
        assert got[f"requests_class{j + 1}"] == int(m.sum()) > 0
        assert got[f"queued_share_class{j + 1}"] == pytest.approx(df["queue_s"][m].sum() / df["e2e_s"][m].sum())
        assert got[f"queue_ms_mean_class{j + 1}"] == pytest.approx(1000 * df["queue_s"][m].mean())
        late = (df["arrival_s"] >= df["arrival_s"].median()).to_numpy()
        for part, sel in (("early", m & ~late), ("late", m & late)):
            assert got[f"queued_share_class{j + 1}_{part}"] == pytest.approx(
                df["queue_s"][sel].sum() / df["e2e_s"][sel].sum())
    assert sum(got[f"requests_class{j}"] for j in range(1, 5)) == int(fin.sum())


def test_size_classes_depend_on_the_workload_only():
    """Another system's outcomes and times for the same requests: the same cut-offs and class sizes
    where the same requests finish (the classes are the workload's, rejected requests included)."""
    df = _requests()
    other = df.assign(queue_s=df["queue_s"] * 3, e2e_s=df["e2e_s"] * 2)
    a, b = chameleon.size_class_figures(df), chameleon.size_class_figures(other)
    assert a["size_class_cuts"] == b["size_class_cuts"]
    assert [a[f"requests_class{j}"] for j in range(1, 5)] == [b[f"requests_class{j}"] for j in range(1, 5)]
    assert a["queued_share_class1"] != b["queued_share_class1"]
    assert chameleon.size_class_figures(df.iloc[:0]) == {"size_class_cuts": []}


def test_point_request_metrics_are_keyed_by_name(monkeypatch):
    """A point with a reproduction's per-request figures is a point of its own (memo and cache key
    hold the figures' name); without them the point is the plain one."""
    from twin.reproduce.base import RequestMetrics

    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)
    run = RunConfig(trace="chameleon", profile=chameleon.PROFILE, adapters=20, ranks=[8, 16], duration=10.0, seed=0,
                    trace_options=[("length_scale", 0.2)])
    runner = Runner(cache=False)
    seen = []
    calls = RequestMetrics("count-v1", lambda req: seen.append(len(req)) or {"n_requests_table": len(req)})
    plain = runner.point(run, "slora", 2.0)
    with_metrics = runner.point(run, "slora", 2.0, request_metrics=calls)
    again = runner.point(run, "slora", 2.0, request_metrics=calls)
    assert "n_requests_table" not in plain and with_metrics["n_requests_table"] == seen[0] > 0
    assert again is with_metrics and len(seen) == 1  # remembered, not simulated twice
    renamed = runner.point(run, "slora", 2.0, request_metrics=RequestMetrics("count-v2", calls.compute))
    assert renamed is not with_metrics and len(seen) == 2
    assert {k: v for k, v in with_metrics.items() if k != "n_requests_table"} == plain


def test_cache_rows_compare_nothing_when_no_cache_evicted():
    from twin.reproduce.base import PaperNumber, row
    from twin.reproduce.report import verdict

    paper = PaperNumber("P99 TTFT vs S-LoRA", "Chameleon-LRU, medium load (8 RPS)", "%", -18.0, "src")
    rows = [row(paper, -17.5), row(paper, -17.5)]
    got = {"LRU": {"adapter_evictions": 0}, "Chameleon": {"adapter_evictions": 0}}
    assert chameleon.mark_unexercised_caches(rows, got) == {"LRU": 0, "Chameleon": 0}
    assert [verdict(r) for r in rows] == ["n/a: no cache evicted"] * 2
    rows = [row(paper, -17.5)]
    chameleon.mark_unexercised_caches(rows, {"LRU": {"adapter_evictions": 3}, "Chameleon": {"adapter_evictions": 0}})
    assert verdict(rows[0]) == "yes"
