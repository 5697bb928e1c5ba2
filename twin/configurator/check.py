"""The twin's check of a configurator's recommendation (``twin configure predict --check``).

A trained configurator is a surrogate of the twin's own optimum rule (``throughput90``: the most
served adapters whose run still serves at least 90 % of the offered tokens; see
:mod:`twin.configurator.labels`). Between its training scenarios it interpolates, and where it
overshoots the twin's optimum its recommendation starves *in the twin itself*. The check runs the
twin at the recommended configuration, exactly as a sweep walk runs it
(:func:`twin.sweep.scenario.run_config`, the same scenario key, seed and maximum rank as
``twin configure search``), and while that run starves (or the configuration fails vLLM's
start-up check) it steps the served adapters down the grid, one value at a time, at the same slot
value, as the rule's walk of that slot value would have stopped: never below served = slots, whose run
the rule keeps even when it starves (an overloaded scenario). A configuration that fails vLLM's start-up
check (the rule never picks one) steps the slots down instead, keeping the served adapters. It never steps up: it only removes recommendations that break the
rule the model was trained to follow; it is not a search (``twin configure search`` is), and it costs
one simulated hour per step (about 2 CPU-s on the shipped Llama profile).

Runs already made (a search's walk over the same scenario, or an earlier check) are reused through
``known``: a walk run at the same configuration is the same run (same seed, workload and engine);
a walk run stopped early by the throughput bound is known to starve (the bound is exact,
:func:`twin.sweep.scenario.throughput_upper_bound`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from twin.configurator.labels import run_ratio
from twin.configurator.search import _pairs_tasks, search_grid
from twin.sweep.grid import PUBLISHED_GRID
from twin.sweep.scenario import DEFAULT_LENGTHS, DEFAULT_POLICY, START_FAILURE_STATUSES, run_config

#: (scenario key, served adapters, slots) -> the run's row (``status``, ``starving``, ratios)
Known = dict
#: statuses of a configuration that does not start: the sweep's own and the real table's
NO_START = ("start_failure", *START_FAILURE_STATUSES)


def step_down(served: int, slots: int, served_grid: Iterable[int]) -> tuple[int, int] | None:
    """The next configuration the check tries after a starving run: the largest served value of the
    grid below ``served`` and not below ``slots`` (the same slot value: the rule's walk of a slot value
    starts at served = slots and keeps that first run even when it starves); ``None`` when there is none."""
    lower = [n for n in sorted(set(int(x) for x in served_grid)) if slots <= n < served]
    return (lower[-1], int(slots)) if lower else None


def step_down_slots(served: int, slots: int, slot_grid: Iterable[int]) -> tuple[int, int] | None:
    """The next configuration the check tries after one that does not start (vLLM's start-up check
    refuses it: the slots' LoRA buffers at the maximum rank leave too little KV): the largest slot
    value of the grid below ``slots``, the same served adapters; ``None`` when there is none."""
    lower = [g for g in sorted(set(int(x) for x in slot_grid)) if g < slots]
    return (int(served), lower[-1]) if lower else None


def scenario_task(rates: list[float], ranks: list[int], profile: str | None, *, window_s: float = 3600.0,
                  policy: str = DEFAULT_POLICY, lengths: tuple[float, float] = DEFAULT_LENGTHS,
                  seed: int = 0, serving_us: float = 0.0, rank_tile_cost: float | None = None,
                  arrival: str = "poisson", workload: str | None = None,
                  served_grid: Iterable[int] = PUBLISHED_GRID,
                  slot_grid: Iterable[int] = PUBLISHED_GRID) -> dict[str, Any]:
    """The task ``twin configure search`` would run for this scenario (its scenario dict, seed,
    maximum rank, window and profile), so that a check's run equals the search walk's run;
    ``serving_us`` / ``rank_tile_cost``: the engine constants of the search
    (:attr:`twin.sweep.grid.GridSpec.serving_us`, :attr:`~twin.sweep.grid.GridSpec.rank_tile_cost`).
    ``workload``: a workload file's scenario instead of ``rates`` / ``ranks`` (``configure search --workload``'s:
    :mod:`twin.sweep.workload_scenario`; ``served_grid`` and ``slot_grid`` then hold values the file can serve)."""
    pairs = [] if workload is not None else [(list(map(float, rates)), list(map(int, ranks)))]
    g = search_grid(pairs, profile, window_s=window_s, policy=policy, lengths=lengths, seeds=(seed,),
                    serving_us=serving_us, rank_tile_cost=rank_tile_cost, arrival=arrival, workload=workload,
                    served=served_grid, slots=slot_grid)
    tasks = _pairs_tasks(g, pairs)
    if not tasks:  # pragma: no cover -- search_grid holds exactly this scenario
        raise ValueError(f"no task for rates {rates} and ranks {ranks}")
    return tasks[0]


def known_from_runs(runs) -> Known:
    """``known`` rows from sweep or search runs (a DataFrame of their rows)."""
    out: Known = {}
    if runs is None or not len(runs):
        return out
    for r in runs.to_dict(orient="records"):
        if r.get("status") == "ok" or r.get("status") in NO_START:
            out[(r["scenario"], int(r["served_adapters"]), int(r["adapter_slots"]))] = r
    return out


def check_recommendation(rates: list[float], ranks: list[int], served: int, slots: int, profile: str | None, *,
                         served_grid: Iterable[int] = PUBLISHED_GRID, slot_grid: Iterable[int] = PUBLISHED_GRID,
                         policy: str = DEFAULT_POLICY, lengths: tuple[float, float] = DEFAULT_LENGTHS,
                         window_s: float = 3600.0, seed: int = 0, ratio: float = 0.9,
                         known: Known | None = None, serving_us: float = 0.0,
                         rank_tile_cost: float | None = None, arrival: str = "poisson",
                         workload: str | None = None) -> dict[str, Any]:
    """Check ``(served, slots)`` in the twin and step the served adapters down while it starves.

    ``serving_us`` / ``rank_tile_cost``: the twin's engine constants, as ``twin configure search`` takes them
    (0 / None: the calibrated engine, as the shipped sweeps); ``known`` must hold runs made with the same.

    Returns ``served_adapters`` and ``adapter_slots`` (the checked recommendation), ``changed``,
    ``throughput_tok_s`` (the twin's at the checked configuration; NaN if it does not start),
    ``starving`` (True when the check ends on a starving run, the one at served = slots, or on a
    configuration that does not start with no smaller slot value left) and
    ``steps``: one dict per configuration tried (``served_adapters``, ``adapter_slots``, ``status``,
    ``ratio`` (throughput / offered), ``ratio_is_upper_bound``, ``starving``, ``simulated``: False
    when the run came from ``known``; ``startup_reason`` on a configuration that does not start). New
    runs are added to ``known`` when it is given.

    ``workload``: check the scenario of a workload file (``predict --workload``; ``rates`` / ``ranks`` unused): a
    run at ``N`` served adapters replays ``N`` of its adapters, as ``configure search --workload`` does;
    ``served_grid`` and ``slot_grid`` must then stay within its adapters."""
    task = scenario_task(rates, ranks, profile, window_s=window_s, policy=policy, lengths=lengths, seed=seed,
                         serving_us=serving_us, rank_tile_cost=rank_tile_cost, arrival=arrival, workload=workload,
                         **({"served_grid": served_grid, "slot_grid": slot_grid} if workload is not None else {}))
    sc = task["scenario"]
    key = sc["key"]
    known = {} if known is None else known
    n, g = int(served), int(slots)
    steps: list[dict[str, Any]] = []
    while True:
        r = known.get((key, n, g))
        simulated = r is None
        if simulated:
            # early stop is exact for the starving decision; a run that does not starve runs to the end
            r = run_config(sc, n, g, task["max_rank"], seed=task["seed"], window_s=task["window_s"],
                           profile=task["profile"], policy=sc.get("policy"), early_stop=True, ratio=ratio)
            r["scenario"] = key
            known[(key, n, g)] = r
        status = str(r.get("status"))
        if status == "ok":
            q, upper = run_ratio(r)
            starving = bool(q < ratio)
        elif status in NO_START:
            q, upper, starving = math.nan, False, True
        else:  # an error inside the twin: not a verdict on the configuration
            raise RuntimeError(f"twin check of {key} at {n} served / {g} slots failed: {r.get('error', status)}")
        steps.append({"served_adapters": n, "adapter_slots": g, "status": status, "ratio": q,
                      "ratio_is_upper_bound": upper, "starving": starving, "simulated": simulated,
                      "cpu_s": float(r.get("cpu_s", 0.0) or 0.0) if simulated else 0.0})
        if status in NO_START and r.get("startup_reason"):
            steps[-1]["startup_reason"] = str(r["startup_reason"])
        if status in NO_START:
            nxt = step_down_slots(n, g, slot_grid)
        else:
            nxt = step_down(n, g, served_grid) if starving else None
        if nxt is None:
            break
        n, g = nxt
    last = steps[-1]
    tp = math.nan
    if last["status"] == "ok" and not last["ratio_is_upper_bound"]:
        tp = float(known[(key, n, g)]["total_tok_s"])
    return {"served_adapters": n, "adapter_slots": g, "changed": (n, g) != (int(served), int(slots)),
            "throughput_tok_s": tp, "starving": bool(last["starving"]), "steps": steps, "scenario": key,
            "profile": task["profile"], "window_s": task["window_s"], "ratio_line": ratio}
