"""What a ``step_bench.csv`` says about the backbone form's shape where the calibration has no data (torch-free).

The Llama profile fits the twin's backbone form (``graph_roofline``,
:class:`twin.perf.forms.GraphRooflineBackbone`) on vLLM 0.8.5 windows with at most ~256 running
requests and ~100k context tokens. The validation runs the twin misses (issue 17) run 500-800
requests over 200-300k context tokens in 2,048-token mixed steps. :func:`step_report` asks the
bench table the question the calibration cannot answer: fitted with ``curve_fit`` on the
calibration-like shapes only (``decodes <= fit_max_decodes`` and ``context_tokens <= fit_max_context``),
does the form predict the larger ones? It reports, per region of the table, the median of
measured / predicted and the MAPE, and for every line of shapes that differ only in their
context the slope (ms per 100k context tokens) of each successive interval, so a curvature the
linear ``c_ctx * C`` term cannot follow shows as slopes that grow along the line.

A bench run times every step the same way, eagerly or (``--step-graphs``) as CUDA-graph replays, with no
switch at a capture size, so ``c_eager`` is pinned to 0; the other constants are fitted, in ms, with the
project's :func:`calibration.fitting.core.fit_params`. The same form is also fitted on every shape (its
adequacy apart from extrapolation), and ``graph_linear`` (Qwen-2.5-7B's profile form) can be fitted instead.

    twin calibrate bench-report results/calibration/bench_h200/step_graphs_llama --plot steps.png
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.bench.schema import STEP_BENCH_COLUMNS
from traces.arguments import cell_error
from calibration.fitting.components import MS, backbone_candidates
from calibration.fitting.core import FitError, ParamSpec, fit_params
from twin.model_spec import get_model

STEP_FILE = "step_bench.csv"
#: the calibration's reach (vLLM 0.8.5 step-latency and adapter-overhead windows): running requests, context tokens
FIT_MAX_DECODES = 256
FIT_MAX_CONTEXT = 100_000
#: the measured step time the report fits (ms), and the shape columns it reads
TIME_COLUMN = "time_ms_median"
SHAPE_COLUMNS = ("batch_tokens", "prefill_tokens", "decodes", "context_tokens")


@dataclass
class StepReport:
    """The fit on the calibration-like rows and its score everywhere."""

    table: pd.DataFrame          # the rows with ``predicted_ms``, ``ratio`` (measured / predicted) and ``region``
    params: dict[str, float]     # the fitted constants, SI units (s, s/token, ...)
    regions: pd.DataFrame        # per region: rows, median ratio, MAPE
    slopes: pd.DataFrame         # per line of shapes differing only in context: slope per interval
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "regions": self.regions.to_dict(orient="records"),
                "slopes": self.slopes.to_dict(orient="records"), **self.meta}


def read_step_table(path: str | Path) -> pd.DataFrame:
    """``step_bench.csv`` (a file or the bench's ``--out`` directory); a clear error when it is not one."""
    p = Path(path)
    if p.is_dir():
        p = p / STEP_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no {STEP_FILE} here; run `twin calibrate bench --parts step --out DIR` first "
                                f"and give DIR")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a readable CSV ({type(e).__name__}); give the {STEP_FILE} a bench run wrote") from None
    missing = [c for c in STEP_BENCH_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: not a step bench table (missing columns {missing}); give the {STEP_FILE} of "
                         f"`twin calibrate bench --parts step`")
    if len(df) == 0:
        raise ValueError(f"{p}: the table has no rows (the step sweep timed nothing)")
    if TIME_COLUMN not in df.columns:
        raise ValueError(f"{p}: not a step bench table of this version (missing column {TIME_COLUMN!r}, the time the "
                         f"report fits); rerun `twin calibrate bench --parts step`")
    # every row is one timed shape: counts >= 0, its times > 0 (the mean too: a table whose means were negated or
    # NaN gave the report of the original, the median being what it fits)
    times = (TIME_COLUMN, "time_ms_mean")
    for col in (*SHAPE_COLUMNS, *times):
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = ~np.isfinite(x) | ((x <= 0) if col in times else ((x < 0) | (x != np.round(x))))
        if wrong.any():
            what = "a time in ms > 0" if col in times else "a whole number >= 0"
            raise cell_error(p, df, int(np.argmax(wrong)), col, f"is not {what}",
                             f"give the {STEP_FILE} a bench run wrote (or drop the row)")
    return df


def _region(df: pd.DataFrame, max_dec: int, max_ctx: int, budget: int) -> np.ndarray:
    fit = (df["decodes"] <= max_dec) & (df["context_tokens"] <= max_ctx)
    saturated = (df["decodes"] >= 512) & (df["context_tokens"] >= 200_000) & (df["batch_tokens"] >= budget)
    return np.where(fit, "fit: calibration-like", np.where(saturated, "saturated: >=512 decodes, >=200k context, "
                                                                      "full budget", "beyond the calibration"))


#: the backbone forms the report can fit (those with a CUDA-graph term; see :mod:`twin.perf.forms`)
STEP_FORMS = ("graph_roofline", "graph_linear")


def step_report(table: pd.DataFrame, fit_max_decodes: int = FIT_MAX_DECODES,
                fit_max_context: int = FIT_MAX_CONTEXT, time_col: str = TIME_COLUMN,
                form: str = "graph_roofline") -> StepReport:
    """Fit the backbone ``form`` (``graph_roofline``, Llama's profile; ``graph_linear``, Qwen's) on the
    calibration-like rows of ``table`` and score it on all of them."""
    if form not in STEP_FORMS:
        raise ValueError(f"step report: form {form!r} is not one the report fits; choose from {', '.join(STEP_FORMS)}")
    df = table.copy()
    budget = int(df["batch_tokens"].max())
    df["region"] = _region(df, fit_max_decodes, fit_max_context, budget)
    fit_rows = df["region"].str.startswith("fit").to_numpy()
    cand = next(c for c in backbone_candidates(graph_max_tokens=int(budget) + 1) if c.form == form)
    cand.fixed = {**cand.fixed, "c_eager": 0.0}  # one timing mode per run (module docstring)
    y_fit = df.loc[df["region"].str.startswith("fit"), time_col].to_numpy(float)
    T_max = max(float(df["batch_tokens"].max()), 1.0)
    C_max = max(float(df["context_tokens"].max()), 1.0)
    D_max = max(float(df["decodes"].max()), 1.0)
    span = float(np.ptp(y_fit)) if len(y_fit) else 1.0
    lo_y = float(y_fit.min()) if len(y_fit) else 1.0
    # starting points from the table's own scale, no upper bounds (a CPU step is seconds, a GPU one ms)
    start = {"c0": 0.5 * lo_y, "c_mem": 0.25 * lo_y, "c_tok": span / T_max, "c_seq": 0.1 * span / D_max,
             "c_ctx": 0.1 * span / C_max, "c_prefill": span / T_max, "c_decode": span / D_max}
    cand.specs = [ParamSpec(sp.name, start[sp.name], 0.0) for sp in cand.specs if sp.name != "c_eager"]
    names = [s.name for s in cand.specs]
    n_fit = int(fit_rows.sum())
    if n_fit < len(names) + 1:
        raise FitError(f"step report: {n_fit} calibration-like rows (decodes <= {fit_max_decodes}, context <= "
                       f"{fit_max_context}) for {len(names)} constants; widen --fit-max-decodes/--fit-max-context or "
                       f"run a larger sweep")
    P = df["prefill_tokens"].to_numpy(float)
    D = df["decodes"].to_numpy(float)
    C = df["context_tokens"].to_numpy(float)
    y = df[time_col].to_numpy(float)

    def predict_ms(theta: dict[str, float], idx: np.ndarray) -> np.ndarray:
        return np.asarray(cand.model(theta).predict(P[idx], D[idx], C[idx]), float) / MS

    idx_fit = np.flatnonzero(fit_rows)

    def fit_on(idx: np.ndarray, what: str):
        return fit_params(lambda *th: predict_ms(dict(zip(names, th)), idx), cand.specs, y[idx],
                          np.maximum(y[idx], 1e-9), f"step report / {form} ({what})")  # relative errors

    fitted = fit_on(idx_fit, "calibration-like shapes")
    pred = predict_ms(fitted.values, np.arange(len(df)))
    df["predicted_ms"] = pred
    df["ratio"] = y / pred
    regions = (df.assign(ape=np.abs(y / pred - 1.0) * 100.0)
               .groupby("region", sort=False)
               .agg(rows=("ratio", "size"), median_ratio=("ratio", "median"), max_ratio=("ratio", "max"),
                    mape_pct=("ape", "mean"))
               .reset_index())
    # the form's adequacy apart from its extrapolation: the same form fitted on every shape
    everywhere = fit_on(np.arange(len(df)), "every shape")
    pred_all = predict_ms(everywhere.values, np.arange(len(df)))
    sat = df["region"].str.startswith("saturated").to_numpy()
    all_fit = {"params": {k: float(v) for k, v in cand.model(everywhere.values).params.items()},
               "mape_pct": float(np.mean(np.abs(y / pred_all - 1.0)) * 100.0),
               "max_ratio": float(np.max(y / pred_all)), "min_ratio": float(np.min(y / pred_all)),
               "saturated_median_ratio": float(np.median(y[sat] / pred_all[sat])) if sat.any() else None,
               "at_bound": list(everywhere.at_bound)}
    params = cand.model(fitted.values).params
    model = str(df.get("model", pd.Series(["?"])).iloc[0])
    timer = str(df["timer"].iloc[0]) if "timer" in df else ""
    return StepReport(df, {k: float(v) for k, v in params.items()}, regions, context_slopes(df, time_col),
                      {"fit_max_decodes": fit_max_decodes, "fit_max_context": fit_max_context, "time_column": time_col,
                       "rows": len(df), "fit_rows": n_fit, "at_bound": list(fitted.at_bound), "form": form,
                       "constants": names,
                       "layers": int(df["layers"].iloc[0]) if "layers" in df else None,
                       "device": str(df["device"].iloc[0]), "model": model, "timer": timer,
                       "cuda_graphs": "cuda_graph" in timer, "all_fit": all_fit,
                       "kv_bytes_per_context_token": kv_bytes_per_token(model, df)})


def kv_bytes_per_token(model: str, df: pd.DataFrame) -> float | None:
    """Bytes of K and V one context token holds over all layers (what a step's attention reads per context
    token): ``2 * layers * kv_heads * head_dim * dtype bytes``, from :mod:`twin.model_spec` when the table's
    model is one it knows (None otherwise, e.g. a ``--small`` CPU run)."""
    try:
        spec = get_model(model)
    except (KeyError, ValueError):
        return None
    layers = int(df["layers"].iloc[0]) if "layers" in df else spec.layers
    dtype = str(df["dtype"].iloc[0]) if "dtype" in df else "float16"
    size = {"float16": 2, "bfloat16": 2, "float32": 4}.get(dtype, spec.dtype_bytes)
    return float(2 * layers * spec.kv_heads * spec.head_dim * size)


def context_slopes(df: pd.DataFrame, time_col: str = "time_ms_median") -> pd.DataFrame:
    """For each line of shapes equal but for the decodes' context: the slope (ms per 100k context tokens)
    of each successive interval, first to last, last / first (1 for a linear cost), and the least-squares
    slope over the whole line (less sensitive to one noisy shape)."""
    keys = ["decodes", "prefill_tokens", "prefill_seqs", "prefill_ctx_before"]
    rows = []
    for key, g in df[df["decodes"] > 0].groupby(keys):
        g = g.sort_values("context_tokens")
        c, t = g["context_tokens"].to_numpy(float), g[time_col].to_numpy(float)
        if len(g) < 3:
            continue
        s = np.diff(t) / np.diff(c) * 1e5
        rows.append({**dict(zip(keys, key)), "contexts": len(g), "context_max": int(c[-1]),
                     "slope_first_ms_per_100k": float(s[0]), "slope_last_ms_per_100k": float(s[-1]),
                     "last_over_first": float(s[-1] / s[0]) if s[0] > 0 else float("nan"),
                     "slope_lsq_ms_per_100k": float(np.polyfit(c / 1e5, t, 1)[0])})
    return pd.DataFrame(rows, columns=keys + ["contexts", "context_max", "slope_first_ms_per_100k",
                                              "slope_last_ms_per_100k", "last_over_first", "slope_lsq_ms_per_100k"])


def _mode(m: dict) -> str:
    return ("each shape captured in a CUDA graph and replayed (`--step-graphs`): GPU time without host launch cost"
            if m.get("cuda_graphs") else "eager (no CUDA graphs): small steps include the host's launch cost")


def _bandwidth_text(rep: StepReport) -> str | None:
    """The KV read bandwidth the lines' median least-squares context slope implies (TB/s), if known."""
    kv = rep.meta.get("kv_bytes_per_context_token")
    if not kv or not len(rep.slopes):
        return None
    slope = float(rep.slopes["slope_lsq_ms_per_100k"].median())
    if slope <= 0:
        return None
    tbps = kv * 1e5 / (slope * 1e-3) / 1e12
    return (f"{slope:.3g} ms per 100k context tokens, least squares along each line (median): with "
            f"{kv / 1024:.0f} KiB of K and V per context token over the layers, the attention reads the cache at "
            f"~{tbps:.2f} TB/s")


def report_markdown(rep: StepReport, source: str) -> str:
    m = rep.meta
    p = rep.params
    lines = [f"# Mixed-step bench: does the backbone form extrapolate? ({m['model']}, {m['device']}, "
             f"{m['layers']} layers)", "",
             f"Source: `{source}` ({m['rows']} shapes; timing: {_mode(m)}). `{m.get('form', 'graph_roofline')}` fitted with curve_fit "
             f"on the {m['fit_rows']} calibration-like shapes (decodes <= {m['fit_max_decodes']}, context <= "
             f"{m['fit_max_context']:,} tokens; `c_eager` = 0: a run is all eager or all replayed), on "
             f"`{m['time_column']}`:", "",
             "| constant | value |", "| --- | --- |"]
    for k in m.get("constants", ("c0", "c_mem", "c_tok", "c_seq", "c_ctx")):
        lines.append(f"| `{k}` | {p[k]:.4g} |")
    if m["at_bound"]:
        lines += ["", f"At a bound: {', '.join(m['at_bound'])}."]
    lines += ["", "Measured / predicted by region:", "", "| region | shapes | median | max | MAPE % |",
              "| --- | --- | --- | --- | --- |"]
    for r in rep.regions.itertuples():
        lines.append(f"| {r.region} | {r.rows} | {r.median_ratio:.3f} | {r.max_ratio:.3f} | {r.mape_pct:.1f} |")
    a = m.get("all_fit")
    if a:
        sat = "" if a["saturated_median_ratio"] is None else \
            f", saturated-region median measured / predicted {a['saturated_median_ratio']:.3f}"
        lines += ["", f"The same form fitted on every shape (its adequacy apart from extrapolation): MAPE "
                      f"{a['mape_pct']:.1f} %, measured / predicted {a['min_ratio']:.3f} to {a['max_ratio']:.3f}{sat}; "
                      f"`c_ctx` {a['params']['c_ctx']:.4g} s per context token"
                      + (f" (at a bound: {', '.join(a['at_bound'])})" if a["at_bound"] else "") + "."]
    if len(rep.slopes):
        s = rep.slopes
        lines += ["", f"Context slopes (ms per 100k tokens) along {len(s)} lines of shapes: first interval median "
                      f"{s['slope_first_ms_per_100k'].median():.3g}, last {s['slope_last_ms_per_100k'].median():.3g}, "
                      f"last / first median {s['last_over_first'].median():.2f} (1 for a cost linear in the context)."]
        bw = _bandwidth_text(rep)
        if bw:
            lines += ["", bw[0].upper() + bw[1:] + "."]
    lines += ["", "A median ratio near 1 beyond the calibration says the form extrapolates on this software stack "
                  "(torch, SDPA attention); a ratio above 1 in the saturated region is a step cost the "
                  "calibration-fitted form misses there."]
    return "\n".join(lines) + "\n"


def summary_lines(rep: StepReport) -> list[str]:
    out = [f"step report: {rep.meta['rows']} shapes ({rep.meta['model']}, {rep.meta['device']}, "
           f"{'CUDA graphs' if rep.meta.get('cuda_graphs') else 'eager'}), {rep.meta.get('form', 'graph_roofline')} "
           f"fitted on {rep.meta['fit_rows']} calibration-like ones"]
    for r in rep.regions.itertuples():
        out.append(f"  {r.region:<58} {r.rows:>4} shapes  measured/predicted median {r.median_ratio:.3f}  "
                   f"max {r.max_ratio:.3f}  MAPE {r.mape_pct:.1f} %")
    a = rep.meta.get("all_fit")
    if a:
        sat = "" if a["saturated_median_ratio"] is None else f", saturated median {a['saturated_median_ratio']:.3f}"
        out.append(f"  the form fitted on every shape: MAPE {a['mape_pct']:.1f} %{sat}")
    if len(rep.slopes):
        out.append(f"  context slope last/first interval, median over {len(rep.slopes)} lines: "
                   f"{rep.slopes['last_over_first'].median():.2f}")
        bw = _bandwidth_text(rep)
        if bw:
            out.append(f"  context slope {bw}")
    return out


def plot_steps(rep: StepReport):
    """Step time against context along the full-budget and decode-only lines, measured (points) and the
    calibration-fitted form (lines), beside measured / predicted per shape coloured by region: a
    :class:`matplotlib.figure.Figure` built without pyplot (no global state), as :mod:`twin.figures` builds its
    figures (``twin calibrate bench-report --plot`` saves it; a notebook shows it)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    df = rep.table
    budget = int(df["batch_tokens"].max())
    fig = Figure(figsize=(15, 4.4))
    axes = fig.subplots(1, 3)
    for ax, sel, title in ((axes[0], (df["batch_tokens"] == budget) & (df["decodes"] > 0),
                            f"full {budget}-token steps (prefill fills the rest)"),
                           (axes[1], df["prefill_tokens"] == 0, "decode-only steps")):
        sub = df[sel]
        if "prefill_ctx_before" in sub:
            sub = sub[sub["prefill_ctx_before"] == sub["prefill_ctx_before"].min()]
        cmap = colormaps["viridis"]
        decs = sorted(sub["decodes"].unique())
        for i, d in enumerate(decs):
            g = sub[sub["decodes"] == d].sort_values("context_tokens")
            col = cmap(i / max(len(decs) - 1, 1))
            ax.plot(g["context_tokens"] / 1e3, g[rep.meta["time_column"]], "o", color=col, label=f"{d} decodes")
            ax.plot(g["context_tokens"] / 1e3, g["predicted_ms"], "-", color=col, alpha=0.7)
        ax.set_xlabel("context tokens (thousands)")
        ax.set_ylabel("step time (ms)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    ax = axes[2]
    for region, g in df.groupby("region", sort=False):
        ax.scatter(g["batch_tokens"], g["ratio"], s=14, label=f"{region.split(':')[0]} ({len(g)})")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("tokens in the step")
    ax.set_ylabel("measured / predicted")
    ax.set_title("the form fitted on the calibration-like shapes", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    m = rep.meta
    fig.suptitle(f"{m['model']} on {m['device']}: mixed steps, {'CUDA graphs' if m.get('cuda_graphs') else 'eager'}"
                 f" (points measured, lines the form fitted on decodes <= {m['fit_max_decodes']}, context <= "
                 f"{m['fit_max_context'] // 1000}k)", fontsize=10)
    fig.tight_layout()
    return fig
