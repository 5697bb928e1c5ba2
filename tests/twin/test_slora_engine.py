"""The S-LoRA engine (``twin/slora_engine.py``) against S-LoRA's semantics (``shared/refs/slora.md``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from policies.lru import LRUCache
from policies.slora import NoCache, SLoRAScheduler
from tests.helpers import constant_profile, random_workload
from traces.workload import Workload
from twin.adapters import AdapterMemory
from twin.config import ConfigError, EngineConfig
from twin.perf.forms import KernelGridLora
from twin.perf.profile import load_profile
from twin.perf.slora_forms import PunicaLoraCost, slora_load_s
from twin.scenario import RunConfig, check_run
from twin.simulate import simulate
from twin.slora_engine import Reservations, SLoRAEngine, first_pass_step, reservation_need

STEP = 0.01  # every step of the constant profile (no prefill/decode/LoRA term)


def run(w, n_tok=None, policy="slora", cache=None, steps=None, **cfg):
    prof = constant_profile(c0=STEP, kv_tokens=200_000)
    return simulate(w, prof, EngineConfig(max_total_tokens=n_tok, **cfg), policy=policy, cache=cache,
                    check_invariants=True, max_run_steps=steps)


def base(arrivals, prompts, outputs):
    n = len(arrivals)
    return Workload.from_arrays(arrivals, prompts, outputs, [-1] * n, [0] * n)


# ---------------------------------------------------------------------- the reservation formula
def test_reservation_need_hand_example():
    # running (left 20, has 100) and a candidate (10, 50): sorted by left, terms 100 + 1*20 = 120
    # and 150 + 2*10 = 170 -> 170; three requests: (30,5),(20,100),(10,50): 35, 105+40=145, 155+30=185
    assert reservation_need([(20, 100), (10, 50)]) == 170
    assert reservation_need([(10, 50), (30, 5), (20, 100)]) == 185
    assert reservation_need([]) == 0


def test_reservation_admits_strictly_below_the_pool():
    # r0 (prompt 100, output 50) is prefilled at 0 (the first poll), its first token at 0.01; r1
    # (prompt 40, output 30) is tried after 10 decodes (0.11): r0 is (left 38, has 111), r1 enters
    # as (29, 41): need = max(111 + 38, 152 + 2*29) = 210
    w = base([0.0, 0.001], [100, 40], [50, 30])
    assert run(w, n_tok=211).requests.loc[1, "first_scheduled_s"] == pytest.approx(0.11)  # 210 < 211
    # with 210 slots it fails and is retried at every iteration; s decodes later, while r0 has more
    # left than r1, need = 210 + s; once 38 - s < 29, r1 comes first: need = max(41 + 29,
    # 152 + s + 2*(38 - s)) = 228 - s, below 210 from s = 19: admitted at 0.11 + 0.19
    late = run(w, n_tok=210).requests
    assert late.loc[1, "first_scheduled_s"] == pytest.approx(0.30)
    assert late.loc[1, "first_scheduled_s"] < late.loc[0, "finish_s"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 300)), min_size=0, max_size=8),
       st.integers(0, 60), st.integers(1, 300), st.integers(0, 1500), st.integers(0, 200))
def test_first_pass_step_is_exact(running, L, H, room, slots):
    """The shortcut that skips decodes after a failed admission finds the first step at which
    the candidate's outcome (admitted / NO_SLOT / NO_KV) changes, exactly as recomputing
    S-LoRA's need after every decode."""
    limit = min([l for l, _ in running], default=30)

    def cat(s):
        need = reservation_need([(l - s, h + s) for l, h in running] + [(L, H)])
        return 0 if need < room else 1 if need < room + slots else 2

    want = next((s for s in range(1, limit + 1) if cat(s) != cat(0)), float("inf"))
    assert first_pass_step(running, [(L, H, room, room + slots)], limit) == want


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(-3, 40), st.integers(0, 300)), min_size=0, max_size=10),
       st.lists(st.tuples(st.booleans(), st.integers(-3, 40), st.integers(0, 300)), min_size=1, max_size=25))
def test_reservations_equal_the_sorted_need(running, ops):
    """The admission's kept order (a bisection per candidate) gives S-LoRA's need exactly as sorting
    the batch's pairs for each candidate does, through candidates refused and admitted (ties of
    ``left`` included, negative ``left`` too, where the ties' order changes the need)."""
    res = Reservations(running)
    pairs = list(running)
    for admit, left, has in ops:
        assert res.need_with(left, has) == reservation_need(pairs + [(left, has)])
        assert res.need_with(left, has) == reservation_need(pairs + [(left, has)])  # (indexed by now)
        if admit:
            res.add(left, has)
            pairs.append((left, has))
            assert res.pairs == sorted(pairs, key=lambda p: -p[0])


@pytest.mark.parametrize("seed", range(12))
def test_kept_reservations_follow_the_running_batch(seed):
    """The engine's reservations kept from step to step (mini-batches added at admission, moved to their
    decoding pairs at the end of the prefill, the finishing requests dropped, squashed ones taken out, decodes
    changing nothing) give S-LoRA's need exactly as sorting the running pairs, in the running set's order (ties
    of ``left`` included: small lengths make many), with and without a candidate, and the same first step at
    which a refused candidate's outcome changes as stepping the decodes one by one."""
    import random
    rng = random.Random(seed)
    res = Reservations()
    dec: dict[int, tuple[int, int]] = {}  # the engine's running set in its order: rid -> (f, b)
    g = 0
    rid = 0

    def plain(extra=()):
        return [(f - g - 1, b + g + 1) for f, b in dec.values()] + list(extra)

    for _ in range(40):
        op = rng.random()
        if op < 0.45 or not dec:  # an admission: candidates tested, some admitted, then the prefill
            res.g = g
            batch: list[tuple[int, int, int]] = []
            for _ in range(rng.randint(1, 5)):
                left, has = rng.randint(0, 6), rng.randint(1, 40)
                assert res.need_with(left, has) == reservation_need(plain([(l, h) for _, l, h in batch] + [(left, has)]))
                if rng.random() < 0.7:
                    res.add(left, has, rid)
                    batch.append((rid, left, has))
                    rid += 1
            for r, left, has in batch:  # S-LoRA's prefill: the first token; a request of one token ends
                if left == 0:
                    res.remove(r, left + g + 1)
                else:
                    res.settle(r, left + g + 1)
                    dec[r] = (left + g, has - g - 1)
        elif op < 0.85:  # decodes up to the first finish, which ends the requests finishing there
            g = min(f for f, _ in dec.values()) if rng.random() < 0.6 else g + 1
            if any(f <= g for f, _ in dec.values()):
                for r in [r for r, (f, _) in dec.items() if f <= g]:
                    del dec[r]
                res.finish(g)
        else:  # a squash: any running request leaves
            r = rng.choice(list(dec))
            res.remove(r, dec.pop(r)[0])
        res.g = g
        want = sorted(plain(), key=lambda p: -p[0])
        assert res.n == len(dec) and res.pairs == want
        assert res.rids == sorted(dec, key=lambda r: -dec[r][0])
        assert res.need() == reservation_need(plain())
        if dec:  # a candidate refused now: when does its outcome change?
            L, H = rng.randint(0, 8), rng.randint(1, 60)
            room = reservation_need(plain([(L, H)])) + rng.randint(-20, 20)
            slots = rng.randint(0, 30)
            limit = min(l for l, _ in want)
            assert first_pass_step(res.fork(g), [(L, H, room, room + slots)], limit) == \
                first_pass_step(plain(), [(L, H, room, room + slots)], limit)


# ---------------------------------------------------------------------- when admission runs
def test_idle_poll_and_admission_every_ten_decodes():
    # r0 arrives at 3 ms on an idle server: the router polls every 10 ms -> admitted at 10 ms;
    # r1 arrives during r0's decodes: admitted only after 10 decodes since r0's prefill
    w = base([0.003, 0.025], [10, 10], [40, 5])
    r = run(w).requests
    assert r.loc[0, "first_scheduled_s"] == pytest.approx(0.01)
    assert r.loc[0, "first_token_s"] == pytest.approx(0.02)
    assert r.loc[1, "first_scheduled_s"] == pytest.approx(0.02 + 10 * STEP)
    # r0 stalled through r1's prefill: its tokens come 40 - 1 decodes + 1 prefill after its first
    assert r.loc[0, "finish_s"] == pytest.approx(0.02 + 40 * STEP)


def test_admission_cadence_is_a_run_option():
    """``--slora-max-wait-tokens N`` (RunConfig -> EngineConfig): r1 arrives during r0's decodes and is
    admitted after N decodes since r0's prefill (S-LoRA's 10 by default; 1: after the next decode)."""
    from twin.compare import load_compare_profile
    from twin.scenario import build_engine_config, build_workload

    for n in (10, 3, 1):
        w = base([0.003, 0.025], [10, 10], [40, 5])
        r = run(w, slora_max_wait_tokens=n).requests
        assert r.loc[1, "first_scheduled_s"] == pytest.approx(0.02 + n * STEP)
    rc = RunConfig(trace="synthetic", duration=5.0, slora_max_wait_tokens=4)
    wl = build_workload(rc)
    assert build_engine_config(rc, wl, load_compare_profile(rc.profile, None)).slora_max_wait_tokens == 4
    with pytest.raises(ConfigError, match="--slora-max-wait-tokens"):
        check_run(RunConfig(trace="synthetic", slora_max_wait_tokens=0))


def test_a_comparison_passes_each_preset_its_own_engine_options():
    """``twin compare --policies slora,vllm --max-total-tokens N``: the S-LoRA preset gets the pool size,
    the vLLM preset runs without it (``for_preset``), and neither is refused."""
    from twin.compare import CompareConfig, compare
    from twin.scenario import for_preset

    rc = RunConfig(trace="synthetic", duration=5.0, max_total_tokens=50_000, max_num_seqs=64)
    assert for_preset(rc, "slora").max_total_tokens == 50_000 and for_preset(rc, "slora").policy == "slora"
    assert for_preset(rc, "slora").max_num_seqs == RunConfig().max_num_seqs  # (a vLLM option, back at its default)
    assert for_preset(rc, "vllm").max_total_tokens is None and for_preset(rc, "vllm").max_num_seqs == 64
    rows, _, _ = compare(rc, CompareConfig(policies=["slora", "vllm"], rps=[1.0], slo=5.0, jobs=1))
    assert [r["policy"] for r in rows] == ["slora", "vllm"] and all(r["finished"] > 0 for r in rows)


def test_a_comparison_gives_kv_tokens_to_vllm_and_max_total_tokens_to_slora():
    """``twin compare --policies slora,vllm --kv-tokens K --max-total-tokens N``: N sizes the S-LoRA preset's pool,
    K the vLLM preset's KV cache (``for_preset``); neither run refuses the pair, which ``twin run`` on S-LoRA does
    (both would size its one pool)."""
    from twin.scenario import check_run, for_preset

    rc = RunConfig(trace="synthetic", duration=5.0, kv_tokens=100_000, max_total_tokens=50_000)
    s, v = for_preset(rc, "slora"), for_preset(rc, "vllm")
    assert (s.kv_tokens, s.max_total_tokens) == (None, 50_000) and (v.kv_tokens, v.max_total_tokens) == (100_000, None)
    check_run(s)
    check_run(v)
    with pytest.raises(ConfigError, match="both size S-LoRA's one pool"):
        check_run(dataclasses.replace(rc, policy="slora"))


def test_a_comparison_across_serving_systems_serves_one_set_of_adapters():
    """S-LoRA adapts q, k, v and o only; vLLM's default is the profile's targets (all seven projections). A
    comparison of presets on both engines gives every preset qkvo unless --lora-targets is given (then that set
    to all), so both serve the same adapters; a comparison on one engine keeps its default. On vLLM the targets
    set the adapters' bytes, so their loads (a profile whose loads follow the bytes: the A40's link model)."""
    from twin.compare import CompareConfig, common_adapters, compare

    rc = RunConfig(trace="synthetic", duration=20.0, adapters=8, ranks=[32], profile="llama-2-7b_a40_vidur")
    assert common_adapters(rc, ["slora", "vllm"]).lora_targets == "qkvo"
    assert common_adapters(rc, ["vllm", "vllm-paged"]).lora_targets is None
    assert common_adapters(rc, ["slora", "chameleon"]).lora_targets is None
    given = dataclasses.replace(rc, lora_targets="all")
    assert common_adapters(given, ["slora", "vllm"]).lora_targets == "all"
    opts = CompareConfig(policies=["slora", "vllm"], rps=[1.0], slo=5.0, jobs=1)
    mixed = {r["policy"]: r for r in compare(rc, opts)[0]}
    alone = {r["policy"]: r for r in compare(rc, dataclasses.replace(opts, policies=["vllm"]))[0]}
    qkvo = {r["policy"]: r for r in compare(dataclasses.replace(rc, lora_targets="qkvo"),
                                            dataclasses.replace(opts, policies=["vllm"]))[0]}
    assert mixed["vllm"]["ttft_ms_p99"] == qkvo["vllm"]["ttft_ms_p99"] < alone["vllm"]["ttft_ms_p99"]


def test_the_pool_from_gpu_memory_reserves_no_slot_buffers():
    """With ``--gpu-mem-gb``, vLLM's KV cache is what the weights and the slots' LoRA buffers leave;
    S-LoRA's unified pool keeps no per-slot buffers (pool_size_lora 0), so ``--slots`` does not shrink it."""
    from twin.compare import load_compare_profile
    from twin.scenario import build_engine_config, build_workload

    def kv(policy, slots):
        rc = RunConfig(trace="synthetic", duration=5.0, policy=policy, gpu_mem_gb=80.0, slots=slots,
                       max_lora_rank=64)
        return build_engine_config(rc, build_workload(rc), load_compare_profile(rc.profile, None)).kv_capacity_tokens

    assert kv("slora", 2) == kv("slora", 16)
    assert kv("vllm", 2) > kv("vllm", 16)


def test_failed_admission_is_retried_every_iteration():
    # r1 (100, 30) against r0 (100, 50) in 260 slots: refused at 0.11 (need 270); s decodes later the
    # need is 288 - s (see above), below 260 from s = 29: admitted at 0.40, not at a multiple of 11
    # iterations (a failed attempt does not count, so the next iteration tries again)
    w = base([0.0, 0.001], [100, 100], [50, 30])
    r = run(w, n_tok=260).requests
    assert r.loc[1, "first_scheduled_s"] == pytest.approx(0.40)


def test_head_of_line_stop():
    # at 0.11 r0 (300, 200) is (188, 311): r1 (1000, 100) needs 1312 + 2*99 = 1510 > 1400 slots and
    # only more as r0 grows, until r0 finishes (2.00; the router then polls: 2.01); r2 (5, 5),
    # arrived after r1, needs 325 and would fit, but FIFO stops at r1
    w = base([0.0, 0.001, 0.002], [300, 1000, 5], [200, 100, 5])
    r = run(w, n_tok=1400).requests
    assert r.loc[0, "finish_s"] == pytest.approx(2.00)
    assert r.loc[1, "first_scheduled_s"] == pytest.approx(2.01)
    assert r.loc[2, "first_scheduled_s"] == r.loc[1, "first_scheduled_s"]
    # SJF orders the queue its own way: the short r2 goes first (the test is the same)
    r_sjf = run(w, n_tok=1400, policy="slora+sjf").requests
    assert r_sjf.loc[2, "first_scheduled_s"] == pytest.approx(0.11)


# ---------------------------------------------------------------------- iterations and the pool
def pressure_workload(seed: int, n: int = 60) -> Workload:
    rng = np.random.default_rng(seed)
    ad = rng.integers(-1, 10, n)
    return Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), rng.integers(1, 1200, n),
                                rng.integers(1, 300, n), ad, np.where(ad >= 0, np.array([8, 16, 32, 64])[ad % 4], 0))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from(["slora", "chameleon", "slora+sjf"]))
def test_pool_never_overflows_no_preemption_no_mixed_steps(seed, policy):
    """Invariants at every step (pool KV + adapters <= N_tok, reservations + adapters <= N_tok)
    under pressure; no preemption; prefill and decode never share an iteration; every request
    is finished or rejected with a reason."""
    res = run(pressure_workload(seed), n_tok=4000, policy=policy)
    s, steps = res.summary, res.steps
    assert s["preemptions"] == 0 or policy == "chameleon"  # only Chameleon's own squash preempts
    assert not ((steps["prefill_tokens"] > 0) & (steps["decode_tokens"] > 0)).any()
    assert (steps["kv_blocks_used"] <= 4000).all()
    assert s["requests_finished"] + s["requests_rejected"] == s["requests_arrived"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from(["slora", "chameleon", "chameleon-lru", "chameleon+prefetch"]),
       st.sampled_from([4000, 20_000]))
def test_the_batch_s_ranks_and_slots_are_kept_as_adapters_join_and_leave(seed, policy, n_tok):
    """The largest rank of the batch (each decode) and its adapters' pool slots (each admission) were sums
    over the batch's adapters, O(adapters in the batch) each time; they are kept as adapters join and leave.
    The invariants compare them with the sums at every step, and the results equal those of the sums."""
    w = pressure_workload(seed)
    kept = run(w, n_tok=n_tok, policy=policy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SLoRAEngine, "_batch_changed", lambda e, a: None)
        mp.setattr(SLoRAEngine, "_batch_slots", property(lambda e: sum(e.adapters.placement.ab[a] for a in e.adapters.batch),
                                                          lambda e, v: None), raising=False)
        mp.setattr(SLoRAEngine, "_batch_max_rank",
                   lambda e: max((int(e.adapter_rank[a]) for a in e.adapters.batch), default=0))
        prof = constant_profile(c0=STEP, kv_tokens=200_000)
        summed = simulate(w, prof, EngineConfig(max_total_tokens=n_tok), policy=policy)
    pd.testing.assert_frame_equal(kept.requests, summed.requests, check_exact=True)
    pd.testing.assert_frame_equal(kept.steps, summed.steps, check_exact=True)


def test_decode_runs_are_exact():
    for policy in ("slora", "chameleon"):
        for n_tok in (3000, 60_000):
            a = run(pressure_workload(3), n_tok=n_tok, policy=policy)
            b = run(pressure_workload(3), n_tok=n_tok, policy=policy, steps=1)
            pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
            assert a.summary["step_segments"] < b.summary["step_segments"]


def test_decode_run_durations_are_decode_s_written_out():
    """A decode run prices each step on the run's constants (the host and LoRA terms once, the backbone per step):
    bit for bit the :meth:`SLoRAEngine._decode_s` of that step, on every kind of shipped backbone."""
    rng = np.random.default_rng(5)
    for name in ("llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085", "llama-2-7b_a100-80gb_vidur", None):
        prof = load_profile(name)
        e = simulate(adapter_workload(), prof, EngineConfig(), policy="slora", cache="lru").engine
        for _ in range(200):
            n, max_r = int(rng.integers(1, 600)), int(rng.choice([8, 16, 32, 64]))
            e.rank_sum = int(rng.integers(n, n * max_r + 1))
            cpu, lora = e._step_cpu_s(), e.lora_cost.decode_s(e.rank_sum, max_r, n)
            ctx = int(rng.integers(0, 300_000))
            assert cpu + (prof.backbone_s(0, n, ctx) + lora) == e._decode_s(n, ctx, max_r)


class _HearsArrivals(SLoRAScheduler):
    """S-LoRA's scheduler with an ``on_arrivals`` of its own (doing nothing): its runs end at every arrival."""

    def on_arrivals(self, lo: int, hi: int) -> None:
        pass


@pytest.mark.parametrize("cache,prefetch", [("none", False), ("lru", False), ("chameleon", False), ("lru", True)])
def test_counting_runs_go_on_over_arrivals_exactly(cache, prefetch):
    """While no admission is due (S-LoRA's counter below max_wait_tokens) and the scheduler does nothing on arrivals,
    a decode run goes on over them: the same outcomes as stepping one iteration at a time and as a scheduler whose
    runs end at each arrival, in fewer segments (the arrivals before a run's last step join the queue ahead of its
    finishes, so a cache policy's idle decisions see the queue stepping shows them)."""
    w = random_workload(n=700, rps=7.0, adapters=40, seed=3)
    prof = load_profile(None)
    cfg = EngineConfig(slora_prefetch=prefetch)
    a = simulate(w, prof, cfg, system="slora", scheduler="slora", cache=cache)
    b = simulate(w, prof, cfg, system="slora", scheduler="slora", cache=cache, max_run_steps=1)
    c = simulate(w, prof, cfg, system="slora", scheduler_obj=_HearsArrivals(), cache=cache)
    assert a.engine._arrivals_inert and not c.engine._arrivals_inert
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, c.requests, check_exact=True)
    assert a.summary["step_segments"] < c.summary["step_segments"] < b.summary["step_segments"]
    assert a.summary["engine_steps"] == b.summary["engine_steps"] == c.summary["engine_steps"]


# ---------------------------------------------------------------------- adapters
def adapter_workload():
    # adapter 0 (rank 16) twice, apart; adapter 1 in between
    return Workload.from_arrays([0.0, 1.0, 3.0], [50, 50, 50], [5, 5, 5], [0, 1, 0], [16, 8, 16])


def test_eager_eviction_and_load_volume():
    res = run(adapter_workload())
    s, e = res.summary, res.engine
    assert s["adapter_loads"] == 3 and s["adapter_evictions"] == 3  # none cache: evicted after each finish
    assert not any(e.adapters.resident)
    prof = e.profile
    nbytes = 2 * (2 * prof.adapter_bytes(16) + prof.adapter_bytes(8))  # each load moves 2x the adapter
    assert s["link_gb"] == pytest.approx(nbytes / 1e9)
    assert res.requests.loc[0, "load_wait_s"] == pytest.approx(slora_load_s(prof, prof.adapter_bytes(16)))
    # q, k, v, o only (S-LoRA): 4r slots per adapter would be Llama-2-7B; here slots follow the bytes
    assert prof.lora_targets == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_a_cache_policy_keeps_idle_adapters_in_the_pool():
    res = run(adapter_workload(), cache="lru")
    s = res.summary
    assert s["adapter_loads"] == 2 and s["adapter_evictions"] == 0  # adapter 0 hit at its second request
    assert res.requests.loc[2, "adapter_hit"]


def test_idle_cached_adapters_give_way_to_reservations():
    # 12 adapters of rank 64 cached by LRU in a small pool: admissions evict them, never overflow
    rng = np.random.default_rng(1)
    n = 80
    ad = rng.integers(0, 12, n)
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), rng.integers(10, 400, n), rng.integers(5, 100, n),
                             ad, np.full(n, 64))
    res = run(w, n_tok=6_000, cache="lru")
    assert res.summary["slora_reservation_evictions"] > 0


def test_an_offload_skips_a_cache_that_keeps_every_idle_adapter(monkeypatch):
    """``_evict_idle`` (S-LoRA's ``offload_adapters``) after each finish asked the cache about every idle
    cached adapter, O(adapters) per decode; a cache that never discards one (``evict_when_idle`` not
    overridden) is not asked. The results equal a run whose cache says False itself (the full scan),
    and the offloads visit no adapter."""
    class KeepAll(LRUCache):  # the same answers, given by an override: the engine scans
        name = "t-keep-all"

        def evict_when_idle(self, a: int) -> bool:
            return False

    rng = np.random.default_rng(3)
    n = 120
    ad = rng.integers(0, 40, n)
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.04, n)), rng.integers(10, 400, n), rng.integers(5, 80, n),
                             ad, np.where(ad % 2, 8, 64))
    visited = []
    scan = AdapterMemory.evictable

    def counted(self):
        out = scan(self)
        visited.append(len(out))
        return out
    monkeypatch.setattr(AdapterMemory, "evictable", counted)
    prof = constant_profile(c0=STEP, kv_tokens=200_000)
    cfg = EngineConfig(max_total_tokens=9_000)
    runs = {}
    for cache in (LRUCache(adapter_memory="unified"), KeepAll(adapter_memory="unified")):
        visited.clear()
        runs[cache.name] = simulate(w, prof, cfg, policy="slora", cache_obj=cache, check_invariants=True)
        runs[cache.name + " visited"] = sum(visited)
    assert runs["lru"].engine.adapters.keeps_idle and not runs["t-keep-all"].engine.adapters.keeps_idle
    assert runs["lru"].summary["slora_reservation_evictions"] > 0  # (idle adapters were cached, then gave way)
    pd.testing.assert_frame_equal(runs["lru"].requests, runs["t-keep-all"].requests)
    pd.testing.assert_frame_equal(runs["lru"].steps, runs["t-keep-all"].steps)
    assert runs["lru visited"] == 0 < runs["t-keep-all visited"]
    plug = LRUCache()
    plug.evict_when_idle = lambda a: a % 2 == 0  # an instance's own answer
    link = runs["lru"].engine.link
    for cache, keeps in ((LRUCache(), True), (KeepAll(), False), (NoCache(), False), (plug, False)):
        assert AdapterMemory(np.array([8]), prof, 1, 1, cache, link).keeps_idle is keeps


def test_rejection_reasons():
    w = base([0.0, 0.1, 0.2, 0.3], [2100, 2000, 900, 10], [10, 1100, 200, 10])
    r = run(w, n_tok=1000).requests
    assert list(r["reject_reason"]) == ["prompt longer than the S-LoRA server's max prompt length",
                                        "prompt + output exceed the S-LoRA server's max request length",
                                        "prompt + output + 1 exceed S-LoRA's max_total_token_num", ""]
    # configurable limits
    r2 = run(w, n_tok=1000, slora_max_prompt_len=4096, slora_max_total_len=4096).requests
    assert r2.loc[0, "reject_reason"] == "prompt + output + 1 exceed S-LoRA's max_total_token_num"
    # a request whose adapter never fits beside it (S-LoRA would block its queue forever)
    wa = Workload.from_arrays([0.0], [500], [400], [0], [128])
    assert run(wa, n_tok=1000).requests.loc[0, "reject_reason"] == "request and its adapter can never fit S-LoRA's pool"


def test_a_prompt_no_prefill_mini_batch_holds_is_rejected_not_stranded():
    """S-LoRA prefills a request whole, within batch_max_tokens: a longer prompt was never admitted and
    stranded every request behind it in the FIFO queue, with no reason (both ended 'unfinished' and the run
    stopped). S-LoRA's start-up assert (batch_max_tokens >= max_req_total_len, ``api_server.py``) keeps every
    request its HTTP server accepts within one mini-batch: a longer one is refused for its length."""
    w = base([0.0, 1.0], [1500, 100], [10, 10])
    with pytest.raises(ConfigError, match="batch_max_tokens >= max_req_total_len"):
        simulate(w, constant_profile(c0=0.01, kv_tokens=40000),
                 EngineConfig(max_loras=2, max_model_len=4096, slora_batch_max_tokens=1024), policy="slora")
    res = simulate(w, constant_profile(c0=0.01, kv_tokens=40000),
                   EngineConfig(max_loras=2, max_model_len=4096, slora_batch_max_tokens=1024, slora_max_total_len=1024),
                   policy="slora")
    r = res.requests
    assert r.loc[0, "reject_reason"] == "prompt + output exceed the S-LoRA server's max request length"
    assert r.loc[1, "outcome"] == "finished" and res.summary["requests_rejected"] == 1
    # the default (max(N_tok / 6, 3072)) holds it
    res = simulate(w, constant_profile(c0=0.01, kv_tokens=40000), EngineConfig(max_loras=2, max_model_len=4096),
                   policy="slora")
    assert list(res.requests["outcome"]) == ["finished", "finished"]


def test_a_squash_whose_recompute_no_mini_batch_holds_leaves_the_request_running():
    """A squashed request waits to recompute prompt + emitted tokens in one prefill: past batch_max_tokens it
    could never be admitted again (it ended 'unfinished', with every request behind it). S-LoRA's start-up
    assert (batch_max_tokens >= max_req_total_len) makes every recompute fit; the guard is checked on an engine
    whose mini-batch is set below it."""
    from policies.slora import SLoRAScheduler

    class Squasher(SLoRAScheduler):
        name = "t-squasher"
        uses_events = True

        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            if lo == 0:
                self.engine.push_event(0.5, lambda now: self.engine.squash(0))

    w = base([0.0, 0.1], [1000, 10], [200, 10])
    from twin.requests import FINISHED

    eng = SLoRAEngine(w, constant_profile(c0=0.01, kv_tokens=40000), EngineConfig(max_loras=2, max_model_len=4096),
                      Squasher(), NoCache())
    eng.batch_max_tokens = 1024
    eng.run()
    assert (eng.state == FINISHED).all() and eng.rec.preemptions == 0
    # a recompute that fits is squashed and finishes
    res = simulate(w, constant_profile(c0=0.01, kv_tokens=40000),
                   EngineConfig(max_loras=2, max_model_len=4096, slora_batch_max_tokens=3072),
                   system="slora", scheduler_obj=Squasher(), cache="none")
    assert list(res.requests["outcome"]) == ["finished", "finished"] and res.summary["preemptions"] == 1


def test_tensor_parallel_is_refused():
    with pytest.raises(ConfigError, match="world_size == 1"):
        check_run(RunConfig(policy="slora", tp=2))
    with pytest.raises(ConfigError, match="world_size == 1"):
        check_run(RunConfig(policy="vllm", system="slora", tp=2))
    with pytest.raises(ConfigError, match="unknown serving system"):
        check_run(RunConfig(system="tgi"))
    with pytest.raises(ConfigError, match="world_size == 1"):
        simulate(base([0.0], [10], [5]), constant_profile(), EngineConfig(tensor_parallel=2), policy="slora")


# ---------------------------------------------------------------------- LoRA compute
def test_punica_cost_follows_ranks_not_resident_adapters():
    c = PunicaLoraCost.from_profile(load_profile(None).with_lora_targets("qkvo"))
    fixed = c.decode_s(0, 32, 8)
    assert c.decode_s(256, 32, 8) - fixed == pytest.approx(2 * (c.decode_s(128, 32, 8) - fixed))
    assert c.decode_s(128, 64, 8) > c.decode_s(128, 32, 8)  # the expand is padded to the max rank
    # engine: a decode step's time depends on the batch's ranks, not on the adapters resident
    prof = load_profile(None)
    e = simulate(adapter_workload(), prof, EngineConfig(), policy="slora", cache="lru").engine
    e.rank_sum = 64
    before = e._decode_s(4, 1000, 32)
    for a in range(e.n_adapters):  # every adapter resident (idle, cached)
        if not e.adapters.resident[a]:
            e.adapters.placement.allocate(a, 0.0)
            e.adapters.mark_resident(a)
    assert e._decode_s(4, 1000, 32) == before
    # (vLLM's kernel grid pays for every slot)
    assert prof.lora_s(0.0, 2, 32, 4, 64, 4) > prof.lora_s(0.0, 2, 32, 4, 8, 4)


def test_lora_targets_drive_compute_on_slora_and_bytes_on_both_systems():
    """S-LoRA's Punica kernels compute the adapted projections only; vLLM 0.8.5 wraps every linear layer in a LoRA
    layer and runs its kernels on all of them for every slot (``get_supported_lora_modules``; a module an adapter
    lacks is zeros in its slot), so there the targets set the adapter's bytes (loads), not the compute."""
    prof = load_profile(None)
    qkvo, full = PunicaLoraCost.from_profile(prof.with_lora_targets("qkvo")), PunicaLoraCost.from_profile(prof)
    assert full.decode_s(128, 32, 8) > qkvo.decode_s(128, 32, 8)
    g_all, g_qkvo = prof.components["lora"], prof.with_lora_targets("qkvo").components["lora"]
    assert isinstance(g_all, KernelGridLora)
    assert prof.with_lora_targets("qkvo").lora_s(0.0, 4, 32, 16, 8, 16) == prof.lora_s(0.0, 4, 32, 16, 8, 16)
    assert g_qkvo.predict(0.0, 4, 32, 16, 8, 16) == g_all.predict(0.0, 4, 32, 16, 8, 16)
    assert prof.with_lora_targets("qkvo").adapter_bytes(32) < prof.adapter_bytes(32)
    a40 = load_profile("llama-2-7b_a40_vidur")  # (loads by the link model; the H100 profile's are measured per rank)
    assert a40.with_lora_targets("qkvo").load_s(32, "cpu") < a40.load_s(32, "cpu")
    w = pressure_workload(7)
    t = [simulate(w, prof, EngineConfig(max_total_tokens=60_000, lora_targets=lt), policy="slora",
                  system="slora").summary["tpot_ms_mean"] for lt in ("qkvo", "all")]
    assert t[1] > t[0]
    v = [simulate(w, prof, EngineConfig(lora_targets=lt), policy="slora", system="vllm").summary
         for lt in ("qkvo", "all")]
    assert v[0]["link_gb"] < v[1]["link_gb"]  # smaller adapters copied


def test_summary_names_the_system():
    w = base([0.0], [10], [5])
    assert run(w).summary["system"] == "slora"
    assert simulate(w, constant_profile(), EngineConfig(), policy="slora", system="vllm").summary["system"] == "vllm"
    assert simulate(w, constant_profile(), EngineConfig(), policy="vllm").summary["system"] == "vllm"


def test_cli_names_the_system(capsys):
    from twin.cli import main

    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "chameleon              [system slora]" in out and "fastlibra              [system vllm]" in out
    assert main(["run", "--policy", "slora", "--duration", "20", "--no-progress"]) == 0
    assert "system                                   slora" in capsys.readouterr().out
    assert main(["run", "--policy", "vllm", "--system", "slora", "--duration", "20", "--max-total-tokens", "50000",
                 "--json", "--no-progress"]) == 0
    assert '"system": "slora"' in capsys.readouterr().out
    assert main(["run", "--policy", "vllm", "--max-total-tokens", "50000"]) == 2
    assert "--max-total-tokens sizes S-LoRA's pool" in capsys.readouterr().err


def test_the_latest_prefetchs_adapters_survive_a_partial_offload_and_go_when_the_batch_empties():
    """S-LoRA (refs/slora.md section 4): adapters tagged by the latest prefetch are protected from the offload after
    a decode in which a request finished, and every adapter is freed when the batch empties. r1's adapter is
    prefetched at counter 7 and r1 finishes while r0 decodes: r2 (same adapter) then finds it resident (it was
    evicted with r1's finish); after the batch emptied, r3 loads it again (a prefetched adapter was kept)."""
    w = Workload.from_arrays([0.0, 0.075, 0.3, 2.0], [10, 10, 10, 10], [60, 3, 3, 3], [0, 1, 1, 1], [16, 16, 16, 16])
    res = run(w, slora_prefetch=True)
    r = res.requests
    assert res.summary["prefetches"] == 1 and r.loc[1, "load_wait_s"] == 0.0
    assert bool(r.loc[2, "adapter_hit"]) and r.loc[2, "load_wait_s"] == 0.0
    assert not bool(r.loc[3, "adapter_hit"]) and r.loc[3, "load_wait_s"] > 0


def test_prefetch_at_decode_counters_five_and_seven():
    # r1 waits while r0 decodes; with --prefetch its adapter is copied before the decode at
    # counter 5, so its prefill (after 10 decodes) waits for no load
    w = Workload.from_arrays([0.0, 0.001], [10, 10], [40, 5], [0, 1], [16, 16])
    off = run(w).requests
    res = run(w, slora_prefetch=True)
    on = res.requests
    assert off.loc[1, "load_wait_s"] > 0 and on.loc[1, "load_wait_s"] == 0.0
    assert res.summary["prefetches"] == 1 and bool(on.loc[1, "adapter_hit"])
    assert on.loc[1, "first_scheduled_s"] == off.loc[1, "first_scheduled_s"]  # admitted at the same iteration
    assert on.loc[1, "ttft_s"] == pytest.approx(off.loc[1, "ttft_s"] - off.loc[1, "load_wait_s"])
    for policy in ("slora", "chameleon", "chameleon+prefetch"):
        a = run(pressure_workload(4), n_tok=5000, policy=policy, slora_prefetch=True)
        b = run(pressure_workload(4), n_tok=5000, policy=policy, slora_prefetch=True, steps=1)
        pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
        assert a.summary["prefetches"] > 0, policy


@pytest.mark.parametrize("policy", ["slora", "chameleon", "vllm"])
def test_a_step_row_lasts_from_its_start_to_its_end_on_either_engine(policy):
    """``steps.parquet``'s ``duration_s`` is the row's time (``t_end - t_start``: every step of a run of decode
    steps, and the loads on its path) on both engines; the S-LoRA engine's rows of several steps held the first
    step's duration, so the column summed to a seventh of the GPU's busy time on a splitwise run."""
    from traces.registry import get_workload

    w = get_workload("synthetic", rps=2.0, duration=60.0, seed=3)
    res = simulate(w, load_profile(None), EngineConfig(max_loras=8) if policy == "vllm" else EngineConfig(),
                   policy=policy)
    st_ = res.steps
    assert (st_["n_steps"] > 1).any()  # (runs of decode steps are recorded as one row)
    np.testing.assert_allclose(st_["duration_s"], st_["t_end"] - st_["t_start"], rtol=1e-9, atol=1e-12)
    assert st_["duration_s"].sum() / res.summary["simulated_s"] == pytest.approx(res.summary["gpu_busy_fraction"])


def test_an_slora_runs_summary_records_only_the_settings_its_engine_reads(tmp_path):
    """The summary's ``config`` of an S-LoRA run left vLLM's settings in (``max_loras`` 101, ``max_num_seqs`` 256,
    ``adapter_memory: 'slots'``), which read as the run's while the engine ignores them and refuses their flags."""
    import json

    from twin.cli import main
    from twin.slora_engine import VLLM_ONLY_CONFIG

    assert main(["run", "--policy", "slora", "--duration", "20", "--no-progress", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert not set(VLLM_ONLY_CONFIG) & set(s["config"]) and s["adapter_memory"] == "unified"
    assert {"max_total_tokens", "running_max_req_size", "slora_max_wait_tokens", "block_size"} <= set(s["config"])


@pytest.mark.parametrize("policy", ["vllm", "slora"])
def test_a_run_of_decode_steps_ends_on_the_summed_clock_and_samples_the_steps(policy):
    """The run's delay `end - now` cannot always land on `end` (`now + delay` rounds past it either way):
    the clock ended the run one ulp early, so every later time differed from stepping one iteration at a
    time. And one step's ITL sample was its clock difference, not its duration (an ulp apart)."""
    prof = constant_profile(c0=0.0065886838, kv_tokens=40_000)
    w = Workload.from_arrays([0.5118216247002567], [20], [900], [0], [8])
    cfg = EngineConfig(max_loras=2, max_model_len=2048)
    a, b = (simulate(w, prof, cfg, policy=policy, max_run_steps=k) for k in (None, 1))
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    for k in ("itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "simulated_s"):
        assert a.summary[k] == b.summary[k], k
    w = Workload.from_arrays([1000.3], [100], [2], [0], [8])
    a, b = (simulate(w, constant_profile(c0=0.01, kv_tokens=40_000), cfg, policy=policy, max_run_steps=k)
            for k in (None, 1))
    assert a.summary["itl_ms_p50"] == b.summary["itl_ms_p50"]


def test_failed_admission_attempts_are_counted_as_stepping_counts_them():
    """Admission is attempted at every iteration once it is due; a run of decode steps made one attempt for
    all of them (3 attempts against stepping's 91)."""
    prof = constant_profile(c0=0.01, kv_tokens=10_000)
    w = Workload.from_arrays([0.0, 0.001], [100, 100], [100, 10], [0, 0], [8, 8])
    cfg = EngineConfig(max_loras=2, max_model_len=2048, running_max_req_size=1)
    a, b = (simulate(w, prof, cfg, policy="slora", max_run_steps=k) for k in (None, 1))
    for k in ("slora_admission_attempts", "slora_failed_admissions"):
        assert a.summary[k] == b.summary[k] > 50, k
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)


def test_an_unloaded_request_is_priced_by_the_engine_it_runs_on():
    """``EngineView.unloaded_service_s`` (Chameleon's "low-load execution time", the base of its quota SLO): on
    the S-LoRA engine a lone request's prefill and decode steps as that engine prices its iterations (S-LoRA's
    Punica LoRA cost), on the vLLM engine the profile's step time with vLLM's kernel grid over the slots. Chameleon
    on S-LoRA priced it with vLLM's kernel grid until stop 56."""
    from twin.engine import Engine
    from twin.registry import make_cache, make_scheduler

    prof = load_profile(None)
    w = Workload.from_arrays([0.0, 1.0], [800, 300], [100, 50], [0, 1], [32, 16])
    cfg = EngineConfig(max_loras=16, max_lora_rank=32)
    sl = SLoRAEngine(w, prof, cfg, make_scheduler("slora"), NoCache())
    vl = Engine(w, prof, cfg, make_scheduler("fcfs"), make_cache("lru"))
    n_in, n_out, r = 800.0, 100.0, 32
    ctx = 850
    cpu = sl.profile.scheduler_s(1, 0, 0, sl.served)
    want = (cpu + sl.profile.backbone_s(800, 0, 0) + sl.lora_cost.prefill_s(800 * r, 800, r, 1, 800)
            + n_out * (cpu + sl.profile.backbone_s(0, 1, ctx) + sl.lora_cost.decode_s(r, r, 1)))
    assert sl.unloaded_service_s(n_in, n_out, r) == pytest.approx(want, rel=1e-12)
    want_v = (prof.step_s(800, 0, 0, 1, 1, r, 16, 1, 0, vl.served)
              + n_out * prof.step_s(0, 1, ctx, 1, 1, r, 16, 1, 0, vl.served))
    assert vl.unloaded_service_s(n_in, n_out, r) == pytest.approx(want_v, rel=1e-12)
    assert sl.unloaded_service_s(n_in, n_out, r) != pytest.approx(want_v, rel=1e-3)


# ---------------------------------------------------------------------- audit fixes: batch_max_tokens, prefetch
def test_batch_max_tokens_floors_at_the_max_request_length():
    """S-LoRA's ``api_server.py``: ``batch_max_tokens = max(int(max_total_token_num / 6), max_req_total_len)`` when
    not given (slora.md section 2.7's 3072 is the default max_req_total_len), and an assert ``batch_max_tokens >=
    max_req_total_len`` otherwise. The floor was a fixed 3072: with --slora-max-total-len 16384, prompts of 4000
    tokens were rejected as longer than one mini-batch, which S-LoRA serves."""
    from twin.slora_engine import batch_max_tokens

    assert batch_max_tokens(EngineConfig(), 20000) == 3333
    assert batch_max_tokens(EngineConfig(), 14500) == 3072
    assert batch_max_tokens(EngineConfig(slora_max_total_len=16384), 20000) == 16384
    assert batch_max_tokens(EngineConfig(slora_max_total_len=16384), 120000) == 20000
    assert batch_max_tokens(EngineConfig(slora_batch_max_tokens=5000, slora_max_total_len=4096), 20000) == 5000
    w = Workload.from_arrays(np.arange(6) * 0.5, [4000] * 6, [50] * 6, [0, 1] * 3, [8, 64] * 3)
    res = run(w, n_tok=20000, slora_max_prompt_len=8192, slora_max_total_len=16384)
    assert res.summary["slora_batch_max_tokens"] == 16384
    assert res.summary["requests_rejected"] == 0 and res.summary["requests_finished"] == 6
    for bmt in (1000, 16383):  # below the max request length: refused, as S-LoRA's assert refuses it
        with pytest.raises(ConfigError, match="S-LoRA refuses to start .*batch_max_tokens >= max_req_total_len"):
            run(w, n_tok=20000, slora_max_prompt_len=8192, slora_max_total_len=16384, slora_batch_max_tokens=bmt)
    with pytest.raises(ConfigError, match="--slora-batch-max-tokens 3071 is below --slora-max-total-len 3072"):
        run(w, n_tok=20000, slora_batch_max_tokens=3071)


def test_queued_request_prefetch_has_no_cap_in_flight():
    """S-LoRA's --prefetch (slora.md section 4, checklist 13): the adapters of next_batch() -- here 8 waiting requests
    of 8 adapters -- are all copied on the separate stream (no bound on the copies in flight). The twin stopped at 4
    in flight, so 4 adapters were loaded synchronously in the prefill (the audit's repro: prefetches 4, late hits 3,
    adapter loads 9)."""
    prof = constant_profile(c0=0.01, kv_tokens=200_000)
    prof.components["load"].params["cpu_gbps"] = 0.5
    n = 8
    w = Workload.from_arrays([0.0] + [0.005] * n, [16] * (n + 1), [400] + [5] * n, list(range(n + 1)), [8] * (n + 1))
    res = simulate(w, prof, EngineConfig(max_total_tokens=20000, slora_prefetch=True), policy="slora",
                   check_invariants=True)
    s = res.summary
    assert s["prefetches"] == n and s["adapter_loads"] == n + 1
    assert res.requests.loc[1:, "adapter_hit"].all()
    prefill = res.steps[res.steps["prefill_tokens"] == 16 * n]
    assert len(prefill) == 1 and int(prefill["loads_started"].iloc[0]) == 0  # it only waits for the copies in flight


@pytest.mark.parametrize("policy", ["slora", "slora+sjf", "chameleon", "chameleon+prefetch"])
def test_queued_request_prefetch_stops_at_the_first_adapter_that_does_not_fit(monkeypatch, policy):
    """S-LoRA's loader (slora.md section 4) loads the next batch's non-resident adapters in order, "stopping before
    total 4r exceeds the free slots": r2's rank-16 adapter does not fit the slots left after r1's, so r3's rank-8
    adapter behind it, which would, is not tried (the twin skipped r2's and copied r3's). Chameleon keeps S-LoRA's
    queued-request prefetch (chameleon.md sections 1-2), naming its queues' heads: the same loader."""
    from twin.slora_engine import SLoRAPrefetcher

    calls: list[tuple[float, int, bool]] = []
    start = SLoRAPrefetcher.start

    def logged(self, a, now, ctx=None, evict=True):
        ok = start(self, a, now, ctx, evict)
        calls.append((now, a, ok))
        return ok

    monkeypatch.setattr(SLoRAPrefetcher, "start", logged)
    w = Workload.from_arrays([0.0, 0.005, 0.005, 0.005], [16] * 4, [400, 5, 5, 5], [0, 1, 2, 3], [8, 8, 16, 8])
    # N_tok: r0's reservation (416) + its adapter's slots and two rank-8 adapters' (104 each) + 2: after r1's adapter,
    # 106 slots are free -- r3's 104 would fit, r2's 208 do not
    opts = {"prefetch_heads": 3} if policy.startswith("chameleon") else None  # (its heads: r1, r2 and r3)
    res = simulate(w, constant_profile(c0=0.01, kv_tokens=200_000), EngineConfig(max_total_tokens=730,
                   slora_prefetch=True), policy=policy, check_invariants=True, scheduler_opts=opts)
    assert res.engine.adapters.placement.ab[:4] == [104, 104, 208, 104]
    t0 = calls[0][0]
    assert [(a, ok) for t, a, ok in calls if t == t0] == [(1, True), (2, False)]
    assert res.summary["requests_finished"] == 4


# ---------------------------------------------------------------------- the admission test as a what-if
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 400)), max_size=12), st.integers(0, 300),
       st.integers(1, 400), st.integers(0, 50), st.data())
def test_need_without_is_the_need_of_the_remaining_pairs(pairs, left, has, g, data):
    """``Reservations.need_without`` (a what-if: the need with a candidate, some running requests gone) equals
    :func:`reservation_need` of the remaining pairs and the candidate, and changes nothing."""
    res = Reservations()
    res.g = 0
    for i, (lft, h) in enumerate(pairs):
        res.add(lft, h, i)
    res.g = g  # (read at decode count g: every left one lower and every has one higher per decode)
    gone = set(data.draw(st.lists(st.integers(0, max(len(pairs) - 1, 0)), max_size=len(pairs))) if pairs else [])
    kept = [(lft - g, h + g) for i, (lft, h) in enumerate(pairs) if i not in gone]
    before = (res.n, res.nf.copy(), res.t.copy(), list(res.rids))
    assert res.need_without(left, has, gone) == reservation_need(kept + [(left, has)])
    assert res.need_without(left, has, set()) == res.need_with(left, has)
    assert (res.n, list(res.rids)) == (before[0], before[3])
    assert (res.nf == before[1]).all() and (res.t == before[2]).all()


def _at(w, prof, cfg, horizon):
    """An S-LoRA engine (FIFO) run to ``horizon`` (deterministic: every call gives the same state)."""
    from twin.registry import make_scheduler

    eng = SLoRAEngine(w, prof, cfg, make_scheduler("slora"), NoCache(), horizon_s=horizon)
    eng.env.run(until=eng.proc)
    return eng


@pytest.mark.parametrize("horizon", [3.0, 6.0, 9.0])
def test_admits_without_is_the_admission_test_once_the_requests_are_squashed(horizon):
    """``SLoRAEngine.admits_without(head, gone)`` -- Chameleon's squash test on this engine -- is what S-LoRA's
    admission test (``_try_admit``, a fresh attempt) says of ``head`` once the running requests ``gone`` have been
    squashed, and it changes nothing."""
    from twin.interfaces import Admit
    from twin.slora_engine import SLoRAStepContext

    w = pressure_workload(3, n=80)
    prof = constant_profile(c0=STEP, kv_tokens=200_000)
    cfg = EngineConfig(max_total_tokens=4000)
    eng = _at(w, prof, cfg, horizon)
    heads = [int(r) for r in eng.waiting_ids()[:3]]
    dec = sorted(eng.dec)
    assert heads and len(dec) >= 2
    cases = [(h, (b,)) for h in heads for b in dec] + [(h, tuple(dec[:k])) for h in heads for k in (0, 2, len(dec))]
    seen = set()
    for head, gone in cases:
        state = (eng.used_blocks, eng._reservations.need(), eng._batch_slots, len(eng.running), eng.n_waiting)
        want = eng.admits_without(head, gone)
        assert state == (eng.used_blocks, eng._reservations.need(), eng._batch_slots, len(eng.running), eng.n_waiting)
        e2 = _at(w, prof, cfg, horizon)
        for b in gone:
            assert e2.squashable(b)
            e2.squash(b)
        got = e2._try_admit(SLoRAStepContext(e2, e2.batch_max_tokens, e2.env.now), head) == Admit.OK
        assert want == got, (head, gone)
        seen.add(want)
    assert seen == {True, False}  # (both outcomes are exercised)


def test_a_cache_prefetch_without_an_in_flight_bound_runs_on_s_lora():
    """``max_inflight = None`` means no bound (twin.interfaces.Policy); S-LoRA's loader compared the copies in
    flight with it directly, so a plug-in cache with predictive prefetch and no bound raised a TypeError there."""
    from policies.chameleon import ChameleonPrefetchCache, ChameleonScheduler

    class Unbounded(ChameleonPrefetchCache):
        max_inflight = None

    w = pressure_workload(4)
    prof = constant_profile(c0=STEP, kv_tokens=200_000)
    res = simulate(w, prof, EngineConfig(max_total_tokens=5000), system="slora", scheduler_obj=ChameleonScheduler(),
                   cache_obj=Unbounded(bin_s=0.05, min_samples=2), check_invariants=True)
    assert res.summary["requests_finished"] + res.summary["requests_rejected"] == len(w)


# ---------------------------------------------------------------------------------------------- stop 67's audit
def test_a_resident_adapter_the_prefetch_names_again_stays_tagged():
    """slora.md section 4: the latest prefetch's adapters are protected from the partial offloads. Adapter 1 is
    prefetched at decode counter 5 for queued request 2 and named again at counter 7, now resident: it stays tagged,
    so the finish at decode 8 does not offload it and request 2 is admitted without loading it again (untagged,
    it was offloaded and reloaded synchronously: 4 loads and a load wait)."""
    prof = constant_profile(c0=0.01, kv_tokens=200_000)
    w = Workload.from_arrays([0.0, 0.0, 0.015], [16, 16, 16], [40, 9, 5], [0, 2, 1], [8, 8, 8])
    runs = [simulate(w, prof, EngineConfig(max_total_tokens=5000, slora_prefetch=True), policy="slora",
                     max_run_steps=m, check_invariants=True) for m in (None, 1)]
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)
    s, req = runs[0].summary, runs[0].requests
    assert s["prefetches"] == 1 and s["adapter_loads"] == 3  # adapters 0 and 2 at the first prefill, 1 prefetched
    assert req["load_wait_s"].iloc[2] == 0.0 and req["load_wait_s"].iloc[0] > 0.0


def test_a_synchronous_prefetch_cache_is_refused_on_slora():
    """S-LoRA copies on its own stream in the background; a cache that prefetches on the deciding step's critical
    path ran there asynchronously, silently the same as its asynchronous variant."""
    w = Workload.from_arrays([0.0], [16], [4], [0], [8])
    with pytest.raises(ConfigError, match="prefetches synchronously.*ema-prefetch"):
        simulate(w, constant_profile(c0=0.01), EngineConfig(), system="slora", cache="ema-prefetch-sync")
    simulate(w, constant_profile(c0=0.01), EngineConfig(), system="slora", cache="ema-prefetch")


def test_no_nothing_admitted_note_when_the_horizon_comes_before_the_first_poll():
    """Idle S-LoRA tries an admission at its 10 ms polls: requests arriving just before a horizon that falls before
    the next poll were never offered, which is not the scheduler's fault (the note blamed its schedule_waiting)."""
    w = Workload.from_arrays([0.062, 0.0627], [100, 100], [10, 10], [0, 1], [8, 8])
    r = simulate(w, None, EngineConfig(), policy="slora", horizon_s=0.0696)
    assert r.summary["slora_admission_attempts"] == 0 and r.summary["requests_unfinished"] == 2
    assert "no request was admitted" not in (r.summary.get("note") or "")
