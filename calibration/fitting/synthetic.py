"""Synthetic vLLM 0.8.5 measurement tables generated from known constants.

``write_vllm085_tables(directory, truth)`` writes the seven CSV tables the real data has
(same columns, same conventions: ~2 s windows, gauges at window ends, KV usage at the end,
loads per server start, probe starts), computed from a :class:`Truth` of component models
plus small multiplicative noise. Fitting them with ``twin calibrate fit`` must give the
constants back: that is the recovery test of the whole pipeline (tables -> observations ->
curve_fit -> profile).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from twin.perf.forms import FORMS, PerfModel
from twin.model_spec import get_model

MODEL = "llama-3.1-8b"


@dataclass
class Truth:
    """Known constants (SI units) of the five components the synthetic tables are drawn from."""

    backbone: dict[str, float] = field(default_factory=lambda: {
        "c0": 0.0110, "c_eager": 0.0030, "c_prefill": 2.1e-5, "c_decode": 2.5e-5, "c_ctx": 8.0e-8,
        "graph_max_tokens": 512.0})
    lora: dict[str, float] = field(default_factory=lambda: {
        "l0": 0.016, "l_adapter": 2.5e-4, "l_token": 1.5e-5, "l_adapter_token": 3.0e-7})
    scheduler: dict[str, float] = field(default_factory=lambda: {
        "k0": 6e-5, "k1": 1.6e-6, "k1_sq": 9e-10, "k2": 0.0, "k_blocked": 2.8e-7})
    load: dict[str, float] = field(default_factory=lambda: {
        "disk_fixed_s": 0.050, "disk_gbps": 2.0, "cpu_fixed_s": 0.005, "cpu_gbps": 20.0})
    kv: dict[str, float] = field(default_factory=lambda: {
        "free_bytes": 40.6e9, "lora_fixed_bytes": 0.33e9, "slot_fixed_bytes": 6.5e6, "slot_bytes_per_rank": 5.75e6,
        "kv_bytes_per_token": 131072.0})
    noise: float = 0.005

    def models(self) -> dict[str, PerfModel]:
        return {"backbone": FORMS[("backbone", "graph_linear")](params=dict(self.backbone)),
                "lora": FORMS[("lora", "additive")](params=dict(self.lora)),
                "scheduler": FORMS[("scheduler", "lora_queue")](params=dict(self.scheduler)),
                "load": FORMS[("load", "link")](params=dict(self.load)),
                "kv": FORMS[("kv", "memory_budget_affine")](params=dict(self.kv))}


def _window_rows(rng, truth: Truth, m: dict[str, PerfModel], run: dict, n_windows: int, kv_tokens: int,
                 slots: int = 0, adapters: int = 0, A: float = 0.0, rank: int = 8, prefill_every: int = 0,
                 prefill_tokens: int = 0, prefill: bool = False) -> list[dict]:
    """Windows of one run; the first has running 0 at its start (warm-up, excluded by the reader)."""
    rows = []
    D = float(run["max_num_seqs"]) if not prefill else 1.0
    kv_prev = 0.0
    W0 = 4000.0
    for j in range(n_windows):
        S = 36 if prefill else int(rng.integers(40, 140))
        ctx_per_seq = 5.0 + 30.0 * (j % 8)
        kv_end = min((ctx_per_seq + 8.0) * D / kv_tokens, 1.0)
        P = 0.0
        if prefill:
            P = 2048.0 * S
        elif prefill_every and j % prefill_every == prefill_every - 1:
            P = float(prefill_tokens)
        W = max(W0 - 100.0 * j, 0.0)
        # exactly what the reader will reconstruct
        C = max((kv_prev + kv_end) / 2 * kv_tokens - 8.0 * D, 0.0)
        n = min(S, np.ceil(P / max(2048.0 - D, 64.0))) if P > 0 else 0.0
        Ps = P / n if n else 0.0

        def comp(p_tok: float) -> float:
            b = float(m["backbone"].predict(p_tok, D, C))
            if adapters:
                b += float(m["lora"].predict(b, A, rank, p_tok + D))
            return b

        comp_s = (n * comp(Ps) + (S - n) * comp(0.0)) / S
        sched_s = float(m["scheduler"].predict(D, W, slots, adapters if adapters else slots))
        eps = rng.normal(0.0, truth.noise, 2)
        step_ms = (comp_s * (1 + eps[0]) + sched_s * (1 + eps[1])) * 1e3
        rows.append({"window_start_s": 2.0 * j, "window_s": 2.0,
                     "running_start": 0.0 if j == 0 else D, "running_end": D,
                     "waiting_start": W, "waiting_end": W, "kv_usage_end": kv_end, "prompt_tokens": P,
                     "generation_tokens": D * S, "engine_steps": S, "mean_step_ms": step_ms,
                     "median_step_ms": step_ms, "max_step_ms": step_ms * 1.3,
                     "mean_scheduler_ms": sched_s * (1 + eps[1]) * 1e3, "mean_unique_adapters": A})
        kv_prev = kv_end
    return rows


def write_vllm085_tables(directory: str | Path, truth: Truth | None = None, seed: int = 0) -> Path:
    """Write the synthetic tables into ``directory`` and return it."""
    truth = truth or Truth()
    rng = np.random.default_rng(seed)
    m = truth.models()
    spec = get_model(MODEL)
    name = "llama-3.1-8b-instruct"
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    kv_plain = 330000

    # step latency: decode sweeps, prefill sweeps -------------------------------------------
    runs, wins = [], []
    for mns in (50, 100, 200, 400, 600, 800, 1000):
        for out in (100, 400):
            rd = f"_{mns}__1_{out}"
            run = {"model": name, "experiment": "decode_sweep", "run_dir": rd, "max_num_seqs": mns}
            rows = _window_rows(rng, truth, m, run, 14, kv_plain, prefill_every=5, prefill_tokens=5 * mns)
            wins += [{**run, "adapter_slots": np.nan, "max_lora_rank": np.nan, "adapter_rank": np.nan,
                      "adapters_used": 0, **r} for r in rows]
            runs.append({**run, "kv_cache_tokens": kv_plain, "engine_steps": sum(r["engine_steps"] for r in rows),
                         "mean_step_ms": np.mean([r["mean_step_ms"] for r in rows]),
                         "mean_scheduler_ms_per_step": np.mean([r["mean_scheduler_ms"] for r in rows]),
                         "total_input_tokens": 5 * 4096, "status": "ok"})
    for mns in (100, 200, 400):
        rd = f"_{mns}__100_1"
        run = {"model": name, "experiment": "prefill_sweep", "run_dir": rd, "max_num_seqs": mns}
        rows = _window_rows(rng, truth, m, run, 8, kv_plain, prefill=True)
        wins += [{**run, "adapter_slots": np.nan, "max_lora_rank": np.nan, "adapter_rank": np.nan,
                  "adapters_used": 0, **r} for r in rows]
        runs.append({**run, "kv_cache_tokens": kv_plain, "engine_steps": 8 * 36,
                     "mean_step_ms": np.mean([r["mean_step_ms"] for r in rows]),
                     "mean_scheduler_ms_per_step": np.mean([r["mean_scheduler_ms"] for r in rows]),
                     "total_input_tokens": 2048 * 36 * 8, "status": "ok"})
    pd.DataFrame(runs).to_csv(d / "step_latency_runs.csv", index=False)
    pd.DataFrame(wins).to_csv(d / "step_latency.csv", index=False)

    # LoRA overhead --------------------------------------------------------------------------
    kv_lora = 210000
    lruns, lwins = [], []
    for out, mns in ((100, 110), (200, 220)):  # two batch limits, so per-token and fixed LoRA costs separate
        rd = f"_{mns}__1_{out}"
        run = {"model": name, "experiment": "baseline_no_lora", "run_dir": rd, "max_num_seqs": mns}
        rows = _window_rows(rng, truth, m, run, 12, kv_plain, prefill_every=3, prefill_tokens=1100)
        lwins += [{**run, "adapter_slots": np.nan, "max_lora_rank": np.nan, "adapter_rank": np.nan,
                   "adapters_used": 0, **r} for r in rows]
        lruns.append({**run, "adapter_slots": np.nan, "max_lora_rank": np.nan, "kv_cache_tokens": kv_plain,
                      "engine_steps": 1, "status": "ok", "mean_itl_ms": 17.0, "adapters_used": 0})
        for used in (1, 32, 64, 128, 192):
            A = used * (1 - (1 - 1 / used) ** mns)
            rd = f"_{mns}_300_8__1_{out}_{used}"
            run = {"model": name, "experiment": "lora_overhead", "run_dir": rd, "max_num_seqs": mns}
            rows = _window_rows(rng, truth, m, run, 12, kv_lora, slots=300, adapters=used, A=A,
                                prefill_every=3, prefill_tokens=1100)
            lwins += [{**run, "adapter_slots": 300, "max_lora_rank": 8, "adapter_rank": 8, "adapters_used": used,
                       **r} for r in rows]
            lruns.append({**run, "adapter_slots": 300, "max_lora_rank": 8, "kv_cache_tokens": kv_lora,
                          "engine_steps": 1, "status": "ok", "mean_itl_ms": 50.0, "adapters_used": used})
    # a run with long prefills and many adapters (identifies the adapter x token term)
    run = {"model": name, "experiment": "find_max_batch", "run_dir": "_300_8__50_50", "max_num_seqs": np.nan}
    rows = _window_rows(rng, truth, m, {**run, "max_num_seqs": 240}, 16, kv_lora, slots=300, adapters=300, A=170.0,
                        prefill_every=2, prefill_tokens=12000)
    lwins += [{**run, "adapter_slots": 300, "max_lora_rank": 8, "adapter_rank": 8, "adapters_used": 300, **r}
              for r in rows]
    lruns.append({**run, "adapter_slots": 300, "max_lora_rank": 8, "kv_cache_tokens": kv_lora, "engine_steps": 1,
                  "status": "ok", "mean_itl_ms": 150.0, "adapters_used": 300})
    pd.DataFrame(lruns).assign(ts_mean_running=220.0, ts_mean_waiting=0.0, ts_mean_kv_usage=0.1).to_csv(
        d / "adapter_overhead.csv", index=False)
    pd.DataFrame(lwins).to_csv(d / "adapter_overhead_windows.csv", index=False)

    # published-style scheduler runs ------------------------------------------------------------
    n = 160
    G = rng.choice([8, 16, 32, 64, 128, 256], n)
    N = np.maximum(G, rng.choice([8, 16, 32, 64, 128, 256, 384, 512], n))
    R = rng.uniform(1, 800, n)
    W = np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0, 15000, n))
    sched = np.asarray(m["scheduler"].predict(R, W, G, N), float) * (1 + rng.normal(0, truth.noise, n)) * 1e3
    pd.DataFrame({"rate_mode": "aggregated_rate", "adapter_slots": G, "served_adapters": N, "lora_rank": 8,
                  "mean_running": R, "mean_waiting": W, "scheduler_ms_per_step": sched}).to_csv(
        d / "scheduler_overhead.csv", index=False)

    # adapter loads ---------------------------------------------------------------------------
    loads = []
    for rank in (8, 16, 32):
        for mr in (r for r in (8, 16, 32) if r >= rank):
            nbytes = spec.adapter_bytes(rank)
            for src, kind, phase in (("disk", "disk_to_cpu", "startup"), ("cpu", "cpu_to_gpu", "serving")):
                t = float(m["load"].predict(rank, nbytes, src)) * 1e3
                for i in range(1, 31):
                    v = t * (1 + rng.normal(0, 2 * truth.noise))
                    if src == "disk" and i == 1:
                        v *= 5.0  # cold start: excluded by the reader
                    loads.append({"model": name, "adapter_rank": rank, "max_lora_rank": mr, "adapter_slots": 1,
                                  "max_cpu_loras": 50, "load_kind": kind, "phase": phase, "load_index": i,
                                  "load_ms": v})
    pd.DataFrame(loads).to_csv(d / "adapter_load.csv", index=False)

    # KV probes ---------------------------------------------------------------------------------
    kv = []
    kvb = spec.kv_bytes_per_token
    for slots in (8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384):
        for rank in (8, 16, 32):
            tok = m["kv"].predict(slots, rank)
            row = {"model": name, "experiment": "kv_probe", "enable_lora": True, "adapter_slots": slots,
                   "max_lora_rank": rank, "max_num_seqs": 2048, "kv_cache_tokens": np.nan,
                   "kv_available_gib": np.nan}
            if tok >= spec.max_model_len:
                row.update(status="ok", kv_cache_tokens=tok)
            elif tok > 0:
                row.update(status="failed_kv_insufficient", kv_available_gib=tok * kvb / 2 ** 30)
            else:
                row.update(status="failed_no_kv_memory")
            kv.append(row)
    kv.append({"model": name, "experiment": "default_latency_server", "enable_lora": False, "adapter_slots": 0,
               "max_lora_rank": 0, "max_num_seqs": 2048, "status": "ok", "kv_cache_tokens": m["kv"].predict(0, 0),
               "kv_available_gib": np.nan})
    pd.DataFrame(kv).to_csv(d / "kv_capacity.csv", index=False)
    return d
