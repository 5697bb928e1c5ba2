"""The engine's step records: segments of identical decode steps and the ITL samples.

Steps are recorded as segments: a row covers ``n_steps`` consecutive identical decode
steps (one row per step otherwise), so ``steps.parquet`` stays small on long runs. The
summary built from them is :func:`twin.metrics.summarize`.

A row's batch columns (``batch_size``, ``distinct_adapters``, ``kv_blocks_used``,
``adapter_mem_bytes``) hold the batch during the row's last step, before the requests that finish
in it leave: within a run of identical decode steps nothing joins or leaves, so that is the batch
of every step of the row (KV blocks: after the last step's allocation). vLLM's own gauges
(``SchedulerStats``) are taken after the finishers leave and hold during the next step, so their
time means count each request one step fewer (0.6-0.7 % lower; the comment in
``Engine._complete_step``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

STEP_COLUMNS = ("t_start", "t_end", "n_steps", "duration_s", "batch_size", "prefill_tokens", "decode_tokens",
                "distinct_adapters", "kv_blocks_used", "adapter_mem_bytes", "loads_started", "link_bytes")


class Recorder:
    """Collects step segments and ITL samples during a run (cheap appends only)."""

    def __init__(self, record_steps: bool = True) -> None:
        self.record_steps = record_steps
        self.rows: list[tuple] = []
        #: keep each segment's ``(t_start, t_end, n_steps, decode_tokens)`` even when the rows are not
        #: recorded (set by :func:`twin.simulate.simulate` when the metrics scrape's stall is modelled:
        #: :func:`twin.scrape_stall.merged_gaps` needs the steps' end times; :meth:`segments`)
        self.keep_segments = False
        self.seg: list[tuple] = []
        #: with ``keep_segments``: per segment index of a run (k > 1), its steps' durations (a list) or the one
        #: duration they all share (a float), so its steps' end times are the clock's (:meth:`run_step_ends`)
        self.run_durs: dict[int, "list[float] | float"] = {}
        self.itl_d: list[float] = []      # single-step durations with decode tokens
        self.itl_w: list[int] = []
        self.itl_run_d: list[float] = []  # per-step durations of runs whose steps differ, run after run
        self.itl_run_n: list[int] = []    # each such run's decode tokens per step ...
        self.itl_run_k: list[int] = []    # ... and its steps
        self.preemptions = 0
        self.n_steps = 0
        self.n_segments = 0
        # time in steps, adapter loads on the step's path included (GPU busy fraction; :meth:`busy_time`), summed over
        # the spans of back-to-back segments: a run of k steps covers the span its k steps cover one at a time, so the
        # sum does not depend on how the steps were grouped (per-segment differences t1 - t0 differed in the last bit)
        self.busy_s = 0.0  # the spans closed so far
        self._span_t0 = self._span_t1 = 0.0  # the open span
        self._bar = None
        self._last_wall = 0.0
        self.progress_requests = 0  # requests the progress bar counts (set by the engine)

    def step(self, t0, t1, k, d, durs, total, batch, prefill, n_dec, adapters, kv_blocks, mem, loads, link_bytes,
             itl_n=None):
        """One step (k == 1) or a run of k decode steps of duration ``d`` each (or ``durs``), from ``t0`` to ``t1``;
        ``total`` is the row's ``duration_s``: the segment's whole time (``t1 - t0``, synchronous loads included).
        ``n_dec`` decode tokens per step; ``itl_n`` of them give an ITL sample of the step's duration (default: all;
        the S-LoRA engine's first decode after a prefill gives its stalled requests their own, longer samples)."""
        self.n_steps += k
        self.n_segments += 1
        if t0 != self._span_t1:  # the engine idled before this segment: its busy span before closes
            self.busy_s += self._span_t1 - self._span_t0
            self._span_t0 = t0
        self._span_t1 = t1
        w = n_dec if itl_n is None else itl_n
        if w:
            if durs is not None:
                self.itl_run_d.extend(durs)
                self.itl_run_n.append(w)
                self.itl_run_k.append(len(durs))
            else:
                self.itl_d.append(total if k == 1 else d)
                self.itl_w.append(w * k)
        if self.record_steps:
            self.rows.append((t0, t1, k, total, batch, prefill, n_dec, adapters, kv_blocks, mem, loads, link_bytes))
        elif self.keep_segments:
            self.seg.append((t0, t1, k, n_dec))
        if k > 1 and self.keep_segments:
            self.run_durs[self.n_segments - 1] = durs if durs is not None else d

    def busy_time(self) -> float:
        """Seconds in steps (adapter loads on a step's path included): the busy spans' lengths, summed."""
        return self.busy_s + (self._span_t1 - self._span_t0)

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Every segment's start, end, steps and decode tokens per step (arrays), or None when
        neither the rows nor the segments were kept."""
        if self.record_steps:
            src = [(r[0], r[1], r[2], r[6]) for r in self.rows]
        elif self.keep_segments:
            src = self.seg
        else:
            return None
        if not src:
            return np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
        a = np.asarray(src, float)
        return a[:, 0], a[:, 1], a[:, 2].astype(np.int64), a[:, 3].astype(np.int64)

    def run_step_ends(self, t_start: np.ndarray) -> dict[int, list[float]]:
        """Per run segment (``keep_segments``), the end times of its steps before the last: the segment's start plus
        its steps' durations added one by one, the clock's own arithmetic (the engine sums a run's end that way,
        and stepping moves the clock by each duration in turn)."""
        from itertools import accumulate

        out = {}
        for i, ds in self.run_durs.items():
            if isinstance(ds, float):
                k = int(self.rows[i][2] if self.record_steps else self.seg[i][2])
                ds = [ds] * k
            out[i] = list(accumulate(ds[:-1], initial=float(t_start[i])))[1:]
        return out

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        d = np.concatenate((np.asarray(self.itl_d, float), np.asarray(self.itl_run_d, float)))
        w = np.concatenate((np.asarray(self.itl_w, np.int64),
                            np.repeat(np.asarray(self.itl_run_n, np.int64), np.asarray(self.itl_run_k, np.int64))))
        return d, w

    def steps_frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(STEP_COLUMNS))

    def progress(self, t: float, horizon: float, finished: int) -> None:
        """Progress bar: simulated seconds up to the horizon when there is one, else requests
        finished out of :attr:`progress_requests` (so the bar keeps moving while the queue drains
        after the last arrival, and reaches 100 % only when the run ends)."""
        w = time.perf_counter()
        if w - self._last_wall < 0.25:
            return
        self._last_wall = w
        timed = horizon != float("inf")
        if self._bar is None:
            from tqdm import tqdm

            if timed:
                self._bar = tqdm(total=round(horizon, 1), unit="sim-s", desc="simulating", leave=False)
            else:
                self._bar = tqdm(total=self.progress_requests, unit="req", desc="requests finished", leave=False)
        if timed:
            self._bar.n = round(min(t, horizon), 1)
        else:
            self._bar.n = finished
            self._bar.set_postfix_str(f"{t:.1f} sim-s", refresh=False)
        self._bar.refresh()

    def close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
