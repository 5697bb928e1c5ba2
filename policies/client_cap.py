"""vLLM's FCFS scheduler behind the real runs' load generator: at most ``client_cap`` requests in flight.

The real validation runs were driven by vLLM's benchmark client (``benchmarks/backend_request_func.py``),
which opens one aiohttp session -- one TCP connection, one local port -- per request. Linux's
default ephemeral port range (``net.ipv4.ip_local_port_range`` = 32768..60999) has 28232 ports
(:data:`CLIENT_MAX_INFLIGHT`): a request sent while they are all in use fails to connect at once
(it is sent but never successful). A property of the load generator and the OS, not of vLLM; the
real runs' engine queues are consistent with it (running + waiting never exceeds ~28.5k in the
overloaded runs, whatever the slots, adapters and rates).

The same runs' server (the peer fork of vLLM 0.8.5, ``--dummy-lora-modules``) loads its
``--max-cpu-loras`` adapters into the CPU tier during start-up, so with ``preload_cpu`` the
adapters start in the CPU tier (:meth:`twin.adapters.AdapterMemory.preload_cpu`) instead of on
disk (the twin's default: an adapter first met at its first request, as offline ``LLM.generate`` meets it; stock
vLLM's OpenAI server also pre-loads the adapters its ``--lora-modules`` names at start-up,
``OpenAIServingModels.init_static_loras``).

``twin validate`` and ``twin calibrate replay`` build it by name: ``make_scheduler("fcfs+client-cap",
client_cap=None)``.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from policies.fcfs import FCFSScheduler
from twin.registry import register_scheduler

#: Requests the real runs' client can hold in flight (one local port per request; see the module
#: docstring). ``None`` disables the cap.
CLIENT_MAX_INFLIGHT: int | None = 28232
#: the requests table's ``drop_reason`` of an arrival that failed at the client
CLIENT_CAP_REASON = "failed at the client: client_cap requests were in flight (one local port each)"


@register_scheduler
class ClientCappedFCFS(FCFSScheduler):
    """vLLM's FCFS scheduler behind the client's in-flight cap (``client_cap``; ``None`` or 0: no
    cap), on a server whose adapters are in the CPU tier from the start when ``preload_cpu``.

    An arrival that finds ``client_cap`` requests in flight (waiting + running in the engine) fails
    at the client: it never reaches the engine's queue. It stays ``unfinished`` in the twin's tables,
    as the real client counts it (sent, not successful; ``ttft_ms_incl_unfinished`` counts it as the
    window length), with :data:`CLIENT_CAP_REASON` as its ``drop_reason`` (the summary's
    ``requests_dropped`` and ``drop_reasons``). ``n_dropped`` counts those failures. With ``preload_gpu`` the first adapters
    (as many as there are GPU slots) are also in GPU slots from the start, as on the calibration's
    offline LoRA servers (``calibration.offline_replay``)."""

    name = "fcfs+client-cap"
    description = ("vLLM FCFS behind a load generator holding at most client_cap requests in flight, "
                   "adapters preloaded in the CPU tier (the real validation runs)")
    citation = "vLLM benchmarks/backend_request_func.py (one connection per request); vLLM v1 scheduler"

    def __init__(self, client_cap: int | None = CLIENT_MAX_INFLIGHT, preload_cpu: bool = True,
                 preload_gpu: bool = False) -> None:
        self.client_cap = client_cap
        self.preload_cpu = preload_cpu
        self.preload_gpu = preload_gpu

    def get_params(self) -> dict[str, Any]:
        """The constructor arguments (scikit-learn's convention)."""
        return {"client_cap": self.client_cap, "preload_cpu": self.preload_cpu, "preload_gpu": self.preload_gpu}

    def bind(self, engine) -> None:
        self.cap = int(self.client_cap) if self.client_cap else 1 << 62
        self.dropped = bytearray(engine.n)
        self.n_dropped = 0
        super().bind(engine)
        # the engine's prefix counts of the requests not rejected at arrival
        self.ok_cum: "range | memoryview" = engine.ok_cum
        if self.preload_cpu:  # the server registers min(served, --max-cpu-loras) adapters at start-up
            cap = engine.config.max_cpu_loras
            n_reg = int(engine.served) if cap is None else min(int(engine.served), int(cap))
            engine.adapters.preload_cpu(range(engine.n_adapters), unused=n_reg - engine.n_adapters)
        if self.preload_gpu:  # the calibration's offline LoRA servers (lora_pre_loading)
            engine.adapters.preload_gpu(range(engine.n_adapters))

    def _push_head(self, a: int) -> None:
        # skip requests that failed at the client (they are never admitted), then
        # FCFSScheduler._push_head written out (one call less per admission)
        p, q, end, dr = self.qptr[a], self.q, self.qend[a], self.dropped
        while p < end and dr[q[p]]:
            p += 1
        self.qptr[a] = p
        if p < end:
            heapq.heappush(self.heap, q[p])

    def next_change_time(self, stop) -> float:
        """FCFS's, or earlier: the arrival that could find the client's ``client_cap`` requests in flight.
        Which arrivals fail depends on the in-flight count when each arrives, and a run of decode steps ends
        at a finish, so a run must not take such an arrival in: stepping one iteration at a time, it would be
        counted before the run's finishes (the drops, and the waiting count the steps are priced with,
        differed). Arrivals before it fail in neither case."""
        t = super().next_change_time(stop)
        e = self.engine
        p = e.arr_ptr + max(self.cap - e.n_waiting - len(e.running), 0)  # the first arrival that may fail
        if p < e.n:
            tp = e.arrival_a[p]
            if tp < t:
                return tp
        return t

    def on_arrivals(self, lo: int, hi: int) -> None:
        e = self.engine
        over = e.n_waiting + len(e.running) - self.cap  # the engine counted [lo, hi) already
        if over > 0 and self.ok_cum[hi] - self.ok_cum[lo] == hi - lo:
            # every arrival of [lo, hi) is valid (the usual case): the last `over` fail, as below
            a = hi - over if over < hi - lo else lo
            ones = b"\x01" * (hi - a)
            self.dropped[a:hi] = ones
            self.admitted[a:hi] = ones
            e.drop_arrivals(range(a, hi), CLIENT_CAP_REASON)
            self.n_dropped += hi - a
            q, qptr, qend, dr, push_head = self.q, self.qptr, self.qend, self.dropped, self._push_head
            # adapters whose queue now starts with a dropped request: their head moves on (each
            # adapter of the drops once, in any order: the heap holds distinct request indices, so
            # its pops do not depend on the push order)
            for g in set(self.grp[a:hi]):
                p = qptr[g]
                if p < qend[g] and dr[q[p]]:
                    push_head(g)
        elif over > 0:
            # the last `over` valid arrivals of [lo, hi) fail at the client
            ok = np.nonzero(e.reject_reason[lo:hi] == 0)[0] + lo
            drop = ok[len(ok) - over:] if over < len(ok) else ok
            np.frombuffer(self.dropped, np.uint8)[drop] = 1
            np.frombuffer(self.admitted, np.uint8)[drop] = 1  # skipped by the arrival-order pointer
            e.drop_arrivals(drop, CLIENT_CAP_REASON)
            self.n_dropped += len(drop)
            q, qptr, qend, dr = self.q, self.qptr, self.qend, self.dropped
            grp = np.frombuffer(self.grp, np.int64)
            for a in np.unique(grp[drop]).tolist():
                if qptr[a] < qend[a] and dr[q[qptr[a]]]:  # a dropped request heads its adapter's queue
                    self._push_head(a)
        super().on_arrivals(lo, hi)
