"""``twin configure search``: the twin used directly as the optimiser (no trained model).

For each scenario (rate triple x rank triple), the twin walks the configuration grid exactly as a
sweep task does (:func:`twin.sweep.walk.run_task`) and the optimum rule picks the configuration.
Results are cached in a sweep directory (shards named by their task's content), so a second
search of the same scenario with the same profile and grid costs nothing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from traces.registry import MAX_REQUESTS
from traces.arrivals import parse_arrival
from twin.sweep.grid import PUBLISHED_GRID, GridSpec
from twin.sweep.grid import add_workload, check_workload_served, scenario_key
from twin.sweep.workload_scenario import load_workload_scenario
from twin.configurator.labels import label_scenarios
from twin.sweep import runner

DEFAULT_CACHE = Path("sweeps") / "search-cache"


def search_grid(scenarios: Iterable[tuple[list[float], list[int]]], profile: str | None, window_s: float = 3600.0,
                served: Iterable[int] = PUBLISHED_GRID, slots: Iterable[int] = PUBLISHED_GRID,
                seeds: Iterable[int] = (0,), lengths: tuple[float, float] = (222.0, 197.0),
                policy: str = "fcfs+client-cap", model: str = "", length_corr: float = 0.0,
                serving_us: float = 0.0, rank_tile_cost: float | None = None, arrival: str = "poisson",
                workload: str | None = None) -> GridSpec:
    """A grid holding exactly the given scenarios (no cross product of rates and ranks); ``arrival``: each
    adapter's arrival process (:attr:`GridSpec.arrival`, ``poisson`` or ``gamma:CV``); ``length_corr``:
    the request pools' prompt-output length coupling (:attr:`GridSpec.length_corr`); ``serving_us``: the
    serving path's host time (:attr:`GridSpec.serving_us`); ``rank_tile_cost``: the LoRA shrink's rank
    tiles beyond the first (:attr:`GridSpec.rank_tile_cost`; None: the profile's own)."""
    sc = list(scenarios)
    g = GridSpec(name="search", profile=profile, window_s=float(window_s), seeds=[int(s) for s in seeds],
                 served=sorted(int(x) for x in served), slots=sorted(int(x) for x in slots),
                 lengths=[[float(lengths[0]), float(lengths[1])]], policy=[policy], model=model,
                 arrival=[parse_arrival(arrival).name],
                 length_corr=float(length_corr), serving_us=float(serving_us),
                 rank_tile_cost=None if rank_tile_cost is None else float(rank_tile_cost))
    g.rates = [list(x) for x in dict.fromkeys(tuple(map(float, r)) for r, _ in sc)]
    g.ranks = [list(x) for x in dict.fromkeys(tuple(map(int, k)) for _, k in sc)]
    if workload is not None:  # a workload file instead of the (rates, ranks) pairs (twin/sweep/workload_scenario.py)
        add_workload(g, {"workload": [str(workload)]}, None)
        for path in g.workloads:
            check_workload_served(g, path, load_workload_scenario(path, g.window_s)["adapters"])
    return g


def check_requests(pairs: list[tuple[list[float], list[int]]], served: Iterable[int], window_s: float) -> None:
    """The search's busiest run (its largest served count at the scenario with the highest mean rate,
    over the window) stays within ``twin run``'s request cap (:data:`traces.registry.MAX_REQUESTS`),
    the rule of a sweep grid: refused before any run, naming the options to lower."""
    mean_rate = max(sum(map(float, r)) / len(r) for r, _ in pairs)
    top = max(int(x) for x in served)
    n = mean_rate * top * float(window_s)
    if n > MAX_REQUESTS:
        raise ValueError(f"--window {window_s:g}: the search's busiest run would be offered ~{n:,.0f} requests "
                         f"({top} served adapters at a mean {mean_rate:g} req/s each over {window_s:g} s), more than "
                         f"the {MAX_REQUESTS:,} a run may hold (the cap of `twin run`); lower --window (e.g. "
                         f"--window 3600, the published runs' hour), --served or --rates")


def _pairs_tasks(g: GridSpec, pairs: list[tuple[list[float], list[int]]]) -> list[dict[str, Any]]:

    want = {scenario_key(r, k, g.lengths[0], g.policy[0], g.arrival[0]) for r, k in pairs}
    out, seen = [], set()
    for t in g.tasks():
        if (g.workloads or t["scenario"]["key"] in want) and t["task_hash"] not in seen:
            seen.add(t["task_hash"])
            out.append(t)
    return out


def check_cache(cache: str | os.PathLike, tasks: list[dict[str, Any]], flag: str = "--cache") -> None:
    """The search's cache ``cache`` is not the directory of a ``twin sweep`` of another grid: a ``sweep.json``
    recording a grid's tasks (:func:`twin.sweep.runner.grid_task_hashes`) of which some of the search's ``tasks``
    are not. Their shards would be mixed into that sweep's (``twin configure dataset`` and ``twin sweep --out`` then
    refuse the directory, :class:`twin.sweep.runner.ForeignShards`), so the search is refused before any run,
    naming ``flag`` (the option that gave the cache). A cache of the search's own (no ``sweep.json``) or one shared
    by several grids passes, and so does a sweep whose grid holds every task of the search (its shards are reused)."""
    p = Path(cache)
    try:
        hashes = runner.grid_task_hashes(p)
    except ValueError as e:  # (sweep.json of no sweep: its message names twin sweep's --out)
        raise ValueError(f"{flag} {cache}: {str(e).split('; use another --out')[0]}; give another {flag} (a "
                         f"directory of the search's own, e.g. {DEFAULT_CACHE})") from None
    if hashes is None:
        return
    if any(t["task_hash"] not in hashes for t in tasks):
        name = (runner.read_meta(p).get("grid") or {}).get("name") or "?"
        raise ValueError(f"{flag} {cache}: holds a sweep of another grid ({name}, its sweep.json), whose tasks are "
                         f"not the search's: the search's shards would be mixed into that sweep's rows (`twin "
                         f"configure dataset` and `twin sweep --out {cache}` would then refuse the directory); give "
                         f"another {flag} (a directory of the search's own, e.g. {DEFAULT_CACHE})")


def search(pairs: list[tuple[list[float], list[int]]], profile: str | None, cache: str | os.PathLike | None = None,
           executor: str = "local", jobs: int = 1, rule: str = "throughput90", progress: bool | None = False,
           ttft_p99_s: float | None = None, itl_p99_s: float | None = None,
           on_grid: Callable[[GridSpec], None] | None = None, cache_flag: str = "--cache",
           **grid_kw: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Search every ``(rates, ranks)`` pair; returns ``(labels, runs)``: one label row per scenario
    (and seed) under ``rule``, and the runs behind them. ``ttft_p99_s`` / ``itl_p99_s``: the ``slo``
    rule's percentile SLOs on the runs' summaries (:func:`twin.configurator.labels.label_scenarios`;
    the search's runs record no ``[slo]`` attainment). A search whose busiest run would exceed the
    twin's request cap is refused first (:func:`check_requests`), as is a ``cache`` holding a sweep of another grid
    (:func:`check_cache`; ``cache_flag``: the option that gave it). ``on_grid``: called with the search's grid once it
    is checked, before any run (``configure search`` warns of a window too short for the starvation line there,
    :func:`twin.sweep.grid.window_note`)."""

    if grid_kw.get("workload") is None:  # (a workload file's requests are its own)
        check_requests(pairs, grid_kw.get("served", PUBLISHED_GRID), grid_kw.get("window_s", 3600.0))
    g = search_grid(pairs, profile, **grid_kw)
    tasks = _pairs_tasks(g, pairs)
    cache = Path(cache or DEFAULT_CACHE)
    check_cache(cache, tasks, cache_flag)
    if on_grid is not None:
        on_grid(g)
    done = runner.done_tasks(cache)
    todo = [t for t in tasks if t["task_hash"] not in done]
    if todo:
        _run_tasks(todo, cache, executor, jobs, progress)
    hashes = {t["task_hash"] for t in tasks}
    files = [runner.shard_dir(cache) / f"{h}.parquet" for h in sorted(hashes)]
    runs = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    slo = {k: v for k, v in (("ttft_p99_s", ttft_p99_s), ("itl_p99_s", itl_p99_s)) if v is not None}
    labels = label_scenarios(runs, rule, **slo)
    return labels, runs


def _run_tasks(tasks: list[dict], cache: Path, executor: str, jobs: int, progress: bool | None) -> None:
    """Run the scenario walks not in ``cache`` yet, writing each one's shard. ``progress``: a bar (True),
    nothing (False), or one line on stderr once the first walk is done (None: no terminal to draw a bar
    on, where the search printed nothing for its minutes of twin runs)."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(tasks), unit="scenario", desc="search")
    tasks = sorted(tasks, key=lambda t: -sum(t["scenario"]["rates"]))
    t0, done = time.perf_counter(), 0
    for rows in runner._EXEC[executor](tasks, jobs):
        if rows:
            runner.write_shard(cache, rows[0]["task_hash"], rows)
        done += 1
        if bar is not None:
            bar.update(1)
        elif progress is None and done == 1 and len(tasks) > 1:
            print(f"search: the twin's walk over the grid, 1 of {len(tasks)} scenarios done in "
                  f"{time.perf_counter() - t0:.0f} s with {jobs} worker(s); the rest follows (--jobs N spreads it, "
                  f"--search-cache DIR keeps the runs for the next time)", file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
