"""The S-LoRA engine: S-LoRA's router loop as a SimPy process (``--system slora``).

Follows ``S-LoRA/S-LoRA`` at ``c1ddf48`` as summarised in ``shared/refs/slora.md`` (its
"Modelling checklist" item numbers in brackets):

* **Rejection at the HTTP server** (``httpserver/manager.py:generate``): a prompt longer than
  ``slora_max_prompt_len`` (2048), prompt + output above ``slora_max_total_len`` (3072), or
  prompt + output + 1 above ``N_tok`` is refused at arrival, with its reason. A request that
  passes those checks but can never pass the admission test with its adapter
  (prompt + output + the adapter's slots >= ``N_tok``) would block S-LoRA's FIFO forever; it is
  rejected at arrival too (a departure, so that every request is accounted for).
* **When admission runs** [2] (``RouterManager._step``): with no running batch, every
  ``poll_s`` (10 ms) from the moment the batch emptied; with a running batch, only once
  ``max_wait_tokens`` (10) decodes have run since the last prefill, and then at every
  iteration until a mini-batch is admitted (a failed attempt decodes without counting).
* **Admission** [1, 4-6] (``ReqQueue.generate_new_batch`` / ``_can_add_new_req``): the
  scheduler policy orders the waiting requests and offers them to :meth:`SLoRAStepContext.try_admit`,
  which applies S-LoRA's test: running requests count as ``(has, left) = (input + generated,
  max_new - generated - 1)``, new ones as ``(input + 1, max_new - 1)``; sorted by ``left``
  (largest first), ``need = max_i(sum_{j<=i} has_j + (i+1) * left_i)`` must stay strictly below
  ``N_tok - sum over the distinct adapters of running and new requests of their slots``; the
  mini-batch's prompt tokens stay within ``batch_max_tokens`` (default ``max(N_tok/6, slora_max_total_len)``,
  3072 by default; a value given below ``slora_max_total_len`` is refused, as S-LoRA's ``api_server.py`` asserts) and
  the running requests within ``running_max_req_size`` (1000). The FIFO scheduler (``slora``,
  ``fcfs``) stops at the first refusal (head-of-line blocking); other schedulers order the
  queue their own way (Chameleon's queues, SJF) -- the test is always this one.
  **A request's admission is decided in** :meth:`SLoRAEngine._try_admit`.
* **Separate iterations** [3]: an iteration is either the prefill of the new mini-batch only
  (the running requests stall) or a decode of every running request; never both.
  **A request's TTFT is decided in** :meth:`SLoRAEngine._complete_prefill`: its first token is
  emitted at the end of its prefill (loads included).
* **One pool** [7-9] of ``N_tok`` slots: one per KV token, ``ceil(adapter bytes / KV bytes per
  token)`` per adapter (``4r`` for S-LoRA's own set-ups: q, k, v, o of a multi-head model).
  ``N_tok`` is ``max_total_tokens``, else ``kv_capacity_tokens``, else the GPU memory the profile
  leaves after the weights and the runtime (no LoRA slots). The KV of a request is its prompt at
  prefill plus one slot per decode, all freed when it finishes. No preemption.
* **Adapters** [11, 12] (``infer_adapter.py``): every adapter sits in pinned host memory from the
  start; the missing adapters of a mini-batch are copied synchronously right before its prefill,
  ``2L`` copies moving twice the adapter's bytes over the host link
  (:func:`twin.perf.slora_forms.slora_load_s`), queued on the contended link. After a decode in
  which a request finished, and when the batch empties, the adapters no running request uses
  are offered to the cache policy: ``none`` (S-LoRA) evicts them all (``evict_when_idle``),
  a cache (Chameleon's, LRU) keeps them in the pool's idle memory. Idle adapters are evicted,
  in the cache policy's victim order, when an admission's reservation needs their slots: after
  every admission, reservations + resident adapters <= ``N_tok``, so the pool never overflows.
  A request that finishes in its prefill does not trigger eviction (as in S-LoRA).
* **Compute** [14]: base model from the profile's backbone, LoRA from
  :class:`twin.perf.slora_forms.PunicaLoraCost` (tokens x each request's own rank over the
  adapted projections, padded to the max rank where S-LoRA's kernels pad), CPU time from the
  profile's scheduler term with the running requests (S-LoRA's router looks at the queue only
  when it admits).

* **Prefetch** [13] (``--prefetch``, off in every paper run; ``EngineConfig.slora_prefetch``): before
  the decodes at counters 5 and 7, the adapters the scheduler's ``prefetch()`` names (S-LoRA's:
  the FIFO prefix that fits one mini-batch) are copied asynchronously (2x their bytes over the
  link) into slots no reservation or resident adapter holds, in order, with no bound on the copies
  in flight, stopping at the first that does not fit (:class:`SLoRAPrefetcher`); the latest prefetch's adapters are
  kept by the offloads; a request whose adapter is still copying waits for the rest in its
  prefill. A cache policy's own predictive prefetch (``chameleon+prefetch``) is asked at the same
  moments whatever the flag. Adapters in flight hold their slots: the admission test counts them
  (S-LoRA does not, and could run out of slots there).
* **Horizon**: a prefill whose loads -- the prefetches it waits for, its own copies queued on the FIFO
  link behind every copy requested before them, their end known exactly from the link's state
  (:meth:`twin.adapters.HostLink.loads_end`) -- and compute would end after the horizon is in flight
  there: it starts none of them (nothing happens after the horizon).

Prefix-KV reuse and fixed adapter regions are vLLM-engine extensions; a cache policy that needs
them is refused with the fix.

Speed: runs of decode steps in which nothing can change -- no finish, no admission due, no
arrival, event, tick or horizon, and, after a failed admission, nothing that could change its outcome
(``Scheduler.next_change_time``; S-LoRA's ``need`` is constant while the running set is, since
every request's ``has`` grows by one and ``left`` falls by one each decode) -- are advanced at
once, each step's duration summed in the same order as single steps (``max_run_steps=1`` steps
one at a time; a test compares both). The admission test's need reads the running batch's reservation pairs
kept in its order from step to step (:class:`Reservations`: a join, a settle or a leave shifts the terms behind
one pair; a decode changes nothing), not a pass over the batch per candidate (a test compares them).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from twin.adapter_placement import UnifiedPool
from twin.adapters import AdapterMemory, HostLink
from twin.config import ConfigError, EngineConfig
from twin.engine_state import EngineState
from twin.interfaces import AdapterCachePolicy, Admit, Policy, Scheduler, is_builtin, policy_stats
from twin.prefetch import AsyncLoader
from twin.perf.slora_forms import SLORA_TARGETS, PunicaLoraCost, slora_load_s
from twin.requests import FINISHED, REJECTED, REJECT_REASONS

if TYPE_CHECKING:  # pragma: no cover
    from traces.workload import Workload
    from twin.perf.profile import Profile

INF = math.inf
OK, NO_BUDGET, NO_SEQ, NO_SLOT, NO_KV = Admit.OK, Admit.NO_BUDGET, Admit.NO_SEQ, Admit.NO_SLOT, Admit.NO_KV
#: S-LoRA's rejection reasons, as indices into :data:`twin.requests.REJECT_REASONS`
R_PROMPT, R_TOTAL, R_POOL, R_NEVER = (REJECT_REASONS.index(r) for r in (
    "prompt longer than the S-LoRA server's max prompt length",
    "prompt + output exceed the S-LoRA server's max request length",
    "prompt + output + 1 exceed S-LoRA's max_total_token_num",
    "request and its adapter can never fit S-LoRA's pool"))
R_UNSERVED = REJECT_REASONS.index("unknown adapter (not served)")
#: a prompt that no prefill mini-batch can hold (S-LoRA's ``generate_new_batch`` never takes it; it
#: stranded every request behind it in the FIFO queue)
R_BATCH = REJECT_REASONS.index("prompt longer than S-LoRA's batch_max_tokens (one prefill mini-batch)")


def slora_pool_tokens(cfg: EngineConfig, profile: "Profile") -> int:
    """S-LoRA's unified pool in token slots: ``--max-total-tokens``, else the KV size given or derived from
    the GPU memory, else what the profile's GPU holds after the weights (S-LoRA keeps no slot buffers)."""
    return int(cfg.max_total_tokens or cfg.kv_capacity_tokens or profile.kv_capacity_tokens(0, 0))


def batch_max_tokens(cfg: EngineConfig, pool_tokens: int) -> int:
    """The prompt tokens of one prefill mini-batch: ``--slora-batch-max-tokens``, else S-LoRA's default
    ``max(int(max_total_token_num / 6), max_req_total_len)`` (``slora/server/api_server.py``; the twin's
    ``max_req_total_len`` is ``slora_max_total_len``, 3072 by default: ``slora.md`` section 2.7's 3072). A value
    given below ``max_req_total_len`` is refused, as S-LoRA's ``assert batch_max_tokens >= max_req_total_len``
    refuses it (:func:`check_batch_max_tokens`)."""
    check_batch_max_tokens(cfg)
    return int(cfg.slora_batch_max_tokens or max(pool_tokens // 6, cfg.slora_max_total_len))


def check_batch_max_tokens(cfg: EngineConfig) -> None:
    """S-LoRA's start-up assert (``api_server.py``): ``batch_max_tokens >= max_req_total_len``."""
    bmt = cfg.slora_batch_max_tokens
    if bmt and bmt < cfg.slora_max_total_len:
        raise ConfigError(f"--slora-batch-max-tokens {bmt} is below --slora-max-total-len {cfg.slora_max_total_len}: "
                          f"S-LoRA refuses to start (api_server.py asserts batch_max_tokens >= max_req_total_len, so "
                          f"that every request it accepts fits one prefill mini-batch); give --slora-batch-max-tokens "
                          f"{cfg.slora_max_total_len} or more, or lower --slora-max-total-len")


def reservation_need(pairs: list[tuple[int, int]]) -> int:
    """S-LoRA's ``_can_add_new_req`` peak: ``pairs`` of ``(left, has)``, sorted by ``left``
    largest first; ``max_i(sum_{j<=i} has_j + (i+1) * left_i)`` (0 for no pair)."""
    return sorted_need(sorted(pairs, key=lambda p: -p[0]))


def sorted_need(pairs: list[tuple[int, int]]) -> int:
    """:func:`reservation_need` of ``pairs`` already in its order."""
    need = 0
    cum = 0
    for i, (left, has) in enumerate(pairs):
        cum += has
        v = cum + (i + 1) * left
        if v > need:
            need = v
    return need


class Reservations:
    """The ``(left, has)`` pairs of ``_can_add_new_req`` (S-LoRA's ``req_queue.py``) kept in
    :func:`reservation_need`'s order -- ``left`` largest first, equal ``left`` in the order added, as
    ``sorted`` leaves them -- with each pair's term of the need kept up to date, so that the need with
    one more pair (each candidate of an admission) is a bisection and two maxima over the kept terms,
    and a pair joins or leaves by one shift of the terms behind it: a few array operations (numpy), no
    Python pass over the pairs and no sort of them.

    The pairs are kept in coordinates that decodes do not change. A decode lowers every ``left`` by one
    and raises every ``has`` by one, so at decode count ``g`` the pair ``(left, has)`` is kept as
    ``f = left + g + 1`` and ``b = has - g - 1``; the term ``T_j = sum_{i<=j} has_i + (j+1) left_j =
    sum_{i<=j} b_i + (j+1) f_j`` does not depend on ``g`` (S-LoRA's need is constant while the running
    set is). So one instance serves the engine's running batch from step to step: the admission adds
    the mini-batch's pairs at ``g`` (:meth:`add`), the end of the prefill moves each to its decoding
    pair (:meth:`settle`: ``left`` one lower), the requests that finish in a decode leave at once (:meth:`finish`:
    theirs are the smallest ``f``, the last pairs, nothing to shift) and a squash takes one out (:meth:`remove`).

    A pair ``(F, B)`` goes after the ``p`` pairs with ``f_j >= F``: the terms before it stay, its own is
    ``sum_{j<p} b_j + B + (p+1) F`` (with ``sum_{j<p} b_j = T_{p-1} - p f_{p-1}``), each one behind it
    becomes ``T_j + B + f_j``, so ``need = max(0, max_{j<p} T_j, that, B + max_{j>=p} (T_j + f_j))``; a
    pair that leaves takes ``b + f_j`` off each term behind it (integers: exactly
    :func:`reservation_need`'s). Kept: ``nf = -f`` (ascending, for the bisection) and ``t = T``, the
    first ``n`` entries of each array, and the request of each pair (``rids``)."""

    __slots__ = ("g", "n", "nf", "t", "rids")

    def __init__(self, pairs: "Iterable[tuple[int, int]]" = (), g: int = 0) -> None:
        #: the decode count that :meth:`need_with`, :meth:`add` and :attr:`pairs` read ``(left, has)`` at
        self.g = g
        pairs = sorted(pairs, key=lambda p: -p[0])
        n = self.n = len(pairs)
        cap = max(2 * n, 16)
        self.nf = np.zeros(cap, np.int64)
        self.t = np.zeros(cap, np.int64)
        if n:
            lh = np.asarray(pairs, np.int64)
            f = lh[:, 0] + (g + 1)
            self.nf[:n] = -f
            self.t[:n] = np.cumsum(lh[:, 1] - (g + 1)) + np.arange(1, n + 1, dtype=np.int64) * f
        #: the request of each pair (-1: none given)
        self.rids: list[int] = [-1] * n

    def fork(self, g: int) -> "Reservations":
        """A copy read at decode count ``g`` (it shares the arrays: read it before this instance changes)."""
        r = Reservations.__new__(Reservations)
        r.g, r.n, r.nf, r.t, r.rids = g, self.n, self.nf, self.t, self.rids
        return r

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The ``(left, has)`` pairs at ``g``, in order."""
        n, g1 = self.n, self.g + 1
        f = -self.nf[:n]
        b = np.diff(self.t[:n] - np.arange(1, n + 1, dtype=np.int64) * f, prepend=0)
        return list(zip((f - g1).tolist(), (b + g1).tolist()))

    def need(self) -> int:
        """``reservation_need(pairs)``."""
        return max(int(self.t[:self.n].max()), 0) if self.n else 0

    def need_with(self, left: int, has: int) -> int:
        """``reservation_need(pairs + [(left, has)])``."""
        F = left + self.g + 1
        B = has - self.g - 1
        n = self.n
        nf = self.nf
        p = int(nf[:n].searchsorted(-F, "right"))
        if p:
            t = self.t
            need = int(t[p - 1]) + p * int(nf[p - 1]) + B + (p + 1) * F
            m = int(t[:p].max())
            if m > need:
                need = m
        else:
            need = B + F
        if p < n:
            c = B + int((self.t[p:n] - nf[p:n]).max())
            if c > need:
                need = c
        return need if need > 0 else 0

    def need_without(self, left: int, has: int, gone: "set[int] | frozenset[int]") -> int:
        """``need_with(left, has)`` were the pairs of the requests ``gone`` not there (a what-if: nothing
        changes). The kept pairs' ``(f, b)`` in order, the ``gone`` ones left out, the new pair after those
        with ``f`` at least as large, and the terms ``sum_{i<=j} b_i + (j+1) f_j`` summed afresh (integers:
        exactly :func:`reservation_need` of the remaining pairs and the new one)."""
        n = self.n
        nf, t = self.nf[:n], self.t[:n]
        idx = np.arange(1, n + 1, dtype=np.int64)
        f = -nf
        b = np.diff(t + idx * nf, prepend=0)
        if gone:
            keep = np.fromiter((r not in gone for r in self.rids), bool, n)
            f, b = f[keep], b[keep]
        F = left + self.g + 1
        p = int((-f).searchsorted(-F, "right"))
        f = np.insert(f, p, F)
        b = np.insert(b, p, has - self.g - 1)
        terms = np.cumsum(b) + np.arange(1, len(f) + 1, dtype=np.int64) * f
        need = int(terms.max())
        return need if need > 0 else 0

    def add(self, left: int, has: int, rid: int = -1) -> None:
        """The pair of request ``rid`` joins (an admitted request): after the pairs with ``left`` at least as large."""
        self.insert(rid, left + self.g + 1, has - self.g - 1)

    def insert(self, rid: int, f: int, b: int) -> None:
        """Request ``rid`` joins with ``f`` (``left + g + 1``) and ``b`` (``has - g - 1``): after the pairs
        with ``f`` at least as large."""
        n = self.n
        if n == len(self.nf):
            cap = 2 * n
            for name in ("nf", "t"):
                a = np.zeros(cap, np.int64)
                a[:n] = getattr(self, name)[:n]
                setattr(self, name, a)
        nf, t = self.nf, self.t
        p = int(nf[:n].searchsorted(-f, "right"))
        if p < n:  # each term behind it: T_j + b + f_j
            np.subtract(t[p:n], nf[p:n], out=t[p + 1:n + 1])
            t[p + 1:n + 1] += b
            nf[p + 1:n + 1] = nf[p:n]
        T = b + (p + 1) * f
        if p:
            T += int(t[p - 1]) + p * int(nf[p - 1])
        nf[p] = -f
        t[p] = T
        self.n = n + 1
        self.rids.insert(p, rid)

    def _index(self, rid: int, f: int) -> int:
        n = self.n
        if self.rids[n - 1] == rid:
            return n - 1
        seg = self.nf[:n]
        return self.rids.index(rid, int(seg.searchsorted(-f, "left")), int(seg.searchsorted(-f, "right")))

    def _b(self, j: int) -> int:
        nf, t = self.nf, self.t
        b = int(t[j]) + (j + 1) * int(nf[j])
        return b - int(t[j - 1]) - j * int(nf[j - 1]) if j else b

    def remove(self, rid: int, f: int) -> None:
        """Request ``rid``, kept with ``f``, leaves."""
        j = self._index(rid, f)
        n = self.n
        if j < n - 1:  # each term behind it: T_k - b - f_k
            nf, t = self.nf, self.t
            b = self._b(j)
            np.add(t[j + 1:n], nf[j + 1:n], out=t[j:n - 1])
            t[j:n - 1] -= b
            nf[j:n - 1] = nf[j + 1:n]
        self.n = n - 1
        del self.rids[j]

    def finish(self, g: int) -> None:
        """The pairs with ``f <= g`` leave: the requests that finish at decode count ``g``, whose ``f`` is the
        smallest (the last pairs: nothing behind them to shift)."""
        n = int(self.nf[:self.n].searchsorted(-g, "left"))
        del self.rids[n:]
        self.n = n

    def settle(self, rid: int, f: int) -> None:
        """Request ``rid``, kept with ``f``, goes on with ``f - 1`` (its ``left`` one lower, its ``has`` the
        same): behind the pairs with ``f - 1`` (or more) it was ahead of, each of which loses ``b + f_k``."""
        j = self._index(rid, f)
        nf, t = self.nf, self.t
        n = self.n
        k = int(nf[:n].searchsorted(1 - f, "right")) - 1  # its place: after every f_k >= f - 1
        b = self._b(j)
        if k > j:
            np.add(t[j + 1:k + 1], nf[j + 1:k + 1], out=t[j:k])
            t[j:k] -= b
            nf[j:k] = nf[j + 1:k + 1]
            del self.rids[j]
            self.rids.insert(k, rid)
        T = b + (k + 1) * (f - 1)
        if k:
            T += int(t[k - 1]) + k * int(nf[k - 1])
        nf[k] = 1 - f
        t[k] = T


def first_pass_step(running: "list[tuple[int, int]] | Reservations", failed: list[tuple[int, int, int, int]],
                    limit: int) -> float:
    """The first number of decode steps ``s`` (1..``limit``, no finish in between) after which the
    outcome of one of the ``failed`` candidates ``(left, has, room, room_without)`` changes, each
    tested alone against the ``running`` pairs ``(left, has)`` (or :class:`Reservations` of them):
    admitted (``need < room``), refused for its adapter's slots (``NO_SLOT``: ``need < room_without``)
    or for KV (``NO_KV``); inf if none.

    With the running requests sorted by ``left`` (``l_j``, ``h_j`` now), after ``s`` decodes
    they are ``(l_j - s, h_j + s)`` and the candidate ``(L, H)`` sits after the ``p(s)`` requests
    with ``l_j >= L + s``. A running request's own term ``T_j = sum_{i<=j} h_i + (j+1) l_j`` does
    not change with ``s``; behind the candidate it becomes ``T_j + H + l_j - s``; the candidate's
    is ``sum_{i<p} h_i + p s + H + (p+1) L``. So ``need(s) = max(max_{j<p} T_j, candidate,
    H - s + max_{j>=p} (T_j + l_j))``: prefix and suffix maxima make each ``s`` O(log n). The
    need may rise or fall with ``s`` (the candidate's window slides along the running requests'
    growth), so every ``s`` is evaluated; a test compares with :func:`reservation_need`."""
    res = running if isinstance(running, Reservations) else Reservations(running)
    n, g1 = res.n, res.g + 1
    nf, t = res.nf[:n], res.t[:n]
    idx = np.arange(1, n + 1, dtype=np.int64)
    neg_l = (nf + g1).tolist()                                               # -l_j
    pre_h = [0] + (t + idx * nf + idx * g1).tolist()                         # sum_{i<j} h_i
    pre_max = [-INF] + np.maximum.accumulate(t).tolist()                     # max_{i<j} T_i
    suf = np.maximum.accumulate((t - nf - g1)[::-1])[::-1].tolist() + [-INF]  # max_{i>=j} (T_i + l_i)
    best = INF
    for L, H, room, room_wo in failed:
        need0 = res.need_with(L, H)
        cat0 = 0 if need0 < room else 1 if need0 < room_wo else 2
        for s in range(1, min(limit, best - 1 if best < INF else limit) + 1):
            p = bisect_right(neg_l, -(L + s))  # running with l_j >= L + s
            need = pre_h[p] + p * s + H + (p + 1) * L
            if pre_max[p] > need:
                need = pre_max[p]
            c = H - s + suf[p]
            if c > need:
                need = c
            if (0 if need < room else 1 if need < room_wo else 2) != cat0:
                best = s
                break
    return best


class SLoRAPool(UnifiedPool):
    """S-LoRA's unified pool (``mem_allocator.py``) in token slots: an adapter takes
    ``ceil(bytes / KV bytes per token)`` slots (``4r`` for q, k, v, o of a multi-head model).
    Room is made by the engine at admission (:meth:`SLoRAEngine._evict_for_reservations`),
    never inside :meth:`allocate`."""

    def __init__(self, engine: "SLoRAEngine") -> None:
        super().__init__(engine, None)
        self.pool_blocks = engine.kv_tokens

    def can_place(self, a: int, extra_blocks: int = 0) -> bool:
        return self.ab[a] + extra_blocks <= self.e.kv_tokens

    def allocate(self, a: int, now: float, evict: bool = True) -> bool:
        """Slots for adapter ``a``: always granted to an admitted request (its reservation was
        tested); a prefetch gets them only from slots no reservation or resident adapter holds
        (after evicting idle adapters when ``evict``)."""
        e = self.e
        if not e._admitting:
            if self.ab[a] > e.unreserved_slots():
                if not evict:
                    return False
                mem = self.mem
                while self.ab[a] > e.unreserved_slots() and mem.any_evictable():
                    mem.evict_victim(now)
                if self.ab[a] > e.unreserved_slots():
                    return False
        e.lend_blocks(self.ab[a])
        self.adapter_blocks += self.ab[a]
        self.allocations += 1
        return True


class SLoRAExtensions:
    """What the engine's summary and checks read from ``engine.extensions`` (no vLLM
    extension is installed on this engine): the pool's counters and the policies' stats."""

    prefix = None
    handles_admission = False
    memory = "unified"  # adapters take slots of the KV pool (EngineState.memory_in_use)

    def __init__(self, engine: "SLoRAEngine", loader: "SLoRAPrefetcher | None") -> None:
        self.e = engine
        self.pool_blocks = engine.kv_tokens
        self.loader = loader

    def reclaimable(self, exclude_node: Any = None, exclude_adapter: int = -1) -> int:
        ab = self.e.adapters.placement.ab
        return sum(ab[v] for v in self.e.adapters.evictable() if v != exclude_adapter)

    def check(self) -> None:
        self.e.adapters.placement.check()

    def stats(self) -> dict[str, Any]:
        e = self.e
        out: dict[str, Any] = {"adapter_memory": "unified", "pool_blocks": e.kv_tokens,
                               "slora_batch_max_tokens": e.batch_max_tokens,
                               "slora_admission_attempts": e.n_attempts, "slora_failed_admissions": e.n_failed,
                               "slora_prefills": e.n_prefills, "slora_idle_polls": e.n_polls,
                               "slora_reservation_evictions": e.n_reservation_evictions}
        if self.loader is not None:
            out.update(self.loader.stats())
        out.update(policy_stats(e.cache))
        out.update(policy_stats(e.scheduler))
        return out


class SLoRAPrefetcher(AsyncLoader):
    """S-LoRA's ``--prefetch`` (``manager.py``, ``infer_adapter.py``; ``slora.md`` section 4 "Prefetch",
    checklist 13): when the decode counter is 5 or 7 the adapters the policies name are copied on a
    separate stream -- asynchronously over the host link, twice the adapter's bytes like every S-LoRA
    load -- into slots no reservation or resident adapter holds.

    ``queued`` is the scheduler whose ``prefetch()`` is S-LoRA's queued-request prefetch (S-LoRA's own:
    ``next_batch()``, the FIFO prefix of the queue whose prompts fit one mini-batch; Chameleon keeps it,
    ``chameleon.md`` sections 1-2, naming its queues' heads): its non-resident adapters are loaded in
    order, **stopping before** their slots exceed the free ones (the first that does not fit ends the
    prefetch: nothing behind it is tried), with no bound on the copies in flight (S-LoRA's loader has
    none). Every adapter it names up to there is *tagged* (``SLoRAEngine._prefetched``), those already
    resident and the one that does not fit included, and the partial offloads keep the resident tagged ones
    until the next prefetch (``slora.md`` section 4: "adapters tagged by the latest prefetch are protected from
    partial eviction"; ``InferAdapter.load_adapters(prefetch=True)`` tags each adapter it is given before its
    residency and capacity tests, as we read it: untagging a resident adapter the queue still names let the
    next finish offload it, and its queued request reloaded it synchronously -- 734 loads against 438 on the
    Chameleon reproduction's S-LoRA baseline at 8 req/s, stop 67's audit). A cache policy's own predictive prefetch (``chameleon+prefetch``) is that policy's feature:
    at most its ``max_inflight`` copies in flight, an adapter that does not fit skipped (as
    :class:`twin.prefetch.AsyncLoader` does on the vLLM engine)."""

    def __init__(self, engine: "SLoRAEngine", sources: list, queued: Any = None) -> None:
        super().__init__(engine, sources)
        #: the source whose prefetch is S-LoRA's queued-request prefetch (None: --prefetch is off)
        self.queued = queued

    def start(self, a: int, now: float, ctx: Any = None, evict: bool = True) -> bool:
        """Copy adapter ``a`` into free slots (after evicting idle adapters when ``evict``); False when
        it is resident or loading already, or does not fit."""
        mem = self.mem
        if a < 0 or mem.resident[a]:
            return False
        if not mem.placement.allocate(a, now, evict):
            return False
        mem.fetch(a, now)
        mem.mark_resident(a)
        self.started += 1
        # (host memory only: no disk read; S-LoRA's load copies each layer's whole w_combined, twice the bytes, §1)
        self._background(a, now, 0.0, mem.cpu_load_s[mem.ranks_l[a]], 2 * mem.bytes[a])
        self.e._prefetched.add(a)
        return True

    def decide(self, now: float, ctx: Any) -> None:
        mem = self.mem
        resident = mem.resident
        for src, (ask, evicts) in zip(self.sources, self._asks):
            if src is self.queued:  # S-LoRA's loader: in order, until one does not fit (infer_adapter.py)
                tagged = self.e._prefetched
                for a in ask(now):
                    if a < 0:
                        continue
                    tagged.add(a)  # (before the fit test: the adapter that ends the prefetch is tagged too)
                    if resident[a]:  # (resident, or its copy in flight: nothing to load)
                        continue
                    if not self.start(a, now, evict=evicts):
                        break
                continue
            cap = INF if src.max_inflight is None else src.max_inflight  # (None: no bound, interfaces.Policy)
            for a in ask(now):
                if len(mem.loading) >= cap:
                    break
                self.start(a, now, evict=evicts)


class SLoRAStepContext:
    """What :meth:`Scheduler.schedule_waiting` may use during one admission attempt: the prompt
    tokens left in ``batch_max_tokens`` (``budget``), the mini-batch ``admitted`` so far, the
    adapter ``loads`` its prefill waits for, ``now``; ``try_admit`` applies S-LoRA's test."""

    __slots__ = ("engine", "budget", "admitted", "chunks", "loads", "load_rids", "now", "reservations", "adapters",
                 "adapter_slots", "failed")

    def __init__(self, engine: "SLoRAEngine", budget: int, now: float) -> None:
        self.engine = engine
        self.budget = budget
        self.admitted: list[int] = []
        self.chunks: list[tuple[int, int]] = []
        self.loads: list = []
        self.load_rids: list[int] = []
        self.now = now
        self.reservations = engine._reservations  # (the running batch's: the mini-batch joins it as admitted)
        self.reservations.g = engine.g
        self.adapters = set(engine.adapters.batch)
        self.adapter_slots = engine._batch_slots
        #: candidates refused for memory: (left, has, room, room without the adapter's slots) --
        #: ``need < room`` admits, ``need < room without`` is NO_SLOT (the adapter is what does not fit)
        self.failed: list[tuple[int, int, int, int]] = []

    def try_admit(self, rid: int) -> Admit:
        return self.engine._try_admit(self, rid)


class SLoRAEngine(EngineState):
    """Simulates one S-LoRA server (see the module docstring). Use :func:`twin.simulate.simulate`
    with ``system="slora"``. Policies see it through :class:`twin.interfaces.EngineView`."""

    #: move SimPy's clock directly when no other event is pending (False: a timeout event per wait)
    direct_clock = True

    def __init__(self, workload: "Workload", profile: "Profile", config: EngineConfig, scheduler: Scheduler,
                 cache: AdapterCachePolicy, horizon_s: float | None = None, max_run_steps: int | None = None,
                 progress: bool = False, record_steps: bool = True, check_invariants: bool = False) -> None:
        check_slora_config(config, cache)
        if config.lora_targets is None:  # S-LoRA adapts q, k, v, o only (LoraLayerWeight)
            profile = profile.with_lora_targets(SLORA_TARGETS)
        self.lora_cost = PunicaLoraCost.from_profile(profile)
        super().__init__(workload, profile, config, scheduler, cache, horizon_s, max_run_steps, progress,
                         record_steps, check_invariants)
        self.proc = self.env.process(self._run())
        if not is_builtin(scheduler):  # a user's scheduler: its offers are checked
            self._try_admit = self._try_admit_checked  # (SLoRAStepContext.try_admit calls it)
        self.adapter_hit_code = bytearray(self.n)
        self._emitted0: dict[int, int] = {}   # tokens emitted before the current admission (squashed requests)
        self._stalled = 0                     # decoding requests that stalled through the last prefill
        self._stall_s = 0.0                   # ... and how long (loads + prefill)
        self.n_attempts = self.n_failed = self.n_prefills = self.n_polls = self.n_reservation_evictions = 0
        self._cut = False  # the step in flight at the horizon was left uncompleted: the router loop stops
        if progress:
            self.rec.progress_requests = int(np.count_nonzero(self.state != REJECTED))

    # ------------------------------------------------------------------ set-up (overrides EngineState)
    def _size_kv_cache(self) -> None:
        """``N_tok`` and S-LoRA's limits; the HTTP server's rejections (module docstring)."""
        cfg, profile = self.config, self.profile
        ranks = self.adapter_rank
        self.max_model_len = cfg.slora_max_total_len
        self.max_lora_rank = int(ranks.max()) if len(ranks) else 0
        self.kv_tokens = slora_pool_tokens(cfg, profile)
        if self.kv_tokens < 2:
            raise ConfigError(f"S-LoRA's pool holds {self.kv_tokens} token slots: {profile.model.name}'s weights leave "
                              f"no room ({profile.name}); set --max-total-tokens or use a GPU with more memory")
        self.block_size = 1  # one slot per KV token
        self.total_blocks = self.kv_tokens
        self.batch_max_tokens = batch_max_tokens(cfg, self.kv_tokens)
        # S-LoRA has no limit on the distinct adapters of a batch and nothing here costs per slot:
        # policies that read max_loras see every adapter allowed at once
        self.config = dataclasses.replace(cfg, max_loras=max(self.n_adapters, 1) + 1, block_size=1,
                                          max_num_batched_tokens=self.batch_max_tokens)
        self._cache_limits()
        self._apply_rejection_rules()

    def _apply_rejection_rules(self, adapter_blocks: list[int] | None = None) -> None:
        cfg, t = self.config, self.requests
        p, o = t.prompt, t.output
        slots = np.asarray(self.adapter_slots_of(), np.int64)
        has = t.adapter >= 0
        ab = np.where(has, np.append(slots, 0)[np.where(has, t.adapter, len(slots))], 0)
        reason = np.zeros(t.n, np.int8)
        reason[p > cfg.slora_max_prompt_len] = R_PROMPT
        reason[(reason == 0) & (p + o > cfg.slora_max_total_len)] = R_TOTAL
        reason[(reason == 0) & (p > self.batch_max_tokens)] = R_BATCH
        reason[(reason == 0) & (p + o + 1 > self.kv_tokens)] = R_POOL
        if cfg.served_adapters is not None and t.n_adapters:
            raw = np.where(has, t.adapter_ids[np.maximum(t.adapter, 0)], -1)
            reason[(reason == 0) & has & (raw >= cfg.served_adapters)] = R_UNSERVED
        # a lone request enters as (p + 1, o - 1): need = p + o, which must stay < N_tok - its adapter
        reason[(reason == 0) & (p + o >= self.kv_tokens - ab)] = R_NEVER
        t.set_rejections(reason)
        self.ok_cum = t.ok_cum

    def adapter_slots_of(self) -> list[int]:
        """Pool slots of each dense adapter: ``ceil(bytes / KV bytes per token)``."""
        per_tok = int(self.profile.components["kv"].params.get("kv_bytes_per_token")
                      or self.profile.model.kv_bytes_per_token)
        return [-(-self.profile.adapter_bytes(int(r)) // per_tok) for r in self.adapter_rank]

    def _attach_policies(self, workload: "Workload", scheduler: Scheduler, cache: AdapterCachePolicy) -> None:
        """Pinned host memory for every adapter, the unified pool, then the policies."""
        cfg = self.config
        self.link = HostLink(self.env)
        self.cache = cache
        self.scheduler = scheduler
        n_ad = max(self.n_adapters, 1)
        mem = self.adapters = AdapterMemory(self.adapter_rank, self.profile, n_ad, n_ad, cache, self.link, 1,
                                            self.max_lora_rank)
        mem.preload_cpu(range(self.n_adapters))  # --lora-dirs are read into pinned memory at start-up
        mem.cpu_load_s = {r: slora_load_s(self.profile, self.profile.adapter_bytes(r)) for r in mem.cpu_load_s}
        mem.use_placement(SLoRAPool(self), n_ad)
        # the scheduler's prefetch is S-LoRA's --prefetch (off in the paper runs: slora_prefetch);
        # a cache policy's own predictive prefetch (chameleon+prefetch) is that policy's feature
        sources = [p for p in ((scheduler,) if cfg.slora_prefetch else ()) + (cache,)
                   if type(p).prefetch is not Policy.prefetch]
        queued = scheduler if cfg.slora_prefetch else None
        loader = SLoRAPrefetcher(self, sources, queued) if sources else None
        self.extensions = SLoRAExtensions(self, loader)
        self._admit_hook = self._reclaim = self._finish_hook = None
        self._prefetch_on = loader is not None
        #: the scheduler does nothing on arrivals (``on_arrivals`` is the base's: FCFS and S-LoRA's own), so while no
        #: admission is due (S-LoRA's counter, ``has_wait_tokens``) an arrival changes nothing a decode run prices or
        #: decides, and a counting run need not end at one (:meth:`_decode`)
        self._arrivals_inert = getattr(scheduler.on_arrivals, "__func__", None) is Scheduler.on_arrivals
        self._bind_policies(scheduler, cache)

    def _init_step_state(self) -> None:
        super()._init_step_state()
        self.inp: dict[int, int] = {}        # running: tokens prefilled at its admission
        self.fin: dict[int, int] = {}        # running: decode count g at which it finishes
        self.base_sum = 0                    # sum over running of (inp - g at join): KV = base_sum + n * g
        self.rank_sum = 0                    # sum of the running requests' ranks (decode LoRA cost)
        self.counter = 0                     # has_wait_tokens
        self._poll0 = 0.0                    # idle polls at _poll0 + k * poll_s
        self._poll_k = 0
        self._stop: Admit | None = None
        self._failed: list[tuple[int, int, int, int]] = []
        self._admitting = False               # admission loads always get their slots
        self._prefetched: set[int] = set()    # adapters of the latest prefetch (kept by offloads)
        # the batch's adapters (``AdapterMemory.batch``) kept summed as they join and leave, so that no decode
        # or admission walks them: how many have each rank, and their pool slots
        self._batch_ranks: dict[int, int] = {}
        self._batch_slots = 0
        #: the running requests' reservation pairs in the admission test's order, kept as they join and leave
        self._reservations = Reservations()

    # ------------------------------------------------------------------ view (overrides EngineState)
    @property
    def pool_blocks(self) -> int:
        return self.kv_tokens

    def reclaimable_blocks(self) -> int:
        return self.extensions.reclaimable()

    def is_decoding(self, rid: int) -> bool:
        return rid in self.fin

    def kv_blocks_held(self, rid: int) -> int:
        d = self.dec.get(rid)
        return self.inp[rid] + self.g - d[0] if d is not None else 0

    def emitted_now(self, rid: int) -> int:
        if self.state[rid] == FINISHED:
            return int(self.output_a[rid])
        if rid in self.dec:
            return self._emitted0.get(rid, 0) + 1 + self.g - self.dec[rid][0]
        if rid in self.resume_T:
            return self.resume_T[rid] - int(self.prompt_a[rid])
        return 0

    # ------------------------------------------------------------------ the router loop
    def _run(self):
        env = self.env
        horizon = self.horizon
        check = self.check_invariants
        poll = self.config.slora_poll_s
        wait_max = self.config.slora_max_wait_tokens
        idle_fails = 0
        while True:
            now = env.now
            if now >= horizon:
                break
            if now >= self._next_arr_t:
                self._ingest(now)
            if now >= self._next_tick:
                self._tick(now)
            if now >= self._async_until:
                self._fire_events(now)
            ctx = None
            if not self.running:
                t_poll = self._poll0 + self._poll_k * poll
                if now >= t_poll:  # (a) no running batch: an admission attempt at each poll
                    self.n_polls += 1
                    ctx = self._admit(now)
                    if ctx is None:
                        self._poll_k += 1
                        idle_fails = idle_fails + 1 if self.n_waiting else 0
                if ctx is None:
                    t_poll = self._poll0 + self._poll_k * poll
                    if not self.n_waiting and self._next_arr_t < INF:  # no one waits: the first poll at/after the arrival
                        k = max(self._poll_k, math.ceil((self._next_arr_t - self._poll0) / poll))
                        while self._poll0 + k * poll < self._next_arr_t:
                            k += 1
                        while k > self._poll_k and self._poll0 + (k - 1) * poll >= self._next_arr_t:
                            k -= 1
                        self._poll_k = k
                        t_poll = self._poll0 + k * poll
                    nothing = self._next_arr_t == INF and self._async_until == INF
                    # nothing can arrive or change: nothing is left, or the rest wait (unfinished) --
                    # also after 16,000 failed idle polls (160 s at 10 ms) with only policy ticks pending
                    if nothing and (not self.n_waiting or (self._next_tick == INF and idle_fails > 0)
                                    or idle_fails > 16_000):
                        break
                    t_next = min(t_poll, self._async_until, self._next_tick, horizon)
                    if (wait := self._clock_wait(max(t_next - now, 0.0))) is not None:
                        yield wait
                    continue
            elif self.counter >= wait_max:  # (c) admission due: every iteration until it succeeds
                ctx = self._admit(now)
            if ctx is not None:
                idle_fails = 0
                yield from self._prefill(ctx, now)
            else:
                yield from self._decode(now, self.counter < wait_max)
            if self._cut:  # the step ends after the horizon: in flight there, not completed
                break
            if check:
                self.assert_invariants()
            if self.progress:
                self.rec.progress(env.now, horizon, self.n_finished)
        self.rec.close_progress()

    def _ingest(self, now: float) -> None:
        """Requests that arrived by ``now`` join the waiting queue (rejected ones are counted)."""
        lo = self.arr_ptr
        hi = int(np.searchsorted(self.arrival, now, side="right"))
        self.arr_ptr = hi
        self._next_arr_t = self.arrival_a[hi] if hi < self.n else INF
        ok = self.ok_cum
        self.n_waiting += ok[hi] - ok[lo]
        self.scheduler.on_arrivals(lo, hi)

    # ------------------------------------------------------------------ admission
    def unreserved_slots(self) -> int:
        """Slots that neither the running requests' reservations nor resident adapters hold."""
        return self.kv_tokens - self._reservations.need() - self.adapters.placement.adapter_blocks

    def _loading_slots(self, exclude: set[int]) -> int:
        ab = self.adapters.placement.ab
        return sum(ab[a] for a in self.adapters.loading if a not in exclude)

    def _running_pairs(self) -> list[tuple[int, int]]:
        """``(left, has)`` of every running request (``_init_cache_list``): has + left = inp + out - 1."""
        g = self.g
        out = []
        for rid, (j0, fg) in self.dec.items():
            left = fg - g - 1
            out.append((left, self.inp[rid] + (fg - j0) - left))
        return out

    def _admit(self, now: float) -> SLoRAStepContext | None:
        """One call of ``generate_new_batch``: the mini-batch, or None (nothing admissible)."""
        self._failed = []
        if not self.n_waiting:
            self._stop = None
            return None
        self.n_attempts += 1
        ctx = SLoRAStepContext(self, self.batch_max_tokens, now)
        self._stop = self._schedule_waiting(ctx)
        if not ctx.admitted:
            self.n_failed += 1
            self._failed = ctx.failed
            return None
        return ctx

    def first_pass_step(self, failed: list[tuple[int, int, int, int]], limit: int) -> float:
        """:func:`first_pass_step` over the running requests now."""
        return first_pass_step(self._reservations.fork(self.g), failed, limit)

    def _try_admit_checked(self, ctx: SLoRAStepContext, rid: int) -> Admit:
        """``ctx.try_admit`` for a scheduler that is not built in: an offer of a request that is not
        waiting is refused (:meth:`EngineState.check_offer`), then :meth:`_try_admit`."""
        self.check_offer(rid, ctx)
        return SLoRAEngine._try_admit(self, ctx, int(rid))

    def _try_admit(self, ctx: SLoRAStepContext, rid: int) -> Admit:
        """S-LoRA's test for one waiting request (``_can_add_new_req``; module docstring)."""
        if len(self.running) >= self.config.running_max_req_size:
            return NO_SEQ
        T = self.resume_T.get(rid) or self.prompt_a[rid]
        if T > ctx.budget:
            return NO_BUDGET
        out_left = self.output_a[rid] - (T - self.prompt_a[rid])
        a = self.adapter_a[rid]
        ab = self.adapters.placement.ab
        new_ad = ab[a] if a >= 0 and a not in ctx.adapters else 0
        pair = (out_left - 1, T + 1)
        need = ctx.reservations.need_with(*pair)
        room = self.kv_tokens - ctx.adapter_slots
        if self.adapters.loading:  # prefetches in flight hold their slots (they cannot be evicted)
            room -= self._loading_slots(ctx.adapters | ({a} if a >= 0 else set()))
        if not need < room - new_ad:
            slot = bool(new_ad) and need < room
            ctx.failed.append((pair[0], pair[1], room - new_ad, room))
            return NO_SLOT if slot else NO_KV
        # admitted: the mini-batch grows
        ctx.reservations.add(*pair, rid)
        if new_ad:
            ctx.adapters.add(a)
            ctx.adapter_slots += new_ad
        ctx.budget -= T
        ctx.chunks.append((rid, T))
        ctx.admitted.append(rid)
        self.running[rid] = None
        self.prefilling[rid] = None
        self.resume_T.pop(rid, None)
        self.n_waiting -= 1
        if a >= 0:
            if self._wad is not None:  # (kept once a policy asked: waiting_adapter_counts)
                self._wad[a] -= 1
        now = ctx.now
        ad = self.adapters
        if not self._seen[rid]:
            self._seen[rid] = 1
            self._first_sched_a[rid] = now
            if a >= 0:
                self.adapter_hit_code[rid] = 1 if ad.resident[a] and ad.loaded_at[a] != now else 2
        if a >= 0:
            self._admitting = True
            ld = ad.acquire(a, now)
            self._admitting = False
            if ad.active[a] == 1:
                self._batch_changed(a)
            if ld is not None:
                ld.nbytes *= 2  # load_lora_A then load_lora_B: each layer's w_combined copied twice
                ctx.loads.append(ld)
                ctx.load_rids.append(rid)
            self.rank_sum += int(self.adapter_rank[a])
        self._evict_for_reservations(need, ctx.adapter_slots, now)  # (the reservations' need: pair is in it now)
        return OK

    def admits_without(self, rid: int, gone: "Iterable[int]" = ()) -> bool:
        """Whether S-LoRA's admission test (:meth:`_try_admit`: ``ReqQueue._can_add_new_req``, ``slora.md``
        section 2) would admit waiting request ``rid`` now, as the first candidate of an attempt (the whole
        ``batch_max_tokens`` left), were the running requests ``gone`` not there: their reservation pairs left
        out, and the slots of each adapter whose every running request is among them. The same integers as
        :meth:`_try_admit` (the running requests' pairs and ``rid``'s, the strict ``need < N_tok - the distinct
        adapters' slots - the slots of prefetches in flight``, ``running_max_req_size``), and nothing changes: a
        policy's what-if, e.g. Chameleon's squash test (would the head get in were the bypasser squashed?,
        :meth:`policies.chameleon.ChameleonScheduler.head_fits_without`) and its predicted wait."""
        running = self.running
        gone = frozenset(r for r in gone if r in running)
        if len(running) - len(gone) >= self.config.running_max_req_size:
            return False
        T = self.resume_T.get(rid) or int(self.prompt_a[rid])
        if T > self.batch_max_tokens:
            return False
        out_left = int(self.output_a[rid]) - (T - int(self.prompt_a[rid]))
        res = self._reservations.fork(self.g)
        need = res.need_without(out_left - 1, T + 1, gone) if gone else res.need_with(out_left - 1, T + 1)
        mem = self.adapters
        ab = mem.placement.ab
        batch = mem.batch
        slots = self._batch_slots
        if gone:
            users: dict[int, int] = {}
            for r in gone:
                b = self.adapter_a[r]
                if b >= 0:
                    users[b] = users.get(b, 0) + 1
            leave = {b for b, k in users.items() if mem.active[b] == k}  # their last running requests go
            if leave:
                batch = batch - leave
                slots -= sum(ab[b] for b in leave)
        a = self.adapter_a[rid]
        room = self.kv_tokens - slots
        if mem.loading:  # prefetches in flight hold their slots
            room -= sum(ab[x] for x in mem.loading if x not in batch and x != a)
        new_ad = ab[a] if a >= 0 and a not in batch else 0
        return need < room - new_ad

    def squashable(self, rid: int) -> bool:
        """:meth:`squash` would take running request ``rid`` out: it is decoding and its recompute (prompt +
        emitted tokens) fits one prefill mini-batch."""
        return (rid in self.running and rid in self.dec
                and int(self.prompt_a[rid]) + self.emitted_now(rid) <= self.batch_max_tokens)

    def _evict_for_reservations(self, need: int, adapter_slots: int, now: float) -> None:
        """Idle cached adapters give their slots back, in the cache policy's victim order, until
        the reservations, the batch's adapters and the idle adapters fit in ``N_tok``."""
        mem = self.adapters
        ab = mem.placement.ab
        idle = mem.placement.adapter_blocks - self._batch_slots  # (loading ones included)
        while idle > self.kv_tokens - adapter_slots - need and mem.any_evictable():
            v = mem.evict_victim(now)
            idle -= ab[v]
            self.n_reservation_evictions += 1

    # ------------------------------------------------------------------ iterations
    def _step_cpu_s(self) -> float:
        return self.profile.scheduler_s(len(self.running), 0, 0, self.served)

    def _prefill_s(self, ctx: SLoRAStepContext) -> float:
        ranks = self.adapter_rank
        tok = tok_rank = n_lora = max_r = max_len = 0
        for rid, T in ctx.chunks:
            tok += T
            a = self.adapter_a[rid]
            if a >= 0:
                r = int(ranks[a])
                tok_rank += T * r
                n_lora += 1
                max_r = r if r > max_r else max_r
                max_len = T if T > max_len else max_len
        lora = self.lora_cost.prefill_s(tok_rank, tok, max_r, n_lora, max_len) if n_lora else 0.0
        return self._step_cpu_s() + (self.profile.backbone_s(tok, 0, 0) + lora)

    def _decode_terms(self, n: int, max_r: int) -> tuple[float, float]:
        """A decode step's host time and LoRA time: constant while the running set and its ranks are."""
        return self._step_cpu_s(), self.lora_cost.decode_s(self.rank_sum, max_r, n)

    def _decode_s(self, n: int, ctx_tok: int, max_r: int) -> float:
        """One decode step of ``n`` requests attending to ``ctx_tok`` tokens (:meth:`_decode` sums these)."""
        cpu, lora = self._decode_terms(n, max_r)
        return cpu + (self.profile.backbone_s(0, n, ctx_tok) + lora)

    def _lone_step_s(self, prefill: int, ctx: int, rank: int) -> float:
        """A lone request's step (:meth:`EngineState.unloaded_service_s`) as this engine prices its iterations
        (:meth:`_prefill_s`, :meth:`_decode_s`): S-LoRA's Punica LoRA cost of one adapter of ``rank``, not the vLLM
        profile's kernel grid over slots."""
        prof = self.profile
        cpu = prof.scheduler_s(1, 0, 0, self.served)
        if prefill:
            return float(cpu + prof.backbone_s(prefill, 0, 0) + self.lora_cost.prefill_s(prefill * rank, prefill, rank,
                                                                                          1, prefill))
        return float(cpu + prof.backbone_s(0, 1, ctx) + self.lora_cost.decode_s(rank, rank, 1))

    def _batch_max_rank(self) -> int:
        return max(self._batch_ranks, default=0)

    def _batch_changed(self, a: int) -> None:
        """Adapter ``a`` joined the batch (its first running request) or left it (its last one ended)."""
        r = int(self.adapter_rank[a])
        ranks = self._batch_ranks
        if self.adapters.active[a]:
            ranks[r] = ranks.get(r, 0) + 1
            self._batch_slots += self.adapters.placement.ab[a]
        else:
            ranks[r] -= 1
            if not ranks[r]:
                del ranks[r]
            self._batch_slots -= self.adapters.placement.ab[a]

    def _prefill(self, ctx: SLoRAStepContext, now: float):
        """Load the mini-batch's missing adapters (synchronously, over the link), prefill it."""
        env = self.env
        load_s = 0.0
        d = self._prefill_s(ctx)
        if ctx.loads:
            # when the loads end, from the link's FIFO state (the prefetches in flight, then these copies behind
            # them: HostLink.loads_end, exact), so a prefill that would end after the horizon does not start them
            # -- in flight there
            check = self.check_invariants
            if self.horizon < INF or check:
                end = self.link.loads_end(now, ctx.loads)
                if end + d > self.horizon:
                    self._cut = True
                    return
            for ld in ctx.loads:
                if ld.wait is not None:  # a prefetch still in flight: the prefill waits for it
                    yield ld.wait
                    continue
                yield env.process(self.link.transfer(ld.nbytes, ld.link_s))
            if check:
                assert env.now == end, f"the loads ended at {env.now}, not when the link's schedule says ({end})"
            load_s = env.now - now
            lw = self.load_wait_d
            for rid in ctx.load_rids:
                lw[rid] = lw.get(rid, 0.0) + load_s
        if env.now + d > self.horizon:  # in flight at the horizon: its first tokens come after the window
            self._cut = True
            return
        stalled = len(self.dec)
        if (wait := self._clock_wait(d)) is not None:
            yield wait
        self._complete_prefill(ctx, now, d, load_s)
        self._stalled, self._stall_s = stalled, (env.now - now) if stalled else 0.0

    def _complete_prefill(self, ctx: SLoRAStepContext, t0: float, d: float, load_s: float) -> None:
        """End of a prefill: each request of the mini-batch emits its first token here
        (*its TTFT is decided here*) and joins the decode batch, or finishes (output 1)."""
        now = self.env.now
        self.n_prefills += 1
        self.counter = 0
        g = self.g
        prefill_tok = 0
        # the batch during the prefill, recorded before the requests that end in it (output 1) leave
        batch, active, resident = len(self.running), self.adapters.n_active, self.adapters.resident_bytes
        ended_tokens = 0
        res = self._reservations
        for rid, T in ctx.chunks:
            prefill_tok += T
            del self.prefilling[rid]
            if rid not in self.preempt_d or self._first_token_a[rid] != self._first_token_a[rid]:
                self._first_token_a[rid] = now          # <- TTFT is decided here
            else:
                self.gap_itl.append(now - self.last_token_d[rid])  # resumed after a squash
            e0 = T - int(self.prompt_a[rid])
            out_left = int(self.output_a[rid]) - e0
            if out_left <= 1:
                res.remove(rid, g + out_left)
                ended_tokens += T
                self._finish(rid, now, evict=False)
                continue
            self._emitted0[rid] = e0
            self.inp[rid] = T
            fg = g + out_left - 1
            self.dec[rid] = (g, fg)
            res.settle(rid, fg + 1)  # (admitted with left out_left - 1: now one token less)
            self.fin[rid] = fg
            self.base_sum += T - g
            self.n_dec += 1
            heapq.heappush(self.fin_heap, (fg, rid))
        self.used_blocks = self.base_sum + self.n_dec * g
        if not self.running:
            self._batch_emptied(now)
        self.rec.step(t0, now, 1, d, None, d + load_s, batch, prefill_tok, 0, active,
                      self.used_blocks + ended_tokens, resident, sum(ld.copies for ld in ctx.loads), sum(ld.nbytes for ld in ctx.loads))

    def _decode(self, now: float, counting: bool):
        """Decode steps of every running request: one, or a run in which nothing can change."""
        g, n = self.g, self.n_dec
        heap, dec = self.fin_heap, self.dec
        while heap and (heap[0][1] not in dec or dec[heap[0][1]][1] != heap[0][0]):
            heapq.heappop(heap)
        k_max = heap[0][0] - g if heap else 1
        if counting:
            wait_max = self.config.slora_max_wait_tokens
            k_max = min(k_max, wait_max - self.counter)
            if self._prefetch_on:  # S-LoRA prefetches before the decodes at counters max/2 and max - 3
                marks = (wait_max // 2, wait_max - 3)
                if self.counter in marks:
                    self._prefetched = set()
                    self.extensions.loader.decide(now, None)
                later = [m - self.counter for m in marks if m > self.counter]
                if later:
                    k_max = min(k_max, min(later))
        if self._stalled:
            k_max = 1  # the first decode after a prefill carries the stalled requests' gap
        k_max = min(k_max, self.max_run_steps)
        # arrivals end a run too: a policy hears of them (on_arrivals) at the step boundary after
        # them, as when stepping one iteration at a time (Chameleon refreshes its queues there) -- unless no
        # admission is due and the scheduler does nothing on arrivals: they join the queue at the run's end
        # (:meth:`_complete_decode`), those before its last step ahead of its finishes, as stepping has them
        t_evt = min(self._async_until, self._next_tick, self._observe_t)
        if not (counting and self._arrivals_inert):
            t_evt = min(t_evt, self._next_arr_t)
        if not counting:  # admission is attempted at every iteration: until its outcome may change
            t_evt = min(t_evt, self._next_change_time(self._stop))
            if self._failed and k_max > 1:  # a refused candidate may pass as the running requests progress
                k_max = min(k_max, self.first_pass_step(self._failed, k_max))
        max_r = self._batch_max_rank()
        ctx_tok = self.used_blocks
        t = now
        k = 0
        durs: list[float] = []
        append = durs.append
        # each step is :meth:`_decode_s` written out on the run's constants: the host time (the running set) and
        # the LoRA time (the batch's ranks and size) do not change within a run, only the context does; the same
        # float operations in the same order, so the durations are the ones stepping gives (a test compares)
        cpu, lora = self._decode_terms(n, max_r)
        backbone = self.profile.backbone_s
        t_last = t  # the last step's start
        while k < k_max:
            d = cpu + (backbone(0, n, ctx_tok) + lora)
            append(d)
            t_last = t
            t += d
            k += 1
            ctx_tok += n
            if t >= t_evt:
                break
        if k > 1 and t > self._observe_t:  # the last step crosses the horizon or a check: the run ends before it
            durs.pop()
            k -= 1
            t = t_last  # (the end of step k: the start of the step dropped)
            t_last = now
            for x in durs[:-1]:  # (the start of the run's last step, summed as the loop sums it)
                t_last += x
        elif t > self.horizon:  # one step, ending after the horizon: in flight there, not completed
            self._cut = True
            return
        # the clock lands on the summed end (one step: now + d, as a single step's)
        if (wait := (self._clock_wait(durs[0]) if k == 1 else self._clock_until(t))) is not None:
            yield wait
        self._complete_decode(now, k, durs, counting, t_last)

    def _complete_decode(self, t0: float, k: int, durs: list[float], counting: bool, t_last: float) -> None:
        now = self.env.now
        if t_last >= self._next_arr_t:  # (a counting run over arrivals: those by its last step's start wait now)
            self._ingest(t_last)
        n = self.n_dec
        self.g = g1 = self.g + k
        if counting:
            self.counter += k
        elif k > 1 and self.n_waiting:  # stepping would have attempted (and failed) before each step of the run
            self.n_attempts += k - 1
            self.n_failed += k - 1
        if self._stalled:  # stalled requests: one ITL sample each of (prefill + this decode)
            self.gap_itl.extend([self._stall_s + durs[0]] * self._stalled)
            itl_n = n - self._stalled  # (their tokens are this step's decode tokens all the same)
            self._stalled = 0
        else:
            itl_n = None
        # (the row's duration_s is the segment's, t1 - t0, as on the vLLM engine; the ITL samples are the steps'
        # durations, durs, for one step too: t1 - t0 of a step can differ from its duration in the last bit)
        self.rec.step(t0, now, k, durs[0], durs, now - t0, len(self.running),
                      0, n, self.adapters.n_active, self.base_sum + n * g1, self.adapters.resident_bytes, 0, 0, itl_n)
        heap, dec = self.fin_heap, self.dec
        finished = False
        while heap and heap[0][0] <= g1:
            fg, rid = heapq.heappop(heap)
            dd = dec.get(rid)
            if dd is not None and dd[1] == fg:
                self._finish(rid, now, evict=True)
                finished = True
        if finished:
            self._reservations.finish(g1)
        self.used_blocks = self.base_sum + self.n_dec * g1
        if finished:
            self._evict_idle(now)  # offload_adapters after a decode in which a request finished
        if not self.running:
            self._batch_emptied(now)

    def _finish(self, rid: int, now: float, evict: bool) -> None:
        del self.running[rid]
        if rid in self.dec:  # (its reservation pair left with the decode's others: _complete_decode)
            j0, _ = self.dec.pop(rid)
            self.fin.pop(rid)
            self.base_sum -= self.inp.pop(rid) - j0
            self.n_dec -= 1
        self._emitted0.pop(rid, None)
        self.state[rid] = FINISHED
        self._finish_a[rid] = now
        self.n_finished += 1
        a = self.adapter_a[rid]
        if a >= 0:
            self.rank_sum -= int(self.adapter_rank[a])
            self._release(a, now, evict)
        self.scheduler.on_finish(rid)

    def _release(self, a: int, now: float, evict: bool) -> None:
        """The request leaves the batch; its adapter, when idle, is offered to the cache policy now
        (after a decode) or at the next offload (a finish in a prefill, a squash). An adapter the latest prefetch
        tagged stays (``offload_adapters`` keeps them: S-LoRA ``manager.py``), as in :meth:`_evict_idle`."""
        self.adapters.release(a, now, evict_idle=evict and a not in self._prefetched)
        if not self.adapters.active[a]:
            self._batch_changed(a)

    def _evict_idle(self, now: float, keep_prefetched: bool = True) -> None:
        """``offload_adapters``: idle resident adapters go when the cache policy says so (a policy that
        keeps them all, ``AdapterMemory.keeps_idle``, is not asked: a scan of every idle cached adapter
        after each finish cost O(adapters) per decode); after a decode the latest prefetch's adapters stay
        (``keep_prefetched``: a partial offload), when the batch empties they go too (:meth:`_batch_emptied`)."""
        mem = self.adapters
        if mem.keeps_idle:
            return
        evict_when_idle = mem.evict_when_idle
        keep = self._prefetched if keep_prefetched else ()
        for a in mem.evictable():
            if a not in keep and evict_when_idle(a):
                mem.evict(a, now)

    def _batch_emptied(self, now: float) -> None:
        """``_filter_runing_batch`` with an empty batch: every idle adapter is offloaded (the latest prefetch's
        too: ``slora.md`` section 4), then poll every ``poll_s``."""
        self._evict_idle(now, keep_prefetched=False)
        self._poll0 = now
        self._poll_k = 1

    def squash(self, rid: int) -> None:
        """A policy's preemption of running request ``rid`` (Chameleon's squash of a bypasser):
        its KV is freed and it waits again, to recompute prompt + emitted tokens. A request whose
        recompute no prefill mini-batch can hold (more than ``batch_max_tokens``: S-LoRA prefills a
        request whole) is left running: it could never be admitted again."""
        if not self.squashable(rid):
            return
        now = self.env.now
        e = self.emitted_now(rid)
        j0, fg = self.dec.pop(rid)
        self._reservations.remove(rid, fg)
        self.fin.pop(rid)
        self.base_sum -= self.inp.pop(rid) - j0
        self.n_dec -= 1
        del self.running[rid]
        self._emitted0.pop(rid, None)
        self.used_blocks = self.base_sum + self.n_dec * self.g
        self.resume_T[rid] = int(self.prompt_a[rid]) + e
        self.last_token_d[rid] = now
        self.n_waiting += 1
        self.preempt_d[rid] = self.preempt_d.get(rid, 0) + 1
        self.rec.preemptions += 1
        a = self.adapter_a[rid]
        if a >= 0:
            if self._wad is not None:  # (kept once a policy asked: waiting_adapter_counts)
                self._wad[a] += 1
            self.rank_sum -= int(self.adapter_rank[a])
            self._release(a, now, False)
        self.scheduler.on_preempt(rid)
        if not self.running:
            self._batch_emptied(now)

    def run(self) -> None:
        self.env.run(until=self.proc)
        self.finalize()

    # ------------------------------------------------------------------ checks
    def assert_invariants(self, mid_step: bool = False) -> None:
        """S-LoRA's pool: KV + resident adapters <= N_tok, reservations + resident adapters
        <= N_tok, no prefill left over, the decode aggregate and the counts in sync."""
        g = self.g
        kv = sum(self.inp[r] + g - self.dec[r][0] for r in self.running)
        assert kv == self.used_blocks, f"KV accounting: held {kv} != used {self.used_blocks}"
        mem = self.adapters
        pl = mem.placement
        ad_slots = pl.adapter_blocks
        assert self.total_blocks == self.kv_tokens - ad_slots, "pool accounting: KV capacity != N_tok - adapters"
        assert kv + ad_slots <= self.kv_tokens, f"pool overflow: KV {kv} + adapters {ad_slots} > {self.kv_tokens}"
        pairs = self._running_pairs()
        need = reservation_need(pairs)
        res = self._reservations
        assert res.need() == need and res.n == len(pairs), "kept reservations' need out of sync"
        assert res.fork(g).pairs == sorted(pairs, key=lambda p: -p[0]), "kept reservation pairs out of sync"
        assert res.rids == sorted(self.dec, key=lambda r: -self.dec[r][1]), "kept reservations' requests out of order"
        assert need + ad_slots <= self.kv_tokens, f"reservations {need} + adapters {ad_slots} > {self.kv_tokens}"
        assert not self.prefilling, "a prefill outlived its iteration"
        assert len(self.running) <= self.config.running_max_req_size, "more running requests than running_max_req_size"
        assert len(self.dec) == self.n_dec == len(self.running), "decode aggregate out of sync"
        assert self.rank_sum == sum(int(self.adapter_rank[self.adapter_a[r]]) for r in self.running
                                    if self.adapter_a[r] >= 0), "rank sum out of sync"
        res = np.asarray(mem.resident, bool)
        act = np.asarray(mem.active, np.int64)
        assert bool(np.all(res[act > 0])), "an adapter in use is not resident"
        assert mem.n_active == int((act > 0).sum()), "active adapter count out of sync"
        ranks: dict[int, int] = {}
        for r in (int(self.adapter_rank[a]) for a in mem.batch):
            ranks[r] = ranks.get(r, 0) + 1
        assert self._batch_ranks == ranks, "the batch's ranks out of sync"
        assert self._batch_slots == sum(pl.ab[a] for a in mem.batch), "the batch's pool slots out of sync"
        self._assert_queue_accounting()
        pl.check()


#: :class:`EngineConfig` fields of the vLLM engine that the S-LoRA engine does not read (its own limits are the
#: ``slora_*`` fields, ``running_max_req_size`` and ``max_total_tokens``): left out of an S-LoRA run's recorded
#: ``config`` (the summary's), which otherwise read as settings of the run (``twin/scenario.py``'s
#: ``SYSTEM_OPTIONS`` refuses their flags on this engine)
VLLM_ONLY_CONFIG = ("max_num_batched_tokens", "max_num_seqs", "max_loras", "max_cpu_loras", "max_lora_rank",
                    "max_model_len", "adapter_memory", "adapter_placement", "adapter_region_bytes", "prefix_caching")


def check_slora_config(config: EngineConfig, cache: AdapterCachePolicy) -> None:
    """Refuse what the S-LoRA engine cannot run, naming the fix (before any work)."""
    if not config.enable_lora:
        raise ConfigError("enable_lora=False with the S-LoRA engine: S-LoRA always serves adapters (it has no switch "
                          "like vLLM's --enable-lora, so its requests' adapters would be served regardless); leave "
                          "enable_lora on, or use the vLLM engine (system='vllm') to reject LoRA requests")
    if config.tensor_parallel > 1:
        raise ConfigError(f"--tp {config.tensor_parallel} with --system slora: the released S-LoRA runs on one GPU "
                          f"(LoraTpPartAdapter asserts world_size == 1); use --tp 1 or --system vllm")
    if cache.adapter_memory not in (None, "unified"):
        raise ConfigError(f"cache policy {cache.name!r} keeps adapters in a {cache.adapter_memory!r} memory, a vLLM-engine "
                          f"layout; S-LoRA keeps them in its unified pool: use --system vllm with it")
    if cache.lora_share:
        raise ConfigError(f"cache policy {cache.name!r}: lora_share {cache.lora_share} sizes a vLLM-engine adapter "
                          f"region; S-LoRA keeps adapters in its unified pool: leave lora_share out or use --system vllm")
    if cache.prefetch_sync and type(cache).prefetch is not Policy.prefetch:
        raise ConfigError(f"cache policy {cache.name!r} prefetches synchronously (on the deciding step's critical path), "
                          f"a vLLM-engine extension; S-LoRA's loader copies on its own stream in the background "
                          f"(slora.md section 4), so it would run asynchronously: use its asynchronous variant (e.g. "
                          f"ema-prefetch) or --system vllm")
    if cache.prefix_kv or config.prefix_caching:
        raise ConfigError(f"prefix-KV reuse (cache policy {cache.name!r} or prefix_caching) is a vLLM-engine extension; "
                          f"S-LoRA frees a request's KV when it finishes: use --system vllm with it")
    for name in ("slora_max_prompt_len", "slora_max_total_len", "running_max_req_size", "slora_max_wait_tokens"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    check_batch_max_tokens(config)
    if not config.slora_poll_s > 0:
        raise ConfigError(f"slora_poll_s must be > 0, got {config.slora_poll_s}")
