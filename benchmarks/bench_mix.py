"""Speed of the twin over the validation mix: a fixed subset of the dev validation runs.

``twin validate`` re-creates every one-hour vLLM 0.8.5 run of the real-run table; the sweeps
of the configurator run tens of thousands of such hours, so this mix is what users wait for.
This benchmark re-creates :data:`RUNS`, ten of the ``dt_modelling`` (dev) runs that start,
chosen to span the mix: ranks 16 and 32, both rate sets (0.1/0.05/0.025 and 1.6/0.8/0.4
req/s per adapter), 8 to 384 served adapters, 8 to 192 slots, from 1.7 k to 1.0 M arrivals
(the kept-up and the overloaded runs; the mean of their published ``sim_wall_s`` is within
10 % of the whole dev mix's). Each run is built exactly as ``twin validate`` builds it
(:mod:`twin.validation.recreate`: workload, engine settings, ``fcfs+client-cap`` and LRU, the serving
path's host time per running request)
and simulated with per-step recording off; only the simulation is timed (workload
generation is not).

Prints one line per run (``run=<id> wall_s=<median> arrivals=<n> steps=<n> segments=<n>``),
then ``mean_wall_per_hour=<s>`` (the mean over the runs of the median wall-clock seconds
per simulated hour), ``mean_cpu_per_hour=<s>`` (the same in CPU seconds of this process:
steadier than wall-clock time on a shared machine) and ``slowest_run=<id> wall_per_hour=<s>``. Needs the real data
(``TWIN_DATA_DIR``).

    python benchmarks/bench_mix.py              # one pass
    python benchmarks/bench_mix.py --repeat 3   # median of three per run
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The fixed subset (run ids ``source/scenario/run_dir`` of the real-run table).
RUNS = (
    "dt_modelling/rank_16_rates_0.1_0.05_0.025/_8_8_16_",
    "dt_modelling/rank_32_rates_0.1_0.05_0.025/_8_64_32_",
    "dt_modelling/rank_32_rates_0.1_0.05_0.025/_32_192_32_",
    "dt_modelling/rank_16_rates_0.1_0.05_0.025/_128_128_16_",
    "dt_modelling/rank_16_rates_0.1_0.05_0.025/_8_384_16_",
    "dt_modelling/rank_32_rates_1.6_0.8_0.4/_32_32_32_",
    "dt_modelling/rank_16_rates_1.6_0.8_0.4/_64_64_16_",
    "dt_modelling/rank_16_rates_1.6_0.8_0.4/_8_128_16_",
    "dt_modelling/rank_16_rates_1.6_0.8_0.4/_192_384_16_",
    "dt_modelling/rank_32_rates_1.6_0.8_0.4/_64_320_32_",
)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="timed simulations per run; the median counts (default 1)")
    ap.add_argument("--runs", type=int, default=len(RUNS), help=f"only the first N runs of the subset (default "
                                                               f"{len(RUNS)})")
    ap.add_argument("--max-run-steps", type=int, default=None, help="engine max_run_steps (1: no run skipping)")
    ap.add_argument("--serving-us", type=float, default=None,
                    help="the serving path's host time per running request and step in microseconds (default: twin "
                         "validate's; 0 gives the re-creations from before it, for comparing engine speed across it)")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {a.repeat}")
    if not 1 <= a.runs <= len(RUNS):
        ap.error(f"--runs must be between 1 and {len(RUNS)}, got {a.runs}")
    return a


def load_specs(n: int) -> list:
    from twin.validation.specs import attach_peer, default_real_csv, load_real, select_runs, spec_from_row

    try:
        csv = default_real_csv()
    except FileNotFoundError as e:
        raise SystemExit(f"bench_mix needs the real validation table: {e}")
    real = attach_peer(load_real(csv), None)
    sel = select_runs(real, run_ids=RUNS[:n]).set_index("run_id")
    missing = [r for r in RUNS[:n] if r not in sel.index]
    if missing:
        raise SystemExit(f"bench_mix: runs {missing} are not in {csv}; the subset names runs of the dev table")
    return [spec_from_row({**sel.loc[r].to_dict(), "run_id": r}) for r in RUNS[:n]]


def run_once(spec, max_run_steps: int | None, serving_us: float | None = None) -> dict:
    from twin.registry import make_cache, make_scheduler
    from twin.simulate import simulate
    from twin.validation.profiles import cached_profile
    from twin.validation.recreate import SCHEDULER, build_config, build_workload

    prof = cached_profile(None)
    wl, _ = build_workload(spec)
    cfg = build_config(spec)
    sched = make_scheduler(SCHEDULER)
    gc.collect()
    c0 = time.process_time()
    res = simulate(wl, prof, cfg, scheduler_obj=sched, cache_obj=make_cache("lru"), horizon_s=spec.window_s,
                   record_steps=False, max_run_steps=max_run_steps,
                   serving_s_per_running=spec.serving_s_per_running if serving_us is None else serving_us * 1e-6)
    cpu = time.process_time() - c0
    s = res.summary
    return {"wall_s": s["wall_s"], "cpu_s": cpu, "arrivals": s["requests_arrived"], "finished": s["requests_finished"],
            "steps": s["engine_steps"], "segments": s["step_segments"], "hours": spec.window_s / 3600.0}


def main(argv: list[str]) -> int:
    a = parse(argv)
    specs = load_specs(a.runs)
    per_hour: dict[str, float] = {}
    cpu_per_hour: dict[str, float] = {}
    for spec in specs:
        walls, cpus = [], []
        for _ in range(a.repeat):
            r = run_once(spec, a.max_run_steps, a.serving_us)
            walls.append(r["wall_s"])
            cpus.append(r["cpu_s"])
        w = statistics.median(walls)
        per_hour[spec.run_id] = w / r["hours"]
        cpu_per_hour[spec.run_id] = statistics.median(cpus) / r["hours"]
        print(f"run={spec.run_id} wall_s={w:.3f} cpu_s={statistics.median(cpus):.3f} arrivals={r['arrivals']} finished={r['finished']} "
              f"steps={r['steps']} segments={r['segments']}", flush=True)
    slowest = max(per_hour, key=per_hour.get)
    print(f"mean_wall_per_hour={statistics.fmean(per_hour.values()):.3f}")
    print(f"mean_cpu_per_hour={statistics.fmean(cpu_per_hour.values()):.3f}")
    print(f"slowest_run={slowest} wall_per_hour={per_hour[slowest]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
