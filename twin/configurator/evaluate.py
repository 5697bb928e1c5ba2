"""``twin configure evaluate``: score configurators on real runs (any table in the validation format).

For every scenario of the selected real runs (``source == ml_test`` by default) the real optimum is
the ``throughput90`` label of the measured grid (it reproduces ``is_optimum_est``). Each predictor
recommends (served adapters, slots) and a throughput; scored per predictor:

* SMAPE in the published convention (``100 * mean(|p - y| / (|p| + |y|))``) of served adapters,
  slots (raw and snapped to the grid) and throughput: ``smape_throughput`` the predicted throughput vs the real
  optimum's (the published convention: the label's throughput is a target), ``smape_throughput_at_rec`` vs the real
  throughput at the recommended configuration (what an operator following it would see);
* regret = real throughput at the recommended (snapped) configuration / the real optimum's
  throughput, from the measured grid (a recommendation that does not start counts 0; a real run
  that failed for reasons unrelated to the configuration leaves it unknown);
* starving recommendations (``starving``): the real run at the recommended configuration serves
  less than 90 % of its offered tokens, or does not start. ``throughput90`` itself can pick a starving
  configuration (it keeps the highest throughput across slot values, and a slot value's walk keeps its first run
  when even that one is below the line): ``starving_beyond_label`` counts only the recommendations that starve where
  the real optimum does not.

Predictors: the trained model (random forest), its <= 30-rule tree, a constant predictor (the
training labels' median), the twin used directly as the optimiser (``twin configure search``), and
the published numbers (SMAPE only, as printed in the paper). With ``check``, each model again after the
twin's check of its recommendations (:mod:`twin.configurator.check`, rows ``<model> + twin check``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twin.configurator.labels import FEATURES, real_optima, run_ratio
from twin.configurator.features import LENGTH_FEATURES, length_columns
from twin.sweep.scenario import DEFAULT_LENGTHS, DEFAULT_POLICY
from twin.configurator.models import smape_pct, snap_config
from twin.sweep.grid import PUBLISHED_GRID, scenario_key
from twin.configurator.labels import from_real
from twin.sweep.scenario import START_FAILURE_STATUSES
from twin.configurator.models import predict
from traces.arguments import cell_error, parse_list
from traces.datadir import shown_path
from twin.configurator.search import search
from twin.configurator.check import check_recommendation, known_from_runs
from twin.configurator.models import load_model, resolve_engine
from twin.sweep.scenario import load_real
from twin.validation.profiles import cached_profile, check_profile_model, profile_of_runs

#: The published figures on the real test scenarios (SMAPE in their convention, %).
PUBLISHED = {
    "llama": {"published random forest": {"smape_served": 0.05, "smape_slots": 6.73},
              "published <= 30-rule tree": {"smape_served": 3.70, "smape_slots": 10.86},
              "published twin as optimiser": {"smape_served": 0.00, "smape_slots": 7.16}},
    "qwen": {"published random forest": {"smape_served": 1.01, "smape_slots": 7.15},
             "published <= 30-rule tree": {"smape_served": 1.01, "smape_slots": 12.41}},
}


def _model_family(profile: str | None, real: pd.DataFrame) -> str | None:
    text = (profile or "") + " " + " ".join(map(str, real.get("model", pd.Series(dtype=str)).dropna().unique()))
    text = text.lower()
    return "llama" if "llama" in text else "qwen" if "qwen" in text else None


#: the measured columns of a real-run table that the evaluation scores against (:func:`from_real`)
MEASURED_COLUMNS = ("offered_tok_s_est", "total_tok_s")


def check_measured(real: pd.DataFrame, path: str | os.PathLike) -> None:
    """The real-run table holds the measured throughput and offered load (:data:`MEASURED_COLUMNS`) the
    scenarios' real optima are found from, as numbers (on every run with status ok); otherwise an error
    naming the file, the column (and the row), before any model is loaded or run simulated."""
    missing = [c for c in MEASURED_COLUMNS if c not in real.columns]
    if missing:
        raise ValueError(f"{path}: the real-run table lacks the measured column(s) {', '.join(missing)} that "
                         f"`twin configure evaluate` finds each scenario's real optimum from; give the full "
                         f"validation table (validation/vllm085_h100_llama31_8b.csv has them)")
    ok = real["status"].astype(str).eq("ok").to_numpy()
    for col in MEASURED_COLUMNS:
        x = pd.to_numeric(real[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = (np.isnan(x) & real[col].notna().to_numpy()) | (ok & ~(np.isfinite(x) & (x >= 0)))
            if col == "offered_tok_s_est":
                wrong |= ok & (x == 0)
        if wrong.any():
            need = "> 0" if col == "offered_tok_s_est" else ">= 0"
            raise cell_error(path, real, int(np.argmax(wrong)), col,
                             f"is not a measurement (a run with status ok needs a finite number {need})",
                             "fix the row or leave it out of the table")


def real_grid(real: pd.DataFrame) -> dict[tuple[str, int, int], pd.Series]:

    df = from_real(real)
    return {(r["scenario"], int(r["served_adapters"]), int(r["adapter_slots"])): r for _, r in df.iterrows()}


def score_recommendation(grid: dict, scenario: str, served: int, slots: int,
                         opt_tp: float) -> tuple[float, bool | None, float]:
    """(regret, starving, real throughput) of a recommendation against the measured grid (NaN / None where the grid
    does not know it: not measured, or a run that failed for reasons unrelated to the configuration; a configuration
    that does not start scores regret 0, starving, throughput 0)."""

    r = grid.get((scenario, int(served), int(slots)))
    if r is None:
        return math.nan, None, math.nan
    if r["status"] == "ok":
        ratio = float(r["total_tok_s"]) / float(r["offered_tok_s"])
        return float(r["total_tok_s"]) / opt_tp, bool(ratio < 0.9), float(r["total_tok_s"])
    if r["status"] in START_FAILURE_STATUSES:
        return 0.0, True, 0.0
    return math.nan, None, math.nan


#: the columns of a predictor's per-scenario scores (:func:`score_predictor`)
SCORE_COLUMNS = ("predictor", "scenario", "real_served", "real_slots", "real_tok_s", "served_raw", "slots_raw", "served",
                 "slots", "pred_tok_s", "real_tok_s_at_rec", "regret", "starving", "starving_beyond_label")


def score_predictor(name: str, preds: pd.DataFrame, truth: pd.DataFrame, grid: dict,
                    served_grid: list[int], slot_grid: list[int]) -> tuple[dict[str, Any], pd.DataFrame]:
    """``preds``: one row per scenario with ``served_raw``, ``slots_raw``, ``throughput``, and optionally the
    configuration recommended in the end, ``served`` / ``slots`` (the twin's check: else the raw values snapped)."""
    m = truth.merge(preds, on="scenario", how="inner")
    rows = []
    for _, r in m.iterrows():
        if "served" in r.index and pd.notna(r["served"]):
            n, g = int(r["served"]), int(r["slots"])
        else:
            n, g = snap_config(r["served_raw"], r["slots_raw"], served_grid, slot_grid)
        reg, starv, tp = score_recommendation(grid, r["scenario"], n, g, float(r["throughput_tok_s"]))
        opt_starves = float(r["ratio_at_label"]) < 0.9
        # beyond the label: the recommendation starves (or does not start) where the real optimum does not
        beyond = None if starv is None else bool(starv and (not opt_starves or reg == 0.0))
        rows.append({"predictor": name, "scenario": r["scenario"], "real_served": int(r["served_adapters"]),
                     "real_slots": int(r["adapter_slots"]), "real_tok_s": float(r["throughput_tok_s"]),
                     "served_raw": float(r["served_raw"]), "slots_raw": float(r["slots_raw"]),
                     "served": n, "slots": g, "pred_tok_s": float(r["throughput"]), "real_tok_s_at_rec": tp,
                     "regret": reg, "starving": starv, "starving_beyond_label": beyond})
    d = pd.DataFrame(rows, columns=SCORE_COLUMNS)  # (no row: a predictor that named none of the scenarios)
    reg = d["regret"].dropna()
    out = {"predictor": name, "scenarios": int(len(d)),
           "smape_served": smape_pct(d["served"], d["real_served"]),
           "smape_slots": smape_pct(d["slots"], d["real_slots"]),
           "smape_served_raw": smape_pct(d["served_raw"], d["real_served"]),
           "smape_slots_raw": smape_pct(d["slots_raw"], d["real_slots"]),
           "smape_throughput": smape_pct(d["pred_tok_s"], d["real_tok_s"]),
           "smape_throughput_at_rec": smape_pct(d["pred_tok_s"], d["real_tok_s_at_rec"]),
           "regret_mean": float(reg.mean()) if len(reg) else math.nan,
           "regret_min": float(reg.min()) if len(reg) else math.nan,
           "regret_known": int(len(reg)),
           "starving": int(d["starving"].fillna(False).astype(bool).sum()),
           "starving_beyond_label": int(d["starving_beyond_label"].fillna(False).astype(bool).sum())}
    return out, d


def model_predictions(model: dict[str, Any], truth: pd.DataFrame) -> pd.DataFrame:
    """A model's recommendation per real scenario. The real runs are the published policy
    (``fcfs+client-cap``) and ShareGPT pool: a model with the length-mix features gets the label
    row's ``mean_input_tokens`` / ``mean_output_tokens`` where present, else the published pool
    means (222 / 197); a model that cannot recommend for that policy is an error naming it."""
    rows = []
    for _, r in truth.iterrows():
        x = {f: float(r[f]) for f in FEATURES}
        lengths = [float(r[f]) for f in LENGTH_FEATURES if f in r and pd.notna(r[f])]
        x.update(length_columns(model, lengths if len(lengths) == 2 else DEFAULT_LENGTHS))
        p = predict(model, x, policy=DEFAULT_POLICY)
        rows.append({"scenario": r["scenario"], "served_raw": p["served_adapters_raw"],
                     "slots_raw": p["adapter_slots_raw"], "throughput": p["throughput_tok_s"]})
    return pd.DataFrame(rows)


def constant_predictions(model: dict[str, Any], truth: pd.DataFrame) -> pd.DataFrame:
    c = model["constant"]
    return pd.DataFrame({"scenario": truth["scenario"], "served_raw": c["served_adapters"],
                         "slots_raw": c["adapter_slots"], "throughput": c["throughput_tok_s"]})


def search_predictions(truth: pd.DataFrame, profile: str | None, cache: str | os.PathLike | None, executor: str,
                       jobs: int, progress: bool | None, serving_us: float = 0.0,
                       rank_tile_cost: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The twin's own optimum of each ``truth`` scenario (``configure search``), named as in the real table (whose
    folder names need not be the twin's keys: the fit split's ``rank_16_rates_0.1_0.05_0.025``), and the walk's
    runs, keyed by the twin's scenario keys (:func:`twin.sweep.grid.scenario_key`) as the check's runs are."""

    pairs = [(parse_list(a, float, "rates"), parse_list(b, int, "ranks")) for a, b in zip(truth["rates"], truth["ranks"])]
    kw: dict[str, Any] = {"serving_us": float(serving_us)} if serving_us else {}
    if rank_tile_cost is not None:
        kw["rank_tile_cost"] = float(rank_tile_cost)
    labels, runs = search(pairs, profile, cache, executor, jobs, progress=progress, cache_flag="--search-cache", **kw)
    names = {_twin_key(a, b): sc for sc, a, b in zip(truth["scenario"], truth["rates"], truth["ranks"])}
    labels = labels.assign(scenario=labels["scenario"].map(lambda k: names.get(k, k)))  # the real table's names
    p = labels.rename(columns={"served_adapters": "served_raw", "adapter_slots": "slots_raw",
                               "throughput_tok_s": "throughput"})[["scenario", "served_raw", "slots_raw", "throughput"]]
    return p, runs


def _twin_key(rates: Any, ranks: Any) -> str:
    """The twin's scenario key of a real scenario's rates and ranks (the search walk's runs carry it)."""
    return scenario_key(parse_list(rates, float, "rates"), parse_list(ranks, int, "ranks"))


def crossings(real: pd.DataFrame, twin_runs: pd.DataFrame | None, source: str = "ml_test") -> pd.DataFrame:
    """At each real 90 % crossing of the measured grid (per scenario and slot value: the last run
    at or above the line and the first below it), the real throughput / offered and the twin's at
    the same configuration (from the search runs, where its walk reached it)."""

    df = from_real(real[real["source"] == source] if source else real)
    measured = {k: sorted(v) for k, v in df.groupby(["scenario", "adapter_slots"])["served_adapters"]}  # (failed too)
    df = df[df["status"] == "ok"]
    key = {sc: _twin_key(rates, ranks) for sc, rates, ranks in zip(df["scenario"], df["rates"], df["ranks"])}
    tw = {}
    if twin_runs is not None and len(twin_runs):
        for _, r in twin_runs[twin_runs["status"] == "ok"].iterrows():
            ratio, upper = run_ratio(r)
            tw[(r["scenario"], int(r["served_adapters"]), int(r["adapter_slots"]))] = -ratio if upper else ratio  # <0: a bound
    rows = []
    for (sc, g), sub in df.groupby(["scenario", "adapter_slots"]):
        sub = sub.sort_values("served_adapters")
        ratios = (sub["total_tok_s"] / sub["offered_tok_s"]).to_numpy()
        served = sub["served_adapters"].to_numpy()
        for i in range(len(sub) - 1):
            if ratios[i] >= 0.9 > ratios[i + 1]:
                for side, j in (("last_above", i), ("first_below", i + 1)):
                    t = tw.get((key[sc], int(served[j]), int(g)), math.nan)
                    grid_g = measured[(sc, g)]
                    rows.append({"scenario": sc, "adapter_slots": int(g), "side": side,
                                 "served_adapters": int(served[j]), "real_ratio": float(ratios[j]),
                                 # (False: the two runs are not neighbours on the grid: failed runs lie between)
                                 "adjacent": grid_g.index(int(served[i + 1])) - grid_g.index(int(served[i])) == 1,
                                 "twin_ratio": abs(t) if t == t else math.nan,
                                 "twin_ratio_is_upper_bound": bool(t == t and t < 0),
                                 "same_side": (bool((abs(t) >= 0.9) == (ratios[j] >= 0.9)) if t == t and t >= 0
                                               else (True if t == t and ratios[j] < 0.9 else None))})
                break
    return pd.DataFrame(rows)


def checked_predictions(preds: pd.DataFrame, truth: pd.DataFrame, profile: str | None, served_grid: list[int],
                        slot_grid: list[int], known: dict, serving_us: float = 0.0,
                        rank_tile_cost: float | None = None) -> tuple[pd.DataFrame, dict[str, float]]:
    """A model's recommendations after the twin's check (:mod:`twin.configurator.check`): each
    snapped recommendation is run in the twin and its served adapters stepped down while the twin
    reads it starving. ``known`` (runs by scenario and configuration) is shared across models and
    with the search's walk. The checked rows keep the model's raw values, carry the checked configuration as
    ``served`` / ``slots``, and the twin's throughput there where the check changed the configuration. ``serving_us`` /
    ``rank_tile_cost``: the twin's engine constants (those of the search whose runs ``known`` holds)."""
    m = truth[["scenario", "rates", "ranks"]].merge(preds, on="scenario", how="inner")
    rows, runs, cpu = [], 0, 0.0
    for _, r in m.iterrows():
        n, g = snap_config(r["served_raw"], r["slots_raw"], served_grid, slot_grid)
        c = check_recommendation(parse_list(r["rates"], float, "rates"), parse_list(r["ranks"], int, "ranks"), n, g,
                                 profile, served_grid=served_grid, slot_grid=slot_grid, known=known,
                                 serving_us=serving_us, rank_tile_cost=rank_tile_cost)
        runs += sum(1 for st in c["steps"] if st["simulated"])
        cpu += sum(st["cpu_s"] for st in c["steps"])
        tp = c["throughput_tok_s"] if c["changed"] and math.isfinite(c["throughput_tok_s"]) else float(r["throughput"])
        rows.append({"scenario": r["scenario"], "served_raw": float(r["served_raw"]), "slots_raw": float(r["slots_raw"]),
                     "served": int(c["served_adapters"]), "slots": int(c["adapter_slots"]), "throughput": tp,
                     "check_steps": len(c["steps"]) - 1})
    return pd.DataFrame(rows), {"check_runs_simulated": runs, "check_cpu_s": cpu}


def evaluate(real_csv: str | os.PathLike, profile: str | None = None, model_path: str | None = None,
             source: str = "ml_test", search_cache: str | os.PathLike | None = None, run_search: bool = True,
             executor: str = "local", jobs: int = 1, progress: bool | None = False, check: bool = False,
             serving_us: float | None = None, rank_tile_cost: "float | str | None" = None) -> dict[str, Any]:
    """Evaluate the configurators of ``profile`` (or ``model_path``) on the real runs of ``real_csv``.
    ``serving_us``: the twin-as-optimiser baseline's and the check's serving-path host time per running
    request and step (microseconds; :attr:`twin.sweep.grid.GridSpec.serving_us`); ``rank_tile_cost``: their
    LoRA shrink rank tiles beyond the first (:attr:`twin.sweep.grid.GridSpec.rank_tile_cost`; ``"profile"``:
    the profile's own). Each left at None is the engine the models were trained on
    (:func:`twin.configurator.models.resolve_engine`; the calibrated engine when no model is loaded).
    With ``check``, every model is also scored after the twin's check of its recommendations
    (rows named ``<model> + twin check``; :func:`checked_predictions`)."""

    real = load_real(real_csv)
    sel = real[real["source"] == source] if source else real
    if not len(sel):
        have = sorted(real["source"].astype(str).unique()) if "source" in real.columns else []
        raise ValueError(f"{real_csv}: no rows with source == {source!r} (its sources: {have}); pass --source NAME, "
                         f"or --source '' for every row")
    if profile is None and model_path:  # the profile the model was trained on, where this twin has it
        own = (load_model(model_path, "rf", as_path=True).get("provenance") or {}).get("profile")
        try:
            profile = own if own and cached_profile(own) else None
        except (KeyError, ValueError, OSError):  # (not a profile here: the runs' model's, as --help says)
            profile = None
    if profile is None:
        profile = profile_of_runs(sel, None, f"the {source or 'selected'} runs of {real_csv}")  # (its default variant)
    if not model_path:  # the shipped configurators of another model's profile would score nothing real
        check_profile_model(cached_profile(profile), sel)
    if not sel["status"].astype(str).eq("ok").any():
        statuses = sel["status"].astype(object).fillna("(empty)").astype(str)  # (an empty cell: NaN, not counted)
        counts = ", ".join(f"{k} {v}" for k, v in statuses.value_counts().items())
        raise ValueError(f"{real_csv}: none of the {len(sel)} rows{f' of source {source!r}' if source else ''} has "
                         f"status ok (statuses: {counts}); a scenario's real optimum needs its served runs")
    check_measured(real, real_csv)
    truth = real_optima(real, source)
    grid = real_grid(sel)
    served_grid = sorted(sel["served_adapters"].unique().astype(int).tolist()) or list(PUBLISHED_GRID)
    slot_grid = sorted(sel["adapter_slots"].unique().astype(int).tolist()) or list(PUBLISHED_GRID)
    table, per = [], []
    primary = None
    models = {}
    try:
        models["rf"] = (load_model(model_path, "rf", as_path=True) if model_path
                        else load_model(profile, "rf", as_path=False))
    except FileNotFoundError:
        if model_path:
            raise
    if not model_path:
        for kind in ("cart", "hstree", "figs", "rulefit"):  # the other shipped kinds, where shipped
            try:
                models[kind] = load_model(profile, kind, as_path=False)
            except FileNotFoundError:
                pass
    serving_us, rank_tile_cost = resolve_engine(list(models.values()), serving_us, rank_tile_cost)
    twin_runs = None
    if run_search:  # first: the check reuses the search walk's runs
        sp, twin_runs = search_predictions(truth, profile, search_cache, executor, jobs, progress, serving_us,
                                           rank_tile_cost)
    known = {}
    if check:
        known = known_from_runs(twin_runs)
    checked_summary = None
    for kind, m in models.items():
        label = {"rf": "random forest", "cart": "<= 30-rule tree",
                 "hstree": "HS-shrunk 30-rule tree", "figs": "FIGS (imodels, <= 30 splits)",
                 "rulefit": "RuleFit (imodels, per target)"}.get(
            m["kind"], m["kind"])
        preds = model_predictions(m, truth)
        s, d = score_predictor(label, preds, truth, grid, served_grid, slot_grid)
        s["model"] = shown_path(m["_path"]) if m.get("_path") else None
        table.append(s)
        per.append(d)
        if primary is None:
            primary = s
        if check:
            cp, cost = checked_predictions(preds, truth, profile, served_grid, slot_grid, known, serving_us,
                                           rank_tile_cost)
            s, d = score_predictor(f"{label} + twin check", cp, truth, grid, served_grid, slot_grid)
            s["model"] = shown_path(m["_path"]) if m.get("_path") else None
            s.update(cost)
            s["changed_by_check"] = int((cp["check_steps"] > 0).sum())
            table.append(s)
            per.append(d)
            if checked_summary is None:
                checked_summary = s
    if models:
        m = next(iter(models.values()))
        s, d = score_predictor("constant (training median)", constant_predictions(m, truth), truth, grid,
                               served_grid, slot_grid)
        table.append(s)
        per.append(d)
    if run_search:
        s, d = score_predictor("twin as optimiser (search)", sp, truth, grid, served_grid, slot_grid)
        table.append(s)
        per.append(d)
        if primary is None:
            primary = s
    fam = _model_family(profile, sel)
    for name, v in (PUBLISHED.get(fam, {}) if source == "ml_test" else {}).items():  # (their 9 test scenarios: beside
        table.append({"predictor": name, "scenarios": 9, **v})                   # another selection, not comparable)
    tab = pd.DataFrame(table)
    summary = {"scenarios": int(len(truth)), "profile": profile, "real": shown_path(real_csv), "source": source,
               "engine": {"serving_us": serving_us, "rank_tile_cost": rank_tile_cost},
               "model": (primary or {}).get("model") or (primary or {}).get("predictor"),
               **{k: (primary or {}).get(k) for k in ("smape_served", "smape_slots", "smape_throughput",
                                                       "smape_throughput_at_rec", "smape_served_raw",
                                                       "smape_slots_raw", "regret_mean", "regret_min", "regret_known",
                                                       "starving", "starving_beyond_label")},
               "table": tab.to_dict(orient="records")}
    if checked_summary is not None:  # the primary model after the twin's check
        summary["checked"] = {k: checked_summary.get(k) for k in (
            "predictor", "smape_served", "smape_slots", "smape_throughput", "regret_mean", "regret_min", "starving",
            "starving_beyond_label", "changed_by_check", "check_runs_simulated", "check_cpu_s")}
    cross = crossings(real, twin_runs, source) if twin_runs is not None else pd.DataFrame()
    if len(cross):
        both = cross.dropna(subset=["twin_ratio"])
        summary["crossings"] = {"points": int(len(cross)), "with_twin": int(len(both)),
                                "same_side": int(both["same_side"].fillna(False).astype(bool).sum())}
    return {"summary": summary, "table": tab, "per_scenario": pd.concat(per, ignore_index=True) if per else
            pd.DataFrame(), "truth": truth, "crossings": cross}


def format_table(tab: pd.DataFrame) -> str:
    cols = [("predictor", 44, "s"), ("smape_served", 9, ".2f"), ("smape_slots", 9, ".2f"),
            ("smape_served_raw", 9, ".2f"), ("smape_slots_raw", 9, ".2f"), ("smape_throughput", 9, ".2f"),
            ("smape_throughput_at_rec", 9, ".2f"), ("regret_mean", 8, ".3f"), ("regret_min", 8, ".3f"),
            ("starving", 6, ".0f"), ("starving_beyond_label", 7, ".0f")]
    hdr = ["predictor".ljust(44), "served", "slots", "served*", "slots*", "tok/s", "tok/s@", "regret", "min", "starve",
           "beyond"]
    lines = [" ".join(h.rjust(w) if i else h for i, (h, (_, w, _)) in enumerate(zip(hdr, cols)))]
    for _, r in tab.iterrows():
        cells = []
        for c, w, f in cols:
            v = r.get(c)
            if f == "s":
                cells.append(str(v)[:w].ljust(w))
            elif v is None or (isinstance(v, float) and not np.isfinite(v)):
                cells.append("-".rjust(w))
            else:
                cells.append(format(float(v), f).rjust(w))
        lines.append(" ".join(cells))
    lines.append("SMAPE % in the published convention 100*mean(|p-y|/(|p|+|y|)), snapped to the grid "
                 "(* = raw prediction); tok/s: predicted vs the real optimum's, tok/s@: vs the real run at the "
                 "recommendation; regret = real tok/s at the recommendation / real optimum; starve: recommendations "
                 "whose real run serves < 90 % of offered, beyond: of those, where the real optimum does not")
    return "\n".join(lines)


def make_figures(res: dict[str, Any], out_dir: str | os.PathLike) -> list[Path]:
    """``recommendations.png`` (per scenario: real optimum and each predictor's served / slots) and
    ``crossings.png`` (twin vs real throughput / offered at the real 90 % crossings)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    paths: list[Path] = []
    per = res["per_scenario"]
    if len(per):
        truth = res["truth"].sort_values("scenario")
        names = list(dict.fromkeys(per["predictor"]))
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        x = np.arange(len(truth))
        w = 0.8 / (len(names) + 1)
        for ax, col, real_col, lab in ((axes[0], "served", "served_adapters", "served adapters"),
                                       (axes[1], "slots", "adapter_slots", "adapter slots")):
            ax.bar(x, truth[real_col], w, label="real optimum", color="k")
            for i, n in enumerate(names):
                d = per[per["predictor"] == n].set_index("scenario").reindex(truth["scenario"])
                ax.bar(x + (i + 1) * w, d[col], w, label=n)
            ax.set_xticks(x + 0.4)
            ax.set_xticklabels([s.replace("_size_", "\n") for s in truth["scenario"]], rotation=60, fontsize=6)
            ax.set_yscale("log", base=2)
            ax.set_title(lab)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        p = out / "recommendations.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    cr = res.get("crossings")
    if cr is not None and len(cr):
        c = cr.dropna(subset=["twin_ratio"])
        fig, ax = plt.subplots(figsize=(5.5, 5))
        for side, mk in (("last_above", "o"), ("first_below", "s")):
            for ub, fc in ((False, None), (True, "none")):
                s = c[(c["side"] == side) & (c["twin_ratio_is_upper_bound"] == ub)]
                if len(s):
                    ax.scatter(s["real_ratio"], s["twin_ratio"], marker=mk, s=22,
                               facecolors=fc if fc else None, edgecolors="C0" if side == "last_above" else "C3",
                               color="C0" if side == "last_above" else "C3",
                               label=f"{side}{' (twin: upper bound, stopped early)' if ub else ''}")
        ax.axhline(0.9, color="grey", lw=0.8)
        ax.axvline(0.9, color="grey", lw=0.8)
        ax.plot([0, 1.05], [0, 1.05], "k:", lw=0.8)
        ax.set_xlim(0.5, 1.02)
        ax.set_ylim(0.5, 1.02)
        ax.set_xlabel("real throughput / offered")
        ax.set_ylabel("twin throughput / offered")
        ax.set_title("at the real 90 % crossings (ml_test grid)", fontsize=9)
        ax.legend(fontsize=6)
        fig.tight_layout()
        p = out / "crossings.png"
        fig.savefig(p, dpi=90)
        plt.close(fig)
        paths.append(p)
    return paths
