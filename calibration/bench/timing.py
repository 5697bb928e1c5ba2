"""Timing: CUDA events on a GPU, ``time.perf_counter`` on the CPU; warm-ups, then repeats.

On a GPU, :func:`time_op` measures *device* time like ``triton.testing.do_bench``: before each
timed call it zeroes a 256 MiB scratch buffer, which evicts the previous call's data from L2
(so a small LoRA kernel does not find its weights cached, as it would not between layers) and
keeps the GPU busy while Python enqueues the call (so host launch latency is not counted).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


_FLUSH: dict[int, torch.Tensor] = {}
FLUSH_BYTES = 256 * 2**20


def _flush_buffer(dev: torch.device) -> torch.Tensor:
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _FLUSH:
        _FLUSH[idx] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=torch.device("cuda", idx))
    return _FLUSH[idx]


def time_op(fn: Callable[[], object], device: torch.device | str, warmup: int, repeats: int,
            flush: bool = True) -> np.ndarray:
    """Milliseconds of ``fn()`` for each of ``repeats`` timed calls after ``warmup`` untimed ones.

    On CUDA each call is bracketed by two CUDA events on the current stream (device time of the
    work ``fn`` enqueues; one ``torch.cuda.synchronize`` after all repeats). On the CPU each call
    is timed with ``time.perf_counter``. ``flush``: zero the L2-flush buffer ahead of each timed
    call on a GPU (see the module docstring).
    """
    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        scratch = _flush_buffer(dev) if flush else None
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for i in range(repeats):
            if scratch is not None:
                scratch.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)], dtype=float)
    out = np.empty(repeats, dtype=float)
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        out[i] = (time.perf_counter() - t0) * 1e3
    return out


def time_wall(fn: Callable[[], object], device: torch.device | str, warmup: int, repeats: int,
              before: Callable[[], object] | None = None) -> np.ndarray:
    """Wall-clock milliseconds of ``fn()`` including host work, synchronizing the GPU after each call.

    ``before()`` (untimed) runs ahead of every call, e.g. to drop a file from the page cache.
    """
    dev = torch.device(device)
    for _ in range(warmup):
        if before:
            before()
        fn()
        sync(dev)
    out = np.empty(repeats, dtype=float)
    for i in range(repeats):
        if before:
            before()
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        out[i] = (time.perf_counter() - t0) * 1e3
    return out


class TimeBudget:
    """A part's time limit over a sweep of units (a LoRA ``(module, rank)`` pair, a step shape).

    Checking the clock only between units lets a sweep overrun its limit by a whole unit (a LoRA pair with its
    torch references took ~20 s on an H200), and the hard ``timeout`` of a lent GPU then kills the process.
    :meth:`next_fits` is called before each unit: it refuses the next one when the time spent so far plus the
    last unit's duration would pass the limit (units of one sweep are alike, so the last one's duration is the
    estimate of the next). The first unit always runs. ``limit_s`` None: no limit.
    """

    def __init__(self, limit_s: float | None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.limit_s = limit_s
        self.clock = clock
        self.start = clock()
        self.units = 0  # units started
        self.last_s = 0.0  # duration of the last finished unit
        self.stopped_at: int | None = None  # units run when the limit stopped the sweep
        self._unit_start: float | None = None

    def next_fits(self) -> bool:
        """Close the running unit, then whether the next one fits (it is then counted as started)."""
        now = self.clock()
        if self._unit_start is not None:
            self.last_s = now - self._unit_start
        if self.limit_s is not None and self.units and (now - self.start) + self.last_s > self.limit_s:
            self.stopped_at = self.units
            self._unit_start = None
            return False
        self._unit_start = now
        self.units += 1
        return True

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    def elapsed(self) -> float:
        return self.clock() - self.start


def stats(ms: np.ndarray) -> dict[str, float]:
    """min/max/mean/median/std (population std, as numpy's default) of a sample in ms."""
    ms = np.asarray(ms, dtype=float)
    return {"min": float(ms.min()), "max": float(ms.max()), "mean": float(ms.mean()),
            "median": float(np.median(ms)), "std": float(ms.std())}
