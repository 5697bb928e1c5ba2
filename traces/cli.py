"""``twin traces ...``: list, show, fetch and synthesize workloads.

``twin/cli.py`` calls :func:`register_cli` with its subparsers; ``python -m traces.cli ...``
runs the same commands standalone. Every synthesis option of :data:`traces.synth.OPTIONS`
and every real-trace option of :data:`traces.registry.REAL_OPTIONS` is a flag
(``--rps``, ``--popularity zipf:1.2``, ``--lengths sharegpt --mean-in 222 --mean-out 196``, ...),
on ``show`` and ``synth`` alike.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from traces.arguments import check_writable_file
from traces.fetch import FetchError, fetch
from traces.registry import REAL_OPTIONS, get_workload, list_traces, run_defaults
from traces.stats import format_summary, plot_summary, summarize, to_json
from traces.synth import OPTIONS

_BOOL_OPTIONS = {"conversations", "shuffle_rates", "keep_failed"}
_TYPES: dict[str, Callable[[str], Any]] = {"rps": float, "duration": float, "n_requests": int, "cv": float,
                                           "on_s": float, "off_s": float, "off_frac": float, "adapters": int,
                                           "mean_in": float, "mean_out": float, "length_scale": float,
                                           "min_prompt": int, "min_output": int, "max_prompt": int, "max_output": int,
                                           "max_total": int, "mean_turns": float, "max_turns": int, "think_s": float,
                                           "tpot_s": float, "window_start": float, "max_conversations": int,
                                           "days": int, "start_min": int, "end_min": int}


def _seed(text: str) -> int:
    """``--seed``: an integer >= 0 (numpy's seed sequences take no negative seed)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give a seed >= 0, e.g. --seed 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is negative; give a seed >= 0, e.g. --seed 0")
    return v


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """One flag per workload option (dest = the option name), all defaulting to None."""
    p.add_argument("--data-dir", default=None, help="data directory (default: $TWIN_DATA_DIR)")
    p.add_argument("--seed", type=_seed, default=0, help="random seed, an integer >= 0 (default 0)")
    g = p.add_argument_group("synthesis options")
    for name, (_, _, _, help_) in OPTIONS.items():
        _add(g, name, help_)
    g2 = p.add_argument_group("real-trace options")
    for name, help_ in REAL_OPTIONS.items():
        _add(g2, name, help_)


def _add(g: Any, name: str, help_: str) -> None:
    flag = "--" + name.replace("_", "-")
    if name in _BOOL_OPTIONS:
        g.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_)
    else:
        g.add_argument(flag, dest=name, type=_TYPES.get(name, str), default=None, help=help_)


def options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The workload options set on the command line (``None`` = not given)."""
    return {k: getattr(args, k) for k in list(OPTIONS) + list(REAL_OPTIONS) if getattr(args, k, None) is not None}


def _err(e: BaseException, args: argparse.Namespace | None = None) -> int:
    """Print ``PROG: error: MESSAGE`` (as argparse does, ``twin traces show: error: ...``) and return 2."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    print(f"{getattr(args, 'prog', None) or 'traces'}: error: {msg}", file=sys.stderr)
    return 2


def cmd_list(args: argparse.Namespace) -> int:
    rows = list_traces(args.data_dir)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        status = "-" if r["kind"] == "synthetic" else ("available" if r["available"] else
                                                       f"missing ({r['fetch'] or 'manual download'})")
        print(f"{r['name']:<{w}}  {r['kind']:<9}  {status:<40}  {r['description']}")
    return 0


def _workload(args: argparse.Namespace):
    opts = options_from_args(args)
    return get_workload(args.trace, data_dir=args.data_dir, seed=args.seed, **opts)


def check_plot_file(plot: str) -> None:
    """``--plot FILE``: refused before any work when it is a directory or cannot be written."""
    check_writable_file("--plot", plot, (".png", ".pdf", ".svg"))


def run_defaults_note(args: argparse.Namespace) -> str | None:
    """What ``twin run --trace NAME`` sets that this table does not show: a built-in trace's scenario defaults
    (:func:`traces.registry.run_defaults`, e.g. ``splitwise`` replayed at 2.2 req/s over 600 s with ranks 8/16/32)
    left unset here. ``traces show`` gives the trace as its loader gives it, so without this line its rate and
    rank share read as what ``twin run`` replays."""
    given = options_from_args(args)
    unset = {k: v for k, v in run_defaults(args.trace).items() if given.get(k) is None}
    if not unset:
        return None
    shown = ", ".join(f"--{k} " + (",".join(map(str, v)) if isinstance(v, list) else f"{v:g}")
                      for k, v in unset.items())
    return (f"note: twin run --trace {args.trace} replays it with {shown} unless given (README 'Defaults'); "
            f"give them here to see that workload")


def cmd_show(args: argparse.Namespace) -> int:
    try:
        if args.bin_s is not None and not args.bin_s > 0:
            raise ValueError(f"--bin-s {args.bin_s}: must be > 0 (seconds per bin of the rate series)")
        if args.plot is not None:
            check_plot_file(args.plot)
        w = _workload(args)
    except (KeyError, FileNotFoundError, ValueError, TypeError) as e:
        return _err(e, args)
    s = summarize(w, bin_s=args.bin_s)
    print(to_json(s) if args.json else format_summary(s))
    if not args.json and (note := run_defaults_note(args)):
        print(note)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_summary(w, args.plot, s)
        print(f"figure written to {args.plot}", file=sys.stderr)
    return 0


def check_out_file(out: str) -> None:
    """``--out FILE.parquet``: refused before generating when it is a directory, sits under a
    file, or its directory cannot be written."""
    if Path(out).suffix.lower() != ".parquet":
        raise ValueError(f"--out {out}: a workload is saved as Parquet; give a FILE.parquet")
    check_writable_file("--out", out)


def cmd_synth(args: argparse.Namespace) -> int:
    try:
        check_out_file(args.out)
        w = _workload(args)
        if not len(w):  # (twin run refuses an empty workload file: write none)
            raise ValueError(f"the workload of --trace {args.trace} holds no request; lengthen --duration or raise "
                             f"--rps (nothing written to {args.out})")
    except (KeyError, FileNotFoundError, ValueError, TypeError) as e:
        return _err(e, args)
    try:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        w.save(args.out)
    except OSError as e:
        print(f"{args.prog}: error: could not write the workload to {args.out} ({e.strerror or e})", file=sys.stderr)
        return 2
    print(format_summary(summarize(w)))
    print(f"workload written to {args.out}", file=sys.stderr)
    return 0


def check_fetch_options(args: argparse.Namespace) -> None:
    """``--sha256``, ``--timeout`` and ``--url`` checked before anything is downloaded."""
    if args.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256.strip()):
        raise FetchError(f"--sha256 {args.sha256!r}: not a SHA-256 digest (64 hexadecimal digits, as `sha256sum` "
                         f"prints)")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise FetchError(f"--timeout {args.timeout:g}: must be a number of seconds > 0, e.g. --timeout 60")
    if args.url is not None and urllib.parse.urlparse(args.url).scheme not in ("http", "https", "file"):
        raise FetchError(f"--url {args.url!r}: give an http://, https:// or file:// URL")


def cmd_fetch(args: argparse.Namespace) -> int:
    try:
        check_fetch_options(args)
        p = fetch(args.name, args.data_dir, force=args.force, url=args.url, sha256=args.sha256, timeout=args.timeout)
    except (FetchError, KeyError) as e:
        return _err(e, args)
    print(p)
    return 0


def register_cli(subparsers: Any) -> None:
    """Add ``traces`` with ``list``, ``show``, ``fetch`` and ``synth`` to a subparsers object."""
    p = subparsers.add_parser("traces", help="list, show, fetch and synthesize workloads",
                              description="Workloads: built-in real traces (data directory), synthetic presets and "
                                          "every synthesis option.")
    add_commands(p)


def add_commands(p: argparse.ArgumentParser) -> None:
    """``list``, ``show``, ``fetch`` and ``synth`` as subcommands of parser ``p`` (``twin traces``, or
    ``python -m traces.cli`` on its own); ``p`` with no subcommand prints its help."""
    sub = p.add_subparsers(dest="traces_cmd", metavar="{list,show,fetch,synth}")
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])

    pl = sub.add_parser("list", help="built-in trace names and whether their files are present")
    pl.add_argument("--data-dir", default=None, help="data directory (default: $TWIN_DATA_DIR)")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=cmd_list, prog=pl.prog)

    ps = sub.add_parser("show", help="statistics of a trace: count, duration, rate, CV, lengths, popularity")
    ps.add_argument("trace", help="built-in name or path (workload .parquet or raw trace)")
    ps.add_argument("--plot", metavar="FILE", default=None, help="write a figure (PNG/PDF/SVG)")
    ps.add_argument("--json", action="store_true", help="print the statistics as JSON")
    ps.add_argument("--bin-s", type=float, default=None, help="bin of the rate-over-time series (s)")
    add_workload_args(ps)
    ps.set_defaults(func=cmd_show, prog=ps.prog)

    pf = sub.add_parser("fetch", help="download a public trace into the data directory (checksummed)")
    pf.add_argument("name", help="trace name (see `twin traces list`)")
    pf.add_argument("--data-dir", default=None, help="data directory to fetch into (default: $TWIN_DATA_DIR)")
    pf.add_argument("--force", action="store_true", help="replace an existing file")
    pf.add_argument("--url", default=None, help="download from this URL instead (mirror, file://...)")
    pf.add_argument("--sha256", default=None, help="expected sha256 (overrides the pinned one)")
    pf.add_argument("--timeout", type=float, default=60.0, help="network timeout (s)")
    pf.set_defaults(func=cmd_fetch, prog=pf.prog)

    py = sub.add_parser("synth", help="generate a workload and save it as Parquet (with its parameters)")
    py.add_argument("--trace", default="synthetic", help="base: a synthetic preset, a real trace name or a path")
    py.add_argument("--out", required=True, metavar="FILE.parquet", help="output workload file")
    add_workload_args(py)
    py.set_defaults(func=cmd_synth, prog=py.prog)


def main(argv: list[str] | None = None) -> int:
    """``python -m traces.cli list|show|fetch|synth ...``: ``twin traces`` without the rest of the twin."""
    ap = argparse.ArgumentParser(prog="python -m traces.cli", description="Workloads: built-in real traces (data "
                                 "directory), synthetic presets and every synthesis option (also `twin traces`).")
    add_commands(ap)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
