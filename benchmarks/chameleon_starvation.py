"""Diagnostic: per-queue quota, usage and waiting of Chameleon's scheduler over time in a burst.

Issue 15 reports that near the knee Chameleon's small-request queue starves (its P99 TTFT
far above every class under S-LoRA) and suggests that "during bursts the small queue is over
its quota and gets only the leftovers after phase 1". This script runs one seeded workload
under S-LoRA and under Chameleon variants (:mod:`policies.chameleon`; the variants differ in
one named option each, ``--variant NAME:KEY=VALUE,...``), samples every ``--sample-s`` seconds,
per Chameleon queue, its quota, the tokens it holds (``used``), its waiting requests, the
age of its oldest waiting request and the tokens it got in phase 1 and phase 2 of
Algorithm 1, and prints TTFT per request class. The classes are the queues of the first
Chameleon run's final cut-offs, applied to every run (so S-LoRA's classes are the same
requests).

Sampling uses the engine's timed events (``EngineView.push_event``); they only split runs of
decode steps, which the engine sums exactly as single steps, so results are those of an
unsampled run.

Server: each preset runs on its own serving system (the ``chameleon*`` and ``slora`` presets on
the S-LoRA engine, ``twin/slora_engine.py``); ``--system vllm`` runs them on the vLLM engine with
S-LoRA's unified pool of KV and adapter weights (``adapter_memory="unified"``), as the first
diagnosis in ``results/policies/chameleon-as-written.md`` did.

    PYTHONPATH=. python benchmarks/chameleon_starvation.py --rps 1.1 --duration 600 \\
        --out results/policies/chameleon-as-written
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from policies.chameleon import ChameleonScheduler  # noqa: E402
from twin.config import ConfigError  # noqa: E402
from twin.metrics import summarize  # noqa: E402
from twin.compare import load_compare_profile  # noqa: E402
from twin.registry import resolve_policy, resolve_system  # noqa: E402
from twin.scenario import RunConfig, build_engine_config, build_workload, parse_workload_option  # noqa: E402
from twin.simulate import ENGINES, SimResult  # noqa: E402

if TYPE_CHECKING:  # pragma: no cover
    from twin.engine import Engine


def parse_variant(text: str) -> tuple[str, str, dict[str, Any]]:
    """``LABEL=PRESET[:KEY=VALUE,...]`` -> (label, preset, scheduler options)."""
    if "=" not in text.split(":", 1)[0]:
        label, rest = text.split(":", 1)[0], text
    else:
        label, rest = text.split("=", 1)
    preset, _, opts = rest.partition(":")
    kw = dict(parse_workload_option(o) for o in opts.split(",") if o)
    return label, preset, kw


def sample(engine: Engine, sched: ChameleonScheduler, every_s: float, rows: list[dict]) -> None:
    """Record the scheduler's queues every ``every_s`` seconds (timed engine events)."""

    def cb(now: float) -> None:
        arr = engine.arrival_a
        for i, q in enumerate(sched.queues):
            p1 = sched.admitted_tokens[0][i] if i < len(sched.admitted_tokens[0]) else 0.0
            p2 = sched.admitted_tokens[1][i] if i < len(sched.admitted_tokens[1]) else 0.0
            rows.append({"t": now, "queue": i, "quota": sched.quota[i], "used": sched.used[i],
                         "waiting": len(q), "oldest_wait_s": now - arr[q[0]] if q else 0.0,
                         "phase1_tokens": p1, "phase2_tokens": p2,
                         "pool_account": sched.used[-1] if sched.leftover_charge == "pool" else 0.0,
                         "running": len(engine.running), "free_blocks": engine.free_blocks,
                         "reclaimable_blocks": engine.reclaimable_blocks(),
                         **{f"stop_p{ph}_{why}": sum(v for (p_, q_, w_), v in sched.stop_counts.items()
                                                     if p_ == ph and q_ == i and (w_ == "quota") == (why == "quota"))
                            for ph in (1, 2) for why in ("quota", "engine")}})
        if engine.arr_ptr < engine.n or engine.n_waiting or engine.running:
            engine.push_event(now + every_s, cb)

    engine.push_event(every_s, cb)


def run_one(run: RunConfig, workload, label: str, preset: str, kw: dict, sample_s: float, targets: str):
    prof = load_compare_profile(run.profile, targets)
    cfg = build_engine_config(run, workload, prof)
    system = resolve_system(preset, run.system)
    sched, cache, _ = resolve_policy(preset, None, None)
    if kw:
        if not isinstance(sched, ChameleonScheduler):
            raise ConfigError(f"--variant {label}: options {kw} are Chameleon scheduler options, but preset {preset!r} "
                              f"uses the {sched.name!r} scheduler")
        sched = type(sched)(**{**sched.get_params(), **kw})
    if run.ttft_slo is not None and hasattr(sched, "slo_s"):  # quotas plan with the TTFT SLO, as twin reproduce does
        sched.slo_s = run.ttft_slo
    eng = ENGINES[system](workload, prof, cfg, sched, cache, record_steps=False)
    rows: list[dict] = []
    if isinstance(sched, ChameleonScheduler):
        sample(eng, sched, sample_s, rows)
    eng.run()
    summary = summarize(eng, 0.0, run.ttft_slo, run.tbt_slo)
    ts = pd.DataFrame(rows)
    if len(ts):
        ts.insert(0, "variant", label)
    return SimResult(summary, eng), sched, ts


def class_table(results: dict[str, SimResult], classes: np.ndarray) -> pd.DataFrame:
    out = []
    for label, res in results.items():
        r = res.requests
        for c in sorted(set(classes.tolist())):
            m = (classes == c) & (r["outcome"] == "finished").to_numpy()
            t = r.loc[m, "ttft_s"]
            out.append({"variant": label, "class": c, "n": int(m.sum()), "ttft_p50_s": t.median(),
                        "ttft_p99_s": t.quantile(0.99), "queue_p99_s": r.loc[m, "queue_s"].quantile(0.99)})
    return pd.DataFrame(out)


def bound_table(ts: pd.DataFrame) -> pd.DataFrame:
    """Per variant and queue, over the samples where the queue had waiting requests: the
    share of them in which it held at least its quota (only phase 2's leftover can admit it
    then), the mean free KV blocks and free + reclaimable (idle cached adapters) blocks, how
    often ``put_batch`` stopped the queue in phase 1 / phase 2 for its budget (``quota``:
    the quota, or the leftover in phase 2) or for the engine's refusal (``engine``: memory,
    NO_KV / NO_SLOT), and its mean waiting count and largest oldest-request wait."""
    ts = ts.copy()
    g0 = ts.groupby(["variant", "queue"], sort=False)
    for c in ("stop_p1_quota", "stop_p1_engine", "stop_p2_quota", "stop_p2_engine"):
        ts[c] = g0[c].diff().fillna(ts[c])  # stops within each sampling interval
    w = ts[ts["waiting"] > 0]
    g = w.groupby(["variant", "queue"], sort=False)
    return pd.DataFrame({"samples_waiting": g.size(),
                         "over_quota_share": g.apply(lambda d: (d["used"] >= d["quota"]).mean()),
                         "free_blocks_mean": g["free_blocks"].mean(),
                         "free+reclaimable_mean": (g["free_blocks"].mean() + g["reclaimable_blocks"].mean()),
                         "p1_quota_stops": g["stop_p1_quota"].sum(), "p1_engine_stops": g["stop_p1_engine"].sum(),
                         "p2_quota_stops": g["stop_p2_quota"].sum(), "p2_engine_stops": g["stop_p2_engine"].sum(),
                         "waiting_mean": g["waiting"].mean(),
                         "oldest_wait_max_s": g["oldest_wait_s"].max()}).reset_index()


def figure(ts: pd.DataFrame, path: Path, t0: float | None, t1: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(ts["variant"]))
    fig, axes = plt.subplots(3, len(variants), figsize=(5 * len(variants), 9), squeeze=False, sharex=True)
    for j, v in enumerate(variants):
        d = ts[ts["variant"] == v]
        if t0 is not None:
            d = d[(d["t"] >= t0) & (d["t"] <= t1)]
        for q, g in d.groupby("queue"):
            line, = axes[0][j].plot(g["t"], g["used"] / 1e3, label=f"q{q} used")
            axes[0][j].plot(g["t"], g["quota"] / 1e3, "--", color=line.get_color(), label=f"q{q} quota")
            axes[1][j].plot(g["t"], g["waiting"], color=line.get_color(), label=f"q{q}")
            axes[2][j].plot(g["t"], g["oldest_wait_s"], color=line.get_color(), label=f"q{q}")
        axes[0][j].set_title(v)
        axes[0][j].set_ylabel("k tokens (used, --quota)")
        axes[1][j].set_ylabel("waiting requests")
        axes[2][j].set_ylabel("oldest wait (s)")
        axes[2][j].set_xlabel("time (s)")
        axes[0][j].legend(fontsize=6, ncol=2)
        axes[1][j].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="chameleon")
    p.add_argument("--rps", type=float, default=1.1)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--adapters", type=int, default=100)
    p.add_argument("--ranks", default="8,16,32,64,128")
    p.add_argument("--popularity", default="U-P")
    p.add_argument("--trace-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--profile", default="llama-2-7b_a40_vidur")
    p.add_argument("--lora-targets", default="qkvo", help="adapted modules: qkvo (the paper's adapter sizes, "
                   "S-LoRA's 4r slots), all, or a comma-separated list")
    p.add_argument("--ttft-slo", type=float, default=None, help="TTFT SLO (s): SLO attainment, and the SLO "
                   "Chameleon's quotas plan with (default: its own estimate, 5x an unloaded request's service time)")
    p.add_argument("--slora-prefetch", action="store_true", help="S-LoRA's prefetch of queued requests' adapters "
                   "(on in twin reproduce chameleon-*: the paper's S-LoRA baseline and Chameleon prefetch)")
    p.add_argument("--system", default=None, help="serving system for every variant: vllm or slora "
                   "(default: each preset's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", action="append", default=None, metavar="LABEL=PRESET[:KEY=VALUE,...]",
                   help="a run (repeatable); default: slora, chameleon")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--window", default=None, metavar="T0,T1", help="time window of the figure (s)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    try:
        run = RunConfig(trace=a.trace, rps=a.rps, duration=a.duration, adapters=a.adapters,
                        ranks=[int(x) for x in a.ranks.split(",")], popularity=a.popularity,
                        trace_options=[parse_workload_option(o) for o in a.trace_opt], seed=a.seed,
                        profile=a.profile, ttft_slo=a.ttft_slo, system=a.system, slora_prefetch=a.slora_prefetch)
        workload = build_workload(run)
        variants = [parse_variant(v) for v in (a.variant or ["slora", "chameleon"])]
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results: dict[str, SimResult] = {}
    series = []
    first: ChameleonScheduler | None = None
    for label, preset, kw in variants:
        res, sched, ts = run_one(run, workload, label, preset, kw, a.sample_s, a.lora_targets)
        results[label] = res
        series.append(ts)
        if first is None and isinstance(sched, ChameleonScheduler):
            first = sched
        s = res.summary
        extra_s = {k: v for k, v in s.items() if k.startswith("chameleon_")}
        print(f"{label:>24}: finished {s['requests_finished']} P50/P99 TTFT {s['ttft_ms_p50'] / 1e3:.2f}/"
              f"{s['ttft_ms_p99'] / 1e3:.2f} s {extra_s}")
    if first is None:
        print("no Chameleon variant: no classes or time series")
        return 0
    classes = np.array([first.queue_of(r) for r in range(first.engine.n)])
    tab = class_table(results, classes)
    print(tab.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    ts = pd.concat([t for t in series if len(t)], ignore_index=True)
    print(bound_table(ts).to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    # the burst: the sample where the smallest queue's oldest request had waited longest (first Chameleon run)
    lab0 = next(lab for lab, _, _ in variants if lab in set(ts["variant"]))
    q0 = ts[(ts["variant"] == lab0) & (ts["queue"] == 0)]
    worst = q0.loc[q0["oldest_wait_s"].idxmax()]
    print(f"burst ({lab0}): worst small-queue wait {worst['oldest_wait_s']:.1f} s at t={worst['t']:.0f} s")
    near = ts[(ts["t"] >= worst["t"] - 20) & (ts["t"] <= worst["t"] + 5) & ((ts["t"] - worst["t"]) % 5 == 0)]
    cols = ["variant", "t", "queue", "quota", "used", "waiting", "oldest_wait_s", "phase1_tokens", "phase2_tokens"]
    print(near[cols].to_string(index=False, float_format=lambda x: f"{x:.0f}"))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        ts.to_csv(out / "timeseries.csv", index=False, float_format="%.5g")
        tab.to_csv(out / "classes.csv", index=False)
        t0, t1 = (float(x) for x in a.window.split(",")) if a.window else (worst["t"] - 60, worst["t"] + 30)
        figure(ts, out / "timeseries.png", t0, t1)
        print(f"wrote {out}/timeseries.csv, classes.csv, timeseries.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
