"""The ``twin`` command.

``twin run`` replays a workload through the engine (``twin run`` alone runs the embedded
default scenario); ``twin policies`` lists schedulers, caches and presets; the ``traces``,
``calibrate``, ``validate`` and ``compare`` commands come from their packages.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import calibration.cli
import traces.cli
import twin.compare
import twin.configurator.cli
import twin.reproduce.cli
import twin.sweep.cli
import twin.validation.cli
from traces.arguments import check_writable_dir
from traces.flags import add_arguments, given_values
from twin.config import ConfigError
from twin.figures import LATENCY_PNG, TIMELINE_PNG, write_run_figures
from twin.perf.profile import load_profile
from twin.registry import describe_all, resolve_system
from twin.requests import with_option
from twin.scenario import (SUMMARY_MARKERS, SYSTEM_OPTIONS, RunConfig, build_engine_config,
                           build_workload, check_adapter_options_act, check_model, check_run, check_system_options,
                           load_scenario_file, option_name, replay_warnings, resolved_scenario, to_toml,
                           with_trace_defaults)
from twin.simulate import NothingAdmittedWarning, simulate

#: the modules that add the other commands (``traces``, ``calibrate``, ``validate``, ``compare``, ``sweep``,
#: ``configure``, ``reproduce``)
COMMAND_MODULES = (traces.cli, calibration.cli, twin.validation.cli, twin.compare, twin.sweep.cli,
                   twin.configurator.cli, twin.reproduce.cli)

SUMMARY_ROWS = [
    ("requests arrived / finished", lambda s: f"{s['requests_arrived']} / {s['requests_finished']}"
     + (f" ({s['requests_not_arrived']} more of the workload arrive after the horizon, not simulated)"
        if s.get("requests_not_arrived") else "")),
    ("rejected / unfinished", lambda s: f"{s['requests_rejected']} / {s['requests_unfinished']}" + _reasons(s)
     + _drops(s)),
    ("offered / throughput (req/s)", lambda s: ("all at t=0" if s["offered_rps"] is None else _f(s["offered_rps"], 3))
                                               + f" / {_f(s['throughput_rps'], 3)}"),
    ("tokens/s in / out", lambda s: f"{_f(s['input_tok_s'], 1)} / {_f(s['output_tok_s'], 1)}"),
    ("TTFT ms mean / p50 / p99", lambda s: f"{_f(s['ttft_ms_mean'])} / {_f(s['ttft_ms_p50'])} / {_f(s['ttft_ms_p99'])}"),
    ("ITL ms mean / p99", lambda s: f"{_itl_mean(s)} / {_f(s['itl_ms_p99'])}"),
    ("TPOT ms mean", lambda s: _f(s["tpot_ms_mean"])),
    ("E2E ms mean / p99", lambda s: f"{_f(s['e2e_ms_mean'])} / {_f(s['e2e_ms_p99'])}"),
    ("adapter hit rate requests / activations",
     lambda s: f"{_f(s.get('adapter_hit_rate_requests'), 3)} / {_f(s['adapter_hit_rate'], 3)}"),
    ("adapter loads cpu / disk", lambda s: f"{s['adapter_loads_from_cpu']} / {s['adapter_loads_from_disk']}"),
    ("link GB / utilization", lambda s: f"{_f(s['link_gb'], 3)} / {_f(s.get('link_utilization'), 4)}"),
    ("GPU busy fraction", lambda s: _f(s.get("gpu_busy_fraction"), 3)),
    ("preemptions", lambda s: str(s["preemptions"])),
    ("KV capacity (tokens)", lambda s: str(s["kv_capacity_tokens"])),
    ("simulated s / wall s", lambda s: f"{_f(s['simulated_s'], 1)} / {_f(s['wall_s'], 3)}"),
]


def _itl_mean(s: dict[str, Any]) -> str:
    """The mean ITL (over finished requests), saying why it is empty when the P99 (over every emitted token,
    unfinished requests' included) is not."""
    if s["itl_ms_mean"] is None and s.get("itl_ms_p99") is not None:
        return "- (no finished request of 2+ tokens)"
    return _f(s["itl_ms_mean"])


def _reasons(s: dict[str, Any]) -> str:
    """The rejections by reason, e.g. `` (110: prompt longer than ...)``; nothing when none."""
    r = s.get("reject_reasons") or {}
    return " (" + "; ".join(f"{n}: {with_option(why)}" for why, n in r.items()) + ")" if r else ""


def _drops(s: dict[str, Any]) -> str:
    """The unfinished requests that failed before the queue, by reason (``drop_reasons``); nothing when none."""
    r = s.get("drop_reasons") or {}
    return " (of the unfinished: " + "; ".join(f"{n} {why}" for why, n in r.items()) + ")" if r else ""


def _f(x: Any, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def serving_setup(engine: Any, system: str) -> str:
    """What the server served: the adapters the workload requested, the GPU adapter slots (``max_loras``;
    S-LoRA has none: adapters share its unified memory pool) and the largest LoRA rank (``max_lora_rank``,
    the workload's largest unless given)."""
    import numpy as np

    cfg = engine.config
    # the adapters of the requests that arrived (a request past --horizon was never offered)
    asked = engine.adapter[(engine.arrival <= engine.horizon) & (engine.adapter >= 0)]
    if not len(asked):
        return "none: the base model only"
    slots = "unified pool" if system == "slora" else str(cfg.max_loras) if cfg.enable_lora else "LoRA off"
    return f"{len(np.unique(asked))} / {slots} / {engine.max_lora_rank}"


def format_summary(s: dict[str, Any], setup: str | None = None) -> str:
    """A readable two-column table of the main figures; ``setup``: :func:`serving_setup`'s line."""
    rows = [("policy", f"{s.get('policy')} (profile {s.get('profile')})"), ("system", str(s.get("system", "vllm"))),
            ("trace", str(s.get("trace", "-")))]
    if setup is not None:
        rows.append(("adapters requested / slots / max rank", setup))
    rows += [(k, fn(s)) for k, fn in SUMMARY_ROWS]
    if "slo_attainment" in s:
        rows.append(("SLO attainment", _f(s["slo_attainment"], 3)))
    if s.get("note"):  # e.g. a scheduler that admitted no request (twin.simulate.nothing_admitted_note)
        rows.append(("note", str(s["note"])))
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 34)
    return "\n".join([line] + [f"{k:<{w}}  {v}" for k, v in rows] + [line])


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``twin run``: every :class:`RunConfig` field (unset ones stay ``None`` so
    that they do not override ``--config``), the scenario file and where the results go."""
    p.add_argument("--config", metavar="FILE", default=None,
                   help="scenario file (TOML, YAML or JSON, a run's summary.json too) with twin run's options under "
                        "RunConfig's field names (rps, max_num_seqs, trace_options, ...); flags override it")
    p.add_argument("--dump-config", action="store_true",
                   help="print the resolved scenario as TOML (a --config file) and exit")
    add_arguments(p, RunConfig, unset_defaults=True)
    p.add_argument("--out", default=None, help="write requests.parquet, steps.parquet, summary.json here")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--plot", action="store_true",
                   help="write latency.png (TTFT, ITL) and timeline.png (requests, KV, adapters, link) into --out "
                        "(without --out: into a new temporary directory, printed)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on simulated time (default: on for a terminal)")


OUT_FILES = ("requests.parquet", "steps.parquet", "summary.json")


def check_out_dir(out: str) -> bool:
    """``--out``: refused before any work when it names a file, sits under a file, cannot be created or
    written, or holds a ``summary.json`` that is not a twin run's (a user's file would be overwritten).
    Returns whether it holds an earlier run's results (whose figures a run without ``--plot`` removes)."""
    try:
        path = check_writable_dir("--out", out)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for name in OUT_FILES:
        f = path / name
        if f.exists() and (f.is_dir() or not os.access(f, os.W_OK)):
            raise ConfigError(f"--out {out}: {f} exists and cannot be replaced; remove it or give another directory")
    summary = path / "summary.json"
    if not summary.exists():
        return False
    try:
        earlier = json.loads(summary.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        earlier = None
    if not isinstance(earlier, dict) or not SUMMARY_MARKERS & set(earlier):
        raise ConfigError(f"--out {out}: {summary} is not the summary of a twin run and would be overwritten; give a "
                          f"new or empty directory (or remove the file)")
    return True


def resolve_run(args: argparse.Namespace) -> tuple[RunConfig, dict[str, Any]]:
    """The scenario: :class:`RunConfig` defaults, then ``--config``, then the flags given;
    returns it with the file's recorded facts (profile hash, policy parameters)."""
    values: dict[str, Any] = {}
    recorded: dict[str, Any] = {}
    if args.config:
        values, recorded = load_scenario_file(args.config)
    in_file = dict(values)
    given = given_values(RunConfig, args)
    for key in ("trace_options", "scheduler_options", "cache_options"):  # a flag's keys over the file's
        if key in given and key in values:
            given[key] = list({**dict(values[key]), **dict(given[key])}.items())
    values.update(given)
    run = RunConfig(**values)
    try:
        check_run(run)
    except ConfigError as e:  # a policy or trace option of the file: named as the file's, not as a flag's
        raise ConfigError(_name_option_sources(str(e), given, in_file, args.config)) from None
    runs_on = {run.policy or "vllm": resolve_system(run.policy, run.system)}
    check_system_options(given, runs_on, run.system is not None)
    _check_file_system_options(args.config, in_file, given, recorded, run, runs_on)
    return run, recorded


#: how an error names the option tables, as flags
_TABLE_FLAGS = {"scheduler_options": "--scheduler-opt", "cache_options": "--cache-opt", "trace_options": "--trace-opt"}


def _name_option_sources(msg: str, given: dict[str, Any], in_file: dict[str, Any], path: str | None) -> str:
    """An option-table error (``--scheduler-opt: ...``, ``--scheduler-opt / --cache-opt: ...``) with each table
    named where it came from: the flag, the scenario file's ``[scheduler_options]``, or both."""
    def source(key: str) -> str:
        parts = [_TABLE_FLAGS[key]] if key in given else []
        if in_file.get(key):
            parts.append(f"--config {path} [{key}]")
        return " / ".join(parts) or _TABLE_FLAGS[key]

    both = f"{_TABLE_FLAGS['scheduler_options']} / {_TABLE_FLAGS['cache_options']}"
    if msg.startswith(both):
        label = f"{source('scheduler_options')} / {source('cache_options')}"
        if not ({"scheduler_options", "cache_options"} & set(given)):  # (both tables of the file)
            label = f"--config {path} [scheduler_options] / [cache_options]"
        return label + msg[len(both):]
    for key, flag in _TABLE_FLAGS.items():
        if msg.startswith(flag):
            return source(key) + msg[len(flag):]
    return msg


def _check_file_system_options(path: str | None, in_file: dict[str, Any], given: dict[str, Any],
                               recorded: dict[str, Any], run: RunConfig, runs_on: dict[str, str]) -> None:
    """A scenario file's options that the run's serving system does not read (:data:`SYSTEM_OPTIONS`): refused in a
    hand-written file, as their flags are; in a scenario the twin wrote (a recorded profile hash: it holds every
    option, those it resolved included), said in a warning when they differ from the defaults, so a vLLM run's
    summary replays on an S-LoRA preset."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.default is not dataclasses.MISSING}
    unread = [k for k, v in in_file.items() if k in SYSTEM_OPTIONS and k not in given and v != defaults.get(k)]
    if not unread:
        return
    system = next(iter(runs_on.values()))
    unread = [k for k in unread if SYSTEM_OPTIONS[k][0] != system]
    if unread and "profile_sha256" in recorded:
        # (every recorded scenario holds the slots it resolved, a run's on S-LoRA too: not said)
        if shown := ", ".join(f"{k} = {in_file[k]!r}" for k in unread if k != "slots"):
            warnings.warn(f"--config {path}: {shown}: options of another serving system than this run's, which "
                          f"does not read them")
        return
    try:
        check_system_options(unread, runs_on, run.system is not None)
    except ConfigError as e:
        key = next(k for k in unread if str(e).startswith(option_name(k) + ":"))
        why = str(e).split(": ", 1)[1].replace(f"leave {option_name(key)} out", "remove it from the file")
        raise ConfigError(f"--config {path}: {key} = {in_file[key]!r}: {why}") from None


def cmd_run(args: argparse.Namespace) -> int:
    if args.dump_config:  # (it prints the scenario and stops: what writes or prints results would be ignored)
        moot = [f for f, v in (("--out", args.out), ("--json", args.json), ("--plot", args.plot),
                               ("--progress", args.progress)) if v]
        if moot:
            raise ConfigError(f"{' / '.join(moot)} with --dump-config: nothing is run or written (it prints the "
                              f"scenario and stops); leave {'it' if len(moot) == 1 else 'them'} out")
    run, recorded = resolve_run(args)
    run = with_trace_defaults(run)  # e.g. the rate and window splitwise is replayed with, recorded in the scenario
    earlier_run = check_out_dir(args.out) if args.out is not None else False
    profile = load_profile(run.profile)
    check_model(run, profile)
    workload = build_workload(run)
    check_adapter_options_act(run, workload, given_values(RunConfig, args))
    kept, rows = workload.meta.get("rows_kept"), workload.meta.get("rows_in_file")
    if kept is not None and rows is not None and kept < rows:  # (a window of a saved workload file)
        print(f"twin run: note: the --duration / window_start window keeps {kept} of the {rows} requests of "
              f"{run.trace}; the others are not simulated (a later window_start or a longer --duration takes them; "
              f"--horizon instead of --duration keeps them as not_arrived)", file=sys.stderr)
    cfg = build_engine_config(run, workload, profile)
    scenario = resolved_scenario(run, profile, cfg, workload)
    for w in replay_warnings(recorded, scenario):
        print(f"twin run: warning: {w}", file=sys.stderr)
    if args.dump_config:
        print(to_toml(scenario), end="")
        return 0
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    with warnings.catch_warnings():  # (said below as `twin run: warning: ...`, from the summary's note)
        warnings.simplefilter("ignore", NothingAdmittedWarning)
        res = simulate(workload, profile, cfg, policy=run.policy, scheduler=run.scheduler, cache=run.cache,
                       scheduler_opts=dict(run.scheduler_options), cache_opts=dict(run.cache_options),
                       system=run.system, horizon_s=run.horizon, ttft_slo_s=run.ttft_slo, tbt_slo_s=run.tbt_slo,
                       progress=progress, frontend_s=run.frontend_ms / 1000.0,
                       serving_s_per_running=run.serving_us / 1e6, rank_tile_cost=run.rank_tile_cost,
                       extra={"trace": scenario["trace"], "workload": workload.meta, "config": cfg.to_dict(),
                              "scenario": scenario})
    if res.summary.get("note"):
        print(f"twin run: warning: {res.summary['note']}", file=sys.stderr)
    if args.json:
        print(json.dumps(res.summary, indent=2, default=str))
    else:
        print(format_summary(res.summary, serving_setup(res.engine, res.summary["system"])))
    if args.out:
        try:
            res.write(args.out)
        except OSError as e:
            where = e.filename or args.out
            print(f"twin run: error: could not write the results to {where} ({e.strerror or e}); the summary above "
                  f"is all that is kept", file=sys.stderr)
            return 2
        if not args.json:
            print(f"wrote {Path(args.out) / 'requests.parquet'}, steps.parquet, summary.json")
        if not args.plot and earlier_run:  # an earlier run's figures would sit beside this run's results: they go
            for name in (LATENCY_PNG, TIMELINE_PNG):
                (Path(args.out) / name).unlink(missing_ok=True)
    figures = []
    if args.plot:
        fig_dir = args.out or tempfile.mkdtemp(prefix="twin-run-")
        figures = write_run_figures(fig_dir, res.requests, res.steps, res.summary)
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
                system = f"[system {r['system']}] " if "system" in r else ""
                print(f"  {r['name']:<{w}}  {system}{r['description']}{cite}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twin", description="LoRA Twin: a digital twin of a multi-LoRA LLM server")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="simulate a workload (no arguments: the embedded default scenario)")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    pol = sub.add_parser("policies", help="list schedulers, adapter-cache policies and presets")
    pol.add_argument("--json", action="store_true", help="print the registries as JSON (kind, name, description, citation)")
    pol.set_defaults(func=cmd_policies)
    for module in COMMAND_MODULES:
        module.register_cli(sub)
    _name_commands(parser)
    return parser


def _name_commands(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's parser records its name as ``args.prog`` (``twin configure predict``), the
    name its errors are printed under, as argparse names its own; a command that sets ``prog`` keeps it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if sub.get_default("prog") is None:
                    sub.set_defaults(prog=sub.prog)
                _name_commands(sub)


#: what a command raises for bad input (reported as ``twin CMD [SUBCMD]: error: ...``, exit 2)
INPUT_ERRORS = (ConfigError, KeyError, FileNotFoundError, ValueError, NotADirectoryError, IsADirectoryError,
                PermissionError)


def _said_warning(prog: str) -> Callable[..., None]:
    """``warnings.showwarning`` for a command: the twin's own warnings (a repeated real run, ...) as
    ``twin validate: warning: ...`` on stderr, as the commands' own warnings read, not as Python's ``file:line:
    Category: ...`` with a source line; other packages' warnings as Python prints them."""
    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if str(filename).startswith(str(Path(__file__).resolve().parents[1])):  # (the twin's packages)
            print(f"{prog}: warning: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)
    return show


def _parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``twin configure predict``), the top one included."""
    out = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out.update(_parsers(sub))
    return out


def unrecognized_message(parser: argparse.ArgumentParser, prog: str, extras: list[str]) -> str:
    """What ``twin CMD`` says for arguments it does not take: the option's closest name in this command,
    the other commands that take it (``--policy`` is ``twin run``'s; ``twin compare`` takes ``--policies``),
    and the help to read; a stray value is named as such (argparse says only "unrecognized arguments")."""
    parsers = _parsers(parser)
    own = parsers.get(prog, parser)
    flags = [o for a in own._actions for o in a.option_strings]
    first = next((x for x in extras if x.startswith("-") and len(x) > 1), None)
    if first is None:
        return (f"unexpected argument{'s' if len(extras) > 1 else ''} {' '.join(map(repr, extras))}: {prog} takes "
                f"no value there (is an option name missing, or a value quoted apart?); see {prog} --help")
    name = first.split("=", 1)[0]
    others = [p for p, sub in parsers.items() if p != prog and any(name in a.option_strings for a in sub._actions)]
    where = (f"; it is an option of {', '.join(others)}" if others else "")
    rest = [x for x in extras if x.startswith("-") and len(x) > 1 and x.split("=", 1)[0] != name]
    more = f" (and {', '.join(x.split('=', 1)[0] for x in rest)})" if rest else ""
    close = difflib.get_close_matches(name.lstrip("-"), [f.lstrip("-") for f in flags], n=1, cutoff=0.7)
    mean = f" (did you mean --{close[0]}?)" if close else ""
    return f"{name} is not an option of {prog}{mean}{where}{more}; see {prog} --help"


#: a value that starts like a negative number (``-0.4,0.05``, ``-1/2``, ``-.5``): argparse takes only a bare
#: ``-1`` or ``-0.5`` for a value, so ``--rates -0.4,0.05,0.1`` read as an option ("expected one argument")
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def attach_negative_values(argv: list[str]) -> list[str]:
    """``--flag -0.4,0.05`` as ``--flag=-0.4,0.05``: a value after a long option that looks like a negative number
    (not a bare one, which argparse already takes) reaches the option, whose own check then names the problem
    ("-0.4 is not a rate") instead of argparse's "expected one argument"."""
    out: list[str] = []
    for tok in argv:
        prev = out[-1] if out else ""
        if (_NEGATIVE_VALUE.match(tok) and prev.startswith("--") and "=" not in prev and len(prev) > 2
                and not re.fullmatch(r"-\d+(\.\d*)?|-\.\d+", tok)):
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    argv = attach_negative_values(list(sys.argv[1:] if argv is None else argv))
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            prog = getattr(args, "prog", None) or parser.prog
            print(f"{prog}: error: {unrecognized_message(parser, prog, extras)}", file=sys.stderr)
            return 2
    except SystemExit as e:  # argparse has printed the usage and the error (or the help)
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _said_warning(args.prog)
            return func(args)
    except INPUT_ERRORS as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.errno is not None and e.filename:  # raised by the OS, not by the twin
            msg = f"cannot use {e.filename}: {e.strerror}; check the path (or give another)"
        print(f"{args.prog}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: no traceback (`twin sweep` says how to resume)
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`twin ... | head`): stop quietly
        try:  # (and let the interpreter's final flush of stdout go nowhere)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 1
    except OSError as e:  # an output path the command could not use (a file where a directory goes, ...)
        where = f" {e.filename}" if e.filename else ""
        print(f"{args.prog}: error: cannot use{where}: {e.strerror or e}; give another path",
              file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
