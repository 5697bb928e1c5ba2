"""``twin validate``: score the twin against real vLLM runs (see :mod:`twin.validation`)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from policies.client_cap import CLIENT_MAX_INFLIGHT
from traces.arguments import check_writable_dir
from twin.scenario import check_host_term, check_number
from twin.validation.output import json_summary, write_outputs
from twin.validation.report import format_report
from twin.validation.runner import run_validation
from twin.validation.specs import (FRONTEND_LATENCY_S, PROMPT_OUTPUT_CORR, RANK_TILE_COST, SCRAPE_S_PER_LABEL,
                                   SERVING_S_PER_RUNNING, check_length_corr)


#: the largest errors the table lists without --top
TOP_DEFAULT = 8


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="re-create real vLLM runs from their configuration and score the twin (SMAPE)",
        description="Re-create every real run of --real from its configuration (profile, adapters, ranks, "
                    "per-adapter Poisson rates, slots, engine settings, 3600 s window, ShareGPT-like lengths) "
                    "and report SMAPE against the real figures, next to the published twin's (--peer).")
    p.add_argument("--real", default=None,
                   help="real-run table (default: validation/vllm085_h100_llama31_8b.csv in the data directory)")
    p.add_argument("--peer", default=None,
                   help="published twin's predictions (default: the peer_twin_*.csv beside --real); 'none' to skip")
    p.add_argument("--profile", default=None, help="profile name or JSON file (default: the model's fitted profile)")
    p.add_argument("--out", default=None, help="write per_run.csv, summary.json and figures into this directory")
    p.add_argument("--json", action="store_true", help="print the JSON summary on stdout instead of the table")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPU count)")
    p.add_argument("--limit", type=int, default=None, help="validate N runs evenly spread over the selection")
    p.add_argument("--filter", default=None,
                   help="pandas query on the real table (e.g. \"source=='dt_modelling' and adapter_slots<=32\") "
                        "or a substring of the run id (source/scenario/run_dir)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic arrivals and lengths")
    p.add_argument("--nominal", action="store_true",
                   help="always use the nominal offered load (ignore requests_sent)")
    p.add_argument("--client-cap", default=None,
                   help=f"requests the real client can hold in flight (default {CLIENT_MAX_INFLIGHT}: one TCP "
                        "connection per request, Linux's default ephemeral port range); 'none' disables the cap")
    p.add_argument("--no-preload", action="store_true",
                   help="adapters start on disk (loaded at their first request, as offline vLLM does) instead of in the CPU "
                        "tier (the real runs' server pre-loads its --max-cpu-loras adapters)")
    p.add_argument("--length-corr", type=float, default=PROMPT_OUTPUT_CORR,
                   help=f"Gaussian-copula correlation of prompt and output length in the re-created request pools "
                        f"(default {PROMPT_OUTPUT_CORR}: fitted on the dt_modelling runs' KV gauges, "
                        f"twin.validation.length_coupling; 0: independent lengths)")
    p.add_argument("--frontend-ms", type=float, default=FRONTEND_LATENCY_S * 1000,
                   help=f"front-end latency of each request outside the engine, in ms (API server and client "
                        f"path; default {FRONTEND_LATENCY_S * 1000:g}: fitted on the dt_modelling runs without a "
                        f"queue, twin.validation.frontend; 0: the engine's own TTFT)")
    p.add_argument("--scrape-us", type=float, default=SCRAPE_S_PER_LABEL * 1e6,
                   help=f"stall of the client-observed path while the server writes its metrics for the client's "
                        f"scrape every 2 s, in microseconds per LoRA label series seen so far (default "
                        f"{SCRAPE_S_PER_LABEL * 1e6:g}: fitted on the dt_modelling runs without a queue, "
                        f"twin.validation.scrape_stall; 0: off)")
    p.add_argument("--serving-us", type=float, default=SERVING_S_PER_RUNNING * 1e6,
                   help=f"host time of the serving path per running request and engine step, in microseconds "
                        f"(API server and streaming clients; default {SERVING_S_PER_RUNNING * 1e6:g}: fitted on the "
                        f"dt_modelling runs with KV usage < 0.5 and >= 100 running, twin.validation.serving_host; "
                        f"0: the calibrated engine alone)")
    p.add_argument("--rank-tile-cost", default=None, metavar="COST|profile",
                   help=f"working-block cost of a LoRA shrink rank tile beyond the first, relative to the first "
                        f"(rank-32 slots run two tiles; default {RANK_TILE_COST:g}: fitted on the dt_modelling runs "
                        f"that differ only in the slots' max rank, twin.validation.rank_tile; 1: every tile alike, "
                        f"the calibrated profiles' extrapolation from rank 8; 'profile': the profile's own value)")
    p.add_argument("--no-figures", action="store_true", help="with --out: skip the figures")
    p.add_argument("--top", type=int, default=None,
                   help=f"largest errors listed in the table (default {TOP_DEFAULT}; not with --json)")
    p.add_argument("--data-dir", default=None, help="data directory (default $TWIN_DATA_DIR)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on for a terminal)")
    p.set_defaults(func=cmd_validate)


#: the largest --scrape-us (1 s per label series: beyond, an error of units)
SCRAPE_US_MAX = 1e6


def _client_cap(value: str | None) -> int | None:
    """``--client-cap``: a count, or none/0/off for no cap; default :data:`CLIENT_MAX_INFLIGHT`."""
    if value is None:
        return CLIENT_MAX_INFLIGHT
    if value.strip().lower() in ("none", "0", "off"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"--client-cap {value!r}: give a number of requests, e.g. --client-cap "
                         f"{CLIENT_MAX_INFLIGHT}, or none") from None
    if n < 0:
        raise ValueError(f"--client-cap {n}: must be >= 0 (0 or none: no cap)")
    return n


def _rank_tile_cost(value: str | None) -> float | None:
    """``--rank-tile-cost``: a number >= 0, or 'profile' (None: the profile's own); default :data:`RANK_TILE_COST`."""
    if value is None:
        return RANK_TILE_COST
    if value.strip().lower() == "profile":
        return None
    try:
        c = float(value)
    except ValueError:
        c = float("nan")
    if not (c >= 0 and math.isfinite(c)):
        raise ValueError(f"--rank-tile-cost {value!r}: give the cost relative to the first rank tile, >= 0, e.g. "
                         f"--rank-tile-cost {RANK_TILE_COST:g} (1: every tile alike), or 'profile'")
    return c


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad option values before any run (``ValueError`` naming the flag and the fix)."""
    for flag, value, low in (("--jobs", args.jobs, 1), ("--limit", args.limit, 1), ("--seed", args.seed, 0),
                             ("--top", args.top, 0)):
        if value is not None and value < low:
            raise ValueError(f"{flag} {value}: must be >= {low}")
    if args.no_figures and args.out is None:  # (the figures are drawn only into --out: the flag did nothing)
        raise ValueError("--no-figures without --out: figures are drawn only into --out; give --out DIR, or leave "
                         "--no-figures out")
    if args.top is not None and args.json:  # (the JSON summary lists no largest errors: --top did nothing)
        raise ValueError(f"--top {args.top} with --json: --top sets the largest errors listed in the table, and "
                         f"--json prints the JSON summary instead of the table; leave one of them out")
    _client_cap(args.client_cap)
    check_length_corr(args.length_corr, "--length-corr")
    check_host_term("frontend_ms", args.frontend_ms, fix="a latency in milliseconds, e.g. --frontend-ms "
                                                         f"{FRONTEND_LATENCY_S * 1000:g} (0: off)")
    check_number("--scrape-us", args.scrape_us, 0, True, "microseconds per label series, e.g. --scrape-us "
                                                        f"{SCRAPE_S_PER_LABEL * 1e6:g} (0: off)")
    if args.scrape_us > SCRAPE_US_MAX:
        raise ValueError(f"--scrape-us {args.scrape_us:g}: more than {SCRAPE_US_MAX:g} (1 s per label series); "
                         f"give microseconds per label series, e.g. --scrape-us {SCRAPE_S_PER_LABEL * 1e6:g} (0: off)")
    check_host_term("serving_us", args.serving_us, fix="microseconds per running request and step, e.g. "
                                                       f"--serving-us {SERVING_S_PER_RUNNING * 1e6:g} (0: off)")
    cost = _rank_tile_cost(args.rank_tile_cost)
    if cost is not None:
        check_host_term("rank_tile_cost", cost, fix=f"a cost relative to the first rank tile, e.g. --rank-tile-cost "
                                                    f"{RANK_TILE_COST:g} (1: every tile alike), or 'profile'")
    if args.out is not None:
        check_writable_dir("--out", args.out)
    if args.filter is not None and not args.filter.strip():
        raise ValueError("--filter: empty; give a pandas query or a substring of the run id")


def cmd_validate(args: argparse.Namespace) -> int:
    check_args(args)
    peer = False if (args.peer or "").lower() == "none" else args.peer
    jobs = args.jobs or os.cpu_count() or 1
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    res = run_validation(args.real, peer, args.profile, jobs=jobs, limit=args.limit, filt=args.filter,
                         seed=args.seed, use_sent=not args.nominal, progress=progress, data_dir=args.data_dir,
                         client_cap=_client_cap(args.client_cap), preload_cpu=not args.no_preload,
                         length_corr=args.length_corr, frontend_s=args.frontend_ms / 1000,
                         scrape_s_per_label=args.scrape_us / 1e6, serving_s_per_running=args.serving_us / 1e6,
                         rank_tile_cost=_rank_tile_cost(args.rank_tile_cost))
    paths = write_outputs(res, args.out, figures=not args.no_figures) if args.out is not None else []
    if args.json:
        print(json_summary(res))
    else:
        print(format_report(res, TOP_DEFAULT if args.top is None else args.top))
        for p in paths:
            print(f"wrote {p}")
    return 0
