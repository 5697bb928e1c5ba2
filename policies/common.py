"""Shared pieces of the policies: an output-length predictor, per-adapter request statistics,
and the adapters of a list of requests (what a prefetch copies). (Waiting requests per adapter, which
Chameleon's cache reads, are the engine's: ``EngineView.waiting_adapter_counts``.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import EngineView

INF = math.inf


class OutputPredictor:
    """Predicted output length of every request, with a given accuracy.

    Chameleon (MICRO'25, §6, sensitivity to the predictor) and muServe (Qiu et al., ATC'24,
    §4) drive their schedulers with an output-length predictor and study its accuracy
    (Chameleon evaluates 100%, 80% and 60%). Here ``accuracy = p`` means: with probability
    ``p`` the prediction is the true output length; otherwise it is the output length of
    another request of the workload drawn at random (an uninformative guess with the right
    marginal distribution). Draws are per request and seeded, so a run is deterministic and
    the same request gets the same prediction under every policy.
    """

    def __init__(self, engine: "EngineView", accuracy: float = 1.0, seed: int = 0) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"predictor accuracy must be in [0, 1], got {accuracy}")
        out = np.asarray(engine.output, np.int64)
        n = len(out)
        rng = np.random.default_rng(seed)
        correct = rng.random(n) < accuracy
        other = out[rng.integers(0, max(n, 1), n)] if n else out
        self.pred = np.where(correct, out, other).astype(np.int64)
        self.pred_l: list[int] = self.pred.tolist()
        self.accuracy = accuracy

    def __getitem__(self, rid: int) -> int:
        return self.pred_l[rid]


class ArrivalStats:
    """Per-adapter request counts and last arrival times, brought up to date lazily from
    the engine's arrival pointer (no per-request callback needed)."""

    def __init__(self, engine: "EngineView") -> None:
        self.e = engine
        A = engine.n_adapters
        self.count = np.zeros(A, np.int64)
        self.last = np.full(A, -INF)
        self.ptr = 0

    def update(self) -> None:
        e = self.e
        hi = e.arr_ptr
        lo = self.ptr
        if hi <= lo:
            return
        ad = e.adapter[lo:hi]
        m = ad >= 0
        if m.any():
            ad = ad[m]
            self.count += np.bincount(ad, minlength=len(self.count))
            # arrivals are sorted: the last occurrence of each adapter carries its latest time
            t = e.arrival[lo:hi][m]
            self.last[ad] = t  # fancy assignment keeps the last write per index
        self.ptr = hi


class WindowedArrivalCounts:
    """Per-adapter request counts over the last ``window_s`` seconds (arrivals in
    ``(now - window_s, now]``), brought up to date lazily from the engine's arrival pointer.

    Chameleon's cache scores an adapter's "usage frequency over a specific time frame"
    (MICRO'25 §4.2). ``window_s=None`` counts every request so far (as :class:`ArrivalStats`)."""

    def __init__(self, engine: "EngineView", window_s: float | None) -> None:
        if window_s is not None and not window_s > 0:
            raise ValueError(f"the frequency window must be positive seconds (or None), got {window_s}")
        self.e = engine
        self.window_s = window_s
        self.count = np.zeros(engine.n_adapters, np.int64)
        self.ptr = 0
        self.lo = 0  # oldest counted arrival (requests lo..ptr-1 with an adapter are counted)

    def update(self) -> None:
        e = self.e
        hi = e.arr_ptr
        if hi > self.ptr:
            ad = e.adapter[self.ptr:hi]
            ad = ad[ad >= 0]
            if len(ad):
                self.count += np.bincount(ad, minlength=len(self.count))
            self.ptr = hi
        if self.window_s is None:
            return
        cut = e.now - self.window_s
        arr = e.arrival
        lo = self.lo
        j = lo + int(np.searchsorted(arr[lo:self.ptr], cut, side="right"))  # arrivals at or before now - window leave
        if j > lo:
            ad = e.adapter[lo:j]
            ad = ad[ad >= 0]
            if len(ad):
                self.count -= np.bincount(ad, minlength=len(self.count))
            self.lo = j


def adapters_of(engine: "EngineView", rids: "Iterable[int]") -> "Iterator[int]":
    """The distinct adapters of requests ``rids``, in the order the requests come (the base model's
    requests have none): what S-LoRA's queued-request prefetch copies for its next batch."""
    ad = engine.adapter_a
    seen: set[int] = set()
    for rid in rids:
        a = ad[rid]
        if a >= 0 and a not in seen:
            seen.add(a)
            yield a


def kmeans_1d(x: np.ndarray, k: int, iters: int = 100) -> tuple[np.ndarray, float]:
    """Lloyd's K-means on 1-D data, initialised at the quantiles (deterministic).

    Returns the sorted centroids and the within-cluster sum of squares (WCSS)."""
    x = np.sort(np.asarray(x, float))
    if len(x) == 0:
        return np.zeros(0), 0.0
    k = max(1, min(k, len(np.unique(x))))
    c = np.quantile(x, (np.arange(k) + 0.5) / k)
    for _ in range(iters):
        cuts = (c[1:] + c[:-1]) / 2
        lab = np.searchsorted(cuts, x, side="right")
        new = np.array([x[lab == j].mean() if np.any(lab == j) else c[j] for j in range(k)])
        new.sort()
        if np.allclose(new, c, rtol=0, atol=1e-12):
            c = new
            break
        c = new
    cuts = (c[1:] + c[:-1]) / 2
    lab = np.searchsorted(cuts, x, side="right")
    wcss = float(sum(((x[lab == j] - c[j]) ** 2).sum() for j in range(k)))
    return c, wcss
