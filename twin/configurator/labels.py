"""Optimum labels from a table of runs (a sweep's results or a real-run table).

Rules (:data:`RULES`):

* ``throughput90`` -- the published rule, exactly: per scenario and slot value, walk served
  adapters upwards while the run's total token throughput is at least ``ratio`` (0.9) x the
  offered tokens and keep the last such run; if even the first run fails, keep it. Across slot
  values, keep the candidate with the highest throughput.
* ``robust`` -- among the same per-slot candidates, the fewest slots whose throughput is within
  ``tolerance`` (1 %) of the best candidate's.
* ``slo`` -- the run with the highest throughput among those with SLO attainment (TTFT / TBT
  SLOs of the sweep) at least ``slo_share`` and not starving: its throughput at least ``ratio`` x the
  offered tokens (:func:`passes_line`, the line of ``throughput90``, so ``--ratio`` sets it), computed
  from the run's own figures; a run without a throughput or its offered tokens is left out. (The
  sweep's ``starving`` flag, at the line its walk ran, is not read.) A sweep run without ``[slo]``
  records no attainment; its runs can still be labelled with percentile SLOs on the stored
  summaries (``ttft_p99_s`` / ``itl_p99_s``: the run's P99 TTFT and P99 inter-token latency of
  finished requests at most these; starving runs, whose unfinished requests those percentiles do
  not see, are left out as above). Chameleon's SLOs (MICRO'25 §6.1: 5 s TTFT, 150 ms TBT) are
  the documented example.

Runs that did not produce a result (start-up failures, errors, real runs that failed for any
reason) are skipped in the walk, as the published labels do. Every label carries its margin to
the 90 % line: ``ratio_at_label - ratio`` (how far the chosen run is above the line) and the
ratio of the next run of its walk (``next_ratio``; for a run that stopped early, its upper bound).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from traces.arguments import parse_list

RULES = ("throughput90", "robust", "slo")
FEATURES = ("rate_max", "rate_min", "rate_mean", "rate_std", "rank_max", "rank_min", "rank_mean", "rank_std")
TARGETS = ("served_adapters", "adapter_slots", "throughput_tok_s")
#: the engine constants a sweep's runs carry beside their profile (:attr:`twin.sweep.grid.GridSpec.serving_us`,
#: :attr:`~twin.sweep.grid.GridSpec.rank_tile_cost`); runs and labels without them are of the calibrated engine alone
ENGINE_COLUMNS = ("serving_us", "rank_tile_cost")
#: the calibrated engine: no serving-path host time, the profile's own rank tiles
CALIBRATED_ENGINE: dict[str, Any] = {"serving_us": 0.0, "rank_tile_cost": None}
#: a sweep's arrival process per scenario (``twin sweep``'s ``arrival`` axis): its name and the per-adapter
#: inter-arrival coefficient of variation (1 for Poisson), a numeric feature ``train --features`` may name
ARRIVAL_COLUMNS = ("arrival", "arrival_cv")
GROUP_CANDIDATES = ("scenario", "policy", "seed", "max_lora_rank", "profile", "mean_input_tokens",
                    "mean_output_tokens", *ARRIVAL_COLUMNS, *ENGINE_COLUMNS)


def features_of(rates, ranks) -> dict[str, float]:
    """The published 8 features: max, min, mean, std (population) of the rate and rank triples."""
    r = np.asarray([float(x) for x in rates], float)
    k = np.asarray([float(x) for x in ranks], float)
    return {"rate_max": float(r.max()), "rate_min": float(r.min()), "rate_mean": float(r.mean()),
            "rate_std": float(r.std()), "rank_max": float(k.max()), "rank_min": float(k.min()),
            "rank_mean": float(k.mean()), "rank_std": float(k.std())}


def from_real(real: pd.DataFrame) -> pd.DataFrame:
    """A real-run table (validation format) in the sweep's column names. The offered tokens are
    ``offered_tok_s_est`` (what ``is_optimum_est`` uses); runs without a result get status != ok."""

    df = real.copy()
    df["offered_tok_s"] = df["offered_tok_s_est"].astype(float)
    df["throughput_ratio"] = df["total_tok_s"].astype(float) / df["offered_tok_s"]
    df["early_stop"] = False
    feats = [features_of(parse_list(a, float, "rates"), parse_list(b, int, "ranks"))
             for a, b in zip(df["rates"].astype(str), df["ranks"].astype(str))]
    for f in FEATURES:
        df[f] = [x[f] for x in feats]
    return df


def engines_of(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The distinct engines (``{"serving_us": us, "rank_tile_cost": cost or None}``) of a table of runs
    or labels, in sorted order; a table without :data:`ENGINE_COLUMNS` (or with blanks there) is of the
    calibrated engine (:data:`CALIBRATED_ENGINE`)."""
    if not len(df):
        return []
    cols = {}
    for c in ENGINE_COLUMNS:
        v = pd.to_numeric(df[c], errors="coerce") if c in df else pd.Series(np.nan, index=df.index)
        cols[c] = [float(x) if math.isfinite(x) else None for x in v.astype(float)]
    pairs = set(zip(*(cols[c] for c in ENGINE_COLUMNS)))
    out = [{"serving_us": us or 0.0, "rank_tile_cost": cost} for us, cost in pairs]
    uniq = {(e["serving_us"], e["rank_tile_cost"]): e for e in out}
    return [uniq[k] for k in sorted(uniq, key=lambda k: (k[0], -1.0 if k[1] is None else k[1]))]


def describe_engine(engine: dict[str, Any]) -> str:
    """``serving_us 18, rank_tile_cost 0.7091`` (or ``the calibrated engine ...`` when it is that one)."""
    us, cost = float(engine.get("serving_us") or 0.0), engine.get("rank_tile_cost")
    tiles = "the profile's" if cost is None else f"{float(cost):g}"
    text = f"serving_us {us:g}, rank_tile_cost {tiles}"
    return f"the calibrated engine ({text})" if us == 0.0 and cost is None else text


def _group_keys(df: pd.DataFrame) -> list[str]:
    return [c for c in GROUP_CANDIDATES if c in df.columns and df[c].notna().all()]


def passes_line(runs: pd.DataFrame, ratio: float = 0.9, strict: bool = False) -> np.ndarray:
    """Per run: its total token throughput is at least ``ratio`` x the offered tokens (above it with
    ``strict``); a run without both figures (a run stopped early, decided starving, has no
    throughput) does not pass."""
    if "total_tok_s" not in runs or "offered_tok_s" not in runs:
        return np.zeros(len(runs), bool)
    tp = pd.to_numeric(runs["total_tok_s"], errors="coerce").to_numpy(float)
    off = pd.to_numeric(runs["offered_tok_s"], errors="coerce").to_numpy(float)
    with np.errstate(invalid="ignore"):
        line = ratio * off
        above = tp > line if strict else tp >= line
    return np.isfinite(tp) & np.isfinite(off) & above


def slot_candidates(g: pd.DataFrame, ratio: float = 0.9, strict: bool = False) -> pd.DataFrame:
    """The per-slot candidates of one scenario (the walk of the published rule), with margins.

    Per slot value (ascending), the runs that produced a result in order of served adapters: the
    candidate is the last run before the first one below the line (:func:`passes_line`), the first
    run when even it fails, the last run when none fails; ``next_served`` / ``next_ratio`` are those
    of the failing run that ended the walk (NaN when the first run failed or none did). One
    vectorised pass over the scenario's runs (a test compares it with the walk run by run)."""
    ok = g[(g["status"] == "ok") & g["adapter_slots"].notna()]
    if not len(ok):
        return pd.DataFrame([])
    slots = ok["adapter_slots"].to_numpy(float)
    order = np.lexsort((ok["served_adapters"].to_numpy(float), slots))  # by slots, then served (stable)
    passed = passes_line(ok, ratio, strict)[order]
    s_sorted = slots[order]
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)]
    cand, nxt = [], []
    for a, b in zip(starts.tolist(), ends.tolist()):
        fails = np.flatnonzero(~passed[a:b])
        if not len(fails):
            cand.append(b - 1), nxt.append(-1)  # every run passes: the last one
        elif fails[0] == 0:
            cand.append(a), nxt.append(-1)  # the first run fails: its own ratio is the margin
        else:
            cand.append(a + int(fails[0]) - 1), nxt.append(a + int(fails[0]))
    out = ok.iloc[order[cand]].copy()
    need = [c for c in ("total_tok_s", "offered_tok_s", "early_stop", "tok_s_upper", "served_adapters") if c in ok]
    recs = ok[need].iloc[order].to_dict("records")  # (run_ratio's fields of the walk's runs)
    out["ratio_at_label"] = [run_ratio(recs[i])[0] for i in cand]
    out["next_served"] = [float(recs[j]["served_adapters"]) if j >= 0 else math.nan for j in nxt]
    out["next_ratio"] = [run_ratio(recs[j])[0] if j >= 0 else math.nan for j in nxt]
    return out


def _ratio(row: pd.Series | None) -> float:
    return math.nan if row is None else run_ratio(row)[0]


def run_ratio(row: Any) -> tuple[float, bool]:
    """(throughput / offered tokens, whether it is an upper bound) of a sweep run row (a Series or a
    dict): a run stopped early by the throughput bound gives that bound."""
    tp, off = row.get("total_tok_s"), row.get("offered_tok_s")
    if (tp is None or not np.isfinite(tp)) and row.get("early_stop"):
        ub = row.get("tok_s_upper")
        return (float(ub / off) if ub is not None and np.isfinite(ub) and off else math.nan), True
    return (float(tp / off) if tp is not None and off else math.nan), False


def label_scenarios(df: pd.DataFrame, rule: str = "throughput90", ratio: float = 0.9, tolerance: float = 0.01,
                    slo_share: float = 0.9, strict: bool = False, ttft_p99_s: float | None = None,
                    itl_p99_s: float | None = None) -> pd.DataFrame:
    """One label row per scenario (and policy / seed / max rank / profile when present):
    the features, ``served_adapters``, ``adapter_slots``, ``throughput_tok_s``, ``ratio_at_label``,
    ``margin`` (to the 90 % line), ``next_ratio``, ``rule``."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose from {', '.join(RULES)}")
    if rule == "slo":
        df = _slo_pass(df, slo_share, ttft_p99_s, itl_p99_s)
    elif ttft_p99_s is not None or itl_p99_s is not None:
        raise ValueError(f"--ttft-p99-s / --itl-p99-s apply to the slo rule, not {rule!r}")
    keys = _group_keys(df)
    rows = []
    for key, g in df.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        lab = _label_one(g, rule, ratio, tolerance, slo_share, strict)
        if lab is None:
            continue
        d = dict(zip(keys, key))
        first = g.iloc[0]
        for c in FEATURES + ("rates", "ranks", "mean_input_tokens", "mean_output_tokens"):
            if c in g:
                d[c] = first[c]
        d.update(lab)
        d["rule"] = rule
        rows.append(d)
    return pd.DataFrame(rows)


def _slo_pass(df: pd.DataFrame, slo_share: float, ttft_p99_s: float | None,
              itl_p99_s: float | None) -> pd.DataFrame:
    """``df`` with a boolean ``slo_ok`` column: the run meets the SLO (attainment of the sweep's
    ``[slo]`` at least ``slo_share``, or the percentile SLOs when given). Errors name the fix."""
    out = df.copy()
    if ttft_p99_s is None and itl_p99_s is None:
        att = pd.to_numeric(out["slo_attainment"], errors="coerce") if "slo_attainment" in out else None
        if att is None or not att.notna().any():
            raise ValueError("the slo rule needs SLO attainment, and these runs record none (their sweep had no "
                             "[slo] ttft_s / tbt_s); give percentile SLOs instead, e.g. --ttft-p99-s 5 "
                             "--itl-p99-s 0.15, or sweep with an [slo] table")
        out["slo_ok"] = att >= slo_share
        return out
    ok = pd.Series(True, index=out.index)
    for lim, col, flag in ((ttft_p99_s, "ttft_ms_p99", "--ttft-p99-s"), (itl_p99_s, "itl_ms_p99", "--itl-p99-s")):
        if lim is None:
            continue
        if not (isinstance(lim, (int, float)) and math.isfinite(lim) and lim > 0):
            raise ValueError(f"{flag} must be a positive number of seconds, got {lim!r}")
        if col not in out:
            raise ValueError(f"{flag} needs the runs' {col} column (sweep results of `twin sweep`)")
        ok &= pd.to_numeric(out[col], errors="coerce") <= 1000.0 * float(lim)
    out["slo_ok"] = ok
    return out


def slo_miss(runs: pd.DataFrame, slo_share: float = 0.9, ttft_p99_s: float | None = None,
             itl_p99_s: float | None = None, ratio: float = 0.9) -> str:
    """Why the ``slo`` rule labelled no scenario of ``runs`` (:func:`label_scenarios` gave no row), with the fix
    that applies: no run with a throughput meets the SLO (loosen the percentile SLOs given, or lower the share
    of the sweep's ``[slo]`` attainment), or those that meet it are all starving (the rule labels only runs that
    keep up: a run whose throughput is below the line loses its unfinished requests from the percentiles)."""
    pct = ttft_p99_s is not None or itl_p99_s is not None
    loosen = ("loosen --ttft-p99-s / --itl-p99-s" if pct
              else "lower --slo-share, or give the sweep's [slo] a looser target")
    ran = runs[(runs["status"] == "ok") & pd.to_numeric(runs["total_tok_s"], errors="coerce").notna()] \
        if "total_tok_s" in runs and "status" in runs else runs.iloc[:0]
    if not len(ran):
        return "no run has a throughput (every run stopped early, failed to start or ended in an error)"
    met = ran[_slo_pass(ran, slo_share, ttft_p99_s, itl_p99_s)["slo_ok"].astype(bool).to_numpy()]
    if not len(met):
        return f"none of the {len(ran)} runs with a throughput meets the SLO; {loosen}"
    share_met = (pd.to_numeric(met["total_tok_s"], errors="coerce")
                 / pd.to_numeric(met["offered_tok_s"], errors="coerce"))
    best = float(share_met.max()) if share_met.notna().any() else math.nan
    most = f"at most {best:.3f}" if math.isfinite(best) else "below the line"
    share = f"all {len(met)}" if len(met) == len(ran) else f"{len(met)} of the {len(ran)}"
    return (f"{share} runs meet the SLO but are starving (throughput {most} of the offered tokens, below the "
            f"starvation line, --ratio {ratio:g}); the slo rule labels only runs that keep up: sweep configurations "
            f"that keep up (fewer served adapters, lower rates), or a longer window_s if the sweep's is short (the "
            f"requests still in flight at its end are not counted), or label with --rule throughput90")


def _label_one(g: pd.DataFrame, rule: str, ratio: float, tolerance: float, slo_share: float,
               strict: bool) -> dict[str, Any] | None:
    if rule == "slo":
        ok = g[(g["status"] == "ok") & g["total_tok_s"].notna() & g["slo_ok"].astype(bool)]
        # not starving at --ratio's line, from the run's own figures (the sweep's `starving` flag is at its walk's
        # line, and was read as missing = keeps up, NaN = starving); a run without its offered tokens is left out
        ok = ok[passes_line(ok, ratio, strict)]
        if not len(ok):
            return None
        best = ok.loc[ok["total_tok_s"].idxmax()]
        return _lab(best, ratio, n_candidates=len(ok))
    cands = slot_candidates(g, ratio, strict)
    if not len(cands):
        return None
    tp = cands["total_tok_s"].astype(float)
    if not tp.notna().any():  # (every candidate stopped early or lost its throughput: pandas' "all NA" error)
        return None
    if rule == "throughput90":
        best = cands.loc[tp.idxmax()]
    else:  # robust
        top = float(tp.max())
        close = cands[tp >= (1.0 - tolerance) * top]
        best = close.sort_values(["adapter_slots", "total_tok_s"], ascending=[True, False]).iloc[0]
    return _lab(best, ratio, n_candidates=len(cands))


def _lab(best: pd.Series, ratio: float, n_candidates: int) -> dict[str, Any]:
    r = best.get("ratio_at_label", _ratio(best))
    return {"served_adapters": int(best["served_adapters"]), "adapter_slots": int(best["adapter_slots"]),
            "throughput_tok_s": float(best["total_tok_s"]), "offered_tok_s": float(best["offered_tok_s"]),
            "ratio_at_label": float(r), "margin": float(r - ratio),
            "next_served": float(best.get("next_served", math.nan)),
            "next_ratio": float(best.get("next_ratio", math.nan)),
            "slo_attainment": float(best.get("slo_attainment", math.nan)) if "slo_attainment" in best else math.nan,
            "n_candidates": int(n_candidates)}


def real_optima(real: pd.DataFrame, source: str = "ml_test", rule: str = "throughput90", **kw) -> pd.DataFrame:
    """Labels of a real-run table's scenarios (``source`` rows) under ``rule``."""
    df = from_real(real[real["source"] == source]) if source else from_real(real)
    return label_scenarios(df.drop(columns=[c for c in ("seed", "policy", "profile") if c in df]), rule, **kw)
