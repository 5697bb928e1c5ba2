"""One call from a workload to results: :func:`simulate`."""

from __future__ import annotations

import gc
import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

from traces.arguments import is_real_number
from twin.config import MAX_SIM_SECONDS, EngineConfig
from twin.engine import Engine
from twin.interfaces import check_policy_object, explain_policy_failure, policy_label
from twin.metrics import outcomes, requests_frame, summarize
from twin.perf.profile import Profile, load_profile
from twin.registry import resolve_policy, resolve_system
from twin.scrape_stall import SCRAPE_PERIOD_S, check_scrape
from twin.slora_engine import VLLM_ONLY_CONFIG, SLoRAEngine

#: the engine of each serving system (``twin.registry.SYSTEMS``)
ENGINES = {"vllm": Engine, "slora": SLoRAEngine}


#: the shortest ``stop_check_s`` (simulated seconds): one check per millisecond is finer than any
#: engine step; a smaller interval would make the chunked run crawl (and below the clock's
#: resolution never advance)
MIN_STOP_CHECK_S = 1e-3


_FROZEN = False


def collect_run_garbage() -> None:
    """Free a finished run's arrays between the runs of one process (a sweep's walk, ``twin validate``'s workers):
    the engine's reference cycles hold them until a collection. The first call also freezes what survives it
    (``gc.freeze``: the modules, the cached profiles and workloads) into the permanent generation, which later
    collections skip. A full collection walks every tracked object of the process: 70-90 ms with pandas, scipy
    and the policies imported, paid after every run (8 % of a one-second run); frozen, the next ones take 0.3-1.5
    ms. Results do not depend on it."""
    global _FROZEN
    gc.collect()
    if not _FROZEN:
        gc.freeze()
        _FROZEN = True


def resolved_config(config: dict[str, Any], engine: Any, profile: Any) -> dict[str, Any]:
    """The engine settings ``config`` (``EngineConfig.to_dict()``) with those left to the engine (None) replaced by
    the values the run used: the slots' max LoRA rank (the largest adapter's), the KV capacity (the profile's for the
    GPU) and the adapters' target modules (the profile's)."""
    used = {"max_lora_rank": getattr(engine, "max_lora_rank", None), "kv_capacity_tokens": getattr(engine, "kv_tokens", None),
            "lora_targets": ",".join(profile.lora_targets)}
    return {k: (used[k] if v is None and used.get(k) is not None else v) for k, v in config.items()}


class NothingAdmittedWarning(UserWarning):
    """A run whose scheduler admitted no request: every request that arrived (and was not rejected)
    ended unfinished, so the summary's latencies and throughput are empty (:func:`nothing_admitted_note`);
    or a run that left requests waiting for ever: without a horizon, or with one that the engine reached idle,
    every request arrived (:func:`stranded_note`)."""


def unfinished_not_dropped(engine: Any) -> np.ndarray:
    """Per request: arrived and neither rejected, finished nor dropped before the queue with a reason
    (``drop_arrivals``: e.g. fcfs+client-cap's client cap), i.e. it waited or ran and did not finish."""
    mask = outcomes(engine) == 3
    dropped = getattr(engine, "_drop_code", None)
    if dropped is not None:
        mask &= dropped == 0
    return mask


def nothing_admitted_note(engine: Any, summary: dict[str, Any], scheduler: Any) -> str | None:
    """The note of a run that finished no request because none was ever admitted (requests arrived, were
    not rejected, and none was ever scheduled), naming the scheduler; None otherwise (a run cut by its
    horizon after admissions or before the engine tried any -- S-LoRA polls every 10 ms while idle --, or whose
    requests were all rejected, is no such run)."""
    if summary.get("requests_finished"):
        return None
    if getattr(engine, "n_attempts", None) == 0:  # (S-LoRA: the horizon came before its first admission poll)
        return None
    if getattr(getattr(engine, "extensions", None), "_swap_wait_since", None):  # (waiting for swap-ins at the horizon)
        return None
    waited = unfinished_not_dropped(engine)
    n = int(np.count_nonzero(waited))
    if not n or not np.isnan(engine.first_sched[waited]).all():
        return None
    return (f"no request was admitted: {policy_label(scheduler)} admitted none of the {n} request(s) that arrived "
            f"and waited, so the run finished none (all {n} unfinished); check its schedule_waiting, which must offer "
            f"waiting requests to ctx.try_admit(rid) (twin.interfaces.Scheduler)")


def stranded_note(engine: Any, summary: dict[str, Any], scheduler: Any) -> str | None:
    """The note of a run that ended with requests that arrived, were admitted at some point or not, and never
    finished although the engine had nothing left to run while they waited, so the scheduler stopped offering
    them (e.g. an ``on_preempt`` that drops the request instead of queueing it again: 62 of 250 requests ended
    silently unfinished). Without a horizon, every such run; with one, a run whose engine went idle before the
    horizon in the state a run without one stops in (:func:`idle_before_horizon`): those requests would never
    have run, however long the horizon. None otherwise (a horizon that cuts a busy run cuts it on purpose; a run
    that admitted nothing has :func:`nothing_admitted_note`)."""
    if summary.get("stopped_early"):
        return None
    horizon = engine.horizon != float("inf")
    if horizon and not idle_before_horizon(engine):
        return None
    stranded = unfinished_not_dropped(engine)
    n = int(np.count_nonzero(stranded))
    if not n:
        return None
    fix = (f"{policy_label(scheduler)} stopped offering them to ctx.try_admit (a preempted request must be queued "
           f"again in on_preempt, an arrival in on_arrivals; twin.interfaces.Scheduler)")
    if not horizon:
        return (f"{n} request(s) never finished although the run had no horizon: the engine ran out of work while "
                f"they waited, i.e. {fix}")
    preempted = int(np.count_nonzero(np.isin(np.flatnonzero(stranded), np.fromiter(engine.preempt_d, np.int64))))
    return (f"{n} request(s) ({preempted} of them preempted) were left waiting at the horizon ({engine.horizon:g} s) "
            f"although the engine went idle before it, every request had arrived and nothing was running or due "
            f"(no adapter load, no policy tick): they would never have run, i.e. {fix}")


def idle_before_horizon(engine: Any) -> bool:
    """Whether a run with a horizon ended as a run without one stops (``Engine._run``: nothing to plan and nothing
    to wait for): every request arrived, no adapter load in flight, no policy tick due, nothing running, and the
    last step ended before the horizon (no request finished at or after it: a step that emptied the batch finishes
    its requests at its end), so the scheduler was offered the waiting requests with the engine idle and admitted
    none, and nothing could change that before the horizon. Only the vLLM engine's loop is known to offer them
    after its last step (the S-LoRA engine polls on a grid that may not reach the horizon): False for others."""
    if type(engine) is not Engine:
        return False
    inf = float("inf")
    return (not engine.running and engine.arr_ptr >= engine.n and engine._next_arr_t == inf
            and engine._async_until == inf and engine._next_tick == inf
            and not bool((engine.finish >= engine.horizon).any()))


def dataframe_columns(df: Any) -> dict[str, np.ndarray]:
    """A workload table (a pandas DataFrame) as a mapping of numpy columns, its rows sorted as a
    :class:`traces.workload.Workload` sorts them (by ``arrival_s``, ties by ``request_id``, which is the row
    order when absent); the columns are then checked by :func:`twin.requests.workload_columns`. Pandas is
    not imported here: the core twin runs without it."""
    cols = {str(c): df[c].to_numpy() for c in df.columns}
    arr = cols.get("arrival_s")
    if arr is not None and arr.dtype.kind in "iuf" and len(arr) > 1 and (np.diff(arr) < 0).any():
        ids = cols.setdefault("request_id", np.arange(len(arr), dtype=np.int64))
        order = np.lexsort((ids, arr))
        cols = {k: v[order] for k, v in cols.items()}
    return cols


@dataclass
class SimResult:
    """Summary, per-request and per-step tables of one run (tables built on first use)."""

    summary: dict[str, Any]
    engine: Engine = field(repr=False)

    @property
    def requests(self) -> "pd.DataFrame":
        if not hasattr(self, "_requests"):
            self._requests = requests_frame(self.engine)
        return self._requests

    @property
    def steps(self) -> "pd.DataFrame":
        return self.engine.rec.steps_frame()

    def write(self, out_dir: str | Path) -> Path:
        """Write ``requests.parquet``, ``steps.parquet`` and ``summary.json`` into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.requests.to_parquet(out / "requests.parquet", index=False)
        self.steps.to_parquet(out / "steps.parquet", index=False)
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2, default=str))
        return out


def simulate(workload, profile: Profile | str | None = None, config: EngineConfig | None = None,
             policy: str | None = None, scheduler: str | None = None, cache: str | None = None,
             horizon_s: float | None = None, ttft_slo_s: float | None = None, tbt_slo_s: float | None = None,
             max_run_steps: int | None = None, progress: bool = False, record_steps: bool = True,
             scheduler_obj=None, cache_obj=None, check_invariants: bool = False, extra: dict[str, Any] | None = None,
             system: str | None = None, frontend_s: float = 0.0, scrape_s_per_label: float = 0.0,
             serving_s_per_running: float = 0.0, rank_tile_cost: float | None = None,
             scrape_period_s: float = SCRAPE_PERIOD_S, stop_when: Callable[[Any], bool] | None = None,
             stop_check_s: float = 5.0, scheduler_opts: dict[str, Any] | None = None,
             cache_opts: dict[str, Any] | None = None) -> SimResult:
    """Replay ``workload`` through the engine and collect the results.

    ``workload``: a :class:`traces.workload.Workload` (``traces.registry.get_workload``), a pandas
    DataFrame or a mapping of numpy columns of its schema (``arrival_s``, ``prompt_tokens``,
    ``output_tokens``, ``adapter_id``, ``adapter_rank``; the conversation columns optional).
    ``profile``: a :class:`Profile`, a name (``twin calibrate list``) or a profile file; None: the default.
    ``policy`` names a preset (``twin policies``); ``scheduler``/``cache`` override its parts by name;
    ``scheduler_obj``/``cache_obj`` are policy *instances* used instead (a plug-in that no registry
    holds, e.g. ``simulate(w, scheduler_obj=MyScheduler(), cache_obj=LRUCache())``; the other part is the
    preset's, or ``fcfs``/``lru``). ``scheduler_opts``/``cache_opts``: constructor arguments of the named
    scheduler and cache, over the preset's (``twin run --scheduler-opt slo_s=5``).
    ``horizon_s`` stops the run (requests in flight are counted as unfinished); None runs
    until every request has finished. ``system`` picks the engine (``vllm``, ``slora``; default:
    the preset's system, ``vllm`` for policy objects). ``frontend_s``: the front-end latency of
    each request outside the engine (API server and client path, seconds; 0: the engine's own
    times): the client-observed first token and finish are that much later (TTFT and E2E grow,
    TPOT and ITL do not; :mod:`twin.metrics`); reported as ``frontend_ms`` when set.
    ``scrape_s_per_label``: the server's metrics scrape every ``scrape_period_s`` stalls the
    client-observed path for this many seconds per LoRA label series seen so far
    (:mod:`twin.scrape_stall`; 0: off); reported as ``scrape_us_per_label`` when set.
    ``serving_s_per_running``: the serving path's host time per running request and step
    (:meth:`twin.perf.profile.Profile.with_serving_host`; 0: the calibrated engine alone); reported as
    ``serving_us_per_running`` when set.
    ``rank_tile_cost``: the working-block cost of a LoRA shrink rank tile beyond the first, relative to the
    first (:meth:`twin.perf.profile.Profile.with_rank_tile_cost`; None: the profile's own); reported as
    ``rank_tile_cost`` when set.
    ``stop_when(engine)``: a decision rule checked every ``stop_check_s`` simulated seconds (the run
    advances in chunks that end at a check or at the engine's end: SimPy processes the same events in
    the same order, so a chunked run is bit-identical to a whole one, as in
    :func:`twin.sweep.scenario.run_config`; a test compares them);
    when it returns True the run stops there and the summary is only ``stopped_early: True`` and
    ``stopped_at_s`` (with the policy, system and profile): the caller's rule decided the outcome.
    A run that finishes no request because its scheduler admitted none (a user scheduler that never calls
    ``ctx.try_admit``) says so: the summary gets a ``note`` naming the scheduler and a
    :class:`NothingAdmittedWarning` is issued (:func:`nothing_admitted_note`); so does a run whose scheduler
    stopped offering requests that waited (an ``on_preempt`` that does not queue the request again), with or
    without a horizon (:func:`stranded_note`).
    """
    if hasattr(workload, "columns") and hasattr(workload, "to_numpy"):  # a pandas DataFrame: its columns are
        workload = dataframe_columns(workload)  # checked as a mapping of columns (a misspelt one is refused)
    if profile is not None and not isinstance(profile, (Profile, str, os.PathLike)):
        raise TypeError(f"profile: got {type(profile).__name__}; give a profile name (`twin calibrate list`), a path "
                        f"to a profile JSON file, or a twin.perf.profile.Profile (None: the default)")
    if extra is not None:
        if not isinstance(extra, Mapping):
            raise TypeError(f"extra: got {type(extra).__name__}; give a dict of summary fields, e.g. "
                            f"{{'trace': 'mine'}}")
        fixed = sorted(str(k) for k in extra if k in ("policy", "system", "scheduler", "cache", "profile"))
        if fixed:
            raise ValueError(f"extra: {', '.join(fixed)} would replace the run's own summary field(s); give the "
                             f"field(s) another name")
    if stop_when is not None:
        if not callable(stop_when):
            raise TypeError(f"stop_when: got {type(stop_when).__name__}; give a function of the engine that returns "
                            f"True to stop the run (None: run to the end)")
        if not (is_real_number(stop_check_s) and MIN_STOP_CHECK_S <= stop_check_s < math.inf):
            raise ValueError(f"stop_check_s {stop_check_s!r}: give the check interval in simulated seconds, "
                             f">= {MIN_STOP_CHECK_S:g} and finite, e.g. 5")
    for arg, v in (("progress", progress), ("record_steps", record_steps), ("check_invariants", check_invariants)):
        if not isinstance(v, (bool, np.bool_)):  # ("no" or "false" is a true value: it would do the opposite)
            raise TypeError(f"{arg}: got {v!r} ({type(v).__name__}); give True or False")
    for arg, v in (("frontend_s", frontend_s), ("scrape_s_per_label", scrape_s_per_label),
                   ("serving_s_per_running", serving_s_per_running), ("scrape_period_s", scrape_period_s)):
        if not is_real_number(v):
            raise TypeError(f"{arg}: got {v!r} ({type(v).__name__}); give a number of seconds")
    if rank_tile_cost is not None and not is_real_number(rank_tile_cost):
        raise TypeError(f"rank_tile_cost: got {rank_tile_cost!r} ({type(rank_tile_cost).__name__}); give a number "
                        f">= 0 (1: every rank tile alike; None: the profile's own)")
    for arg, v in (("ttft_slo_s", ttft_slo_s), ("tbt_slo_s", tbt_slo_s)):
        if v is not None and not (is_real_number(v) and 0 < v < math.inf):
            raise ValueError(f"{arg} {v!r}: give the SLO in seconds, > 0 and finite (None: no SLO)")
        if v is not None and v > MAX_SIM_SECONDS:
            raise ValueError(f"{arg} {v!r}: beyond the {MAX_SIM_SECONDS:g} s (about 3 years) a run may simulate, so "
                             f"every request would meet it; give the SLO in seconds, e.g. 2 (None: no SLO)")
    if not (frontend_s >= 0.0 and math.isfinite(frontend_s)):
        raise ValueError(f"frontend_s {frontend_s!r}: give the front-end latency in seconds, >= 0 (0: off)")
    check_scrape(scrape_s_per_label, scrape_period_s)

    if not (serving_s_per_running >= 0.0 and math.isfinite(serving_s_per_running)):
        raise ValueError(f"serving_s_per_running {serving_s_per_running!r}: give seconds per running request and "
                         f"step, >= 0 (0: off)")
    for arg, v, top in (("frontend_s", frontend_s, 1e3), ("scrape_s_per_label", scrape_s_per_label, 1.0),
                        ("serving_s_per_running", serving_s_per_running, 1.0)):  # (1e12 s ran: latencies of 1e12 s)
        if v > top:
            raise ValueError(f"{arg} {v!r}: more than {top:g} s, an error of units (the host terms are milliseconds or "
                             f"microseconds: twin run's --frontend-ms / --serving-us take at most the same); give "
                             f"seconds")
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    if serving_s_per_running:
        prof = prof.with_serving_host(serving_s_per_running)
    if rank_tile_cost is not None:
        prof = prof.with_rank_tile_cost(rank_tile_cost)
    cfg = config or EngineConfig()
    if not isinstance(cfg, EngineConfig):
        raise TypeError(f"config: got {type(cfg).__name__}, not a twin.config.EngineConfig; build one, e.g. "
                        f"EngineConfig(max_loras=8)")
    for obj, opts, arg in ((scheduler_obj, scheduler_opts, "scheduler"), (cache_obj, cache_opts, "cache")):
        if obj is not None and opts:  # (the options would be dropped: the instance is built already)
            raise ValueError(f"{arg}_opts {opts!r} with {arg}_obj: an instance is built with its options; give "
                             f"them to its constructor, or name the policy ({arg}=...) with {arg}_opts")
    if scheduler_obj is not None:
        check_policy_object(scheduler_obj, "scheduler", "scheduler_obj")
    if cache_obj is not None:
        check_policy_object(cache_obj, "cache", "cache_obj")
    if scheduler_obj is None or cache_obj is None:
        s, c, label = resolve_policy(policy, scheduler, cache, scheduler_opts, cache_opts)
        scheduler_obj = scheduler_obj or s
        cache_obj = cache_obj or c
    else:
        label = f"{scheduler_obj.name}+{cache_obj.name}"
    system = resolve_system(policy, system)
    if cfg.lora_targets is not None:  # the adapters' modules: bytes and compute (both systems)
        prof = prof.with_lora_targets(cfg.lora_targets)
    t0 = time.perf_counter()
    eng = ENGINES[system](workload, prof, cfg, scheduler_obj, cache_obj, horizon_s=horizon_s,
                          max_run_steps=max_run_steps, progress=progress, record_steps=record_steps,
                          check_invariants=check_invariants)
    eng.frontend_s = float(frontend_s)
    eng.scrape_s_per_label, eng.scrape_period_s = float(scrape_s_per_label), float(scrape_period_s)
    if scrape_s_per_label:  # the stalls merge streamed chunks: the client's ITL needs the steps' end times
        eng.rec.keep_segments = True
    try:
        if stop_when is not None:
            env, t = eng.env, stop_check_s
            while eng.proc.is_alive:
                # to the next check, or to the engine's end if that comes first (the clock must not
                # pass it: the summary's simulated time is the clock's); a run of decode steps ends by the check,
                # so the rule reads the state stepping one iteration at a time has there
                eng._observe_t = min(t, eng.horizon)
                env.run(until=env.any_of([eng.proc, env.timeout(max(t - env.now, 0.0))]))
                if eng.proc.is_alive and stop_when(eng):
                    return SimResult({"policy": label, "system": system, "scheduler": scheduler_obj.name,
                                      "cache": cache_obj.name, "profile": prof.name, "stopped_early": True,
                                      "stopped_at_s": float(eng.env.now)}, eng)
                t += stop_check_s
        eng.run()
    except Exception as e:  # a policy's hook that raised: name the policy and the hook
        err = explain_policy_failure(e, (scheduler_obj, cache_obj))
        if err is None:
            raise
        raise err from e
    wall = time.perf_counter() - t0
    summary = summarize(eng, wall, ttft_slo_s, tbt_slo_s)
    if system == "slora" and extra and "config" in extra:  # the engine's settings (1-token slots, its limits)
        extra = {**extra, "config": {k: v for k, v in eng.config.to_dict().items() if k not in VLLM_ONLY_CONFIG}}
    if extra and isinstance(extra.get("config"), dict):  # settings left to the engine: the values it used
        extra = {**extra, "config": resolved_config(extra["config"], eng, prof)}
    clash = sorted(str(k) for k in (extra or {}) if k in summary)
    if clash:  # (the run's own metrics would be replaced silently)
        raise ValueError(f"extra: {', '.join(clash)} would replace the run's own summary field(s); give the field(s) "
                         f"another name")
    summary = {"policy": label, "system": system, "scheduler": scheduler_obj.name, "cache": cache_obj.name,
               "profile": prof.name, **summary, **(extra or {})}
    if frontend_s:
        summary["frontend_ms"] = float(frontend_s) * 1000
    if scrape_s_per_label:
        summary["scrape_us_per_label"] = float(scrape_s_per_label) * 1e6
    if serving_s_per_running:
        summary["serving_us_per_running"] = float(serving_s_per_running) * 1e6
    if rank_tile_cost is not None:
        summary["rank_tile_cost"] = float(rank_tile_cost)
    note = nothing_admitted_note(eng, summary, scheduler_obj) or stranded_note(eng, summary, scheduler_obj)
    if note is not None:  # (the summary's latencies are empty: say why, in the summary and as a warning)
        summary["note"] = note
        warnings.warn(note, NothingAdmittedWarning, stacklevel=2)
    return SimResult(summary, eng)
