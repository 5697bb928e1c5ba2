"""The ``twin`` command.

``twin run`` replays a workload through the engine (``twin run`` alone runs the embedded
default scenario); ``twin policies`` lists schedulers, caches and presets; the ``traces``,
``calibrate``, ``validate`` and ``compare`` commands come from their packages.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import calibration.cli
import traces.cli
import twin.compare
import twin.validation.cli
from traces.flags import add_arguments, from_namespace
from twin.config import ConfigError
from twin.figures import write_run_figures
from twin.perf.profile import load_profile
from twin.registry import describe_all
from twin.scenario import RunConfig, build_engine_config, build_workload
from twin.simulate import simulate

#: the modules that add the other commands (``traces``, ``calibrate``, ``validate``, ``compare``)
COMMAND_MODULES = (traces.cli, calibration.cli, twin.validation.cli, twin.compare)

SUMMARY_ROWS = [
    ("requests arrived / finished", lambda s: f"{s['requests_arrived']} / {s['requests_finished']}"),
    ("rejected / unfinished", lambda s: f"{s['requests_rejected']} / {s['requests_unfinished']}"),
    ("throughput (req/s)", lambda s: _f(s["throughput_rps"], 3)),
    ("tokens/s in / out", lambda s: f"{_f(s['input_tok_s'], 1)} / {_f(s['output_tok_s'], 1)}"),
    ("TTFT ms mean / p50 / p99", lambda s: f"{_f(s['ttft_ms_mean'])} / {_f(s['ttft_ms_p50'])} / {_f(s['ttft_ms_p99'])}"),
    ("ITL ms mean / p99", lambda s: f"{_f(s['itl_ms_mean'])} / {_f(s['itl_ms_p99'])}"),
    ("TPOT ms mean", lambda s: _f(s["tpot_ms_mean"])),
    ("E2E ms mean / p99", lambda s: f"{_f(s['e2e_ms_mean'])} / {_f(s['e2e_ms_p99'])}"),
    ("adapter hit rate requests / activations",
     lambda s: f"{_f(s.get('adapter_hit_rate_requests'), 3)} / {_f(s['adapter_hit_rate'], 3)}"),
    ("adapter loads cpu / disk", lambda s: f"{s['adapter_loads_from_cpu']} / {s['adapter_loads_from_disk']}"),
    ("link GB / utilization", lambda s: f"{_f(s['link_gb'], 3)} / {_f(s.get('link_utilization'), 3)}"),
    ("GPU busy fraction", lambda s: _f(s.get("gpu_busy_fraction"), 3)),
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


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``twin run``: every :class:`RunConfig` field, and where the results go."""
    add_arguments(p, RunConfig)
    p.add_argument("--out", default=None, help="write requests.parquet, steps.parquet, summary.json here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--plot", action="store_true",
                   help="write latency.png (TTFT, ITL) and timeline.png (requests, KV, adapters, link) into --out "
                        "(without --out: into a new temporary directory, printed)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on simulated time (default: on for a terminal)")


def cmd_run(args: argparse.Namespace) -> int:
    run = from_namespace(RunConfig, args)
    profile = load_profile(run.profile)
    workload = build_workload(run)
    cfg = build_engine_config(run, workload, profile)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    res = simulate(workload, profile, cfg, policy=run.policy, scheduler=run.scheduler, cache=run.cache,
                   horizon_s=run.horizon, ttft_slo_s=run.ttft_slo, tbt_slo_s=run.tbt_slo, progress=progress,
                   extra={"trace": run.trace, "workload": workload.meta, "config": cfg.to_dict()})
    if args.out:
        res.write(args.out)
    figures = []
    if args.plot:
        fig_dir = args.out or tempfile.mkdtemp(prefix="twin-run-")
        figures = write_run_figures(fig_dir, res.requests, res.steps, res.summary)
    if args.json:
        print(json.dumps(res.summary, indent=2, default=str))
    else:
        print(format_summary(res.summary))
        if args.out:
            print(f"wrote {Path(args.out) / 'requests.parquet'}, steps.parquet, summary.json")
    if figures:
        print(f"figures: {', '.join(str(f) for f in figures)}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twin", description="LoRA Twin: a digital twin of a multi-LoRA LLM server")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate a workload (no arguments: the embedded default scenario)")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    pol = sub.add_parser("policies", help="list schedulers, adapter-cache policies and presets")
    pol.add_argument("--json", action="store_true")
    pol.set_defaults(func=cmd_policies)
    for module in COMMAND_MODULES:
        module.register_cli(sub)
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
