"""One sweep task: a scenario's walk over its configurations.

For each slot value (ascending), served adapters are walked upwards; a configuration that fails
the start-up check is recorded (``status = start_failure``) and skipped; with ``early_stop_walk``
the walk of a slot value stops after its first starving run (throughput < ``ratio`` x offered),
because the ``throughput90`` rule never looks past it. The first run of a slot walk is always run
to the end (the rule keeps it, with its throughput, when it starves); later runs may stop early
(:func:`twin.sweep.scenario.run_config`).
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from traces.arrivals import parse_arrival
from twin.simulate import collect_run_garbage
from twin.sweep.scenario import run_config


def scenario_columns(sc: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    if sc.get("workload"):  # a workload file: its features over its adapters (twin/sweep/workload_scenario.py)
        extra = {k: float(sc[k]) for k in ("serving_us", "rank_tile_cost") if sc.get(k) is not None}
        return {"scenario": sc["key"], "workload": sc["workload"], "workload_sha256": sc["workload_sha256"],
                "rates": "", "ranks": "-".join(str(int(r)) for r in sc["ranks"]), **sc["features"],
                "arrival": sc["arrival"], "policy": sc.get("policy") or "fcfs+client-cap", **extra}
    rates = np.asarray(sc["rates"], float)
    ranks = np.asarray(sc["ranks"], float)
    coupling = {"length_corr": float(sc["length_corr"])} if sc.get("length_corr") else {}  # absent: 0
    if sc.get("serving_us"):
        coupling["serving_us"] = float(sc["serving_us"])
    if sc.get("rank_tile_cost") is not None:
        coupling["rank_tile_cost"] = float(sc["rank_tile_cost"])
    return {"scenario": sc["key"], "rates": "-".join(_f(r) for r in sc["rates"]),
            "ranks": "-".join(str(int(r)) for r in sc["ranks"]),
            "rate_max": float(rates.max()), "rate_min": float(rates.min()), "rate_mean": float(rates.mean()),
            "rate_std": float(rates.std()), "rank_max": float(ranks.max()), "rank_min": float(ranks.min()),
            "rank_mean": float(ranks.mean()), "rank_std": float(ranks.std()),
            "mean_input_tokens": float(sc["lengths"][0]), "mean_output_tokens": float(sc["lengths"][1]),
            "arrival": sc.get("arrival", "poisson"), "arrival_cv": parse_arrival(sc.get("arrival", "poisson")).cv,
            "policy": sc.get("policy", "fcfs+client-cap"), **coupling}


def _f(x: float) -> str:
    s = repr(float(x))
    return s[:-2] if s.endswith(".0") else s


def run_task(task: dict[str, Any]) -> list[dict[str, Any]]:
    """Run one task (a dict from :meth:`twin.sweep.grid.GridSpec.tasks`); returns its rows."""

    sc = task["scenario"]
    base = scenario_columns(sc)
    base.update(task_id=task["task_id"], task_hash=task["task_hash"])
    rows: list[dict[str, Any]] = []
    for g in task["slots"]:
        first = True
        for n in task["served"]:
            if g > n:
                continue
            t0 = time.perf_counter()
            try:
                r = run_config(sc, n, g, task["max_rank"], seed=task["seed"], window_s=task["window_s"],
                               profile=task["profile"], policy=sc.get("policy"),
                               early_stop=bool(task.get("early_stop_run")) and not first,
                               ratio=task.get("ratio", 0.9), ttft_slo_s=task.get("ttft_slo_s"),
                               tbt_slo_s=task.get("tbt_slo_s"), engine_overrides=task.get("engine") or None)
            except Exception as e:  # noqa: BLE001 -- recorded, the walk goes on
                r = {"served_adapters": n, "adapter_slots": g, "max_lora_rank": task["max_rank"],
                     "seed": task["seed"], "status": "error", "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc(limit=3), "wall_s": time.perf_counter() - t0}
            finally:
                collect_run_garbage()  # (the engine's reference cycles hold a run's arrays until collected)
            r.update(base)
            r["walk_index"] = len(rows)
            rows.append(r)
            if r.get("status") != "ok":
                continue
            first = False
            if task.get("early_stop_walk", True) and r.get("starving"):
                break
    return rows
