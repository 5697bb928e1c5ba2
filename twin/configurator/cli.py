"""``twin configure``: labels, datasets, interpretable configurators, search and evaluation."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from traces.arguments import check_writable_dir, check_writable_file, did_you_mean, first_repeat, has_empty_item
from traces.registry import MAX_REQUESTS
from twin.configurator.domain import describe, outside, training_domain
from twin.configurator.models import DEFAULT_PROFILE, KINDS
from twin.scenario import check_host_term, check_number, rank_limit
from twin.validation.specs import RANK_TILE_COST, SERVING_S_PER_RUNNING, WINDOW_S

#: where ``configure train`` writes a model without --out (relative to the current directory)
DEFAULT_MODEL_DIR = "configurators"
#: folds of ``configure train``'s grid search without --cv
DEFAULT_CV = 5


def _finite(o: Any) -> Any:
    """``o`` with every non-finite float (a next run that was never simulated, an empty mean) as
    ``None``, so ``--json`` prints strict JSON (``null``, not ``NaN``) that any parser reads."""
    import math

    import numpy as np

    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else None
    return o


def _jd(o: Any):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return str(o)


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "configure", help="pick served adapters and GPU adapter slots: labels, models, search, evaluation",
        description="Optimum labels from sweeps (throughput90, robust, slo), interpretable configurators "
                    "(random forest, <= 30-leaf tree as plain rules), recommendations, the twin used directly "
                    "as the optimiser, and evaluation on real runs.")
    sub = p.add_subparsers(dest="configure_command")

    d = sub.add_parser("dataset", help="optimum labels (one row per scenario) from sweep results")
    d.add_argument("sweeps", nargs="+", help="sweep directories (twin sweep --out), shard files or CSV tables")
    d.add_argument("--rule", choices=("throughput90", "robust", "slo"), default="throughput90",
                   help="optimum rule: throughput90 (the published one: per slot value, the most served adapters "
                        "at >= --ratio of the offered tokens, or the first run when even it is below; then the "
                        "best throughput over the slot values, which can be such a starving first run: the label's "
                        "margin says so), robust (fewest slots within --tolerance of the best), slo (best "
                        "throughput with SLO attainment >= --slo-share)")
    d.add_argument("--ratio", type=float, default=0.9,
                   help="starvation line: throughput / offered (default 0.9; every rule's, the slo rule's 'not "
                        "starving' too); not below the line the sweep walked at, whose walks stopped there")
    d.add_argument("--tolerance", type=float, default=None, help="robust: throughput tolerance (default 1 %%)")
    d.add_argument("--slo-share", type=float, default=None,
                   help="slo: minimum SLO attainment of the sweep's [slo] (default 0.9; not with --ttft-p99-s / "
                        "--itl-p99-s)")
    _percentile_slo_args(d)
    d.add_argument("--out", default=None, help="write the labels (.csv or .parquet)")
    d.add_argument("--json", action="store_true", help="print {rule, scenarios, labels: [one object per scenario]}")
    d.set_defaults(func=cmd_dataset)

    t = sub.add_parser("train", help="train a configurator (grid search, saved as JSON with provenance)")
    t.add_argument("dataset", nargs="+", help="sweep directories (labelled with --rule) and/or labels (.csv/.parquet from "
                        "`configure dataset`), e.g. labels kept from an earlier sweep plus a sweep of the rest; "
                        "each scenario in one source only")
    t.add_argument("--kind", choices=KINDS, default="rf",
                   help="rf (random forest), cart (<= 30 leaves, exported as rules), hstree (the cart tree with "
                        "hierarchical shrinkage, lambda chosen by cross-validation), figs (imodels' FIGS, a sum "
                        "of small trees with <= 30 splits in all), rulefit (imodels' RuleFit per target: a linear model over the "
                        "features and <= 30 rules; figs and rulefit need pip install 'lora-twin[configurator]')")
    t.add_argument("--rule", choices=("throughput90", "robust", "slo"), default=None,
                   help="label rule when sweep directories are given (default throughput90; labels files keep theirs)")
    _percentile_slo_args(t)
    t.add_argument("--out", default=None,
                   help="model file, .json or .json.gz (default: configurators/<profile>.<kind>.json in the current "
                        "directory; a name ending in .gz is written compressed). The shipped models are replaced only "
                        "when --out names one (twin/configurator/models/<profile>.<kind>.json[.gz])")
    t.add_argument("--profile", default=None, help="profile the sweeps ran with (default: from the data)")
    t.add_argument("--cv", type=int, default=None,
                   help=f"folds of the halving grid search (default {DEFAULT_CV}; not with --no-search)")
    t.add_argument("--no-search", action="store_true", help="fit the default hyper-parameters only")
    t.add_argument("--features", default=None,
                   help="feature columns (default: the published 8); add mean_input_tokens,mean_output_tokens "
                        "for the request-length mix (numeric columns of the labels) and policy for one indicator "
                        "column per scheduler/cache policy of the labels (added anyway when they hold several)")
    t.add_argument("--seed", type=int, default=0,
                   help="random state of the estimator and of the search's folds (default 0)")
    t.add_argument("--json", action="store_true",
                   help="print the saved model's path, kind, scenarios, best parameters and CV SMAPE as JSON")
    t.set_defaults(func=cmd_train)

    pr = sub.add_parser("predict", help="recommend served adapters and slots for a scenario")
    _scenario_args(pr)
    pr.add_argument("--model", default=None, help="model file (default: the shipped configurator of --profile)")
    pr.add_argument("--profile", default=None,
                    help=f"profile whose shipped configurator recommends (default {DEFAULT_PROFILE}); with --model, "
                         f"the model's own profile only")
    pr.add_argument("--kind", choices=KINDS, default=None, help="shipped model kind (default rf)")
    pr.add_argument("--explain", action="store_true", help="print the rule path")
    pr.add_argument("--adapters", type=int, default=None,
                    help="adapters to host: GPUs needed at the recommended served adapters")
    pr.add_argument("--gpu-hour-usd", type=float, default=None, help="GPU price: cost per million tokens")
    pr.add_argument("--feature", action="append", default=[], metavar="NAME=VALUE",
                    help="value of a feature beyond the rate and rank triples, for a model trained with "
                         "`train --features` (e.g. mean_input_tokens=222); repeat for several. The features "
                         "derived from --rates / --ranks (rate_max ... rank_std) are refused here: change "
                         "--rates / --ranks instead")
    pr.add_argument("--workload", default=None, metavar="FILE",
                    help="recommend for a workload file of your own instead of --rates/--ranks (any file twin run "
                         "--trace takes): the features are the max, min, mean and std of its adapters' rates "
                         "(requests in --window / --window) and ranks, as configure search --workload measures "
                         "them; a model trained without the length or arrival features refuses a file whose "
                         "lengths or burstiness it never saw")
    pr.add_argument("--window", type=float, default=None,
                    help="with --workload: the seconds of the file whose requests make the rates (default 3600, as "
                         "configure search --workload and the sweeps replay a file)")
    pr.add_argument("--check", action="store_true",
                    help="run the twin at the recommendation and step the served adapters down while it starves "
                         "there (the model's own rule; about 2 CPU-s per simulated hour)")
    _engine_args(pr, "with --check: the twin's", from_model=True)
    pr.add_argument("--json", action="store_true",
                    help="print one object: served_adapters, adapter_slots, throughput_tok_s, uncertainty, ...")
    pr.set_defaults(func=cmd_predict)

    r = sub.add_parser("rules", help="print the <= 30-rule configurator (or a RuleFit model's terms)")
    r.add_argument("--model", default=None, help="model file with rules (default: the shipped cart model)")
    r.add_argument("--profile", default=None,
                   help=f"profile whose shipped rule model to print (default {DEFAULT_PROFILE}); with --model, the "
                        f"model's own profile only")
    r.add_argument("--kind", choices=("cart", "hstree", "rulefit"), default=None,
                   help="shipped rule model: cart (default), hstree (the same rules, shrunk leaf values) or "
                        "rulefit (per target: rules and linear terms with non-zero coefficients, by importance)")
    r.add_argument("--json", action="store_true", help="print the rules and the model's provenance as JSON")
    r.set_defaults(func=cmd_rules)

    e = sub.add_parser("evaluate", help="score configurators on real runs (SMAPE, regret, starvation)")
    e.add_argument("--real", default=None,
                   help="real-run table in the validation format (default: validation/vllm085_h100_llama31_8b.csv)")
    e.add_argument("--profile", default=None, help="profile (default: with --model, the profile the model was trained on; "
                   "else the configurator profile of the runs' model, for Llama-3.1-8B " + DEFAULT_PROFILE + ")")
    e.add_argument("--model", default=None, help="model file (default: the shipped configurators of the profile)")
    e.add_argument("--source", default="ml_test", help="rows of the table to use (column source; '' = all)")
    e.add_argument("--no-search", action="store_true", help="leave out the twin-as-optimiser baseline")
    e.add_argument("--search-cache", default=None,
                   help="sweep directory caching the search runs (not with --no-search)")
    _engine_args(e, "the search baseline's and the check's", from_model=True)
    e.add_argument("--check", action="store_true",
                   help="also score every model after the twin's check of its recommendations (predict --check)")
    e.add_argument("--executor", choices=("local", "dask", "ray"), default=None,
                   help="where the search baseline's twin runs go: local worker processes (default), a local "
                        "Dask or Ray cluster (not with --no-search)")
    e.add_argument("--jobs", type=int, default=None, help="workers of the executor (default 1; not with --no-search)")
    e.add_argument("--out", default=None, help="write evaluation.csv, per_scenario.csv, crossings.csv, summary.json")
    e.add_argument("--json", action="store_true",
                   help="print one object: scenarios, smape_served, smape_slots, smape_throughput, regret_mean, "
                        "regret_min, starving, model, profile, and a row per model and baseline")
    e.set_defaults(func=cmd_evaluate)

    s = sub.add_parser("search", help="the twin used directly as the optimiser (walks the grid; no model)")
    _scenario_args(s)
    s.add_argument("--profile", default=DEFAULT_PROFILE, help=f"profile the twin runs with (default {DEFAULT_PROFILE})")
    s.add_argument("--rule", choices=("throughput90", "robust", "slo"), default="throughput90",
                   help="optimum rule (default throughput90); slo needs --ttft-p99-s and/or --itl-p99-s (the "
                        "search's runs record no [slo] attainment)")
    _percentile_slo_args(s)
    s.add_argument("--workload", default=None, metavar="FILE",
                   help="search a workload file of your own instead of --rates/--ranks (any file twin run --trace "
                        "takes): a run serving N adapters replays the requests of N of its adapters (nested subsets "
                        "along the walk; twin/sweep/workload_scenario.py)")
    s.add_argument("--cache", default=None, help="sweep directory caching the runs (default sweeps/search-cache)")
    s.add_argument("--window", type=float, default=3600.0,
                   help="simulated seconds of each run (default 3600; the busiest run may be offered at most "
                        "twin run's 5,000,000 requests)")
    s.add_argument("--served", default=None, help="served-adapter grid, e.g. 16,32,64 (default: the published one)")
    s.add_argument("--slots", default=None, help="slot grid, e.g. 16,32 (default: the published one)")
    s.add_argument("--length-corr", type=float, default=0.0, metavar="RHO",
                   help="prompt-output length coupling of the request pool (default 0: independent lengths, "
                        "as the shipped sweeps; twin validate re-creates the real runs with -0.37)")
    _engine_args(s, "the twin's")
    s.add_argument("--executor", choices=("local", "dask", "ray"), default="local",
                   help="where the twin runs go: local worker processes (default), a local Dask or Ray cluster")
    s.add_argument("--jobs", type=int, default=1, help="workers of the executor (default 1)")
    s.add_argument("--json", action="store_true",
                   help="print one object: served_adapters, adapter_slots, throughput_tok_s and the walk's runs")
    s.set_defaults(func=cmd_search)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rates", default=None,
                   help="per-adapter rate triple (req/s, numbers > 0: one per adapter class), e.g. 0.4,0.05,0.00625; "
                        "predict takes exactly three (the models were trained on triples), search as many as --ranks")
    p.add_argument("--ranks", default=None,
                   help="rank triple (whole numbers >= 1, one per adapter class, as many as --rates), e.g. 8,16,32")
    p.add_argument("--policy", default=None,
                   help="scheduler/cache policy (a `twin policies` preset; default: the published "
                        "fcfs+client-cap); predict: one the model was trained with")
    p.add_argument("--lengths", default=None, metavar="IN,OUT",
                   help="request-length mix: mean input and output tokens (the published ShareGPT pool is "
                        "222,197, search's default); predict: needed by a model trained on the length features, "
                        "and only 222,197 is accepted by one trained without them")
    p.add_argument("--arrival", default=None, metavar="PROCESS",
                   help="each adapter's arrival process: poisson (the published runs; search's default) or "
                        "gamma:CV, bursty streams whose inter-arrival gaps have coefficient of variation CV (e.g. "
                        "gamma:2); predict: needed by a model trained on the arrival_cv feature, and only poisson is "
                        "accepted by one trained without it")


def _lengths(args) -> tuple[float, float] | None:
    from traces.arguments import parse_list

    if args.lengths is None:
        return None
    try:  # (parse_list's own messages gave another example, 0.5,1,2, and refused a sign but not a zero)
        v = parse_list(args.lengths, float, "--lengths", None)
    except ValueError:
        v = []
    if len(v) != 2 or not all(math.isfinite(x) and x > 0 for x in v):
        raise ValueError(f"--lengths {args.lengths!r}: expected two positive numbers IN,OUT (mean input and output "
                         f"tokens), e.g. --lengths 222,197")
    return float(v[0]), float(v[1])


def _percentile_slo_args(p) -> None:
    p.add_argument("--ttft-p99-s", type=float, default=None,
                   help="slo: label with percentile SLOs on the stored summaries instead of the sweep's [slo] "
                        "attainment: P99 TTFT at most this many seconds (e.g. 5, Chameleon's SLO)")
    p.add_argument("--itl-p99-s", type=float, default=None,
                   help="slo: P99 inter-token latency at most this many seconds (e.g. 0.15, Chameleon's TBT SLO)")


#: the adapter classes of a scenario: the configurators' features are the max / min / mean / std of the
#: rate and rank triples, and every shipped model and the published grid are triples
ARITY = 3


def _items(flag: str, value: str, example: str) -> None:
    """Refuse an empty list or an empty item (``0.4,,0.1``, a trailing comma) in a comma-separated
    option, naming the option with an example of its own (before :func:`traces.arguments.parse_list`)."""
    text = value.strip()
    if not text:
        raise ValueError(f"{flag} {value!r}: empty list; give comma-separated values, e.g. {flag} {example}")
    if has_empty_item(text):
        raise ValueError(f"{flag} {value!r}: an empty item (two commas in a row, or a comma at either end); give "
                         f"comma-separated values, e.g. {flag} {example}")


def _int_list(flag: str, value: str, example: str, what: str) -> list[int]:
    """``--served`` / ``--slots``: whole numbers >= 1, no empty list or item."""
    from traces.arguments import parse_list

    _items(flag, value, example)
    v = parse_list(value, int, flag, None)
    bad = [x for x in v if x < 1]
    if bad:
        raise ValueError(f"{flag} {value!r}: {bad[0]} is not {what}; give whole numbers >= 1, e.g. {flag} {example} "
                         f"(or leave out {flag} for the published grid)")
    i = first_repeat(v)
    if i >= 0:  # (as a grid refuses a repeated value: its runs would be done twice)
        raise ValueError(f"{flag} {value!r}: {v[i]} is listed twice (its runs would be done twice); give each value "
                         f"once, e.g. {flag} {example}")
    return v


def _pair(args, triple: bool = True) -> tuple[list[float], list[int]]:
    """The scenario's rates and ranks, one of each per adapter class: every rate a finite number of
    req/s above 0 (a class of adapters without traffic is not served: leave it out), every rank a
    whole number >= 1; an empty item is refused. ``triple`` (predict: the models were trained on
    triples) refuses another count than three; otherwise (search: the twin simulates any number of
    classes) as many rates as ranks."""
    from traces.arguments import parse_list

    missing = [f for f, v in (("--rates", args.rates), ("--ranks", args.ranks)) if v is None]
    if missing:
        alt = " (or, for search, --workload FILE: a trace of your own)" if hasattr(args, "workload") else ""
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: the per-adapter "
                         f"rates and ranks of the scenario, e.g. --rates 0.4,0.05,0.00625 --ranks 8,16,32{alt}")
    _items("--rates", args.rates, "0.4,0.05,0.00625")
    _items("--ranks", args.ranks, "8,16,32")
    rates = parse_list(args.rates, float, "--rates", None)
    bad = [r for r in rates if not (math.isfinite(r) and r > 0)]
    if bad:
        raise ValueError(f"--rates {args.rates!r}: {bad[0]:g} is not a rate; give per-adapter request rates in req/s "
                         f"above 0, e.g. --rates 0.4,0.05,0.00625 (leave out a class of adapters without traffic)")
    top = MAX_REQUESTS / WINDOW_S  # (one adapter alone would send more requests in the hour than a run may hold)
    if max(rates) > top:
        raise ValueError(f"--rates {args.rates!r}: {max(rates):g} req/s per adapter is beyond what the twin can "
                         f"simulate: one such adapter sends more than {MAX_REQUESTS:,} requests (a run's limit) in the "
                         f"{WINDOW_S:g} s window; give per-adapter rates of at most {top:g} req/s (the published "
                         f"grid's highest is 3.2)")
    ranks = parse_list(args.ranks, int, "--ranks", None)
    bad = [k for k in ranks if k < 1]
    if bad:
        raise ValueError(f"--ranks {args.ranks!r}: {bad[0]} is not a LoRA rank; give whole numbers >= 1, e.g. "
                         f"--ranks 8,16,32")
    limit, why = rank_limit("vllm")
    if max(ranks) > limit:  # (as `twin run` and a grid refuse it: every run of the twin would fail to start)
        raise ValueError(f"--ranks {max(ranks)}: above {limit}, {why}: vLLM cannot serve such an adapter; give "
                         f"ranks of at most {limit}, e.g. --ranks 8,16,32")
    for flag, v, example in (("--rates", rates, "0.4,0.05,0.00625"), ("--ranks", ranks, "8,16,32")):
        if triple and len(v) != ARITY:
            raise ValueError(f"{flag} {getattr(args, flag[2:])!r}: {len(v)} value{'s' if len(v) != 1 else ''}, "
                             f"expected a triple (one per adapter class: the configurators were trained on three), "
                             f"e.g. {flag} {example}")
    if len(rates) != len(ranks):
        raise ValueError(f"--rates {args.rates!r} and --ranks {args.ranks!r}: {len(rates)} rates but {len(ranks)} "
                         f"ranks; give one rate and one rank per adapter class, e.g. --rates 0.4,0.05,0.00625 "
                         f"--ranks 8,16,32")
    return rates, ranks


def _check_percentile_slo(args) -> None:
    """``--ttft-p99-s`` / ``--itl-p99-s``, when given, are latencies > 0."""
    for flag, v in (("--ttft-p99-s", args.ttft_p99_s), ("--itl-p99-s", args.itl_p99_s)):
        if v is not None:
            check_number(flag, v, 0, False, "a latency in seconds, e.g. 5")


def _check_rule_args(args) -> None:
    """``--ratio`` in (0, 1], ``--tolerance`` in [0, 1), ``--slo-share`` in (0, 1], before any table is read;
    ``--tolerance`` only with the robust rule and ``--slo-share`` only with the slo rule on the sweep's
    ``[slo]`` attainment (elsewhere nothing reads them). Fills in their defaults."""
    check_number("--ratio", args.ratio, 0, False, "a share of the offered tokens in (0, 1], e.g. --ratio 0.9")
    if args.ratio > 1:
        raise ValueError(f"--ratio {args.ratio:g}: must be at most 1 (a share of the offered tokens), e.g. --ratio 0.9")
    if args.tolerance is not None:
        check_number("--tolerance", args.tolerance, 0, True, "a share of the best throughput in [0, 1), e.g. 0.01")
        if args.tolerance >= 1:
            raise ValueError(f"--tolerance {args.tolerance:g}: must be below 1 (a share of the best throughput), "
                             f"e.g. 0.01")
    if args.slo_share is not None:
        check_number("--slo-share", args.slo_share, 0, False, "a share of requests in (0, 1], e.g. --slo-share 0.9")
        if args.slo_share > 1:
            raise ValueError(f"--slo-share {args.slo_share:g}: must be at most 1 (a share of requests), e.g. 0.9")
    _check_percentile_slo(args)
    # (a bad value is named first, then an option the rule does not read)
    if args.tolerance is not None and args.rule != "robust":
        raise ValueError(f"--tolerance {args.tolerance:g}: applies to --rule robust (the throughput tolerance among "
                         f"the best configurations), not {args.rule!r}, which does not read it; leave it out or "
                         f"give --rule robust")
    if args.slo_share is not None and args.rule != "slo":
        raise ValueError(f"--slo-share {args.slo_share:g}: applies to --rule slo (the minimum SLO attainment), not "
                         f"{args.rule!r}, which does not read it; leave it out or give --rule slo")
    if args.slo_share is not None and (args.ttft_p99_s is not None or args.itl_p99_s is not None):
        raise ValueError(f"--slo-share {args.slo_share:g} with --ttft-p99-s / --itl-p99-s: the percentile SLOs decide "
                         f"which runs meet the SLO, so the share of the sweep's [slo] attainment is not read; give "
                         f"one of them")
    args.tolerance = 0.01 if args.tolerance is None else args.tolerance
    args.slo_share = 0.9 if args.slo_share is None else args.slo_share


def cmd_dataset(args) -> int:
    from twin.configurator.dataset import build_dataset, load_runs, sweep_meta
    from twin.configurator.labels import slo_miss

    _check_rule_args(args)
    if args.out:
        check_writable_file("--out", args.out, (".csv", ".parquet"))
    _check_repeated_sources(args.sweeps)
    runs = load_runs(args.sweeps)
    lab = build_dataset(runs, args.rule, sweeps=sweep_meta([s for s in args.sweeps if Path(s).is_dir()])["sweeps"],
                        ratio=args.ratio, tolerance=args.tolerance, slo_share=args.slo_share,
                        ttft_p99_s=args.ttft_p99_s, itl_p99_s=args.itl_p99_s)
    if not len(lab):  # (an empty table was printed and written as if labelled)
        why = (slo_miss(runs, args.slo_share, args.ttft_p99_s, args.itl_p99_s, args.ratio) if args.rule == "slo"
               else "no candidate run has a throughput (total_tok_s is empty: every candidate stopped early, or the "
                    "column was lost from the run tables)")
        raise ValueError(f"no scenario of the {len(runs)} runs could be labelled under rule {args.rule}: {why}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        (lab.to_parquet if out.suffix.lower() == ".parquet" else lab.to_csv)(out, index=False)
    if args.json:
        print(json.dumps(_finite({"rule": args.rule, "scenarios": len(lab), "labels": lab.to_dict(orient="records")}),
                         default=_jd, indent=1))
    else:
        cols = [c for c in ("scenario", "served_adapters", "adapter_slots", "throughput_tok_s", "ratio_at_label",
                            "margin", "next_ratio") if c in lab]
        print(lab[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"{len(lab)} scenarios labelled ({args.rule}) from {len(runs)} runs"
              + (f"; wrote {args.out}" if args.out else ""))
    return 0


def _check_repeated_sources(srcs: list[str]) -> None:
    """``dataset`` / ``train``: each source once (compared as resolved paths): a sweep given twice was counted
    twice ("1 scenarios labelled from 2 runs"), and train fitted every scenario of it twice."""
    seen: dict[Path, str] = {}
    for s in srcs:
        key = Path(s).expanduser().resolve()
        if key in seen:
            same = f" (the same path as {seen[key]})" if seen[key] != s else ""
            raise ValueError(f"{s} is given twice{same}: its runs or labels would be counted twice; give each sweep "
                             f"directory or labels file once")
        seen[key] = s


def _check_model_out(out: str) -> None:
    """``train --out``: a .json file (or .json.gz, written compressed: :func:`twin.configurator.models.save_model`),
    writable, before any data is read (``--out m.txt`` wrote a model's JSON into a .txt)."""
    name = Path(out).name
    if not (name.lower().endswith(".json") or (name.endswith(".gz") and name[:-3].lower().endswith(".json"))):
        raise ValueError(f"--out {out}: give a .json or .json.gz file (the model as JSON; .gz: written compressed), "
                         f"e.g. --out configurators/my-model.rf.json")
    check_writable_file("--out", out)


def _next_run(ratio: float | None) -> str:
    """The walk's next run as the search line says it: its share of the offered tokens, or that the walk has none
    there (the label is the grid's last served value, or no run after it was simulated: it printed "next run nan")."""
    if ratio is None or not math.isfinite(ratio):
        return "no next run in the walk"
    return f"next run {ratio:.3f}"


def _check_profile(name: str) -> None:
    """``train --profile``: a shipped profile name or a profile JSON file (:func:`twin.perf.profile.load_profile`
    refuses an unknown one, listing the shipped ones), checked before any data is read."""
    from twin.perf.profile import load_profile

    if not name.strip():
        raise ValueError("--profile '': give the profile the sweeps ran with, e.g. --profile llama-3.1-8b_h100_vllm085 "
                         "(or leave out --profile: it is read from the data)")
    try:
        load_profile(name)
    except KeyError as e:
        raise ValueError(f"--profile: {e.args[0]}") from None


def _check_features(feats: list[str], columns: "list[str] | None" = None) -> None:
    """``train --features``: every name a feature the configurator computes (:data:`~twin.configurator.labels.FEATURES`,
    the length mix, ``policy``) or, once the labels are read (``columns``), a numeric column of theirs (``predict
    --feature NAME=VALUE`` gives it); an indicator column is named as such before any table is read (a misspelt name
    was reported as a column the labels file lacks, listing every column)."""
    from twin.configurator.features import ARRIVAL_FEATURE, LENGTH_FEATURES, POLICY, is_policy_column
    from twin.configurator.labels import FEATURES

    known = (*FEATURES, *LENGTH_FEATURES, ARRIVAL_FEATURE, POLICY)
    for f in feats:
        if is_policy_column(f):
            raise ValueError(f"--features: {f!r} is an indicator column; name {POLICY!r} to encode every policy of "
                             f"the labels")
        if columns is not None and f not in known and f not in columns:
            raise ValueError(f"--features: unknown feature {f!r}{did_you_mean(f, [*known, *columns])}; the known "
                             f"features are {', '.join(known)} (the published 8 are the default), or a numeric "
                             f"column of the labels")


def _check_labels_profile(profile: str, lab) -> None:
    """``train --profile``: the profile the labels were made with (their ``profile`` column, where they have one),
    else an error: the model would record the wrong profile, and ``predict --check`` / ``evaluate`` would run it."""
    from twin.perf.profile import load_profile

    if "profile" not in lab:
        return
    have = sorted({str(v) for v in lab["profile"].dropna()})
    name = load_profile(profile).name  # (a profile file: the name it holds)
    if have and (len(have) > 1 or name != have[0]):
        raise ValueError(f"--profile {profile}: the labels were made with profile {', '.join(have)} (their profile "
                         f"column), not {name}; the model would record the wrong profile and `configure predict "
                         f"--check` / `configure evaluate` would run it; leave --profile out (it is read from the "
                         f"data), or label sweeps run with {name}")


def _file_record(path: str, lab: Any) -> dict[str, Any]:
    """A labels file behind a model, pinned in its provenance: the path as given, the SHA-256 and size of its bytes
    (as read for training) and its rows, so the data a model was trained on can be told from a later edit of the
    file at the same path."""
    import hashlib

    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return {"path": str(path), "sha256": h.hexdigest(), "bytes": size, "rows": int(len(lab))}


#: the fewest labelled scenarios ``train``'s grid search cross-validates (:func:`twin.configurator.models.train`)
MIN_SEARCH_SCENARIOS = 6


def cmd_train(args) -> int:
    import pandas as pd

    from twin.configurator.dataset import (build_dataset, combine_labels, label_engine, load_labels, load_runs, sweep_meta,
                                           trained_grid)
    from twin.configurator.labels import FEATURES
    from twin.configurator.models import save_model, shipped_model_path, train

    if args.cv is not None and args.no_search:  # (the folds were read by nothing)
        raise ValueError(f"--cv {args.cv} with --no-search: no cross-validation is run (the default hyper-parameters "
                         f"are fitted once); leave one out")
    if args.cv is not None and args.cv < 2:
        raise ValueError(f"--cv {args.cv}: the grid search needs at least 2 folds, e.g. --cv 5 (or --no-search)")
    args.cv = DEFAULT_CV if args.cv is None else args.cv
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}: must be >= 0, e.g. --seed 0")
    _check_percentile_slo(args)
    if args.profile is not None:  # stored in the model (predict --check and evaluate run the twin with it)
        _check_profile(args.profile)
    if args.out:
        _check_model_out(args.out)
    srcs = args.dataset
    _check_repeated_sources(srcs)
    for s in srcs:
        if not Path(s).exists():
            raise FileNotFoundError(f"{s}: no such sweep directory or labels file; give the --out directory of "
                                    f"`twin sweep` or the CSV of `twin configure dataset`")
    feats = [f.strip() for f in args.features.split(",")] if args.features is not None else None
    if feats is not None and not all(feats):
        raise ValueError(f"--features {args.features!r}: an empty name; give comma-separated feature columns, e.g. "
                         f"--features {','.join(FEATURES)},mean_input_tokens (or leave out --features for the "
                         f"published 8)")
    if feats is not None and len(set(feats)) < len(feats):
        twice = next(f for f in feats if feats.count(f) > 1)
        raise ValueError(f"--features {args.features!r}: {twice} is named twice; name each feature once")
    if feats is not None:
        _check_features(feats)
    # label files of `configure dataset`: read and checked before any sweep is labelled
    files = [(s, load_labels(s, feats)) for s in srcs if not Path(s).is_dir()]
    meta: dict[str, Any] = {}
    dirs = [s for s in srcs if Path(s).is_dir()]
    if not dirs:  # labels files only: nothing is labelled here, so a rule or SLO given would be ignored
        slo = [f for f, v in (("--ttft-p99-s", args.ttft_p99_s), ("--itl-p99-s", args.itl_p99_s)) if v is not None]
        if slo:
            raise ValueError(f"{' / '.join(slo)}: label sweep directories, and {', '.join(s for s, _ in files)} "
                             f"{'is a labels file' if len(files) == 1 else 'are labels files'} (labelled by "
                             f"`twin configure dataset`); give the SLOs to `twin configure dataset --rule slo`, or "
                             f"give train the sweep directory")
        rules = sorted({str(r) for _, lab in files if "rule" in lab for r in pd.unique(lab["rule"].astype(str))})
        if args.rule is not None and rules and rules != [args.rule]:
            raise ValueError(f"--rule {args.rule}: labels sweep directories, and the labels given were labelled under "
                             f"{', '.join(rules)}; leave out --rule, or relabel the sweep with `twin configure dataset "
                             f"--rule {args.rule}`")
    args.rule = args.rule or "throughput90"
    parts = []
    if dirs:  # sweep directories: labelled here under --rule (all together: one table of runs)
        runs = load_runs(dirs)
        meta = sweep_meta(dirs)
        parts.append((", ".join(dirs), build_dataset(runs, args.rule, sweeps=meta["sweeps"],
                                                     ttft_p99_s=args.ttft_p99_s, itl_p99_s=args.itl_p99_s)))
    parts += files
    lab = combine_labels(parts)
    if not args.no_search and len(lab) < MIN_SEARCH_SCENARIOS:  # (the search was skipped in silence)
        raise ValueError(f"{len(lab)} labelled scenario{'s' if len(lab) != 1 else ''} are too few for the grid "
                         f"search's cross-validation (it needs at least {MIN_SEARCH_SCENARIOS}: two per fold, three "
                         f"folds); label more scenarios, or give --no-search to fit the default hyper-parameters "
                         f"without cross-validation")
    if args.profile is not None:
        _check_labels_profile(args.profile, lab)
    profile = args.profile or (str(lab["profile"].iloc[0]) if "profile" in lab else None)
    if args.profile is None and profile is not None:  # (trained, then predict --check failed: "unknown profile")
        from twin.perf.profile import load_profile

        try:
            load_profile(profile)
        except (KeyError, ValueError, OSError) as e:
            why = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise ValueError(f"the labels were made with profile {profile!r} (their profile column), which this twin "
                             f"cannot load ({why}); the model would record it and `configure predict --check` / "
                             f"`configure evaluate` would fail: give --profile with that profile's name or JSON "
                             f"file") from None
    if profile is None:  # (the model recorded profile None, and load_model refused it as damaged)
        from twin.perf.profile import DEFAULT_FITTED

        profile = DEFAULT_FITTED
        warnings.warn(f"the labels name no profile (no profile column): the model records the default profile "
                      f"{profile}, which predict --check and evaluate run; give --profile P if they came from another")
    grid = trained_grid(lab, meta.get("sweeps") or [])
    from twin.sweep.scenario import twin_version

    prov = {"profile": profile, "rule": str(lab["rule"].iloc[0]) if "rule" in lab else args.rule,
            "engine": label_engine(lab), "sources": [str(s) for s in srcs], **meta,
            "source_files": [_file_record(s, f) for s, f in files], "twin_version": twin_version(),
            "command": "twin configure train " + " ".join(sys.argv[3:] if len(sys.argv) > 3 else srcs)}
    if {"ratio_at_label", "margin"} <= set(lab.columns):  # (the labels' starvation line: predict's starving note)
        lines = (lab["ratio_at_label"] - lab["margin"]).dropna()
        if len(lines):
            prov["ratio_line"] = round(float(lines.median()), 6)
    if feats:
        _check_features(feats, [c for c in lab.columns if pd.api.types.is_numeric_dtype(lab[c])])
        missing = [f for f in feats if f not in lab and f != "policy"]  # policy: checked by train
        if missing:  # (a feature the configurator computes that these labels lack: older labels)
            raise ValueError(f"--features: {missing} not in the labels (columns: {sorted(lab.columns)})")
    from twin.sweep.runner import MissingExtra

    try:
        model = train(lab, args.kind, features=feats, seed=args.seed, cv=args.cv, search=not args.no_search,
                      provenance=prov, grid=grid)
    except MissingExtra as e:
        print(f"twin configure train: error: {e}", file=sys.stderr)
        return 2
    # (the default was the shipped model itself: a two-scenario smoke sweep replaced the 831-scenario tree that
    # predict, rules and evaluate then used without a word)
    out = Path(args.out) if args.out else Path(DEFAULT_MODEL_DIR) / f"{profile or 'model'}.{args.kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    save_model(model, out)
    folds = model["provenance"].get("cv_folds")
    if folds is not None and folds < args.cv:  # (the folds were capped without a word)
        print(f"twin configure train: note: --cv {args.cv}: {len(lab)} labelled scenarios make at most {folds} folds "
              f"(the halving search fits two scenarios per fold), so the search cross-validated with {folds}",
              file=sys.stderr)
    info = {"model": str(out), "kind": args.kind, "scenarios": len(lab), "profile": profile,
            **{k: model["provenance"].get(k) for k in ("best_params", "cv_smape_served_slots_mean", "cv_folds")},
            "bytes": out.stat().st_size}
    print(json.dumps(_finite(info), indent=1, default=_jd) if args.json else
          "\n".join(f"{k:<28} {v}" for k, v in info.items())
          + f"\nuse it with --model {out} (predict, rules, evaluate); the shipped model of the profile is unchanged"
          * (not args.out or out.resolve() != shipped_model_path(profile or "model", args.kind).resolve()))
    return 0


def offered_tok_s(rates: list[float], served: int, lengths: list[float] | None = None) -> float:
    """The tokens/s ``served`` adapters offer: the rates assigned round-robin (as the sweeps assign them) times the
    mean request's input + output tokens (``lengths``, else the published pool means, 222 / 197)."""
    from twin.sweep.scenario import DEFAULT_LENGTHS

    mean_in, mean_out = lengths if lengths else DEFAULT_LENGTHS
    k = len(rates)
    req_s = sum(rates) * (served // k) + sum(rates[: served % k])
    return req_s * (float(mean_in) + float(mean_out))


def workload_offered_tok_s(wl: dict[str, Any], served: int, seed: int = 0) -> float:
    """The tokens/s that ``served`` of a workload file's adapters offer over the window (``wl``: what
    :func:`_predict_workload` read): the requests the twin's run at ``served`` replays
    (:func:`twin.sweep.workload_scenario.served_workload`, the seeded order's first ``served`` adapters and the
    base model's requests), as a sweep row's ``offered_tok_s``."""
    from twin.sweep.workload_scenario import served_workload

    w = served_workload({"workload": wl["path"], "workload_sha256": wl["sha256"]}, min(int(served), wl["adapters"]),
                        seed, wl["window_s"])
    df = w.df
    inw = df["arrival_s"].to_numpy() <= wl["window_s"]
    tok = df["prompt_tokens"].to_numpy()[inw].sum() + df["output_tokens"].to_numpy()[inw].sum()
    return float(tok) / wl["window_s"]


def _workload_option(args, beside: list[tuple[str, Any]]) -> str:
    """``--workload FILE`` of ``search`` and ``predict``: the options in ``beside`` (``(flag, value)``) that the
    file gives itself are refused when set, and the file must exist; returns its path, ``~`` expanded."""
    given = [f for f, v in beside if v is not None]
    if given:
        raise ValueError(f"--workload with {', '.join(given)}: the workload file gives its requests' rates, ranks, "
                         f"lengths and arrival times itself; leave out {', '.join(given)}")
    path = str(Path(args.workload).expanduser())
    if not Path(path).is_file():
        what = "a directory" if Path(path).is_dir() else "no such file"
        raise ValueError(f"--workload {path}: {what}; give a workload file (.parquet, .csv, .jsonl) as "
                         f"`twin run --trace FILE` takes it")
    return path


def _predict_workload(args) -> dict[str, Any]:
    """``predict --workload FILE``: the file read as ``configure search --workload`` reads it
    (:func:`twin.sweep.workload_scenario.load_workload_scenario` over ``--window``), with ``window_s``; the options
    the file gives (--rates, --ranks, --lengths, --arrival) are refused beside it, before the model is read."""
    from twin.sweep.workload_scenario import load_workload_scenario

    args.workload = _workload_option(args, [("--rates", args.rates), ("--ranks", args.ranks),
                                            ("--lengths", args.lengths), ("--arrival", args.arrival)])
    if args.window is None:
        args.window = 3600.0
    check_number("--window", args.window, 0, False, "the seconds of the file whose requests make the rates, e.g. "
                                                     "--window 3600")
    try:
        info = load_workload_scenario(args.workload, args.window)
    except ValueError as e:  # (its messages speak of a grid's keys: here they are the options)
        raise ValueError(str(e).replace("grid [scenarios] workload", "--workload", 1).replace(
            "give a window_s", "give a --window", 1)) from None
    return {**info, "window_s": float(args.window)}


def _window_flag(wl: dict[str, Any]) -> str:
    """`` --window W`` for a ``--workload`` read over another window than the default (empty otherwise)."""
    return f" --window {wl['window_s']:g}" if wl["window_s"] != WINDOW_S else ""


def _search_engine_flags(model: dict[str, Any]) -> str:
    """The ``search`` flags that run the profile and engine ``model`` was trained on (search defaults to the default
    profile's shipped configurator's engine, which another profile's or a model of one's own need not share)."""
    from twin.configurator.models import resolve_engine

    us, cost = resolve_engine([model])
    profile = (model.get("provenance") or {}).get("profile")
    return ((f" --profile {profile}" if profile and profile != DEFAULT_PROFILE else "")
            + (f" --serving-us {us:g}" if us else "") + (f" --rank-tile-cost {cost:g}" if cost is not None else ""))


def _diluted_rates_note(wl: dict[str, Any]) -> str:
    """``predict --workload``: a warning when the file's requests stop well before ``--window`` ends (more than
    :data:`~twin.sweep.workload_scenario.GRACE_SHARE` of it): the rates the model reads are the file's requests over
    the whole window, below the rates at which they arrive -- a 300-s trace read over the default 3600 s looks 12x
    lighter than it is, and gets the recommendation of that lighter traffic; empty otherwise."""
    from twin.sweep.workload_scenario import GRACE_SHARE

    w, last = float(wl["window_s"]), float(wl["last_arrival_s"])
    if w - last <= GRACE_SHARE * w or last <= 0:
        return ""
    return (f"--window {w:g}: the last request of {wl['path']} arrives at {last:.1f} s, so the rates the model reads "
            f"are its requests over {w:g} s, {w / last:.3g}x below the rates at which they arrive (and a --check "
            f"run's backlog has {w - last:.0f} s to drain); give --window {math.floor(last):g} to recommend for its "
            f"traffic as it arrives")


def _fit_to_workload(res: dict[str, Any], wl: dict[str, Any]) -> None:
    """A recommendation for a workload file of ``N`` adapters serves at most ``N`` (``res`` changed in place): a
    model's served count above it becomes ``N`` (all of the file's adapters on one GPU; the model's own count stays
    under ``served_adapters_model``), and the slots at most the served adapters."""
    n = int(wl["adapters"])
    if res["served_adapters"] > n:
        res["served_adapters_model"] = res["served_adapters"]
        res["served_adapters"] = n
    res["adapter_slots"] = min(int(res["adapter_slots"]), int(res["served_adapters"]))
    res["workload"] = {k: wl[k] for k in ("path", "sha256", "adapters", "requests", "window_s", "last_arrival_s")}


def _extra_features(items: list[str]) -> dict[str, float]:
    """``--feature NAME=VALUE`` flags as a feature dict (numeric values only; not the features that
    --rates / --ranks give, which a flag would silently override)."""
    from twin.configurator.labels import FEATURES

    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--feature {item!r}: expected NAME=VALUE, e.g. --feature mean_input_tokens=222")
        if name == "policy" or name.startswith("policy="):
            raise ValueError(f"--feature {item!r}: give the policy as --policy NAME (e.g. --policy fcfs+client-cap)")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--feature {item!r}: the value must be a number") from None
        if not math.isfinite(out[name]):
            raise ValueError(f"--feature {item!r}: the value must be a finite number, e.g. --feature "
                             f"mean_input_tokens=222")
        if name in FEATURES:
            raise ValueError(f"--feature {item!r}: {name} is derived from --rates / --ranks (the max, min, mean and "
                             f"std of the triples); change --rates / --ranks instead of setting it")
    return out


def _load_for(args, default_kind: str):
    """The model of ``--model FILE``, else the shipped one of ``--profile`` (default :data:`DEFAULT_PROFILE`) and
    ``--kind`` (``default_kind`` when not given); a ``--kind`` that the file is not is refused (it picks only a
    shipped model), as is a ``--profile`` that is not the file's (it was ignored: the model's own profile is the
    one its recommendation is for, and the one ``--check`` runs)."""
    from twin.configurator.models import load_model

    kind = getattr(args, "kind", None) or default_kind
    model = (load_model(args.model, kind, as_path=True) if args.model  # (a path; a profile name is never one)
             else load_model(args.profile or DEFAULT_PROFILE, kind, as_path=False))
    if args.model and getattr(args, "kind", None) and model.get("kind") != args.kind:
        raise ValueError(f"--kind {args.kind} with --model {args.model}: the file is a {model.get('kind')} model, and "
                         f"--kind picks only a shipped model of --profile; leave --kind out, or leave --model out for "
                         f"the shipped {args.kind} model")
    _check_model_profile(args, model)
    return model


def _check_model_profile(args, model: dict[str, Any]) -> None:
    """``--profile`` beside ``--model FILE`` (predict, rules, evaluate --no-search): only the file's own profile,
    else an error (it was ignored: the model's own profile is the one its recommendation is for)."""
    own = (model.get("provenance") or {}).get("profile")
    if args.model and args.profile is not None and args.profile != own:
        raise ValueError(f"--profile {args.profile} with --model {args.model}: the model was trained on "
                         f"{own or 'runs of no recorded profile'}, and --profile picks only a shipped model; leave "
                         f"--profile out (the model's own profile is used), or leave --model out for the shipped "
                         f"model of {args.profile}")


def cmd_predict(args) -> int:
    from twin.configurator.features import (ARRIVAL_FEATURE, LENGTH_FEATURES, arrival_columns, arrival_name,
                                            is_policy_column, length_columns)
    from twin.configurator.labels import features_of
    from twin.configurator.models import predict
    from twin.sweep.workload_scenario import FILE_ARRIVAL

    if args.adapters is not None:
        check_number("--adapters", args.adapters, 1, True, "the adapters to host (for the GPUs needed), e.g. 1000")
    if args.gpu_hour_usd is not None and not (math.isfinite(args.gpu_hour_usd) and args.gpu_hour_usd > 0):
        raise ValueError(f"--gpu-hour-usd {args.gpu_hour_usd:g}: must be a price > 0 in USD per GPU-hour, e.g. 2.5")
    extra = _extra_features(args.feature)
    if args.workload is None and args.window is not None:
        raise ValueError("--window sets the seconds of a --workload file whose requests make the rates; give it with "
                         "--workload FILE, or drop it (--rates / --ranks are rates already)")
    wl = _predict_workload(args) if args.workload is not None else None
    if wl and args.adapters is not None and args.adapters < wl["adapters"]:
        # (printed "serve 10 adapters ..." then "2 adapters need 1 GPU")
        raise ValueError(f"--adapters {args.adapters:g} with --workload {args.workload}: the file's requests name "
                         f"{wl['adapters']} adapters, and the recommendation is for its traffic, so the adapters to "
                         f"host are at least those; leave --adapters out (it defaults to the file's {wl['adapters']}), "
                         f"or give more")
    rates, ranks = (None, None) if wl else _pair(args, triple=True)
    lengths = _lengths(args)
    if not args.check and (args.serving_us is not None or args.rank_tile_cost is not None):
        raise ValueError("--serving-us / --rank-tile-cost set the twin's engine for --check; add --check (a model's "
                         "recommendation does not depend on them)")
    _check_serving_us(args.serving_us)
    model = _load_for(args, "rf")
    if args.check:
        _check_rank_tile_cost(args.rank_tile_cost, model.get("provenance", {}).get("profile") or DEFAULT_PROFILE)
    if wl:
        from twin.configurator.features import workload_columns

        bad = sorted(set(extra) & (set(LENGTH_FEATURES) | {ARRIVAL_FEATURE}))
        if bad:
            raise ValueError(f"--workload with --feature {bad[0]}: the file gives its requests' lengths and arrival "
                             f"times itself; drop --feature {bad[0]}")
        x = workload_columns(model, wl["features"], f"--workload {args.workload}")
    else:
        x = features_of(rates, ranks)
    both = sorted(set(extra) & set(LENGTH_FEATURES))
    if both and lengths is not None:
        raise ValueError(f"--feature {both[0]} and --lengths both set the request-length mix; give only --lengths")
    if not both:
        x.update(length_columns(model, lengths))
    if ARRIVAL_FEATURE in extra and args.arrival is not None:
        raise ValueError(f"--feature {ARRIVAL_FEATURE} and --arrival both set the arrival process; give only "
                         f"--arrival (e.g. --arrival gamma:2)")
    if ARRIVAL_FEATURE in extra and extra[ARRIVAL_FEATURE] != 1.0:
        arrival_name(extra)  # (a CV outside the gamma streams' range: refused as --arrival would be)
    x.update(arrival_columns(model, args.arrival))
    unused = sorted(set(extra) - set(model["features"]))
    if unused:
        raise ValueError(f"--feature {unused[0]}: this model does not use it (its features: "
                         f"{', '.join(model['features'])}); drop the flag or pick a model trained with it")
    x.update(extra)
    missing = [f for f in model["features"] if f not in x and not is_policy_column(f)]  # indicators: --policy
    if missing:
        lens = " or as --lengths IN,OUT (mean input and output tokens, e.g. --lengths 222,197)" if set(missing) & set(
            LENGTH_FEATURES) else ""
        if ARRIVAL_FEATURE in missing:
            lens += " or as --arrival poisson|gamma:CV (each adapter's arrival process, e.g. --arrival gamma:2)"
        raise ValueError(f"the model was trained on features {missing} beyond the rate and rank triples; "
                         f"give them as --feature NAME=VALUE (e.g. --feature {missing[0]}=...){lens}")
    res = predict(model, x, explain=args.explain, policy=args.policy)
    res["rates"], res["ranks"] = rates, ranks
    if wl:
        _fit_to_workload(res, wl)
    elif args.check:
        _check_requests(args.rates, rates, res["served_adapters"])
    dom = training_domain(model)
    off = outside(dom, x)
    res["domain"] = None if dom is None else {"source": dom["source"], "outside": off}
    if off and not args.json:
        flags = (f" --workload {args.workload}" + _window_flag(wl) if wl else
                 f" --rates {args.rates} --ranks {args.ranks}") + _search_engine_flags(model)
        print(f"twin configure predict: warning: outside the model's training domain ({dom['source']}): "
              f"{describe(off)}; the recommendation extrapolates. --check runs the twin at it; "
              f"`twin configure search{flags}` finds the twin's own optimum on the engine the model was trained on",
              file=sys.stderr)
    if wl and not args.json and (note := _diluted_rates_note(wl)):
        print(f"twin configure predict: warning: {note}", file=sys.stderr)
    if all(f in x for f in LENGTH_FEATURES):
        res["lengths"] = [x[f] for f in LENGTH_FEATURES]
    res["arrival"] = arrival_name(x)
    if wl:
        res["lengths"] = [float(wl["features"][f]) for f in LENGTH_FEATURES]
        res["arrival"] = FILE_ARRIVAL
    if args.check:
        from twin.configurator.models import resolve_engine

        _check(res, model, *resolve_engine([model], args.serving_us, args.rank_tile_cost), workload=wl)
        if not any(st["status"] == "ok" for st in res["check"]["steps"]):
            return _none_started(res, args.json)
    offered = (workload_offered_tok_s(wl, res["served_adapters"]) if wl
               else offered_tok_s(rates, res["served_adapters"], res.get("lengths")))
    res["offered_tok_s"] = offered
    if res["throughput_tok_s"] > offered:  # (a model's extrapolation: 1204 tok/s of 161 offered)
        res["throughput_model_tok_s"] = res["throughput_tok_s"]
        res["throughput_tok_s"] = offered
    _cap_spread(res, offered if not (res.get("check") or {}).get("changed") else
                (workload_offered_tok_s(wl, res["model_recommendation"]["served_adapters"]) if wl
                 else offered_tok_s(rates, res["model_recommendation"]["served_adapters"], res.get("lengths"))))
    tp = res["throughput_tok_s"]
    _starvation(res, model, offered)
    gpus = None
    if wl and not args.adapters:  # (the adapters to host: the file's)
        args.adapters = wl["adapters"]
    if args.adapters:
        res["gpus_needed"] = gpus = int(math.ceil(args.adapters / res["served_adapters"]))
    if args.gpu_hour_usd:
        # the adapters the user has, not the recommended count: their traffic (tokens/s in proportion to the adapters
        # served, the recommendation's throughput per served adapter) over the GPUs they take
        total = tp * (args.adapters / res["served_adapters"]) if args.adapters else tp
        res["usd_per_million_tokens"] = (gpus or 1) * args.gpu_hour_usd / (total * 3600 / 1e6) if total > 0 else None
    if args.json:
        print(json.dumps(_finite(res), indent=1, default=_jd))
        return 0
    c = res.get("check")
    if c:
        m0 = res["model_recommendation"]
        tried = ", ".join(f"{st['served_adapters']}/{st['adapter_slots']}: "
                          + (f"{'<= ' if st['ratio_is_upper_bound'] else ''}{st['ratio']:.3f} of offered"
                             if st["status"] == "ok" else st["status"]) for st in c["steps"])
        verdict = ("kept" if not c["changed"] else
                   f"stepped down from {m0['served_adapters']} served adapters")
        last = c["steps"][-1]
        why = ("" if not c["starving"] else " -- still starving at served = slots, which the rule keeps"
               if last["status"] == "ok" else " -- no slot value of the grid starts")
        from twin.configurator.labels import describe_engine

        print(f"twin check on {describe_engine(c['engine'])} ({tried}): {verdict}{why}")
    capped = (f" (the model's {res['throughput_model_tok_s']:.0f} capped at the offered load)"
              if "throughput_model_tok_s" in res else "")
    stepped = bool(c and c["changed"])  # (then the raw values and the spread are the model's, before the check)
    raw = (f"the model's {res['model_recommendation']['served_adapters']} / "
           f"{res['model_recommendation']['adapter_slots']}, raw " if stepped else "raw ")
    print(f"serve {res['served_adapters']} adapters with {res['adapter_slots']} GPU adapter slots "
          f"({raw}{res['served_adapters_raw']:.1f} / {res['adapter_slots_raw']:.1f}); expected throughput "
          f"{tp:.0f} tok/s{capped}  [{res['model']} configurator, profile {res['profile']}, rule {res['rule']}, "
          f"policy {res['policy']}" + (f", lengths {res['lengths'][0]:.4g}/{res['lengths'][1]:.4g}" if "lengths" in res
                                       else "")
          + (f", arrival {res['arrival']}" if res["arrival"] != "poisson" else "") + "]")
    u = res.get("uncertainty")
    if u:
        tu, tm = u["throughput_tok_s"], u.get("throughput_model_tok_s")
        trees = (f" (capped at the offered load, as the expected throughput; the trees' {tm['p10']:.0f}-"
                 f"{tm['p90']:.0f})" if tm else "")
        print(f"{'the model' + chr(39) + 's ' if stepped else ''}spread across {u['trees']} trees (p10-p90): served {u['served_adapters']['p10']:.0f}-"
              f"{u['served_adapters']['p90']:.0f}, slots {u['adapter_slots']['p10']:.0f}-{u['adapter_slots']['p90']:.0f}, "
              f"throughput {tu['p10']:.0f}-{tu['p90']:.0f} tok/s{trees}")
    if res["expected_starving"] and not c:  # (with --check, its own line says what the twin read)
        flags = (f"--workload {wl['path']}" + _window_flag(wl) if wl else
                 f"--rates {','.join(f'{v:g}' for v in rates)} --ranks {','.join(str(int(k)) for k in res['ranks'])}")
        from twin.sweep.scenario import DEFAULT_LENGTHS, DEFAULT_POLICY

        if res.get("policy") and res["policy"] != DEFAULT_POLICY:
            flags += f" --policy {res['policy']}"
        if not wl and res.get("lengths") and tuple(map(float, res["lengths"])) != tuple(map(float, DEFAULT_LENGTHS)):
            flags += f" --lengths {res['lengths'][0]:g},{res['lengths'][1]:g}"
        if not wl and res.get("arrival", "poisson") != "poisson":
            flags += f" --arrival {res['arrival']}"
        flags += _search_engine_flags(model)
        print(_starvation_note(res, flags))
    short = (" -- a configuration expected to starve, so more GPUs than this are needed"
             if res["expected_starving"] and res["expected_ratio"] < res["ratio_line"] - NEAR_LINE else "")
    if "gpus_needed" in res:
        print(f"{args.adapters} adapters need {res['gpus_needed']} GPU{'s' * (res['gpus_needed'] != 1)} at this "
              f"configuration{short}")
    if res.get("usd_per_million_tokens"):
        whose = (f"{args.adapters} adapters' traffic on {res['gpus_needed']} GPU{'s' * (res['gpus_needed'] != 1)}"
                 if args.adapters else
                 f"one GPU serving {res['served_adapters']} adapters")
        print(f"cost: {res['usd_per_million_tokens']:.3f} USD per million tokens at {args.gpu_hour_usd} USD/GPU-h "
              f"({whose}; per token served{', not offered' if short else ''})")
    if args.explain:
        from twin.configurator.features import feature_label

        if res.get("terms"):  # a rule ensemble (RuleFit): per target, the terms that add up at this scenario
            for t, v in res["terms"].items():
                log = "log_prediction" in v
                total = v["log_prediction"] if log else v["prediction"]
                print(f"{t} = " + (f"exp({total:+.4f}) = {math.exp(total):.6g}" if log else f"{total:.6g}")
                      + f", {'the exponent is ' if log else ''}the sum of (R<k>: the target's rule k in `configure rules`):")
                for term in v["terms"]:
                    what = ("intercept" if term["term"] == "intercept" else
                            f"{term['coef']:+.4g} * {feature_label(term['feature'])}" if term["term"] == "linear" else
                            f"R{term['rule']}: {' AND '.join(term['conditions'])}")
                    print(f"  {term['contribution']:+.4f}  {what}")
        elif res.get("rule_path_by_tree"):  # a sum of trees (FIGS): one path per tree
            print("rule paths (" + res["rule_path_note"] + "): " + " + ".join(
                f"tree {k}: [{' AND '.join(steps) or 'root'}]" for k, steps in enumerate(res["rule_path_by_tree"], 1)))
        else:
            print("rule path: " + (" AND ".join(res.get("rule_path") or []) or "(root)")
                  + (f"  ({res['rule_path_note']})" if res.get("rule_path_note") else ""))
            if res.get("path_features"):
                n = (res.get("uncertainty") or {}).get("trees", "all")
                print(f"splits on the {n} trees' paths: " + ", ".join(
                    f"{feature_label(f)} {100 * v:.0f} %" for f, v in res["path_features"].items()))
    return 0


#: points below the starvation line within which ``predict`` calls its recommendation near the line rather than
#: starving: about the shipped forest's throughput error on the real test runs (SMAPE 1.1 % in the published
#: convention, some 2 % relative), so a model's 0.89 cannot tell a starving run from one that keeps up
NEAR_LINE = 0.02


def _starvation(res: dict[str, Any], model: dict[str, Any], offered: float) -> None:
    """``predict``'s expected share of the offered tokens at its recommendation (``expected_ratio``) and whether that
    is below the label rule's starvation line (``expected_starving``; the line, ``ratio_line``, is the model's
    ``provenance["ratio_line"]``, or the published 90 % its shipped models were labelled at), read from
    ``expected_ratio_from``: the model (its throughput over the tokens/s its served adapters offer) or, with
    ``--check``, the twin's run at the checked configuration (its verdict; the model's throughput is kept as
    ``throughput_tok_s`` where the check kept the configuration).

    A recommendation can starve for two reasons. The rules keep a starving configuration when a slot value's walk
    starts below the line and wins on throughput (the published rule: "if even the first run fails, keep it"), at
    served = slots: 2 of the 9 Llama test scenarios (rates 3.2/1.6/x req/s) do, on the real server too. Beyond that
    no training label starves, so a starving recommendation at more served adapters than slots is the model reading
    between its training scenarios (e.g. rates between the grid's 0.1 and 0.4 req/s)."""
    from twin.configurator.dataset import PUBLISHED_WALK_RATIO

    line = float((model.get("provenance") or {}).get("ratio_line", PUBLISHED_WALK_RATIO))
    c = res.get("check")
    last = c["steps"][-1] if c and c.get("steps") else None
    if last is not None and last["status"] == "ok":
        ratio, starving, source = float(last["ratio"]), bool(c["starving"]), "twin check"
    else:
        ratio = res["throughput_tok_s"] / offered if offered > 0 else float("nan")
        starving, source = bool(ratio < line), "model"
    res.update(expected_ratio=ratio, ratio_line=line, expected_starving=starving, expected_ratio_from=source)


def _starvation_note(res: dict[str, Any], scenario: str) -> str:
    """The line ``predict`` prints under a recommendation the model expects below the line (:func:`_starvation`;
    without ``--check``, whose own line says what the twin read); ``scenario``: the search flags that name the same
    scenario and engine (``--rates R --ranks K``, or ``--workload FILE``; ``--profile``, ...)."""
    q, line = res["expected_ratio"], res["ratio_line"]
    head = (f"the expected throughput is {100 * q:.0f} % of the {res['offered_tok_s']:,.0f} tok/s that "
            f"{res['served_adapters']} served adapters offer")
    slo = (f"`twin configure search {scenario} --rule slo --ttft-p99-s S` (the highest throughput that does not "
           f"starve in the twin, within a P99 TTFT of S seconds)")
    if q >= line - NEAR_LINE:
        return (f"near the line: {head}, within {100 * NEAR_LINE:.0f} points below the {100 * line:.0f} % line, "
                f"inside the model's error: `--check` runs the twin there (and steps the served adapters down if it "
                f"starves)")
    if res["served_adapters"] == res["adapter_slots"]:
        return (f"starving: {head}, below the {100 * line:.0f} % line, so its queue would grow for as long as the "
                f"traffic lasts: the {res['rule']} rule keeps a starving configuration when it has the highest "
                f"throughput of the slot values' walks (a walk keeps its first run, at served = slots, even when that "
                f"one starves). For a configuration that keeps up: {slo}")
    return (f"starving: {head}, below the {100 * line:.0f} % line. No training label starves with more served "
            f"adapters than slots, so this is the model reading between its training scenarios: `--check` runs the "
            f"twin at it and steps the served adapters down while it starves, or {slo}")


def _cap_spread(res: dict[str, Any], offered: float) -> None:
    """The forest's throughput spread (``res["uncertainty"]``, p10-p90 across its trees) capped at ``offered``, the
    tokens/s its recommendation's served adapters offer, as the expected throughput is (``res`` changed in place; the
    trees' own under ``uncertainty["throughput_model_tok_s"]``): a spread of 9672-10937 tok/s was printed beside an
    expected 8129 capped at the offered load, and 1160-1175 beside 0."""
    u = res.get("uncertainty")
    t = (u or {}).get("throughput_tok_s")
    if not t or not (t["p10"] > offered or t["p90"] > offered):
        return
    u["throughput_model_tok_s"] = dict(t)
    u["throughput_tok_s"] = {k: min(float(v), offered) for k, v in t.items()}


def _check_requests(given: str, rates: list[float], served: int, window_s: float = 3600.0) -> None:
    """``predict --check``: the twin's run at the recommended ``served`` adapters (its busiest: the check only
    steps down) stays within ``twin run``'s request cap (:data:`traces.registry.MAX_REQUESTS`), as a search's
    does; else an error naming --rates and the cap, before any run (numpy refused the draw: "lam value too
    large"). ``given``: --rates as typed."""
    from traces.registry import MAX_REQUESTS

    k = len(rates)
    n = (sum(rates) * (served // k) + sum(rates[: served % k])) * window_s
    if n > MAX_REQUESTS:
        count = f"{n:,.0f}" if n < 1e15 else f"{n:.3g}"
        raise ValueError(f"--rates {given}: the twin's check at the recommended {served} "
                         f"served adapters would be offered ~{count} requests over its {window_s:g} s window, more "
                         f"than the {MAX_REQUESTS:,} a run may hold (the cap of `twin run`); lower --rates, or leave "
                         f"out --check (the model's recommendation runs nothing)")


def _none_started(res: dict[str, Any], as_json: bool) -> int:
    """``predict --check`` where no configuration the check tried passed vLLM's start-up check: no
    recommendation is printed (nor a configuration in the JSON: ``served_adapters`` and ``adapter_slots``
    null, ``check.none_started`` true), what failed is said instead; exit status 1."""
    c = res["check"]
    tried = ", ".join(f"{st['served_adapters']}/{st['adapter_slots']}" for st in c["steps"])
    reason = next((st.get("startup_reason") for st in c["steps"] if st.get("startup_reason")), "")
    c["none_started"] = True
    for k in ("served_adapters", "adapter_slots", "throughput_tok_s"):
        res[k] = None
    if as_json:
        print(json.dumps(_finite(res), indent=1, default=_jd))
    print(f"twin configure predict: no recommendation: the twin's check tried {tried} (served/slots) and none passed "
          f"vLLM's start-up check{f' (first: {reason})' if reason else ''}; the model's "
          f"{res['model_recommendation']['served_adapters']} / {res['model_recommendation']['adapter_slots']} cannot "
          f"be served on this GPU: lower --ranks, or find what starts with `twin configure search`", file=sys.stderr)
    return 1


def _check(res: dict[str, Any], model: dict[str, Any], serving_us: float = 0.0,
           rank_tile_cost: float | None = None, workload: dict[str, Any] | None = None) -> None:
    """``predict --check``: the twin's check of the recommendation (:mod:`twin.configurator.check`);
    ``res`` then holds the checked configuration, the model's own under ``model_recommendation``, and
    the twin's throughput where the check changed the configuration. ``workload`` (``predict --workload``): the
    file's scenario is checked, on the grid's values within its adapters and the recommendation's own."""
    from twin.configurator.check import check_recommendation
    from twin.sweep.grid import PUBLISHED_GRID
    from twin.sweep.scenario import DEFAULT_LENGTHS

    grid = model.get("grid") or {}
    served_grid = grid.get("served") or list(PUBLISHED_GRID)
    slot_grid = grid.get("slots") or list(PUBLISHED_GRID)
    kw: dict[str, Any] = {"arrival": res.get("arrival") or "poisson"}
    if workload is not None:
        n = int(workload["adapters"])
        served_grid = sorted({int(v) for v in served_grid if int(v) <= n} | {int(res["served_adapters"])})
        slot_grid = sorted({int(v) for v in slot_grid if int(v) <= n} | {int(res["adapter_slots"])})
        kw = {"workload": workload["path"], "window_s": workload["window_s"]}
    lengths = tuple(res.get("lengths") or DEFAULT_LENGTHS)
    c = check_recommendation(res["rates"], res["ranks"], res["served_adapters"], res["adapter_slots"], res["profile"],
                             served_grid=served_grid, slot_grid=slot_grid, policy=res["policy"], lengths=lengths,
                             serving_us=serving_us, rank_tile_cost=rank_tile_cost, **kw)
    res["model_recommendation"] = {k: res[k] for k in ("served_adapters", "adapter_slots", "throughput_tok_s")}
    res["check"] = {k: c[k] for k in ("changed", "starving", "steps", "scenario", "window_s", "ratio_line")}
    res["check"]["engine"] = {"serving_us": serving_us, "rank_tile_cost": rank_tile_cost}
    res["served_adapters"], res["adapter_slots"] = c["served_adapters"], c["adapter_slots"]
    if c["changed"] and math.isfinite(c["throughput_tok_s"]):
        res["throughput_tok_s"] = c["throughput_tok_s"]


def cmd_rules(args) -> int:
    from twin.configurator.models import format_rules

    model = _load_for(args, "cart")
    if model.get("rule_ensembles"):
        from twin.configurator.models import format_rule_ensembles

        if args.json:
            print(json.dumps(_finite({"rule_ensembles": model["rule_ensembles"], "provenance": model["provenance"]}),
                             indent=1, default=_jd))
        else:
            print(format_rule_ensembles(model))
        return 0
    if not model.get("rules"):
        raise ValueError(f"{model.get('_path')} has no rules (kind {model.get('kind')}); give a model trained with "
                         f"--kind cart, hstree or rulefit, or leave --model out for the shipped cart model")
    if args.json:
        pol = {"policies": model["policies"]} if model.get("policies") else {}  # the indicators' policies
        print(json.dumps(_finite({"rules": model["rules"], **pol, "provenance": model["provenance"]}), indent=1,
                         default=_jd))
    else:
        print(format_rules(model))
    return 0


def _engine_args(p: argparse.ArgumentParser, whose: str, from_model: bool = False) -> None:
    """``--serving-us`` and ``--rank-tile-cost``: the twin's engine constants that ``twin validate`` fits on the
    real runs' fit split (:data:`twin.validation.specs.SERVING_S_PER_RUNNING`, :data:`~twin.validation.specs.
    RANK_TILE_COST`). ``from_model`` (predict, evaluate): each defaults to the engine the model was trained on
    (:func:`twin.configurator.models.model_engine`); else (search) to the calibrated engine alone."""
    if from_model:
        us_default = "the engine the model was trained on, in its provenance; 0, the calibrated engine, for a model without one"
        cost_default, profile_word, cost_type = "the engine the model was trained on", ", or 'profile' for the profile's own", _tile_cost
    else:
        us_default, cost_default, profile_word, cost_type = (
            "the engine the profile's shipped configurator was trained on; 0, the calibrated engine, for a profile "
            "without one", "the same engine's; the profile's own for a profile without a configurator", "", float)
    used = "twin validate and the adapter-twin-llama-validated grid use"
    p.add_argument("--serving-us", type=float, default=None, metavar="US",
                   help=f"{whose} serving-path host time per running request and engine step, microseconds (default: "
                        f"{us_default}; {used} {SERVING_S_PER_RUNNING * 1e6:g})")
    p.add_argument("--rank-tile-cost", type=cost_type, default=None, metavar="COST",
                   help=f"{whose} working-block cost of a LoRA shrink rank tile beyond the first, relative to the "
                        f"first (rank-32 slots run two tiles){profile_word} (default: {cost_default}; {used} "
                        f"{RANK_TILE_COST:g})")


def _shipped_engine(profile: str, serving_us: float | None, rank_tile_cost: float | None) -> tuple[float, float | None]:
    """``configure search``'s engine: each constant given, else the one the profile's shipped configurator was
    trained on (:func:`twin.configurator.models.model_engine`: the default profile's is ``twin validate``'s 18 us and
    0.7091), else the calibrated engine (0 us, the profile's own rank tiles) for a profile without a configurator."""
    from twin.configurator.models import load_model, resolve_engine

    models = []
    if serving_us is None or rank_tile_cost is None:
        try:
            models = [load_model(profile, "rf", as_path=False)]
        except (FileNotFoundError, ValueError):  # (no shipped configurator, or a profile given as a file)
            pass
    return resolve_engine(models, serving_us, rank_tile_cost)


def _tile_cost(text: str) -> "float | str":
    """``--rank-tile-cost`` of predict / evaluate: a number, or 'profile' (the profile's own rank tiles)."""
    from twin.configurator.models import PROFILE_TILES

    if text.strip().lower() == PROFILE_TILES:
        return PROFILE_TILES
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a cost relative to the first rank tile, e.g. "
                                         f"{RANK_TILE_COST:g} (1: every tile alike), or 'profile'") from None


def _check_serving_us(us: float | None) -> None:
    """``--serving-us``: None (not given) or a number >= 0, else an error naming the fix."""
    if us is not None:
        check_host_term("serving_us", us, "--serving-us", "microseconds per running request and step, e.g. "
                                                          "--serving-us 18 (0: off)")


def _check_rank_tile_cost(cost: "float | str | None", profile: str | None) -> None:
    """``--rank-tile-cost``: a number >= 0 that the profile's LoRA form can take (kernel_grid), else an error
    (None, not given, and 'profile' pass)."""
    if cost is None or isinstance(cost, str):
        return
    check_host_term("rank_tile_cost", cost, "--rank-tile-cost", "a cost relative to the first rank tile, e.g. "
                                                                f"--rank-tile-cost {RANK_TILE_COST:g} (1: every tile alike)")
    from twin.sweep.scenario import get_profile

    try:
        get_profile(profile).with_rank_tile_cost(cost)
    except ValueError as e:
        raise ValueError(f"--rank-tile-cost {cost:g}: {e}") from None


def cmd_evaluate(args) -> int:
    from twin.configurator.evaluate import evaluate, format_table
    from twin.sweep.runner import check_selection

    if args.no_search:  # (the search baseline's options were read by nothing)
        given = [f for f, v in (("--search-cache", args.search_cache), ("--executor", args.executor),
                                ("--jobs", args.jobs)) if v is not None]
        if given:
            raise ValueError(f"{' / '.join(given)} with --no-search: {'it sets' if len(given) == 1 else 'they set'} "
                             f"the twin-as-optimiser baseline's runs, which --no-search leaves out; drop "
                             f"{'it' if len(given) == 1 else 'them'}, or drop --no-search")
        engine = [f for f, v in (("--serving-us", args.serving_us), ("--rank-tile-cost", args.rank_tile_cost))
                  if v is not None]
        if engine and not args.check:  # (recorded in the summary's engine, though no run read them)
            raise ValueError(f"{' / '.join(engine)} with --no-search and without --check: "
                             f"{'it sets' if len(engine) == 1 else 'they set'} the engine of the twin's runs (the "
                             f"twin-as-optimiser baseline's and --check's), and none is run; drop "
                             f"{'it' if len(engine) == 1 else 'them'}, or give --check")
    args.executor = args.executor or "local"
    args.jobs = 1 if args.jobs is None else args.jobs
    check_selection(jobs=args.jobs)
    _check_serving_us(args.serving_us)
    _check_rank_tile_cost(args.rank_tile_cost, args.profile)
    if args.out:
        check_writable_dir("--out", args.out)
    if args.search_cache is not None:
        check_writable_dir("--search-cache", args.search_cache)
    if args.no_search and args.model and args.profile is not None:  # (as predict refuses it)
        from twin.configurator.models import load_model

        _check_model_profile(args, load_model(args.model, "rf", as_path=True))
    real = args.real
    if real is None:
        from traces.datadir import require

        real = require("validation/vllm085_h100_llama31_8b.csv")
    with _executor_extra():  # (progress None: no terminal, a line once the search is under way)
        res = evaluate(real, args.profile, args.model, args.source or "", args.search_cache, not args.no_search,
                       args.executor, args.jobs, progress=sys.stderr.isatty() or None, check=args.check,
                       serving_us=args.serving_us, rank_tile_cost=args.rank_tile_cost)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        res["table"].to_csv(out / "evaluation.csv", index=False, float_format="%.4g")
        res["per_scenario"].to_csv(out / "per_scenario.csv", index=False, float_format="%.6g")
        res["crossings"].to_csv(out / "crossings.csv", index=False, float_format="%.4f")
        (out / "summary.json").write_text(json.dumps(_finite(res["summary"]), indent=1, default=_jd))
        from twin.configurator.evaluate import make_figures

        make_figures(res, out)
    if args.json:
        print(json.dumps(_finite(res["summary"]), indent=1, default=_jd))
    else:
        s = res["summary"]
        from twin.configurator.labels import describe_engine

        print(f"twin configure evaluate: {s['scenarios']} scenarios of {s['real']} (source {s['source']}), "
              f"profile {s['profile']}; the twin's search and check: {describe_engine(s['engine'])}")
        print(format_table(res["table"]))
        if "crossings" in s:
            c = s["crossings"]
            print(f"real 90 % crossings: {c['points']} points, {c['with_twin']} reached by the twin's walk, "
                  f"{c['same_side']} on the same side of the line")
    return 0


def _no_result(runs) -> str:
    """Why a walk's runs gave no label: their statuses and the first run's reason (where one says)."""
    from twin.configurator.dataset import describe_statuses

    return describe_statuses(runs)


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"P99 {'TTFT' if k == 'ttft_p99_s' else 'ITL'} <= {v:g} s" for k, v in slo.items())


def _search_slo(args) -> dict[str, float]:
    """``search``'s percentile SLOs, checked before any run: the ``slo`` rule needs at least one (the
    search's runs record no ``[slo]`` attainment), the other rules take none."""
    _check_percentile_slo(args)
    slo = {k: v for k, v in (("ttft_p99_s", args.ttft_p99_s), ("itl_p99_s", args.itl_p99_s)) if v is not None}
    if args.rule == "slo" and not slo:
        raise ValueError("--rule slo: the search's runs record no [slo] attainment; give percentile SLOs on its runs, "
                         "e.g. --ttft-p99-s 5 --itl-p99-s 0.15 (P99 TTFT and P99 inter-token latency in seconds)")
    if args.rule != "slo" and slo:
        raise ValueError(f"--ttft-p99-s / --itl-p99-s apply to --rule slo, not {args.rule!r}; add --rule slo or drop "
                         f"them")
    return slo


@contextmanager
def _executor_extra():
    """Report an executor whose optional extra is missing (``--executor ray`` without ray, ``dask``
    without dask.distributed; raised before the first run) as bad input, as ``twin sweep`` does:
    ``twin configure: error: ...``, exit 2."""
    from twin.sweep.runner import MissingExtra

    try:
        yield
    except MissingExtra as e:
        raise ValueError(f"{e}; or use --executor local") from None


def _window_warning(grid) -> None:
    """``search --window`` too short for the starvation line (:func:`twin.sweep.grid.window_note`): a warning
    before any run (a short window still answers, and quickly; the tokens in flight at its end go uncounted,
    so a configuration that keeps up can read as starving and the answer be too few served adapters, or none)."""
    from twin.sweep.grid import window_note

    short = window_note(grid, "the scenario", "--window")
    if short:
        print(f"twin configure search: warning: {short}", file=sys.stderr)


def cmd_search(args) -> int:
    from twin.configurator.search import search
    from twin.sweep.runner import check_selection
    from twin.sweep.grid import PUBLISHED_GRID
    from twin.sweep.scenario import DEFAULT_LENGTHS, DEFAULT_POLICY, check_length_corr

    check_number("--window", args.window, 0, False, "the simulated seconds of each run, e.g. --window 3600")
    check_selection(jobs=args.jobs)
    if args.cache is not None:  # (a file there was "cannot use FILE/shards", naming no option)
        check_writable_dir("--cache", args.cache)
    kw: dict[str, Any] = {"window_s": args.window}
    if args.workload is not None:  # a trace of the user's: its rates, ranks, lengths and arrivals are the file's
        args.workload = _workload_option(args, [("--rates", args.rates), ("--ranks", args.ranks),
                                                ("--lengths", args.lengths), ("--arrival", args.arrival),
                                                ("--length-corr", args.length_corr or None)])
        kw["workload"] = args.workload
        pair = None
    else:
        pair = _pair(args, triple=False)
    if args.policy is not None:  # checked with the grid, before any run
        kw["policy"] = args.policy
    lengths = _lengths(args)
    if lengths is not None:
        kw["lengths"] = lengths
    if args.arrival is not None:
        from twin.configurator.features import arrival_option

        kw["arrival"] = arrival_option(args.arrival).name
    kw["served"] = (_int_list("--served", args.served, "16,32,64", "a served-adapter count")
                    if args.served is not None else list(PUBLISHED_GRID))
    kw["slots"] = (_int_list("--slots", args.slots, "16,32", "a slot count")
                   if args.slots is not None else list(PUBLISHED_GRID))
    if args.length_corr:
        kw["length_corr"] = check_length_corr(args.length_corr, "--length-corr")
    _check_serving_us(args.serving_us)
    if args.rank_tile_cost is not None:
        _check_rank_tile_cost(args.rank_tile_cost, args.profile)
    us, cost = _shipped_engine(args.profile, args.serving_us, args.rank_tile_cost)
    if us:
        kw["serving_us"] = us
    if cost is not None:
        kw["rank_tile_cost"] = cost
    slo = _search_slo(args)
    with _executor_extra():  # (the window's warning once the grid is checked, before any run)
        try:
            labels, runs = search([pair] if pair else [], args.profile, args.cache, args.executor, args.jobs,
                                  args.rule, progress=sys.stderr.isatty() or None, on_grid=_window_warning, **slo, **kw)
        except ValueError as e:  # (the file's checks speak of a grid's key: here it is the option)
            msg = str(e)
            if args.workload is None or not msg.startswith(("grid [scenarios] workload", "grid [configs] served")):
                raise
            raise ValueError(msg.replace("grid [scenarios] workload", "--workload", 1).replace(
                "grid [configs] served", "--served", 1).replace("/ slots", "/ --slots", 1)) from None
    if labels.empty and args.rule == "slo" and runs["status"].astype(str).eq("ok").any():
        raise ValueError(f"no configuration of the search meets the SLOs ({_slo_text(slo)}) without starving: "
                         f"{_no_result(runs)}; loosen --ttft-p99-s / --itl-p99-s, or lower --rates")
    if labels.empty:  # no run of the walk gave a result (the rule skips start failures and errors)
        raise ValueError(f"no configuration of the search ran: {_no_result(runs)}")
    lab = labels.iloc[0].to_dict()
    res = {"served_adapters": int(lab["served_adapters"]), "adapter_slots": int(lab["adapter_slots"]),
           "throughput_tok_s": float(lab["throughput_tok_s"]), "ratio_at_label": lab["ratio_at_label"],
           "margin": lab["margin"], "next_ratio": lab["next_ratio"], "rule": args.rule, "profile": args.profile,
           "policy": kw.get("policy", DEFAULT_POLICY), "lengths": list(kw.get("lengths", DEFAULT_LENGTHS)),
           "arrival": kw.get("arrival", "poisson"), "length_corr": float(kw.get("length_corr", 0.0)),
           **({"workload": str(Path(args.workload).resolve()), "lengths": [float(lab["mean_input_tokens"]),
                                                                           float(lab["mean_output_tokens"])],
               "arrival": "file"} if args.workload else {}), "serving_us": float(kw.get("serving_us", 0.0)),
           "rank_tile_cost": kw.get("rank_tile_cost"),
           "runs": int(len(runs)), "runs_simulated": int((runs["status"] == "ok").sum()),
           "cpu_s": float(runs["wall_s"].fillna(0).sum()), **({"slo": slo} if slo else {})}
    if args.json:
        print(json.dumps(_finite(res), indent=1, default=_jd))
    else:
        print(f"serve {res['served_adapters']} adapters with {res['adapter_slots']} slots: "
              f"{res['throughput_tok_s']:.0f} tok/s ({res['ratio_at_label']:.3f} of offered; "
              f"{_next_run(res['next_ratio'])}) [{args.rule}, twin walk of {res['runs']} runs, "
              f"{res['cpu_s']:.0f} CPU-s]")
    return 0
