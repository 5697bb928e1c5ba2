"""The contract of :mod:`twin.preemption` (:class:`~twin.preemption.PreemptionWalk`): vLLM v1's walk over the
running requests when the KV pool runs out (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``'s running
loop).

The running requests are walked in admission order; each gets its tokens (one for a decoder, a chunk of at most the
remaining token budget for a prefilling request) and the blocks they need; when they do not fit, the *last* running
request is preempted (recompute: its blocks are freed) until they fit -- and no further -- or until the request itself
was preempted, which ends the walk. The walk stops when the token budget is spent. Both implementations (the bulk
walk and the one-request-at-a-time reference, ``bulk_preempt_walk``) must follow it.

The walk is tested on a small host object with hand-made running sets (every expected value derived here from the
rule above), against a reference written from vLLM's loop on seeded random sets, and inside the real engine, where a
preempted decoder's KV is freed and it goes back to the front of the waiting queue with prompt + emitted tokens to
recompute.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.helpers import ListQueueScheduler, constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.preemption import PreemptionWalk
from twin.registry import make_cache
from twin.simulate import simulate

WALKS = [True, False]  # bulk_preempt_walk: the bulk walk and the one-request-at-a-time walk
WALK_IDS = ["bulk", "stepwise"]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _Host(PreemptionWalk):
    """The engine state the walk reads, for a hand-made running set.

    ``reqs`` maps a request id to ``("dec", computed)`` (a decoder that has computed ``computed`` tokens and holds
    their blocks) or ``("pref", T, c, held)`` (a prefilling request with ``T`` known tokens, ``c`` computed, ``held``
    blocks); ``order`` is the admission order. ``_preempt`` frees the victim's blocks, as the engine's does."""

    def __init__(self, bulk: bool, bs: int, free: int, budget: int, order: list[int],
                 reqs: dict[int, tuple], g: int = 100) -> None:
        self.bulk_preempt_walk = bulk
        self.block_size = bs
        self.g = g
        self.config = SimpleNamespace(max_num_batched_tokens=budget)
        self.running: dict[int, None] = {r: None for r in order}
        self.prefilling: dict[int, None] = {}
        self.T: dict[int, int] = {}
        self.c: dict[int, int] = {}
        self.held: dict[int, int] = {}
        self.dec: dict[int, tuple[int, int]] = {}
        n = max(order) + 1 if order else 1
        self._pref_np = np.zeros(n, np.uint8)
        self._base_np = np.zeros(n, np.int64)
        used = 0
        for r in order:
            spec = reqs[r]
            if spec[0] == "pref":
                _, T, c, held = spec
                self.prefilling[r] = None
                self.T[r], self.c[r], self.held[r] = T, c, held
                self._pref_np[r] = 1
                used += held
            else:
                computed = spec[1]
                base = computed - g
                self.dec[r] = (base, g + 1000)
                self._base_np[r] = base
                used += _ceil(computed, bs)
        self.used_blocks = used
        self.total_blocks = used + free
        self.victims: list[int] = []
        self.now_seen: list[float] = []

    def _running_order(self) -> np.ndarray:
        return np.fromiter(self.running, np.int64, len(self.running))

    def _preempt(self, rid: int, now: float) -> int:
        self.victims.append(rid)
        self.now_seen.append(now)
        del self.running[rid]
        if rid in self.prefilling:
            del self.prefilling[rid]
            freed = self.held.pop(rid)
        else:
            base, _ = self.dec.pop(rid)
            freed = _ceil(base + self.g, self.block_size)
        self.used_blocks -= freed
        return freed


def _walk(bulk: bool, *args: Any, **kw: Any) -> tuple[_Host, tuple[int, list[tuple[int, int]], int]]:
    h = _Host(bulk, *args, **kw)
    return h, h._preempt_until_fits(7.5)


@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_the_last_admitted_request_is_preempted_first_and_the_walk_stops_once_the_step_fits(bulk: bool) -> None:
    """Block size 4; four decoders admitted in the order 5, 2, 7, 1 (request ids out of order on purpose), each
    with 8 computed tokens (2 full blocks held, the next token needs a third); 1 free block.

    5 takes the free block; 2 needs one, none is left: the last admitted, 1, is preempted (frees 2 blocks); 2 takes
    one, 7 takes the other. Nothing else is preempted: victims [1], 3 tokens and 3 new blocks."""
    h, (budget, chunks, need) = _walk(bulk, 4, 1, 100, [5, 2, 7, 1], {r: ("dec", 8) for r in (5, 2, 7, 1)})
    assert h.victims == [1]
    assert h.now_seen == [7.5]
    assert (budget, chunks, need) == (100 - 3, [], 3)
    assert list(h.running) == [5, 2, 7]
    assert h.used_blocks == 4 * 2 - 2  # the victim's two blocks are free again (the step's 3 not added yet)


@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_victims_are_taken_from_the_back_one_by_one_until_the_chunk_fits(bulk: bool) -> None:
    """Block size 4, 1 free block. Order 3, 0, 4, 6: 3 decodes without a new block (5 computed); 0 prefills 16
    of its 20 tokens (4 computed, 1 block held: it needs ceil(20 / 4) - 1 = 4 more); 4 (4 computed, 1 block) and
    6 (8 computed, 2 blocks) are decoders behind it.

    0 needs 4 > 1: 6 goes (free 3), still short: 4 goes (free 4): it fits, and the walk stops preempting -- 3, ahead
    of it, keeps its place. The step: 1 + 16 tokens, 0 + 4 blocks, chunk (0, 16)."""
    reqs = {3: ("dec", 5), 0: ("pref", 20, 4, 1), 4: ("dec", 4), 6: ("dec", 8)}
    h, (budget, chunks, need) = _walk(bulk, 4, 1, 100, [3, 0, 4, 6], reqs)
    assert h.victims == [6, 4]
    assert (budget, chunks, need) == (100 - 17, [(0, 16)], 4)
    assert list(h.running) == [3, 0]


@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_a_request_that_cannot_fit_preempts_itself_and_ends_the_walk(bulk: bool) -> None:
    """Block size 4, 1 free block, budget 17. Order 1, 2, 3: decoder 1 (4 computed) needs a block and takes the free
    one (budget 16); 2 prefills min(40 - 8, 16) = 16 tokens and needs ceil(24 / 4) - 2 = 4 blocks: 3 (3 computed,
    1 block) goes, free 1 < 4, so 2 itself goes (the last running request is now 2). The walk ends there: 1 keeps
    its token and block, and 2's chunk is not in the step (budget 16 left, no chunk, 1 block)."""
    reqs = {1: ("dec", 4), 2: ("pref", 40, 8, 2), 3: ("dec", 3)}
    h, (budget, chunks, need) = _walk(bulk, 4, 1, 17, [1, 2, 3], reqs)
    assert h.victims == [3, 2]
    assert (budget, chunks, need) == (16, [], 1)
    assert list(h.running) == [1]


@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_the_walk_ends_with_the_token_budget_and_preempts_nobody_past_it(bulk: bool) -> None:
    """Block size 4, 1 free block, budget 5. Order 1, 2, 3: decoder 1 (5 computed) needs no block (budget 4);
    2 prefills min(30 - 6, 4) = 4 tokens, ceil(10 / 4) - 2 = 1 block: the free one; the budget is spent. Decoder 3
    (8 computed) would need a block and none is left, but it gets no token this step: nothing is preempted."""
    reqs = {1: ("dec", 5), 2: ("pref", 30, 6, 2), 3: ("dec", 8)}
    h, (budget, chunks, need) = _walk(bulk, 4, 1, 5, [1, 2, 3], reqs)
    assert h.victims == []
    assert (budget, chunks, need) == (0, [(2, 4)], 1)


def _reference(bs: int, free: int, budget: int, order: list[int], reqs: dict[int, tuple]):
    """vLLM v1's running loop written out: requests in admission order, each preempting the last running request
    while its blocks do not fit (stopping at itself); the walk ends when the budget is spent."""
    queue = list(order)
    victims: list[int] = []
    chunks: list[tuple[int, int]] = []
    need = 0

    def blocks(r: int) -> int:
        s = reqs[r]
        return s[3] if s[0] == "pref" else _ceil(s[1], bs)

    i = 0
    gone = False
    while i < len(queue) and budget > 0:
        r = queue[i]
        s = reqs[r]
        if s[0] == "pref":
            k = min(s[1] - s[2], budget)
            nd = _ceil(s[2] + k, bs) - s[3]
        else:
            k, nd = 1, int(s[1] % bs == 0)
        while nd > free:
            v = queue.pop()
            victims.append(v)
            free += blocks(v)
            if v == r:
                gone = True
                break
        if gone:
            break
        free -= nd
        need += nd
        budget -= k
        if s[0] == "pref":
            chunks.append((r, k))
        i += 1
    return victims, gone, (budget, chunks, need)


def _random_case(rng: np.random.Generator) -> tuple[int, int, int, list[int], dict[int, tuple]]:
    bs = int(rng.choice([1, 2, 4, 16]))
    n = int(rng.integers(1, 40))
    order = [int(x) for x in rng.permutation(3 * n)[:n]]
    reqs: dict[int, tuple] = {}
    for r in order:
        if rng.random() < 0.25:
            T = int(rng.integers(2, 200))
            c = int(rng.integers(1, T))  # (part-way through its prefill, holding the blocks of what it computed)
            reqs[r] = ("pref", T, c, _ceil(c, bs))
        else:
            reqs[r] = ("dec", int(rng.integers(1, 300)))
    free = int(rng.integers(0, 6))
    budget = int(rng.integers(1, 3 * n + 100))
    return bs, free, budget, order, reqs


@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_both_walks_follow_vllms_running_loop_on_random_running_sets(bulk: bool) -> None:
    """400 seeded random running sets (decoders and prefilling requests, 0-5 free blocks, budgets from tight to
    roomy, block sizes 1-16): the victims, in order, and the step (budget left, chunks, new blocks) are the
    reference loop's; the random sets preempt (and preempt a request itself) often enough to matter."""
    rng = np.random.default_rng(20240607)
    preempted = self_preempted = 0
    for _ in range(400):
        bs, free, budget, order, reqs = _random_case(rng)
        want_victims, gone, want = _reference(bs, free, budget, order, reqs)
        h, got = _walk(bulk, bs, free, budget, order, reqs, g=int(rng.integers(0, 50)))
        assert (h.victims, got) == (want_victims, want), (bs, free, budget, order, reqs)
        assert list(h.running) == [r for r in order if r not in want_victims]
        preempted += bool(want_victims)
        self_preempted += gone
    assert preempted > 100 and self_preempted > 10


# ---------------------------------------------------------------------------------------------- inside the engine
@pytest.mark.parametrize("bulk", WALKS, ids=WALK_IDS)
def test_a_preempted_decoder_frees_its_kv_and_waits_at_the_front_with_prompt_plus_emitted_tokens(
        bulk: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real engine: 6 KV blocks of 16 tokens; r0, r1, r2 (prompt 16, 33 tokens: the last one computed at
    position 47, within 3 blocks) at t=0, r3 (prompt 16, 2 tokens) at 1 ms.

    Step 1 prefills the three (3 blocks, a first token each); at the next step each decoder's 17th token needs a
    second block (6 used) and r3 is refused for KV. At computed length 32 each needs a third block, none is free:
    r0 preempts the last admitted, r2 (2 blocks freed), then r0 and r1 take one each -- nothing else goes. r2 has
    emitted 1 + 16 tokens: it waits, ahead of r3, to recompute 16 + 17 = 33 tokens (vLLM v1 keeps the output tokens).
    When r0 and r1 finish, one step prefills r2's 33 tokens and r3's 16, and r2 still emits 33 tokens in all."""
    monkeypatch.setattr(Engine, "bulk_preempt_walk", bulk)
    prof = constant_profile(c0=0.01, c_prefill=1e-5, kv_tokens=96)
    w = Workload.from_arrays([0.0, 0.0, 0.0, 0.001], [16, 16, 16, 16], [33, 33, 33, 2])
    sched = ListQueueScheduler()
    seen: list[dict[str, Any]] = []
    orig = Engine._preempt_until_fits

    def spy(self: Engine, now: float):
        before = dict(running=list(self.running), used=self.used_blocks, total=self.total_blocks,
                      preempted=dict(self.preempt_d), emitted=self.emitted_now(2) if 2 in self.running else None)
        out = orig(self, now)
        seen.append(dict(before, after_running=list(self.running), after_used=self.used_blocks, out=out,
                         resume=dict(self.resume_T), queue=list(sched.queue), waiting=self.n_waiting))
        return out

    monkeypatch.setattr(Engine, "_preempt_until_fits", spy)
    res = simulate(w, prof, EngineConfig(max_loras=1, enable_lora=False, max_model_len=96), scheduler_obj=sched,
                   cache_obj=make_cache("lru"), check_invariants=True)
    assert len(seen) == 1
    s = seen[0]
    assert s["total"] == 6 and s["used"] == 6 and s["preempted"] == {}
    assert s["running"] == [0, 1, 2] and s["after_running"] == [0, 1]
    assert s["emitted"] == 17
    assert s["after_used"] == 6 - 2           # r2's two blocks freed
    budget, chunks, need = s["out"]
    assert chunks == [] and need == 2         # r0's and r1's third blocks
    assert s["resume"] == {2: 16 + 17}        # prompt + emitted tokens to recompute
    assert s["queue"] == [2, 3] and s["waiting"] == 2
    r = res.requests.set_index("request_id")
    assert r["preemptions"].tolist() == [0, 0, 1, 0]
    assert r["outcome"].tolist() == ["finished"] * 4
    assert r["tokens_emitted"].tolist() == [33, 33, 33, 2]
    # r0 and r1 finish together; the next step admits r2 (33 tokens to recompute) and r3 (16): 49 prefill tokens
    prefills = [int(x) for x in res.steps["prefill_tokens"] if x]
    assert prefills == [48, 33 + 16]
