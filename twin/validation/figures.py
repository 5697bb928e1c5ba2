"""Figures of a validation (matplotlib, imported when a figure is drawn).

:func:`make_figures` draws, in the manner of the published twin's Figure 7, twin against real
across served adapters for each scenario (``fig7_<source>.png``), twin-vs-real scatter plots
over all runs (``scatter_twin_vs_real.png``), and the client's mean ITL over its mean TPOT across
served adapters, real and twin (``itl_over_tpot.png``: the streamed chunks the scrape stall merges).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from twin.scrape_stall import OUTPUT_PROC_CHUNK_SIZE
from twin.validation.metrics import METRICS
from twin.validation.report import fmt
from twin.validation.runner import ValidationResult

_SCATTER_METRICS = ("throughput", "itl", "tpot", "ttft_mean", "ttft_incl_unfinished", "request_throughput")


def _pyplot():
    import matplotlib  # optional heavy dependency

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _scenario_row(axes, i: int, n_rows: int, sc: str, g: pd.DataFrame, cmap) -> None:
    """One scenario: throughput, mean ITL and TTFT against served adapters, a line per slot value."""
    third = "ttft_incl_unfinished" if g["real_ttft_incl_unfinished"].notna().any() else "ttft_mean"
    panels = [("throughput", "total tok/s", 1.0), ("itl", "mean ITL (ms)", 1.0),
              (third, ("TTFT incl. unfinished (s)" if third == "ttft_incl_unfinished"
                       else "mean TTFT, finished (s)"), 1e-3)]
    slots = sorted(g["adapter_slots"].unique())
    for j, (m, lab, scale) in enumerate(panels):
        ax = axes[i, j]
        for k, sl in enumerate(slots):
            h = g[g["adapter_slots"] == sl].sort_values("served_adapters")
            col = cmap(k / max(len(slots) - 1, 1))
            ax.plot(h["served_adapters"], h[f"real_{m}"] * scale, "-o", color=col, ms=3, lw=1.2,
                    label=f"{sl} slots")
            ax.plot(h["served_adapters"], h[f"twin_{m}"] * scale, "--x", color=col, ms=3, lw=1.0)
            pc = f"peer_{m}"
            if pc in h and h[pc].notna().any():
                ax.plot(h["served_adapters"], h[pc] * scale, ":+", color=col, ms=4, lw=1.0)  # (markers: a lone point)
        if m.startswith("ttft"):
            ax.set_yscale("log")
        ax.set_title(f"{sc}: {lab}", fontsize=8)
        ax.tick_params(labelsize=7)
        if i == n_rows - 1:
            ax.set_xlabel("served adapters", fontsize=8)
        if j == 0:
            ax.legend(fontsize=6, ncol=2)


def figure7(runs: pd.DataFrame, src: str, out: Path) -> Path:
    """``fig7_<src>.png``: for each scenario (rates x ranks) of one source, twin against real
    across served adapters, one line per adapter-slot value (solid real, dashed ours, dotted with + markers
    published twin), for throughput, mean ITL and TTFT incl. unfinished (mean TTFT of finished
    requests where the real table lacks it)."""
    plt = _pyplot()
    cmap = plt.get_cmap("viridis")
    scen = list(runs.groupby("scenario"))
    fig, axes = plt.subplots(len(scen), 3, figsize=(14, 2.6 * len(scen) + 0.6), squeeze=False)
    for i, (sc, g) in enumerate(scen):
        _scenario_row(axes, i, len(scen), sc, g, cmap)
    fig.suptitle(f"{src}: real (solid, o), twin (dashed, x), published twin (dotted, +); colour = adapter slots",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (2.6 * len(scen) + 0.6)))
    p = out / f"fig7_{src}.png"
    fig.savefig(p, dpi=72)
    plt.close(fig)
    return p


def scatter(res: ValidationResult, runs: pd.DataFrame, out: Path) -> Path:
    """``scatter_twin_vs_real.png``: twin (and published twin) against real, per metric."""
    plt = _pyplot()
    ms = [m for m in METRICS if m.name in _SCATTER_METRICS]
    fig, axes = plt.subplots(2, 3, figsize=(13, 8))
    for ax, m in zip(axes.ravel(), ms):
        r, t = runs[f"real_{m.name}"], runs[f"twin_{m.name}"]
        ok = r.notna() & t.notna() & (r > 0) & (t > 0)
        for cl, mk in (("kept_up", "o"), ("overloaded", "s"), ("sent_unknown", "^")):
            sel = ok & (runs["client"] == cl)
            ax.scatter(r[sel], t[sel], s=9, marker=mk, alpha=0.7, label=cl)
        if m.peer:
            pr = runs[f"peer_{m.name}"]
            sel = ok & pr.notna() & (pr > 0)
            ax.scatter(r[sel], pr[sel], s=6, marker=".", color="grey", alpha=0.5, label="published twin")
        if ok.any():
            lo, hi = float(min(r[ok].min(), t[ok].min())), float(max(r[ok].max(), t[ok].max()))
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.7)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_title(f"{m.label} ({m.unit}): SMAPE {fmt(res.summary['subsets']['all']['metrics'][m.name]['smape'])} %",
                     fontsize=9)
        ax.set_xlabel("real", fontsize=8)
        ax.set_ylabel("twin", fontsize=8)
        ax.legend(fontsize=6)
    fig.tight_layout()
    p = out / "scatter_twin_vs_real.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def itl_over_tpot(runs: pd.DataFrame, out: Path) -> Path:
    """``itl_over_tpot.png``: mean ITL / mean TPOT against the served adapters, real and twin, for the runs
    with at most 128 running requests (real gauge; the steps' outputs are merged into chunks after a
    scrape stall, :func:`twin.scrape_stall.merged_gaps`) and for the others (delivered step by step)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    ok = (runs["real_tpot"] > 0) & (runs["twin_tpot"] > 0) & runs["real_itl"].notna() & runs["twin_itl"].notna()
    few = runs["ts_mean_running"] <= OUTPUT_PROC_CHUNK_SIZE
    for ax, sel, title in ((axes[0], ok & few, f"<= {OUTPUT_PROC_CHUNK_SIZE} running requests"),
                           (axes[1], ok & ~few, f"> {OUTPUT_PROC_CHUNK_SIZE} running requests")):
        r = runs[sel]
        ax.scatter(r["served_adapters"], r["real_itl"] / r["real_tpot"], s=14, marker="o", facecolors="none",
                   edgecolors="k", label="real")
        ax.scatter(r["served_adapters"] * 1.04, r["twin_itl"] / r["twin_tpot"], s=10, marker="x", color="tab:red",
                   label="twin")
        ax.axhline(1.0, color="grey", lw=0.7)
        ax.set_xscale("log")
        ticks = [t for t in (8, 16, 32, 64, 128, 256, 512) if len(r) and r["served_adapters"].min() / 2 <= t
                 <= r["served_adapters"].max() * 2]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_title(f"{title} ({len(r)} runs)", fontsize=9)
        ax.set_xlabel("served adapters", fontsize=8)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean ITL / mean TPOT", fontsize=8)
    fig.tight_layout()
    p = out / "itl_over_tpot.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p


def make_figures(res: ValidationResult, out_dir: str | os.PathLike) -> list[Path]:
    """:func:`figure7` for each source, then :func:`scatter` and :func:`itl_over_tpot`, over the scored runs;
    the paths written."""
    out = Path(out_dir)
    runs = res.runs[res.runs["scored"]]
    if not len(runs):
        return []
    paths = [figure7(gs, src, out) for src, gs in runs.groupby("source")]
    paths.append(scatter(res, runs, out))
    if {"real_tpot", "twin_tpot", "real_itl", "twin_itl", "served_adapters", "ts_mean_running"} <= set(runs.columns):
        paths.append(itl_over_tpot(runs, out))
    return paths
