"""Scoring the re-created runs against the real ones.

SMAPE as the published twin computes it, ``100 * mean(|twin - real| / (|twin| + |real|))``
(:func:`smape`); the standard SMAPE is twice that. The published twin's predictions are scored
the same way on the same runs. Subsets (:data:`SUBSETS`): ``kept_up`` (``requests_sent >= 95 %``
of the nominal count), ``overloaded`` (below), ``sent_unknown`` (runs without
``requests_sent``); ``peer_runs`` are the runs the published twin has a prediction for;
``dt_modelling`` the 1-hour runs it replayed one by one.

The real runs are split (:data:`SPLIT_OF_SOURCE`, per-run column ``split``): ``fit`` = the
``dt_modelling`` runs, which may identify a handful of mechanism constants (each with a physical
meaning and unit, documented where it is used); ``test`` = the ``ml_test`` runs, never used for
fitting or for choosing between alternatives. Both are subsets (``fit``, ``test``) and the
summary's ``fit_test`` block gives their headline SMAPEs side by side.

Runs whose server failed to start for lack of memory
(:data:`twin.validation.specs.START_FAILURE_STATUSES`) are scored as a classification
(:func:`startup_classification`); runs that failed for reasons unrelated to the configuration
(port in use, Slurm cancellation, illegal memory access, ...) are listed but not scored.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from twin.validation.diagnostics import diagnostics
from twin.validation.knee import crossings_from_per_run
from twin.validation.knee import summary as crossings_summary
from twin.validation.metrics import METRICS
from twin.validation.specs import START_FAILURE_STATUSES, nominal_requests

KEPT_UP_FRACTION = 0.95

SUBSETS = ("all", "fit", "test", "kept_up", "overloaded", "sent_unknown", "peer_runs", "dt_modelling")
#: the train/test split of the real runs by their ``source``
SPLIT_OF_SOURCE = {"dt_modelling": "fit", "ml_test": "test"}
#: the figures the ``fit_test`` block of the summary reports per split
FIT_TEST_METRICS = ("throughput", "itl", "ttft_mean", "ttft_p99", "ttft_incl_unfinished")
SUBSET_HELP = {
    "all": "all successful runs",
    "fit": "fit split: dt_modelling runs (may fit mechanism constants)",
    "test": "test split: ml_test runs (never fitted)",
    "kept_up": "client kept up (requests_sent >= 95 % of nominal)",
    "overloaded": "client fell behind (requests_sent < 95 % of nominal)",
    "sent_unknown": "requests_sent not recorded (ml_test)",
    "peer_runs": "runs the published twin predicted",
    "dt_modelling": "the published twin's 1-hour replays (its 4.2/9.7/17.6 % set)",
}


# --------------------------------------------------------------------------- SMAPE
def smape_terms(twin: Iterable[float], real: Iterable[float]) -> np.ndarray:
    """Per-run ``|twin - real| / (|twin| + |real|)`` (0 when both are 0, NaN when either is missing)."""
    t = np.asarray(list(twin) if not isinstance(twin, (np.ndarray, pd.Series)) else twin, float)
    r = np.asarray(list(real) if not isinstance(real, (np.ndarray, pd.Series)) else real, float)
    den = np.abs(t) + np.abs(r)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, np.abs(t - r) / np.where(den > 0, den, 1.0), 0.0)
    out[~(np.isfinite(t) & np.isfinite(r))] = np.nan
    return out


def smape(twin: Iterable[float], real: Iterable[float]) -> float:
    """SMAPE as the published twin computes it: ``100 * mean(|t - r| / (|t| + |r|))`` over runs
    where both values exist (the standard SMAPE is twice this). NaN when there is no pair."""
    terms = smape_terms(twin, real)
    terms = terms[np.isfinite(terms)]
    return float(100.0 * terms.mean()) if terms.size else float("nan")


# --------------------------------------------------------------------------- per run
def score(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: ``real_<metric>``, ``twin_<metric>``, their SMAPE terms ``err_<metric>`` (and
    ``peer_err_<metric>``), the nominal request count, the client class and ``scored``."""
    runs = runs.copy()
    ok = runs["status"] == "ok"
    twin_ok = runs.get("twin_status", pd.Series(index=runs.index, dtype=object)) == "ok"
    for m in METRICS:
        t = runs.get(f"twin_{m.name}", pd.Series(np.nan, index=runs.index)).astype(float)
        r = runs[m.real].astype(float) if m.real in runs else pd.Series(np.nan, index=runs.index)
        runs[f"real_{m.name}"] = r
        runs[f"twin_{m.name}"] = t
        runs[f"err_{m.name}"] = np.where(ok & twin_ok, smape_terms(t, r), np.nan)
        if m.peer:
            pcol = f"peer_{m.name}"
            runs[f"peer_err_{m.name}"] = np.where(ok, smape_terms(runs[pcol].astype(float), r), np.nan)
    runs["nominal_requests"] = [nominal_requests(row) for _, row in runs.iterrows()]
    sent = runs["requests_sent"].astype(float) if "requests_sent" in runs else pd.Series(np.nan, index=runs.index)
    runs["sent_fraction"] = sent / runs["nominal_requests"]
    runs["client"] = np.where(sent.isna(), "sent_unknown",
                              np.where(runs["sent_fraction"] >= KEPT_UP_FRACTION, "kept_up", "overloaded"))
    src = runs["source"] if "source" in runs else pd.Series("", index=runs.index)
    runs["split"] = src.map(SPLIT_OF_SOURCE).fillna("")
    runs["real_start_failure"] = runs["status"].isin(START_FAILURE_STATUSES)
    runs["scored"] = ok & twin_ok
    return runs


# --------------------------------------------------------------------------- subsets
def subset_mask(runs: pd.DataFrame, name: str) -> pd.Series:
    ok = runs["status"] == "ok"
    if name == "all":
        return ok
    if name in ("fit", "test"):
        return ok & (runs["split"] == name)
    if name in ("kept_up", "overloaded", "sent_unknown"):
        return ok & (runs["client"] == name)
    if name == "peer_runs":
        return ok & runs["has_peer"].astype(bool)
    if name == "dt_modelling":
        return ok & (runs["source"] == "dt_modelling") & runs["has_peer"].astype(bool)
    raise KeyError(f"unknown subset {name!r}; choose from {', '.join(SUBSETS)}")


def _pct(e: pd.Series, factor: float = 1.0, fn: Callable = np.mean) -> float | None:
    e = np.asarray(e, float)
    e = e[np.isfinite(e)]
    return float(100.0 * factor * fn(e)) if e.size else None


def subset_table(runs: pd.DataFrame, name: str) -> dict[str, Any]:
    """SMAPE (published-twin convention) of the twin and of the published twin on one subset.

    ``ours`` is over every scored run of the subset; ``ours_on_peer_runs`` and ``peer`` are
    over the runs both twins predicted (side by side on the same runs)."""
    mask = subset_mask(runs, name)
    sub = runs[mask]
    scored = sub[sub["scored"]]
    both = scored[scored["has_peer"].astype(bool)]
    d: dict[str, Any] = {"runs": int(len(sub)), "scored": int(len(scored)), "with_peer": int(len(both)),
                         "description": SUBSET_HELP[name], "metrics": {}}
    for m in METRICS:
        e = scored[f"err_{m.name}"].dropna()
        row: dict[str, Any] = {"n": int(len(e)), "smape": _pct(e), "smape_standard": _pct(e, 2.0),
                               "median_err": _pct(e, 2.0, np.median)}
        if m.peer:
            pe = both[f"peer_err_{m.name}"]
            oe = both[f"err_{m.name}"]
            keep = pe.notna() & oe.notna()
            row["n_peer"] = int(keep.sum())
            row["smape_on_peer_runs"] = _pct(oe[keep])
            row["peer_smape"] = _pct(pe[keep])
            row["peer_smape_standard"] = _pct(pe[keep], 2.0)
        d["metrics"][m.name] = row
    return d


# --------------------------------------------------------------------------- start-up failures
def startup_classification(runs: pd.DataFrame) -> dict[str, Any]:
    """How many memory start-up failures the twin's start-up check predicts, and false alarms."""
    fail = runs[runs["real_start_failure"]]
    ok = runs[runs["status"] == "ok"]
    pred_fail = fail["twin_status"] == "start_failure"
    false_alarm = ok["twin_status"] == "start_failure"
    by_status = {}
    for st, g in fail.groupby("status"):
        by_status[st] = {"runs": int(len(g)), "predicted": int((g["twin_status"] == "start_failure").sum())}
    n = int(len(fail))
    return {"real_failures": n, "predicted": int(pred_fail.sum()),
            "fraction": (float(pred_fail.sum()) / n) if n else None,
            "ok_runs": int(len(ok)), "false_alarms": int(false_alarm.sum()),
            "by_status": by_status,
            "not_scored": {k: int(v) for k, v in runs.loc[~runs["real_start_failure"] & (runs["status"] != "ok"),
                                                           "status"].value_counts().items()}}


# --------------------------------------------------------------------------- the summary
def split_crossings(runs: pd.DataFrame, split: str) -> dict[str, Any]:
    """The twin at the real 90 % crossings of one split (:mod:`twin.validation.knee`: the crossings, how many
    are within +-2 points of throughput / offered, the median and largest miss); ``{"crossings": 0}`` when the
    split has none or the table lacks the columns (``offered_tok_s_est``)."""
    if "split" not in runs.columns or "offered_tok_s_est" not in runs.columns or "twin_throughput" not in runs.columns:
        return {"crossings": 0}
    return crossings_summary(crossings_from_per_run(runs[runs["split"] == split], source=None))


def summarize(runs: pd.DataFrame, profile_name: str, real_csv: str, peer_csv: str | None,
              serving_s_per_running: float = 0.0, rank_tile_cost: float | None = None) -> dict[str, Any]:
    """The validation's summary (``summary.json``): headline SMAPEs, every subset, the start-up
    classification and the diagnostics (:func:`twin.validation.diagnostics.diagnostics`)."""
    subsets = {name: subset_table(runs, name) for name in SUBSETS}
    a = subsets["all"]["metrics"]
    dt = subsets["dt_modelling"]["metrics"]
    su = startup_classification(runs)
    errors = runs["twin_status"].eq("error").sum() if "twin_status" in runs else 0
    s: dict[str, Any] = {
        "runs": int(subsets["all"]["scored"]),
        "runs_in_table": int(len(runs)),
        "runs_ok": int(subsets["all"]["runs"]),
        "profile": profile_name,
        "real_csv": real_csv,
        "peer_csv": peer_csv,
        "smape_convention": "100*mean(|twin-real|/(|twin|+|real|)) (published twin); standard SMAPE = 2x",
        "smape_throughput": a["throughput"]["smape"],
        "smape_request_throughput": a["request_throughput"]["smape"],
        "smape_itl": a["itl"]["smape"],
        "smape_tpot": a["tpot"]["smape"],
        "smape_ttft_mean": a["ttft_mean"]["smape"],
        "smape_ttft_median": a["ttft_median"]["smape"],
        "smape_ttft_p99": a["ttft_p99"]["smape"],
        "smape_ttft_incl_unfinished": a["ttft_incl_unfinished"]["smape"],
        "peer_smape_throughput": a["throughput"].get("peer_smape"),
        "peer_smape_itl": a["itl"].get("peer_smape"),
        "peer_smape_ttft_incl_unfinished": a["ttft_incl_unfinished"].get("peer_smape"),
        "ours_on_peer_runs": {k: a[k].get("smape_on_peer_runs") for k in ("throughput", "request_throughput", "itl",
                                                                          "ttft_incl_unfinished")},
        "fit_test": {name: {"runs": subsets[name]["scored"],
                            **{k: subsets[name]["metrics"][k]["smape"] for k in FIT_TEST_METRICS},
                            "crossings_90": split_crossings(runs, name)}
                     for name in ("fit", "test")},
        "dt_modelling": {k: {"ours": dt[k].get("smape_on_peer_runs"), "peer": dt[k].get("peer_smape"),
                             "n": dt[k].get("n_peer")} for k in ("throughput", "itl", "ttft_incl_unfinished")},
        "start_failures_predicted": su["fraction"],
        "start_failures": su,
        "twin_errors": int(errors),
        "diagnostics": diagnostics(runs, profile_name, serving_s_per_running, rank_tile_cost),
        "subsets": subsets,
    }
    return s
