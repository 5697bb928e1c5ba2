"""Shortest predicted job first with aging (muServe-style).

Qiu et al., *Power-aware Deep Learning Model Serving with muServe*, USENIX ATC'24, §4:
requests are ordered by their *predicted* output length (a speculative shortest-job-first
that uses an output-length predictor), and starvation is prevented by aging. Chameleon
(MICRO'25, §6) uses it as the ``S-LoRA+SJF`` baseline and varies the predictor's accuracy
(100%, 80%, 60%: :class:`policies.common.OutputPredictor`).

Priority (smaller first)::

    priority(r, now) = predicted_output(r) - aging * (now - arrival(r))

``aging`` is in tokens per second waited (default 50: a request that waited 10 s overtakes
one predicted 500 tokens shorter). Since every waiting request ages at the same rate, the
order equals the order of ``predicted_output(r) + aging * arrival(r)``, which does not change
with time: the queue is a heap on that key. A request preempted by the engine keeps its key.

Admission follows vLLM's checks (``StepContext.try_admit``): a request whose adapter cannot
get a slot is skipped (up to ``max_skips`` per step); any other refusal stops the step.
"""

from __future__ import annotations

import heapq
import math
from typing import Iterable

from policies.common import OutputPredictor, adapters_of
from twin.registry import Preset, register_preset, register_scheduler
from twin.interfaces import Admit, EngineView, Scheduler

INF = math.inf


@register_scheduler
class SJFScheduler(Scheduler):
    name = "sjf"
    description = "shortest predicted output first with aging (muServe); predictor accuracy is a parameter"
    citation = "Qiu et al., muServe, ATC'24 §4; S-LoRA+SJF baseline of Chameleon MICRO'25 §6"

    def __init__(self, accuracy: float = 1.0, aging: float = 50.0, seed: int = 0, max_skips: int = 64) -> None:
        super().__init__()
        self.accuracy = accuracy
        self.aging = aging
        self.seed = seed
        self.max_skips = max_skips

    def bind(self, engine: EngineView) -> None:
        super().bind(engine)
        self.pred = OutputPredictor(engine, self.accuracy, self.seed)
        self.heap: list[tuple[float, int]] = []
        self.ok = (engine.reject_reason == 0).tolist()
        self._capped = False

    def key(self, rid: int) -> float:
        return self.pred[rid] + self.aging * self.engine.arrival_a[rid]

    def on_arrivals(self, lo: int, hi: int) -> None:
        ok, heap = self.ok, self.heap
        for rid in range(lo, hi):
            if ok[rid]:
                heapq.heappush(heap, (self.key(rid), rid))

    def on_preempt(self, rid: int) -> None:
        heapq.heappush(self.heap, (self.key(rid), rid))

    def schedule_waiting(self, ctx) -> Admit | None:
        heap = self.heap
        skipped: list[tuple[float, int]] = []
        stop = None
        self._capped = False
        while heap:
            item = heap[0]
            r = ctx.try_admit(item[1])
            if r == Admit.OK:
                heapq.heappop(heap)
                continue
            if r == Admit.NO_SLOT:
                skipped.append(heapq.heappop(heap))
                if len(skipped) >= self.max_skips:
                    self._capped = True
                    stop = r
                    break
                continue
            stop = r
            break
        for item in skipped:
            heapq.heappush(heap, item)
        return stop

    def next_change_time(self, stop: Admit | None) -> float:
        if stop == Admit.NO_SEQ:
            return INF  # the running set is full until a finish ends the run
        # a new, shorter request may fit; the skipped ones (capped or not) stay refused for a slot until the
        # batch's adapters change, which only a finish, an admission or a load's end does, and each ends the
        # run anyway (it re-planned every step once capped: 28x FCFS's time on an overloaded many-adapter run)
        return self.engine.next_arrival_time()


@register_scheduler
class SLoRASJFScheduler(SJFScheduler):
    """muServe's SJF order on S-LoRA (Chameleon's ``S-LoRA+SJF`` baseline): S-LoRA with its waiting
    queue ordered by :class:`SJFScheduler`'s key, so S-LoRA's queued-request prefetch
    (``EngineConfig.slora_prefetch``, :class:`policies.slora.SLoRAScheduler`) names the adapters of the
    next batch *in that order*: the waiting requests with the smallest keys whose prompts fill one
    batch's token budget (at most ``max_lookahead``). Without it a run with the prefetch on would give
    S-LoRA and Chameleon the prefetch and their SJF baseline none. Plain ``sjf`` (on vLLM) does not
    prefetch."""

    name = "slora-sjf"
    description = ("S-LoRA with muServe's SJF order: its queued-request prefetch (on --system slora with "
                   "--slora-prefetch) follows the SJF order")
    citation = "Chameleon MICRO'25 §6 (S-LoRA+SJF); muServe ATC'24 §4; S-LoRA MLSys'24 §4.2 (prefetch)"

    prefetch_evicts = False  # prefetch into free pool memory only (as S-LoRA's)

    def __init__(self, accuracy: float = 1.0, aging: float = 50.0, seed: int = 0, max_skips: int = 64,
                 lookahead_tokens: int | None = None, max_lookahead: int | None = None) -> None:
        super().__init__(accuracy, aging, seed, max_skips)
        self.lookahead_tokens = lookahead_tokens
        #: at most this many requests in the next batch (None: no cap, as S-LoRA's ``next_batch``)
        self.max_lookahead = max_lookahead

    def _next_batch(self) -> Iterable[int]:
        """The prefix, in SJF order, of the waiting requests whose prompts fit in one step's token
        budget (S-LoRA §4.2's prefetch set, ``next_batch()``; the first that does not fit ends it).
        The heap is read in key order from its root, through a frontier of the entries whose parent
        was taken: a step reads what it yields and their children, not the whole queue."""
        e = self.engine
        budget = self.lookahead_tokens or e.config.max_num_batched_tokens
        heap, cap = self.heap, self.max_lookahead
        n = len(heap)
        frontier = [(heap[0], 0)] if heap else []
        taken = 0
        while frontier and (cap is None or taken < cap):
            item, i = heapq.heappop(frontier)
            budget -= e.tokens_known(item[1])
            if budget < 0:
                return
            yield item[1]
            taken += 1
            for c in (2 * i + 1, 2 * i + 2):
                if c < n:
                    heapq.heappush(frontier, (heap[c], c))

    def prefetch(self, now: float) -> Iterable[int]:
        return adapters_of(self.engine, self._next_batch())


register_preset(Preset("slora+sjf", "slora-sjf", "none", "S-LoRA with muServe-style SJF scheduling (Chameleon's "
                       "baseline); with --slora-prefetch, S-LoRA's queued-request prefetch in SJF order",
                       "Chameleon MICRO'25 §6; muServe ATC'24", cache_opts={"adapter_memory": "unified"},
                       system="slora"))
