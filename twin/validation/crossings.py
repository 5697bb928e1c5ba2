"""Command line of :mod:`twin.validation.knee`: the twin at the real runs' 90 % crossings, from a validation
pass's ``per_run.csv`` (the computation is re-exported here).

``python -m twin.validation.crossings PER_RUN_CSV [--source dt_modelling]`` prints every crossing
and the summary (crossings within +-2 points, median and largest twin - real), then the twin's
throughput error of the KV-saturated runs by served adapters per slot, the slope behind the misses
(:func:`twin.validation.diagnostics.saturated_throughput_by_share`, both splits). Given several passes
of the same runs with different seeds (``twin validate --seed K --out DIR``), it prints the twin's
ratio per pass and its spread at each crossing (:func:`twin.validation.knee.seed_spread`; ``--out``
writes that table): one real run per configuration is set beside a twin whose own seed moves a
knife-edge run by several points.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from traces.arguments import check_writable_file

from twin.validation.diagnostics import saturated_throughput_by_share
from twin.validation.knee import LINE, TOLERANCE_POINTS, crossings_from_per_run, seed_spread, summary
from twin.validation.specs import read_table, script_inputs

__all__ = ["LINE", "TOLERANCE_POINTS", "crossings_from_per_run", "seed_spread", "summary", "main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the twin at the real 90 % crossings of a validation per_run.csv")
    ap.add_argument("per_run", nargs="+", help="per_run.csv of a twin validate --out pass; several (passes with "
                                               "different --seed) print the twin's spread at each crossing")
    ap.add_argument("--real", default=None, help="real-run table (default: the Llama validation table in $TWIN_DATA_DIR)")
    ap.add_argument("--source", default="dt_modelling", help="subset of the real runs (default: the fit split)")
    ap.add_argument("--out", default=None, help="with several passes: write the per-crossing table here (CSV)")
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except SystemExit as e:  # (script_inputs: a missing file)
        if isinstance(e.code, int) or e.code is None:
            raise
        msg = str(e.code)
    except (ValueError, FileNotFoundError) as e:
        msg = str(e)
    print(msg if msg.startswith("crossings:") else f"crossings: {msg}", file=sys.stderr)
    return 2


#: columns of a per_run.csv the crossings read (beside the twin's and the real figures)
PER_RUN_KEYS = ("run_dir", "scenario", "source", "status")


def _run(a: argparse.Namespace) -> int:
    """:func:`main` after parsing; bad inputs raise ``ValueError`` naming the file and the fix, before any work."""
    real_csv = script_inputs(a.real, *a.per_run)
    if a.out is not None:
        check_writable_file("--out", a.out, (".csv",))
    real = read_table(real_csv, "real-run table (--real)")
    missing = [c for c in ("run_dir", "scenario", "source", "offered_tok_s_est") if c not in real.columns]
    if missing:
        raise ValueError(f"{real_csv}: not a real-run validation table (missing columns {missing})")
    real = real[["run_dir", "scenario", "source", "offered_tok_s_est"]]
    passes = []
    for p in a.per_run:
        df = read_table(p, "per_run.csv")
        missing = [c for c in PER_RUN_KEYS if c not in df.columns]
        if missing:
            raise ValueError(f"{p}: not the per_run.csv of a twin validate --out pass (missing columns {missing})")
        passes.append(df.merge(real, on=["run_dir", "scenario", "source"], how="left"))
    if len(passes) == 1:
        cr = crossings_from_per_run(passes[0], a.source)
        with pd.option_context("display.width", 200, "display.max_rows", 500):
            print(cr.to_string(index=False))
        print(summary(cr))
        by_share = saturated_throughput_by_share(passes[0][passes[0]["status"] == "ok"])
        for split in ("fit", "test"):
            if split in by_share:
                cells = "; ".join(f"{k} {v['median_pct']:+.1f} % ({v['runs']})"
                                  for k, v in by_share[split]["by_served_per_slot"].items())
                print(f"saturated runs, twin / real throughput - 1 by served adapters per slot, {split} split: {cells}")
        return 0
    try:
        table, s = seed_spread(passes, a.source)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    with pd.option_context("display.width", 250, "display.max_rows", 500):
        print(table.to_string(index=False))
    print(s)
    if a.out:
        table.to_csv(a.out, index=False)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
