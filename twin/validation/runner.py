"""The whole validation (:func:`run_validation`): load, select, re-create every run in a
process pool, score.

Runs are independent: each worker process re-creates runs with
:func:`twin.validation.recreate.simulate_run` (the profile loaded once per process), longest
first so the pool's tail is short. A run whose simulation raises is reported in its row
(``twin_status`` ``error``, column ``error``) and the validation goes on.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from policies.client_cap import CLIENT_MAX_INFLIGHT
from traces.arguments import cell_error
from traces.lengths import LengthError
from twin.simulate import collect_run_garbage
from twin.validation.profiles import cached_profile, check_profile_model, profile_of_runs
from twin.validation.recreate import sharegpt_model, simulate_run
from twin.validation.scoring import score, summarize
from twin.validation.specs import (FRONTEND_LATENCY_S, PROMPT_OUTPUT_CORR, RANK_TILE_COST, SCRAPE_S_PER_LABEL,
                                   SERVING_S_PER_RUNNING, START_FAILURE_STATUSES, RunSpec, attach_peer,
                                   default_peer_csv, default_real_csv, load_peer, load_real, select_runs, spec_from_row,
                                   warn_unscored_figures)


@dataclass
class ValidationResult:
    runs: pd.DataFrame            # one row per real run (real, twin, peer figures, SMAPE terms)
    summary: dict[str, Any]
    wall_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)


def _worker(args: tuple[dict, dict]) -> dict[str, Any]:
    spec_d, opts = args
    spec = RunSpec(**spec_d)
    try:
        return simulate_run(spec, **opts)
    except Exception as e:  # noqa: BLE001 -- reported per run, the validation goes on
        return {"run_id": spec.run_id, "twin_status": "error", "error": f"{type(e).__name__}: {e}"}
    finally:
        collect_run_garbage()  # (the engine's reference cycles hold a run's arrays until collected)


def _progress_bar(total: int):
    from tqdm import tqdm  # optional dependency, only for a progress bar

    return tqdm(total=total, unit="run", desc="validating", leave=False)


def run_all(specs: list[RunSpec], sim_opts: dict[str, Any], jobs: int, progress: bool) -> list[dict[str, Any]]:
    """:func:`simulate_run` of every spec with ``sim_opts``, in ``jobs`` worker processes."""
    # longest runs first so the pool's tail is short
    order = sorted(specs, key=lambda s: -(s.requests_sent or s.nominal_requests))
    tasks = [(asdict(s), sim_opts) for s in order]
    bar = _progress_bar(len(tasks)) if progress and tasks else None
    out: list[dict[str, Any]] = []
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            out.append(_worker(t))
            bar and bar.update(1)
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(min(jobs, len(tasks))) as pool:  # (no idle workers)
            for r in pool.imap_unordered(_worker, tasks, chunksize=1):
                out.append(r)
                bar and bar.update(1)
    if bar is not None:
        bar.close()
    return out


def check_pool_lengths(real: pd.DataFrame, sel: pd.DataFrame, real_csv: str | os.PathLike, length_corr: float) -> None:
    """Every selected run with status ``ok`` has pool mean lengths the ShareGPT-like length model can
    draw (:func:`twin.validation.recreate.sharegpt_model`, cached: the worker processes forked later
    reuse the models); otherwise an error naming the row, before any run (the run alone failed, after
    the others were simulated). ``sel``: rows of ``real``, whose index is the rows' position in ``real_csv``."""
    for i, row in zip(sel.index.tolist(), sel.itertuples(index=False)):
        if row.status != "ok":
            continue
        try:
            sharegpt_model(float(row.pool_mean_input_tokens), float(row.pool_mean_output_tokens), length_corr)
        except LengthError as e:
            col = "pool_mean_input_tokens" if "prompt mean" in str(e) else "pool_mean_output_tokens"
            raise cell_error(real_csv, real, i, col, f"cannot be drawn by the ShareGPT-like length model ({e})",
                             "fix the row or leave it out of the table") from None


def run_validation(real_csv: str | os.PathLike | None = None, peer_csv: str | os.PathLike | None | bool = None,
                   profile: str | None = None, jobs: int = 1, limit: int | None = None, filt: str | None = None,
                   seed: int = 0, use_sent: bool = True, progress: bool = False,
                   data_dir: str | os.PathLike | None = None,
                   client_cap: int | None = CLIENT_MAX_INFLIGHT, preload_cpu: bool = True,
                   run_ids: Iterable[str] | None = None,
                   length_corr: float = PROMPT_OUTPUT_CORR,
                   frontend_s: float = FRONTEND_LATENCY_S,
                   scrape_s_per_label: float = SCRAPE_S_PER_LABEL,
                   serving_s_per_running: float = SERVING_S_PER_RUNNING,
                   rank_tile_cost: float | None = RANK_TILE_COST) -> ValidationResult:
    """Re-create the runs of ``real_csv`` with the twin and score them (see :mod:`twin.validation`).

    ``peer_csv``: the published twin's predictions (None: the ``peer_twin_*.csv`` beside the real
    file; False: none). ``jobs``: worker processes (runs are independent). ``client_cap`` and
    ``preload_cpu`` go to the scheduler ``fcfs+client-cap`` (:mod:`policies.client_cap`).
    ``length_corr``: prompt-output length coupling of the re-created pools (0: independent).
    ``frontend_s``: the requests' front-end latency outside the engine (0: the engine's times).
    ``scrape_s_per_label``: the metrics scrape's stall per LoRA label series (0: none).
    ``serving_s_per_running``: the serving path's host time per running request and step (0: none).
    ``rank_tile_cost``: the LoRA shrink's rank tiles beyond the first, relative to the first (None: the
    profile's own)."""
    t0 = time.perf_counter()
    real_csv = Path(real_csv) if real_csv else default_real_csv(data_dir)
    real = load_real(real_csv)
    warn_unscored_figures(real, real_csv)
    if peer_csv is None:
        peer_csv = default_peer_csv(real_csv)
    peer = load_peer(peer_csv) if peer_csv else None
    real = attach_peer(real, peer)
    sel = select_runs(real, filt, limit, run_ids=run_ids)
    if not len(sel):
        raise ValueError(f"no run of {real_csv} matches the selection (filter {filt!r}, limit {limit})")
    profile = profile_of_runs(sel, profile, f"the selected runs of {real_csv}")
    prof = cached_profile(profile)
    check_profile_model(prof, sel)
    if rank_tile_cost is not None:
        try:
            prof.with_rank_tile_cost(rank_tile_cost)
        except ValueError:  # (twin validate applies its fitted default unless told otherwise: say how to turn it off)
            lo = prof.components["lora"]
            raise ValueError(f"rank tile cost {rank_tile_cost:g} (twin validate's default unless --rank-tile-cost is "
                             f"given): profile {profile or prof.name!r} prices LoRA with the {lo.form!r} form, which "
                             f"has no rank tiles (only vLLM 0.8.5's kernel_grid form does); give --rank-tile-cost "
                             f"profile (or 1) with this profile") from None
    specs = [spec_from_row(row, seed, use_sent, length_corr, frontend_s, scrape_s_per_label, serving_s_per_running,
                           rank_tile_cost)
             for _, row in sel.iterrows()
             if row["status"] == "ok" or row["status"] in START_FAILURE_STATUSES]
    if not specs:
        statuses = sel["status"].astype(object).fillna("(empty)").astype(str)  # (an empty cell: NaN, not counted)
        counts = ", ".join(f"{k} {v}" for k, v in statuses.value_counts().items())
        raise ValueError(f"none of the {len(sel)} selected runs of {real_csv} can be scored (statuses: {counts}); "
                         f"the twin re-creates runs with status ok and start failures "
                         f"({', '.join(START_FAILURE_STATUSES)}): select some of those")
    check_pool_lengths(real, sel, real_csv, length_corr)
    sim_opts = dict(profile_name=profile, client_cap=client_cap, preload_cpu=preload_cpu)
    results = run_all(specs, sim_opts, jobs, progress)
    tw = pd.DataFrame(results) if results else pd.DataFrame({"run_id": []})
    runs = score(sel.merge(tw, on="run_id", how="left"))
    summary = summarize(runs, prof.name, str(real_csv), str(peer_csv) if peer_csv else None, serving_s_per_running,
                        rank_tile_cost)
    summary["wall_s"] = time.perf_counter() - t0
    opts = dict(real=str(real_csv), peer=str(peer_csv) if peer_csv else None, profile=prof.name, jobs=jobs,
                limit=limit, filter=filt, seed=seed, use_sent=use_sent, client_cap=client_cap,
                preload_cpu=preload_cpu, length_corr=length_corr, frontend_s=frontend_s,
                scrape_s_per_label=scrape_s_per_label, serving_s_per_running=serving_s_per_running,
                rank_tile_cost=rank_tile_cost)
    summary["options"] = opts
    return ValidationResult(runs, summary, summary["wall_s"], opts)
