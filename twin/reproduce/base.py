"""Building blocks of a reproduction: the paper's numbers, result rows, the simulation runner,
the low-load reference and the knee search.

**Nothing measured by a paper is an input.** A paper module keeps the numbers it reproduces in
one table of :class:`PaperNumber` (with the section or figure they come from); they are only
ever printed beside the twin's. Loads are placed relative to the *twin's* knee
(:func:`knee_search`) and SLOs follow the paper's *definitions* applied to the twin's own
measurements (e.g. Chameleon's "5x the mean low-load execution time", :func:`low_load_reference`).

**Names, not objects.** Every workload, preset and profile is chosen by name through the public
registries (:func:`pick`), so presets, engines and profiles that other work registers later are
picked up; where the paper's name does not exist (yet) the closest existing one is used and
recorded in the outcome's set-up (``setup["substitutions"]``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from traces.registry import list_traces
from twin.compare import load_compare_profile
from twin.config import ConfigError
from twin.perf.profile import available_profiles
from twin.registry import PRESETS, load_entry_points, resolve_policy, resolve_system
from twin.reproduce.point_cache import PointCache
from twin.requests import FINISHED, REJECTED
from twin.scenario import RunConfig, build_engine_config, build_workload
from twin.metrics import summarize
from twin.simulate import simulate

_REJECTED = int(REJECTED)


@dataclass(frozen=True)
class PaperNumber:
    """One number (or stated finding) of a paper, with where it is stated."""

    metric: str
    condition: str
    unit: str
    value: float | str
    source: str


@dataclass
class Row:
    """One reproduced number: the paper's value beside the twin's."""

    metric: str
    condition: str
    unit: str
    paper: float | str
    twin: float | str | None
    source: str = ""
    #: the verdict when the value's tolerance test would mislead, with why (e.g. ``"n/a: no cache
    #: eviction at this load"``; a mean that meets the paper's while its parts differ in sign)
    verdict_override: str = ""

    def as_json(self) -> dict[str, Any]:
        """The five keys of ``twin reproduce --json``."""
        return {"metric": self.metric, "condition": self.condition, "unit": self.unit, "paper": self.paper,
                "twin": self.twin}


def row(paper: PaperNumber, twin: float | str | None, digits: int = 1) -> Row:
    """The row of ``paper`` with the twin's value (numbers rounded to ``digits``; None/NaN: not measured)."""
    if isinstance(twin, (float, np.floating)):
        twin = None if not math.isfinite(float(twin)) else round(float(twin), digits)
    return Row(paper.metric, paper.condition, paper.unit, paper.value, twin, paper.source)


def yes_no(flag: bool) -> str:
    """A qualitative finding's value."""
    return "yes" if flag else "no"


def pct_change(value: float | None, base: float | None) -> float:
    """``100 * (value / base - 1)`` (NaN when either is missing or the base is 0)."""
    if value is None or base is None or base == 0 or not math.isfinite(value) or not math.isfinite(base):
        return float("nan")
    return 100.0 * (value / base - 1.0)


def pct_text(x: float | None) -> str:
    """A share as a whole percentage for notes (``"-"`` when missing or not finite)."""
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.0f} %"


def ratio(value: float | None, base: float | None) -> float:
    """``value / base`` (NaN when either is missing or the base is 0)."""
    if value is None or base is None or base == 0:
        return float("nan")
    return value / base


@dataclass
class Outcome:
    """What one reproduction produced: the rows, how it was set up, every simulated point and
    the notes that explain the differences."""

    name: str
    title: str
    rows: list[Row]
    setup: dict[str, Any]
    points: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """``{"name": ..., "rows": [...]}`` as ``twin reproduce --json`` prints it."""
        return {"name": self.name, "rows": [r.as_json() for r in self.rows]}


# --------------------------------------------------------------------------- names
def pick(kind: str, preferred: str, fallback: str, substitutions: dict[str, str]) -> str:
    """``preferred`` when a ``kind`` ("trace", "preset" or "profile") of that name is registered,
    else ``fallback`` (recorded in ``substitutions``); a ConfigError when neither exists."""
    load_entry_points()
    known = {"trace": lambda: {t["name"] for t in list_traces()}, "preset": lambda: set(PRESETS),
             "profile": lambda: set(available_profiles())}[kind]()
    if preferred in known:
        return preferred
    if fallback in known:
        substitutions[preferred] = fallback
        return fallback
    raise ConfigError(f"twin reproduce: neither {kind} {preferred!r} nor its stand-in {fallback!r} is registered; "
                      f"install the package that provides it (known {kind}s: {', '.join(sorted(known))})")


def system_of(preset: str) -> str:
    """The serving system a preset runs on (its ``system`` field, :func:`twin.registry.resolve_system`)."""
    return f"the {resolve_system(preset)} engine"


# --------------------------------------------------------------------------- simulations
@dataclass(frozen=True)
class RequestMetrics:
    """Figures a reproduction computes from a point's per-request table (:func:`twin.metrics.requests_frame`):
    ``compute(requests) -> {key: value}``. ``name`` identifies the computation in the point's key
    (memo and on-disk cache): change it whenever ``compute`` changes."""

    name: str
    compute: Callable[[Any], dict[str, Any]]


def _request_metrics(res) -> dict[str, Any]:
    """Per-request figures a summary lacks: load waits of misses, P99 TTFT and mean miss load by
    rank, and the finished requests' mean TTFT split into queueing (``queue_ms_mean``: arrival to
    first scheduling), adapter-load wait (``load_wait_ms_mean``) and the rest, ``forward_ms_mean``
    = TTFT - queueing - load wait: the forward passes up to the first token (the adaptive-caching
    study's "inference time", §4-5). The split holds where loads sit on the admitting steps'
    critical path (vLLM's synchronous loads and prefetches); an asynchronous swap-in's wait
    (``async_swap_in``) comes before the admission, inside the queueing, and counts in both."""
    df = res.requests
    out: dict[str, Any] = {}
    done = df[df["outcome"] == "finished"]
    hit = done["adapter_hit"]
    miss = done[hit.eq(False).fillna(False).to_numpy(bool)]
    waits = miss["load_wait_s"].to_numpy(float) * 1000.0
    out["miss_load_ms_max"] = float(waits.max()) if waits.size else float("nan")
    out["miss_load_ms_p99"] = float(np.percentile(waits, 99)) if waits.size else float("nan")
    nan = float("nan")
    out["queue_ms_mean"] = float(done["queue_s"].mean() * 1000.0) if len(done) else nan
    out["load_wait_ms_mean"] = float(done["load_wait_s"].mean() * 1000.0) if len(done) else nan
    out["forward_ms_mean"] = (float(((done["ttft_s"] - done["queue_s"] - done["load_wait_s"]) * 1000.0).mean())
                              if len(done) else nan)
    for r, g in done.groupby("adapter_rank"):
        out[f"ttft_ms_p99_rank{int(r)}"] = float(np.percentile(g["ttft_s"] * 1000.0, 99))
        m = miss[miss["adapter_rank"] == r]["load_wait_s"].to_numpy(float) * 1000.0
        out[f"miss_load_ms_mean_rank{int(r)}"] = float(m.mean()) if m.size else float("nan")
    return out


def window_metrics(requests, t0: float) -> dict[str, Any]:
    """Mean TTFT and TPOT (as the summary defines them: finished requests; TPOT of those with
    2+ tokens) of the requests that arrived at or after ``t0`` -- a run measured after a warm-up
    of ``t0`` seconds -- with their count: ``measured_from_s``, ``measured_finished``,
    ``measured_unfinished`` (arrived from ``t0`` on, not finished: rejected or in flight),
    ``measured_ttft_ms_mean``, ``measured_tpot_ms_mean`` (None when no request qualifies)."""
    late = requests[requests["arrival_s"].to_numpy(float) >= t0]
    done = late[late["outcome"] == "finished"]
    ttft = done["ttft_s"].to_numpy(float)
    tpot = done["tpot_s"].to_numpy(float)
    tpot = tpot[np.isfinite(tpot)]
    return {"measured_from_s": float(t0), "measured_finished": int(len(done)),
            "measured_unfinished": int(len(late) - len(done)),
            "measured_ttft_ms_mean": float(ttft.mean()) * 1000.0 if ttft.size else None,
            "measured_tpot_ms_mean": float(tpot.mean()) * 1000.0 if tpot.size else None}


def measured_ttft_mean_lower_bound(engine: Any, t0: float) -> float:
    """A lower bound, from the engine's state now, on the final ``measured_ttft_ms_mean`` / 1000 of
    :func:`window_metrics` (mean TTFT in seconds of the finished requests that arrived at or after
    ``t0``), for a run that goes on until every request has finished (no horizon, no request
    dropped after its arrival: every request not rejected up front finishes). Each such request
    contributes its TTFT once known; one that arrived and has no first token yet, at least
    ``now - arrival``; one that has not arrived, at least 0 (front-end latency only adds). The
    final mean is over exactly these requests, so it is at least their sum over their count."""
    arr = np.asarray(engine.arrival, float)
    keep = (arr >= t0) & (np.asarray(engine.state) != _REJECTED)
    n = int(np.count_nonzero(keep))
    if not n:
        return 0.0
    now = float(engine.env.now)
    a, ft = arr[keep], np.asarray(engine.first_token, float)[keep]
    known = ft == ft
    lower = np.where(known, ft - a, np.maximum(now - a, 0.0))
    return float(lower.sum()) / n


def every_request_finishes(engine: Any) -> bool:
    """Whether the run of ``engine`` goes on until every request not rejected up front has finished:
    no horizon, and no scheduler that drops requests after their arrival (the client cap) nor an
    engine that drops arrivals. Only then does :func:`measured_ttft_mean_lower_bound` bound the
    final mean."""
    return engine.horizon == math.inf and getattr(engine.scheduler, "dropped", None) is None \
        and getattr(engine, "_drop_code", None) is None


def ttft_mean_exceeds(limit_s: float, t0: float) -> Callable[[Any], bool]:
    """A :func:`twin.simulate.simulate` ``stop_when`` rule for a run whose outcome is judged by
    ``measured_ttft_ms_mean < limit_s`` (a peak search's probe): True once
    :func:`measured_ttft_mean_lower_bound` reaches ``limit_s`` -- the full run would fail too. Never
    True for a run with a horizon or a scheduler that drops requests after their arrival (the
    client cap): there not every request finishes, so the bound does not hold."""

    def rule(engine: Any) -> bool:
        if not every_request_finishes(engine):
            return False
        return measured_ttft_mean_lower_bound(engine, t0) >= limit_s

    return rule


def clock_reaches(t_s: float) -> Callable[[Any], bool]:
    """A ``stop_when`` rule that stops a run at simulated time ``t_s`` (at the first check at or
    after it) if it has not ended by then: a cap on how long a backlog is simulated draining."""
    return lambda engine: engine.env.now >= t_s


def _pool_use_peak(res, prof, cfg, blocks: float) -> float | None:
    """The largest share of a unified pool (S-LoRA's ``max_total_token_num`` slots) in use at a
    step: KV plus resident adapter weights in KV-token units (``adapter_mem_bytes`` / the KV
    bytes of one pool slot, ``slora.md`` §3). None where adapters live outside the KV pool."""
    if res.summary.get("adapter_memory") != "unified" or not len(res.steps):
        return None
    per_block = int(prof.components["kv"].params.get("kv_bytes_per_token") or prof.model.kv_bytes_per_token)
    if res.summary.get("pool_blocks") is None:
        per_block *= cfg.block_size
    used = res.steps["kv_blocks_used"].to_numpy(float) + res.steps["adapter_mem_bytes"].to_numpy(float) / per_block
    return float(used.max() / blocks)


def running_adapter_bytes(res, t: np.ndarray, during: bool = True) -> np.ndarray:
    """Bytes of the adapters that running requests use in the recorded step ending at ``t`` (the
    step records hold the batch during the step, before the requests that finish in it leave): a
    request runs from its first admission (``first_sched``, strictly before ``t``: admissions at a
    step's end belong to the next step) until its finish (a finish at ``t`` ran in that step).
    ``during=False``: at the instant ``t`` after the step instead (a finish at ``t`` is released). A
    squashed and re-admitted request counts as running in between (an overestimate; Chameleon
    squashes at most a few per cent)."""
    e = res.engine
    first = np.asarray(e.first_sched, float)
    finish = np.asarray(e.finish, float)
    adapter = np.asarray(e.adapter)
    nbytes = np.asarray(e.adapters.bytes, float)
    out = np.zeros(len(t))
    for a in np.unique(adapter[(adapter >= 0) & np.isfinite(first)]):
        m = (adapter == a) & np.isfinite(first)
        started = np.searchsorted(np.sort(first[m]), t, side="left")
        finishes = np.sort(np.where(np.isfinite(finish[m]), finish[m], np.inf))
        ended = np.searchsorted(finishes, t, side="left" if during else "right")
        out += (started > ended) * nbytes[a]
    return out


def pool_shares(res, prof, cfg, blocks: float) -> dict[str, float | None]:
    """How a unified pool (S-LoRA's slots) is used over a run, from the step records:
    ``mem_demand_peak`` -- the largest share held by KV plus the adapters of *running* requests
    (what the requests need; Chameleon's "nothing is cached" is this reaching the pool);
    ``mem_use_mean`` / ``mem_demand_mean`` -- time-weighted means of the pool in use (cache
    included) and of that demand; ``cache_share_mean`` -- time-weighted mean share held by
    resident adapters no running request uses (Chameleon's cache; for S-LoRA the prefetched
    adapters of queued requests); ``cache_empty_time`` -- the share of time in which they hold
    under 5 % of the pool. None where adapters live outside the KV pool."""
    keys = ("mem_demand_peak", "mem_use_mean", "mem_demand_mean", "cache_share_mean", "cache_empty_time")
    if res.summary.get("adapter_memory") != "unified" or not len(res.steps):
        return dict.fromkeys(keys)
    st = res.steps
    per_block = int(prof.components["kv"].params.get("kv_bytes_per_token") or prof.model.kv_bytes_per_token)
    if res.summary.get("pool_blocks") is None:
        per_block *= cfg.block_size
    t1 = st["t_end"].to_numpy(float)
    w = t1 - st["t_start"].to_numpy(float)
    kv = st["kv_blocks_used"].to_numpy(float)
    resident = st["adapter_mem_bytes"].to_numpy(float)
    running = running_adapter_bytes(res, t1)
    use = (kv + resident / per_block) / blocks
    demand = (kv + running / per_block) / blocks
    cached = np.maximum(resident - running, 0.0) / per_block / blocks
    if not w.sum() > 0:
        w = np.ones_like(w)
    return {"mem_demand_peak": float(demand.max()), "mem_use_mean": float(np.average(use, weights=w)),
            "mem_demand_mean": float(np.average(demand, weights=w)),
            "cache_share_mean": float(np.average(cached, weights=w)),
            "cache_empty_time": float(np.average(cached < CACHE_EMPTY_SHARE, weights=w))}


#: "nothing is cached" (Chameleon §6.1): idle resident adapters hold less than this share of the pool
CACHE_EMPTY_SHARE = 0.05

#: summary keys that time the host, not the simulation: left out, so a rerun writes identical files
HOST_TIMINGS = ("wall_s", "x_realtime")


class Runner:
    """Runs simulation points by name, remembers them (a repeated point is not simulated twice,
    e.g. the knee shared by ``chameleon-fig11`` and ``chameleon-caches`` under ``all``) and
    counts them on an optional progress bar (tqdm, stderr)."""

    def __init__(self, progress: bool = False, label: str = "reproduce", cache: PointCache | None | bool = None,
                 ) -> None:
        """``cache``: a :class:`PointCache` on disk shared across processes; None takes the one
        ``$TWIN_REPRODUCE_CACHE`` names (if any); False: none."""
        self.progress = progress
        self.label = label
        self.memo: dict[tuple, dict[str, Any]] = {}
        self.cache = PointCache.from_env() if cache is None else (cache or None)
        self.bar = None

    def start(self, label: str) -> None:
        """Begin a reproduction: a fresh progress bar (when enabled) named ``label``."""
        self.close()
        self.label = label
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(unit="run", desc=label, leave=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def point(self, run: RunConfig, policy: str | None, rps: float | None = None, *, scheduler: str | None = None,
              cache: str | None = None, slo_s: float | None = None, accuracy: float | None = None,
              lora_targets: str | None = None, memory: bool = False,
              measure_from_s: float | None = None, fail_above_ttft_s: float | None = None,
              stop_at_s: float | None = None, request_metrics: "RequestMetrics | None" = None,
              memory_gauge_s: float | None = None) -> dict[str, Any]:
        """The summary (plus :func:`_request_metrics`) of ``run`` at ``rps`` under the preset
        ``policy`` (``scheduler``/``cache`` override its parts). ``slo_s`` is the TTFT SLO, given to
        schedulers that plan with one (Chameleon's quotas) as ``twin compare`` does. ``memory``:
        record the steps and add ``kv_use_peak``, the largest share of the KV blocks in use, ``mem_use_peak``
        (:func:`_pool_use_peak`) and the pool's use by requests and by cached adapters (:func:`pool_shares`).
        ``measure_from_s``: a warm-up; add the ``measured_*`` figures of :func:`window_metrics` over the
        requests that arrive from then on (the summary's own figures stay over the whole run).
        ``fail_above_ttft_s`` (with ``measure_from_s``; a peak search's probe judged by
        ``measured_ttft_ms_mean``): stop the run as soon as that mean is known to reach this limit
        (:func:`ttft_mean_exceeds`, an exact bound); the point is then only ``stopped_early: True``,
        ``stopped_at_s`` and ``measured_ttft_ms_mean_lower`` (the bound, ms) beside the preset and rate.
        Never stops a run where requests can be dropped after their arrival (:func:`ttft_mean_exceeds`).
        ``stop_at_s`` (with ``measure_from_s``; a point past the preset's own peak whose backlog would be
        simulated draining for hours): stop the run at this simulated time (:func:`clock_reaches`) if it
        has not ended. A run that ends before is the full point (the same key and figures); one that is
        cut gets ``stopped_early: True``, ``stopped_at_s``, the summary of the run up to then (counters,
        requests finished, :func:`twin.metrics.summarize` at the stop), ``measured_arrived`` /
        ``measured_finished`` and ``measured_ttft_ms_mean_lower``: the exact lower bound on the mean TTFT
        the full run would measure (None where requests can be dropped); its ``measured_ttft_ms_mean`` and
        ``measured_tpot_ms_mean`` are None (the requests finished by then are not a fair sample).
        ``request_metrics``: a reproduction's own figures of the per-request table (e.g. Chameleon's
        size classes, :class:`RequestMetrics`), added to a point that runs to its end and remembered
        under their name (part of the point's key).
        ``memory_gauge_s``: read the server's memory in use (:meth:`twin.engine_state.EngineState.memory_in_use`)
        every that many simulated seconds and add ``memory_in_use_mean``, the mean of the readings from
        ``measure_from_s`` (or 0) to the last arrival, while the offered load lasts. The run advances in
        chunks between readings (:func:`twin.simulate.simulate`'s ``stop_when``; bit-identical to a whole
        run); with ``stop_at_s`` the cut falls on the first reading at or after it, as on the default
        5 s grid when ``stop_at_s`` is a multiple of both."""
        if (fail_above_ttft_s is not None or stop_at_s is not None) and measure_from_s is None:
            raise ValueError("Runner.point: fail_above_ttft_s and stop_at_s judge the measured requests; "
                             "give measure_from_s too")
        if fail_above_ttft_s is not None and stop_at_s is not None:
            raise ValueError("Runner.point: give fail_above_ttft_s (a peak-search probe) or stop_at_s (a capped "
                             "rate point), not both")
        if rps is not None:
            run = dataclasses.replace(run, rps=float(rps))
        key = (repr(run), policy, scheduler, cache, slo_s, accuracy, lora_targets, memory)
        if measure_from_s is not None:  # (points without a warm-up keep their keys in the on-disk cache)
            key += (float(measure_from_s),)
        if request_metrics is not None:  # (so do points without a reproduction's own figures)
            key += (("request_metrics", request_metrics.name),)
        if memory_gauge_s is not None:
            if not memory_gauge_s > 0:
                raise ValueError(f"Runner.point: memory_gauge_s {memory_gauge_s!r}: give the interval in simulated "
                                 f"seconds, > 0")
            key += (("memory_gauge_s", float(memory_gauge_s)),)
        full_key = key  # a run to the end (also what a probe that did not stop is stored as)
        if fail_above_ttft_s is not None:
            key += (("fail_above_ttft_s", float(fail_above_ttft_s)),)
        if stop_at_s is not None:
            key += (("stop_at_s", float(stop_at_s)),)
        for k in dict.fromkeys((full_key, key)):  # a full run answers a probe too
            if k in self.memo:
                return self.memo[k]
            if self.cache is not None and (stored := self.cache.get(k)) is not None:
                self.memo[k] = stored
                if self.bar is not None:
                    self.bar.update()
                return stored
        if self.bar is not None:
            self.bar.set_postfix_str(f"{policy or scheduler}+{cache or ''} at {run.rps:.3g} req/s")
        prof = load_compare_profile(run.profile, lora_targets)
        w = build_workload(run)
        # the server as the preset's own system sizes it (its run carries the preset, as `twin compare`'s does): an
        # S-LoRA preset's pool was sized as vLLM's, less the per-slot LoRA buffers S-LoRA does not have (12 % of it)
        cfg = build_engine_config(dataclasses.replace(run, policy=policy) if policy is not None else run, w, prof)
        s, c, label = resolve_policy(policy, scheduler, cache)
        if slo_s is not None and hasattr(s, "slo_s"):
            s.slo_s = slo_s
        if accuracy is not None and hasattr(s, "accuracy"):
            s.accuracy = accuracy
        stop_when = None
        if fail_above_ttft_s is not None:
            stop_when = ttft_mean_exceeds(float(fail_above_ttft_s), float(measure_from_s))
        elif stop_at_s is not None:
            stop_when = clock_reaches(float(stop_at_s))
        readings: list[tuple[float, float]] = []
        check_s = 5.0  # (simulate's default)
        if memory_gauge_s is not None:
            rule, check_s = stop_when, float(memory_gauge_s)

            def stop_when(e: Any) -> bool:  # a reading at every check, then the point's own stop rule
                readings.append((float(e.env.now), e.memory_in_use()))
                return rule(e) if rule is not None else False
        res = simulate(w, prof, cfg, scheduler_obj=s, cache_obj=c, ttft_slo_s=slo_s, record_steps=memory,
                       system=resolve_system(policy, run.system),  # the preset's engine, as twin.compare.run_one
                       frontend_s=run.frontend_ms / 1000.0, serving_s_per_running=run.serving_us / 1e6,
                       rank_tile_cost=run.rank_tile_cost, stop_when=stop_when, stop_check_s=check_s)
        gauge: dict[str, Any] = {}
        if memory_gauge_s is not None:
            t0 = float(measure_from_s or 0.0)
            last = float(np.max(res.engine.arrival)) if res.engine.n else 0.0
            vals = [u for t, u in readings if t0 <= t <= last]
            gauge = {"memory_in_use_mean": float(np.mean(vals)) if vals else None, "memory_in_use_readings": len(vals)}
        if res.summary.get("stopped_early") and stop_at_s is not None:
            return self._store(key, {**self._cut_point(res, policy or label, run.rps, float(measure_from_s), slo_s),
                                     **gauge})
        if res.summary.get("stopped_early"):
            return self._store(key, {**res.summary, "preset": policy or label, "rps": run.rps,
                                     "measured_from_s": float(measure_from_s), "measured_ttft_ms_mean_lower":
                                     1000.0 * measured_ttft_mean_lower_bound(res.engine, measure_from_s)})
        out = {k: v for k, v in res.summary.items()
               if not isinstance(v, (dict, list)) and k not in HOST_TIMINGS}
        if memory:
            # the pool in the engine's own KV units (S-LoRA counts 1-token slots, vLLM blocks)
            blocks = res.summary.get("pool_blocks") or res.summary["kv_capacity_tokens"] / cfg.block_size
            out["kv_use_peak"] = float(res.steps["kv_blocks_used"].max() / blocks) if len(res.steps) else float("nan")
            out["mem_use_peak"] = _pool_use_peak(res, prof, cfg, blocks)
            out.update(pool_shares(res, prof, cfg, blocks))
        out.update({"preset": policy or label, "rps": run.rps, **_request_metrics(res)})
        if measure_from_s is not None:
            out.update(window_metrics(res.requests, float(measure_from_s)))
        if request_metrics is not None:
            out.update(request_metrics.compute(res.requests))
        out.update(gauge)
        return self._store(full_key, out)

    @staticmethod
    def _cut_point(res, preset: str, rps: float, t0: float, slo_s: float | None) -> dict[str, Any]:
        """The point of a run cut at ``stop_at_s`` (see :meth:`point`): the summary up to the cut,
        the measured requests' counts and the lower bound on their mean TTFT."""
        e = res.engine
        out = {k: v for k, v in summarize(e, 0.0, slo_s).items()
               if not isinstance(v, (dict, list)) and k not in HOST_TIMINGS}
        arr = np.asarray(e.arrival, float)
        late = (arr >= t0) & (arr <= float(e.env.now))
        bound = measured_ttft_mean_lower_bound(e, t0) if every_request_finishes(e) else None
        out.update({**res.summary, "preset": preset, "rps": rps, "measured_from_s": t0,
                    "measured_arrived": int(np.count_nonzero(late)),
                    "measured_finished": int(np.count_nonzero(late & (np.asarray(e.state) == FINISHED))),
                    "measured_ttft_ms_mean": None, "measured_tpot_ms_mean": None,
                    "measured_ttft_ms_mean_lower": None if bound is None else 1000.0 * bound})
        return out

    def _store(self, key: tuple, out: dict[str, Any]) -> dict[str, Any]:
        """Memoise a simulated point (and write it to the on-disk cache), count it on the bar."""
        self.memo[key] = out
        if self.cache is not None:
            self.cache.put(key, out)
        if self.bar is not None:
            self.bar.update()
        return out


# --------------------------------------------------------------------------- references
#: "low load": requests in flight on average (Little's law: rate x mean E2E) at most this, so a
#: request almost never shares the GPU with another (a definition, not a paper number)
LOW_LOAD_OCCUPANCY = 0.1
#: requests of the low-load reference run
LOW_LOAD_REQUESTS = 200
#: first guess of the low-load rate (req/s), corrected once from its own E2E
LOW_LOAD_FIRST_RPS = 0.05


def low_load_reference(runner: Runner, run: RunConfig, policy: str, requests: int = LOW_LOAD_REQUESTS,
                       ) -> dict[str, Any]:
    """The summary of ``run`` under ``policy`` at a rate low enough that on average at most
    :data:`LOW_LOAD_OCCUPANCY` requests are in flight: a run at :data:`LOW_LOAD_FIRST_RPS`, then
    (when its rate x mean E2E exceeds the bound) one at ``LOW_LOAD_OCCUPANCY / E2E``. Its
    ``e2e_ms_mean`` is the "mean low-load execution time"; ``rps`` the rate used."""
    rps = LOW_LOAD_FIRST_RPS
    s = runner.point(dataclasses.replace(run, duration=requests / rps), policy, rps)
    e2e = s["e2e_ms_mean"] / 1000.0
    if rps * e2e > LOW_LOAD_OCCUPANCY:
        rps = LOW_LOAD_OCCUPANCY / e2e
        s = runner.point(dataclasses.replace(run, duration=requests / rps), policy, rps)
    return s


@dataclass
class Knee:
    """The highest rate that met the condition (``rate``), the lowest that failed (``failed``,
    None when none did up to the doubling limit) and every probe ``(rate, met)``."""

    rate: float
    failed: float | None
    probes: list[tuple[float, bool]]


def knee_search(point: Callable[[float], dict[str, Any]], ok: Callable[[dict[str, Any]], bool], start: float,
                bisections: int, max_doublings: int = 10, resolution: float | None = None) -> Knee:
    """The highest Poisson rate whose run meets ``ok`` (e.g. P99 TTFT within the SLO).

    From ``start``: double while the condition holds (halve while it fails) to bracket the knee
    between a passing rate and a failing one, then bisect ``bisections`` times; the result is the
    last passing rate, within ``(failed - rate)`` (``start * 2**-bisections`` or finer relative
    to the bracket) of the true knee of this workload and horizon. With ``resolution`` (a
    fraction), bisection goes on after those until ``failed - rate <= resolution * rate``: the
    knee is then known to within that share of itself (the doubling bracket is as wide as its
    lower end, so ``ceil(log2(1 / resolution))`` bisections at most). A rate 0 means even
    ``start / 2**max_doublings`` fails.
    """
    if resolution is not None and not resolution > 0:
        raise ValueError(f"knee_search: resolution {resolution!r} must be > 0 (a fraction of the knee, e.g. 0.05)")
    probes: list[tuple[float, bool]] = []

    def test(r: float) -> bool:
        met = bool(ok(point(r)))
        probes.append((r, met))
        return met

    r = float(start)
    if test(r):
        lo, hi = r, None
        for _ in range(max_doublings):
            r *= 2.0
            if test(r):
                lo = r
            else:
                hi = r
                break
        if hi is None:
            return Knee(lo, None, probes)
    else:
        lo, hi = None, r
        for _ in range(max_doublings):
            r /= 2.0
            if test(r):
                lo = r
                break
            hi = r
        if lo is None:
            return Knee(0.0, hi, probes)
    for _ in range(bisections):
        mid = 0.5 * (lo + hi)
        if test(mid):
            lo = mid
        else:
            hi = mid
    knee = Knee(lo, hi, probes)
    return knee if resolution is None else refine_knee(point, ok, knee, resolution)


def refine_knee(point: Callable[[float], dict[str, Any]], ok: Callable[[dict[str, Any]], bool], knee: Knee,
                resolution: float) -> Knee:
    """``knee`` bisected further (the same midpoints :func:`knee_search` would probe next) until
    ``failed - rate <= resolution * rate``; a knee with no failing rate, or rate 0, is returned as it is.
    The probes are ``knee``'s followed by the new ones."""
    if not resolution > 0:
        raise ValueError(f"refine_knee: resolution {resolution!r} must be > 0 (a fraction of the knee, e.g. 0.05)")
    lo, hi = knee.rate, knee.failed
    if hi is None or lo <= 0:
        return knee
    probes = list(knee.probes)
    while hi - lo > resolution * lo:
        mid = 0.5 * (lo + hi)
        met = bool(ok(point(mid)))
        probes.append((mid, met))
        if met:
            lo = mid
        else:
            hi = mid
    return Knee(lo, hi, probes)
