"""The published adapter twin's models (Agullo et al. 2025), evaluated on our observations.

``peer_fitted_constants.csv`` holds their constants; these functions turn them into
predictions for the same windows, runs and loads our fits are scored on, so the report
can put both fit qualities side by side:

* decode step (ms) = ``c0 * running + c1`` (prefill cost 0 in their twin);
* step with LoRA = decode step * ``(K6 * unique adapters + K7) / 100``;
* scheduler (ms) = ``1000 * max(0, a*mm(R) + b*mm(W) + c*mm(W*G/N) - base)`` with min-max
  scaled features ``mm(x) = (x - min) / (max - min)``;
* CPU->GPU load (ms) = their table per (max LoRA rank, adapter rank).
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


#: a published-twin load constant's name: the slots' max rank and the adapter's rank
_LOAD_CONSTANT = re.compile(r"max_rank_(\d+)_adapter_rank_(\d+)")


@dataclass
class PeerModels:
    decode: tuple[float, float] | None = None  # (c0 ms/request, c1 ms)
    lora: tuple[float, float] | None = None  # (K6 %/adapter, K7 %)
    sched: dict[str, float] = field(default_factory=dict)
    load_ms: dict[tuple[int, int], float] = field(default_factory=dict)  # (max rank, adapter rank) -> ms

    @classmethod
    def from_table(cls, peer: pd.DataFrame) -> "PeerModels":
        out = cls()
        if peer is None or len(peer) == 0:
            return out

        def val(component: str, constant: str) -> float | None:
            r = peer[(peer["component"] == component) & (peer["constant"] == constant)]
            return float(r["value"].iloc[0]) if len(r) else None

        c0, c1 = val("default_latency_decode", "c0"), val("default_latency_decode", "c1")
        if c0 is not None and c1 is not None:
            out.decode = (c0, c1)
        k6, k7 = val("lora_compute_overhead", "c0"), val("lora_compute_overhead", "c1")
        if k6 is not None and k7 is not None:
            out.lora = (k6, k7)
        s = peer[peer["component"] == "scheduler_overhead"]
        for _, r in s.iterrows():
            key = str(r["constant"]).split(" ")[0]
            out.sched[key] = float(r["value"])
        for _, r in peer[peer["component"] == "lora_load_cpu_to_gpu"].iterrows():
            m = _LOAD_CONSTANT.fullmatch(str(r["constant"]))  # max_rank_32_adapter_rank_8
            if m is None:
                raise ValueError(f"published twin's table: lora_load_cpu_to_gpu constant {r['constant']!r} is not of "
                                 f"the form max_rank_<M>_adapter_rank_<R> (e.g. max_rank_32_adapter_rank_8); fix "
                                 f"or drop that row")
            out.load_ms[(int(m.group(1)), int(m.group(2)))] = float(r["value"])
        return out

    def step_ms(self, running: np.ndarray) -> np.ndarray:
        if self.decode is None:
            return np.full(len(running), np.nan)
        return self.decode[0] * np.asarray(running, float) + self.decode[1]

    def lora_step_ms(self, running: np.ndarray, adapters: np.ndarray) -> np.ndarray:
        if self.lora is None:
            return np.full(len(running), np.nan)
        return self.step_ms(running) * (self.lora[0] * np.asarray(adapters, float) + self.lora[1]) / 100.0

    def sched_ms(self, R: np.ndarray, W: np.ndarray, G: np.ndarray, N: np.ndarray) -> np.ndarray:
        s = self.sched
        need = ["a", "b", "c", "base", "min_avg_batch_size", "max_avg_batch_size", "min_avg_waiting_queue",
                "max_avg_waiting_queue", "min_avg_waiting_queue_x_gpu/cpu_diff", "max_avg_waiting_queue_x_gpu/cpu_diff"]
        if any(k not in s for k in need):
            return np.full(len(R), np.nan)

        def mm(x, lo, hi):
            return (np.asarray(x, float) - s[lo]) / (s[hi] - s[lo])

        ratio = np.where(np.asarray(N, float) > 0, np.asarray(G, float) / np.maximum(np.asarray(N, float), 1), 0.0)
        v = (s["a"] * mm(R, "min_avg_batch_size", "max_avg_batch_size")
             + s["b"] * mm(W, "min_avg_waiting_queue", "max_avg_waiting_queue")
             + s["c"] * mm(np.asarray(W, float) * ratio, "min_avg_waiting_queue_x_gpu/cpu_diff",
                           "max_avg_waiting_queue_x_gpu/cpu_diff") - s["base"])
        return 1000.0 * np.maximum(v, 0.0)

    def cpu_load_ms(self, max_rank: np.ndarray, rank: np.ndarray) -> np.ndarray:
        return np.array([self.load_ms.get((int(m), int(r)), np.nan) for m, r in zip(max_rank, rank)], float)
