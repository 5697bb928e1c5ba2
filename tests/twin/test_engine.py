"""Engine behaviour: exact hand-computed values, run-skipping exactness, accounting, invariants."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers import constant_profile, random_workload
from traces.workload import Workload
from twin.config import ConfigError, EngineConfig
from twin.engine import Engine
from twin.interfaces import Scheduler
from twin.registry import make_cache, make_scheduler
from twin.requests import FINISHED, PENDING, StartupError
from twin.simulate import simulate


def test_hand_computed_ttft_and_itl():
    """c0 = 10 ms per step, 1e-5 s per prefill token, nothing else.

    r0 (t=0, prompt 100, 5 tokens): step [0, 0.011] prefills 100 tokens -> TTFT 0.011;
    r1 (t=0.015, prompt 3000, 2 tokens) arrives during r0's decode step [0.011, 0.021];
    step [0.021, 0.05147] runs r0's decode + 2047 tokens of r1 (budget 2048 - 1);
    step [0.05147, 0.071] runs r0's third decode + r1's remaining 953 tokens -> r1 TTFT
    0.071 - 0.015; the next 10 ms decode step gives r0's 5th token (4 decode steps) and
    r1's second: both finish at 0.081.
    """
    prof = constant_profile(c0=0.01, c_prefill=1e-5)
    w = Workload.from_arrays([0.0, 0.015], [100, 3000], [5, 2])
    res = simulate(w, prof, EngineConfig(max_loras=1, enable_lora=False), check_invariants=True)
    r = res.requests.set_index("request_id")
    t1 = 0.011
    t2 = t1 + 0.010
    t3 = t2 + 0.010 + 2047e-5
    t4 = t3 + 0.010 + 953e-5
    assert r.loc[0, "ttft_s"] == pytest.approx(t1, abs=1e-12)
    assert r.loc[0, "finish_s"] == pytest.approx(t4 + 0.010, abs=1e-12)
    assert r.loc[1, "ttft_s"] == pytest.approx(t4 - 0.015, abs=1e-12)
    assert r.loc[1, "finish_s"] == pytest.approx(t4 + 0.010, abs=1e-12)
    # r0's ITLs: 10 ms, 10 ms + 2047 prefill tokens, 10 ms + 953 tokens
    assert r.loc[0, "tpot_s"] == pytest.approx((t4 + 0.010 - t1) / 4, abs=1e-12)
    s = res.summary
    assert s["requests_finished"] == 2 and s["requests_unfinished"] == 0


def test_adapter_load_on_critical_path():
    """A cold adapter is loaded from disk (0.5 s) then copied to the GPU (0.1 s) inside the step."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 1.0], [10, 10], [1, 1], [0, 0], [8, 8])
    res = simulate(w, prof, EngineConfig(max_loras=1), check_invariants=True)
    r = res.requests.set_index("request_id")
    assert r.loc[0, "ttft_s"] == pytest.approx(0.61, abs=1e-12)
    assert r.loc[0, "load_wait_s"] == pytest.approx(0.6, abs=1e-12)
    assert r.loc[1, "ttft_s"] == pytest.approx(0.01, abs=1e-12)  # resident: a hit
    assert res.summary["adapter_loads_from_disk"] == 1 and res.summary["adapter_hit_rate"] == 0.5


def test_cpu_tier_and_lru_eviction():
    """One GPU slot, two adapters alternating: every switch evicts; the second time from CPU."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 2.0, 4.0, 6.0], [10] * 4, [1] * 4, [0, 1, 0, 1], [8] * 4)
    res = simulate(w, prof, EngineConfig(max_loras=1, max_cpu_loras=2), check_invariants=True)
    s = res.summary
    assert s["adapter_loads_from_disk"] == 2 and s["adapter_loads_from_cpu"] == 2
    assert s["adapter_evictions"] == 3
    ttft = res.requests["ttft_s"].to_numpy()
    assert ttft == pytest.approx([0.61, 0.61, 0.11, 0.11], abs=1e-12)


def test_cpu_tier_keeps_the_adapters_of_the_batch():
    """A full CPU tier drops its least recently used adapter *not in the batch*: vLLM touches the CPU cache's
    entry of every batch adapter each step (``LRUCacheWorkerLoRAManager.add_adapter``: ``get_adapter``).

    Two slots, three CPU slots. Adapter 0 runs from t=0 to ~12 s; 1, 2, 3 come and go at t=1, 2, 3 (3 fills the
    CPU tier: 1 goes, not 0, which joined first but is in the batch); 1 and 2 come back at t=20, 21, pushing 0
    out of its GPU slot; 0 comes back at t=30 and is copied from the CPU tier (0.1 s), not loaded from disk."""
    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    w = Workload.from_arrays([0.0, 1.0, 2.0, 3.0, 20.0, 21.0, 30.0], [10] * 7, [1000, 1, 1, 1, 1, 1, 1],
                             [0, 1, 2, 3, 1, 2, 0], [8] * 7)
    res = simulate(w, prof, EngineConfig(max_loras=2, max_cpu_loras=3), check_invariants=True)
    r = res.requests.set_index("request_id")
    assert 12 < r.loc[0, "finish_s"] < 20 and r.loc[3, "finish_s"] < 20
    assert r.loc[6, "ttft_s"] == pytest.approx(0.11, abs=1e-12)  # (0.61 when the tier dropped adapter 0 at t=3)
    assert res.summary["adapter_loads_from_disk"] == 6 and res.summary["adapter_loads_from_cpu"] == 1


@pytest.mark.parametrize("cpu_slots", [4, 5, 9])
def test_an_adapter_dropped_from_the_cpu_tier_leaves_its_slot(cpu_slots):
    """vLLM's CPU cache removes an adapter through ``deactivate_adapter`` (``LRUCacheLoRAModelManager``), so
    with vLLM's LRU slots every adapter in a slot stays in the CPU tier (the invariant ``check_invariants``
    asserts at every step), down to vLLM's default of as many CPU slots as GPU slots. The runs must drop
    adapters that hold a slot: evictions beyond the slot loads' own."""
    prof = constant_profile(c0=0.01, disk_s=0.05, cpu_s=0.01)
    w = random_workload(n=300, rps=8.0, adapters=24, seed=11)
    res = simulate(w, prof, EngineConfig(max_loras=4, max_cpu_loras=cpu_slots, max_num_seqs=16),
                   check_invariants=True)
    s = res.summary
    assert s["requests_finished"] == 300 and s["adapter_loads_from_disk"] > 24


def test_slot_limit_skips_but_keeps_order():
    """max_loras=1: a request of another adapter waits while adapter 0 runs; same-adapter
    requests behind it are admitted (vLLM v1 skips, it does not block)."""
    prof = constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 0.001, 0.002], [10, 10, 10], [50, 5, 5], [0, 1, 0], [8, 8, 8])
    res = simulate(w, prof, EngineConfig(max_loras=1), check_invariants=True)
    r = res.requests.set_index("request_id")
    assert r.loc[2, "first_scheduled_s"] < r.loc[1, "first_scheduled_s"]
    assert r.loc[1, "first_scheduled_s"] >= r.loc[0, "finish_s"]


def test_run_skipping_is_exact():
    """Advancing runs of identical decode steps gives exactly the step-by-step results."""
    prof = constant_profile(c0=0.008, c_prefill=2e-5, c_decode=5e-5, c_ctx=1e-8, k6=1.5, lora_pct=180, sched=1e-4,
                            k2=3e-7, kv_tokens=6000)
    w = random_workload(n=400, rps=6.0, adapters=20, seed=3)
    cfg = EngineConfig(max_loras=4, max_num_seqs=64, max_model_len=2048)
    a = simulate(w, prof, cfg)
    b = simulate(w, prof, cfg, max_run_steps=1)
    assert a.summary["preemptions"] > 0, "the scenario must exercise preemption"
    assert a.summary["step_segments"] < b.summary["step_segments"]
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    for k in ("itl_ms_p99", "itl_ms_p50", "engine_steps", "adapter_loads", "link_gb"):
        assert a.summary[k] == b.summary[k], k


def test_same_seed_same_results():
    w = random_workload(n=300, seed=5)
    prof = constant_profile(c0=0.01, c_prefill=1e-5, c_decode=1e-4)
    a = simulate(w, prof, EngineConfig(max_loras=3)).requests
    b = simulate(w, prof, EngineConfig(max_loras=3)).requests
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_accounting_with_horizon_and_rejections():
    """Every arrival ends finished, rejected (with a reason) or unfinished at the horizon."""
    prof = constant_profile(c0=0.02, c_prefill=1e-4, kv_tokens=160_000)
    rng = np.random.default_rng(1)
    n = 500
    prompt = rng.integers(1, 2000, n)
    prompt[7] = 200_000  # longer than max_model_len
    w = Workload.from_arrays(np.sort(rng.uniform(0, 60, n)), prompt, rng.integers(1, 200, n), rng.integers(0, 5, n),
                             np.full(n, 8))
    res = simulate(w, prof, EngineConfig(max_loras=2, max_lora_rank=8, served_adapters=4), horizon_s=40.0,
                   check_invariants=True)
    s = res.summary
    assert s["requests_arrived"] == int((w.df["arrival_s"] <= 40.0).sum())
    assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == s["requests_arrived"]
    assert s["requests_unfinished"] > 0 and s["requests_rejected"] > 0
    assert "unknown adapter (not served)" in s["reject_reasons"]
    assert "prompt + output exceed max_model_len" in s["reject_reasons"]
    assert (res.requests.loc[res.requests["outcome"] == "finished", "finish_s"] <= 40.0).all()


def test_startup_check_refuses_impossible_config():
    prof = constant_profile(kv_tokens=100_000)  # < 131072 = Llama-3.1-8B max_model_len
    w = random_workload(n=10)
    with pytest.raises(StartupError, match="max_model_len"):
        simulate(w, prof, EngineConfig(max_loras=2))
    # a shorter max_model_len starts
    simulate(w, prof, EngineConfig(max_loras=2, max_model_len=4096))


def test_bad_config_errors():
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=128, max_num_seqs=256).validate()
    with pytest.raises(ConfigError, match="max_cpu_loras"):
        EngineConfig(max_loras=8, max_cpu_loras=4).validate()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), slots=st.integers(1, 4), kv=st.integers(2200, 9000), seqs=st.integers(2, 40),
       budget=st.sampled_from([64, 256, 2048]), adapters=st.integers(1, 8))
def test_invariants_random_workloads(seed, slots, kv, seqs, budget, adapters):
    prof = constant_profile(c0=0.005, c_prefill=1e-5, c_decode=1e-4, k6=2.0, lora_pct=150, sched=1e-4, k2=1e-6,
                            kv_tokens=kv)
    w = random_workload(n=60, rps=20.0, adapters=adapters, seed=seed, max_prompt=1000, max_out=120)
    cfg = EngineConfig(max_loras=slots, max_num_seqs=min(seqs, budget), max_num_batched_tokens=budget,
                       max_model_len=2048)
    res = simulate(w, prof, cfg, check_invariants=True)
    s = res.summary
    assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == s["requests_arrived"] == 60
    assert s["requests_unfinished"] == 0  # no horizon: everything that fits finishes
    fin = res.requests[res.requests["outcome"] == "finished"]
    assert (fin["tokens_emitted"] == fin["output_tokens"]).all()
    assert (fin["first_token_s"] >= fin["arrival_s"]).all() and (fin["finish_s"] >= fin["first_token_s"]).all()
    b = simulate(w, prof, cfg, max_run_steps=1)
    assert np.array_equal(res.requests["finish_s"].to_numpy(), b.requests["finish_s"].to_numpy(), equal_nan=True)


def _memory(n=4, slots=3, seed=0):
    import random

    import simpy

    from policies.lru import LRUCache
    from twin.adapters import AdapterMemory, HostLink

    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    mem = AdapterMemory(np.full(n, 8), prof, slots, n, LRUCache(), HostLink(simpy.Environment()))
    mem.preload_cpu(range(n))
    mem._order_rng = random.Random(seed)
    return mem


def test_vllm_activation_order_reloads_adapters_of_the_batch():
    """vLLM walks the batch's adapters in set order; a new adapter evicts the LRU-oldest at that
    moment, which can be an adapter of the batch not touched yet in this step (then reloaded)."""
    # the victim left the batch before the previous step: it is older than the whole batch
    mem = _memory()
    for a in (1, 2, 3):
        mem.acquire(a, 0.0)
    mem.release(3, 1.0)
    ld = mem.acquire(0, 2.0)
    assert ld.link_s == pytest.approx(0.1) and mem.reloads == 0 and not mem.resident[3]
    # the victim left after the previous step: one batch adapter (1) and one idle adapter (3) were
    # touched in the previous walk in random order; adapter 1 is evicted and copied back when the
    # new adapter comes first in this walk (1/2) and 1 is the older of the two (1/2): 1/4 of runs
    counts = []
    for seed in range(4000):
        m = _memory(n=3, slots=2, seed=seed)
        m.acquire(1, 0.0)
        m.acquire(2, 0.0)
        m.release(2, 1.0)
        ld = m.acquire(0, 1.0)
        assert ld.link_s == pytest.approx(0.1 * (1 + m.reloads))
        assert m.resident[0] and m.resident[1] and not m.resident[2]  # the final state is LRU's
        counts.append(m.reloads)
    assert set(counts) == {0, 1} and np.mean(counts) == pytest.approx(0.25, abs=0.025)
    # longer batches reload more, never more than the untouched adapters
    big = []
    for seed in range(500):
        m = _memory(n=12, slots=11, seed=seed)
        for a in range(1, 12):
            m.acquire(a, 0.0)
        m.release(11, 1.0)
        m.acquire(0, 1.0)
        assert 0 <= m.reloads <= 10
        big.append(m.reloads)
    assert np.mean(big) > 2 * np.mean(counts)


def test_activation_order_reloads_only_with_vllm_lru():
    """Other cache policies (and LRU with the behaviour off) never reload adapters of the batch."""
    from policies.lru import LRUCache

    class PlainLRU(LRUCache):
        activation_order_reloads = False

    w = random_workload(n=400, rps=8.0, adapters=24, seed=3)
    cfg = EngineConfig(max_loras=4, max_cpu_loras=24)
    prof = constant_profile(c0=0.01, c_decode=1e-4, disk_s=0.0, cpu_s=0.005)
    vllm = simulate(w, prof, cfg, cache_obj=LRUCache(), check_invariants=True)
    plain = simulate(w, prof, cfg, cache_obj=PlainLRU(), check_invariants=True)
    assert vllm.summary["adapter_loads"] > plain.summary["adapter_loads"]
    assert vllm.summary["requests_finished"] + vllm.summary["requests_unfinished"] == 400


def test_preempted_decoder_recomputes_its_output_and_keeps_it():
    """vLLM v1 recompute preemption keeps the generated tokens: a decoding request that is
    preempted re-prefills prompt + emitted tokens and continues from there.

    KV of 4 blocks of 16 tokens, two requests (prompt 16, 40 tokens) at t=0. Step 1 prefills
    both (32 tokens, first token each). Decode step n computes token 16 + n; at n = 17 both
    need a third block: r0 (first in the running list) preempts r1, which has emitted 17
    tokens (33 known). r0 decodes alone to its 40th token (n = 39) and frees its 4 blocks;
    r1 then recomputes its 33 tokens (token 18 at the end of that prefill) and decodes the
    other 22. Steps: 1 + 39 + 1 + 22; prefill tokens 32 + 33; decode tokens 39 + 16 + 22.
    """
    prof = constant_profile(c0=0.01, c_prefill=1e-5, kv_tokens=64)
    w = Workload.from_arrays([0.0, 0.0], [16, 16], [40, 40])
    res = simulate(w, prof, EngineConfig(max_loras=1, enable_lora=False, max_model_len=64), check_invariants=True)
    r = res.requests.set_index("request_id")
    st = res.steps
    assert r["preemptions"].tolist() == [0, 1]
    assert r["outcome"].tolist() == ["finished", "finished"]
    assert int(st["n_steps"].sum()) == 1 + 39 + 1 + 22
    assert int((st["prefill_tokens"] * 1).sum()) == 32 + 33
    assert int((st["decode_tokens"] * st["n_steps"]).sum()) == 39 + 16 + 22
    # r1's clock: 40 steps of r0's life (the first one with 32 prefill tokens), its 33-token recompute
    # step, 22 decode steps
    t_r0 = 0.01 + 32e-5 + 39 * 0.01
    assert r.loc[0, "finish_s"] == pytest.approx(t_r0, abs=1e-12)
    assert r.loc[1, "finish_s"] == pytest.approx(t_r0 + 0.01 + 33e-5 + 22 * 0.01, abs=1e-12)


def test_engine_implements_the_engine_view():
    """Every member of twin.interfaces.EngineView (what policies may use) exists on the engine."""
    import policies  # noqa: F401
    from twin.engine import Engine
    from twin.interfaces import EngineCore, EngineView
    from twin.registry import resolve_policy

    s, c, _ = resolve_policy("vllm")
    w = {"arrival_s": np.array([0.0, 0.5]), "prompt_tokens": np.array([10, 20]), "output_tokens": np.array([3, 4])}
    e = Engine(w, constant_profile(), EngineConfig(max_model_len=4096), s, c)
    members = set(EngineCore.__annotations__) | set(EngineView.__annotations__)
    members |= {n for cls in (EngineView, EngineCore) for n in vars(cls) if not n.startswith("_")}
    missing = sorted(m for m in members if not hasattr(e, m))
    assert not missing, missing


def _same_run(a, b) -> None:
    """Two simulations gave identical results: every request, every step record, the summary."""
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    sa = {k: repr(v) for k, v in a.summary.items() if k not in ("wall_s", "x_realtime")}
    sb = {k: repr(v) for k, v in b.summary.items() if k not in ("wall_s", "x_realtime")}
    assert sa == sb


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bulk_preemption_walk_is_exact(seed, monkeypatch):
    """The bulk walk over the running requests when KV runs out (prefix sums between the
    positions where something happens) gives exactly the one-request-at-a-time walk."""
    from twin.engine import Engine

    prof = constant_profile(c0=0.008, c_prefill=2e-5, c_decode=5e-5, c_ctx=1e-8, k6=1.5, lora_pct=180, sched=1e-4,
                            k2=3e-7, kv_tokens=5000)
    w = random_workload(n=500, rps=30.0, adapters=6, seed=seed, max_prompt=900, max_out=400)
    cfg = EngineConfig(max_loras=4, max_num_seqs=256, max_num_batched_tokens=512, max_model_len=2048)
    a = simulate(w, prof, cfg, check_invariants=True)
    monkeypatch.setattr(Engine, "bulk_preempt_walk", False)
    b = simulate(w, prof, cfg, check_invariants=True)
    assert a.summary["preemptions"] > 50, "the scenario must exercise the preemption walk"
    _same_run(a, b)


@pytest.mark.parametrize("profile", ["llama-3.1-8b_h100_vllm085", "percent"])
def test_decode_run_fast_path_is_exact(profile):
    """A decode run's step durations written out on the run's constants (context term added
    last, LoRA term once or as a percentage of the base) equal single steps bit for bit: the
    shipped profile (roofline backbone, kernel-grid LoRA, queue scheduler) and a percent-LoRA one."""
    from twin.perf.profile import load_profile

    if profile == "percent":
        prof = constant_profile(c0=0.008, c_decode=5e-5, c_ctx=3e-8, k6=1.5, lora_pct=180, sched=1e-4, k2=3e-7)
    else:
        prof = load_profile(profile)
    assert prof._ctx_coef and prof._ctx_coef > 0
    w = random_workload(n=300, rps=4.0, adapters=10, seed=7, max_prompt=1200, max_out=400)
    cfg = EngineConfig(max_loras=4, max_num_seqs=64, max_model_len=4096, kv_capacity_tokens=200_000)
    a = simulate(w, prof, cfg, horizon_s=60.0)
    b = simulate(w, prof, cfg, horizon_s=60.0, max_run_steps=1)
    assert a.summary["engine_steps"] > 3 * a.summary["step_segments"], "runs of several decode steps"
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    assert a.summary["engine_steps"] == b.summary["engine_steps"]
    for k in ("itl_ms_p99", "itl_ms_p50", "itl_ms_mean", "simulated_s"):
        assert repr(a.summary[k]) == repr(b.summary[k]), k


@pytest.mark.parametrize("policy", ["vllm", "chameleon+prefetch", "ema-prefetch"])
def test_direct_clock_is_exact(policy, monkeypatch):
    """Moving SimPy's clock directly when no other event is pending gives exactly the results
    of a timeout event per wait (also with asynchronous loads, whose events keep the queue busy)."""
    from twin.engine import Engine

    prof = constant_profile(c0=0.008, c_prefill=2e-5, c_decode=5e-5, c_ctx=1e-8, k6=1.5, lora_pct=180, sched=1e-4,
                            k2=3e-7, kv_tokens=8000)
    w = random_workload(n=300, rps=8.0, adapters=24, seed=11)
    cfg = EngineConfig(max_loras=4, max_num_seqs=64, max_model_len=2048)
    a = simulate(w, prof, cfg, policy=policy, check_invariants=True)
    monkeypatch.setattr(Engine, "direct_clock", False)
    b = simulate(w, prof, cfg, policy=policy, check_invariants=True)
    assert a.summary["adapter_loads"] > 10
    _same_run(a, b)


def test_inline_shuffle_draws_as_random_shuffle():
    """The adapters' inline shuffle gives random.Random.shuffle's order and leaves the
    generator in the same state (the vLLM activation-order model draws from it)."""
    import random

    from twin.adapters import shuffle

    for seed in range(5):
        a, b = random.Random(seed), random.Random(seed)
        for n in list(range(0, 70)) + [127, 128, 129, 300, 1000, 1024, 1025, 1500]:  # (past the bit table)
            x, y = list(range(n)), list(range(n))
            a.shuffle(x)
            shuffle(b, y)
            assert x == y, (seed, n)
        assert a.random() == b.random()


def test_one_step_decode_run_is_exact(monkeypatch):
    """A decode run that a finish ends after its first step is that step's :meth:`Profile.step_s`
    (no run machinery): the same results as stepping one iteration at a time, and the path is
    taken (fewer calls of the run entry point than decode-run segments)."""
    from twin.perf.profile import Profile, load_profile

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    w = random_workload(n=400, rps=12.0, adapters=10, seed=5, max_prompt=400, max_out=8)
    cfg = EngineConfig(max_loras=4, max_num_seqs=64, max_model_len=4096, kv_capacity_tokens=200_000)
    calls = []
    orig = Profile.decode_run
    monkeypatch.setattr(Profile, "decode_run", lambda self, *a, **k: calls.append(1) or orig(self, *a, **k))
    a = simulate(w, prof, cfg, check_invariants=True)
    monkeypatch.setattr(Profile, "decode_run", orig)
    b = simulate(w, prof, cfg, max_run_steps=1)
    st = a.steps
    runs = int(((st.prefill_tokens == 0) & (st.decode_tokens > 0)).sum())
    assert len(calls) < runs - 50, "one-step runs must skip the run entry point"
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    for k in ("itl_ms_p99", "itl_ms_p50", "itl_ms_mean", "simulated_s", "engine_steps", "adapter_loads"):
        assert repr(a.summary[k]) == repr(b.summary[k]), k


@pytest.mark.parametrize("slack", [1024, 0])
def test_running_order_columns_follow_the_running_dict(slack, monkeypatch):
    """The per-admission columns the bulk preemption walk reads give the running requests in
    admission order (``list(running)``) through admissions, finishes, preemptions and the
    columns' compaction (``slack`` 0: compacted at most walks; also checked at every step by
    ``assert_invariants``)."""
    from twin.engine import Engine

    monkeypatch.setattr(Engine, "run_columns_slack", slack)

    prof = constant_profile(c0=0.008, c_prefill=2e-5, c_decode=5e-5, c_ctx=1e-8, sched=1e-4, kv_tokens=4000)
    w = random_workload(n=300, rps=30.0, adapters=4, seed=2, max_prompt=600, max_out=300)
    cfg = EngineConfig(max_loras=4, max_num_seqs=128, max_num_batched_tokens=512, max_model_len=2048)
    seen = []
    orig = Engine._preempt_until_fits

    def spy(self, now):
        seen.append(self._running_order().tolist() == list(self.running))
        return orig(self, now)

    Engine._preempt_until_fits = spy
    try:
        res = simulate(w, prof, cfg, check_invariants=True)
    finally:
        Engine._preempt_until_fits = orig
    assert res.summary["preemptions"] > 10 and len(seen) > 10 and all(seen)


def test_dense_adapter_ids_match_unique_and_searchsorted():
    """The presence-table remap of adapter ids gives ``np.unique`` and ``np.searchsorted``'s arrays
    (small ids), and the sort path is kept for huge ids."""
    from twin.requests import dense_adapter_ids

    rng = np.random.default_rng(0)
    cases = [rng.integers(-1, 50, 2000), rng.integers(-1, 10**12, 500), np.full(7, -1), np.zeros(0, np.int64),
             np.array([5, 5, -1, 3, 70000]),
             # every request names an adapter (the mask-free path), and huge ids without -1
             rng.integers(0, 50, 2000), np.array([3, 0, 3, 7]), np.array([2]), rng.integers(0, 10**12, 300)]
    for raw in cases:
        raw = np.asarray(raw, np.int64)
        used, dense = dense_adapter_ids(raw)
        want = np.unique(raw[raw >= 0])
        assert used.dtype == want.dtype and np.array_equal(used, want)
        assert dense.dtype == np.int64
        assert np.array_equal(dense, np.where(raw >= 0, np.searchsorted(want, raw), -1))


def test_fcfs_queue_order_with_16_bit_keys():
    """FCFS's per-adapter queues (a stable sort on 16-bit adapter keys) are the stable sort on
    64-bit keys: every adapter's requests in arrival order."""
    from policies.fcfs import FCFSScheduler
    from twin.engine import Engine
    from policies.lru import LRUCache

    w = random_workload(n=3000, rps=50.0, adapters=300, seed=4)
    eng = Engine(w, constant_profile(), EngineConfig(max_loras=8), FCFSScheduler(), LRUCache())
    s = eng.scheduler
    grp = np.where(eng.adapter >= 0, eng.adapter, eng.n_adapters)
    valid = np.nonzero(eng.reject_reason == 0)[0]
    want = valid[np.argsort(grp[valid].astype(np.int64), kind="stable")]
    assert np.array_equal(np.frombuffer(s.q, np.int64), want)


@pytest.mark.parametrize("case", ["all accepted", "too long", "unserved", "rank", "lora off", "no adapters",
                                  "base requests", "unified pool", "empty"])
def test_rejection_rules_from_maxima_match_the_masks(case, monkeypatch):
    """``apply_rejection_rules`` accepting every request from the maxima gives exactly the columns
    of the rule-by-rule masks, and falls back to them whenever some rule can refuse a request."""
    from twin.requests import RequestTable

    df = random_workload(n=800, rps=40.0, adapters=12, seed=11).df
    w = {c: df[c].to_numpy().copy()[:0 if case == "empty" else None] for c in df.columns}
    args = dict(max_model_len=4096, block_size=16, total_blocks=10_000, served_adapters=None, enable_lora=True,
                max_lora_rank=64, adapter_blocks=None)
    if case == "too long":
        w["prompt_tokens"][::97] = 5000
    elif case == "unserved":
        args["served_adapters"] = 6
    elif case == "rank":
        args["max_lora_rank"] = 8  # (ranks 8 and 16)
    elif case == "lora off":
        args["enable_lora"] = False
    elif case == "no adapters":
        w["adapter_id"][:] = -1
    elif case == "base requests":
        w["adapter_id"][::5] = -1
    elif case == "unified pool":
        args["adapter_blocks"] = np.full(12, 9_990, np.int64)
    tables = []
    for fast in (True, False):
        monkeypatch.setattr(RequestTable, "decide_from_maxima", fast)
        t = RequestTable(w)
        t.apply_rejection_rules(**args)
        tables.append(t)
    a, b = tables
    assert np.array_equal(a.reject_reason, b.reject_reason) and np.array_equal(a.state, b.state)
    assert list(a.ok_cum) == list(b.ok_cum) and len(a.ok_cum) == a.n + 1
    refused = int(np.count_nonzero(b.reject_reason))
    assert (refused == 0) == (case in ("all accepted", "no adapters", "base requests", "empty")), refused
    assert isinstance(a.ok_cum, range) == (refused == 0 and a.n > 0)  # (an index is its own prefix count)


def test_fcfs_queues_skip_rejected_requests():
    """With requests refused at arrival, FCFS's queues hold exactly the accepted ones, each
    adapter's in arrival order, and its arrival-order list is the accepted requests."""
    from policies.fcfs import FCFSScheduler
    from twin.engine import Engine
    from policies.lru import LRUCache

    w = random_workload(n=2000, rps=50.0, adapters=40, seed=5)
    eng = Engine(w, constant_profile(), EngineConfig(max_loras=8, served_adapters=25), FCFSScheduler(), LRUCache())
    s = eng.scheduler
    valid = np.nonzero(eng.reject_reason == 0)[0]
    assert 0 < len(valid) < eng.n
    grp = np.where(eng.adapter >= 0, eng.adapter, eng.n_adapters)
    want = valid[np.argsort(grp[valid], kind="stable")]
    assert np.array_equal(np.frombuffer(s.q, np.int64), want)
    assert list(s.valid_list) == valid.tolist()


@pytest.mark.parametrize("preset, trace", [("vllm", "synthetic"), ("vllm-partition", "multiturn-synth"),
                                           ("fastlibra", "multiturn-synth"), ("slora", "synthetic")])
def test_memory_in_use_counts_kv_history_and_adapters(preset, trace):
    """``memory_in_use`` read during a run (timed events split only decode runs) equals the memory
    counted independently: running KV + lent blocks (history KV, adapters of a unified pool) over
    the pool, plus resident adapter bytes over vLLM's slots or the fixed region; FastLibra's own
    swapper gauge (``usage``) where it has one. The run itself is the unsampled one."""
    from twin.compare import load_compare_profile
    from twin.registry import resolve_policy, resolve_system
    from twin.scenario import RunConfig, build_engine_config, build_workload
    from twin.simulate import ENGINES

    run = RunConfig(trace=trace, duration=40.0, rps=2.0, adapters=30, slots=8, seed=1)
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    system = resolve_system(preset, None)
    readings: list[tuple[float, float]] = []

    def engine():
        s, c, _ = resolve_policy(preset, None, None)
        return ENGINES[system](w, prof, build_engine_config(run, w, prof), s, c, record_steps=False)

    eng = engine()

    def expected() -> float:
        e, mem = eng, eng.adapters
        tokens = (e.pool_blocks - e.total_blocks + e.used_blocks) * e.block_size
        cap = e.pool_blocks * e.block_size
        if preset in ("vllm", "vllm-partition"):
            region = (mem.placement.alloc.capacity if preset == "vllm-partition"
                      else mem.gpu_slots * prof.adapter_bytes(e.max_lora_rank))
            tokens += mem.resident_bytes / e.kv_bytes_per_token
            cap += region / e.kv_bytes_per_token
        return tokens / cap

    def sample(now: float) -> None:
        got = eng.memory_in_use()
        readings.append((now, got))
        assert got == pytest.approx(expected(), rel=1e-12)
        if preset == "fastlibra":
            assert got == pytest.approx(eng.cache.usage(), rel=1e-12)
        if eng.arr_ptr < eng.n or eng.n_waiting or eng.running:
            eng.push_event(now + 0.731, sample)

    eng.push_event(0.731, sample)
    eng.run()
    assert len(readings) > 40 and all(0.0 <= u <= 1.0 for _, u in readings)
    assert max(u for _, u in readings) > 0.0
    plain = engine()
    plain.run()
    assert np.array_equal(np.asarray(plain.finish), np.asarray(eng.finish), equal_nan=True)


def test_preload_gpu_makes_adapters_resident_idle_and_evictable_in_order():
    """``AdapterMemory.preload_gpu`` (the calibration's pre-loading servers): at most ``gpu_slots``
    adapters resident from the start, in the CPU tier too, idle in the given order (the first is
    the LRU victim), and a request of one of them is a hit with no load."""
    import simpy

    from policies.lru import LRUCache
    from twin.adapters import AdapterMemory, HostLink

    prof = constant_profile(c0=0.01, disk_s=0.5, cpu_s=0.1)
    mem = AdapterMemory(np.full(5, 8), prof, 3, 5, LRUCache(), HostLink(simpy.Environment()))
    mem.preload_gpu([2, 0, 4, 1])
    assert [mem.resident[a] for a in range(5)] == [True, False, True, False, True]
    assert mem.n_resident == 3 and list(mem.cpu) == [2, 0, 4]
    assert mem.acquire(0, 1.0) is None and mem.hits == 1 and mem.loads_cpu == 0
    assert mem.evict_victim(1.0) == 2  # the first preloaded, idle since start
    load = mem.acquire(3, 1.0)
    assert load is not None and load.adapter == 3
    pooled = AdapterMemory(np.full(2, 8), prof, 2, 2, LRUCache(), HostLink(simpy.Environment()))
    pooled.use_placement(object(), 2)  # a shared pool (adapter-placement extension): no fixed slots to fill
    with pytest.raises(ValueError, match="fixed adapter slots"):
        pooled.preload_gpu([0])


@pytest.mark.parametrize("fitted", [False, True], ids=["constant-profile", "llama-profile"])
def test_serving_host_time_is_exact_in_runs_and_adds_per_running_request(fitted):
    """The serving path's host time (Profile.with_serving_host) is part of every step: run skipping and
    the decode-run fast path give exactly the step-by-step results, and one step costs h x running more."""
    from twin.perf.profile import load_profile

    prof = (load_profile("llama-3.1-8b_h100_vllm085") if fitted else
            constant_profile(c0=0.008, c_prefill=2e-5, c_decode=5e-5, c_ctx=1e-8, k6=1.5, lora_pct=180, sched=1e-4,
                             k2=3e-7, kv_tokens=6000))
    h = 19e-6
    served = prof.with_serving_host(h)
    assert served.serving_s_per_running == h and prof.serving_s_per_running == 0.0
    for running in (0, 1, 250):
        assert served.scheduler_s(running, 7, 4, 20) == prof.scheduler_s(running, 7, 4, 20) + h * running
    assert served.step_s(0, 100, 30_000, 100, 4, 16, 8, 100, 0, 20) > prof.step_s(0, 100, 30_000, 100, 4, 16, 8, 100, 0,
                                                                                  20)
    assert served.without("mixed").serving_s_per_running == h
    w = random_workload(n=400, rps=6.0, adapters=20, seed=3)
    cfg = EngineConfig(max_loras=4, max_num_seqs=64, max_model_len=2048, kv_capacity_tokens=None if fitted else 6000)
    a = simulate(w, prof, cfg, serving_s_per_running=h)
    b = simulate(w, prof, cfg, serving_s_per_running=h, max_run_steps=1)
    c = simulate(w, prof, cfg)
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    assert a.summary["serving_us_per_running"] == pytest.approx(19.0) and "serving_us_per_running" not in c.summary
    assert a.summary["itl_ms_mean"] > c.summary["itl_ms_mean"]


@pytest.mark.parametrize("served_us", [0.0, 18.0])
def test_rank_tile_cost_is_exact_in_runs_and_lowers_rank_32_steps_only(served_us):
    """The LoRA shrink's rank tile cost (Profile.with_rank_tile_cost) is part of every step: run skipping and the
    decode-run fast path give exactly the step-by-step results; slots of rank <= 16 are unchanged and rank-32
    slots get cheaper steps."""
    from twin.perf.profile import load_profile

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    tiled = prof.with_rank_tile_cost(0.25)
    assert tiled.components["lora"].params["n_tile_cost"] == 0.25 and "n_tile_cost" not in prof.components["lora"].params
    assert tiled.with_serving_host(1e-5).components["lora"].params["n_tile_cost"] == 0.25
    assert prof.with_rank_tile_cost(1.0).step_s(0, 80, 20_000, 80, 30, 32, 64, 80, 0, 64) == prof.step_s(
        0, 80, 20_000, 80, 30, 32, 64, 80, 0, 64)
    for rank in (8, 16):
        assert tiled.step_s(0, 80, 20_000, 80, 30, rank, 64, 80, 0, 64) == prof.step_s(0, 80, 20_000, 80, 30, rank,
                                                                                          64, 80, 0, 64)
    assert tiled.step_s(0, 80, 20_000, 80, 30, 32, 64, 80, 0, 64) < prof.step_s(0, 80, 20_000, 80, 30, 32, 64, 80, 0,
                                                                                   64)
    w = random_workload(n=400, rps=6.0, adapters=40, seed=5, ranks=(16, 32))
    cfg = EngineConfig(max_loras=32, max_num_seqs=64, max_model_len=2048)
    kw = {"serving_s_per_running": served_us * 1e-6}
    a = simulate(w, prof, cfg, rank_tile_cost=0.25, **kw)
    b = simulate(w, prof, cfg, rank_tile_cost=0.25, max_run_steps=1, **kw)
    c = simulate(w, prof, cfg, **kw)
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)
    assert a.summary["rank_tile_cost"] == 0.25 and "rank_tile_cost" not in c.summary
    assert a.summary["itl_ms_mean"] < c.summary["itl_ms_mean"]


def test_rank_tile_cost_refuses_bad_values_and_forms_without_rank_tiles():
    from twin.perf.profile import load_profile

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="relative to the first"):
            prof.with_rank_tile_cost(bad)
    other = constant_profile(c0=0.01, c_prefill=1e-5, c_decode=1e-4)  # a percent_of_base LoRA form
    assert other.with_rank_tile_cost(1.0) is other  # 1 changes nothing
    with pytest.raises(ValueError, match="has no rank tiles"):
        other.with_rank_tile_cost(0.5)
    with pytest.raises(ValueError, match="has no rank tiles"):
        simulate(random_workload(n=10, seed=1), other, EngineConfig(), rank_tile_cost=0.5)


def test_serving_host_time_refuses_a_negative_or_infinite_value():
    prof = constant_profile(c0=0.01, c_prefill=1e-5, c_decode=1e-4)
    w = random_workload(n=20, seed=1)
    for bad in (-1e-6, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="seconds per running request"):
            simulate(w, prof, EngineConfig(), serving_s_per_running=bad)
        with pytest.raises(ValueError, match="seconds per running request"):
            prof.with_serving_host(bad)


def test_workload_built_directly_is_validated():
    """Workload(df) and Workload.from_arrays refuse what the file readers refuse, never truncate."""
    from traces.workload import WorkloadError

    base = dict(arrival_s=[0.0, 1.0], prompt_tokens=[10, 20], output_tokens=[5, 5], adapter_id=[0, -1],
                adapter_rank=[8, 0])
    for change, fragment in ((dict(prompt_tokens=[10.5, 20]), "'prompt_tokens' holds integers; row 0 has 10.5"),
                             (dict(adapter_id=[-5, -1]), "'adapter_id' must be >= -1"),
                             (dict(prefix_tokens=[-1, 0]), "'prefix_tokens' must be >= 0"),
                             (dict(turn=[-7, 0]), "'turn' must be >= -1")):
        with pytest.raises(WorkloadError, match=fragment):
            Workload(pd.DataFrame({**base, **change}))
    with pytest.raises(WorkloadError, match="holds integers"):
        Workload.from_arrays([0, 1], [5.7, 5], [5, 5])
    with pytest.raises(WorkloadError, match="one value per request"):
        Workload.from_arrays([0, 1, 2], [5, 5], [5, 5, 5])
    with pytest.raises(WorkloadError, match=r"unknown column\(s\) \['adaptor'\]"):
        Workload.from_arrays([0, 1], [5, 5], [5, 5], adaptor=[1, 1])
    with pytest.raises(WorkloadError, match="is a pandas DataFrame, got dict"):
        Workload({"arrival_s": [0.0]})
    assert Workload.from_arrays([0, 1], [5.0, 6.0], [5, 5]).df["prompt_tokens"].tolist() == [5, 6]


def test_simulate_refuses_bad_run_arguments_before_the_run():
    w = Workload.from_arrays([0.0, 0.5, 1.0], [10, 20, 30], [5, 5, 5])
    cfg = EngineConfig(kv_capacity_tokens=4000, max_model_len=2048)
    for kw, fragment in ((dict(horizon_s=-1.0), "horizon_s -1.0"), (dict(horizon_s=float("nan")), "horizon_s nan"),
                         (dict(horizon_s="5"), "horizon_s '5'"), (dict(max_run_steps=-3), "max_run_steps -3"),
                         (dict(ttft_slo_s=-1), "ttft_slo_s -1"), (dict(tbt_slo_s="x"), "tbt_slo_s 'x'"),
                         (dict(ttft_slo_s=1e308), r"ttft_slo_s 1e\+308: beyond the 1e\+08 s \(about 3 years\)"),
                         (dict(tbt_slo_s=float("nan")), "tbt_slo_s nan")):
        with pytest.raises(ValueError, match=fragment):
            simulate(w, constant_profile(), cfg, **kw)
    with pytest.raises(TypeError, match="not a twin.config.EngineConfig"):
        simulate(w, constant_profile(), {"max_loras": 2})
    cols = {k: w.df[k].to_numpy() for k in w.df.columns}
    with pytest.raises(ValueError, match="'prompt_tokens' must be >= 1"):
        simulate({**cols, "prompt_tokens": -cols["prompt_tokens"]}, constant_profile(), cfg)
    with pytest.raises(TypeError, match="workload: got list"):
        simulate([1, 2, 3], constant_profile(), cfg)


def test_engine_config_refuses_values_of_the_wrong_type_naming_the_field():
    """EngineConfig built directly (not through `twin run`): a fraction of a count, a string, None where a
    number is needed, NaN, and the S-LoRA bounds are refused by validate(); numpy integers and whole floats
    pass."""
    EngineConfig(max_loras=np.int64(4), kv_capacity_tokens=4000.0).validate()
    for kw, fragment in ((dict(max_loras=2.5), "max_loras must be a whole number, got 2.5"),
                         (dict(enable_lora="no"), "enable_lora must be true or false"),
                         (dict(max_num_batched_tokens="2048"), "max_num_batched_tokens must be a whole number"),
                         (dict(max_num_seqs=None), "max_num_seqs needs a value"),
                         (dict(kv_capacity_tokens=float("nan")), "kv_capacity_tokens must be a whole number"),
                         (dict(max_total_tokens=-5), "max_total_tokens must be >= 1"),
                         (dict(slora_batch_max_tokens=0), "slora_batch_max_tokens must be >= 1"),
                         (dict(slora_poll_s=0.0), "slora_poll_s must be > 0")):
        with pytest.raises(ConfigError, match=fragment):
            EngineConfig(**kw).validate()


class _NeverAdmit(Scheduler):
    """A user scheduler that never offers a request to ``ctx.try_admit``."""

    name = "never-admit"

    def on_preempt(self, rid: int) -> None:
        pass

    def schedule_waiting(self, ctx):
        return None


def test_a_scheduler_that_admits_nothing_is_named_in_a_note_and_a_warning():
    """A run whose scheduler admits no request ends with every request unfinished: the summary says so in
    its ``note`` (naming the scheduler) and a NothingAdmittedWarning is issued; a run cut by its horizon after
    admissions, which also finishes none, gets neither."""
    import warnings

    from twin.registry import make_cache
    from twin.simulate import NothingAdmittedWarning

    w = Workload.from_arrays([0.0, 0.5, 1.0], [10, 20, 30], [5, 5, 5])
    cfg = EngineConfig(kv_capacity_tokens=4000, max_model_len=2048)
    with pytest.warns(NothingAdmittedWarning, match=r"no request was admitted: scheduler 'never-admit' \(.*_NeverAdmit\) "
                                                    r"admitted none of the 3 request\(s\) that arrived and waited, so the "
                                                    r"run finished none \(all 3 unfinished\); check its schedule_waiting"):
        res = simulate(w, constant_profile(), cfg, scheduler_obj=_NeverAdmit(), cache_obj=make_cache("lru"))
    s = res.summary
    assert (s["requests_arrived"], s["requests_finished"], s["requests_unfinished"]) == (3, 0, 3)
    assert s["note"].startswith("no request was admitted: scheduler 'never-admit'")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NothingAdmittedWarning)
        cut = simulate(w, constant_profile(c0=1.0), cfg, horizon_s=0.9).summary  # (admitted, not finished)
        assert cut["requests_finished"] == 0 and "note" not in cut
        assert "note" not in simulate(w, constant_profile(), cfg).summary


class _DropAll(Scheduler):
    """A user scheduler that drops every arrival before the queue (``EngineView.drop_arrivals``)."""

    name = "drop-all"

    def __init__(self, reason: object = "turned away by the test's admission control") -> None:
        self.reason = reason

    def on_arrivals(self, lo: int, hi: int) -> None:
        self.engine.drop_arrivals(range(lo, hi), self.reason)

    def on_preempt(self, rid: int) -> None:
        pass

    def schedule_waiting(self, ctx):
        return None


class _DropSome(Scheduler):
    """A user scheduler that drops a random share of the arrivals (a range or an array of them) and offers
    the waiting requests oldest first, checking the engine's waiting requests per adapter at every call."""

    name = "drop-some"

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.checks = 0

    def on_arrivals(self, lo: int, hi: int) -> None:
        e = self.engine
        ok = np.arange(lo, hi)[e.reject_reason[lo:hi] == 0]
        if len(ok) and self.rng.random() < 0.3:
            if self.rng.random() < 0.5 and len(ok) == hi - lo:
                e.drop_arrivals(range(int(ok[-1]), hi), "dropped by the test")
            else:
                e.drop_arrivals(ok[self.rng.random(len(ok)) < 0.5], "dropped by the test")

    def on_preempt(self, rid: int) -> None:
        pass

    def schedule_waiting(self, ctx):
        e = self.engine
        waiting = e.adapter[e.waiting_ids()]
        assert np.array_equal(e.waiting_adapter_counts(), np.bincount(waiting[waiting >= 0], minlength=e.n_adapters))
        self.checks += 1
        for rid in e.waiting_ids():
            r = ctx.try_admit(int(rid))
            if r != r.OK:
                return r
        return None


@pytest.mark.parametrize("system,seed", [("vllm", 0), ("vllm", 1), ("slora", 2), ("slora", 3)])
def test_waiting_requests_per_adapter_are_kept_through_admissions_preemptions_and_drops(system, seed):
    """``waiting_adapter_counts`` (kept on the events that change it, the arrivals added when read) equals the
    bincount of the adapters of ``waiting_ids`` at every admission attempt and every step (the invariants),
    through arrivals, rejections at start-up, admissions, preemptions and dropped arrivals."""
    rng = np.random.default_rng(seed)
    n = 300
    ad = rng.integers(-1, 12, n)  # (-1: the base model)
    prompt, output = rng.integers(10, 400, n), rng.integers(1, 300, n)
    prompt[::25], output[::25] = 1500, 1600  # rejected at start-up (longer than either server takes)
    w = Workload.from_arrays(np.sort(rng.uniform(0, 3, n)), prompt, output, ad, np.where(ad >= 0, 8, 0))
    sched = _DropSome(seed)
    cfg = EngineConfig(max_loras=4, max_model_len=1024) if system == "vllm" else EngineConfig(max_total_tokens=3000)
    res = simulate(w, constant_profile(c0=0.01, kv_tokens=3000), cfg, scheduler_obj=sched, cache_obj=make_cache("lru"),
                   system=system, check_invariants=True)
    s = res.summary
    assert sched.checks > 20 and s["requests_dropped"] > 0 and s["requests_rejected"] > 0
    assert s["requests_finished"] + s["requests_dropped"] + s["requests_rejected"] == n
    if system == "vllm":
        assert s["preemptions"] > 0


def test_dropped_arrivals_carry_their_reason_and_are_not_blamed_on_the_scheduler():
    """Requests a plug-in drops before the queue stay unfinished with its reason in ``drop_reason`` and the
    summary's ``drop_reasons``; the run gets no "nothing admitted" note (nothing waited to be admitted). A
    reason that is not a non-empty string is refused naming the call."""
    import warnings

    from twin.interfaces import PolicyError
    from twin.registry import make_cache
    from twin.simulate import NothingAdmittedWarning

    w = Workload.from_arrays([0.0, 0.5, 1.0], [10, 20, 30], [5, 5, 5])
    cfg = EngineConfig(kv_capacity_tokens=4000, max_model_len=2048)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NothingAdmittedWarning)
        res = simulate(w, constant_profile(), cfg, scheduler_obj=_DropAll(), cache_obj=make_cache("lru"))
    s = res.summary
    assert (s["requests_unfinished"], s["requests_dropped"]) == (3, 3) and "note" not in s
    assert s["drop_reasons"] == {"turned away by the test's admission control": 3}
    assert res.requests["drop_reason"].tolist() == ["turned away by the test's admission control"] * 3
    for bad in ("", "  ", None, 3):
        with pytest.raises(PolicyError, match=r"drop_arrivals\(\.\.\., reason=.*\): give why the requests failed"):
            simulate(w, constant_profile(), cfg, scheduler_obj=_DropAll(bad), cache_obj=make_cache("lru"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 39), max_size=6),
                          st.lists(st.integers(0, 39), max_size=6)), min_size=1, max_size=12))
def test_waiting_ids_equal_the_set_difference_after_random_changes(rounds):
    """``waiting_ids`` masks the running requests out of the arrived PENDING ones (a sorted set difference
    with the running ones cost a sort per call, each victim of Chameleon's cache): after random arrivals,
    admissions, finishes and preemptions, the same ascending indices as the plain set difference."""
    n = 40
    w = Workload.from_arrays(np.arange(n) * 0.1, [10] * n, [2] * n, [-1] * n, [0] * n)
    e = Engine(w, constant_profile(c0=0.01, kv_tokens=40_000), EngineConfig(max_model_len=4096), make_scheduler("fcfs"),
               make_cache("lru"))
    for arrive, admit, finish in rounds:
        e.arr_ptr = min(e.arr_ptr + arrive, n)
        for rid in admit:  # arrived and PENDING requests start (or a running one is preempted: it waits again)
            if rid < e.arr_ptr and e.state[rid] == PENDING:
                if rid in e.running:
                    del e.running[rid]
                else:
                    e.running[rid] = None
        for rid in finish:
            if rid < e.arr_ptr and e.state[rid] == PENDING:
                e.running.pop(rid, None)
                e.state[rid] = FINISHED
        got = e.waiting_ids()
        plain = np.setdiff1d(np.nonzero(e.state[:e.arr_ptr] == PENDING)[0], np.array(list(e.running), np.int64),
                             assume_unique=True)
        assert got.dtype == np.int64 and got.tolist() == plain.tolist()


@pytest.mark.parametrize("horizon", [1e9, float("inf"), -1.0, 0.0])
def test_a_horizon_beyond_the_longest_run_is_refused(horizon):
    """``horizon_s`` above 0 and up to MAX_SIM_SECONDS (1e8 s), as ``--horizon`` is (config.py): past it the summary's
    rates read ~0 and the clock's resolution breaks the latencies; a zero horizon simulated nothing and its summary
    divided by a 1 s stand-in window (simulated_s 1.0, TTFT incl. unfinished 1000 ms)."""
    with pytest.raises(ValueError, match=r"horizon_s .*above 0 and up to 1e\+08"):
        simulate(random_workload(20), horizon_s=horizon)


def test_a_policy_whose_bind_raises_is_named_with_the_hook():
    """``bind`` is a hook like the others: what it raises comes out as a PolicyError naming the policy and the hook."""
    from policies.fcfs import FCFSScheduler
    from twin.interfaces import PolicyError

    class BadBind(FCFSScheduler):
        name = "bad-bind"

        def bind(self, engine):
            super().bind(engine)
            raise ValueError("boom")

    with pytest.raises(PolicyError, match=r"scheduler 'bad-bind' \(.*BadBind\) failed in its hook bind.*ValueError: boom"):
        simulate(random_workload(20), scheduler_obj=BadBind())


@pytest.mark.parametrize("opts", [[1], "max_wait_s=2", {1: 2}])
def test_policy_options_that_are_not_a_dict_of_names_are_refused(opts):
    with pytest.raises(TypeError, match="scheduler_opts .*give the policy's constructor arguments as a dict"):
        simulate(random_workload(20), scheduler_opts=opts)


@pytest.mark.parametrize("config", [EngineConfig(max_loras=1000), EngineConfig(max_lora_rank=10**6)])
def test_slots_whose_lora_buffers_leave_no_kv_memory_are_named(config):
    """Slots and a max rank whose LoRA buffers take all the memory: the message names them (it blamed the block size)."""
    with pytest.raises(StartupError, match=r"adapter slots of max rank \d+ leave no memory for the KV cache.*give "
                                           r"fewer slots \(max_loras\) or a lower max_lora_rank"):
        simulate(random_workload(20), config=config)


class _Pacer(Scheduler):
    """FCFS with at most one admission per tick (a token refilled at each tick): it admits only at its ticks."""

    name = "t-pacer"

    def __init__(self, every: float = 0.5) -> None:
        self.every = every

    @property
    def tick_interval(self) -> float:
        return self.every

    def bind(self, engine) -> None:
        super().bind(engine)
        self.q: list[int] = []
        self.tokens = 1

    def on_arrivals(self, lo: int, hi: int) -> None:
        self.q.extend(range(lo, hi))

    def on_preempt(self, rid: int) -> None:
        self.q.insert(0, rid)

    def on_tick(self, now: float) -> None:
        self.tokens = 1

    def schedule_waiting(self, ctx):
        if self.q and self.tokens:
            r = ctx.try_admit(self.q[0])
            if r.name == "OK":
                self.q.pop(0)
                self.tokens = 0
                return None
            return r
        return None


def test_a_scheduler_that_admits_at_its_ticks_is_not_stopped_by_the_idle_tick_guard():
    """With only policy ticks left, a run without a horizon ends after 16 ticks in a row that admit nothing. The
    count ran over the whole run, never reset by progress, so a scheduler admitting one request per tick (30
    arriving at once) was stopped after 17 productive ticks with 13 requests stranded (stop 67's liveness fuzz)."""
    n = 30
    w = Workload.from_arrays(np.zeros(n), np.full(n, 10), np.full(n, 2), np.full(n, -1), np.zeros(n, np.int64))
    runs = [simulate(w, constant_profile(c0=0.01), EngineConfig(max_loras=1), scheduler_obj=_Pacer(0.5),
                     policy="vllm", max_run_steps=k) for k in (None, 1)]
    assert runs[0].summary["requests_finished"] == n
    assert runs[0].requests.equals(runs[1].requests)
    # (the pacer admits at t = 0, 0.5, ..., 14.5: the last finishes two steps after)
    assert runs[0].summary["simulated_s"] == pytest.approx(14.52)
