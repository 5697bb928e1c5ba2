"""Diagnostic: where the Chameleon reproduction's memory becomes "mostly full, nothing cached".

The paper (Chameleon MICRO'25 §6.1; ``shared/refs/chameleon.md`` §5) reports that "from about
12.5 RPS memory is mostly full and nothing is cached" (S-LoRA's knee is 8.6 RPS, so about 1.45x
it) and that Chameleon caches at its medium load (8 RPS, 0.93x). This script checks the twin's
set-up against those facts: at a given length scale it measures S-LoRA's knee and the TTFT SLO as
``twin reproduce chameleon-fig11`` does (:func:`twin.reproduce.chameleon.reference`), then runs
each preset at the given fractions of that knee and prints how the unified pool is used
(:func:`twin.reproduce.base.pool_shares`): the mean share in use, the mean share held by cached
adapters that no running request uses, the share of time in which they hold under 5 % ("nothing
is cached"), the requests' own peak (KV + running requests' adapters) and the requests that
found their adapter resident. ``--occupancy-at`` also samples, at those fractions, what holds the
pool and what bounds admission (:func:`occupancy`): S-LoRA's reservations, resident and cached
adapters, and Chameleon's quota tokens held.

    PYTHONPATH=. python benchmarks/chameleon_memory.py --length-scale 0.1305 \\
        --fractions 0.7,0.93,1.0,1.05,1.2,1.45 --occupancy-at 1.2 --cache /tmp/points
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from twin.config import ConfigError  # noqa: E402
from twin.reproduce import chameleon  # noqa: E402
from twin.reproduce.base import Runner  # noqa: E402
from twin.reproduce.point_cache import PointCache  # noqa: E402
from twin.scenario import RunConfig  # noqa: E402

def occupancy(run: RunConfig, preset: str, slo_s: float, every_s: float = 0.5, warmup_s: float = 60.0) -> dict:
    """Time means (after ``warmup_s``, sampled every ``every_s`` s with timed engine events, which
    leave the run unchanged) of what holds the pool and what admission is bounded by: S-LoRA's
    reservations (its peak-future KV, ``reservation_need``), resident adapters, idle cached
    adapters, and for Chameleon the tokens its queues hold against their quotas over ``Tok_total``."""
    import numpy as np

    from twin.compare import load_compare_profile
    from twin.registry import resolve_policy
    from twin.scenario import build_engine_config, build_workload
    from twin.simulate import ENGINES
    from twin.slora_engine import reservation_need

    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    sched, cache, _ = resolve_policy(preset, None, None)
    if hasattr(sched, "slo_s"):
        sched.slo_s = slo_s
    eng = ENGINES["slora"](w, prof, build_engine_config(run, w, prof), sched, cache, record_steps=False)
    rows: list[tuple[float, ...]] = []

    def sample(now: float) -> None:
        n = eng.kv_tokens
        quota = sum(sched.used) / sched.capacity_tokens() if hasattr(sched, "capacity_tokens") else float("nan")
        rows.append((now, reservation_need(eng._running_pairs()) / n, eng.adapters.placement.adapter_blocks / n,
                     eng.reclaimable_blocks() / n, quota, len(eng.running), eng.n_waiting))
        if eng.arr_ptr < eng.n or eng.n_waiting or eng.running:
            eng.push_event(now + every_s, sample)

    eng.push_event(every_s, sample)
    eng.run()
    a = np.array(rows)
    a = a[(a[:, 0] > warmup_s) & (a[:, 0] <= run.duration)]
    return {"reserved": a[:, 1].mean(), "adapters": a[:, 2].mean(), "cached": a[:, 3].mean(),
            "reserved+running_adapters": (a[:, 1] + a[:, 2] - a[:, 3]).mean(), "quota_held": a[:, 4].mean(),
            "running": a[:, 5].mean(), "waiting": a[:, 6].mean()}


COLUMNS = ("mem_use_mean", "cache_share_mean", "cache_empty_time", "mem_demand_peak", "mem_use_peak",
           "adapter_hit_rate_requests")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length-scale", type=float, required=True, help="the workload's length scale (e.g. 0.1305)")
    p.add_argument("--fractions", default="0.7,0.93,1.0,1.05,1.2,1.45",
                   help="loads as fractions of S-LoRA's knee at that scale")
    p.add_argument("--presets", default="slora,chameleon")
    p.add_argument("--quick", action="store_true", help="the reproduction's --quick effort (120 s runs)")
    p.add_argument("--occupancy-at", default=None, metavar="FRACTIONS",
                   help="also sample what holds the pool at these fractions of the knee (:func:`occupancy`)")
    p.add_argument("--cache", default=None, metavar="DIR", help="point cache shared with twin reproduce --cache")
    a = p.parse_args(argv)
    try:
        fractions = [float(x) for x in a.fractions.split(",")]
        if not a.length_scale > 0 or not all(f > 0 for f in fractions):
            raise ValueError
    except ValueError:
        print("chameleon_memory: --length-scale and --fractions take positive numbers, e.g. --fractions 0.93,1.45",
              file=sys.stderr)
        return 2
    effort = chameleon.QUICK if a.quick else chameleon.FULL
    runner = Runner(cache=PointCache(Path(a.cache)) if a.cache else False)
    run = RunConfig(trace=chameleon.WORKLOAD, profile=chameleon.PROFILE, adapters=chameleon.ADAPTERS,
                    ranks=list(chameleon.RANKS), popularity=chameleon.POPULARITY, duration=effort.duration_s,
                    seed=0, slora_prefetch=chameleon.QUEUED_PREFETCH)
    run = chameleon.at_scale(run, a.length_scale)
    try:
        ref = chameleon.reference(runner, run, chameleon.BASELINE, effort)
        knee = ref["knee"].rate
        print(f"length scale {a.length_scale:g}: TTFT SLO {ref['slo_s']:.2f} s, S-LoRA's knee {knee:.3g} req/s")
        print("preset,fraction,rps,p99_ttft_s," + ",".join(COLUMNS))
        for f in fractions:
            for preset in a.presets.split(","):
                s = runner.point(run, preset, f * knee, slo_s=ref["slo_s"], memory=True)
                cells = ["" if s.get(c) is None else f"{s[c]:.3f}" for c in COLUMNS]
                print(f"{preset},{f:g},{f * knee:.2f},{s['ttft_ms_p99'] / 1000:.2f}," + ",".join(cells), flush=True)
        for f in [float(x) for x in a.occupancy_at.split(",")] if a.occupancy_at else []:
            for preset in a.presets.split(","):
                occ = occupancy(dataclasses.replace(run, rps=f * knee), preset, ref["slo_s"])
                print(f"occupancy {preset} at {f:g} x the knee (means, share of the pool; quota_held: of Tok_total): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in occ.items()), flush=True)
    except ConfigError as err:
        print(f"chameleon_memory: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
