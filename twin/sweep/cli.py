"""``twin sweep``: run a grid of scenarios x configurations (see :mod:`twin.sweep`)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from traces.arguments import check_writable_dir
from twin.sweep.grid import NAMED_GRIDS


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of scenarios x configurations through the twin (Parquet shards, resume)",
        description=f"Run a named grid ({', '.join(NAMED_GRIDS)}) or a "
                    "TOML/YAML grid file. One task = one scenario's walk over its configurations (slots x served "
                    "adapters); a walk stops at its first starving run and a run stops as soon as it is decided "
                    "starving. One Parquet shard per task under OUT/shards; an interrupted sweep resumes.")
    p.add_argument("grid", nargs="?", default=None, help="named grid or grid file (default: smoke)")
    p.add_argument("--out", default=None, help="output directory (default: sweeps/<grid name>)")
    p.add_argument("--executor", choices=("local", "dask", "ray"), default="local",
                   help="local worker processes (default), a Dask cluster or a Ray cluster")
    p.add_argument("--jobs", type=int, default=1, help="workers (local processes, or local Dask/Ray workers)")
    p.add_argument("--address", default=None, help="scheduler address of a running Dask / Ray cluster")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip tasks whose shard exists (default); --no-resume starts over")
    p.add_argument("--limit", type=int, default=None, help="run only the first N tasks")
    p.add_argument("--every", type=int, default=None, help="run one task in N (an evenly spread fraction)")
    p.add_argument("--shard", default=None, help="i/k: run the i-th of k interleaved parts of the grid (parts run at the same time each need "
                        "their own --out: one sweep at a time writes into an --out)")
    p.add_argument("--exclude", default=None,
                   help="scenarios to leave out, comma-separated: keys, a real-run CSV (its ml_test scenarios, the "
                        "held-out test set) or a labels CSV of `configure dataset` (all its scenarios: sweep the "
                        "rest of a sample whose labels are kept)")
    p.add_argument("--order", choices=("heavy", "shuffle", "grid"), default="heavy",
                   help="task order: heaviest first (default: short tail), shuffled (any prefix is a random "
                        "sample: for measuring a fraction), or the grid's order")
    p.add_argument("--list", action="store_true", help="list the named grids and exit")
    p.add_argument("--dry-run", action="store_true", help="print the grid's size and exit")
    p.add_argument("--summary", action="store_true", help="summarize the results already in --out and exit")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar with ETA (default: on for a terminal)")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from twin.sweep.grid import NAMED_GRIDS, defaults_note, load_grid, window_note
    from twin.sweep.scenario import twin_version
    from twin.sweep.runner import (MissingExtra, check_address, check_executor, check_runnable, check_selection,
                                   done_tasks, exclusion_keys, read_meta, read_results, run_sweep, select_tasks,
                                   shard_dir, summarize_results, unmatched_exclusions)

    _check_mode(args)
    if args.list and args.json:
        grids = [fn() for fn in NAMED_GRIDS.values()]
        print(json.dumps([{"name": g.name, "tasks": len(g.tasks()), "runs_max": g.n_runs_max(), "profile": g.profile,
                           "window_s": g.window_s} for g in grids], indent=2))
        return 0
    if args.list:
        w = max(map(len, NAMED_GRIDS))
        for name, fn in NAMED_GRIDS.items():
            g = fn()
            print(f"{name:<{w}}  {len(g.tasks()):>5} tasks, <= {g.n_runs_max():>6} runs, profile {g.profile}, "
                  f"window {g.window_s:g} s")
        return 0
    check_selection(args.limit, args.shard, args.every, args.jobs)
    check_address(args.executor, args.address)
    if args.out is not None and not args.out.strip():
        raise ValueError("--out: empty; give a directory, e.g. --out sweeps/my-grid (or leave --out out for "
                         "sweeps/<grid name>)")
    grid = load_grid(args.grid or "smoke")
    out = args.out or f"sweeps/{grid.name}"
    if args.summary:
        if Path(out).is_file() and Path(out).suffix != ".parquet":
            raise ValueError(f"--summary --out {out}: a file, not a sweep's directory (nor one of its .parquet "
                             f"shards); give the --out directory of `twin sweep`")
        if args.grid is not None and args.out is not None and (Path(out) / "sweep.json").is_file():
            swept = (read_meta(Path(out)).get("grid") or {}).get("name")
            if swept is not None and swept != grid.name:
                raise ValueError(f"--summary --out {out}: it holds a sweep of grid {swept}, not {grid.name}; leave out "
                                 f"the grid name (the summary is of --out), or give the --out of the {grid.name} sweep")
        s = summarize_results(read_results(out))  # (shards of no task of the grid sweep.json records: refused)
        print(json.dumps(s, indent=2) if args.json else "\n".join(
            f"{k:<26} {'; '.join(v) if isinstance(v, list) else v}" for k, v in s.items()))
        return 0
    if not args.dry_run:
        check_writable_dir("--out", out)  # (before any run: not a file, creatable, writable)
        try:
            check_executor(args.executor)  # (before --out is made)
        except MissingExtra as e:
            print(f"twin sweep: error: {e}", file=sys.stderr)
            return 2
    exclude = exclusion_keys(args.exclude)
    grid_tasks = grid.tasks()
    check_runnable(grid_tasks)
    unmatched = unmatched_exclusions(exclude, grid_tasks)
    # a key given as such that names no scenario is a typo (or another grid's key): refused; a table's keys may
    # legitimately miss the grid (a real-run table, labels of another grid): warned of
    typos = sorted(unmatched & _literal_exclusions(args.exclude))
    if typos and grid_tasks:
        raise ValueError(f"--exclude {','.join(typos)}: {'these keys match' if len(typos) > 1 else 'the key matches'} "
                         f"no scenario of grid {grid.name}, so {'they' if len(typos) > 1 else 'it'} would exclude "
                         f"nothing; its keys look like {grid_tasks[0]['scenario']['key']!r}: fix or drop "
                         f"{'them' if len(typos) > 1 else 'it'}")
    if unmatched and grid_tasks:  # (a table of another grid's scenarios: they exclude nothing)
        print(f"twin sweep: warning: {len(unmatched)} of the {len(exclude)} --exclude keys match no scenario of grid "
              f"{grid.name} (e.g. {sorted(unmatched)[0]!r}) and exclude nothing; its keys look like "
              f"{grid_tasks[0]['scenario']['key']!r}", file=sys.stderr)
    tasks = select_tasks(grid_tasks, args.limit, args.shard, args.every, exclude)
    note = defaults_note(grid, len(grid_tasks))
    if note:
        print(f"twin sweep: note: {note}", file=sys.stderr)
    if exclude and not select_tasks(grid_tasks, exclude=exclude):
        print(f"twin sweep: warning: --exclude leaves none of the {len(grid_tasks)} tasks of grid {grid.name}: "
              f"nothing to run", file=sys.stderr)
    elif args.shard and not tasks and (left := select_tasks(grid_tasks, exclude=exclude)):
        # (a 1-task grid's --shard 1/2 ran nothing and said "0 tasks run (0 of 0)")
        i, k = args.shard.split("/")
        print(f"twin sweep: warning: --shard {args.shard} selects none of the {len(left)} tasks of grid {grid.name} "
              f"(part {i} of {k} takes tasks {i}, {int(i) + int(k)}, ... counted from 0): nothing to run; a grid of "
              f"{len(left)} task{'s' * (len(left) != 1)} has {min(len(left), int(k))} non-empty part"
              f"{'s' * (min(len(left), int(k)) != 1)}", file=sys.stderr)

    def short_window() -> None:  # (a warning, not a refusal: short windows still serve smoke runs and latency checks)
        # (a named grid's window is the grid's design, which `twin sweep --list` states: nothing to act on)
        short = window_note(grid, f"grid {grid.name!r}", "window_s") if grid_tasks else ""
        if short and (args.grid or "smoke") not in NAMED_GRIDS:
            print(f"twin sweep: warning: {short}", file=sys.stderr)

    if args.dry_run:
        from twin.sweep.scenario import get_profile

        short_window()
        d = {"grid": grid.name, "tasks": len(tasks), "configs_per_task": len(grid.configs()),
             "runs_max": grid.n_runs_max(), "profile": grid.profile or get_profile(None).name,
             "digest": grid.digest()}
        print(json.dumps(d, indent=2) if args.json else "\n".join(f"{k:<18} {v}" for k, v in d.items()))
        return 0
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    # a SIGTERM (kill, a batch scheduler's time limit) stops the sweep as Ctrl-C does: the pool's workers are
    # terminated with it (they ran on as orphans), finished shards are kept, and the command says how to resume
    old_term = signal.signal(signal.SIGTERM, _term_as_interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        rep = run_sweep(grid, out, args.executor, args.jobs, args.address, args.resume, args.limit, args.shard,
                        args.every, progress, exclude=exclude, order=args.order, on_start=short_window)
    except MissingExtra as e:
        print(f"twin sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: every finished task's shard is on disk, the next call resumes there
        done = len(done_tasks(out))
        print(f"twin sweep: interrupted; {done} finished task shards are kept under {shard_dir(out)}: "
              f"run the same command to resume (only unfinished tasks run again)", file=sys.stderr)
        return 130
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if rep.shards_damaged:
        print(f"twin sweep: note: {len(rep.shards_damaged)} damaged shards (not readable as Parquet, or not their "
              f"task's run rows, e.g. "
              f"{rep.shards_damaged[0]}) were not counted as finished: their tasks ran again when selected",
              file=sys.stderr)
    if rep.resumed_from_version:
        print(f"twin sweep: note: {out} holds shards written by lora-twin {rep.resumed_from_version}, this is "
              f"{twin_version()}: the kept shards are not recomputed; --no-resume recomputes every task",
              file=sys.stderr)
    d = rep.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        started = f", {rep.runs_start_failed} failed to start" if rep.runs_start_failed else ""
        print(f"sweep {grid.name}: {rep.tasks_run} tasks run ({rep.tasks_done_before} already done of "
              f"{rep.tasks_total}), {rep.runs} runs ({rep.runs_simulated} simulated{started}, {rep.runs_early_stopped} "
              f"stopped early), {rep.cpu_s / 3600:.3f} CPU-h in {rep.wall_s:.1f} s wall -> {out}")
    if rep.runs and not rep.runs_simulated and rep.runs_start_failed:
        print(f"twin sweep: no run was simulated: {rep.runs_start_failed} of the {rep.runs} runs failed vLLM's "
              f"start-up check (first: {rep.first_start_failure}); their rows have status 'start_failure'",
              file=sys.stderr)
    if rep.runs_failed:  # kept as rows with status 'error' (a resumed sweep does not rerun them)
        print(f"twin sweep: {rep.runs_failed} of {rep.runs} runs ended in an error (first: {rep.first_error}); their "
              f"rows have status 'error' and the exception in column 'error' (exit status 1)", file=sys.stderr)
        return 1  # the shards are written; a script must not read the sweep as a success
    return 0


def _term_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM handled as Ctrl-C (:func:`cmd_sweep`)."""
    raise KeyboardInterrupt


def _literal_exclusions(spec: str | None) -> set[str]:
    """The parts of ``--exclude`` given as scenario keys, not as tables (as
    :func:`twin.sweep.runner.exclusion_keys` reads them: a part naming no existing path; a missing path is refused
    there)."""
    return {part.strip() for part in (spec or "").split(",") if part.strip() and not Path(part.strip()).exists()}


def _check_mode(args: argparse.Namespace) -> None:
    """``--list``, ``--summary`` and ``--dry-run`` run nothing: the options only a run reads are refused beside them
    (they would be ignored), as are the first two together (``--dry-run`` reads the selection: ``--limit``,
    ``--every``, ``--shard``, ``--exclude``)."""
    run_only = [("--limit", args.limit is not None), ("--every", args.every is not None),
                ("--shard", args.shard is not None), ("--exclude", args.exclude is not None),
                ("--executor", args.executor != "local"), ("--jobs", args.jobs != 1),
                ("--address", args.address is not None), ("--no-resume", not args.resume),
                ("--order", args.order != "heavy"), ("--dry-run", args.dry_run)]
    if args.list:
        given = [f for f, on in [("GRID", args.grid is not None), ("--out", args.out is not None),
                                 ("--summary", args.summary)] + run_only if on]
        if given:
            raise ValueError(f"--list lists the named grids and runs none, so {' and '.join(given)} would be ignored; "
                             f"give either --list (with --json) or a grid to run")
    elif args.summary:
        given = [f for f, on in run_only if on]
        if given:
            raise ValueError(f"--summary summarizes the results already in --out and runs nothing, so "
                             f"{' and '.join(given)} would be ignored; leave {'them' if len(given) > 1 else 'it'} out "
                             f"(or drop --summary to run the sweep)")
    elif args.dry_run:
        selection = {"--limit", "--every", "--shard", "--exclude"}  # (they decide the tasks the dry run counts)
        given = [f for f, on in run_only + [("--out", args.out is not None)]
                 if on and f not in selection and f != "--dry-run"]
        if given:
            raise ValueError(f"--dry-run prints the grid's size and runs nothing, so {' and '.join(given)} would be "
                             f"ignored; leave {'them' if len(given) > 1 else 'it'} out (or drop --dry-run to run "
                             f"the sweep)")
