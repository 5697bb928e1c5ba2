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
the first policy: a TTFT reading of Chameleon §6's "SLO = 5x the latency of a request on an
unloaded system", chosen because the SLO bounds TTFT. ``twin reproduce chameleon-fig11`` follows
the paper's own set-up instead (5x the unloaded mean execution time, E2E: with the paper's short
requests that is its 5 s SLO), so the two SLOs differ on the same workload.

Writes ``compare.csv``, ``sustained.json`` and ``compare.png`` (P99 TTFT, P99 TBT, goodput and
the request-level adapter hit rate against the rate, one line per policy) into ``--out``
(default ``runs/compare/<trace>``, printed at the end); a progress bar counts the runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import pandas as pd

from traces.arguments import check_writable_dir, first_repeat, has_empty_item, parse_list
from traces.flags import add_arguments, from_namespace, given_values
from twin.figures import compare_figure
from twin.config import ConfigError
from twin.perf.profile import Profile, load_profile
from twin.registry import CACHES, PRESETS, SCHEDULERS, load_entry_points, resolve_policy, resolve_system
from twin.requests import with_option
from twin.scenario import (MAX_SIM_SECONDS, RunConfig, build_engine_config, build_workload, check_adapter_options_act,
                           check_number, check_run, check_system_options, for_preset)
from twin.simulate import simulate

COLUMNS = [("ttft_ms_p50", "TTFT p50 ms", 0), ("ttft_ms_p99", "TTFT p99 ms", 0), ("itl_ms_p50", "ITL p50 ms", 1),
           ("itl_ms_p99", "ITL p99 ms", 1), ("offered_rps", "offered req/s", 2), ("throughput_rps", "thr req/s", 2), ("goodput_rps", "goodput req/s", 2),
           ("slo_attainment", "SLO att.", 3), ("adapter_hit_rate_requests", "hit rate req.", 3),
           ("adapter_hit_rate", "hit rate act.", 3)]
#: request counts printed after the summary columns (arrived in the window, refused at admission)
COUNT_COLUMNS = [("requests", "arrived"), ("rejected", "rejected")]


def parse_names(text: str) -> list[str]:
    """Comma-separated names (preset names contain dashes, so not :func:`parse_list`)."""
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ValueError("--policies: give at least one preset, e.g. slora,chameleon")
    if has_empty_item(text):
        raise ValueError(f"--policies: {text!r} has an empty name (two commas in a row, or a comma at an end)")
    _no_repeats("--policies", names)
    return names


def parse_rates(text: str) -> list[float]:
    """Request rates such as ``6,8,9`` (each once)."""
    rates = parse_list(text, float, "--rps")
    bad = [r for r in rates if not r > 0]
    if bad:  # (the same words as a single run's --rps, which every rate of the comparison is)
        raise ValueError(f"{bad[0]:g} is not a request rate (must be > 0); give request rates in requests per second, "
                         f"e.g. --rps 6,8,9")
    _no_repeats("--rps", rates)
    return rates


def _no_repeats(name: str, values: list) -> None:
    i = first_repeat(values)
    if i >= 0:
        raise ValueError(f"{name}: {values[i]!r} is given twice; list each value once")


@dataclass
class CompareConfig:
    """The options of ``twin compare`` besides the scenario's (:class:`RunConfig`)."""

    policies: list[str] = field(default_factory=list, metadata={
        "help": "comma-separated presets, e.g. slora,chameleon", "parse": parse_names, "required": True})
    rps: list[float] = field(default_factory=list, metadata={
        "help": "comma-separated request rates, e.g. 6,8,9", "parse": parse_rates, "required": True})
    slo: float | None = field(default=None, metadata={
        "help": "TTFT SLO in seconds (default: --slo-x x unloaded mean)"})
    slo_x: float = field(default=5.0, metadata={
        "help": "SLO as a multiple of the unloaded mean TTFT of the first policy (twin reproduce chameleon-fig11 "
                "uses the paper's 5x unloaded E2E instead)"})
    unloaded_rps: float = field(default=0.2, metadata={"help": "rate of the unloaded reference run"})
    accuracy: float | None = field(default=None, metadata={
        "help": "output-length predictor accuracy (sjf, chameleon)"})
    jobs: int = field(default=1, metadata={"help": "runs in parallel (processes)"})


#: the largest ``--slo-x``: an SLO that many times the unloaded mean TTFT bounds nothing
MAX_SLO_X = 1e4

#: where ``twin compare`` writes without ``--out`` (relative to the working directory; ``runs/``
#: is ignored by git, so a sweep never lands among the committed results)
DEFAULT_OUT = "runs/compare"
#: the adapters' target modules of a comparison across serving systems when ``--lora-targets`` is not given:
#: the projections S-LoRA adapts (:func:`common_adapters`)
MIXED_SYSTEMS_TARGETS = "qkvo"

#: scenario options that ``twin compare`` sets itself (the rate) or per policy
NOT_COMPARE_OPTIONS = ("rps", "policy", "scheduler", "cache", "scheduler_options", "cache_options", "horizon",
                       "ttft_slo", "tbt_slo")


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare policies over a sweep of request rates (table + figure)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p, CompareConfig, unset_defaults=True)  # (unset: None, to tell the options given, see check_given)
    add_arguments(p, RunConfig, exclude=NOT_COMPARE_OPTIONS, unset_defaults=True)
    p.add_argument("--out", default=None,
                   help=f"output directory for compare.csv, compare.png, sustained.json (default {DEFAULT_OUT}/<trace>)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar over the runs (default: on for a terminal)")
    p.set_defaults(func=cmd_compare)


def load_compare_profile(profile: str | None, lora_targets: str | None) -> Profile:
    """The profile, with its adapter target modules replaced when ``lora_targets`` is given."""
    prof = load_profile(profile)
    return prof.with_lora_targets(lora_targets) if lora_targets else prof


def _policy_objects(name: str, slo_s: float | None, accuracy: float | None):
    s, c, label = resolve_policy(name)
    if slo_s is not None and hasattr(s, "slo_s"):
        s.slo_s = slo_s
    if accuracy is not None and hasattr(s, "accuracy"):
        s.accuracy = accuracy
    return s, c, label


def run_one(run: RunConfig, options: CompareConfig, policy: str, rps: float, slo_s: float | None) -> dict[str, Any]:
    """One simulation of ``run`` at rate ``rps``; returns the summary row (picklable, for --jobs)."""
    run = dataclasses.replace(for_preset(run, policy), rps=rps)
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    cfg = build_engine_config(run, w, prof)
    s, c, label = _policy_objects(policy, slo_s, options.accuracy)
    res = simulate(w, prof, cfg, scheduler_obj=s, cache_obj=c, ttft_slo_s=slo_s, record_steps=False,
                   system=resolve_system(policy, run.system), frontend_s=run.frontend_ms / 1000.0,
                   serving_s_per_running=run.serving_us / 1e6, rank_tile_cost=run.rank_tile_cost)
    row = {"policy": policy, "rps": rps, **{k: res.summary.get(k) for k, _, _ in COLUMNS},
           "requests": res.summary["requests_arrived"], "finished": res.summary["requests_finished"],
           "rejected": res.summary["requests_rejected"],
           "reject_reasons": dict(res.summary["reject_reasons"]),  # reason -> requests
           "wall_s": res.summary["wall_s"]}
    return row


def unloaded_mean_ttft(run: RunConfig, options: CompareConfig, policy: str) -> float:
    """Mean TTFT of the trace replayed at a low rate (the SLO reference)."""
    run = dataclasses.replace(for_preset(run, policy), rps=options.unloaded_rps)
    prof = load_compare_profile(run.profile, None)
    try:
        w = build_workload(run)
    except ConfigError as e:  # (its advice, "raise --rps", names the swept rates, not this run's)
        if "holds no request" not in str(e):
            raise
        raise ConfigError(f"the SLO's unloaded reference run ({policy} at --unloaded-rps {options.unloaded_rps:g} "
                          f"req/s) holds no request of --trace {run.trace}; raise --unloaded-rps (below the lowest "
                          f"swept rate) or lengthen --duration, or give the SLO with --slo") from None
    s, c, _ = _policy_objects(policy, None, options.accuracy)
    res = simulate(w, prof, build_engine_config(run, w, prof), scheduler_obj=s, cache_obj=c, record_steps=False,
                   system=resolve_system(policy, run.system), frontend_s=run.frontend_ms / 1000.0,
                   serving_s_per_running=run.serving_us / 1e6, rank_tile_cost=run.rank_tile_cost)
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


def sustained_bound(rates: list[float], p99_ms: list[float | None], slo_s: float) -> str:
    """Where :func:`sustained_rps` is only a bound: ``">="`` when every swept rate meets the SLO (the
    knee lies above the sweep) or when the first rate that does not has no P99 TTFT (every request
    rejected: the value is the last rate that met it, with the knee somewhere before the next, unmeasured),
    ``"<"`` when even the lowest misses it, else ``"="`` (interpolated between two measured rates)."""
    lim = slo_s * 1000.0
    for i, (_, p) in enumerate(sorted(zip(rates, p99_ms))):
        if p is not None and p <= lim:
            continue
        return "<" if i == 0 else ">=" if p is None else "="
    return ">="


def format_sustained(sustained: dict[str, float], bounds: dict[str, str], rates: list[float]) -> list[str]:
    """The console lines of the sustained throughput: a bound is printed as one (``>= 3.00``, ``< 1``),
    and a ratio to the first policy only where both are measured (interpolated inside the sweep)."""
    first = next(iter(sustained))
    lo = min(rates)
    lines = []
    for p, v in sustained.items():
        b = bounds[p]
        val = (f">= {v:6.2f} req/s (every swept rate meets the SLO: sweep higher --rps)" if v >= max(rates) else
               f">= {v:6.2f} req/s (the next swept rate has no P99 TTFT, every request rejected: the knee lies "
               f"between)") if b == ">=" else \
            f" < {lo:6.2f} req/s (even the lowest swept rate misses the SLO)" if b == "<" else f"   {v:6.2f} req/s"
        if p != first and b == "=" and bounds[first] == "=" and sustained[first] > 0:
            val += f"  ({v / sustained[first]:.2f}x {first})"
        lines.append(f"  {p:<24} {val}")
    return lines


def format_rejections(rows: list[dict[str, Any]]) -> list[str]:
    """The console lines that say why requests were rejected (a policy on S-LoRA refuses prompts longer
    than its server's limits, e.g.), one per policy that rejected any: its counts of arrivals per swept
    rate and the reasons. Nothing when no request was rejected."""
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("rejected"):
            by_policy.setdefault(r["policy"], []).append(r)
    lines = []
    for policy, rs in by_policy.items():
        counts = ", ".join(f"{int(r['rejected'])} of {int(r['requests'])} at {r['rps']:g} req/s" for r in rs)
        reasons = dict.fromkeys(with_option(why) for r in rs for why in r.get("reject_reasons") or {})
        lines.append(f"  {policy} rejected {counts}: {'; '.join(reasons) or 'reason not recorded'}")
    return lines


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as ``compare.csv`` holds them: each row's rejections as ``"36: reason; ..."``."""
    frame = pd.DataFrame(rows)
    if "reject_reasons" in frame:
        frame["reject_reasons"] = ["; ".join(f"{n}: {why}" for why, n in (r or {}).items())
                                   for r in frame["reject_reasons"]]
    return frame


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ["policy", "rps"] + [h for _, h, _ in COLUMNS] + [h for _, h in COUNT_COLUMNS]
    lines = [head]
    for r in rows:
        vals = [r["policy"], f"{r['rps']:g}"]
        for k, _, nd in COLUMNS:
            v = r.get(k)
            vals.append("-" if v is None else f"{v:.{nd}f}")
        vals += ["-" if r.get(k) is None else str(int(r[k])) for k, _ in COUNT_COLUMNS]
        lines.append(vals)
    w = [max(len(str(ln[i])) for ln in lines) for i in range(len(head))]
    out = ["  ".join(str(v).rjust(w[i]) if i > 1 else str(v).ljust(w[i]) for i, v in enumerate(ln)) for ln in lines]
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


def write_figure(rows: list[dict[str, Any]], slo_s: float, path: Path, title: str) -> Path:
    """Save :func:`twin.figures.compare_figure` as ``path`` (PNG)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    compare_figure(rows, slo_s, title).savefig(path, dpi=110)
    return path


def check_compare_options(options: CompareConfig) -> None:
    """The comparison's own options, each refused with its flag and the form to give before any run."""
    if options.slo is not None:
        check_number("--slo", options.slo, 0, False, "a TTFT SLO in seconds, e.g. --slo 5 (or leave it out: --slo-x "
                                                    "x unloaded)")
    check_number("--slo-x", options.slo_x, 0, False, "a multiple of the unloaded mean TTFT, e.g. --slo-x 5")
    if options.slo is not None and options.slo > MAX_SIM_SECONDS:
        raise ValueError(f"--slo {options.slo:g}: beyond the {MAX_SIM_SECONDS:g} s (about 3 years) a run may simulate, "
                         f"so every rate would meet it; give a TTFT SLO in seconds, e.g. --slo 5")
    if options.slo_x > MAX_SLO_X:
        raise ValueError(f"--slo-x {options.slo_x:g}: more than {MAX_SLO_X:g} times the unloaded mean TTFT, so every "
                         f"rate would meet it; give a multiple of the unloaded mean TTFT, e.g. --slo-x 5")
    check_number("--unloaded-rps", options.unloaded_rps, 0, False,
                 "the rate of the unloaded reference run, e.g. --unloaded-rps 0.2")
    if options.accuracy is not None and not 0.0 <= options.accuracy <= 1.0:
        raise ValueError(f"--accuracy {options.accuracy:g}: must be in [0, 1] (the share of output lengths the "
                         f"predictor gets right, e.g. --accuracy 0.8)")
    check_number("--jobs", options.jobs, 1, True, "the runs in parallel, e.g. --jobs 2")
    if options.slo is None and options.rps and 0 < min(options.rps) <= options.unloaded_rps:
        raise ValueError(f"--unloaded-rps {options.unloaded_rps:g}: the SLO's reference run must be unloaded, below "
                         f"the lowest swept rate ({min(options.rps):g} req/s); give e.g. --unloaded-rps "
                         f"{min(options.rps) / 10:g}, or set the SLO with --slo")


def check_given(run: RunConfig, options: CompareConfig, given: Collection[str]) -> None:
    """Refuse options given on the command line (``given``: field names of :class:`CompareConfig` and
    :class:`RunConfig`) that the comparison would not read: ``--slo-x`` and ``--unloaded-rps`` with
    ``--slo`` (no unloaded reference run is made), ``--accuracy`` when no compared preset's scheduler
    predicts output lengths, and an engine option of a serving system none of the presets runs on
    (:func:`twin.scenario.check_system_options`)."""
    check_compare_options(options)
    if options.slo is not None:
        for name, flag in (("slo_x", "--slo-x"), ("unloaded_rps", "--unloaded-rps")):
            if name in given:
                v = getattr(options, name)
                raise ValueError(f"{flag} {v:g} with --slo {options.slo:g}: --slo sets the TTFT SLO itself, so no "
                                 f"unloaded reference run is made and {flag} (which "
                                 f"{'scales its mean TTFT' if name == 'slo_x' else 'sets its rate'}) would change "
                                 f"nothing; give --slo, or --slo-x [--unloaded-rps] without --slo")
    load_entry_points()
    pols = [p for p in options.policies if p in PRESETS]
    if len(pols) < len(options.policies) or not pols:
        return  # (an unknown preset is named by compare())
    if "accuracy" in given:
        users = [p for p in pols if hasattr(resolve_policy(p)[0], "accuracy")]
        if not users:
            with_acc = [n for n in sorted(PRESETS) if hasattr(resolve_policy(n)[0], "accuracy")]
            raise ValueError(f"--accuracy {options.accuracy:g}: no compared preset ({', '.join(pols)}) predicts output "
                             f"lengths, so it would change nothing; leave it out, or compare a preset whose scheduler "
                             f"does (e.g. {', '.join(with_acc[:3])})")
    try:
        runs_on = {p: resolve_system(p, run.system) for p in pols}
    except KeyError:
        return  # (an unknown --system is named by check_run)
    check_system_options(given, runs_on, run.system is not None, compare=True)


def common_adapters(run: RunConfig, policies: Collection[str]) -> RunConfig:
    """``run`` with the adapters' target modules every compared preset serves: when the presets run on
    different serving systems and ``--lora-targets`` is not given, ``qkvo`` for all of them. S-LoRA adapts q, k, v
    and o only, while a vLLM run's default is the profile's targets (all seven projections of the calibration's
    adapters): left alone, the two systems would serve different adapters (2.3x the bytes per load and more LoRA
    compute on vLLM) and the comparison would not be of one workload."""
    if run.lora_targets is not None:
        return run
    load_entry_points()
    systems = {resolve_system(for_preset(run, p).policy, run.system) for p in policies if p in PRESETS}
    return dataclasses.replace(run, lora_targets=MIXED_SYSTEMS_TARGETS) if len(systems) > 1 else run


def compare(run: RunConfig, options: CompareConfig, progress: bool = False, given: Collection[str] = (),
            ) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    """Every preset of ``options.policies`` at every rate of ``options.rps``: the summary rows,
    the sustained throughput per preset and the TTFT SLO (s). ``progress``: a progress bar
    (tqdm, on stderr) over the runs, the unloaded reference run included. ``given``: the workload
    options given on the command line, refused before any run where they change nothing
    (:func:`twin.scenario.check_adapter_options_act`: ``--seed`` on a workload file replayed as written,
    ``--ranks`` / ``--popularity`` on a workload without adapters)."""
    pols, rates = options.policies, options.rps
    if not pols or not rates:
        raise ValueError("--policies and --rps need at least one value each")
    check_compare_options(options)
    load_entry_points()
    unknown = [p for p in pols if p not in PRESETS]
    if unknown:
        parts = [n for n in unknown if n in SCHEDULERS or n in CACHES]
        hint = (f" ({', '.join(parts)} {'is a scheduler or cache' if len(parts) == 1 else 'are schedulers or caches'}, "
                f"not a preset: a preset names both, e.g. vllm = fcfs + lru; `twin run --scheduler/--cache` takes "
                f"them one by one)") if parts else ""
        raise KeyError(f"unknown policies {unknown}{hint}; presets: {', '.join(sorted(PRESETS))}")
    run = common_adapters(run, pols)
    if run.max_total_tokens is not None and run.kv_tokens is not None and all(
            resolve_system(p, run.system) == "slora" for p in pols):
        raise ConfigError(f"--kv-tokens {run.kv_tokens} and --max-total-tokens {run.max_total_tokens}: every compared "
                          f"preset ({', '.join(pols)}) runs on S-LoRA, whose one pool of token slots both size "
                          f"(--max-total-tokens wins); give one of them, or add a preset on vLLM to --policies for "
                          f"--kv-tokens to size its KV cache")
    for p in pols:  # before any run, also when the runs go to worker processes: each preset as it runs
        check_run(for_preset(run, p))  # (its own serving system's checks)
    for r in sorted({min(rates), max(rates)}):  # an empty or oversized workload: refused before any run, not
        w = build_workload(dataclasses.replace(for_preset(run, pols[0]), rps=r))  # after the rates before it ran
    check_adapter_options_act(run, w, given)  # (the rate changes neither the adapters nor what the seed draws)
    jobs = [(p, r) for p in pols for r in rates]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs) + (options.slo is None), unit="run", desc="compare", leave=False)
    slo = options.slo
    if slo is None:
        if bar is not None:
            bar.set_postfix_str(f"unloaded reference, {pols[0]} at {options.unloaded_rps:g} req/s")
        slo = options.slo_x * unloaded_mean_ttft(run, options, pols[0])
        if bar is not None:
            bar.update()
    rows: list[dict[str, Any] | None] = [None] * len(jobs)
    if options.jobs > 1:
        with ProcessPoolExecutor(min(options.jobs, len(jobs))) as ex:  # (no idle workers)
            futures = {ex.submit(run_one, run, options, p, r, slo): i for i, (p, r) in enumerate(jobs)}
            for fut in as_completed(futures):
                rows[futures[fut]] = fut.result()
                if bar is not None:
                    bar.update()
    else:
        for i, (p, r) in enumerate(jobs):
            if bar is not None:
                bar.set_postfix_str(f"{p} at {r:g} req/s")
            rows[i] = run_one(run, options, p, r, slo)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    sustained = {p: sustained_rps(rates, v, slo) for p, v in p99_by_policy(rows).items()}
    return rows, sustained, slo


def p99_by_policy(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Each policy's P99 TTFT (ms) over the rates, in the rows' order."""
    out: dict[str, list[float | None]] = {}
    for r in rows:
        out.setdefault(r["policy"], []).append(r["ttft_ms_p99"])
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    run = from_namespace(RunConfig, args, exclude=NOT_COMPARE_OPTIONS)
    options = from_namespace(CompareConfig, args)
    given = {*given_values(RunConfig, args, exclude=NOT_COMPARE_OPTIONS), *given_values(CompareConfig, args)}
    check_given(run, options, given)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    out = check_writable_dir("--out", args.out) if args.out is not None else Path(DEFAULT_OUT) / Path(run.trace).stem
    rows, sustained, slo = compare(run, options, progress=progress, given=given)
    out.mkdir(parents=True, exist_ok=True)
    rows_frame(rows).to_csv(out / "compare.csv", index=False)
    prof_name = load_compare_profile(run.profile, None).name
    fig = write_figure(rows, slo, out / "compare.png", f"{run.trace} (profile {prof_name}), TTFT SLO {slo:.2f} s")
    bounds = {p: sustained_bound(options.rps, v, slo) for p, v in p99_by_policy(rows).items()}
    slo_ref = None if options.slo else options.policies[0]
    systems = {p: resolve_system(for_preset(run, p).policy, run.system) for p in options.policies}
    targets = common_adapters(run, options.policies).lora_targets
    doc = {"slo_s": slo, "slo_reference_policy": slo_ref, "sustained_rps": sustained, "sustained_bound": bounds,
           "systems": systems,
           "lora_targets": targets or ",".join(load_compare_profile(run.profile, None).lora_targets)}
    (out / "sustained.json").write_text(json.dumps(doc, indent=2))
    if args.json:
        print(json.dumps({**doc, "rows": rows}, indent=2, default=str))
        return 0
    print(f"TTFT SLO = {slo:.3f} s" + ("" if options.slo else
                                       f" ({options.slo_x:g} x the unloaded mean TTFT of {slo_ref}, the first policy, "
                                       f"at {options.unloaded_rps:g} req/s)"))
    if len(set(systems.values())) > 1:  # (the presets run on different engines: say which)
        print("serving systems: " + ", ".join(f"{p} on {sy}" for p, sy in systems.items())
              + " (README 'Serving systems')")
        if run.lora_targets is None:
            print(f"adapters: {MIXED_SYSTEMS_TARGETS} projections on every system (S-LoRA adapts only these; "
                  f"--lora-targets gives all the systems another set)")
    print(format_table(rows))
    rejections = format_rejections(rows)
    if rejections:  # (the throughput of a policy that refuses requests counts only those it served)
        print("rejected up front (not served, and not in the latencies):")
        print("\n".join(rejections))
    print()
    print("sustained throughput (P99 TTFT <= SLO):")
    print("\n".join(format_sustained(sustained, bounds, options.rps)))
    print(f"wrote {out / 'compare.csv'}, {out / 'sustained.json'}, {fig}")
    return 0

