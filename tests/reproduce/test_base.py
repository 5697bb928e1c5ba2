"""The reproduction building blocks: the knee search, the low-load reference, names by registry,
and that the papers' numbers are never inputs."""

from __future__ import annotations

import dataclasses
import math

import pytest

from twin.config import ConfigError
from twin.compare import load_compare_profile
from twin.model_spec import QKVO
from twin.reproduce import adaptive_caching, fastlibra
from twin.reproduce.base import (LOW_LOAD_OCCUPANCY, Knee, PaperNumber, Runner, knee_search, low_load_reference,
                                 pct_change, pick, ratio, refine_knee)
from twin.scenario import RunConfig, build_engine_config, build_workload
from twin.simulate import simulate


@pytest.mark.parametrize("true_knee, start", [(3.3, 1.0), (3.3, 10.0), (0.4, 2.0), (7.0, 7.0)])
def test_knee_search_brackets_the_knee(true_knee, start):
    """On a step at ``true_knee`` the result passes, the first failing probe fails, and the bracket
    halves with every bisection."""
    k = knee_search(lambda r: {"r": r}, lambda s: s["r"] <= true_knee, start, bisections=6)
    assert k.rate <= true_knee < k.failed
    width = k.failed - k.rate
    assert width <= max(start, true_knee) * 2 / 2 ** 6 + 1e-12
    assert all(met == (r <= true_knee) for r, met in k.probes)


@pytest.mark.parametrize("true_knee", [3.3, 5.0, 27.0, 96.5, 0.7])
@pytest.mark.parametrize("resolution", [0.5, 0.25, 0.05])
def test_knee_search_resolution_bounds_the_bracket(true_knee, resolution):
    """With ``resolution`` the search bisects until the bracket is within that share of the knee
    found, and no further than one bisection past it; two fixed bisections from a doubling bracket
    leave up to 25 % of the failing rate (the earlier FastLibra default)."""
    k = knee_search(lambda r: {"r": r}, lambda s: s["r"] <= true_knee, 1.0, 0, resolution=resolution)
    assert k.rate <= true_knee < k.failed
    assert k.failed - k.rate <= resolution * k.rate + 1e-12
    bis = [r for r, _ in k.probes if r not in {2.0 ** i for i in range(-10, 11)}]
    assert len(bis) <= math.ceil(math.log2(1 / resolution))
    coarse = knee_search(lambda r: {"r": r}, lambda s: s["r"] <= true_knee, 1.0, 2)
    assert coarse.failed - coarse.rate <= 0.25 * coarse.failed
    with pytest.raises(ValueError, match="resolution"):
        knee_search(lambda r: {"r": r}, lambda s: True, 1.0, 0, resolution=0.0)


@pytest.mark.parametrize("true_knee", [3.3, 22.6, 0.7])
def test_refine_knee_continues_the_search(true_knee):
    """Refining a coarse knee probes the midpoints the search would have probed next: the same knee and probes
    as one search with that resolution, and a bracket within it; a knee without a failing rate stays."""
    point, ok = (lambda r: {"r": r}), (lambda s: s["r"] <= true_knee)
    coarse = knee_search(point, ok, 1.0, 2)
    fine = refine_knee(point, ok, coarse, 0.005)
    assert fine == knee_search(point, ok, 1.0, 2, resolution=0.005)
    assert fine.rate <= true_knee < fine.failed and fine.failed - fine.rate <= 0.005 * fine.rate
    assert fine.probes[:len(coarse.probes)] == coarse.probes and len(fine.probes) > len(coarse.probes)
    open_ended = Knee(4.0, None, [(4.0, True)])
    assert refine_knee(point, ok, open_ended, 0.005) is open_ended
    with pytest.raises(ValueError, match="resolution"):
        refine_knee(point, ok, coarse, 0.0)


def test_ratio_rows_unresolved_by_their_knees():
    """A throughput ratio whose knees' brackets straddle the tolerance band is graded 'unresolved', not yes/no
    (the fig11 ablation row read 0.96 against 1.05, 'yes', while its brackets allowed 0.945-0.981)."""
    from twin.reproduce.chameleon import PAPER, ratio_bracket, ratio_row
    from twin.reproduce.report import verdict

    slora = Knee(22.422, 22.837, [])
    nocache = Knee(21.591, 22.006, [])
    lo, hi = ratio_bracket(nocache, slora)
    assert lo == pytest.approx(21.591 / 22.837) and hi == pytest.approx(22.006 / 22.422)
    r = ratio_row(PAPER["thr_ChameleonNoCache"], nocache, slora)
    assert r.twin == 0.96 and verdict(r).startswith("unresolved")
    fine = ratio_row(PAPER["thr_ChameleonNoCache"], Knee(21.591, 21.65, []), Knee(22.422, 22.5, []))
    assert verdict(fine) == "yes"  # 0.960-0.966: within 0.10 of 1.05 at both ends
    far = ratio_row(PAPER["thr_Chameleon"], Knee(22.837, 23.252, []), slora)
    assert verdict(far) == "no"  # 1.000-1.037 against 1.5: outside at both ends


def test_knee_search_limits():
    assert knee_search(lambda r: {}, lambda s: True, 1.0, 3, max_doublings=4).failed is None
    k = knee_search(lambda r: {}, lambda s: False, 1.0, 3, max_doublings=4)
    assert k.rate == 0.0 and len(k.probes) == 5


def test_changes_and_ratios():
    assert pct_change(80.0, 100.0) == pytest.approx(-20.0)
    assert ratio(3.0, 2.0) == 1.5
    assert pct_change(None, 1.0) != pct_change(None, 1.0)  # NaN
    assert ratio(1.0, 0.0) != ratio(1.0, 0.0)


def test_pick_falls_back_and_records():
    subs: dict[str, str] = {}
    assert pick("preset", "slora", "vllm", subs) == "slora" and subs == {}
    assert pick("trace", "no-such-workload", "synthetic", subs) == "synthetic"
    assert subs == {"no-such-workload": "synthetic"}
    with pytest.raises(ConfigError, match="neither profile"):
        pick("profile", "no-such-profile", "nor-this-one", {})


def test_low_load_reference_is_low():
    run = RunConfig(trace="synthetic", adapters=4, ranks=[8], seed=0)
    s = low_load_reference(Runner(), run, "vllm", requests=30)
    assert s["rps"] * s["e2e_ms_mean"] / 1000.0 <= LOW_LOAD_OCCUPANCY + 1e-9
    assert s["requests_finished"] == s["requests_arrived"] > 0


def test_paper_numbers_are_not_inputs(monkeypatch):
    """The twin's column is the same with every paper number replaced (and runs are deterministic)."""
    monkeypatch.setitem(adaptive_caching.REQUESTS, "quick", 60)
    first = [r.twin for r in adaptive_caching.run(Runner(cache=False), True).rows]
    fake = {k: dataclasses.replace(p, value=-999.0) for k, p in adaptive_caching.PAPER.items()}
    monkeypatch.setattr(adaptive_caching, "PAPER", fake)
    rows = adaptive_caching.run(Runner(cache=False), True).rows
    assert [r.twin for r in rows] == first
    assert all(r.paper == -999.0 for r in rows)
    assert isinstance(next(iter(fake.values())), PaperNumber)


def test_fastlibra_systems_serve_the_same_adapters():
    """FastLibra's reproduction gives every system the same adapters: q, k, v, o (S-LoRA's only
    targets), so FastLibra and vLLM do not compute and copy 2.4x larger adapters than S-LoRA."""
    run = dataclasses.replace(fastlibra.scenario("fastlibra-chatbot", fastlibra.QUICK, {}), duration=3.0, rps=1.0)
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    for preset, system in (("fastlibra", "vllm"), ("vllm-partition", "vllm"), ("slora", "slora")):
        e = simulate(w, prof, build_engine_config(run, w, prof), policy=preset, system=system).engine
        assert tuple(e.profile.lora_targets) == tuple(QKVO), preset


def test_memory_gauge_reads_the_run_without_changing_it(monkeypatch):
    """A point with the memory gauge is the plain point (a run in chunks is the whole run) plus the
    mean of the readings taken every ``memory_gauge_s`` from ``measure_from_s`` to the last arrival;
    the gauge is part of the point's key and a bad interval is refused."""
    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)
    run = RunConfig(trace="multiturn-synth", duration=30.0, adapters=20, slots=8, seed=2)
    runner = Runner(cache=False)
    plain = runner.point(run, "fastlibra", 2.0, measure_from_s=10.0)
    gauged = runner.point(run, "fastlibra", 2.0, measure_from_s=10.0, memory_gauge_s=0.5)
    assert gauged is not plain
    extra = {k: gauged[k] for k in set(gauged) - set(plain)}
    # (the checks end runs of decode steps, so the gauge reads the state stepping has there: more segments, the
    # same steps and results)
    def same(x, y):  # (NaN for the figures of misses when no request missed: FastLibra's swapper prefetches)
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
    assert set(gauged) >= set(plain)
    assert all(same(gauged[k], v) for k, v in plain.items() if k != "step_segments")
    assert gauged["step_segments"] >= plain["step_segments"] and gauged["engine_steps"] == plain["engine_steps"]
    assert set(extra) == {"memory_in_use_mean", "memory_in_use_readings"}
    assert 0.0 < extra["memory_in_use_mean"] <= 1.0
    assert 35 <= extra["memory_in_use_readings"] <= 41  # every 0.5 s from 10 s to the last arrival (< 30 s)
    with pytest.raises(ValueError, match="memory_gauge_s"):
        runner.point(run, "fastlibra", 2.0, memory_gauge_s=0.0)


def test_a_mean_of_changes_of_mixed_sign_is_not_a_reproduction():
    """fastlibra-ttft's headline row read -60.3 against the paper's -60.3 as the mean of +17.8 (FastLibra
    worse on translation) and -99.4 twice: graded "no", naming the parts; one-signed parts keep the test."""
    from twin.reproduce.base import PaperNumber, row
    from twin.reproduce.fastlibra import mixed_sign_verdict
    from twin.reproduce.report import verdict

    paper = PaperNumber("mean TTFT vs vLLM", "FastLibra, mean of the three workloads", "%", -60.3, "src")
    mixed = mixed_sign_verdict(row(paper, -60.3), {"chatbot": -99.4, "translation": 17.8, "agent": -99.4})
    assert verdict(mixed).startswith("no: the workloads' changes differ in sign") and "translation +17.8" in \
        verdict(mixed)
    same = mixed_sign_verdict(row(paper, -60.3), {"chatbot": -50.0, "translation": -70.0, "agent": -61.0})
    assert verdict(same) == "yes"
    assert verdict(mixed_sign_verdict(row(paper, -20.0), {"a": -10.0, "b": -30.0})) == "no"


def test_a_point_sizes_the_server_as_its_presets_system(monkeypatch):
    """Runner.point built the engine configuration from a run without the preset, so an S-LoRA preset's pool with
    gpu_mem_gb was sized as vLLM's, less the per-slot LoRA buffers S-LoRA does not have (72,480 of 82,704 tokens in
    the FastLibra set-up). It is sized as `twin run` and `twin compare` size it now."""
    from twin.scenario import for_preset

    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)
    run = dataclasses.replace(RunConfig(trace="multiturn-synth", duration=10.0, adapters=20, slots=8, seed=2),
                              gpu_mem_gb=48.0)
    runner = Runner(cache=False)
    for preset in ("slora", "fastlibra"):
        got = runner.point(run, preset, 1.0)["kv_capacity_tokens"]
        r = dataclasses.replace(for_preset(run, preset), rps=1.0)
        prof = load_compare_profile(r.profile, None)
        want = build_engine_config(r, build_workload(r), prof).kv_capacity_tokens
        assert got == want, preset
