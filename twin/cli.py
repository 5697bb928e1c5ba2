"""The ``twin`` command.

``twin run`` replays a workload through the engine (``twin run`` alone runs the embedded
default scenario); ``twin policies`` lists schedulers, caches and presets; the ``traces``,
``calibrate``, ``validate`` and ``compare`` commands come from their packages.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from twin.config import ConfigError, EngineConfig

SUMMARY_ROWS = [
    ("requests arrived / finished", lambda s: f"{s['requests_arrived']} / {s['requests_finished']}"),
    ("rejected / unfinished", lambda s: f"{s['requests_rejected']} / {s['requests_unfinished']}"),
    ("throughput (req/s)", lambda s: _f(s["throughput_rps"], 3)),
    ("tokens/s in / out", lambda s: f"{_f(s['input_tok_s'], 1)} / {_f(s['output_tok_s'], 1)}"),
    ("TTFT ms mean / p50 / p99", lambda s: f"{_f(s['ttft_ms_mean'])} / {_f(s['ttft_ms_p50'])} / {_f(s['ttft_ms_p99'])}"),
    ("ITL ms mean / p99", lambda s: f"{_f(s['itl_ms_mean'])} / {_f(s['itl_ms_p99'])}"),
    ("TPOT ms mean", lambda s: _f(s["tpot_ms_mean"])),
    ("E2E ms mean / p99", lambda s: f"{_f(s['e2e_ms_mean'])} / {_f(s['e2e_ms_p99'])}"),
    ("adapter hit rate", lambda s: _f(s["adapter_hit_rate"], 3)),
    ("adapter loads cpu / disk", lambda s: f"{s['adapter_loads_from_cpu']} / {s['adapter_loads_from_disk']}"),
    ("link GB", lambda s: _f(s["link_gb"], 3)),
    ("preemptions", lambda s: str(s["preemptions"])),
    ("KV capacity (tokens)", lambda s: str(s["kv_capacity_tokens"])),
    ("simulated s / wall s", lambda s: f"{_f(s['simulated_s'], 1)} / {_f(s['wall_s'], 3)}"),
]


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def format_summary(s: dict[str, Any]) -> str:
    """A readable two-column table of the main figures."""
    rows = [("policy", f"{s.get('policy')} (profile {s.get('profile')})"), ("trace", str(s.get("trace", "-")))]
    rows += [(k, fn(s)) for k, fn in SUMMARY_ROWS]
    if "slo_attainment" in s:
        rows.append(("SLO attainment", _f(s["slo_attainment"], 3)))
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 34)
    return "\n".join([line] + [f"{k:<{w}}  {v}" for k, v in rows] + [line])


def _ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.replace("-", ",").split(",") if x]
    except ValueError:
        raise SystemExit(f"--ranks must be integers separated by commas, e.g. 8,16,32 (got {text!r})")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default="synthetic", help="trace name (`twin traces list`) or a file path")
    p.add_argument("--policy", default=None, help="preset: scheduler + cache (`twin policies`); default vllm")
    p.add_argument("--scheduler", default=None, help="override the preset's scheduler")
    p.add_argument("--cache", default=None, help="override the preset's adapter-cache policy")
    p.add_argument("--profile", default=None, help="profile name (`twin calibrate list`) or JSON file")
    p.add_argument("--rps", type=float, default=None, help="target mean request rate (rescales a trace)")
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals to keep/generate")
    p.add_argument("--horizon", type=float, default=None,
                   help="stop the simulation at this time; requests in flight count as unfinished")
    p.add_argument("--adapters", type=int, default=None, help="number of adapters")
    p.add_argument("--ranks", default=None, help="adapter ranks, e.g. 8,16,32,64,128")
    p.add_argument("--popularity", default=None, help="adapter popularity, e.g. powerlaw, zipf:1.2, U-P")
    p.add_argument("--slots", type=int, default=None, help="GPU adapter slots (max_loras)")
    p.add_argument("--cpu-slots", type=int, default=None, help="CPU adapter slots (max_cpu_loras)")
    p.add_argument("--max-lora-rank", type=int, default=None, help="slot rank padding (default: largest rank)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--gpu-mem-gb", type=float, default=None,
                   help="GPU memory; the KV capacity follows from it (default: the profile's GPU)")
    p.add_argument("--kv-tokens", type=int, default=None, help="override the KV capacity (tokens)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (adapter shards per GPU)")
    p.add_argument("--ttft-slo", type=float, default=None, help="TTFT SLO in seconds (SLO attainment)")
    p.add_argument("--tbt-slo", type=float, default=None, help="time-between-tokens SLO in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="data directory (default $TWIN_DATA_DIR)")
    p.add_argument("--out", default=None, help="write requests.parquet, steps.parquet, summary.json here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on simulated time (default: on for a terminal)")


def build_workload(args: argparse.Namespace):
    from traces.registry import get_workload

    opts = dict(data_dir=args.data_dir, rps=args.rps, duration=args.duration, adapters=args.adapters,
                ranks=_ranks(args.ranks), popularity=args.popularity, seed=args.seed)
    return get_workload(args.trace, **opts)


def build_config(args: argparse.Namespace, workload, profile) -> EngineConfig:
    from twin.perf.profile import kv_tokens_for_memory

    n_adapters = int((workload.df["adapter_id"].max() + 1)) if len(workload.df) else 0
    # default: 16 slots (with max rank 128, 32 slots would leave Llama-3.1-8B on an H100 less
    # KV than one 131,072-token request, and vLLM would refuse to start)
    slots = args.slots if args.slots is not None else max(1, min(n_adapters, 16) if n_adapters else 1)
    cfg = EngineConfig(max_num_batched_tokens=args.max_batched_tokens, max_num_seqs=args.max_num_seqs,
                       max_loras=slots, max_cpu_loras=args.cpu_slots, max_lora_rank=args.max_lora_rank,
                       kv_capacity_tokens=args.kv_tokens, tensor_parallel=args.tp)
    if args.gpu_mem_gb is not None and args.kv_tokens is None:
        max_rank = args.max_lora_rank or int(workload.df["adapter_rank"].max() or 0)
        cfg.kv_capacity_tokens = kv_tokens_for_memory(profile, args.gpu_mem_gb, slots, max_rank)
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    from twin.perf.profile import load_profile
    from twin.simulate import simulate

    profile = load_profile(args.profile)
    workload = build_workload(args)
    cfg = build_config(args, workload, profile)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    res = simulate(workload, profile, cfg, policy=args.policy, scheduler=args.scheduler, cache=args.cache,
                   horizon_s=args.horizon, ttft_slo_s=args.ttft_slo, tbt_slo_s=args.tbt_slo, progress=progress,
                   extra={"trace": args.trace, "workload": workload.meta, "config": cfg.to_dict()})
    if args.out:
        res.write(args.out)
    if args.json:
        print(json.dumps(res.summary, indent=2, default=str))
    else:
        print(format_summary(res.summary))
        if args.out:
            print(f"wrote {Path(args.out) / 'requests.parquet'}, steps.parquet, summary.json")
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    from twin.registry import describe_all

    rows = describe_all()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    w = max(len(r["name"]) for r in rows)
    for kind in ("preset", "scheduler", "cache"):
        print(f"{kind}s:")
        for r in rows:
            if r["kind"] == kind:
                cite = f"  [{r['citation']}]" if r["citation"] else ""
                print(f"  {r['name']:<{w}}  {r['description']}{cite}")
    return 0


def _optional_commands(sub) -> None:
    """Commands contributed by the other packages (each in its own module)."""
    import importlib

    for mod in ("traces.cli", "calibration.cli", "twin.validation.cli", "twin.compare", "twin.sweep_cli"):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod or mod.startswith(str(e.name)):
                continue
            raise
        m.register_cli(sub)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twin", description="LoRA Twin: a digital twin of a multi-LoRA LLM server")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate a workload (no arguments: the embedded default scenario)")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    pol = sub.add_parser("policies", help="list schedulers, adapter-cache policies and presets")
    pol.add_argument("--json", action="store_true")
    pol.set_defaults(func=cmd_policies)
    _optional_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ConfigError, KeyError, FileNotFoundError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"twin {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
