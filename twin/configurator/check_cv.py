"""How often a configurator overshoots the twin's own optimum, and what the twin's check does about it,
measured on the training labels by cross-validation (no real run is used).

For each fold of a ``k``-fold split of the label rows (one row per scenario, from ``twin configure
dataset``), a model of the given kind is fitted on the other folds with fixed hyper-parameters (the
shipped model's chosen ones by default; no grid search inside the folds) and recommends for the
held-out scenarios. Each recommendation is scored against the twin's label (the ``throughput90``
optimum of the scenario's sweep walk) and then checked in the twin
(:func:`twin.configurator.check.check_recommendation`). Printed: served / slot SMAPE against the
labels before and after the check (on the labels' engine: :func:`twin.configurator.dataset.label_engine`),
the recommendations that starve in the twin (before: the
check's first run; after: none unless even the smallest served value starves), and the twin's
throughput at the recommendation / the label's.

    python -m twin.configurator.check_cv results/configurator/labels_llama_throughput90.csv \\
        --profile llama-3.1-8b_h100_vllm085 --jobs 2 --out results/configurator/check_cv_llama.csv
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twin.configurator.check import check_recommendation
from twin.configurator.dataset import label_engine
from twin.configurator.models import load_model, predict, smape_pct, train
from twin.configurator.labels import FEATURES
from twin.sweep.grid import PUBLISHED_GRID


#: the per-scenario columns ``--out`` writes: the label, the held-out recommendation, the check
OUT_COLUMNS = ["scenario", "fold", "served_adapters", "adapter_slots", "throughput_tok_s", "ratio_at_label",
               "served_raw", "slots_raw", "served", "slots", "twin_ratio_at_rec", "starving_at_rec", "checked_served",
               "checked_slots", "starving_after_check", "check_steps", "twin_tok_s_checked", "rel_tok_s_checked",
               "check_cpu_s"]


def _check_one(args: tuple) -> dict[str, Any]:
    rates, ranks, n, g, profile, grid, policy, lengths, window_s, engine = args
    return check_recommendation(rates, ranks, n, g, profile, served_grid=grid, slot_grid=grid,
                                policy=policy, lengths=lengths, window_s=window_s, **engine)


def cross_validated_predictions(labels: pd.DataFrame, kind: str, folds: int, seed: int,
                                params: dict[str, Any] | None) -> pd.DataFrame:
    """One row per label row: the held-out model's snapped and raw recommendation."""
    from sklearn.model_selection import KFold

    rows = []
    kf = KFold(folds, shuffle=True, random_state=seed)
    for f, (tr, te) in enumerate(kf.split(labels)):
        m = train(labels.iloc[tr].reset_index(drop=True), kind, seed=seed, search=False, params=params)
        m["grid"] = {"served": list(PUBLISHED_GRID), "slots": list(PUBLISHED_GRID)}
        for _, r in labels.iloc[te].iterrows():
            p = predict(m, {k: float(r[k]) for k in FEATURES}, policy=r.get("policy"))
            rows.append({"scenario": r["scenario"], "fold": f, "served": p["served_adapters"], "slots": p["adapter_slots"],
                         "served_raw": p["served_adapters_raw"], "slots_raw": p["adapter_slots_raw"]})
    return pd.DataFrame(rows)


def run(labels_path: str, profile: str | None, kind: str = "rf", folds: int = 5, seed: int = 0, jobs: int = 1,
        limit: int | None = None, window_s: float = 3600.0) -> tuple[pd.DataFrame, dict[str, Any]]:
    labels = pd.read_csv(labels_path)
    if "rule" in labels and set(labels["rule"].dropna()) - {"throughput90"}:
        raise ValueError(f"{labels_path}: the check follows the throughput90 rule; give throughput90 labels")
    profile = profile or str(labels["profile"].dropna().iloc[0])
    engine = label_engine(labels)  # the check runs the twin the labels came from
    try:  # the shipped model's chosen hyper-parameters
        params = dict(load_model(profile, kind, as_path=False)["provenance"].get("best_params") or {})
    except FileNotFoundError:
        params = {}
    preds = cross_validated_predictions(labels, kind, folds, seed, params)
    d = labels.merge(preds, on="scenario")
    if limit:
        d = d.sample(n=min(limit, len(d)), random_state=seed).reset_index(drop=True)
    work = [([float(x) for x in str(r["rates"]).split("-")], [int(x) for x in str(r["ranks"]).split("-")],
             int(r["served"]), int(r["slots"]), profile, list(PUBLISHED_GRID),
             str(r.get("policy") or "fcfs+client-cap"),
             (float(r["mean_input_tokens"]), float(r["mean_output_tokens"])), window_s, engine) for _, r in d.iterrows()]
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as ex:
            checks = list(ex.map(_check_one, work, chunksize=1))
    else:
        checks = [_check_one(w) for w in work]
    d["checked_served"] = [c["served_adapters"] for c in checks]
    d["checked_slots"] = [c["adapter_slots"] for c in checks]
    d["twin_ratio_at_rec"] = [c["steps"][0]["ratio"] for c in checks]
    d["starving_at_rec"] = [c["steps"][0]["starving"] for c in checks]
    d["starving_after_check"] = [c["starving"] for c in checks]
    d["check_steps"] = [len(c["steps"]) - 1 for c in checks]
    d["check_cpu_s"] = [sum(s["cpu_s"] for s in c["steps"]) for c in checks]
    d["twin_tok_s_checked"] = [c["throughput_tok_s"] for c in checks]
    d["rel_tok_s_checked"] = d["twin_tok_s_checked"] / d["throughput_tok_s"]
    label_starves = d["ratio_at_label"] < 0.9  # an overloaded scenario: the rule keeps a starving first run
    summary = {
        "labels": str(labels_path), "profile": profile, "engine": engine, "kind": kind, "folds": folds, "params": params,
        "scenarios": int(len(d)),
        "smape_served": smape_pct(d["served"], d["served_adapters"]),
        "smape_slots": smape_pct(d["slots"], d["adapter_slots"]),
        "smape_served_checked": smape_pct(d["checked_served"], d["served_adapters"]),
        "smape_slots_checked": smape_pct(d["checked_slots"], d["adapter_slots"]),
        "served_above_label": int((d["served"] > d["served_adapters"]).sum()),
        "served_below_label": int((d["served"] < d["served_adapters"]).sum()),
        # as the evaluation's `starving`: the recommendation starves where the label (the twin's optimum) does not
        "starving_in_twin": int((d["starving_at_rec"] & ~label_starves).sum()),
        "starving_in_twin_after_check": int((d["starving_after_check"] & ~label_starves).sum()),
        "label_starves": int(label_starves.sum()),
        "changed_by_check": int((d["check_steps"] > 0).sum()),
        "checked_tok_s_vs_label_median": float(np.nanmedian(d["rel_tok_s_checked"])),
        "checked_tok_s_vs_label_min": float(np.nanmin(d["rel_tok_s_checked"])),
        "check_cpu_s_mean": float(d["check_cpu_s"].mean()), "wall_s": time.perf_counter() - t0,
    }
    return d, summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m twin.configurator.check_cv", description=__doc__.split("\n\n")[0])
    p.add_argument("labels", help="throughput90 labels (.csv from `twin configure dataset`)")
    p.add_argument("--profile", default=None, help="profile the labels came from (default: their profile column)")
    p.add_argument("--kind", default="rf", help="model kind (default rf)")
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--limit", type=int, default=None, help="check a random sample of this many scenarios")
    p.add_argument("--out", default=None, help="per-scenario CSV (the summary goes beside it as .json)")
    a = p.parse_args(argv)
    if not Path(a.labels).is_file():
        print(f"check_cv: {a.labels}: no such file; give the labels CSV of `twin configure dataset`", file=sys.stderr)
        return 2
    try:
        d, s = run(a.labels, a.profile, a.kind, a.folds, a.seed, a.jobs, a.limit)
    except ValueError as e:  # bad labels: named, before any run
        print(f"check_cv: {e}", file=sys.stderr)
        return 2
    if a.out:
        d[OUT_COLUMNS].to_csv(a.out, index=False, float_format="%.6g")
        Path(a.out).with_suffix(".json").write_text(json.dumps(s, indent=1))
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
