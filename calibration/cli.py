"""``twin calibrate``: fit profiles from measurement tables, list them, report on them.

* ``twin calibrate fit --measurements DIR --model NAME [--out FILE]`` fits a profile from
  the tables in DIR (format detected: vLLM 0.8.5 peer tables, vLLM 0.5.0 runs, or Vidur
  operator timings with ``--gpu``) and writes it (default: ``calibration/profiles/<name>.json``).
* ``twin calibrate list`` lists the profiles ``twin run --profile NAME`` accepts.
* ``twin calibrate report PROFILE`` prints every model's constants and fit quality and writes
  a figure per model (measured points against the fitted curve) when the measurements are found.
* ``twin calibrate replay`` replays the published 600 s serving runs (calibration data) through
  the twin and compares adapter loads, completed requests and ITL with the real runs
  (:mod:`calibration.serving_replay`).
* ``twin calibrate replay-offline`` replays the calibration's offline runs (step-latency and
  adapter-overhead runs, all requests at t = 0) end to end through the twin and compares their
  duration, TTFT, ITL and throughput (:mod:`calibration.offline_replay`).
* ``twin calibrate bench ...`` (the GPU microbenchmark harness) is added by
  :mod:`calibration.bench.cli`.
* ``twin calibrate bench-report DIR`` fits the backbone form on the calibration-like shapes of a
  bench's ``step_bench.csv`` and scores it on the larger ones (:mod:`calibration.bench.step_report`),
  and fits the slot-grid kernels' cost per launched and working block (:mod:`calibration.bench.grid_report`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from calibration.bench.cli import register_bench
from traces.arguments import check_writable_dir, check_writable_file
from traces.datadir import data_dir, shown_path
from twin.perf.profile import PROFILE_DIR, available_profiles, load_profile


def register_cli(subparsers) -> None:
    """Add the ``calibrate`` command (``fit``, ``list``, ``report`` [, ``bench``]) to ``subparsers``."""
    p = subparsers.add_parser("calibrate", help="fit, list and report performance profiles",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="calibrate_command")

    fit = sub.add_parser("fit", help="fit a profile from measurement tables")
    fit.add_argument("--measurements", required=True, metavar="DIR",
                     help="directory of calibration tables (e.g. $TWIN_DATA_DIR/calibration/vllm085_h100)")
    fit.add_argument("--model", required=True, help="model name (e.g. llama-3.1-8b, qwen-2.5-7b, llama-2-7b)")
    fit.add_argument("--out", metavar="FILE", help="profile JSON to write (default: calibration/profiles/<name>.json)")
    fit.add_argument("--format", choices=("auto", "vllm085", "vllm050", "vidur"), default="auto",
                     help="table format (default: detected from the directory's files)")
    fit.add_argument("--gpu", default=None, help="(vidur) GPU of the Vidur operator timings: a40, a100-80gb, "
                                                  "a100-48gb, a100-24gb (capped A100s), h100; default a40")
    fit.add_argument("--reference", action="append", metavar="PROFILE",
                     help="(vidur) fitted profile(s) the estimated parts come from; default: "
                          "llama-3.1-8b_h100_vllm085 and llama-2-7b_h100_vllm050")
    fit.add_argument("--vidur-dir", metavar="DIR", help="(vllm050) Vidur operator timings for the prefill cost "
                                                         "(default: the sibling directory vidur_linear_ops)")
    fit.add_argument("--folds", type=int, default=5, help="k of the grouped k-fold held-out scoring (default 5)")
    fit.add_argument("--quiet", action="store_true", help="print only the output path")
    fit.add_argument("--allow-poor-fit", action="store_true",
                     help="write the profile even when a component fails the fit-quality gate (every constant its "
                          "fit estimated on a bound of the fit, a held-out MAPE above 50 %%, a held-out R^2 below 0; "
                          "calibration.fitting.core.fit_quality_problems); the problems are recorded in "
                          "provenance.poor_fit. Without it such a fit is an error (exit 2) and nothing is written")
    fit.set_defaults(func=cmd_fit)

    lst = sub.add_parser("list", help="list the available profiles by name")
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    lst.set_defaults(func=cmd_list)

    rep = sub.add_parser("report", help="constants, fit quality and figures of a profile")
    rep.add_argument("profile", help="profile name (`twin calibrate list`) or JSON file")
    rep.add_argument("--measurements", metavar="DIR",
                     help="measurement directory for the figures (default: the profile's provenance directory "
                          "inside $TWIN_DATA_DIR)")
    rep.add_argument("--out-dir", metavar="DIR", help="where figures go (default: results/calibration/<name>, "
                                                         "the committed figures: replaced only when the measurements "
                                                         "are found)")
    rep.add_argument("--no-figures", action="store_true", help="print only")
    rep.add_argument("--json", action="store_true", help="print the fit-quality summary as JSON")
    rep.add_argument("--markdown", action="store_true", help="print the fit-quality tables as Markdown")
    rep.set_defaults(func=cmd_report)

    rp = sub.add_parser("replay", help="replay the published 600 s serving runs through the twin (adapter loads, "
                                       "completed requests, ITL against the real runs)")
    rp.add_argument("--profile", help="profile (default: the default profile)")
    rp.add_argument("--every", type=int, default=1, help="replay every k-th run (default: all)")
    rp.add_argument("--all-runs", action="store_true", help="also the runs serving no more adapters than slots")
    _replay_outputs(rp)
    rp.set_defaults(func=cmd_replay)

    ro = sub.add_parser("replay-offline", help="replay the calibration's offline runs end to end through the twin "
                                               "(duration, TTFT, ITL, throughput against the real runs)")
    ro.add_argument("--model", default="llama-3.1-8b", help="the model whose runs are replayed (llama-3.1-8b or "
                                                            "qwen-2.5-7b; default llama-3.1-8b)")
    ro.add_argument("--profile", help="profile (default: the model's shipped vLLM 0.8.5 profile)")
    ro.add_argument("--client-start-ms", type=float, default=None,
                    help="the benchmark client's start-up time per request, ms (default: estimated on the prefill "
                         "sweeps; 0: off)")
    ro.add_argument("--seed", type=int, default=0, help="seed of the requests' adapter draws (default 0)")
    ro.add_argument("--markdown", metavar="MD", help="write a Markdown report")
    ro.add_argument("--figure", metavar="PNG", help="draw twin against real per run (duration, TTFT, ITL)")
    _replay_outputs(ro)
    ro.set_defaults(func=cmd_replay_offline)

    register_bench(sub)

    br = sub.add_parser("bench-report", help="what a bench says about the profile's forms: the backbone fitted on "
                                             "step_bench.csv's calibration-like shapes and scored on the larger ones; "
                                             "the slot-grid kernels' cost per launched and working thread block")
    br.add_argument("bench", help="the bench's --out directory (or its step_bench.csv)")
    br.add_argument("--fit-max-decodes", type=int, default=None,
                    help="largest decode count of the calibration-like shapes (default 256)")
    br.add_argument("--fit-max-context", type=int, default=None,
                    help="largest context of the calibration-like shapes, tokens (default 100000)")
    br.add_argument("--form", choices=("graph_roofline", "graph_linear"), default="graph_roofline",
                    help="the backbone form the step report fits (graph_roofline: Llama-3.1-8B's profile; "
                         "graph_linear: Qwen-2.5-7B's)")
    br.add_argument("--profile", default=None, help="profile whose kernel_grid constants the slot-grid fit is set "
                                                   "beside (default: the shipped default profile)")
    br.add_argument("--markdown", metavar="MD", help="write the report as Markdown (e.g. under results/calibration/)")
    br.add_argument("--out", metavar="CSV", help="write the step table with the predictions and ratios")
    br.add_argument("--plot", metavar="PNG", help="draw the steps against context with the fitted form, and "
                                                  "measured / predicted per shape (needs step_bench.csv)")
    br.add_argument("--grid-plot", metavar="PNG", help="draw the slot-grid kernels' time against the slots with the "
                                                       "fitted per-block costs (needs a GPU run's lora_kernels.csv)")
    br.add_argument("--json", action="store_true", help="print the report as JSON")
    br.set_defaults(func=cmd_bench_report)

    def _help(args: argparse.Namespace) -> int:
        p.print_help()  # no subcommand: usage, exit 2 (as `twin configure` does)
        return 2

    p.set_defaults(func=_help)


def cmd_bench_report(args: argparse.Namespace) -> int:
    """The step report (``step_bench.csv``), the slot-grid report (Triton rows of ``lora_kernels.csv``) and the
    host-to-device copies (``h2d_copy.csv``: alone, concurrent, beside a compute job) of a bench directory, each when
    its table is there."""
    from calibration.fitting.core import FitError
    from calibration.bench.grid_report import LORA_FILE, grid_lines, grid_markdown, grid_report, read_grid_rows
    from calibration.bench.step_report import FIT_MAX_CONTEXT, FIT_MAX_DECODES, STEP_FILE, read_step_table, \
        report_markdown, step_report, summary_lines as step_lines
    from calibration.bench.transfer_report import H2D_FILE, h2d_lines, h2d_markdown, h2d_summary, read_h2d_table

    src = Path(args.bench)
    try:
        max_dec = FIT_MAX_DECODES if args.fit_max_decodes is None else args.fit_max_decodes
        max_ctx = FIT_MAX_CONTEXT if args.fit_max_context is None else args.fit_max_context
        if max_dec < 0 or max_ctx < 0:
            raise ValueError("--fit-max-decodes and --fit-max-context must be >= 0")
        for opt, path, ext in (("--markdown", args.markdown, ()), ("--out", args.out, ()),
                               ("--plot", args.plot, FIGURE_SUFFIXES), ("--grid-plot", args.grid_plot, FIGURE_SUFFIXES)):
            if path:  # (a figure's format from its suffix: checked before the fit, not by matplotlib after it)
                check_writable_file(opt, path, ext)
        profile = load_profile(args.profile)  # (an unknown --profile is refused whether or not a slot grid is there)
        if not src.exists():
            raise FileNotFoundError(f"{src}: no such bench directory; give the --out of `twin calibrate bench`")
        has_step = (src / STEP_FILE).is_file() if src.is_dir() else src.name == STEP_FILE
        has_lora = (src / LORA_FILE).is_file() if src.is_dir() else src.name == LORA_FILE
        has_h2d = (src / H2D_FILE).is_file() if src.is_dir() else src.name == H2D_FILE
        if not (has_step or has_lora or has_h2d):
            names = f"none of {STEP_FILE}, {LORA_FILE}, {H2D_FILE}"
            inside = sorted({str(f.parent.relative_to(src)) for name in (STEP_FILE, LORA_FILE, H2D_FILE)
                             for f in src.glob(f"*/{name}")}) if src.is_dir() else []
            if inside:  # (e.g. the device session's bench.tgz, unpacked: one folder per bench process)
                raise FileNotFoundError(f"{src}: {names} here, but its folder(s) "
                                        f"{', '.join(inside)} hold them; give one, e.g. {src / inside[0]}")
            raise FileNotFoundError(f"{src}: {names} here; run `twin calibrate bench "
                                    f"--parts step,lora,h2d --out DIR` and give DIR")
        if args.plot and not has_step:
            raise FileNotFoundError(f"--plot draws the mixed steps, and {src} holds no {STEP_FILE}; leave --plot out "
                                    f"or give a bench directory with the step part")
        step = step_report(read_step_table(src), max_dec, max_ctx, form=args.form) if has_step else None
        h2d = read_h2d_table(src) if has_h2d else None
        grid, grid_why = None, None
        if has_lora:
            try:
                rows = read_grid_rows(src)
            except ValueError as e:  # a CPU run: no Triton timings; the step report may still stand
                if not has_step:
                    raise
                grid_why = str(e)
            else:
                grid = grid_report(rows, profile)
        if args.profile is not None and not has_lora:  # (the profile prices the slot grid only: it did nothing)
            raise ValueError(f"--profile {args.profile}: it prices the slot-grid kernels, and {src} holds no "
                             f"{LORA_FILE}; leave --profile out or give a bench directory with the lora part")
        if args.grid_plot and grid is None:
            raise FileNotFoundError(f"--grid-plot draws the slot-grid kernels, and {src} holds no GPU run's Triton "
                                    f"slot-grid rows ({LORA_FILE}){f': {grid_why}' if grid_why else ''}; leave "
                                    f"--grid-plot out or give a GPU bench directory with the lora part")
    except (FileNotFoundError, KeyError, ValueError, FitError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"twin calibrate bench-report: error: {msg}", file=sys.stderr)
        return 2
    if args.markdown:
        parts = (([report_markdown(step, str(src))] if step else []) + ([grid_markdown(grid)] if grid else [])
                 + ([h2d_markdown(h2d)] if h2d is not None else []))
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text("\n".join(parts))
    if args.out and step:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        step.table.to_csv(args.out, index=False)
    figures = []
    if args.plot and step:
        from calibration.bench.step_report import plot_steps
        figures.append((plot_steps(step), args.plot))
    if args.grid_plot and grid is not None:
        from calibration.bench.grid_report import plot_grid
        figures.append((plot_grid(grid, rows), args.grid_plot))
    for fig, path in figures:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    if args.json:
        print(json.dumps({"step": step.to_dict() if step else None, "slot_grid": grid.to_dict() if grid else None,
                          "h2d": h2d_summary(h2d).to_dict(orient="records") if h2d is not None else None},
                         indent=1, default=float))
        return 0
    lines = (step_lines(step) if step else []) + (grid_lines(grid) if grid else []) + \
        (h2d_lines(h2d) if h2d is not None else [])
    if grid_why:
        lines.append(f"slot-grid report skipped: {grid_why}")
    print("\n".join(lines))
    return 0


def _replay_outputs(parser: argparse.ArgumentParser) -> None:
    """The options every replay command takes: a per-run CSV, JSON output, the data directory."""
    parser.add_argument("--out", metavar="CSV", help="write one row per run")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--data-dir", help="data directory (default $TWIN_DATA_DIR)")


def _shown(path: str | Path) -> str:
    """A path as a profile's command records it (:func:`traces.datadir.shown_path`): ``$TWIN_DATA_DIR/...`` inside the
    data directory, relative to the working directory (the project's root) inside it, else as given; a trailing
    ``/`` kept (the shipped profiles' commands: ``--measurements $TWIN_DATA_DIR/calibration/vidur_linear_ops/``)."""
    shown = shown_path(path)
    if str(path).endswith("/") and not shown.endswith("/"):
        shown += "/"
    return shown


def _quote(part: str) -> str:
    """``shlex.quote``, leaving a leading ``$TWIN_DATA_DIR`` for the shell to expand."""
    head = "$TWIN_DATA_DIR"
    if part == head or part.startswith(head + "/"):
        rest = part[len(head):]
        return head + (shlex.quote(rest) if rest else "")
    return shlex.quote(part)


def _command_line(args: argparse.Namespace, fmt: str, out: Path) -> str:
    """The ``twin calibrate fit`` command that rewrites ``out`` (``fmt``: the detected table format), with the paths
    as :func:`_shown` records them (no machine's own directories: the command reruns from the project's root)."""
    parts = ["twin", "calibrate", "fit", "--measurements", _shown(args.measurements), "--model", args.model,
             "--out", _shown(out)]
    if args.format != "auto":
        parts += ["--format", args.format]
    if fmt == "vidur":
        parts += ["--gpu", args.gpu or DEFAULT_GPU]
        for r in args.reference or []:
            parts += ["--reference", r]
    if fmt == "vllm050" and args.vidur_dir:
        parts += ["--vidur-dir", _shown(args.vidur_dir)]
    if args.folds != 5:
        parts += ["--folds", str(args.folds)]
    if getattr(args, "allow_poor_fit", False):
        parts += ["--allow-poor-fit"]
    return " ".join(_quote(p) for p in parts)


#: the GPU of the Vidur operator timings when ``--gpu`` is not given
DEFAULT_GPU = "a40"
FORMAT_NAMES = {"vllm085": "vLLM 0.8.5 tables of an H100", "vllm050": "vLLM 0.5.0 runs on an H100",
                "vidur": "Vidur operator timings"}


def check_format_options(args: argparse.Namespace, fmt: str) -> None:
    """Refuse options the table format ``fmt`` does not use (they would be silently ignored) and check the
    values of those it does (``--gpu``, ``--reference``: known names), before anything is read."""
    unused = [(flag, v, used_by) for flag, v, used_by in (("--gpu", args.gpu, "vidur"),
                                                          ("--reference", args.reference, "vidur"),
                                                          ("--vidur-dir", args.vidur_dir, "vllm050"))
              if v is not None and fmt != used_by]
    if unused:
        flags = " and ".join(f for f, _, _ in unused)
        why = "; ".join(f"{f} {' '.join(v) if isinstance(v, list) else v}: used only with {FORMAT_NAMES[u]} "
                        f"(--format {u})" for f, v, u in unused)
        raise ValueError(f"{why}; {args.measurements} holds {FORMAT_NAMES[fmt]} (--format {fmt}), whose fit does "
                         f"not use {'them' if len(unused) > 1 else 'it'}: leave {flags} out")
    if fmt != "vidur":
        return
    from calibration.fitting.vidur import GPU_ALIASES, GPUS

    gpu = args.gpu or DEFAULT_GPU
    if GPU_ALIASES.get(gpu.lower(), gpu.lower()) not in GPUS:
        aliases = ", ".join(f"{a} = {g}" for a, g in GPU_ALIASES.items())
        raise ValueError(f"--gpu {gpu}: unknown GPU of the Vidur operator timings; choose one of "
                         f"{', '.join(GPUS)} ({aliases})")
    for r in args.reference or []:
        try:
            load_profile(r)
        except (FileNotFoundError, KeyError, ValueError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise ValueError(f"--reference {r}: {msg}") from None


def cmd_fit(args: argparse.Namespace) -> int:
    # (the commands import what they run: the fitting's imports are a start-up cost every `twin` command paid)
    from calibration.fitting.core import FitError, check_fit_quality, dropped_rows_reported, fit_quality_problems
    from calibration.fitting.fit import fit_profile
    from calibration.fitting.profile_io import write_profile
    from calibration.fitting.tables import detect_format
    from calibration.report import summary_lines

    try:
        if args.folds < 2 or args.folds > 100:
            raise ValueError(f"--folds {args.folds}: the held-out scoring needs 2 to 100 folds, e.g. --folds 5")
        if args.vidur_dir is not None and not Path(args.vidur_dir).is_dir():
            raise FileNotFoundError(f"--vidur-dir {args.vidur_dir}: not a directory; give the folder of Vidur's "
                                    f"operator timings, which holds h100/<model>_mlp.csv (calibration/vidur_linear_ops "
                                    f"under TWIN_DATA_DIR), or leave it out")
        if args.out is not None:  # checked before the fit, not after it
            check_writable_file("--out", args.out, (".json",))
        fmt = detect_format(Path(args.measurements)) if args.format == "auto" else args.format
        check_format_options(args, fmt)
        out_hint = Path(args.out) if args.out else None
        with dropped_rows_reported("twin calibrate fit"):  # rows with NaN left out, named on stderr
            profile = fit_profile(args.measurements, args.model, fmt=fmt, gpu=args.gpu or DEFAULT_GPU,
                                  references=args.reference,
                                  vidur_dir=args.vidur_dir, k=args.folds, command="", data_root=data_dir())
        out = out_hint or PROFILE_DIR / f"{profile['name']}.json"
        profile["provenance"]["command"] = _command_line(args, fmt, out)
        # the gate: a fit that ran but failed (every constant on a bound, a held-out error beyond the limit) is not
        # written -- by default it would overwrite the shipped profile of that name
        if getattr(args, "allow_poor_fit", False):
            problems = fit_quality_problems(profile)
            if problems:
                profile["provenance"]["poor_fit"] = problems
                print("twin calibrate fit: warning: --allow-poor-fit: writing a profile whose fit fails the quality "
                      "gate:\n  " + "\n  ".join(problems), file=sys.stderr)
        else:
            check_fit_quality(profile)
        write_profile(profile, out)
    except (FileNotFoundError, KeyError, ValueError, FitError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"twin calibrate fit: error: {msg}", file=sys.stderr)
        return 2
    if args.quiet:
        print(out)
    else:
        print("\n".join(summary_lines(profile)))
        print(f"\nwrote {out}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for name, path in available_profiles().items():
        if path is None:  # the hand-set constants: `--profile embedded` (`default` names the fitted profile)
            name = "embedded"
        try:
            prof = load_profile(str(path) if path else "embedded")
            raw = prof.raw
            rows.append({"name": name, "model": prof.model.name, "gpu": prof.gpu, "software": prof.software,
                         "version": raw.get("version"), "path": str(path) if path else "(embedded)",
                         "gpu_memory_bytes": raw.get("gpu_memory_bytes"),
                         "description": ("hand-set constants, not fitted (`--profile embedded`; `default` names the "
                                         "fitted profile marked below)") if path is None else raw.get("description", "")})
        except Exception as e:  # a broken file is listed with its problem rather than hiding it
            rows.append({"name": name, "model": "?", "gpu": "?", "software": "?", "version": None,
                         "path": str(path), "description": f"UNLOADABLE: {e}"})
    default = load_profile(None).name
    if args.json:
        print(json.dumps({"default": default, "profiles": rows}, indent=2))
        return 0
    w = max(len(r["name"]) for r in rows)
    print(f"{'name':<{w}}  {'model':<13} {'gpu':<10} {'software':<12} description")
    for r in rows:
        mark = " (default)" if r["name"] == default or (r["name"] == "embedded" and default.startswith("default")) else ""
        print(f"{r['name']:<{w}}  {r['model']:<13} {r['gpu']:<10} {r['software'][:12]:<12} {r['description']}{mark}")
    print(f"\n`twin run --profile NAME|FILE`; without --profile (or with --profile default) the profile is {default}.")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from calibration.fitting.core import FitError, dropped_rows_reported
    from calibration.report import report

    try:
        if args.json and args.markdown:
            raise ValueError("--json and --markdown: give one of them (the fit-quality summary as JSON, or its tables "
                             "as Markdown)")
        if args.measurements is not None and args.no_figures:  # (the text part reads the profile file only)
            raise ValueError(f"--measurements {args.measurements} with --no-figures: the measurements are read only "
                             f"for the figures; leave one of them out")
        if args.out_dir is not None:
            if args.no_figures:
                raise ValueError(f"--out-dir {args.out_dir} with --no-figures: no figure would be drawn there; leave "
                                 f"one of them out")
            check_writable_dir("--out-dir", args.out_dir)  # (not the committed figures' directory, by default)
        with dropped_rows_reported("twin calibrate report"):
            return report(args.profile, measurements=args.measurements, out_dir=args.out_dir,
                          figures=not args.no_figures, as_json=args.json, as_markdown=args.markdown)
    except (FileNotFoundError, KeyError, ValueError, FitError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"twin calibrate report: error: {msg}", file=sys.stderr)
        return 2


def cmd_replay(args: argparse.Namespace) -> int:
    from calibration.serving_replay import read_table, replay_serving_runs, select_runs, summary

    try:
        if args.every < 1:
            raise ValueError(f"--every {args.every}: must be >= 1 (replay every k-th run)")
        if args.out is not None:  # checked before the replay (minutes), not after it
            check_writable_file("--out", args.out, (".csv",))
        profile = load_profile(args.profile)
        if profile.model.name != SERVING_RUNS_MODEL:  # (checked before the replay, as replay-offline checks)
            raise ValueError(_profile_of_another_model(
                args.profile, profile.model.name, SERVING_RUNS_MODEL,
                f"the published serving runs were served by {SERVING_RUNS_MODEL} (the Qwen fit found their lightest "
                f"steps are not Qwen's)"))
        table = select_runs(read_table(args.data_dir), args.every, only_swapping=not args.all_runs)
        runs = replay_serving_runs(table, args.profile)
    except (FileNotFoundError, KeyError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"twin calibrate replay: error: {msg}", file=sys.stderr)
        return 2
    s = {"profile": profile.name, **summary(runs)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        runs.to_csv(args.out, index=False)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{s['runs']} published serving runs replayed (600 s each) on profile {profile.name}")
    print(f"{'LRU variant':<40} {'loads |log t/r|':>16} {'loads t/r':>10} {'completed':>10} {'mean ITL':>9}")
    for k, label in (("plain", "LRU, batch touched at once"), ("order", "LRU, vLLM activation order")):
        v = s[k]
        print(f"{label:<40} {v['loads_mean_abs_log_ratio']:>16.2f} {v['loads_median_ratio']:>10.2f} "
              f"{v['completed_smape']:>9.1f}% {v['itl_smape']:>8.1f}%")
    print("(completed and ITL: 100*mean(|twin-real|/(twin+real)))")
    if args.out:
        print(f"wrote {args.out}")
    return 0


#: the figure formats the reports draw (matplotlib's raster and vector ones)
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")

#: the model that served the calibration's published 600 s serving runs (``scheduler_overhead.csv``)
SERVING_RUNS_MODEL = "llama-3.1-8b"


def _profile_of_another_model(given: str, its_model: str, model: str, whose: str | None = None) -> str:
    """The refusal of ``--profile given`` (a profile of ``its_model``) for the runs of ``model`` (``whose``: what says
    they are ``model``'s; default: ``--model``), naming the shipped profiles of ``model``."""
    own = []
    for name, path in available_profiles().items():
        if path is None:
            continue
        try:
            if load_profile(str(path)).model.name == model:
                own.append(name)
        except (FileNotFoundError, KeyError, ValueError):  # (a broken file is not offered)
            continue
    which = (f"pass a profile of {model} (shipped: {', '.join(own)})" if own
             else f"pass a profile fitted for {model} (`twin calibrate fit --model {model}`)")
    whose = whose or f"--model {model} replays the runs of {model}"
    return (f"--profile {given}: a profile of {its_model}, but {whose}; leave "
            f"--profile out (the model's shipped profile) or {which}")


def cmd_replay_offline(args: argparse.Namespace) -> int:
    from calibration.fitting.core import FitError
    from calibration.fitting.tables import Vllm085Tables
    from calibration.offline_replay import (estimate_client_start, offline_runs, profile_for_model,
                                            replay_figure, replay_offline_runs, summary as offline_summary,
                                            write_markdown)
    from twin.model_spec import get_model

    try:
        if args.client_start_ms is not None and not (args.client_start_ms >= 0 and args.client_start_ms < 1e6):
            raise ValueError(f"--client-start-ms {args.client_start_ms}: give the start-up time per request in ms, "
                             f">= 0 (0: off), e.g. --client-start-ms 1.0")
        if args.seed < 0:
            raise ValueError(f"--seed {args.seed}: must be >= 0 (the seed of the requests' adapter draws), e.g. "
                             f"--seed 0")
        for flag, path, ext in (("--out", args.out, (".csv",)), ("--markdown", args.markdown, (".md",)),
                                ("--figure", args.figure, (".png",))):
            if path is not None:  # checked before the replay, not after it
                check_writable_file(flag, path, ext)
        spec = get_model(args.model)
        profile = load_profile(args.profile or profile_for_model(spec.name))
        if profile.model.name != spec.name:  # (it would price the runs of one model with another's constants)
            raise ValueError(_profile_of_another_model(args.profile, profile.model.name, spec.name))
        directory = data_dir(args.data_dir) / "calibration" / "vllm085_h100"
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory} does not exist: set TWIN_DATA_DIR to the shared data directory "
                                    f"(or give --data-dir), which holds calibration/vllm085_h100")
        tables = Vllm085Tables.read(directory, spec)
        runs = offline_runs(tables.step_runs, tables.lora_runs)
        if len(runs) == 0:
            raise ValueError(f"{directory} holds no successful offline run of {spec.name}")
        if args.client_start_ms is None:
            est = estimate_client_start(runs, profile, args.seed)
            client_s = est if est is not None and est > 0 else 0.0
        else:
            client_s = args.client_start_ms / 1e3
        rows = replay_offline_runs(runs, profile, args.seed, client_start_s=client_s)
    except (FileNotFoundError, KeyError, ValueError, FitError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"twin calibrate replay-offline: error: {msg}", file=sys.stderr)
        return 2
    s = offline_summary(rows)
    skipped = runs.attrs.get("skipped", [])
    s.update({"model": spec.name, "profile": profile.name, "client_start_ms": client_s * 1e3,
              "runs_not_replayed": [{"run_dir": r, "status": st} for r, st in skipped]})
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        rows.to_csv(args.out, index=False, float_format="%.6g")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        cmd = f"twin calibrate replay-offline --model {args.model} --out {args.out or 'CSV'} --markdown {args.markdown}"
        if args.figure:
            cmd += f" --figure {args.figure}"
        write_markdown(rows, s, Path(args.markdown), cmd, profile.name)
    if args.figure:
        Path(args.figure).parent.mkdir(parents=True, exist_ok=True)
        replay_figure(rows, f"{spec.name}: calibration offline runs replayed ({profile.name})").savefig(
            args.figure, dpi=110)
    if args.json:
        print(json.dumps(s, indent=2, default=float))
        return 0
    print(f"{s['runs']} offline runs of {spec.name} replayed (profile {profile.name}; client start-up "
          f"{client_s * 1e3:.2f} ms per request)")
    if skipped:  # (a failed run, or one without its lengths or duration: nothing to replay against)
        print(f"{len(skipped)} run(s) of the tables not replayed: "
              + "; ".join(f"{r} ({st})" for r, st in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    print(f"{'runs':<12} {'experiment':<18} {'n':>3} {'duration':>9} {'mean TTFT':>10} {'mean ITL':>9} {'tok/s':>7}")

    def f(v):
        return f"{v:.1f}%" if v is not None else "-"
    for kind, label in (("fitted", "fitted"), ("not_fitted", "never fitted")):
        for exp, b in s[kind].items():
            if exp == "runs":
                continue
            print(f"{label:<12} {exp:<18} {b['runs']:>3} {f(b['smape_duration_s']):>9} {f(b['smape_mean_ttft_ms']):>10} "
                  f"{f(b['smape_mean_itl_ms']):>9} {f(b['smape_total_tok_s']):>7}")
    print("(SMAPE, 100*mean(|twin-real|/(twin+real)); fitted: the run's windows are in the profile's fit)")
    for path in (args.out, args.markdown, args.figure):
        if path:
            print(f"wrote {path}")
    return 0
