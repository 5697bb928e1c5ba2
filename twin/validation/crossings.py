"""The twin at the real runs' 90 % crossings, from a validation pass's ``per_run.csv``.

Issue 17's last Llama target: at each real 90 % crossing (per scenario and slot count, the
last run at or above 0.9 of the offered tokens and the first run below it, in the order of the
served adapters, as :func:`twin.configurator.evaluate.crossings` finds them), the twin's
throughput / offered within +-2 points of the real one. Here the twin's figure is the
validation's re-creation of the same run (``twin_throughput / offered_tok_s_est``), so any
subset of the real runs can be scored, e.g. the fit split (``dt_modelling``) for choosing
between mechanisms without touching the test split.

``python -m twin.validation.crossings PER_RUN_CSV [--source dt_modelling]`` prints every crossing
and the summary (crossings within +-2 points, median and largest twin - real).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import pandas as pd

from twin.validation.specs import script_inputs

#: the real 90 % line and the issue's tolerance (points of throughput / offered)
LINE = 0.9
TOLERANCE_POINTS = 2.0


def crossings_from_per_run(per_run: pd.DataFrame, source: str | None = "dt_modelling") -> pd.DataFrame:
    """One row per side of each real 90 % crossing of ``per_run`` (a validation pass's per-run
    table, which carries ``real_throughput``, ``twin_throughput`` and, joined from the real
    table, ``offered_tok_s_est``): real and twin throughput / offered and their difference in points."""
    need = {"scenario", "adapter_slots", "served_adapters", "real_throughput", "twin_throughput",
            "offered_tok_s_est", "status"}
    missing = sorted(need - set(per_run.columns))
    if missing:
        raise ValueError(f"crossings: the per-run table lacks columns {missing}; pass a validation per_run.csv "
                         f"joined with the real table's offered_tok_s_est")
    df = per_run if source is None else per_run[per_run["source"] == source]
    df = df[(df["status"] == "ok") & df["real_throughput"].notna()]
    rows: list[dict[str, Any]] = []
    for (sc, g), sub in df.groupby(["scenario", "adapter_slots"]):
        sub = sub.sort_values("served_adapters")
        off = sub["offered_tok_s_est"].to_numpy(float)
        real = sub["real_throughput"].to_numpy(float) / off
        twin = sub["twin_throughput"].to_numpy(float) / off
        served = sub["served_adapters"].to_numpy(int)
        for i in range(len(sub) - 1):
            if real[i] >= LINE > real[i + 1]:
                for side, j in (("last_above", i), ("first_below", i + 1)):
                    d = (twin[j] - real[j]) * 100.0
                    rows.append({"scenario": sc, "adapter_slots": int(g), "side": side, "served_adapters": int(served[j]),
                                 "real_ratio": round(float(real[j]), 4), "twin_ratio": round(float(twin[j]), 4),
                                 "twin_minus_real_points": round(float(d), 2),
                                 "within_tolerance": bool(math.isfinite(d) and abs(d) <= TOLERANCE_POINTS)})
                break
    return pd.DataFrame(rows)


def summary(cr: pd.DataFrame) -> dict[str, Any]:
    """Crossings within +-2 points, and the median / largest twin - real (points) per side."""
    if not len(cr):
        return {"crossings": 0}
    d = cr["twin_minus_real_points"]
    out: dict[str, Any] = {"crossings": int(len(cr)), "within_2_points": int(cr["within_tolerance"].sum()),
                           "median_abs_points": round(float(d.abs().median()), 2),
                           "largest_abs_points": round(float(d.abs().max()), 2)}
    for side in ("last_above", "first_below"):
        s = d[cr["side"] == side]
        if len(s):
            out[f"median_{side}_points"] = round(float(s.median()), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the twin at the real 90 % crossings of a validation per_run.csv")
    ap.add_argument("per_run", help="per_run.csv of a twin validate --out pass")
    ap.add_argument("--real", default=None, help="real-run table (default: the Llama validation table in $TWIN_DATA_DIR)")
    ap.add_argument("--source", default="dt_modelling", help="subset of the real runs (default: the fit split)")
    a = ap.parse_args(argv)
    real_csv = script_inputs(a.real, a.per_run)
    pr = pd.read_csv(a.per_run)
    real = pd.read_csv(real_csv, usecols=["run_dir", "scenario", "source", "offered_tok_s_est"])
    pr = pr.merge(real, on=["run_dir", "scenario", "source"], how="left")
    cr = crossings_from_per_run(pr, a.source)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(cr.to_string(index=False))
    print(summary(cr))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
