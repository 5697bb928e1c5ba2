"""Reading the vLLM 0.8.5 calibration tables and turning ~2 s windows into fit observations.

The tables are those documented in the data directory's README
(``calibration/vllm085_h100/``): ``step_latency{,_runs}.csv``,
``adapter_overhead{,_windows}.csv``, ``adapter_load.csv``, ``kv_capacity.csv``,
``scheduler_overhead.csv`` and ``peer_fitted_constants.csv``. Nothing is copied: the
fits read them from the directory given on the command line.

Window method (the finest grain the data has is a ~2 s Prometheus window with ``S`` engine
steps, ``P`` prompt tokens, running/waiting gauges at its two ends and KV usage at its end):

* **target**: ``mean_step_ms`` (gap between consecutive step timestamps) minus
  ``mean_scheduler_ms`` (measured separately) is the model-execution time of the mean step
  (backbone, plus LoRA where enabled); the scheduler is fitted to ``mean_scheduler_ms``,
  so that backbone + scheduler reproduces ``mean_step_ms``;
* **decode sequences per step** ``D``: mean of the running gauge at the window's ends
  (checked against generated tokens / steps where that counter is exact: median ratio 1.00);
* **context tokens** ``C``: mean of the KV usage at the window's start (previous window's
  end) and end, times the server's KV capacity, minus 8 tokens per sequence for the
  half-filled last 16-token block;
* **prefill tokens**: the window's ``P`` prompt tokens are carried by
  ``n = min(S, ceil(P / (2048 - D)))`` steps of ``P/n`` tokens (decodes are scheduled first
  and prompt chunks fill the rest of the ``max_num_batched_tokens`` = 2048 budget), the
  other ``S - n`` steps are pure decode; a model's window prediction is the
  step-weighted mean over these two kinds of step (exact for linear forms);
* **exclusions**: windows with fewer than 5 steps (sampling edges), the warm-up/drain
  windows (running gauge 0 at either end), windows whose counters overflowed (``NaN``) and
  stall windows (max step > 4x median: a one-off ~0.35 s host pause inside the scheduler);
* **weights**: a window's mean over ``S`` steps gets ``sigma = 1/sqrt(S)``;
* **kinds**: ``decode`` (no prompt tokens), ``prefill`` (prefill sweep) and ``mixed``
  (decode sweep windows where a new wave of prompts was prefilled). The step composition
  of mixed windows is not observed, so they are used for held-out scoring only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.fitting.core import FitError, first_nan_counts, warn_dropped
from twin.model_spec import ModelSpec, get_model

#: vLLM 0.8.5 V1 defaults of the measured servers
MAX_BATCHED_TOKENS = 2048
GRAPH_MAX_TOKENS = 512
MIN_STEPS = 5
STALL_FACTOR = 4.0

VLLM085_FILES = ("step_latency.csv", "step_latency_runs.csv", "adapter_overhead.csv", "adapter_overhead_windows.csv",
                 "adapter_load.csv", "kv_capacity.csv", "scheduler_overhead.csv")


def detect_format(directory: Path) -> str:
    """``vllm085`` (peer 0.8.5 tables), ``vllm050`` (Llama-2 0.5.0 runs) or ``vidur`` (operator timings)."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"measurement directory {d} does not exist; give --measurements the directory that "
                                f"holds the calibration tables (e.g. $TWIN_DATA_DIR/calibration/vllm085_h100)")
    if (d / "step_latency.csv").exists():
        return "vllm085"
    if (d / "runs.csv").exists() and (d / "adapter_load_manual.csv").exists():
        return "vllm050"
    if any(d.glob("*/*_mlp.csv")) or any(d.glob("*_mlp.csv")):
        return "vidur"
    raise FileNotFoundError(f"{d} holds no known calibration tables (expected step_latency.csv [vLLM 0.8.5], "
                            f"runs.csv + adapter_load_manual.csv [vLLM 0.5.0] or <gpu>/*_mlp.csv [Vidur])")


def same_model(names: pd.Series, model: ModelSpec) -> np.ndarray:
    """Rows of a ``model`` column that name ``model`` (aliases such as ``-instruct`` resolved)."""
    cache: dict[str, bool] = {}
    out = []
    for n in names.astype(str):
        if n not in cache:
            try:
                cache[n] = get_model(n).name == model.name
            except KeyError:
                cache[n] = False
        out.append(cache[n])
    return np.asarray(out, bool)


@dataclass
class Vllm085Tables:
    """The 0.8.5 tables restricted to one model (``sched``, ``peer`` keep their 'all' rows)."""

    directory: Path
    model: ModelSpec
    step_runs: pd.DataFrame
    step_windows: pd.DataFrame
    lora_runs: pd.DataFrame
    lora_windows: pd.DataFrame
    loads: pd.DataFrame
    kv: pd.DataFrame
    sched: pd.DataFrame
    peer: pd.DataFrame

    @classmethod
    def read(cls, directory: str | Path, model: str | ModelSpec) -> "Vllm085Tables":
        d = Path(directory)
        spec = model if isinstance(model, ModelSpec) else get_model(model)
        missing = [f for f in VLLM085_FILES if not (d / f).exists()]
        if missing:
            raise FileNotFoundError(f"{d} lacks {', '.join(missing)}; it is not a complete vLLM 0.8.5 calibration "
                                    f"directory (see the data README, section calibration/vllm085_h100)")

        def rd(name: str, by_model: bool = True) -> pd.DataFrame:
            df = pd.read_csv(d / name)
            if by_model and "model" in df.columns:
                df = df[same_model(df["model"], spec)].reset_index(drop=True)
            return df

        t = cls(d, spec, rd("step_latency_runs.csv"), rd("step_latency.csv"), rd("adapter_overhead.csv"),
                rd("adapter_overhead_windows.csv"), rd("adapter_load.csv"), rd("kv_capacity.csv"),
                rd("scheduler_overhead.csv", by_model=False),
                rd("peer_fitted_constants.csv", by_model=False) if (d / "peer_fitted_constants.csv").exists()
                else pd.DataFrame())
        if t.peer is not None and len(t.peer):
            t.peer = t.peer[same_model(t.peer["model"], spec) | (t.peer["model"] == "all")].reset_index(drop=True)
        if len(t.step_windows) == 0:
            avail = sorted(pd.read_csv(d / "step_latency_runs.csv")["model"].unique())
            raise FitError(f"no step-latency measurements of {spec.name} in {d}; models present: {avail}")
        return t


def _kv_tokens_per_run(windows: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """KV capacity (tokens) of the server of each window's run; runs whose log is missing take
    the median of the logged runs of the same experiment with the same LoRA setting."""
    keys = ["model", "experiment", "run_dir"]
    r = runs[keys + ["kv_cache_tokens"]].copy()
    r["lora"] = (runs["adapter_slots"].fillna(0) > 0) if "adapter_slots" in runs.columns else False
    kv = windows[keys].merge(r[keys + ["kv_cache_tokens"]], on=keys, how="left")["kv_cache_tokens"].to_numpy(float).copy()
    lora = ((windows["adapter_slots"].fillna(0) > 0).to_numpy() if "adapter_slots" in windows.columns
            else np.zeros(len(windows), bool))
    fill = r.groupby(["experiment", "lora"])["kv_cache_tokens"].median()
    fill_lora = r.groupby("lora")["kv_cache_tokens"].median()
    for i in np.flatnonzero(~np.isfinite(kv)):
        v = fill.get((windows["experiment"].iloc[i], bool(lora[i])), np.nan)
        kv[i] = v if np.isfinite(v) else fill_lora.get(bool(lora[i]), r["kv_cache_tokens"].median())
    return pd.Series(kv, index=windows.index)


def window_features(windows: pd.DataFrame, runs: pd.DataFrame, table: str = "windows") -> pd.DataFrame:
    """One row per usable window with the model inputs and targets (see the module docstring).

    Columns: ``group`` (run), ``experiment``, ``kind``, ``S``, ``P``, ``n_pre``, ``P_step``,
    ``D``, ``C``, ``R``, ``W``, ``G``, ``N``, ``A``, ``step_ms``, ``sched_ms``, ``comp_ms``
    (= step - scheduler), ``sigma``; ``attrs['excluded']`` counts the dropped windows by reason.
    Windows dropped for a NaN are named in a :class:`~calibration.fitting.core.DroppedRowsWarning`
    (``table``: where they come from).
    """
    w = windows.sort_values(["model", "experiment", "run_dir", "window_start_s"]).copy()
    w["kv_start"] = w.groupby(["model", "experiment", "run_dir"])["kv_usage_end"].shift(1).fillna(0.0)
    w["kv_tokens"] = _kv_tokens_per_run(w, runs)
    reasons = {
        "fewer than 5 steps": w["engine_steps"].fillna(0) < MIN_STEPS,
        "no step timing": w["mean_step_ms"].isna() | w["mean_scheduler_ms"].isna(),
        "warm-up or drain (running 0 at an end)": (w["running_start"] == 0) | (w["running_end"] == 0),
        "token counter overflow (NaN)": w["prompt_tokens"].isna(),
        "stall (max step > 4x median)": w["max_step_ms"] > STALL_FACTOR * w["median_step_ms"],
    }
    drop = np.zeros(len(w), bool)
    excluded = {}
    for name, m in reasons.items():
        m = m.to_numpy() & ~drop
        excluded[name] = int(m.sum())
        drop |= m
    warn_dropped(table, len(w), {"engine_steps": int(w["engine_steps"].isna().sum()),  # (under "fewer than 5 steps")
                                 "mean_step_ms or mean_scheduler_ms": excluded["no step timing"],
                                 "prompt_tokens": excluded["token counter overflow (NaN)"]}, "windows")
    w = w[~drop].copy()
    S = w["engine_steps"].to_numpy(float)
    P = w["prompt_tokens"].to_numpy(float)
    D = (w["running_start"].to_numpy(float) + w["running_end"].to_numpy(float)) / 2
    # decodes are scheduled first; prompt chunks fill the rest of the 2048-token budget
    n_pre = np.minimum(S, np.ceil(P / np.maximum(MAX_BATCHED_TOKENS - D, 64.0)))
    C = np.maximum((w["kv_start"].to_numpy(float) + w["kv_usage_end"].to_numpy(float)) / 2
                   * w["kv_tokens"].to_numpy(float) - 8.0 * D, 0.0)
    G = w["adapter_slots"].fillna(0).to_numpy(float) if "adapter_slots" in w.columns else np.zeros(len(w))
    N = w["adapters_used"].fillna(0).to_numpy(float) if "adapters_used" in w.columns else np.zeros(len(w))
    N = np.where(N > 0, N, G)
    A = w["mean_unique_adapters"].fillna(0).to_numpy(float) if "mean_unique_adapters" in w.columns else np.zeros(len(w))
    kind = np.where(P == 0, "decode", np.where(w["experiment"].to_numpy() == "prefill_sweep", "prefill", "mixed"))
    out = pd.DataFrame({
        "group": (w["experiment"] + "/" + w["run_dir"]).to_numpy(),
        "experiment": w["experiment"].to_numpy(), "kind": kind, "S": S, "P": P, "n_pre": n_pre,
        "P_step": np.where(n_pre > 0, P / np.maximum(n_pre, 1), 0.0), "D": D, "C": C,
        "R": D, "W": (w["waiting_start"].to_numpy(float) + w["waiting_end"].to_numpy(float)) / 2,
        "G": G, "N": N, "A": A, "adapters_used": w["adapters_used"].fillna(0).to_numpy(float) if "adapters_used" in w
        else 0.0,
        "step_ms": w["mean_step_ms"].to_numpy(float), "sched_ms": w["mean_scheduler_ms"].to_numpy(float),
        "sigma": 1.0 / np.sqrt(S), "window_start_s": w["window_start_s"].to_numpy(float),
    })
    out["comp_ms"] = out["step_ms"] - out["sched_ms"]
    out.attrs["excluded"] = excluded
    return out.reset_index(drop=True)


def prefill_run_points(runs: pd.DataFrame, used_groups: set[str]) -> pd.DataFrame:
    """Run-level observations of prefill-sweep runs that have no usable window (too few steps).

    A run of ``S`` logged steps with ``P`` prompt tokens and 1-token outputs becomes one
    observation with ``n = ceil(P/2048)`` prefill steps and ``D = C = 0``.
    """
    r = runs[runs["experiment"] == "prefill_sweep"].copy()
    r["group"] = r["experiment"] + "/" + r["run_dir"]
    r = r[~r["group"].isin(used_groups)]
    warn_dropped("step_latency_runs.csv (prefill runs without windows)", len(r),
                 first_nan_counts(r, ("engine_steps", "mean_step_ms")), "runs")
    r = r[r["engine_steps"].notna() & r["mean_step_ms"].notna()]
    if len(r) == 0:
        return pd.DataFrame()
    S = r["engine_steps"].to_numpy(float)
    P = r["total_input_tokens"].to_numpy(float)
    n_pre = np.minimum(S, np.ceil(P / MAX_BATCHED_TOKENS))
    out = pd.DataFrame({
        "group": r["group"].to_numpy(), "experiment": "prefill_sweep", "kind": "prefill", "S": S, "P": P,
        "n_pre": n_pre, "P_step": P / np.maximum(n_pre, 1), "D": 0.0, "C": 0.0, "R": 0.0, "W": 0.0, "G": 0.0,
        "N": 0.0, "A": 0.0, "adapters_used": 0.0, "step_ms": r["mean_step_ms"].to_numpy(float),
        "sched_ms": r["mean_scheduler_ms_per_step"].to_numpy(float), "sigma": 1.0 / np.sqrt(S),
        "window_start_s": np.nan})
    out["comp_ms"] = out["step_ms"] - out["sched_ms"]
    return out.reset_index(drop=True)
