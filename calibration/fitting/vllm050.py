"""Profile of Llama-2 on the H100 with vLLM 0.5.0, from the older peer runs (``vllm050_h100_llama2``).

What the 0.5.0 runs can give, and how (run-level data only: no step log, no windows):

* **backbone (decode)**: the median inter-token latency of a run is a decode step at the
  run's mean running batch ``R`` and context ``C = KV usage x KV blocks x 16 - 8 R``
  (median: robust to the separate prefill steps of the V0 engine); runs whose requests use
  no adapter (LoRA disabled, or ``restrict_loras = 0``) only. CUDA graphs cover batches of
  at most 256 sequences in vLLM 0.5.0 (``graph_max_tokens = 256``).
* **backbone (prefill)**: the duration left after the decode steps,
  ``duration - (output tokens / R) * median ITL``, regressed on the input tokens: an
  *effective* per-token prefill cost that also carries recomputation after preemptions
  (these offline runs preempt) and V0 prefill-step overheads: a coarse estimate.
* **LoRA**: median ITL of runs using ``k`` adapters on the same server as a
  ``restrict_loras = 0`` run, with ``A = k (1 - (1 - 1/k)^R)`` expected distinct adapters per
  step; three max ranks (8/16/32) make the rank coefficient identifiable.
* **loads**: the hand-timed loads (``adapter_load_manual.csv``: disk load and activation,
  per rank; the first load of each rank is a cold start and is left out of the disk table).
* **KV**: "# GPU blocks" x 16 of the memory-overhead servers by slots and max rank
  (max_num_seqs 4096; failed starts with a logged block count are capacity points too).
* **scheduler**: not measured (the V0 scheduler time is not logged); it is inside the
  measured ITL and therefore inside the backbone: the component is zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting import components as C
from calibration.fitting.core import (FitError, ParamSpec, first_nan_counts, fit_params, grouped_folds, quality,
                                      warn_dropped)
from calibration.fitting.profile_io import build_profile, provenance
from calibration.fitting.tables import Col, adapter_rank, max_lora_rank, read_table, same_model, text
from calibration.fitting.vidur import read_ops
from twin.perf.forms import FORMS
from twin.model_spec import ALL_TARGETS, ModelSpec, get_model
from twin.scenario import VLLM050_MAX_LORA_RANKS

GPU = "H100-64GB"
SOFTWARE = "vllm-0.5.0"
GRAPH_MAX_TOKENS_V050 = 256
FILES = ("runs.csv", "adapter_load_manual.csv")


def profile_name(model: ModelSpec) -> str:
    return f"{model.name}_h100_vllm050"


VLLM050_README = "the data README, section calibration/vllm050_h100_llama2"
#: the columns the fit reads (see calibration.fitting.tables.Col)
RUNS_COLUMNS = (
    text("study", "study name"), text("experiment", "experiment name"), text("model", "model name"),
    text("variant", "variant name"), text("run_dir", "run directory"), text("status", "run status (ok, failed_...)"),
    Col("max_loras", "a number of adapter slots", whole=True),
    max_lora_rank(without_lora=True, ranks=VLLM050_MAX_LORA_RANKS),
    Col("restrict_loras", "a number of adapters requested"),
    Col("median_itl_ms", "a median inter-token latency (ms)", "pos"),
    Col("ts_mean_running", "a mean running-request gauge"), Col("ts_mean_kv_usage", "a mean KV usage", "frac"),
    Col("gpu_kv_blocks", "a number of KV blocks"), Col("duration_s", "a run duration (s)", "pos"),
    Col("total_input_tokens", "a number of prompt tokens"), Col("total_output_tokens", "a number of output tokens"),
)
LOAD_COLUMNS = (
    text("model", "model name"), text("phase", "load phase (first_load or later_load)"),
    adapter_rank(ranks=VLLM050_MAX_LORA_RANKS),
    Col("sample", "a sample number (1, 2, ...)", "pos", missing_ok=False, whole=True),
    Col("loading_ms", "an adapter loading time (ms)", "pos", missing_ok=False),
    Col("activating_ms", "an adapter activation time (ms)", "pos", missing_ok=False),
)


def read_runs(directory: Path, spec: ModelSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    d = Path(directory)
    missing = [f for f in FILES if not (d / f).exists()]
    if missing:
        raise FileNotFoundError(f"{d} lacks {', '.join(missing)} (vLLM 0.5.0 calibration directory expected)")
    # both tables are checked (columns, numbers, impossible values) before either is used
    runs = read_table(d / "runs.csv", RUNS_COLUMNS, VLLM050_README)
    loads = read_table(d / "adapter_load_manual.csv", LOAD_COLUMNS, VLLM050_README)
    runs = runs[same_model(runs["model"], spec)].reset_index(drop=True)
    loads = loads[same_model(loads["model"], spec)].reset_index(drop=True)
    if len(runs) == 0:
        raise FitError(f"no vLLM 0.5.0 runs of {spec.name} in {d}")
    return runs, loads


def decode_obs(runs: pd.DataFrame) -> pd.DataFrame:
    """One observation per completed performance-analysis run (those with a NaN in a column the fit
    needs are left out, named in a :class:`~calibration.fitting.core.DroppedRowsWarning`)."""
    r = runs[(runs["status"] == "ok") & runs["study"].eq("performance_analysis")]
    warn_dropped("runs.csv (completed performance_analysis runs)", len(r),
                 first_nan_counts(r, ("median_itl_ms", "ts_mean_running", "gpu_kv_blocks")), "runs")
    r = r[r["median_itl_ms"].notna() & (r["ts_mean_running"] > 0) & r["gpu_kv_blocks"].notna()].copy()
    r["restrict"] = r["restrict_loras"].fillna(0)
    r["k"] = np.where(r["experiment"] == "compute_overhead", r["restrict"], 0.0)
    R = r["ts_mean_running"].to_numpy(float)
    k = r["k"].to_numpy(float)
    out = pd.DataFrame({
        "group": (r["experiment"] + "/" + r["variant"] + "/" + r["max_loras"].fillna(0).astype(int).astype(str)
                  + "_" + r["max_lora_rank"].fillna(0).astype(int).astype(str)).to_numpy(),
        "run": r["run_dir"].to_numpy(), "experiment": r["experiment"].to_numpy(),
        "R": R, "D": R, "C": np.maximum(r["ts_mean_kv_usage"].to_numpy(float) * r["gpu_kv_blocks"].to_numpy(float) * 16
                                     - 8 * R, 0.0),
        "k": k, "A": np.where(k > 0, k * (1 - (1 - 1 / np.maximum(k, 1)) ** R), 0.0),
        "rank": r["max_lora_rank"].fillna(0).to_numpy(float),
        "itl_ms": r["median_itl_ms"].to_numpy(float), "duration_s": r["duration_s"].to_numpy(float),
        "in_tok": r["total_input_tokens"].to_numpy(float), "out_tok": r["total_output_tokens"].to_numpy(float),
        "S": np.ones(len(r)), "n_pre": np.zeros(len(r)), "P_step": np.zeros(len(r)), "sigma": np.ones(len(r)),
        "kind": "decode"})
    out["comp_ms"] = out["itl_ms"]
    return out.reset_index(drop=True)


def fit_vllm050(directory: str | Path, model: str | ModelSpec = "llama-2-7b", command: str = "", k: int = 5,
                data_root: Path | None = None, vidur_dir: Path | None = None) -> dict[str, Any]:
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    runs, manual = read_runs(Path(directory), spec)
    obs = decode_obs(runs)
    base = obs[obs["k"] == 0].reset_index(drop=True)
    if len(base) < 8:
        raise FitError(f"vllm050: {len(base)} runs without adapters for the decode-step fit; need at least 8")

    # backbone: decode steps from median ITL (P = 0); the prefill cost per token cannot come
    # from decode steps: it is taken from Vidur's H100 operator timings of the same model
    # when available, else estimated from the run durations (coarse)
    cp, cp_note = prefill_cost(Path(directory), base, spec, vidur_dir)
    backbone = C.fit_backbone(base, GRAPH_MAX_TOKENS_V050, k, train_kinds=("decode",),
                              method="median ITL of runs without adapter requests = decode step at (R, C); see "
                                     "calibration.fitting.vllm050", fixed={"c_prefill": cp["value"], "c_tok": cp["value"]})
    backbone["fit"]["prefill"] = cp
    bm = C.fitted_model(backbone, "backbone")

    # LoRA ----------------------------------------------------------------------------------
    lo = obs[obs["k"] > 0].reset_index(drop=True)
    lora = fit_lora_runs(lo, bm, k)

    # loads -----------------------------------------------------------------------------------
    rows = []
    for _, r in manual.iterrows():
        if r["phase"] != "first_load":
            rows.append(("disk", int(r["adapter_rank"]), float(r["loading_ms"]), int(r["sample"]), f"disk/{r['adapter_rank']}"))
        rows.append(("cpu", int(r["adapter_rank"]), float(r["activating_ms"]), int(r["sample"]), f"cpu/{r['adapter_rank']}"))
    ld = pd.DataFrame(rows, columns=["source", "rank", "load_ms", "order", "group"])
    load = C.fit_load(ld, spec, ALL_TARGETS,
                      method="adapter_load_manual.csv: disk = 'loading' times of the later loads (the first load of "
                             "each rank is a cold start), cpu = 'activating' times; link model across ranks 8/16/32")

    # KV ------------------------------------------------------------------------------------
    ko, pr = kv_probes(runs)
    ko["group"] = np.arange(len(ko))
    kv = C.fit_kv(ko, pr, spec.kv_bytes_per_token, spec.max_model_len,
                  method="memory_overhead servers (max_num_seqs 4096): '# GPU blocks' x 16 per (slots, max rank), "
                         "including failed starts that logged a block count; probes = the distinct (slots, rank) "
                         "starts (ECC/port failures left out)")

    sched_model = FORMS[("scheduler", "linear_queue")](params={"k0": 0.0, "k1": 0.0, "k2": 0.0, "k3": 0.0})
    sched = sched_model.to_dict()
    sched.update({"stderr": {}, "fit": {"heldout": {"all": {"note": "not measured"}}},
                  "method": "not identifiable: vLLM 0.5.0 logs no scheduler time; the scheduler's CPU time is part "
                            "of the measured inter-token latency and therefore of the backbone fit (zero here)"})

    notes = [cp_note, _decode_only_note(bm, C.fitted_model(lora, "lora")),
        "vLLM 0.5.0 (V0 engine, no chunked prefill by default, CUDA graphs up to batch 256) on one H100 64 GB; "
        "data: the peer's older performance-analysis runs. Not comparable 1:1 with the 0.8.5 profiles.",
        "What these runs cannot give: the scheduler time (not logged; folded into the backbone), a prefill cost "
        "(no prefill-step timing: taken from Vidur's operator timings when available, otherwise only an effective "
        "per-token cost from run durations that includes recomputation after preemptions), per-step LoRA data "
        "(adapters per step estimated as k(1-(1-1/k)^R) from the adapters used), and load times beyond three ranks "
        "with three to four hand-timed samples each (the disk table is noisy: 38-107 ms at rank 32).",
    ]
    prov = provenance(Path(directory), FILES, command, "see each component's 'method' and the module docstring of "
                      "calibration.fitting.vllm050", data_root=data_root,
                      extra={"source": "Agullo et al. (GPULLMAdapterOptimization), vLLM 0.5.0 runs",
                             "validation_data_used": False, "format": "vllm050"})
    return build_profile(profile_name(spec), spec.name, GPU, SOFTWARE,
                         f"{spec.name} on one H100 64 GB with vLLM 0.5.0 (V0 engine); fitted from run-level "
                         f"measurements (coarser than the 0.8.5 profiles)",
                         {"backbone": backbone, "lora": lora, "scheduler": sched, "load": load, "kv": kv}, prov,
                         ALL_TARGETS, None, notes)


def _decode_only_note(bm, lm) -> str:
    """The disclosure that the LoRA terms and the per-sequence cost come from decode-only runs (the run-level median
    ITL is a decode step: :func:`decode_obs`) and are extrapolations for prefill, with the figures they give."""
    p = bm.params
    dec = float(bm.predict(0, 1, 0))
    pre = float(bm.predict(512, 0, 0))
    lora_pre = float(lm.predict(pre, 1, 8, 512))
    lora_dec = float(lm.predict(dec, 1, 8, 1))
    per_tok = lm.params.get("l_token")
    return ("Decode-only extrapolations: the LoRA terms and the per-sequence cost are fitted on decode steps only (a "
            "run's median inter-token latency; these runs time no prefill step), and the profile applies them to "
            "prefills as fitted. LoRA (" + lm.form + ")"
            + (f": l_token = {per_tok * 1e3:.3g} ms per token, fitted where every token is a decode, is charged to "
               f"every token of a step, prefill tokens included" if per_tok is not None else "")
            + f": one rank-8 adapter adds {lora_pre * 1e3:.1f} ms to a 512-token prefill whose base step is "
            f"{pre * 1e3:.1f} ms ({lora_dec * 1e3:.1f} ms to one decode token). Backbone: c_seq = "
            f"{p.get('c_seq', 0.0) * 1e6:.0f} us per decode sequence (sampling and the V0 scheduler's per-sequence "
            f"time, both inside the decode ITL) is charged to decodes only, so a 512-token prefill step "
            f"({pre * 1e3:.1f} ms) prices below one decode token ({dec * 1e3:.1f} ms). Neither is physical for prefill "
            f"(no run measured it): a prefill with LoRA is likely priced far too slow, one without LoRA too fast; the "
            f"profile suits decode-dominated workloads.")


def prefill_cost(directory: Path, base: pd.DataFrame, spec: ModelSpec,
                 vidur_dir: Path | None) -> tuple[dict[str, Any], str]:
    """Per-token prefill cost (s): Vidur's H100 linear-op slope of the same model when the
    operator table is found (``vidur_dir`` or the sibling ``vidur_linear_ops``), else the
    effective cost from run durations (duration minus decode steps, regressed on input tokens)."""
    vd = Path(vidur_dir) if vidur_dir else Path(directory).parent / "vidur_linear_ops"
    try:
        ops = read_ops(vd, "h100", spec)
        big = ops["num_tokens"] >= 1024
        slope, icpt = np.polyfit(ops.loc[big, "num_tokens"], ops.loc[big, "lin_ms"], 1)
        res = ops.loc[big, "lin_ms"] - (icpt + slope * ops.loc[big, "num_tokens"])
        se = float(np.sqrt(np.sum(res ** 2) / (big.sum() - 2) / np.sum((ops.loc[big, "num_tokens"]
                                                                           - ops.loc[big, "num_tokens"].mean()) ** 2)))
        return ({"value": float(slope) * 1e-3, "stderr": se * 1e-3,
                 "source": f"Vidur H100 linear-op timings of {spec.name} (slope above 1024 tokens)"},
                f"Prefill cost per token ({slope * 1e3:.1f} us) from Vidur's H100 linear-operator timings of "
                f"{spec.name} (the 0.5.0 runs have no prefill-step timing); prefill attention and the V0 engine's "
                f"prefill-step overheads are not included (Vidur's H100 may also differ from the 64 GB H100).")
    except FileNotFoundError as e:
        if vidur_dir is not None:  # asked for by name: no silent fall-back to the coarse estimate
            raise FileNotFoundError(f"--vidur-dir {vidur_dir}: {e}; give the directory that holds h100/<model>_mlp.csv "
                                    f"(calibration/vidur_linear_ops under TWIN_DATA_DIR), or leave --vidur-dir out "
                                    f"for the effective estimate from run durations") from None
    dec_s = np.asarray(C.fitted_model(C.fit_backbone(base, GRAPH_MAX_TOKENS_V050, 5, train_kinds=("decode",)),
                                      "backbone").predict(np.zeros(len(base)), base["D"].to_numpy(float),
                                                          base["C"].to_numpy(float)), float)
    left = base["duration_s"].to_numpy(float) - base["out_tok"].to_numpy(float) / base["R"].to_numpy(float) * dec_s
    x = base["in_tok"].to_numpy(float)
    ok = np.isfinite(left) & (x > 0)
    pf = fit_params(lambda c: c * x[ok] / 1e3, [ParamSpec("c_prefill_ms", 0.05, 0.0, 5.0)], left[ok], None,
                    "backbone/prefill")
    v = pf.values["c_prefill_ms"] * 1e-3
    return ({"value": v, "stderr": pf.stderr["c_prefill_ms"] * 1e-3,
             "source": "effective: run duration minus decode steps, regressed on input tokens",
             "train": quality(left[ok], pf.values["c_prefill_ms"] * x[ok] / 1e3)},
            f"Prefill cost per token ({v * 1e6:.1f} us) is an effective estimate from run durations (no Vidur table "
            f"found): it includes recomputation after preemption and is coarse.")


def fit_lora_runs(lo: pd.DataFrame, bm, k: int) -> dict[str, Any]:
    """LoRA extra on run-level median ITL (``A`` estimated), candidates with a rank coefficient."""
    if len(lo) < 6:
        raise FitError(f"vllm050 lora: {len(lo)} runs with adapters; need at least 6")
    y = lo["itl_ms"].to_numpy(float)
    D, Cx, A, rk = (lo[c].to_numpy(float) for c in ("D", "C", "A", "rank"))
    base = np.asarray(bm.predict(np.zeros_like(D), D, Cx), float)
    MS = 1e-3
    cands = {
        "percent_of_base+rank": ("percent_of_base", [ParamSpec("k6", 0.1, 0, 100), ParamSpec("k7", 105, 100, 1000),
                                                     ParamSpec("rank_coef", 0.1, -10, 10)], {}),
        "additive+rank": ("additive", [ParamSpec("l0", 3.0, 0, 500), ParamSpec("l_adapter", 0.03, 0, 50),
                                       ParamSpec("l_token", 0.01, 0, 10), ParamSpec("rank_coef", 0.01, -0.05, 1)],
                          {"l0": MS, "l_adapter": MS, "l_token": MS}),
    }
    out: dict[str, dict[str, Any]] = {}
    for label, (form, specs, to_si) in cands.items():
        cand = C.Candidate(form, "lora", specs, {}, to_si)
        names = [s.name for s in specs]

        def pred(theta: dict[str, float], idx: np.ndarray, cand=cand) -> np.ndarray:
            m = cand.model(theta)
            b = base[idx] * MS
            return (b + np.asarray(m.predict(b, A[idx], rk[idx], D[idx]), float)) / MS

        full = fit_params(lambda *th: pred(dict(zip(names, th)), np.arange(len(lo))), specs, y, None, f"lora/{label}")
        oof = np.full(len(lo), np.nan)
        for tr, te in grouped_folds(lo["group"], k):
            f = fit_params(lambda *th: pred(dict(zip(names, th)), tr), specs, y[tr], None, f"lora/{label}")
            oof[te] = pred(f.values, te)
        out[label] = C._entry(cand, full, quality(y, pred(full.values, np.arange(len(lo)))), {"all": quality(y, oof)})
    best = C._select("lora", out, "compute_overhead runs: median ITL with k adapters; base = backbone at (R, C); "
                                  "A = k(1-(1-1/k)^R); decode steps only, so the per-token term is a decode token's "
                                  "and its use on prefill tokens an extrapolation (see the profile's notes)",
                     f"grouped {k}-fold by server configuration")
    best["data"] = {"runs": int(len(lo)), "max_lora_rank": sorted(set(int(r) for r in rk))}
    return best


def kv_probes(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The memory_overhead servers as KV capacities and start outcomes per (slots, max rank).

    Capacity = vLLM 0.5 "# GPU blocks" x 16 (also from failed starts that logged a block
    count); a probe is a distinct (slots, rank) start (ECC/port failures left out).
    """
    mem = runs[(runs["experiment"] == "memory_overhead")]
    kv_rows, probes = [], []
    for (slots, rank), g in mem.groupby([mem["max_loras"].fillna(0), mem["max_lora_rank"].fillna(0)]):
        st = set(g["status"])
        blocks = g["gpu_kv_blocks"].dropna()
        if len(blocks) and blocks.iloc[0] > 0 and st & {"ok", "failed_kv_insufficient"}:
            kv_rows.append((slots, rank, float(blocks.median()) * 16))
        if st & {"ok", "failed_kv_insufficient", "failed_no_kv_memory", "failed_cuda_oom"}:
            probes.append((slots, rank, "ok" in st))
    return (pd.DataFrame(kv_rows, columns=["slots", "rank", "tokens"]),
            pd.DataFrame(probes, columns=["slots", "rank", "ok"]))
