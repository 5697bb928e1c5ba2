"""``twin reproduce NAME [--quick] [--out DIR] [--json]``: a seed paper's experiment, our numbers beside theirs.

    twin reproduce --list
    twin reproduce chameleon-fig11 --quick
    twin reproduce fastlibra-ttft --json
    twin reproduce all --out results/reproductions     # every name + README.md (the committed results)

A reproduction sets the paper's experiment up end to end (workload, profile, loads relative to
the baseline's knee measured by the twin, SLOs as the paper defines them) and prints one row per
number of the paper it reproduces: metric, condition, unit, the paper's value, the twin's.
``--json`` prints ``{"name": ..., "rows": [{"metric", "condition", "unit", "paper", "twin"}, ...]}``
(a list of them for ``all``). ``--out DIR`` writes ``rows.parquet``, ``rows.csv``, ``points.csv``
(every simulated point), ``summary.json`` and ``figure.png`` (under ``DIR/NAME/`` for ``all``,
with ``DIR/README.md``). ``--quick`` is the short variant CI runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from traces.arguments import check_writable_dir
from twin.config import ConfigError
from twin.reproduce.base import Outcome, Runner
from twin.reproduce.point_cache import PointCache
from twin.reproduce.registry import ALL, REPRODUCTIONS, resolve_names, run_reproduction
from twin.reproduce.report import format_outcome, readme, write_outcome


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("reproduce", help="reproduce a seed paper's result by name (table: paper vs twin)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", default=None, help=f"reproduction name (`--list`), or {ALL}")
    p.add_argument("--list", action="store_true", help="list the reproductions and exit")
    p.add_argument("--quick", action="store_true", help="the short variant (short horizon, fewer rates; what CI runs)")
    p.add_argument("--out", default=None, help="write rows.parquet/csv, points.csv, summary.json and figure.png here")
    p.add_argument("--json", action="store_true", help='print {"name": ..., "rows": [...]} as JSON')
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over the simulations (default: on for a terminal)")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="keep every simulated point in DIR and reuse the points an earlier run of the same code "
                        "left there (keyed by a fingerprint of the code and profiles; default: $TWIN_REPRODUCE_CACHE, "
                        "else none)")
    p.set_defaults(func=cmd_reproduce)


def engine_note(outcomes: list[Outcome]) -> str:
    """Which serving system ran each preset (read from the presets, so a merged engine shows)."""
    systems: dict[str, str] = {}
    for o in outcomes:
        systems.update(o.setup.get("presets") or {})
        for pol in (o.setup.get("policies") or {}).values():
            if pol.get("preset"):
                systems[pol["preset"]] = pol.get("system") or ""
    kinds = sorted(set(systems.values()))
    return ("**Engine.** These results were produced with the serving system(s): " + "; ".join(kinds) +
            ". Presets: " + ", ".join(f"`{p}`" for p in sorted(systems)) + ".")


def cmd_reproduce(args: argparse.Namespace) -> int:
    if args.list:
        runs = [f for f, given in (("NAME", args.name is not None), ("--quick", args.quick),
                                   ("--out", args.out is not None), ("--cache", args.cache is not None)) if given]
        if runs:
            raise ConfigError(f"--list lists the reproductions and runs none, so {', '.join(runs)} would be ignored; "
                              f"give either --list or a reproduction name")
    if args.list and args.json:
        print(json.dumps([{"name": r.name, "paper": r.paper, "description": r.description}
                          for r in REPRODUCTIONS.values()], indent=2))
        return 0
    if args.list:
        w = max(len(n) for n in REPRODUCTIONS)
        for r in REPRODUCTIONS.values():
            print(f"{r.name:<{w}}  {r.paper}: {r.description}")
        return 0
    if not args.name:
        raise ConfigError(f"give a reproduction name ({', '.join(REPRODUCTIONS)}, or {ALL}); `twin reproduce --list` "
                          f"describes them")
    names = resolve_names(args.name)
    out = None
    if args.out is not None:
        out = check_writable_dir("--out", args.out)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    cache = PointCache(check_writable_dir("--cache", args.cache)) if args.cache is not None else None
    runner = Runner(progress=progress, cache=cache)
    outcomes = []
    for name in names:
        o = run_reproduction(name, quick=args.quick, runner=runner)
        outcomes.append(o)
        if out is not None:
            write_outcome(o, REPRODUCTIONS[name].figure, out / name if args.name == ALL else out)
        if not args.json:
            print(format_outcome(o))
            print()
    if out is not None and args.name == ALL:
        cmd = f"twin reproduce {ALL}{' --quick' if args.quick else ''} --out {args.out}"
        (out / "README.md").write_text(readme(outcomes, cmd, engine_note(outcomes)))
    if args.json:
        docs = [o.as_json() for o in outcomes]
        print(json.dumps(docs[0] if args.name != ALL else docs, indent=2))
    elif out is not None:
        print(f"wrote {out}" + (f" ({', '.join(names)} and README.md)" if args.name == ALL else ""))
    return 0
