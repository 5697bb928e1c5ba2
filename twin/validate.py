"""``twin validate``: re-create real vLLM runs from their configuration and score the twin.

Every row of a real-run table (``validation/vllm085_*.csv`` in the data directory, see its
README) is one one-hour vLLM 0.8.5 run. The twin re-creates it **from its configuration
alone** (:func:`build_run`):

* the profile of the run's model (``--profile``; default: the model's fitted profile);
* ``served_adapters`` adapters, ranks from ``ranks`` round-robin (``8-8-16``: adapter ``i``
  has rank ``ranks[i % 3]``); per-adapter Poisson rates from ``rates`` assigned round-robin and
  then shuffled independently of the ranks (the real client, ``benchmark_serving_by_time.py``);
* ``adapter_slots`` GPU slots (``max_loras``), ``max_cpu_loras`` CPU slots, ``max_lora_rank``;
* the engine settings of the runs: chunked prefill with 2048 batched tokens, ``max_num_seqs``
  2048, default ``max_model_len``, prefix caching off (the twin has none);
* a 3600 s window: arrivals in ``[0, 3600)``, requests in flight at 3600 s are cancelled
  (unfinished, not counted as successful);
* request lengths drawn from a ShareGPT-like distribution (the shared ``lengths/`` histograms
  under the real runs' filters) whose means match the run's prompt-pool means
  (``pool_mean_input_tokens`` / ``pool_mean_output_tokens``).

**Offered load** (column ``load_basis`` of the per-run CSV). Where the run records
``requests_sent`` (the number of requests the client actually sent -- a fact about the run's
input), the twin draws exactly that many arrivals: per-adapter Poisson streams conditioned on
their total (multinomial adapter choice in proportion to the rates, uniform times); basis
``requests_sent``. Elsewhere it draws the nominal Poisson streams; basis ``nominal``. In the
overloaded runs the real client could not keep its schedule (``requests_sent`` down to 55 % of
nominal), so the nominal load would overstate what the server received.

**Start-up failures**. Runs whose server failed to start for lack of memory
(:data:`START_FAILURE_STATUSES`) are predicted by the twin's own start-up check (the KV
capacity left after the weights and the LoRA slot buffers, from the profile, against one
``max_model_len`` request: :func:`twin.engine.check_startup`) and scored as a classification.
Runs that failed for reasons unrelated to the configuration (port in use, Slurm cancellation,
illegal memory access, ...) are listed but not scored.

**Metrics** (:data:`METRICS`, defined once): request throughput, total token throughput
(``throughput`` -- the published twin's throughput), mean ITL, mean TPOT, mean / median / P99
TTFT of finished requests and the published twin's TTFT (``ttft_ms_incl_unfinished``:
unfinished requests count as the window length). SMAPE as the published twin computes it,
``100 * mean(|twin - real| / (|twin| + |real|))`` (:func:`smape`); the standard SMAPE is twice
that. The published twin's predictions (``--peer``) are scored the same way on the same runs.
Subsets: ``kept_up`` (``requests_sent >= 95 %`` of the nominal count), ``overloaded``
(below), ``sent_unknown`` (runs without ``requests_sent``); ``peer_runs`` are the runs the
published twin has a prediction for; ``dt_modelling`` the 1-hour runs it replayed one by one.
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

WINDOW_S = 3600.0
KEPT_UP_FRACTION = 0.95

#: Key columns that identify a scenario in both the real and the peer table.
RUN_KEYS = ("source", "ranks", "rates", "served_adapters", "adapter_slots", "max_lora_rank")

#: Real-run statuses that mean "the server could not start with this configuration" (memory).
START_FAILURE_STATUSES = ("failed_kv_insufficient", "failed_no_kv_memory", "failed_cuda_oom",
                          "failed_sampler_warmup_oom")


@dataclass(frozen=True)
class Metric:
    """One scored figure: its name, the real table's column, the twin's summary key, the peer's column."""

    name: str
    label: str
    real: str
    twin: str
    peer: str | None
    unit: str


#: Every metric the validation reports (the single definition used by the table, CSV and JSON).
METRICS: tuple[Metric, ...] = (
    Metric("throughput", "total token throughput", "total_tok_s", "total_tok_s", "total_tok_s", "tok/s"),
    Metric("request_throughput", "request throughput", "request_throughput", "throughput_rps", "peer_rps", "req/s"),
    Metric("itl", "mean ITL", "mean_itl_ms", "itl_ms_mean", "itl_ms", "ms"),
    Metric("tpot", "mean TPOT", "mean_tpot_ms", "tpot_ms_mean", None, "ms"),
    Metric("ttft_mean", "mean TTFT (finished)", "mean_ttft_ms", "ttft_ms_mean", None, "ms"),
    Metric("ttft_median", "median TTFT (finished)", "median_ttft_ms", "ttft_ms_p50", None, "ms"),
    Metric("ttft_p99", "P99 TTFT (finished)", "p99_ttft_ms", "ttft_ms_p99", None, "ms"),
    Metric("ttft_incl_unfinished", "TTFT incl. unfinished", "ttft_ms_incl_unfinished", "ttft_ms_incl_unfinished",
           "ttft_ms_incl_unfinished", "ms"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}

SUBSETS = ("all", "kept_up", "overloaded", "sent_unknown", "peer_runs", "dt_modelling")
SUBSET_HELP = {
    "all": "all successful runs",
    "kept_up": "client kept up (requests_sent >= 95 % of nominal)",
    "overloaded": "client fell behind (requests_sent < 95 % of nominal)",
    "sent_unknown": "requests_sent not recorded (ml_test)",
    "peer_runs": "runs the published twin predicted",
    "dt_modelling": "the published twin's 1-hour replays (its 4.2/9.7/17.6 % set)",
}


# --------------------------------------------------------------------------- SMAPE
def smape_terms(twin: Iterable[float], real: Iterable[float]) -> np.ndarray:
    """Per-run ``|twin - real| / (|twin| + |real|)`` (0 when both are 0, NaN when either is missing)."""
    t = np.asarray(list(twin) if not isinstance(twin, (np.ndarray, pd.Series)) else twin, float)
    r = np.asarray(list(real) if not isinstance(real, (np.ndarray, pd.Series)) else real, float)
    den = np.abs(t) + np.abs(r)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, np.abs(t - r) / np.where(den > 0, den, 1.0), 0.0)
    out[~(np.isfinite(t) & np.isfinite(r))] = np.nan
    return out


def smape(twin: Iterable[float], real: Iterable[float]) -> float:
    """SMAPE as the published twin computes it: ``100 * mean(|t - r| / (|t| + |r|))`` over runs
    where both values exist (the standard SMAPE is twice this). NaN when there is no pair."""
    terms = smape_terms(twin, real)
    terms = terms[np.isfinite(terms)]
    return float(100.0 * terms.mean()) if terms.size else float("nan")


# --------------------------------------------------------------------------- loading
def default_real_csv(data_dir: str | os.PathLike | None = None) -> Path:
    from traces.datadir import require

    return require("validation/vllm085_h100_llama31_8b.csv", data_dir)


def default_peer_csv(real_csv: str | os.PathLike) -> Path | None:
    """The ``peer_twin_*.csv`` beside ``real_csv`` for the same model (None if there is none)."""
    real_csv = Path(real_csv)
    stem = real_csv.stem
    parts = stem.split("_")
    # vllm085_h100_llama31_8b -> model tag after the GPU part
    tag = "_".join(parts[2:]) if len(parts) > 2 else stem
    cand = real_csv.parent / f"peer_twin_{tag}.csv"
    if cand.exists():
        return cand
    for p in sorted(real_csv.parent.glob("peer_twin_*.csv")):
        if tag and tag in p.stem:
            return p
    return None


def load_real(path: str | os.PathLike) -> pd.DataFrame:
    df = pd.read_csv(path)
    missing = [c for c in (*RUN_KEYS, "status", "scenario", "run_dir", "offered_req_s", "pool_mean_input_tokens",
                           "pool_mean_output_tokens") if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a real-run validation table (missing columns {missing})")
    for c in ("ranks", "rates"):
        df[c] = df[c].astype(str)
    df["run_id"] = [f"{s}/{sc}/{rd}" for s, sc, rd in zip(df["source"], df["scenario"], df["run_dir"])]
    if df["run_id"].duplicated().any():
        df["run_id"] = df["run_id"] + "#" + df.groupby("run_id").cumcount().astype(str)
    return df


def load_peer(path: str | os.PathLike) -> pd.DataFrame:
    df = pd.read_csv(path)
    for c in ("ranks", "rates"):
        df[c] = df[c].astype(str)
    df["peer_rps"] = df["finished_requests"] / WINDOW_S
    df = df.drop_duplicates(list(RUN_KEYS), keep="first")
    return df


def attach_peer(real: pd.DataFrame, peer: pd.DataFrame | None) -> pd.DataFrame:
    """Real runs with the published twin's predictions (columns ``peer_<metric>``)."""
    out = real.copy()
    cols = {m.peer: f"peer_{m.name}" for m in METRICS if m.peer}
    if peer is None:
        for c in cols.values():
            out[c] = np.nan
        out["has_peer"] = False
        return out
    p = peer[list(RUN_KEYS) + list(cols)].rename(columns=cols)
    out = out.merge(p, on=list(RUN_KEYS), how="left")
    out["has_peer"] = out[list(cols.values())[0]].notna()
    return out


# --------------------------------------------------------------------------- one run
@dataclass
class RunSpec:
    """What the twin needs to re-create one real run (its configuration only)."""

    run_id: str
    model: str
    ranks: list[int]
    rates: list[float]
    served: int
    slots: int
    max_rank: int
    cpu_slots: int
    max_num_seqs: int
    mean_in: float
    mean_out: float
    requests_sent: float | None
    window_s: float = WINDOW_S
    seed: int = 0

    @property
    def adapter_rates(self) -> np.ndarray:
        """Per-adapter rates (req/s): the rate list over the served adapters, round-robin."""
        r = np.asarray(self.rates, float)
        return r[np.arange(self.served) % r.size]

    @property
    def nominal_requests(self) -> float:
        return float(self.adapter_rates.sum() * self.window_s)


def _num_list(text: str, cast: Callable) -> list:
    return [cast(x) for x in str(text).replace(",", "-").split("-") if x != ""]


def spec_from_row(row: pd.Series | dict, seed: int = 0, use_sent: bool = True) -> RunSpec:
    g = row.get if isinstance(row, dict) else row.get
    served = int(g("served_adapters"))
    sent = g("requests_sent")
    sent = float(sent) if (use_sent and sent is not None and np.isfinite(float(sent))) else None
    cpu = g("max_cpu_loras")
    cpu = int(cpu) if cpu is not None and np.isfinite(float(cpu)) else served
    mns = g("max_num_seqs")
    mns = int(mns) if mns is not None and np.isfinite(float(mns)) else 2048
    win = g("benchmark_time_s")
    win = float(win) if win is not None and np.isfinite(float(win)) else WINDOW_S
    run_id = str(g("run_id"))
    return RunSpec(run_id=run_id, model=str(g("model")), ranks=_num_list(g("ranks"), int),
                   rates=_num_list(g("rates"), float), served=served, slots=int(g("adapter_slots")),
                   max_rank=int(g("max_lora_rank")), cpu_slots=cpu, max_num_seqs=mns,
                   mean_in=float(g("pool_mean_input_tokens")), mean_out=float(g("pool_mean_output_tokens")),
                   requests_sent=sent, window_s=win, seed=(zlib.crc32(run_id.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF)


_LENGTH_MODELS: dict[tuple[float, float], Any] = {}


def _sharegpt_model(mean_in: float, mean_out: float):
    """ShareGPT-like length model with the given means (cached per pair of means).

    Uses :func:`traces.lengths.sharegpt_like`'s model (the committed CDF knots); when those
    are not committed, builds the same model from the data directory's ``lengths/``
    histograms (piecewise-linear CDF through the bin edges), under the real runs' filters.
    """
    key = (round(mean_in, 6), round(mean_out, 6))
    m = _LENGTH_MODELS.get(key)
    if m is not None:
        return m
    from traces.lengths import SHAREGPT_FILTER, ShareGPTLengths

    try:
        base = ShareGPTLengths.from_json(filt=SHAREGPT_FILTER)
    except FileNotFoundError:
        base = _sharegpt_from_histograms()
    m = base.solve(mean_in, mean_out)
    _LENGTH_MODELS[key] = m
    return m


def _sharegpt_from_histograms():
    """Private fallback: the ShareGPT-like model straight from ``lengths/*_hist.csv``."""
    from traces.lengths import SHAREGPT_FILTER, ShareGPTLengths
    from traces.datadir import require

    def knots(name: str):
        h = pd.read_csv(require(f"lengths/{name}"))
        x = np.concatenate(([h["bin_lo_tokens"].iloc[0]], h["bin_hi_tokens"].to_numpy(float)))
        F = np.concatenate(([0.0], np.cumsum(h["count_approx"].to_numpy(float))))
        return x, F / F[-1]

    return ShareGPTLengths(knots("sharegpt_prompt_hist.csv"), knots("sharegpt_output_hist.csv"), SHAREGPT_FILTER)


def build_workload(spec: RunSpec):
    """The run's workload: per-adapter Poisson arrivals in the window and ShareGPT-like lengths.

    Returns ``(workload, load_basis)``; see the module docstring for the offered load."""
    from traces.arrivals import assign_rates_round_robin
    from traces.workload import Workload

    rng = np.random.default_rng(spec.seed)
    n_ad = spec.served
    ranks = np.asarray(spec.ranks, np.int64)[np.arange(n_ad) % len(spec.ranks)]
    ad_rate = assign_rates_round_robin(spec.rates, n_ad, rng, shuffle=True)
    if spec.requests_sent is not None:
        # per-adapter Poisson streams conditioned on their total = requests_sent
        n = int(round(spec.requests_sent))
        ids = rng.choice(n_ad, size=n, p=ad_rate / ad_rate.sum())
        basis = "requests_sent"
    else:
        counts = rng.poisson(ad_rate * spec.window_s)
        ids = np.repeat(np.arange(n_ad, dtype=np.int64), counts)
        basis = "nominal"
    t = rng.uniform(0.0, spec.window_s, size=ids.size)
    order = np.argsort(t, kind="stable")
    t, ids = t[order], ids[order].astype(np.int64)
    p, o = _sharegpt_model(spec.mean_in, spec.mean_out).sample(t.size, rng)
    wl = Workload.from_arrays(t, p, o, ids, ranks[ids],
                              meta={"source": "validation", "run": spec.run_id, "load_basis": basis})
    return wl, basis


def build_config(spec: RunSpec):
    from twin.config import EngineConfig

    return EngineConfig(max_num_batched_tokens=2048, max_num_seqs=spec.max_num_seqs, block_size=16, enable_lora=True,
                        max_loras=spec.slots, max_cpu_loras=max(spec.cpu_slots, spec.slots),
                        max_lora_rank=spec.max_rank, max_model_len=None, served_adapters=spec.served)


def predict_startup(spec: RunSpec, profile) -> tuple[bool, int, str]:
    """The twin's start-up check for the run: ``(starts, kv_tokens, message)``."""
    from twin.engine import StartupError, check_startup

    kv = int(profile.kv_capacity_tokens(spec.slots, spec.max_rank))
    try:
        check_startup(kv, profile.model.max_model_len, spec.slots, spec.max_rank)
    except StartupError as e:
        return False, kv, str(e)
    return True, kv, ""


#: The real runs' client can hold at most this many requests in flight. vLLM's benchmark client
#: (``backend_request_func.py``) opens one aiohttp session -- one TCP connection, one local port --
#: per request, and Linux's default ephemeral port range (``net.ipv4.ip_local_port_range`` =
#: 32768..60999) has 28232 ports: a request sent while they are all in use fails to connect at
#: once (it is sent but never successful). A property of the load generator and the OS, not of
#: vLLM; the real runs' engine queues are consistent with it (running + waiting never exceeds
#: ~28.5k in the overloaded runs, whatever the slots, adapters and rates). ``None`` disables it.
CLIENT_MAX_INFLIGHT: int | None = 28232


def _capped_fcfs(cap: int | None, preload: bool = True):
    """vLLM's FCFS scheduler behind the client's in-flight cap (see :data:`CLIENT_MAX_INFLIGHT`;
    ``None``: no cap), on a server whose adapters are in the CPU tier from the start (``preload``,
    see :meth:`twin.adapters.AdapterMemory.preload_cpu`).

    An arrival that finds ``cap`` requests in flight (waiting + running in the engine) fails at the
    client: it never reaches the engine's queue. It stays ``unfinished`` in the twin's tables, as
    the real client counts it (sent, not successful; ``ttft_ms_incl_unfinished`` counts it as the
    window length)."""
    from policies.fcfs import FCFSScheduler

    class ClientCappedFCFS(FCFSScheduler):
        name = "fcfs+client-cap"

        def bind(self, engine) -> None:
            self.cap = int(cap) if cap else 1 << 62
            self.dropped = bytearray(engine.n)
            self.n_dropped = 0
            super().bind(engine)
            if preload:
                engine.adapters.preload_cpu(range(engine.n_adapters))

        def _push_head(self, a: int) -> None:
            # skip requests that failed at the client (they are never admitted)
            p, q, end, dr = self.qptr[a], self.q, self.qend[a], self.dropped
            while p < end and dr[q[p]]:
                p += 1
            self.qptr[a] = p
            super()._push_head(a)

        def on_arrivals(self, lo: int, hi: int) -> None:
            e = self.engine
            over = e.n_waiting + len(e.running) - self.cap  # the engine counted [lo, hi) already
            if over > 0:
                # the last `over` valid arrivals of [lo, hi) fail at the client
                ok = np.nonzero(e.reject_reason[lo:hi] == 0)[0] + lo
                drop = ok[len(ok) - over:] if over < len(ok) else ok
                np.frombuffer(self.dropped, np.uint8)[drop] = 1
                np.frombuffer(self.admitted, np.uint8)[drop] = 1  # skipped by the arrival-order pointer
                e.n_waiting -= len(drop)
                self.n_dropped += len(drop)
                q, qptr, qend, dr = self.q, self.qptr, self.qend, self.dropped
                grp = np.frombuffer(self.grp, np.int64)
                for a in np.unique(grp[drop]).tolist():
                    if qptr[a] < qend[a] and dr[q[qptr[a]]]:  # a dropped request heads its adapter's queue
                        self._push_head(a)
            super().on_arrivals(lo, hi)

    return ClientCappedFCFS()


def _lru():
    import policies  # noqa: F401
    from policies.lru import LRUCache

    return LRUCache()


_PROFILES: dict[str, Any] = {}


def _profile(name: str | None):
    from twin.perf.profile import load_profile

    key = name or ""
    if key not in _PROFILES:
        _PROFILES[key] = load_profile(name)
    return _PROFILES[key]


def simulate_run(spec: RunSpec, profile_name: str | None = None,
                 client_cap: int | None = CLIENT_MAX_INFLIGHT, preload_cpu: bool = True) -> dict[str, Any]:
    """Re-create one run; returns the twin's figures (``twin_<metric>``) and run facts."""
    from twin.simulate import simulate

    prof = _profile(profile_name)
    out: dict[str, Any] = {"run_id": spec.run_id, "profile": prof.name, "seed": spec.seed}
    ok, kv, msg = predict_startup(spec, prof)
    out["twin_kv_tokens"] = kv
    out["twin_starts"] = ok
    if not ok:
        out["twin_status"] = "start_failure"
        return out
    t0 = time.perf_counter()
    wl, basis = build_workload(spec)
    cfg = build_config(spec)
    sched = _capped_fcfs(client_cap, preload=preload_cpu)
    res = simulate(wl, prof, cfg, scheduler_obj=sched, cache_obj=_lru(), horizon_s=spec.window_s,
                   record_steps=True)
    dropped = sched.n_dropped
    s = res.summary
    st = res.steps
    busy = float(st["duration_s"].sum()) if len(st) else 0.0
    if busy > 0:  # time averages over the window (idle time counts as 0), like the real runs' gauges
        out["twin_mean_running"] = float((st["batch_size"] * st["duration_s"]).sum()) / spec.window_s
        out["twin_mean_kv_usage"] = float((st["kv_blocks_used"] * st["duration_s"]).sum()) * cfg.block_size / (
            spec.window_s * max(s["kv_capacity_tokens"], 1))
    out.update(twin_status="ok", load_basis=basis, twin_requests=len(wl), twin_finished=s["requests_finished"],
               twin_unfinished=s["requests_unfinished"], twin_rejected=s["requests_rejected"],
               twin_client_failed=dropped, client_cap=client_cap or 0,
               twin_preemptions=s["preemptions"], twin_adapter_loads=s["adapter_loads"],
               twin_engine_steps=s["engine_steps"], sim_wall_s=time.perf_counter() - t0)
    for m in METRICS:
        v = s.get(m.twin)
        out[f"twin_{m.name}"] = float(v) if v is not None else np.nan
    return out


def _worker(args: tuple[dict, dict]) -> dict[str, Any]:
    import gc

    spec_d, opts = args
    spec = RunSpec(**spec_d)
    try:
        return simulate_run(spec, **opts)
    except Exception as e:  # noqa: BLE001 -- reported per run, the validation goes on
        return {"run_id": spec.run_id, "twin_status": "error", "error": f"{type(e).__name__}: {e}"}
    finally:
        gc.collect()  # the engine's reference cycles hold a run's arrays until collected


# --------------------------------------------------------------------------- selection
def select_runs(real: pd.DataFrame, filt: str | None = None, limit: int | None = None,
                only_ok: bool = False, run_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Runs to validate. ``filt``: a pandas query (``"adapter_slots <= 32 and source == 'ml_test'"``)
    when it contains a comparison, else a substring of ``run_id``. ``limit``: ``N`` runs evenly
    spread over the (filtered) table, so a small limit still covers slots, rates and loads.
    ``run_ids``: only these runs (``source/scenario/run_dir``)."""
    df = real
    if run_ids is not None:
        df = df[df["run_id"].isin(set(run_ids))]
    if filt:
        if any(op in filt for op in ("==", "!=", "<", ">", " in ", "~")):
            df = df.query(filt, engine="python")
        else:
            df = df[df["run_id"].str.contains(filt, regex=False)]
    if only_ok:
        df = df[df["status"] == "ok"]
    if limit is not None and limit < len(df):
        idx = np.unique(np.linspace(0, len(df) - 1, int(limit)).round().astype(int))
        df = df.iloc[idx]
    return df


# --------------------------------------------------------------------------- the whole validation
@dataclass
class ValidationResult:
    runs: pd.DataFrame            # one row per real run (real, twin, peer figures, SMAPE terms)
    summary: dict[str, Any]
    wall_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)


def run_validation(real_csv: str | os.PathLike | None = None, peer_csv: str | os.PathLike | None | bool = None,
                   profile: str | None = None, jobs: int = 1, limit: int | None = None, filt: str | None = None,
                   seed: int = 0, use_sent: bool = True, progress: bool = False,
                   data_dir: str | os.PathLike | None = None,
                   client_cap: int | None = CLIENT_MAX_INFLIGHT, preload_cpu: bool = True,
                   run_ids: Iterable[str] | None = None) -> ValidationResult:
    """Re-create the runs of ``real_csv`` with the twin and score them (see the module docstring).

    ``peer_csv``: the published twin's predictions (None: the ``peer_twin_*.csv`` beside the real
    file; False: none). ``jobs``: worker processes (runs are independent)."""
    t0 = time.perf_counter()
    real_csv = Path(real_csv) if real_csv else default_real_csv(data_dir)
    real = load_real(real_csv)
    if peer_csv is None:
        peer_csv = default_peer_csv(real_csv)
    peer = load_peer(peer_csv) if peer_csv else None
    real = attach_peer(real, peer)
    sel = select_runs(real, filt, limit, run_ids=run_ids)
    if not len(sel):
        raise ValueError(f"no run of {real_csv} matches the selection (filter {filt!r}, limit {limit})")
    if profile is None:
        profile = profile_for_model(sel["model"].dropna().iloc[0] if sel["model"].notna().any() else None)
    prof = _profile(profile)
    _check_profile_model(prof, sel)
    specs = []
    for _, row in sel.iterrows():
        if row["status"] == "ok" or row["status"] in START_FAILURE_STATUSES:
            specs.append(spec_from_row(row, seed, use_sent))
    sim_opts = dict(profile_name=profile, client_cap=client_cap, preload_cpu=preload_cpu)
    results = _run_all(specs, sim_opts, jobs, progress)
    tw = pd.DataFrame(results) if results else pd.DataFrame({"run_id": []})
    runs = sel.merge(tw, on="run_id", how="left")
    runs = _score(runs)
    summary = summarize(runs, prof.name, str(real_csv), str(peer_csv) if peer_csv else None)
    summary["wall_s"] = time.perf_counter() - t0
    opts = dict(real=str(real_csv), peer=str(peer_csv) if peer_csv else None, profile=prof.name, jobs=jobs,
                limit=limit, filter=filt, seed=seed, use_sent=use_sent, client_cap=client_cap,
                preload_cpu=preload_cpu)
    summary["options"] = opts
    return ValidationResult(runs, summary, summary["wall_s"], opts)


def profile_for_model(model: str | None) -> str | None:
    """The calibrated vLLM 0.8.5 / H100 profile of ``model`` (``qwen-2.5-7b-instruct`` ->
    ``qwen-2.5-7b_h100_vllm085``) when it is shipped, else None (the default profile)."""
    from twin.perf.profile import available_profiles

    if not model:
        return None
    tag = str(model).lower().replace("-instruct", "")
    avail = available_profiles()
    for name in (f"{tag}_h100_vllm085",):
        if avail.get(name):
            return name
    return None


def _check_profile_model(prof, sel: pd.DataFrame) -> None:
    models = {str(m).lower() for m in sel["model"].dropna().unique()}
    tag = prof.model.name.lower().replace("-instruct", "")
    bad = [m for m in models if tag not in m.replace("-instruct", "")]
    if bad:
        raise ValueError(f"profile {prof.name!r} describes {prof.model.name}, but the runs are of {sorted(bad)}; "
                         f"pass --profile with that model's calibrated profile")


def _run_all(specs: list[RunSpec], sim_opts: dict[str, Any], jobs: int, progress: bool) -> list[dict[str, Any]]:
    from dataclasses import asdict

    # longest runs first so the pool's tail is short
    order = sorted(specs, key=lambda s: -(s.requests_sent or s.nominal_requests))
    tasks = [(asdict(s), sim_opts) for s in order]
    bar = None
    if progress and tasks:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), unit="run", desc="validating", leave=False)
    out: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            out.append(_worker(t))
            bar and bar.update(1)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(jobs) as pool:
            for r in pool.imap_unordered(_worker, tasks, chunksize=1):
                out.append(r)
                bar and bar.update(1)
    if bar is not None:
        bar.close()
    return out


def _score(runs: pd.DataFrame) -> pd.DataFrame:
    runs = runs.copy()
    ok = runs["status"] == "ok"
    twin_ok = runs.get("twin_status", pd.Series(index=runs.index, dtype=object)) == "ok"
    for m in METRICS:
        t = runs.get(f"twin_{m.name}", pd.Series(np.nan, index=runs.index)).astype(float)
        r = runs[m.real].astype(float) if m.real in runs else pd.Series(np.nan, index=runs.index)
        runs[f"real_{m.name}"] = r
        runs[f"twin_{m.name}"] = t
        runs[f"err_{m.name}"] = np.where(ok & twin_ok, smape_terms(t, r), np.nan)
        if m.peer:
            pcol = f"peer_{m.name}"
            runs[f"peer_err_{m.name}"] = np.where(ok, smape_terms(runs[pcol].astype(float), r), np.nan)
    nominal = []
    for _, row in runs.iterrows():
        r = np.asarray(_num_list(row["rates"], float))
        win = row.get("benchmark_time_s", WINDOW_S)
        win = float(win) if win == win and win is not None else WINDOW_S
        nominal.append(float(r[np.arange(int(row["served_adapters"])) % r.size].sum() * win))
    runs["nominal_requests"] = nominal
    sent = runs["requests_sent"].astype(float) if "requests_sent" in runs else pd.Series(np.nan, index=runs.index)
    runs["sent_fraction"] = sent / runs["nominal_requests"]
    runs["client"] = np.where(sent.isna(), "sent_unknown",
                              np.where(runs["sent_fraction"] >= KEPT_UP_FRACTION, "kept_up", "overloaded"))
    runs["real_start_failure"] = runs["status"].isin(START_FAILURE_STATUSES)
    runs["scored"] = ok & twin_ok
    return runs


def subset_mask(runs: pd.DataFrame, name: str) -> pd.Series:
    ok = runs["status"] == "ok"
    if name == "all":
        return ok
    if name in ("kept_up", "overloaded", "sent_unknown"):
        return ok & (runs["client"] == name)
    if name == "peer_runs":
        return ok & runs["has_peer"].astype(bool)
    if name == "dt_modelling":
        return ok & (runs["source"] == "dt_modelling") & runs["has_peer"].astype(bool)
    raise KeyError(f"unknown subset {name!r}; choose from {', '.join(SUBSETS)}")


def subset_table(runs: pd.DataFrame, name: str) -> dict[str, Any]:
    """SMAPE (published-twin convention) of the twin and of the published twin on one subset.

    ``ours`` is over every scored run of the subset; ``ours_on_peer_runs`` and ``peer`` are
    over the runs both twins predicted (side by side on the same runs)."""
    mask = subset_mask(runs, name)
    sub = runs[mask]
    scored = sub[sub["scored"]]
    both = scored[scored["has_peer"].astype(bool)]
    d: dict[str, Any] = {"runs": int(len(sub)), "scored": int(len(scored)), "with_peer": int(len(both)),
                         "description": SUBSET_HELP[name], "metrics": {}}
    for m in METRICS:
        e = scored[f"err_{m.name}"].dropna()
        row: dict[str, Any] = {"n": int(len(e)), "smape": _pct(e), "smape_standard": _pct(e, 2.0),
                               "median_err": _pct(e, 2.0, np.median)}
        if m.peer:
            pe = both[f"peer_err_{m.name}"]
            oe = both[f"err_{m.name}"]
            keep = pe.notna() & oe.notna()
            row["n_peer"] = int(keep.sum())
            row["smape_on_peer_runs"] = _pct(oe[keep])
            row["peer_smape"] = _pct(pe[keep])
            row["peer_smape_standard"] = _pct(pe[keep], 2.0)
        d["metrics"][m.name] = row
    return d


def _pct(e: pd.Series, factor: float = 1.0, fn=np.mean) -> float | None:
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    return float(100.0 * factor * fn(e)) if e.size else None


def startup_classification(runs: pd.DataFrame) -> dict[str, Any]:
    """How many memory start-up failures the twin's start-up check predicts, and false alarms."""
    fail = runs[runs["real_start_failure"]]
    ok = runs[runs["status"] == "ok"]
    pred_fail = fail["twin_status"] == "start_failure"
    false_alarm = ok["twin_status"] == "start_failure"
    by_status = {}
    for st, g in fail.groupby("status"):
        by_status[st] = {"runs": int(len(g)), "predicted": int((g["twin_status"] == "start_failure").sum())}
    n = int(len(fail))
    return {"real_failures": n, "predicted": int(pred_fail.sum()),
            "fraction": (float(pred_fail.sum()) / n) if n else None,
            "ok_runs": int(len(ok)), "false_alarms": int(false_alarm.sum()),
            "by_status": by_status,
            "not_scored": {k: int(v) for k, v in runs.loc[~runs["real_start_failure"] & (runs["status"] != "ok"),
                                                           "status"].value_counts().items()}}


def summarize(runs: pd.DataFrame, profile_name: str, real_csv: str, peer_csv: str | None) -> dict[str, Any]:
    subsets = {name: subset_table(runs, name) for name in SUBSETS}
    a = subsets["all"]["metrics"]
    dt = subsets["dt_modelling"]["metrics"]
    su = startup_classification(runs)
    errors = runs["twin_status"].eq("error").sum() if "twin_status" in runs else 0
    s: dict[str, Any] = {
        "runs": int(subsets["all"]["scored"]),
        "runs_in_table": int(len(runs)),
        "runs_ok": int(subsets["all"]["runs"]),
        "profile": profile_name,
        "real_csv": real_csv,
        "peer_csv": peer_csv,
        "smape_convention": "100*mean(|twin-real|/(|twin|+|real|)) (published twin); standard SMAPE = 2x",
        "smape_throughput": a["throughput"]["smape"],
        "smape_request_throughput": a["request_throughput"]["smape"],
        "smape_itl": a["itl"]["smape"],
        "smape_tpot": a["tpot"]["smape"],
        "smape_ttft_mean": a["ttft_mean"]["smape"],
        "smape_ttft_median": a["ttft_median"]["smape"],
        "smape_ttft_p99": a["ttft_p99"]["smape"],
        "smape_ttft_incl_unfinished": a["ttft_incl_unfinished"]["smape"],
        "peer_smape_throughput": a["throughput"].get("peer_smape"),
        "peer_smape_itl": a["itl"].get("peer_smape"),
        "peer_smape_ttft_incl_unfinished": a["ttft_incl_unfinished"].get("peer_smape"),
        "ours_on_peer_runs": {k: a[k].get("smape_on_peer_runs") for k in ("throughput", "request_throughput", "itl",
                                                                          "ttft_incl_unfinished")},
        "dt_modelling": {k: {"ours": dt[k].get("smape_on_peer_runs"), "peer": dt[k].get("peer_smape"),
                             "n": dt[k].get("n_peer")} for k in ("throughput", "itl", "ttft_incl_unfinished")},
        "start_failures_predicted": su["fraction"],
        "start_failures": su,
        "twin_errors": int(errors),
        "diagnostics": diagnostics(runs, profile_name),
        "subsets": subsets,
    }
    return s


def diagnostics(runs: pd.DataFrame, profile_name: str | None = None) -> dict[str, Any]:
    """Internal state, twin against the real runs' Prometheus gauges (time averages over the hour):
    mean running requests and KV tokens held per running request (real: mean KV usage x the KV
    capacity, which the profile reproduces within ~1 % of the probes). Medians over scored runs.
    With a profile, also :func:`step_at_real_mix` (the step model at the KV-saturated runs' own
    step composition)."""
    sc = runs[runs["scored"]]
    out: dict[str, Any] = {}
    need = {"ts_mean_running", "twin_mean_running", "ts_mean_kv_usage", "twin_mean_kv_usage", "twin_kv_tokens"}
    if not len(sc) or not need <= set(sc.columns):
        return out
    if profile_name is not None:
        mix = step_at_real_mix(sc, _profile(profile_name))
        if len(mix):
            G = mix["slots"]
            bins = {f"slots {lo + 1}-{hi}": (G > lo) & (G <= hi) for lo, hi in ((0, 32), (32, 96), (96, 448))}
            out["saturated_runs_real_itl_over_model_step_at_real_mix"] = {
                "runs": int(len(mix)), "median": float(mix["ratio"].median()),
                "median_gap_ms": float((mix["real_itl_ms"] - mix["model_step_ms"]).median()),
                "by_slots": {k: {"runs": int(m.sum()), "median": float(mix.loc[m, "ratio"].median())}
                             for k, m in bins.items() if m.any()},
                "note": "real mean ITL over the profile's step (scheduler + backbone + LoRA) evaluated at the "
                        "run's mean step composition, KV-saturated runs only (see step_at_real_mix)"}
    busy = sc[(sc["ts_mean_running"] > 1) & (sc["twin_mean_running"] > 1)]
    if len(busy):
        real_kv = busy["ts_mean_kv_usage"] * busy["twin_kv_tokens"] / busy["ts_mean_running"]
        twin_kv = busy["twin_mean_kv_usage"] * busy["twin_kv_tokens"] / busy["twin_mean_running"]
        out["kv_tokens_per_running_request"] = {"real_median": float(real_kv.median()),
                                                "twin_median": float(twin_kv.median()), "runs": int(len(busy))}
        out["mean_running_twin_over_real_median"] = float((busy["twin_mean_running"]
                                                           / busy["ts_mean_running"]).median())
    return out


SATURATED_KV_USAGE = 0.9


def step_at_real_mix(runs: pd.DataFrame, prof) -> pd.DataFrame:
    """The profile's step at each KV-saturated real run's own mean step composition.

    Separates the step model's error from the twin's dynamics (running batch, preemptions,
    request lengths): in a run whose KV cache stays full (mean usage >= 0.9) every step decodes
    the running batch and admits what KV frees, so steps are alike and the mean step is the
    model at the mean composition (checked on the twin's own steps: 88.04 ms at its mean mix
    against its mean step of 88.06 ms in the 16-slot / 32-adapter rate-3.2 run). Per step, from
    the real run's figures with ``itl`` its mean ITL (every running decode gets one token per
    step, so the ITL is the step): ``D = output_tok_s * itl`` decode tokens,
    ``P = (input_tok_s + recompute) * itl`` prefill tokens (``recompute`` = preemptions per
    second x (mean prompt + half the mean output) tokens), ``C`` = mean KV usage x the KV
    capacity, ``R`` running and ``W`` waiting (the gauges), ``A`` = the expected distinct
    adapters among ``R`` requests drawn at the adapters' rates, at most the slots. Returns one
    row per run with ``model_step_ms``, ``real_itl_ms`` and their ``ratio``.
    """
    need = {"ts_mean_kv_usage", "ts_mean_running", "ts_mean_waiting", "input_tok_s", "output_tok_s",
            "twin_kv_tokens", "real_itl", "rates", "served_adapters", "adapter_slots", "max_lora_rank",
            "pool_mean_input_tokens", "pool_mean_output_tokens"}
    if not need <= set(runs.columns):
        return pd.DataFrame()
    sat = runs[(runs["ts_mean_kv_usage"] >= SATURATED_KV_USAGE) & runs["real_itl"].notna()]
    rows = []
    for _, r in sat.iterrows():
        spec = spec_from_row(r)
        itl = float(r["real_itl"]) / 1000.0
        G, n = spec.slots, spec.served
        share = spec.adapter_rates / spec.adapter_rates.sum()
        R, W = float(r["ts_mean_running"]), float(r["ts_mean_waiting"])
        A = min(float(G), float(np.sum(1.0 - (1.0 - share) ** R)))
        pre = float(r.get("ts_preemptions", np.nan))
        pre = pre if math.isfinite(pre) else 0.0  # not recorded: no recompute term
        rec = pre / spec.window_s * (spec.mean_in + spec.mean_out / 2)
        D = float(r["output_tok_s"]) * itl
        P = (float(r["input_tok_s"]) + rec) * itl
        C = float(r["ts_mean_kv_usage"]) * float(r["twin_kv_tokens"])
        base = prof.backbone_s(P, D, C)
        step = prof.scheduler_s(R, W, G, n) + base + prof.lora_s(base, A, spec.max_rank, P + D, G, R)
        rows.append({"run_id": r["run_id"], "slots": G, "running": R, "prefill_tokens": P, "decode_tokens": D,
                     "context_tokens": C, "adapters": A, "model_step_ms": step * 1000.0,
                     "real_itl_ms": itl * 1000.0, "ratio": itl / step})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- report
def _fmt(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def format_report(res: ValidationResult, top: int = 8) -> str:
    s = res.summary
    lines = [f"twin validate: {s['runs']} successful runs scored of {s['runs_ok']} ok "
             f"({s['runs_in_table']} runs selected), profile {s['profile']}",
             f"SMAPE in the published twin's convention {s['smape_convention'].split(' (')[0]}; "
             f"'std' = standard SMAPE (x2). 'peer' = the published twin on the same runs."]
    for name in SUBSETS:
        sub = s["subsets"][name]
        if not sub["scored"]:
            continue
        lines.append("")
        lines.append(f"[{name}] {sub['description']}: {sub['scored']} runs scored, {sub['with_peer']} with a peer "
                     f"prediction")
        hdr = f"  {'metric':<24}{'n':>5}{'ours':>8}{'std':>8}{'| n':>6}{'ours':>8}{'peer':>8}{'peer std':>10}"
        lines.append(hdr)
        lines.append("  " + "-" * (len(hdr) - 2))
        for m in METRICS:
            r = sub["metrics"][m.name]
            peer = (f"{r.get('n_peer', 0):>6}{_fmt(r.get('smape_on_peer_runs')):>8}{_fmt(r.get('peer_smape')):>8}"
                    f"{_fmt(r.get('peer_smape_standard')):>10}") if m.peer else f"{'':>6}{'':>8}{'-':>8}{'-':>10}"
            lines.append(f"  {m.label:<24}{r['n']:>5}{_fmt(r['smape']):>8}{_fmt(r['smape_standard']):>8}{peer}")
    su = s["start_failures"]
    lines.append("")
    lines.append(f"start-up failures (memory): {su['predicted']} / {su['real_failures']} predicted "
                 f"({_fmt(100 * su['fraction'] if su['fraction'] is not None else None)} %), "
                 f"false alarms on ok runs: {su['false_alarms']} / {su['ok_runs']}")
    for st, d in su["by_status"].items():
        lines.append(f"  {st:<34}{d['predicted']:>5} / {d['runs']}")
    if su["not_scored"]:
        lines.append("  not scored (not configuration-related): " +
                     ", ".join(f"{k} {v}" for k, v in su["not_scored"].items()))
    dg = s.get("diagnostics") or {}
    if "kv_tokens_per_running_request" in dg:
        kv = dg["kv_tokens_per_running_request"]
        lines.append(f"gauges (medians over {kv['runs']} busy runs): KV tokens per running request real "
                     f"{kv['real_median']:.0f}, twin {kv['twin_median']:.0f}; mean running twin/real "
                     f"{dg['mean_running_twin_over_real_median']:.2f}")
    mix = dg.get("saturated_runs_real_itl_over_model_step_at_real_mix")
    if mix:
        lines.append(f"KV-saturated runs ({mix['runs']}): real ITL / model step at the run's own mix, median "
                     f"{mix['median']:.2f} ({mix['median_gap_ms']:.1f} ms); "
                     + ", ".join(f"{k} {v['median']:.2f}" for k, v in mix["by_slots"].items()))
    worst = largest_errors(res.runs, top)
    if len(worst):
        lines.append("")
        lines.append(f"largest errors (|twin-real|/(|twin|+|real|), %), top {top} by throughput + ITL + TTFT-incl:")
        for _, r in worst.iterrows():
            lines.append(f"  {r['run_id'][:70]:<70} tok/s {_fmt(r['real_throughput'], 0)}->{_fmt(r['twin_throughput'], 0)}"
                         f" ITL {_fmt(r['real_itl'])}->{_fmt(r['twin_itl'])}"
                         f" TTFTinc {_fmt(r['real_ttft_incl_unfinished'] / 1000 if r['real_ttft_incl_unfinished'] == r['real_ttft_incl_unfinished'] else None)}s"
                         f"->{_fmt(r['twin_ttft_incl_unfinished'] / 1000)}s  [{r['client']}]")
    if s.get("twin_errors"):
        lines.append(f"\n{s['twin_errors']} runs raised errors in the twin (see the CSV column 'error')")
    lines.append(f"\nwall time {res.wall_s:.1f} s")
    return "\n".join(lines)


def largest_errors(runs: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    sc = runs[runs["scored"]].copy()
    if not len(sc):
        return sc
    score = sc[["err_throughput", "err_itl"]].fillna(0).sum(axis=1) + sc["err_ttft_incl_unfinished"].fillna(0)
    return sc.assign(_score=score).sort_values("_score", ascending=False).head(top)


PER_RUN_COLUMNS = ["run_id", "source", "scenario", "run_dir", "ranks", "rates", "served_adapters", "adapter_slots",
                   "max_lora_rank", "status", "twin_status", "load_basis", "client", "sent_fraction", "requests_sent",
                   "nominal_requests", "twin_requests", "twin_finished", "twin_unfinished", "twin_preemptions",
                   "twin_adapter_loads", "twin_client_failed", "twin_kv_tokens", "has_peer", "ts_mean_running",
                   "twin_mean_running", "ts_mean_kv_usage", "twin_mean_kv_usage", "ts_preemptions"]


def per_run_frame(res: ValidationResult) -> pd.DataFrame:
    runs = res.runs
    cols = [c for c in PER_RUN_COLUMNS if c in runs]
    for m in METRICS:
        cols += [f"real_{m.name}", f"twin_{m.name}", f"err_{m.name}"]
        if m.peer:
            cols += [f"peer_{m.name}", f"peer_err_{m.name}"]
    cols += [c for c in ("sim_wall_s", "error") if c in runs]
    out = runs[cols].copy()
    for c in out.columns:
        if c.startswith("err_") or c.startswith("peer_err_"):
            out[c] = out[c] * 100.0  # percent, published-twin convention
    return out


def write_outputs(res: ValidationResult, out_dir: str | os.PathLike, figures: bool = True) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out / "per_run.csv"
    per_run_frame(res).to_csv(p, index=False, float_format="%.6g")
    paths.append(p)
    p = out / "summary.json"
    p.write_text(json.dumps(res.summary, indent=2, default=_json_default))
    paths.append(p)
    if figures:
        paths += make_figures(res, out)
    return paths


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return str(o)


def json_summary(res: ValidationResult) -> str:
    return json.dumps(res.summary, indent=2, default=_json_default)


# --------------------------------------------------------------------------- figures
def make_figures(res: ValidationResult, out_dir: str | os.PathLike) -> list[Path]:
    """Figures in the manner of the published twin's Figure 7: for each scenario (rates x ranks),
    twin against real across served adapters, one line per adapter-slot value (solid real,
    dashed ours, dotted published twin), for throughput, mean ITL and TTFT incl. unfinished (mean
    TTFT of finished requests where the real table lacks it); one figure per source
    (``fig7_<source>.png``), plus twin-vs-real scatter plots over all runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    runs = res.runs[res.runs["scored"]]
    paths: list[Path] = []
    if not len(runs):
        return paths
    cmap = plt.get_cmap("viridis")
    for src, gs in runs.groupby("source"):
        scen = list(gs.groupby("scenario"))
        fig, axes = plt.subplots(len(scen), 3, figsize=(14, 2.6 * len(scen) + 0.6), squeeze=False)
        for i, (sc, g) in enumerate(scen):
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
                        ax.plot(h["served_adapters"], h[pc] * scale, ":", color=col, lw=1.0)
                if m.startswith("ttft"):
                    ax.set_yscale("log")
                ax.set_title(f"{sc}: {lab}", fontsize=8)
                ax.tick_params(labelsize=7)
                if i == len(scen) - 1:
                    ax.set_xlabel("served adapters", fontsize=8)
                if j == 0:
                    ax.legend(fontsize=6, ncol=2)
        fig.suptitle(f"{src}: real (solid, o), twin (dashed, x), published twin (dotted); colour = adapter slots",
                     fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (2.6 * len(scen) + 0.6)))
        p = out / f"fig7_{src}.png"
        fig.savefig(p, dpi=72)
        plt.close(fig)
        paths.append(p)
    # scatter twin vs real
    ms = [m for m in METRICS if m.name in ("throughput", "itl", "tpot", "ttft_mean", "ttft_incl_unfinished",
                                           "request_throughput")]
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
        ax.set_title(f"{m.label} ({m.unit}): SMAPE {_fmt(res.summary['subsets']['all']['metrics'][m.name]['smape'])} %",
                     fontsize=9)
        ax.set_xlabel("real", fontsize=8)
        ax.set_ylabel("twin", fontsize=8)
        ax.legend(fontsize=6)
    fig.tight_layout()
    p = out / "scatter_twin_vs_real.png"
    fig.savefig(p, dpi=90)
    plt.close(fig)
    paths.append(p)
    return paths
