"""Diagnostic: where the queueing of ``twin reproduce chameleon-schedulers`` comes from.

The paper (Chameleon MICRO'25 §6) states that at 9 RPS FIFO's small requests spend 28.6 % of
their E2E time queued while Chameleon keeps every class below 8 %. The reproduction measures
each size class's share of E2E spent queued (arrival to first scheduling; size classes of
:func:`twin.reproduce.chameleon.size_class_figures`). This script reruns its set-up (read from the
reproduction's ``summary.json``: workload, profile, length scale, loads, SLO) for S-LoRA and
Chameleon with S-LoRA's admission cadence as it is -- waiting requests are considered only after
``max_wait_tokens`` = 10 decodes since the last prefill (``shared/refs/slora.md`` §2; the twin's
``EngineConfig.slora_max_wait_tokens``) -- and with admission tried after every decode (1, the least
the engine accepts), and prints per load the P99 TTFT, the mean queue time, the mean inter-token
latency and every class's queued share. 8 runs, about 5 s.

    PYTHONPATH=. python benchmarks/chameleon_queueing.py \\
        [--summary results/reproductions/chameleon-schedulers/summary.json] [--loads low,medium]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from twin.compare import load_compare_profile  # noqa: E402
from twin.registry import resolve_policy  # noqa: E402
from twin.reproduce.chameleon import size_class_figures  # noqa: E402
from twin.scenario import RunConfig, build_engine_config, build_workload  # noqa: E402
from twin.simulate import simulate  # noqa: E402


def run_point(run: RunConfig, preset: str, slo_s: float, wait_tokens: int) -> dict:
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    run = dataclasses.replace(run, slora_max_wait_tokens=wait_tokens)  # (twin run --slora-max-wait-tokens)
    cfg = build_engine_config(run, w, prof)
    sched, cache, _ = resolve_policy(preset, None, None)
    if hasattr(sched, "slo_s"):
        sched.slo_s = slo_s  # as the reproduction's runner gives it
    res = simulate(w, prof, cfg, scheduler_obj=sched, cache_obj=cache, ttft_slo_s=slo_s, system="slora")
    return {**res.summary, **size_class_figures(res.requests)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--summary", default=str(ROOT / "results/reproductions/chameleon-schedulers/summary.json"))
    ap.add_argument("--loads", default="low,medium", help="loads of the summary's set-up (low, medium, high)")
    ap.add_argument("--presets", default="slora,chameleon")
    a = ap.parse_args(argv)
    setup = json.loads(Path(a.summary).read_text())["setup"]
    run = RunConfig(trace=setup["workload"], profile=setup["profile"], adapters=setup["adapters"],
                    ranks=list(setup["ranks"]), popularity=setup["popularity"], duration=setup["duration_s"],
                    seed=setup["seed"], slora_prefetch=setup["queued_prefetch"],
                    trace_options=[("length_scale", setup["length_scale"])])
    slo_s = setup["ttft_slo_s"]
    print(f"{'load':<7} {'req/s':>6} {'preset':<10} {'wait':>4} {'P99 TTFT s':>10} {'queue ms':>9} {'ITL ms':>8}  "
          f"queued share by size class (small -> large)")
    for load in a.loads.split(","):
        rps = setup["loads_rps"][load]
        for preset in a.presets.split(","):
            for wait in (10, 1):
                s = run_point(dataclasses.replace(run, rps=rps), preset, slo_s, wait)
                k = len(s["size_class_cuts"]) + 1
                shares = " / ".join(f"{100 * s[f'queued_share_class{c}']:.1f} %" for c in range(1, k + 1))
                print(f"{load:<7} {rps:6.2f} {preset:<10} {wait:>4} {s['ttft_ms_p99'] / 1000:10.2f} "
                      f"{s['queue_ms_mean']:9.0f} {s['itl_ms_mean']:8.1f}  {shares}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
