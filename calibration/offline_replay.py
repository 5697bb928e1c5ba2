"""Replay the calibration's offline runs end to end through the twin (a calibration-side check).

The profile's step costs are fitted on the ~2 s *windows* of the calibration runs
(``step_latency.csv``, ``adapter_overhead_windows.csv``); this replays the *runs* themselves
(``step_latency_runs.csv``, ``adapter_overhead.csv``) through the whole engine and compares what
their client measured: the benchmark's duration, mean TTFT, mean ITL / TPOT and token
throughput. Every run is offline (``benchmark_throughput``-style: all ``num_prompts`` requests
sent at t = 0), so its workload is known exactly: ``input_tokens_per_req`` prompt tokens and
``output_tokens_per_req`` output tokens per request, vLLM 0.8.5's chunked prefill with the run's
``max_num_batched_tokens`` (2,048) and ``max_num_seqs`` (where the table leaves it empty, vLLM's
default for a GPU under 70 GiB: 256, ``EngineArgs._set_default_args_v1``; the ``find_max_batch``
run's observed maximum of 256 running agrees), the run's measured KV cache size. LoRA runs use
``adapters_used`` adapters of ``adapter_rank``, each request's drawn uniformly at random (seeded),
pre-loaded in the GPU slots (``lora_pre_loading``), with the run's ``max_loras`` and
``max_lora_rank``. Random, not round-robin in request order: the runs' windows hold
``N (1 - (1 - 1/N)^R)`` distinct adapters per step for ``R`` running requests over ``N`` adapters
(105 of 128, 120 of 160, 134 of 192 at 220 running), where a round-robin order would put every
adapter in each step.

The benchmark client's start-up is modelled too. With an infinite request rate, vLLM's benchmark
client creates one task per request and asyncio starts them all (each builds its own aiohttp
session) before its event loop polls a socket, so the first request reaches the server only
after about ``client_start_s`` per request, and request ``i``'s clock (its TTFT's origin) starts
at ``i * client_start_s``. The prefill sweeps show it: their duration exceeds the span of their
logged engine steps (``engine_steps * mean_step_ms``, which the twin's engine time matches) by
0.98-1.26 ms per request whatever the prompt length and ``max_num_seqs``. :func:`estimate_client_start`
takes the median over the prefill sweeps (replayed without it) of that excess per request; it is
a property of the load generator, not of vLLM, and does not apply to Poisson arrivals (the client
then sleeps between requests).

Two kinds of run, reported apart (``fitted`` column):

* runs whose windows the fit used (they have a step log): the replay is a closure test of the
  engine's mechanics -- batch formation, chunked prefill, admission -- on top of step costs fitted
  to the same runs;
* runs without a step log, whose windows the fit never saw (the LoRA runs with the most adapters
  and ``find_max_batch``, the only calibration run with both a 2,048-token prefill chunk and
  hundreds of decodes of hundreds of adapters in one step): an extrapolation check.

``twin calibrate replay-offline`` prints the table and the per-kind SMAPE (the published
twin's convention ``100*mean(|t-r|/(|t|+|r|))``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.workload import Workload
from twin.config import EngineConfig
from twin.perf.profile import Profile, default_variant, load_profile
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate
from twin.validation.scoring import smape

#: vLLM 0.8.5's ``max_num_seqs`` when the server is not given one, on a GPU with less than 70 GiB
#: (the calibration's H100 64 GB): ``EngineArgs._set_default_args_v1``
DEFAULT_MAX_NUM_SEQS_UNDER_70GIB = 256
#: the calibration servers' token budget where a run does not record it
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: the client figures compared, real column -> twin summary key
FIGURES = {"duration_s": "duration_s", "mean_ttft_ms": "ttft_ms_mean", "mean_itl_ms": "itl_ms_mean",
           "total_tok_s": "total_tok_s"}
#: the calibration's models (``twin.model_spec`` names) -> the shipped profile fitted on their tables
PROFILE_OF_MODEL = {"llama-3.1-8b": "llama-3.1-8b_h100_vllm085", "qwen-2.5-7b": "qwen-2.5-7b_h100_vllm085"}


def offline_runs(step_runs: pd.DataFrame, lora_runs: pd.DataFrame) -> pd.DataFrame:
    """The successful offline runs of ``step_latency_runs.csv`` and ``adapter_overhead.csv`` (one
    model's rows), one row each with what a replay needs; ``fitted`` is True when the run has a
    step log (its windows are in the fit)."""
    cols = ["model", "experiment", "run_dir", "max_num_seqs", "adapter_slots", "max_lora_rank", "adapter_rank",
            "adapters_used", "num_prompts", "input_tokens_per_req", "output_tokens_per_req", "kv_cache_tokens",
            "max_num_batched_tokens", "engine_steps", "duration_s", "mean_ttft_ms", "mean_itl_ms", "total_tok_s",
            "ts_mean_running", "status"]
    frames = []
    for df, lora in ((step_runs, False), (lora_runs, True)):
        if df is None or len(df) == 0:
            continue
        d = df.copy()
        for c in cols:
            if c not in d.columns:
                d[c] = np.nan
        d = d[cols].assign(lora=lora)
        if not lora:
            d[["adapter_slots", "max_lora_rank", "adapter_rank"]] = np.nan
            d["adapters_used"] = 0
        frames.append(d)
    if not frames:
        return pd.DataFrame(columns=cols + ["lora", "fitted"])
    runs = pd.concat(frames, ignore_index=True)
    ok = ((runs["status"] == "ok") & runs["num_prompts"].notna() & runs["input_tokens_per_req"].notna()
          & runs["output_tokens_per_req"].notna() & runs["duration_s"].notna())
    skipped = runs.loc[~ok, ["run_dir", "status"]]
    runs = runs[ok].reset_index(drop=True)
    runs["fitted"] = runs["engine_steps"].notna()
    #: the runs not replayed (a failed run, one that recorded no lengths or duration): ``(run_dir, status)``
    runs.attrs["skipped"] = [(str(r), str(st)) for r, st in zip(skipped["run_dir"], skipped["status"])]
    return runs


def _int(v: Any, default: int) -> int:
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else int(round(float(v)))


def replay_run(run: pd.Series | dict, profile: Profile, seed: int = 0, client_start_s: float = 0.0) -> dict[str, Any]:
    """Simulate one offline run (a row of :func:`offline_runs`); returns the twin's figures.
    ``seed`` draws the requests' adapters; ``client_start_s`` is the client's start-up time per
    request (every request reaches the server at ``n * client_start_s``; request ``i``'s TTFT
    counts from ``i * client_start_s``)."""
    r = dict(run)
    n = _int(r["num_prompts"], 0)
    prompt = max(_int(r["input_tokens_per_req"], 1), 1)
    out = max(_int(r["output_tokens_per_req"], 1), 1)
    seqs = _int(r.get("max_num_seqs"), DEFAULT_MAX_NUM_SEQS_UNDER_70GIB)
    budget = _int(r.get("max_num_batched_tokens"), DEFAULT_MAX_NUM_BATCHED_TOKENS)
    lora = bool(r.get("lora")) and _int(r.get("adapters_used"), 0) > 0
    n_adapters = _int(r.get("adapters_used"), 0) if lora else 1
    rank = _int(r.get("adapter_rank"), 8) if lora else 8
    adapter = np.random.default_rng(seed).integers(0, n_adapters, n) if lora else np.full(n, -1)
    sent = n * float(client_start_s)
    wl = Workload.from_arrays(np.full(n, sent), np.full(n, prompt), np.full(n, out), adapter, np.full(n, rank),
                              meta={"source": "calibration offline run", "run_dir": str(r.get("run_dir"))})
    if lora:
        slots = _int(r.get("adapter_slots"), n_adapters)
        cfg = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, enable_lora=True, max_loras=slots,
                           max_cpu_loras=max(slots, n_adapters), max_lora_rank=_int(r.get("max_lora_rank"), rank),
                           served_adapters=n_adapters, max_model_len=prompt + out + 16)
    else:
        cfg = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, enable_lora=False,
                           max_model_len=prompt + out + 16)
    kv = r.get("kv_cache_tokens")
    if kv is not None and not (isinstance(kv, float) and math.isnan(kv)):
        cfg.kv_capacity_tokens = int(kv)
    sched = make_scheduler("fcfs+client-cap", client_cap=None, preload_cpu=True, preload_gpu=lora)
    res = simulate(wl, profile, cfg, scheduler_obj=sched, cache_obj=make_cache("lru"), record_steps=False)
    s = res.summary
    req = res.requests.sort_values("request_id")
    duration = float(req["finish_s"].max()) if len(req) else float("nan")
    # the client's clock for request i starts at i * client_start_s (request ids follow the workload order)
    ttft = (req["first_token_s"].to_numpy(float) - np.arange(len(req)) * float(client_start_s)) * 1e3
    return {"duration_s": duration, "ttft_ms_mean": float(np.nanmean(ttft)) if len(req) else None,
            "itl_ms_mean": s.get("itl_ms_mean") if out > 1 else None,
            "total_tok_s": n * (prompt + out) / duration if duration > 0 else float("nan"),
            "engine_steps": s.get("engine_steps"), "finished": s.get("requests_finished"),
            "adapter_loads": s.get("adapter_loads"), "preemptions": s.get("preemptions"), "prompt_tokens": prompt,
            "output_tokens": out, "max_num_seqs": seqs}


def estimate_client_start(runs: pd.DataFrame, profile: Profile | str | None, seed: int = 0) -> float | None:
    """The client's start-up time per request (s): the median, over the prefill sweeps replayed
    without it, of (real duration - twin duration) / requests. None without a prefill sweep."""
    pre = runs[runs["experiment"] == "prefill_sweep"]
    if len(pre) == 0:
        return None
    rows = replay_offline_runs(pre, profile, seed, client_start_s=0.0)
    return float(np.median((rows["real_duration_s"] - rows["twin_duration_s"]) / rows["prompts"]))


def replay_offline_runs(runs: pd.DataFrame, profile: Profile | str | None, seed: int = 0,
                        client_start_s: float = 0.0) -> pd.DataFrame:
    """Replay every run of ``runs`` (:func:`offline_runs`); one row per run, real beside twin."""
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    rows = []
    for _, r in runs.iterrows():
        t = replay_run(r, prof, seed, client_start_s)
        row = {"experiment": r["experiment"], "run_dir": r["run_dir"], "fitted": bool(r["fitted"]),
               "slots": r["adapter_slots"], "adapters": r["adapters_used"], "max_num_seqs": t["max_num_seqs"],
               "prompts": int(r["num_prompts"]), "prompt_tokens": t["prompt_tokens"],
               "output_tokens": t["output_tokens"], "twin_steps": t["engine_steps"],
               "real_steps": r["engine_steps"], "twin_preemptions": t["preemptions"]}
        for real_col, twin_key in FIGURES.items():
            row[f"real_{real_col}"] = float(r[real_col]) if pd.notna(r[real_col]) else np.nan
            v = t[twin_key]
            row[f"twin_{real_col}"] = float(v) if v is not None else np.nan
        if t["output_tokens"] <= 1:  # one output token: no inter-token gap to compare
            row["real_mean_itl_ms"] = row["twin_mean_itl_ms"] = np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _smape(twin: np.ndarray, real: np.ndarray) -> float | None:
    """:func:`twin.validation.scoring.smape` (the published convention), None where no run has both."""
    v = smape(twin, real)
    return None if math.isnan(v) else v


def summary(rows: pd.DataFrame) -> dict[str, Any]:
    """Per kind of run (fitted windows or not) and per experiment: runs and the SMAPE of each
    figure; and the twin / real ratio of every figure of the runs the fit never saw."""
    out: dict[str, Any] = {"runs": int(len(rows)), "convention": "100*mean(|t-r|/(|t|+|r|))"}
    for kind, sub in (("fitted", rows[rows["fitted"]]), ("not_fitted", rows[~rows["fitted"]])):
        block: dict[str, Any] = {"runs": int(len(sub))}
        for exp, g in sub.groupby("experiment"):
            block[str(exp)] = {"runs": int(len(g)),
                               **{f"smape_{c}": _smape(g[f"twin_{c}"].to_numpy(float), g[f"real_{c}"].to_numpy(float))
                                  for c in FIGURES}}
        out[kind] = block
    ratios = []
    for _, r in rows[~rows["fitted"]].iterrows():
        ratios.append({"experiment": r["experiment"], "run_dir": r["run_dir"],
                       **{f"{c}_twin_over_real": (r[f"twin_{c}"] / r[f"real_{c}"]
                                                  if np.isfinite(r[f"real_{c}"]) and r[f"real_{c}"] else None)
                          for c in FIGURES}})
    out["not_fitted_ratios"] = ratios
    return out


def profile_for_model(model: str) -> str:
    """The shipped profile fitted on a calibration model's tables (``twin.model_spec`` name), in its default variant
    where one is shipped (:func:`twin.perf.profile.default_variant`: Llama-3.1-8B's adapter check, fitted on the same
    tables), so the replay runs the profile every other command picks."""
    try:
        return default_variant(PROFILE_OF_MODEL[model])
    except KeyError:
        raise ValueError(f"no shipped profile for the calibration model {model!r}; known: "
                         f"{', '.join(sorted(PROFILE_OF_MODEL))}; give --profile") from None


def write_markdown(rows: pd.DataFrame, summ: dict[str, Any], path: Path, command: str, profile: str) -> None:
    """A short report: the command, the per-kind table, and every run the fit never saw."""
    lines = ["# Replaying the calibration's offline runs end to end (calibration data)", "",
             f"Generated with `{command}` (profile `{profile}`; the benchmark client's start-up "
             f"{summ.get('client_start_ms', 0.0):.2f} ms per request, estimated on the prefill sweeps).", "",
             "Every run sends all its requests at t = 0 with fixed prompt and output lengths, so the twin re-creates",
             "its workload exactly (`calibration/offline_replay.py`). SMAPE in the published twin's convention",
             "`100*mean(|t-r|/(|t|+|r|))`, %:", "",
             "| runs | experiment | runs | duration | mean TTFT | mean ITL | token throughput |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]

    def f(v):
        return "-" if v is None else f"{v:.1f}"
    for kind, label in (("fitted", "windows in the fit (closure)"), ("not_fitted", "no step log (never fitted)")):
        for exp, b in summ[kind].items():
            if exp == "runs":
                continue
            lines.append(f"| {label} | {exp} | {b['runs']} | {f(b['smape_duration_s'])} | {f(b['smape_mean_ttft_ms'])} "
                         f"| {f(b['smape_mean_itl_ms'])} | {f(b['smape_total_tok_s'])} |")
    lines += ["", "Runs the fit never saw, twin against real:", "",
              "| experiment | run | slots | adapters | max_num_seqs | prompt / output tokens | duration s | mean TTFT s "
              "| mean ITL ms |", "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
    for _, r in rows[~rows["fitted"]].iterrows():
        lora = pd.notna(r["slots"]) and _int(r["adapters"], 0) > 0
        slots, adapters = (str(_int(r["slots"], 0)), str(_int(r["adapters"], 0))) if lora else ("-", "-")
        lines.append(f"| {r['experiment']} | `{r['run_dir']}` | {slots} | {adapters} | "
                     f"{r['max_num_seqs']} | {r['prompt_tokens']} / {r['output_tokens']} | "
                     f"{r['twin_duration_s']:.0f} / {r['real_duration_s']:.0f} | "
                     f"{r['twin_mean_ttft_ms'] / 1e3:.1f} / {r['real_mean_ttft_ms'] / 1e3:.1f} | "
                     f"{r['twin_mean_itl_ms']:.1f} / {r['real_mean_itl_ms']:.1f} |")
    path.write_text("\n".join(lines) + "\n")


def replay_figure(rows: pd.DataFrame, title: str = ""):
    """Twin against real per run: duration, mean TTFT and mean ITL on log-log axes with the
    identity line, runs whose windows are in the fit apart from those never fitted. Returns a
    :class:`matplotlib.figure.Figure` (built without ``pyplot``)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (col, label, scale) in zip(axes, (("duration_s", "duration (s)", 1.0),
                                              ("mean_ttft_ms", "mean TTFT (s)", 1e-3),
                                              ("mean_itl_ms", "mean ITL (ms)", 1.0))):
        lo, hi = np.inf, 0.0
        for fitted, marker, name in ((True, "o", "windows in the fit"), (False, "^", "never fitted")):
            g = rows[rows["fitted"] == fitted]
            r, t = g[f"real_{col}"].to_numpy(float) * scale, g[f"twin_{col}"].to_numpy(float) * scale
            m = np.isfinite(r) & np.isfinite(t) & (r > 0) & (t > 0)
            if m.any():
                ax.scatter(r[m], t[m], marker=marker, s=18, alpha=0.8, label=name)
                lo, hi = min(lo, r[m].min(), t[m].min()), max(hi, r[m].max(), t[m].max())
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.set_xscale("log")  # log axes, labels on the decades only
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"real {label}")
        ax.set_ylabel(f"twin {label}")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
