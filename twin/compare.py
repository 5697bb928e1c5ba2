"""``twin compare``: several policies over a sweep of request rates, side by side.

    twin compare --trace splitwise --policies slora,chameleon-nocache,chameleon-nosched,chameleon \\
                 --rps 6,8,9 --profile llama-2-7b_a40_vidur --adapters 100 --ranks 8,16,32,64,128 \\
                 --popularity powerlaw --duration 600

For every (policy, rate) it replays the same workload (same seed: the same requests, only
the policy changes) and reports P50/P99 TTFT, P50/P99 time between tokens (ITL), the
throughput of requests that met the TTFT SLO (goodput), SLO attainment and the adapter hit
rate. Per policy it also reports the **sustained throughput**: the highest rate at which the
P99 TTFT stays within the SLO, interpolated linearly between the swept rates (Chameleon's
"throughput under the SLO"). The SLO is ``--slo`` seconds, or ``--slo-x`` (default 5) times
the *unloaded* mean TTFT, measured by replaying the same trace at ``--unloaded-rps`` under
the first policy (Chameleon §6: "SLO = 5x the latency of a request on an unloaded system").

Writes ``compare.csv`` and ``compare.png`` (P99 TTFT, goodput and hit rate against the
rate, one line per policy) into ``--out`` (default ``results/compare/<trace>``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = [("ttft_ms_p50", "TTFT p50 ms", 0), ("ttft_ms_p99", "TTFT p99 ms", 0), ("itl_ms_p50", "TBT p50 ms", 1),
           ("itl_ms_p99", "TBT p99 ms", 1), ("throughput_rps", "thr req/s", 2), ("goodput_rps", "SLO thr req/s", 2),
           ("slo_attainment", "SLO att.", 3), ("adapter_hit_rate", "hit rate", 3)]


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare policies over a sweep of request rates (table + figure)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default="synthetic", help="trace name (`twin traces list`) or file")
    p.add_argument("--policies", required=True, help="comma-separated presets, e.g. slora,chameleon; "
                   "'SCHED+CACHE' pairs as 'sched=NAME/cache=NAME'")
    p.add_argument("--rps", required=True, help="comma-separated request rates, e.g. 6,8,9")
    p.add_argument("--profile", default=None, help="profile name or JSON file (e.g. llama-2-7b_a40_vidur)")
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals per run")
    p.add_argument("--adapters", type=int, default=None)
    p.add_argument("--ranks", default=None, help="e.g. 8,16,32,64,128")
    p.add_argument("--popularity", default=None, help="e.g. powerlaw, zipf:1.2")
    p.add_argument("--trace-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="extra workload option (repeatable), e.g. length_scale=0.5")
    p.add_argument("--lora-targets", default=None,
                   help="adapter target modules (sets the adapter size): qkvo, all, or a comma list of module names")
    p.add_argument("--slots", type=int, default=None, help="GPU adapter slots for slot-based policies (vLLM)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--kv-tokens", type=int, default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--slo", type=float, default=None, help="TTFT SLO in seconds (default: --slo-x x unloaded mean)")
    p.add_argument("--slo-x", type=float, default=5.0, help="SLO as a multiple of the unloaded mean TTFT")
    p.add_argument("--unloaded-rps", type=float, default=0.2, help="rate of the unloaded reference run")
    p.add_argument("--accuracy", type=float, default=None, help="output-length predictor accuracy (sjf, chameleon)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default=None, help="output directory (default results/compare/<trace>)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=cmd_compare)


def _trace_opts(items: list[str]) -> dict[str, Any]:
    import ast

    out = {}
    for it in items:
        if "=" not in it:
            raise ValueError(f"--trace-opt takes KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k.strip()] = v
    return out


def _workload(args, rps: float):
    from traces.registry import get_workload
    from twin.cli import _ranks

    return get_workload(args.trace, data_dir=args.data_dir, rps=rps, duration=args.duration, adapters=args.adapters,
                        ranks=_ranks(args.ranks), popularity=args.popularity, seed=args.seed,
                        **_trace_opts(args.trace_opt))


def _profile(args):
    from twin.model_spec import ALL_TARGETS, QKVO
    from twin.perf.profile import load_profile

    prof = load_profile(args.profile)
    if args.lora_targets:
        t = args.lora_targets
        prof.lora_targets = QKVO if t == "qkvo" else ALL_TARGETS if t == "all" else tuple(t.split(","))
    return prof


def _config(args, workload):
    from twin.config import EngineConfig

    n_adapters = int(workload.df["adapter_id"].max() + 1) if len(workload.df) else 0
    slots = args.slots if args.slots is not None else max(1, min(n_adapters, 32) if n_adapters else 1)
    return EngineConfig(max_num_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs,
                        max_loras=slots, kv_capacity_tokens=args.kv_tokens, tensor_parallel=args.tp)


def _policy_objects(name: str, slo_s: float | None, accuracy: float | None):
    from twin.registry import resolve_policy

    s, c, label = resolve_policy(name)
    if slo_s is not None and hasattr(s, "slo_s"):
        s.slo_s = slo_s
    if accuracy is not None and hasattr(s, "accuracy"):
        s.accuracy = accuracy
    return s, c, label


def run_one(args_dict: dict[str, Any], policy: str, rps: float, slo_s: float | None) -> dict[str, Any]:
    """One simulation; returns the summary row (picklable, for --jobs)."""
    from twin.simulate import simulate

    args = argparse.Namespace(**args_dict)
    prof = _profile(args)
    w = _workload(args, rps)
    cfg = _config(args, w)
    s, c, label = _policy_objects(policy, slo_s, args.accuracy)
    res = simulate(w, prof, cfg, scheduler_obj=s, cache_obj=c, ttft_slo_s=slo_s, record_steps=False)
    row = {"policy": policy, "rps": rps, **{k: res.summary.get(k) for k, _, _ in COLUMNS},
           "requests": res.summary["requests_arrived"], "finished": res.summary["requests_finished"],
           "wall_s": res.summary["wall_s"]}
    return row


def unloaded_mean_ttft(args, policy: str) -> float:
    """Mean TTFT of the trace replayed at a low rate (the SLO reference)."""
    from twin.simulate import simulate

    prof = _profile(args)
    w = _workload(args, args.unloaded_rps)
    s, c, _ = _policy_objects(policy, None, args.accuracy)
    res = simulate(w, prof, _config(args, w), scheduler_obj=s, cache_obj=c, record_steps=False)
    return float(res.summary["ttft_ms_mean"]) / 1000.0


def sustained_rps(rates: list[float], p99_ms: list[float | None], slo_s: float) -> float:
    """Highest rate with P99 TTFT <= SLO, interpolated linearly between swept rates
    (0 when even the lowest rate misses it; the highest rate when none misses it)."""
    pts = sorted(zip(rates, p99_ms))
    lim = slo_s * 1000.0
    best = 0.0
    for i, (r, p) in enumerate(pts):
        if p is not None and p <= lim:
            best = r
            continue
        if i > 0 and pts[i - 1][1] is not None and pts[i - 1][1] <= lim and p is not None:
            r0, p0 = pts[i - 1]
            best = r0 + (r - r0) * (lim - p0) / (p - p0)
        break
    return best


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ["policy", "rps"] + [h for _, h, _ in COLUMNS]
    lines = [head]
    for r in rows:
        vals = [r["policy"], f"{r['rps']:g}"]
        for k, _, nd in COLUMNS:
            v = r.get(k)
            vals.append("-" if v is None else f"{v:.{nd}f}")
        lines.append(vals)
    w = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
    out = ["  ".join(str(v).rjust(w[i]) if i > 1 else str(v).ljust(w[i]) for i, v in enumerate(l)) for l in lines]
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def write_figure(rows: list[dict[str, Any]], slo_s: float, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    for pol in pols:
        rs = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["rps"])
        x = [r["rps"] for r in rs]
        for ax, key, scale in ((axes[0], "ttft_ms_p99", 1e-3), (axes[1], "itl_ms_p99", 1.0),
                               (axes[2], "goodput_rps", 1.0), (axes[3], "adapter_hit_rate", 1.0)):
            y = [(r[key] * scale) if r.get(key) is not None else float("nan") for r in rs]
            ax.plot(x, y, marker="o", label=pol)
    axes[0].axhline(slo_s, color="k", ls="--", lw=0.8, label=f"SLO {slo_s:.2f} s")
    axes[0].set_yscale("log")
    for ax, t in zip(axes, ("P99 TTFT (s)", "P99 TBT (ms)", "throughput within SLO (req/s)", "adapter hit rate")):
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare(args) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    pols = [p.strip() for p in args.policies.split(",") if p.strip()]
    rates = [float(x) for x in args.rps.split(",") if x.strip()]
    if not pols or not rates:
        raise ValueError("--policies and --rps need at least one value each")
    from twin.registry import PRESETS, load_entry_points

    load_entry_points()
    unknown = [p for p in pols if p not in PRESETS]
    if unknown:
        raise KeyError(f"unknown policies {unknown}; presets: {', '.join(sorted(PRESETS))}")
    slo = args.slo
    if slo is None:
        slo = args.slo_x * unloaded_mean_ttft(args, pols[0])
    ad = {k: v for k, v in vars(args).items() if k != "func"}
    jobs = [(p, r) for p in pols for r in rates]
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as ex:
            rows = list(ex.map(run_one, [ad] * len(jobs), [p for p, _ in jobs], [r for _, r in jobs],
                               [slo] * len(jobs)))
    else:
        rows = [run_one(ad, p, r, slo) for p, r in jobs]
    sustained = {p: sustained_rps(rates, [r["ttft_ms_p99"] for r in rows if r["policy"] == p], slo) for p in pols}
    return rows, sustained, slo


def cmd_compare(args) -> int:
    import pandas as pd

    rows, sustained, slo = compare(args)
    out = Path(args.out) if args.out else Path("results") / "compare" / Path(args.trace).stem
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "compare.csv", index=False)
    fig = write_figure(rows, slo, out / "compare.png", f"{args.trace} (profile {args.profile or 'default'}), "
                                                       f"TTFT SLO {slo:.2f} s")
    (out / "sustained.json").write_text(json.dumps({"slo_s": slo, "sustained_rps": sustained}, indent=2))
    if args.json:
        print(json.dumps({"slo_s": slo, "rows": rows, "sustained_rps": sustained}, indent=2, default=str))
        return 0
    print(f"TTFT SLO = {slo:.3f} s" + ("" if args.slo else f" ({args.slo_x:g} x the unloaded mean TTFT)"))
    print(format_table(rows))
    print()
    base = next(iter(sustained.values()))
    print("sustained throughput (P99 TTFT <= SLO):")
    for p, v in sustained.items():
        rel = f"  ({v / base:.2f}x {next(iter(sustained))})" if base > 0 else ""
        print(f"  {p:<24} {v:6.2f} req/s{rel}")
    print(f"wrote {out / 'compare.csv'}, {fig}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    from twin.cli import main

    sys.exit(main(["compare", *sys.argv[1:]]))
