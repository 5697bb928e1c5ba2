"""Figures of one run, from its tables (``twin run --plot``).

* :func:`latency_figure`: the TTFT distribution of finished requests (histogram on a log
  axis and its CDF with the P50/P99 marks) and the ITL distribution (step durations weighted
  by the decode tokens each step emitted, as the summary's ITL percentiles);
* :func:`timeline_figure`: over simulated time, running requests (steps table) and waiting
  ones (arrived, not yet admitted: requests table), KV cache use, adapters in the batch
  against the GPU slots and resident adapter memory, and the host-link traffic.

Both return a :class:`matplotlib.figure.Figure` built without ``pyplot`` (no global state, no
backend switch: the same code draws in a notebook and on a headless machine);
:func:`write_run_figures` saves them as PNG. matplotlib is imported inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

#: file names :func:`write_run_figures` writes
LATENCY_PNG, TIMELINE_PNG = "latency.png", "timeline.png"


def _figure(nrows: int, ncols: int, size: tuple[float, float]) -> tuple["Figure", np.ndarray]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    return fig, axes


def _log_x(ax) -> None:
    """Log x axis with plain labels on the decades only."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def itl_samples(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per-step durations (s) and their weights (decode tokens emitted by those steps) from a
    steps table; a row covering ``n_steps`` identical steps counts ``n_steps`` times."""
    dec = steps["decode_tokens"].to_numpy()
    k = steps["n_steps"].to_numpy()
    m = dec > 0
    return steps["duration_s"].to_numpy()[m] / k[m], dec[m] * k[m]


def waiting_curve(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Times and counts of requests waiting for their first admission (arrived, not rejected,
    not yet scheduled), as a step function."""
    r = requests[requests["outcome"].isin(["finished", "unfinished"])]
    arr = r["arrival_s"].to_numpy()
    sched = r["first_scheduled_s"].to_numpy()
    sched = np.where(np.isfinite(sched), sched, np.inf)
    t = np.concatenate([arr, sched[np.isfinite(sched)]])
    d = np.concatenate([np.ones(len(arr)), -np.ones(int(np.isfinite(sched).sum()))])
    order = np.argsort(t, kind="stable")
    return t[order], np.cumsum(d[order])


def latency_figure(requests: pd.DataFrame, steps: pd.DataFrame | None, summary: dict[str, Any] | None = None,
                   title: str | None = None) -> "Figure":
    """TTFT histogram and CDF of the finished requests; ITL distribution (needs the steps table)."""
    fig, ax = _figure(1, 3, (15, 4))
    fin = requests[requests["outcome"] == "finished"]
    ttft = fin["ttft_s"].to_numpy() * 1000
    ttft = ttft[np.isfinite(ttft) & (ttft > 0)]
    if len(ttft):
        bins = np.geomspace(ttft.min(), ttft.max() * 1.0001, 50) if ttft.max() > ttft.min() else 10
        ax[0].hist(ttft, bins=bins, color="tab:blue", alpha=0.8)
        _log_x(ax[0])
        xs = np.sort(ttft)
        ax[1].plot(xs, np.arange(1, len(xs) + 1) / len(xs), color="tab:blue")
        _log_x(ax[1])
        for q, ls in ((50, "--"), (99, ":")):
            v = float(np.percentile(ttft, q))
            for a in ax[:2]:
                a.axvline(v, color="k", ls=ls, lw=0.8, label=f"P{q} {v:.0f} ms")
        ax[1].legend(fontsize=8)
    ax[0].set_title(f"TTFT, {len(ttft)} finished requests")
    ax[0].set_xlabel("TTFT (ms)")
    ax[0].set_ylabel("requests")
    ax[1].set_title("TTFT CDF")
    ax[1].set_xlabel("TTFT (ms)")
    ax[1].set_ylabel("fraction of finished requests")
    if steps is not None and len(steps):
        d, w = itl_samples(steps)
        if len(d):
            d = d * 1000
            bins = np.geomspace(max(d.min(), 1e-3), d.max() * 1.0001, 50) if d.max() > d.min() else 10
            ax[2].hist(d, bins=bins, weights=w, color="tab:orange", alpha=0.8)
            _log_x(ax[2])
            if summary and summary.get("itl_ms_p99") is not None:
                ax[2].axvline(summary["itl_ms_p99"], color="k", ls=":", lw=0.8,
                              label=f"P99 {summary['itl_ms_p99']:.1f} ms")
                ax[2].legend(fontsize=8)
    ax[2].set_title("ITL (time between tokens), weighted by tokens")
    ax[2].set_xlabel("ITL (ms)")
    ax[2].set_ylabel("tokens")
    for a in ax:
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def with_idle_gaps(t0: np.ndarray, t1: np.ndarray, values: np.ndarray, idle: float = 0.0,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A step function of per-row ``values`` (held from each row's start, ``where="post"``) with ``idle`` drawn
    from a row's end to the next row's start when the engine idled between them (it steps only while a
    request runs): without it the line held the last step's batch through the idle time."""
    gap = np.flatnonzero(t0[1:] > t1[:-1])
    x = np.concatenate((t0, t1[gap], t1[-1:]))
    y = np.concatenate((values.astype(float), np.full(len(gap) + (len(t1) > 0), float(idle))))
    order = np.argsort(x, kind="stable")
    return x[order], y[order]


def timeline_figure(requests: pd.DataFrame, steps: pd.DataFrame, summary: dict[str, Any] | None = None,
                    title: str | None = None, bin_s: float | None = None) -> "Figure":
    """Running / waiting requests, KV use, adapters and link traffic over simulated time."""
    summary = summary or {}
    fig, ax = _figure(4, 1, (13, 10))
    t0, t1 = steps["t_start"].to_numpy(), steps["t_end"].to_numpy()
    # the batch during each step (held from the row's start), waiting requests (step function)
    ax[0].step(*with_idle_gaps(t0, t1, steps["batch_size"].to_numpy()), where="post", lw=0.8,
               label="running (during each step; 0 while the engine idles)")
    tw, nw = waiting_curve(requests)
    if len(tw):
        ax[0].step(tw, nw, where="post", lw=0.8, label="waiting for first admission")
    ax[0].set_ylabel("requests")
    ax[0].legend(fontsize=8, loc="upper left")
    # KV cache use
    block = int((summary.get("config") or {}).get("block_size") or 16)
    cap = summary.get("kv_capacity_tokens")
    used = steps["kv_blocks_used"].to_numpy() * block
    tu = t0
    if not (summary.get("config") or {}).get("prefix_caching"):  # (idle: no request holds KV; history KV may)
        tu, used = with_idle_gaps(t0, t1, used)
    if cap:
        ax[1].step(tu, used / cap * 100, where="post", lw=0.8, color="tab:green")
        ax[1].set_ylabel("KV cache used (%)")
        ax[1].set_ylim(0, 105)
    else:
        ax[1].step(tu, used, where="post", lw=0.8, color="tab:green")
        ax[1].set_ylabel("KV tokens used")
    # adapters in the batch (against the slots) and resident adapter memory
    ax[2].step(*with_idle_gaps(t0, t1, steps["distinct_adapters"].to_numpy()), where="post", lw=0.8,
               color="tab:purple", label="adapters in the batch")
    # (S-LoRA has no adapter slots: its adapters share the unified pool with the KV cache)
    slots = None if summary.get("system") == "slora" else (summary.get("config") or {}).get("max_loras")
    if slots:
        ax[2].axhline(slots, color="tab:purple", ls="--", lw=0.8, label=f"GPU adapter slots ({slots})")
    ax[2].set_ylabel("adapters")
    ax2 = ax[2].twinx()
    ax2.step(t0, steps["adapter_mem_bytes"].to_numpy() / 1e9, where="post", lw=0.8, color="tab:gray",
             label="resident adapter memory")
    ax2.set_ylabel("resident adapters (GB)")
    h1, l1 = ax[2].get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax[2].legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    # host-link traffic per bin
    end = float(t1.max()) if len(t1) else 1.0
    width = bin_s or max(end / 200, 1e-3)
    edges = np.arange(0.0, end + width, width)
    gb, _ = np.histogram(t0, bins=edges, weights=steps["link_bytes"].to_numpy() / 1e9)
    ax[3].bar(edges[:-1], gb / width, width=width, align="edge", color="tab:red", alpha=0.8)
    util = summary.get("link_utilization")
    ax[3].set_ylabel("host link (GB/s)")
    ax[3].set_title("adapter loads on the host-to-GPU link, per bin of %.3g s" % width
                    + (f" (link busy {util:.1%} of the run)" if util is not None else ""), fontsize=9)
    ax[3].set_xlabel("simulated time (s)")
    for a in ax:
        a.grid(alpha=0.3)
        a.set_xlim(0, end)
    busy = summary.get("gpu_busy_fraction")
    ax[0].set_title("requests" + (f" (GPU busy {busy:.1%} of the run)" if busy is not None else ""), fontsize=9)
    if title:
        fig.suptitle(title)
    return fig


def write_run_figures(out_dir: str | Path, requests: pd.DataFrame, steps: pd.DataFrame,
                      summary: dict[str, Any] | None = None) -> list[Path]:
    """Write :data:`LATENCY_PNG` and :data:`TIMELINE_PNG` into ``out_dir``; returns their paths
    (the timeline needs the steps table: skipped when it is empty)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summary or {}
    title = f"{summary.get('trace', '')} / {summary.get('policy', '')} ({summary.get('profile', '')})".strip(" /")
    paths = []
    fig = latency_figure(requests, steps, summary, title)
    fig.savefig(out / LATENCY_PNG, dpi=100)
    paths.append(out / LATENCY_PNG)
    if steps is not None and len(steps):
        fig = timeline_figure(requests, steps, summary, title)
        fig.savefig(out / TIMELINE_PNG, dpi=100)
        paths.append(out / TIMELINE_PNG)
    return paths


#: panels of :func:`compare_figure`: (summary key, scale, title)
COMPARE_PANELS = (("ttft_ms_p99", 1e-3, "P99 TTFT (s)"), ("itl_ms_p99", 1.0, "P99 TBT (ms)"),
                  ("goodput_rps", 1.0, "throughput within SLO (req/s)"),
                  ("adapter_hit_rate_requests", 1.0, "adapter hit rate (requests)"))


def compare_figure(rows: list[dict[str, Any]], slo_s: float | None = None, title: str | None = None) -> "Figure":
    """``twin compare``'s figure: one line per policy against the request rate, for each of
    :data:`COMPARE_PANELS` (rows: dicts with ``policy``, ``rps`` and those keys)."""
    fig, axes = _figure(1, len(COMPARE_PANELS), (4.3 * len(COMPARE_PANELS), 4))
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    for pol in pols:
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["rps"])
        x = [r["rps"] for r in rs]
        for ax, (key, scale, _) in zip(axes, COMPARE_PANELS):
            y = [(r[key] * scale) if r.get(key) is not None else float("nan") for r in rs]
            ax.plot(x, y, marker="o", label=pol)
    offered = sorted({(r["rps"], r["offered_rps"]) for r in rows if r.get("offered_rps") is not None})
    if offered:  # the load the windows offered (a replayed trace's --rps is its mean over the whole trace)
        k = [i for i, (key, _, _) in enumerate(COMPARE_PANELS) if key == "goodput_rps"]
        if k:
            axes[k[0]].plot([o[0] for o in offered], [o[1] for o in offered], color="k", ls=":", lw=1.0,
                            label="offered")
            axes[k[0]].legend(fontsize=8)
    if slo_s is not None:
        axes[0].axhline(slo_s, color="k", ls="--", lw=0.8, label=f"SLO {slo_s:.2f} s")
    axes[0].set_yscale("log")
    for ax, (_, _, t) in zip(axes, COMPARE_PANELS):
        ax.set_xlabel("--rps (req/s; a trace: its mean over the whole trace)")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return fig
