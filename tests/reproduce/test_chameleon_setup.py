"""The Chameleon reproduction's set-up rules (``twin/reproduce/chameleon.py``): the length scale
from the paper's rule "scaled down so that peak memory equals GPU capacity", searched at S-LoRA's
knee, and the pool's peak use counting adapter weights."""

from __future__ import annotations

import dataclasses
import math

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
    assert e["length_rule"] == "peak-memory" and e["scale_probes"]
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
