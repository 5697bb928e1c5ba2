"""The vLLM engine's scheduling against a line-by-line port of vLLM 0.8.5 V1's own scheduler.

:func:`vllm085_schedule` re-implements, from the vLLM 0.8.5 wheel's source (``vllm/v1/core/sched/scheduler.py``;
line numbers of that file below), what decides when a request gets its tokens: ``Scheduler.schedule`` (the
running requests first in admission order, the token budget, recompute preemption of the last running request,
no admission in a step that preempted, the waiting queue with its ``max_loras`` skip that keeps places) and
``Scheduler.update_from_output`` (a token per request that has computed all its known tokens; a request that
reached its ``max_tokens`` frees its blocks before the next step), with ``KVCacheManager.allocate_slots``'s block
arithmetic (``vllm/v1/core/kv_cache_manager.py``: ``cdiv(num_computed + num_new, block_size)`` blocks held, no
preallocation, no watermark, no lookahead). Prefix caching is off, as in the real validation runs
(``shared/data/README.md``, "Setup"); no spec decode, no encoder inputs, no structured output.

Offline batches (every request at time 0) make steps the clock: the port counts steps, and the twin's step
records (segments of ``n_steps``) give the step at which each request got its first token and finished. For
seeded random workloads -- KV pools from just large enough (hundreds of preemptions) to roomy, 0-11 adapters
with 1-5 slots, budgets 512 / 2048, 8-256 sequences -- the twin's :class:`~twin.engine.Engine` (FCFS, LRU slots)
must give every request the same first-token step, finish step and preemption count, and the same number of
steps, with its decode runs advanced at once (the default) and stepped one at a time. With arrivals over time
(the engine core adds the arrived requests before each step) and a constant step time, the same holds for the
first-token and finish times, from a flood of arrivals to an engine idle half the time.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.perf.profile import load_profile
from twin.registry import make_cache, make_scheduler


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Req:
    """``vllm/v1/request.py``'s ``Request``, the fields the scheduler reads."""

    __slots__ = ("rid", "num_tokens", "num_computed_tokens", "num_output_tokens", "max_tokens", "lora", "blocks",
                 "first_step", "finish_step", "preemptions", "first_s", "finish_s")

    def __init__(self, rid: int, prompt: int, max_tokens: int, lora: int) -> None:
        self.rid, self.num_tokens, self.max_tokens, self.lora = rid, prompt, max_tokens, lora
        self.num_computed_tokens = self.num_output_tokens = self.blocks = self.preemptions = 0
        self.first_step = self.finish_step = -1
        self.first_s = self.finish_s = -1.0


def vllm085_schedule(prompt, output, lora, *, budget: int, max_num_seqs: int, block_size: int, num_blocks: int,
                     max_loras: int, arrival=None, step_s: float = 0.01) -> tuple[list[_Req], int]:
    """Run vLLM 0.8.5 V1's scheduler over a batch; returns the requests (first-token and finish step and time,
    preemptions) and the number of steps.

    ``arrival`` (seconds; None: all at 0, offline): before each step the engine core adds the requests that arrived
    (``EngineCore.step``: the input queue is drained into ``Scheduler.add_request`` -- ``waiting.append`` -- before
    ``schedule()``); an idle engine waits for the next arrival. Every step lasts ``step_s``."""
    reqs = [_Req(i, int(p), int(o), int(a)) for i, (p, o, a) in enumerate(zip(prompt, output, lora))]
    arr = [0.0] * len(reqs) if arrival is None else [float(x) for x in arrival]
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    free = num_blocks
    step = finished = nxt = 0
    now = 0.0

    def allocate(r: _Req, num_new: int) -> bool:
        """KVCacheManager.allocate_slots (kv_cache_manager.py:220-232; no prefix cache, no lookahead)."""
        nonlocal free
        need = _cdiv(r.num_computed_tokens + num_new, block_size) - r.blocks
        if need > free:
            return False  # "Cannot allocate new blocks"
        free -= need
        r.blocks += need
        return True

    while finished < len(reqs):
        if not running and not waiting:  # idle until the next arrival
            now = max(now, arr[nxt])
        while nxt < len(reqs) and arr[nxt] <= now:
            waiting.append(reqs[nxt])
            nxt += 1
        step += 1
        now += step_s
        token_budget = budget
        scheduled: dict[int, tuple[_Req, int]] = {}
        preempted: list[_Req] = []
        # First, schedule the RUNNING requests (scheduler.py:176-266).
        i = 0
        while i < len(running) and token_budget > 0:
            r = running[i]
            num_new = min(r.num_tokens - r.num_computed_tokens, token_budget)  # (:179-190)
            while True:  # (:216-237)
                if allocate(r, num_new):
                    can_schedule = True
                    break
                victim = running.pop()  # "Preempt the lowest-priority request." (:224)
                free += victim.blocks
                victim.blocks = victim.num_computed_tokens = 0
                victim.preemptions += 1
                waiting.appendleft(victim)
                preempted.append(victim)
                if victim is r:
                    can_schedule = False
                    break
            if not can_schedule:
                break
            scheduled[r.rid] = (r, num_new)
            token_budget -= num_new
            i += 1
        # The LoRAs of the scheduled running requests (:281-287); skipped requests keep their places (:291, :417-419).
        scheduled_loras = {r.lora for r, _ in scheduled.values() if r.lora >= 0}
        skipped: deque[_Req] = deque()
        if not preempted:  # (:294)
            while waiting and token_budget > 0:
                if len(running) == max_num_seqs:  # (:296)
                    break
                r = waiting[0]
                if r.lora >= 0 and len(scheduled_loras) == max_loras and r.lora not in scheduled_loras:  # (:312-320)
                    waiting.popleft()
                    skipped.appendleft(r)
                    continue
                # num_tokens, not the prompt: a resumed request recomputes its output tokens too (:337-341)
                num_new = min(r.num_tokens, token_budget)
                if not allocate(r, num_new):  # (:362-366)
                    break
                waiting.popleft()
                running.append(r)
                if r.lora >= 0:
                    scheduled_loras.add(r.lora)
                scheduled[r.rid] = (r, num_new)
                token_budget -= num_new
        if skipped:
            waiting.extendleft(skipped)  # (:417-419)
        for r, n in scheduled.values():  # end of schedule(): num_computed_tokens += scheduled tokens (:505-506)
            r.num_computed_tokens += n
        # update_from_output: a token for each request that computed all its tokens; finished ones leave (:625-744)
        still: list[_Req] = []
        for r in running:
            if r.rid in scheduled and r.num_computed_tokens >= r.num_tokens:
                r.num_output_tokens += 1
                r.num_tokens += 1
                if r.first_step < 0:
                    r.first_step, r.first_s = step, now
                if r.num_output_tokens >= r.max_tokens:  # check_stop: max_tokens reached; _free_request (:701-703)
                    r.finish_step, r.finish_s = step, now
                    free += r.blocks
                    r.blocks = 0
                    finished += 1
                    continue
            still.append(r)
        running = still
    return reqs, step


def _case(seed: int) -> dict:
    """A seeded offline batch and a configuration (sizes kept small: the port and the twin run in ~0.1 s)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 120))
    prompt = rng.integers(1, 1500, n)
    output = rng.integers(1, 160, n)
    n_adapters = int(rng.integers(0, 12))
    lora = rng.integers(0, n_adapters, n) if n_adapters else np.full(n, -1)
    budget = int(rng.choice([512, 2048]))
    seqs = min(int(rng.choice([8, 32, 256])), budget)
    bs = 16
    # from the fewest blocks the longest request needs (hundreds of preemptions) to room to spare
    blocks = _cdiv(int((prompt + output).max()), bs) + int(rng.integers(0, 800))
    return dict(prompt=prompt, output=output, lora=lora, budget=budget, max_num_seqs=seqs, block_size=bs,
                num_blocks=blocks, max_loras=int(rng.integers(1, 6)))


def _config(case: dict) -> EngineConfig:
    """The case's server: its KV pool, slots, sequences and token budget."""
    p, o, a = case["prompt"], case["output"], case["lora"]
    return EngineConfig(kv_capacity_tokens=case["num_blocks"] * case["block_size"], max_model_len=int((p + o).max()),
                        max_loras=case["max_loras"], max_num_seqs=case["max_num_seqs"],
                        max_num_batched_tokens=case["budget"], block_size=case["block_size"],
                        enable_lora=bool((a >= 0).any()))


def _twin(case: dict, max_run_steps: int | None) -> tuple[list[int], list[int], list[int], int]:
    p, o, a = case["prompt"], case["output"], case["lora"]
    n = len(p)
    wl = Workload.from_arrays(np.zeros(n), p, o, a, np.where(a >= 0, 8, 0))
    cfg = _config(case)
    eng = Engine(wl, load_profile(None), cfg, make_scheduler("fcfs"), make_cache("lru"), max_run_steps=max_run_steps)
    eng.run()
    rows = eng.rec.rows
    ends = np.array([r[1] for r in rows])
    steps_done = np.cumsum([r[2] for r in rows])  # a finish ends a decode run, a first token is a prefill step

    def step_at(t: float) -> int:
        j = int(np.searchsorted(ends, t))
        assert ends[j] == t, "a first token or finish inside a segment"
        return int(steps_done[j])

    return ([step_at(eng.first_token[i]) for i in range(n)], [step_at(eng.finish[i]) for i in range(n)],
            [int(x) for x in eng.preemptions], int(eng.rec.n_steps))


@pytest.mark.parametrize("seed", range(24))
def test_the_engine_schedules_as_vllm_085_v1(seed):
    case = _case(seed)
    reqs, steps = vllm085_schedule(**case)
    want = ([r.first_step for r in reqs], [r.finish_step for r in reqs], [r.preemptions for r in reqs], steps)
    modes = (None, 1) if seed % 6 == 0 else (None,)  # stepping one at a time on a quarter of the cases (slower)
    for mode in modes:
        got = _twin(case, mode)
        for what, w, g in zip(("first-token step", "finish step", "preemptions"), want[:3], got[:3]):
            bad = [i for i in range(len(w)) if w[i] != g[i]]
            assert not bad, (f"seed {seed}, max_run_steps={mode}: {what} of request {bad[0]}: vLLM 0.8.5 {w[bad[0]]}, "
                             f"twin {g[bad[0]]} ({len(bad)} requests differ)")
        assert got[3] == steps, f"seed {seed}, max_run_steps={mode}: {got[3]} steps, vLLM 0.8.5 {steps}"


def test_the_cases_reach_what_they_claim():
    """The seeded cases preempt (a pool just large enough), skip requests for a full set of slots, and fill the
    sequences: a port that never preempts or skips would make the comparison vacuous."""
    pre = skips = 0
    for seed in range(24):
        case = _case(seed)
        reqs, _ = vllm085_schedule(**case)
        pre += sum(r.preemptions for r in reqs)
        n_adapters = len(set(case["lora"].tolist()) - {-1})
        skips += n_adapters > case["max_loras"]
    assert pre > 500 and skips >= 8, (pre, skips)


@pytest.mark.parametrize("seed", range(100, 112))
def test_the_engine_schedules_arrivals_as_vllm_085_v1(seed):
    """The same port with requests arriving over time (Poisson, from a trickle to a flood) and every step lasting
    10 ms (a profile of a constant step, loads free): the twin's event-driven engine -- idle until an arrival,
    arrivals joining at the next step's start, decode runs advanced at once up to the next arrival -- gives every
    request the first-token and finish times and preemptions of vLLM's step loop."""
    from tests.helpers import constant_profile

    case = _case(seed)
    n = len(case["prompt"])
    rng = np.random.default_rng(seed + 1000)
    arrival = np.cumsum(rng.exponential(float(rng.choice([0.002, 0.02, 0.2, 1.0])), n))
    reqs, steps = vllm085_schedule(**case, arrival=arrival, step_s=0.01)
    p, o, a = case["prompt"], case["output"], case["lora"]
    wl = Workload.from_arrays(arrival, p, o, a, np.where(a >= 0, 8, 0))
    cfg = _config(case)
    eng = Engine(wl, constant_profile(c0=0.01, disk_s=0.0, cpu_s=0.0), cfg, make_scheduler("fcfs"), make_cache("lru"))
    eng.run()
    assert eng.rec.n_steps == steps
    np.testing.assert_allclose(eng.first_token, [r.first_s for r in reqs], rtol=0, atol=1e-9)
    np.testing.assert_allclose(eng.finish, [r.finish_s for r in reqs], rtol=0, atol=1e-9)
    assert [int(x) for x in eng.preemptions] == [r.preemptions for r in reqs]
