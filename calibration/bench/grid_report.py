"""What the slot-grid kernel timings say about the ``kernel_grid`` LoRA form's constants (torch-free).

The twin's LoRA step cost (:class:`twin.perf.forms.KernelGridLora`) counts the thread blocks vLLM
0.8.5's LoRA kernels launch for every adapter slot: ``l_cta`` per launched block (most of them exit
at once) and ``l_active`` per block that works. The profile fits both on whole steps (calibration
windows and serving runs), where they share the step with everything else. A GPU run of
``twin calibrate bench --parts lora`` times the same launch pattern on its own (``slot_shrink`` and
``slot_expand`` rows of ``lora_kernels.csv``, with each call's launched and working blocks), over
8-512 slots. :func:`grid_report` fits, per kernel, ``t = c + l_cta * launched + l_active * working``
with ``curve_fit`` on the Triton rows and sets the per-block costs beside the profile's. For the shrink
kernel it also fits the two split-K regimes apart (``SPLIT_K = 64`` below 128 tokens, 8 from 128): the
ratio of their working-block costs is the kernel-level counterpart of the profile's ``split64_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting.core import FitError, ParamSpec, fit_params, quality

LORA_FILE = "lora_kernels.csv"
GRID_COLUMNS = ["kernel", "impl", "batch_tokens", "n_adapters", "slots", "blocks_launched", "blocks_working",
                "time_ms_median"]


@dataclass
class GridReport:
    fits: pd.DataFrame          # per kernel: rows, c_us, l_cta_ns, l_active_ns, r2, mape_pct
    profile: dict[str, float]   # the profile's l_cta / l_active in ns per block (empty without a kernel_grid form)
    meta: dict[str, Any]
    #: the shrink kernel per split-K regime (None when either regime has fewer than 4 rows)
    splits: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits.to_dict(orient="records"), "profile_ns_per_block": self.profile,
                "shrink_split_regimes": self.splits, **self.meta}


def read_grid_rows(path: str | Path) -> pd.DataFrame:
    """The Triton slot-grid rows of ``lora_kernels.csv`` (a file or the bench's ``--out`` directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / LORA_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no {LORA_FILE} here; run `twin calibrate bench --parts lora --out DIR` on a GPU")
    df = pd.read_csv(p)
    missing = [c for c in GRID_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: no slot-grid columns {missing}: a {LORA_FILE} written before the slot-grid kernels "
                         f"were added; rerun the bench")
    rows = df[df["kernel"].isin(["slot_shrink", "slot_expand"]) & (df["impl"] == "triton")]
    if rows.empty:
        raise ValueError(f"{p}: no Triton slot-grid timings (kernel slot_shrink/slot_expand, impl triton); only a GPU "
                         f"run times the Triton kernels (a CPU run times the torch references)")
    return rows.reset_index(drop=True)


def _fit_blocks(g: pd.DataFrame, what: str):
    """``t_ms = c + l_cta * launched + l_active * working`` on rows ``g``: (fitted, predictions, y)."""
    y = g["time_ms_median"].to_numpy(float)
    launched = g["blocks_launched"].to_numpy(float)
    working = g["blocks_working"].to_numpy(float)
    if len(g) < 4:
        raise FitError(f"grid report: {len(g)} {what} rows; need at least 4 (more slots, tokens or adapters)")
    scale = float(np.median(y))
    specs = [ParamSpec("c", 0.5 * scale, 0.0), ParamSpec("l_cta", scale / max(launched.max(), 1.0) * 0.1, 0.0),
             ParamSpec("l_active", scale / max(working.max(), 1.0), 0.0)]

    def f(c, l_cta, l_active):
        return c + l_cta * launched + l_active * working

    fit = fit_params(f, specs, y, np.maximum(y, 1e-9), f"grid report / {what}")
    v = fit.values
    return fit, f(v["c"], v["l_cta"], v["l_active"]), y


#: vLLM 0.8.5's lora_shrink splits K 64 ways below this many tokens, 8 ways from it
SPLIT64_BELOW_TOKENS = 128


def split_regimes(rows: pd.DataFrame) -> dict[str, Any] | None:
    """The shrink kernel fitted apart on its 64-split (fewer than 128 tokens) and 8-split rows: each regime's
    per-block costs with standard errors and the working-block ratio 64-split / 8-split (None when a regime
    has fewer than 4 rows)."""
    g = rows[rows["kernel"] == "slot_shrink"]
    few = g["batch_tokens"] < SPLIT64_BELOW_TOKENS
    if few.sum() < 4 or (~few).sum() < 4:
        return None
    out: dict[str, Any] = {}
    for name, sub in (("split64", g[few]), ("split8", g[~few])):
        fit, _, _ = _fit_blocks(sub, f"slot_shrink {name}")
        out[name] = {"rows": int(len(sub)), "l_cta_ns": fit.values["l_cta"] * 1e6,
                     "l_active_ns": fit.values["l_active"] * 1e6,
                     "l_active_se_ns": fit.stderr["l_active"] * 1e6, "l_cta_se_ns": fit.stderr["l_cta"] * 1e6}
    a64, a8 = out["split64"], out["split8"]
    ratio = a64["l_active_ns"] / a8["l_active_ns"] if a8["l_active_ns"] > 0 else float("nan")
    # first-order error propagation of a ratio of independent estimates (nan where a constant sat at a bound)
    rel = np.hypot(a64["l_active_se_ns"] / a64["l_active_ns"], a8["l_active_se_ns"] / a8["l_active_ns"]) \
        if a64["l_active_ns"] > 0 and a8["l_active_ns"] > 0 else float("nan")
    out["working_ratio"] = float(ratio)
    out["working_ratio_se"] = float(ratio * rel)
    return out


def grid_report(rows: pd.DataFrame, profile: Any = None) -> GridReport:
    """Per kernel, ``t_ms = c + l_cta * blocks_launched + l_active * blocks_working`` (all >= 0) fitted
    with curve_fit, relative errors; ``profile`` (a :class:`twin.perf.profile.Profile`) for comparison."""
    out = []
    for kernel, g in rows.groupby("kernel", sort=True):
        fit, pred, y = _fit_blocks(g, kernel)
        v = fit.values
        q = quality(y, pred)
        out.append({"kernel": kernel, "rows": len(g), "slots_max": int(g["slots"].max()), "c_us": v["c"] * 1e3,
                    "l_cta_ns": v["l_cta"] * 1e6, "l_active_ns": v["l_active"] * 1e6, "r2": q["r2"],
                    "mape_pct": q["mape_pct"], "at_bound": ",".join(fit.at_bound)})
    prof: dict[str, float] = {}
    if profile is not None and "lora" in profile.components and profile.components["lora"].form == "kernel_grid":
        p = profile.components["lora"].params
        prof = {"l_cta_ns": float(p["l_cta"]) * 1e9, "l_active_ns": float(p["l_active"]) * 1e9,
                "split64_cost": float(p.get("split64_cost", 1.0))}
    return GridReport(pd.DataFrame(out), prof, {"profile": getattr(profile, "name", None),
                                                "device": str(rows["device"].iloc[0]) if "device" in rows else "?"},
                      split_regimes(rows))


def _split_text(rep: GridReport) -> str | None:
    sp = rep.splits
    if not sp:
        return None
    a64, a8 = sp["split64"], sp["split8"]
    text = (f"a working block costs {a64['l_active_ns']:.3g} +- "
            f"{a64['l_active_se_ns']:.2g} ns with 64 splits (< {SPLIT64_BELOW_TOKENS} tokens, {a64['rows']} rows) and "
            f"{a8['l_active_ns']:.3g} +- {a8['l_active_se_ns']:.2g} ns with 8 ({a8['rows']} rows): ratio "
            f"{sp['working_ratio']:.2f} +- {sp['working_ratio_se']:.2f}")
    if "split64_cost" in rep.profile:
        text += f" (the profile's split64_cost: {rep.profile['split64_cost']:.3g})"
    return text


def grid_lines(rep: GridReport) -> list[str]:
    lines = ["slot-grid kernels: t = c + l_cta * launched blocks + l_active * working blocks (Triton rows)"]
    for r in rep.fits.itertuples():
        lines.append(f"  {r.kernel:<12} {r.rows:>4} rows (up to {r.slots_max} slots)  l_cta {r.l_cta_ns:.3g} ns  "
                     f"l_active {r.l_active_ns:.3g} ns  c {r.c_us:.3g} us  R^2 {r.r2:.3f}  MAPE {r.mape_pct:.1f} %")
    if rep.profile:
        lines.append(f"  profile {rep.meta['profile']} (fitted on whole steps): l_cta {rep.profile['l_cta_ns']:.3g} ns  "
                     f"l_active {rep.profile['l_active_ns']:.3g} ns")
    split = _split_text(rep)
    if split:
        lines.append(f"  slot_shrink by split-K regime: {split}")
    return lines


def grid_markdown(rep: GridReport) -> str:
    lines = ["## Slot-grid LoRA kernels: cost per launched and per working thread block", "",
             "`t = c + l_cta * launched + l_active * working`, fitted per kernel with curve_fit on the Triton rows of "
             "`lora_kernels.csv` (relative errors).", "",
             "| kernel | rows | slots up to | l_cta (ns) | l_active (ns) | c (us) | R^2 | MAPE % |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rep.fits.itertuples():
        lines.append(f"| {r.kernel} | {r.rows} | {r.slots_max} | {r.l_cta_ns:.3g} | {r.l_active_ns:.3g} | "
                     f"{r.c_us:.3g} | {r.r2:.3f} | {r.mape_pct:.1f} |")
    if rep.profile:
        lines += ["", f"The profile `{rep.meta['profile']}` prices a launched block at {rep.profile['l_cta_ns']:.3g} ns "
                      f"and a working one at {rep.profile['l_active_ns']:.3g} ns, fitted on whole steps (all layers, "
                      f"host time included)."]
    split = _split_text(rep)
    if split:
        lines += ["", f"`slot_shrink` by split-K regime: {split}."]
    return "\n".join(lines) + "\n"


def plot_grid(rep: GridReport, rows: pd.DataFrame):
    """Each slot-grid kernel's median time against the slots (one line per batch size, medians over the
    adapters, modules and ranks measured), measured (points) and as the fitted per-block costs predict it
    (dashed), beside measured against predicted per row: a :class:`matplotlib.figure.Figure` built without
    pyplot, as :func:`calibration.bench.step_report.plot_steps` (``bench-report --grid-plot`` saves it)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fits = rep.fits.set_index("kernel")
    df = rows.copy()
    df["predicted_ms"] = [fits.loc[k, "c_us"] * 1e-3 + fits.loc[k, "l_cta_ns"] * 1e-6 * launched
                          + fits.loc[k, "l_active_ns"] * 1e-6 * working
                          for k, launched, working in zip(df["kernel"], df["blocks_launched"], df["blocks_working"])]
    kernels = sorted(df["kernel"].unique())
    fig = Figure(figsize=(5 * (len(kernels) + 1), 4.4))
    axes = fig.subplots(1, len(kernels) + 1)
    cmap = colormaps["viridis"]
    for ax, kernel in zip(axes, kernels):
        g = df[df["kernel"] == kernel]
        sizes = sorted(g["batch_tokens"].unique())
        for i, t in enumerate(sizes):
            m = g[g["batch_tokens"] == t].groupby("slots")[["time_ms_median", "predicted_ms"]].median()
            col = cmap(i / max(len(sizes) - 1, 1))
            ax.plot(m.index, m["time_ms_median"], "o", color=col, label=f"{t} tokens")
            ax.plot(m.index, m["predicted_ms"], "--", color=col, alpha=0.7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("adapter slots (blocks launched for each)")
        ax.set_ylabel("kernel time (ms, median)")
        f = fits.loc[kernel]
        ax.set_title(f"{kernel}: l_cta {f['l_cta_ns']:.3g} ns, l_active {f['l_active_ns']:.3g} ns", fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    ax = axes[-1]
    for kernel in kernels:
        g = df[df["kernel"] == kernel]
        ax.scatter(g["predicted_ms"], g["time_ms_median"], s=8, label=kernel)
    lo, hi = float(df[["predicted_ms", "time_ms_median"]].min().min()), float(df[["predicted_ms", "time_ms_median"]].max().max())
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted (ms)")
    ax.set_ylabel("measured (ms)")
    ax.set_title("every row", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle(f"vLLM 0.8.5's slot-grid LoRA kernels on {rep.meta['device']}: t = c + l_cta * launched + "
                 f"l_active * working (points measured, dashed fitted)", fontsize=10)
    fig.tight_layout()
    return fig
