"""Fits of the five profile components from observation tables (see :mod:`calibration.fitting.tables`).

Each ``fit_*`` function tries the candidate forms of its kind, fits each with
``scipy.optimize.curve_fit`` (:func:`calibration.fitting.core.fit_params`), scores it on
held-out data (grouped k-fold by run, or leave-one-out for small tables), and returns a
profile component entry::

    {"form", "params" (SI units), "stderr", "units", "equation", "fit": {...}, "selection": {...},
     "candidates": {form: {"params", "heldout"}}, "method": "..."}

Working units inside the fits are milliseconds (times) and GiB (memory); the profile stores
seconds and bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting.core import FitError, ParamSpec, choose, cross_val_predict, fit_params, quality
from twin.perf.forms import FORMS, PerfModel
from twin.model_spec import ModelSpec

MS = 1e-3
GIB = float(2 ** 30)


@dataclass
class Candidate:
    """A form to try: fitted parameters (ms-based working units), fixed ones (SI units)."""

    form: str
    kind: str
    specs: list[ParamSpec]
    fixed: dict[str, float]
    #: factor from working units to the profile's SI units, per fitted parameter
    to_si: dict[str, float]

    def model(self, theta: dict[str, float]) -> PerfModel:
        params = {k: v * self.to_si.get(k, 1.0) for k, v in theta.items()}
        params.update(self.fixed)
        return FORMS[(self.kind, self.form)](params=params)

    def si(self, d: dict[str, float]) -> dict[str, float]:
        return {k: v * self.to_si.get(k, 1.0) for k, v in d.items()}


def _entry(cand: Candidate, fitted, fitq: dict, held: dict, extra: dict | None = None) -> dict[str, Any]:
    m = cand.model(fitted.values)
    d = m.to_dict()
    d["stderr"] = {k: (None if not np.isfinite(v) else float(f"{v:.6g}")) for k, v in cand.si(fitted.stderr).items()}
    d["params"] = {k: float(f"{v:.8g}") for k, v in d["params"].items()}
    d["fixed"] = sorted(cand.fixed)
    if fitted.at_bound:
        d["at_bound"] = list(fitted.at_bound)
    d["fit"] = {"train": fitq, "heldout": held}
    if extra:
        d.update(extra)
    return d


def _select(kind: str, cands: dict[str, dict[str, Any]], method: str, heldout_desc: str) -> dict[str, Any]:
    """The chosen candidate's entry, with every candidate's held-out score and the ranking."""
    name = choose({k: {"heldout": v["fit"]["heldout"]["all"], "params": [p for p in v["params"]
                                                                           if p not in v.get("fixed", [])]}
                   for k, v in cands.items()})
    best = dict(cands[name])
    others = {k: {"params": v["params"], "heldout": v["fit"]["heldout"]} for k, v in cands.items()}
    best["candidates"] = others
    best["selection"] = {
        "chosen": name, "criterion": "lowest held-out MAPE (forms within 2 % relative: fewer parameters)",
        "heldout": heldout_desc,
        "ranking": sorted(((k, v["fit"]["heldout"]["all"]["mape_pct"]) for k, v in cands.items()),
                          key=lambda kv: kv[1]),
    }
    best["method"] = method
    return best


# ------------------------------------------------------------------------------------------
# backbone
# ------------------------------------------------------------------------------------------

def backbone_candidates(graph_max_tokens: int) -> list[Candidate]:
    c0 = ParamSpec("c0", 10.0, 0.0, 500.0)
    ctx = ParamSpec("c_ctx", 1e-5, 0.0, 1e-2)
    eager = ParamSpec("c_eager", 2.0, 0.0, 200.0)
    fx = {"graph_max_tokens": float(graph_max_tokens)}
    time = lambda names: {n: MS for n in names}  # noqa: E731
    return [
        Candidate("linear", "backbone", [c0, ParamSpec("c_prefill", 0.02, 0, 1), ParamSpec("c_decode", 0.03, 0, 1), ctx],
                  {}, time(["c0", "c_prefill", "c_decode", "c_ctx"])),
        Candidate("graph_linear", "backbone", [c0, eager, ParamSpec("c_prefill", 0.02, 0, 1),
                                               ParamSpec("c_decode", 0.03, 0, 1), ctx], fx,
                  time(["c0", "c_eager", "c_prefill", "c_decode", "c_ctx"])),
        Candidate("graph_roofline", "backbone", [c0, eager, ParamSpec("c_mem", 2.0, 0, 500),
                                                 ParamSpec("c_tok", 0.02, 0, 1), ParamSpec("c_seq", 0.005, 0, 1), ctx],
                  fx, time(["c0", "c_eager", "c_mem", "c_tok", "c_seq", "c_ctx"])),
    ]


def window_backbone_ms(model: PerfModel, f: pd.DataFrame) -> np.ndarray:
    """Mean backbone step (ms) of each window: ``n_pre`` steps with ``P_step`` prefill tokens, the rest decode."""
    S, n = f["S"].to_numpy(float), f["n_pre"].to_numpy(float)
    D, C, P = f["D"].to_numpy(float), f["C"].to_numpy(float), f["P_step"].to_numpy(float)
    pre = np.asarray(model.predict(P, D, C), float)
    dec = np.asarray(model.predict(np.zeros_like(P), D, C), float)
    return (n * pre + (S - n) * dec) / S / MS


def fit_backbone(obs: pd.DataFrame, graph_max_tokens: int = 512, k: int = 5,
                 train_kinds: tuple[str, ...] = ("decode", "prefill"), method: str = "",
                 fixed: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit the backbone to the windows' ``comp_ms`` (mean step minus scheduler time).

    ``fixed`` (SI units) pins parameters the observations cannot identify (e.g. the prefill
    cost when only decode steps were measured); each candidate pins those it has.
    """
    if len(obs) == 0:
        raise FitError("backbone: no usable step-latency windows")
    y = obs["comp_ms"].to_numpy(float)
    sig = obs["sigma"].to_numpy(float)
    train = obs["kind"].isin(train_kinds).to_numpy()
    if train.sum() < 8:
        raise FitError(f"backbone: only {int(train.sum())} decode/prefill windows; need at least 8")
    kinds = obs["kind"].to_numpy()
    cands: dict[str, dict[str, Any]] = {}
    oof_by: dict[str, np.ndarray] = {}
    for cand in backbone_candidates(graph_max_tokens):
        for name, v in (fixed or {}).items():
            if any(s.name == name for s in cand.specs):
                cand.specs = [s for s in cand.specs if s.name != name]
                cand.fixed = {**cand.fixed, name: float(v)}

        def fit_idx(idx: np.ndarray, cand: Candidate = cand):
            sub = obs.iloc[idx]
            return fit_params(lambda *th: window_backbone_ms(cand.model(dict(zip([s.name for s in cand.specs], th))),
                                                             sub), cand.specs, y[idx], sig[idx], f"backbone/{cand.form}")

        def pred_idx(fitted, idx: np.ndarray, cand: Candidate = cand):
            return window_backbone_ms(cand.model(fitted.values), obs.iloc[idx])

        full = fit_idx(np.flatnonzero(train))
        pred = pred_idx(full, np.arange(len(obs)))
        oof = cross_val_predict(fit_idx, pred_idx, len(obs), obs["group"], k, train_mask=train)
        oof_by[cand.form] = oof
        held = {"all": quality(y, oof)}
        for kd in ("decode", "prefill", "mixed"):
            m = kinds == kd
            if m.any():
                held[kd] = quality(y[m], oof[m])
        cands[cand.form] = _entry(cand, full, quality(y[train], pred[train]), held)
    out = _select("backbone", cands, method, f"grouped {k}-fold by run over all windows (mixed windows are never "
                                              f"fitted, only predicted)")
    out["_oof_ms"] = oof_by[out["selection"]["chosen"]]
    return out


# ------------------------------------------------------------------------------------------
# LoRA compute
# ------------------------------------------------------------------------------------------

def lora_candidates(model: ModelSpec | None = None, graph_max_tokens: int = 512) -> list[Candidate]:
    """LoRA forms to try; ``kernel_grid`` (needs the model's dimensions) only when ``model`` is given."""
    pct = Candidate("percent_of_base", "lora", [ParamSpec("k6", 2.0, 0, 100), ParamSpec("k7", 200.0, 100, 1000)], {},
                    {})
    add = Candidate("additive", "lora", [ParamSpec("l0", 15.0, 0, 500), ParamSpec("l_adapter", 0.3, 0, 50),
                                         ParamSpec("l_token", 0.01, 0, 10)], {},
                    {"l0": MS, "l_adapter": MS, "l_token": MS})
    add_at = Candidate("additive", "lora", [ParamSpec("l0", 15.0, 0, 500), ParamSpec("l_adapter", 0.3, 0, 50),
                                            ParamSpec("l_token", 0.01, 0, 10),
                                            ParamSpec("l_adapter_token", 1e-4, 0, 1)], {},
                       {"l0": MS, "l_adapter": MS, "l_token": MS, "l_adapter_token": MS})
    out = [pct, add, add_at]
    if model is not None:
        dims = {"layers": float(model.layers), "hidden": float(model.hidden), "intermediate": float(model.intermediate),
                "q_dim": float(model.heads * model.head_dim), "kv_dim": float(model.kv_heads * model.head_dim),
                "vocab": float(model.vocab), "graph_max_tokens": float(graph_max_tokens)}
        # l_cta / l_active in ns per thread block (working unit), the others in ms
        to_si = {"l0": MS, "l_cta": 1e-9, "l_active": 1e-9, "l_adapter": MS, "l_token": MS}
        specs = {"l0": ParamSpec("l0", 0.1, 0, 500), "l_cta": ParamSpec("l_cta", 1.0, 0, 1000),
                 "l_active": ParamSpec("l_active", 20.0, 0, 10000), "l_adapter": ParamSpec("l_adapter", 0.3, 0, 50),
                 "l_token": ParamSpec("l_token", 0.01, 0, 10)}
        for fitted in (("l_cta", "l_active"), ("l_cta", "l_active", "l_adapter"),
                       ("l0", "l_cta", "l_adapter", "l_token")):
            fixed = {**dims, **{k: 0.0 for k in specs if k not in fitted}}
            out.append(Candidate("kernel_grid", "lora", [specs[k] for k in fitted], fixed, to_si))
    return out


def _requests_per_step(f: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Requests in a decode step and in a prefill step: the running batch ``D`` (the windows and
    runs give its mean), plus the prompts of the chunk where ``R_pre`` is known."""
    D = np.maximum(f["D"].to_numpy(float), 1.0)
    R_pre = f["R_pre"].to_numpy(float) if "R_pre" in f.columns else D
    return D, np.where(np.isfinite(R_pre), R_pre, D)


def window_lora_ms(backbone: PerfModel, lora: PerfModel, f: pd.DataFrame, max_rank: np.ndarray) -> np.ndarray:
    """Mean backbone + LoRA step (ms) of each window (same step mixture as the backbone)."""
    S, n = f["S"].to_numpy(float), f["n_pre"].to_numpy(float)
    D, C, P, A = (f[c].to_numpy(float) for c in ("D", "C", "P_step", "A"))
    G = f["G"].to_numpy(float)
    R_dec, R_pre = _requests_per_step(f)
    zero = np.zeros_like(P)
    b_pre = np.asarray(backbone.predict(P, D, C), float)
    b_dec = np.asarray(backbone.predict(zero, D, C), float)
    pre = b_pre + np.asarray(lora.predict(b_pre, A, max_rank, P + D, G, R_pre), float)
    dec = b_dec + np.asarray(lora.predict(b_dec, A, max_rank, D, G, R_dec), float)
    return (n * pre + (S - n) * dec) / S / MS


def runs_weighted_as_windows(sig: np.ndarray, is_run: np.ndarray) -> np.ndarray:
    """The LoRA fit's sigmas with the serving runs' scaled so that runs and windows carry the same total
    weight (``sum 1/sigma^2``), whatever their numbers of rows (a copy; unchanged without both kinds)."""
    sig = np.asarray(sig, float).copy()
    if is_run.any() and (~is_run).any():
        w_win = float(np.sum(1.0 / sig[~is_run] ** 2))
        w_run = float(np.sum(1.0 / sig[is_run] ** 2))
        sig[is_run] *= np.sqrt(w_run / w_win)
    return sig


def fit_lora(obs: pd.DataFrame, backbone: PerfModel, max_rank: np.ndarray, k: int = 5,
             method: str = "", model: ModelSpec | None = None, graph_max_tokens: int = 512) -> dict[str, Any]:
    """Fit the LoRA extra time on observations with adapters; the backbone is fixed (fitted without LoRA).

    ``obs`` holds step-log windows and, optionally, serving runs (``kind == "run"``: a run's
    mean ITL with its step mixture); each kind carries the same total weight whatever its
    number of rows, and held-out scores are given per kind. The selection score is the
    mean of the per-kind held-out MAPE when runs are present (else the MAPE over all rows).
    """
    if len(obs) < 6:
        raise FitError(f"lora: {len(obs)} usable windows with LoRA enabled; need at least 6")
    y = obs["comp_ms"].to_numpy(float)
    kinds = obs["kind"].to_numpy()
    is_run = kinds == "run"
    sig = runs_weighted_as_windows(obs["sigma"].to_numpy(float), is_run)
    cands: dict[str, dict[str, Any]] = {}
    for cand in lora_candidates(model, graph_max_tokens):
        names = [s.name for s in cand.specs]
        if cand.form == "kernel_grid":
            label = "kernel_grid(" + ",".join(n for n in names) + ")"
        else:
            label = cand.form + ("+A*T" if "l_adapter_token" in names else "")

        def fit_idx(idx: np.ndarray, cand: Candidate = cand):
            sub = obs.iloc[idx]
            names = [s.name for s in cand.specs]
            return fit_params(lambda *th: window_lora_ms(backbone, cand.model(dict(zip(names, th))), sub, max_rank[idx]),
                              cand.specs, y[idx], sig[idx], f"lora/{label}")

        def pred_idx(fitted, idx: np.ndarray, cand: Candidate = cand):
            return window_lora_ms(backbone, cand.model(fitted.values), obs.iloc[idx], max_rank[idx])

        full = fit_idx(np.arange(len(obs)))
        pred = pred_idx(full, np.arange(len(obs)))
        oof = cross_val_predict(fit_idx, pred_idx, len(obs), obs["group"], k)
        held = {"all": quality(y, oof)}
        for kd in ("decode", "mixed", "run"):
            m = kinds == kd
            if m.any():
                held[kd] = quality(y[m], oof[m])
        if is_run.any() and (~is_run).any():
            held["windows"] = quality(y[~is_run], oof[~is_run])
            held["all"] = {**held["all"], "mape_pct": float((held["windows"]["mape_pct"] + held["run"]["mape_pct"]) / 2),
                           "note": "MAPE: mean of the windows' and the serving runs' held-out MAPE (selection "
                                   "criterion); the other scores are over all rows"}
        e = _entry(cand, full, quality(y, pred), held)
        e["_oof_ms"] = oof
        cands[label] = e
    out = _select("lora", cands, method, f"grouped {k}-fold by run over the LoRA windows"
                  + (" and serving runs (each run its own group)" if is_run.any() else ""))
    chosen = out["selection"]["chosen"]
    out["_oof_ms"] = cands[chosen]["_oof_ms"]
    return out


# ------------------------------------------------------------------------------------------
# scheduler
# ------------------------------------------------------------------------------------------

def scheduler_candidates() -> list[Candidate]:
    t = {"k0": MS, "k1": MS, "k1_sq": MS, "k2": MS, "k3": MS, "k_blocked": MS}
    return [
        Candidate("linear_queue", "scheduler", [ParamSpec("k0", 0.05, -5, 5), ParamSpec("k1", 2e-3, -1, 1),
                                                ParamSpec("k2", 1e-4, -1, 1), ParamSpec("k3", -1e-4, -1, 1)], {}, t),
        Candidate("lora_queue", "scheduler", [ParamSpec("k0", 0.05, 0, 5), ParamSpec("k1", 2e-3, 0, 1),
                                              ParamSpec("k1_sq", 1e-7, 0, 1e-2), ParamSpec("k2", 1e-6, 0, 1),
                                              ParamSpec("k_blocked", 1e-4, 0, 1)], {}, t),
    ]


def scheduler_predict_ms(model: PerfModel, f: pd.DataFrame) -> np.ndarray:
    """Scheduler time per step (ms) of each observation."""
    R, W, G, N = (f[c].to_numpy(float) for c in ("R", "W", "G", "N"))
    if model.form == "linear_queue":  # its predict takes scalar slots/served: same equation, vectorised
        p = model.params
        ratio = np.where(N > 0, G / np.maximum(N, 1), 0.0)
        return (p["k0"] + p["k1"] * R + p["k2"] * W + p["k3"] * W * ratio) / MS
    return np.asarray(model.predict(R, W, G, N), float) / MS


def fit_scheduler(obs: pd.DataFrame, k: int = 5, method: str = "",
                  source_weight: dict[str, float] | None = None) -> dict[str, Any]:
    """Fit the scheduler time per step on the union of sources in ``obs['source']``.

    Source ``s`` carries the total weight ``source_weight[s]`` (default 1) whatever its number
    of rows (``sigma = sqrt(n_s / weight_s)``), so a few hundred runs are not drowned by
    thousands of windows; held-out scores are given per source.
    """
    y = obs["sched_ms"].to_numpy(float)
    src = obs["source"].to_numpy()
    counts = pd.Series(src).value_counts()
    sw = source_weight or {}
    sig = np.sqrt(np.array([counts[s] / sw.get(s, 1.0) for s in src], float))
    cands: dict[str, dict[str, Any]] = {}
    for cand in scheduler_candidates():
        names = [s.name for s in cand.specs]

        def fit_idx(idx: np.ndarray, cand: Candidate = cand, names=names):
            sub = obs.iloc[idx]
            return fit_params(lambda *th: scheduler_predict_ms(cand.model(dict(zip(names, th))), sub), cand.specs,
                              y[idx], sig[idx], f"scheduler/{cand.form}")

        def pred_idx(fitted, idx: np.ndarray, cand: Candidate = cand):
            return scheduler_predict_ms(cand.model(fitted.values), obs.iloc[idx])

        full = fit_idx(np.arange(len(obs)))
        pred = pred_idx(full, np.arange(len(obs)))
        oof = cross_val_predict(fit_idx, pred_idx, len(obs), obs["group"], k)
        held = {s: quality(y[src == s], oof[src == s]) for s in counts.index}
        # the criterion: every source counts the same
        held["all"] = {"mape_pct": float(np.mean([held[s]["mape_pct"] for s in counts.index])),
                       "note": "MAPE: unweighted mean over the sources (selection criterion)", "n": int(len(y))}
        e = _entry(cand, full, quality(y, pred), held)
        e["_oof_ms"] = oof
        cands[cand.form] = e
    out = _select("scheduler", cands, method, f"grouped {k}-fold by run; score = mean of the per-source held-out MAPE")
    out["_oof_ms"] = cands[out["selection"]["chosen"]]["_oof_ms"]
    return out


# ------------------------------------------------------------------------------------------
# adapter loads
# ------------------------------------------------------------------------------------------

#: physical upper bounds of the links (GB/s): PCIe 5.0 x16 and a PCIe 5.0 NVMe drive
LINK_MAX_GBPS = {"cpu": 64.0, "disk": 14.0}


def fit_load(loads: pd.DataFrame, model: ModelSpec, targets: tuple[str, ...], method: str = "") -> dict[str, Any]:
    """Per-(source, rank) table of mean load times with standard errors, plus the link model
    ``t = fixed + bytes/bandwidth`` fitted across ranks for each source.

    ``loads`` columns: ``source`` ('disk' | 'cpu'), ``rank``, ``load_ms``, ``group`` (server
    start). Held-out: loads are split by their position (even / odd) in each server start; the
    table and the link model fitted on one half predict the other (both directions).
    """
    if len(loads) == 0:
        raise FitError("load: no adapter-load measurements")
    loads = loads.copy()
    loads["bytes"] = [model.adapter_bytes(int(r), targets) for r in loads["rank"]]
    params: dict[str, Any] = {}
    stderr: dict[str, Any] = {}
    table: dict[str, dict[str, float]] = {}
    table_se: dict[str, dict[str, float]] = {}
    fit_info: dict[str, Any] = {}
    at_bound: list[str] = []
    by_max: dict[str, dict[str, dict[str, float]]] = {}
    by_max_q: dict[str, dict[str, float]] = {}

    def link_fit(sub: pd.DataFrame, source: str):
        x = sub["bytes"].to_numpy(float) / 1e9  # GB
        y = sub["load_ms"].to_numpy(float)
        specs = [ParamSpec("fixed_ms", float(np.min(y)), 0.0, float(np.max(y)) * 2),
                 ParamSpec("gbps", LINK_MAX_GBPS[source] / 4, 0.05, LINK_MAX_GBPS[source])]
        return fit_params(lambda f, b: f + x / b * 1e3, specs, y, None, f"load/{source} link")

    for source in ("disk", "cpu"):
        sub = loads[loads["source"] == source]
        if len(sub) == 0:
            raise FitError(f"load: no {source} loads in the measurements")
        g = sub.groupby("rank")["load_ms"]
        table[source] = {str(int(r)): float(f"{v / 1e3:.6g}") for r, v in g.mean().items()}
        table_se[source] = {str(int(r)): float(f"{v / 1e3:.4g}") for r, v in (g.std(ddof=1) / np.sqrt(g.count())).items()}
        if sub["rank"].nunique() >= 2:
            lf = link_fit(sub, source)
        else:  # one rank: bandwidth not identifiable; keep the fixed cost, bandwidth at the physical bound
            lf = fit_params(lambda f: f + sub["bytes"].to_numpy(float) / 1e9 / LINK_MAX_GBPS[source] * 1e3,
                            [ParamSpec("fixed_ms", float(sub["load_ms"].mean()), 0.0, 1e6)],
                            sub["load_ms"].to_numpy(float), None, f"load/{source} fixed")
            lf.values["gbps"] = LINK_MAX_GBPS[source]
            lf.stderr["gbps"] = float("nan")
            lf.at_bound.append("gbps")
        params[f"{source}_fixed_s"] = float(f"{lf.values['fixed_ms'] * MS:.6g}")
        params[f"{source}_gbps"] = float(f"{lf.values['gbps']:.6g}")
        stderr[f"{source}_fixed_s"] = None if not np.isfinite(lf.stderr["fixed_ms"]) else lf.stderr["fixed_ms"] * MS
        stderr[f"{source}_gbps"] = None if not np.isfinite(lf.stderr["gbps"]) else lf.stderr["gbps"]
        at_bound += [f"{source}_{'fixed_s' if n == 'fixed_ms' else 'gbps'}" for n in lf.at_bound]
        # held-out: even/odd halves of each server start's sequence of loads
        half = (sub.groupby("group").cumcount() % 2).to_numpy()
        y = sub["load_ms"].to_numpy(float)
        pt = np.full(len(sub), np.nan)
        pl = np.full(len(sub), np.nan)
        for h in (0, 1):
            tr, te = sub[half != h], half == h
            means = tr.groupby("rank")["load_ms"].mean()
            pt[te] = sub.loc[te, "rank"].map(means).to_numpy(float)
            if tr["rank"].nunique() >= 2:
                lf_h = link_fit(tr, source)
                pl[te] = lf_h.values["fixed_ms"] + sub.loc[te, "bytes"].to_numpy(float) / 1e9 / lf_h.values["gbps"] * 1e3
        if "max_rank" in sub.columns and sub["max_rank"].nunique() > 1:
            # the slot's max rank matters (padding), but the engine's load call does not pass it:
            # keep that finer table for information, with its own held-out score
            pm = np.full(len(sub), np.nan)
            for h in (0, 1):
                tr, te = sub[half != h], half == h
                means = tr.groupby(["max_rank", "rank"])["load_ms"].mean()
                pm[te] = [means.get((a, b), np.nan) for a, b in zip(sub.loc[te, "max_rank"], sub.loc[te, "rank"])]
            g2 = sub.groupby(["max_rank", "rank"])["load_ms"].mean()
            by_max.setdefault(source, {})
            for (mr, r), v in g2.items():
                by_max[source].setdefault(str(int(mr)), {})[str(int(r))] = float(f"{v / 1e3:.6g}")
            by_max_q[source] = quality(y, pm)
        fit_info[source] = {"table": quality(y, pt), "link": quality(y, pl),
                            "link_train": quality(y, lf.values["fixed_ms"] + sub["bytes"].to_numpy(float) / 1e9
                                                  / lf.values["gbps"] * 1e3),
                            "n_loads": int(len(sub)), "ranks": sorted(int(r) for r in sub["rank"].unique())}
    params["table_s"] = table
    all_held = {"mape_pct": float(np.mean([fit_info[s]["table"]["mape_pct"] for s in ("disk", "cpu")])),
                "note": "MAPE of the per-rank table, mean over the two sources"}
    m = FORMS[("load", "link")](params=params)
    d = m.to_dict()
    d["stderr"] = {**{k: (None if v is None else float(f"{v:.6g}")) for k, v in stderr.items()}, "table_s": table_se}
    d["fit"] = {"heldout": {"all": all_held, **fit_info}}
    if at_bound:
        d["at_bound"] = at_bound
    if by_max:
        d["table_by_max_rank_s"] = by_max
        d["fit"]["heldout_table_by_max_rank"] = by_max_q
        d["table_by_max_rank_note"] = ("mean load (s) per slot max rank and adapter rank; the engine uses it when the "
                                       "(max_lora_rank, rank) pair was measured, else table_s, else the link model")
    d["method"] = method
    d["selection"] = {"chosen": "link (per-rank table for measured ranks, link model elsewhere)",
                      "heldout": "loads split even/odd within each server start; each half predicts the other"}
    return d


# ------------------------------------------------------------------------------------------
# KV capacity
# ------------------------------------------------------------------------------------------

def kv_candidates(kv_bytes_per_token: int) -> list[Candidate]:
    fx = {"kv_bytes_per_token": float(kv_bytes_per_token)}
    return [
        Candidate("memory_budget", "kv", [ParamSpec("free_bytes", 40.0, 0, 1000),
                                          ParamSpec("slot_bytes_per_rank", 0.006, 0, 1)], fx,
                  {"free_bytes": GIB, "slot_bytes_per_rank": GIB}),
        Candidate("memory_budget_affine", "kv", [ParamSpec("free_bytes", 40.0, 0, 1000),
                                                 ParamSpec("lora_fixed_bytes", 0.3, 0, 50),
                                                 ParamSpec("slot_fixed_bytes", 0.005, 0, 1),
                                                 ParamSpec("slot_bytes_per_rank", 0.006, 0, 1)], fx,
                  {"free_bytes": GIB, "lora_fixed_bytes": GIB, "slot_fixed_bytes": GIB, "slot_bytes_per_rank": GIB}),
    ]


def kv_tokens_continuous(model: PerfModel, slots: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """The KV form without the block rounding (for fitting): tokens as a real number."""
    p = model.params
    per_slot = p.get("slot_fixed_bytes", 0.0) + p["slot_bytes_per_rank"] * rank
    free = p["free_bytes"] - slots * per_slot - np.where(slots > 0, p.get("lora_fixed_bytes", 0.0), 0.0)
    return free / p["kv_bytes_per_token"]


def fit_kv(obs: pd.DataFrame, probes: pd.DataFrame, kv_bytes_per_token: int, max_model_len: int,
           method: str = "") -> dict[str, Any]:
    """Fit KV capacity (tokens) against slots and max rank; classify the probe starts.

    ``obs``: ``slots``, ``rank``, ``tokens`` (measured capacity: logged KV size, or the
    available KV memory of a start that failed for lack of KV) and ``group``. ``probes``:
    ``slots``, ``rank``, ``ok`` (the start succeeded) - a config is predicted to fail when
    the predicted capacity is below ``max_model_len``. Held-out: leave-one-out.
    """
    if len(obs) < 4:
        raise FitError(f"kv: {len(obs)} capacity measurements; need at least 4")
    y = obs["tokens"].to_numpy(float)
    S, Rk = obs["slots"].to_numpy(float), obs["rank"].to_numpy(float)
    cands: dict[str, dict[str, Any]] = {}
    for cand in kv_candidates(kv_bytes_per_token):
        names = [s.name for s in cand.specs]
        if cand.form == "memory_budget_affine" and not (S == 0).any():
            cand.specs = [s for s in cand.specs if s.name != "lora_fixed_bytes"]
            cand.fixed = {**cand.fixed, "lora_fixed_bytes": 0.0}
            names = [s.name for s in cand.specs]

        def fit_idx(idx: np.ndarray, cand: Candidate = cand, names=names):
            return fit_params(lambda *th: kv_tokens_continuous(cand.model(dict(zip(names, th))), S[idx], Rk[idx]),
                              cand.specs, y[idx], None, f"kv/{cand.form}")

        def pred_idx(fitted, idx: np.ndarray, cand: Candidate = cand):
            m = cand.model(fitted.values)
            return np.array([m.predict(int(s), int(r)) for s, r in zip(S[idx], Rk[idx])], float)

        full = fit_idx(np.arange(len(obs)))
        pred = pred_idx(full, np.arange(len(obs)))
        oof = cross_val_predict(fit_idx, pred_idx, len(obs), np.arange(len(obs)), k=len(obs))
        m = cand.model(full.values)
        pp = np.array([m.predict(int(s), int(r)) for s, r in zip(probes["slots"], probes["rank"])])
        ok_pred = pp >= max_model_len
        ok = probes["ok"].to_numpy(bool)
        cls = {"correct": int((ok_pred == ok).sum()), "total": int(len(ok)),
               "ok_predicted_ok": int((ok_pred & ok).sum()), "ok_total": int(ok.sum()),
               "failed_predicted_failed": int((~ok_pred & ~ok).sum()), "failed_total": int((~ok).sum()),
               "misclassified": [{"slots": int(s), "max_rank": int(r), "measured": "ok" if o else "failed",
                                  "predicted_tokens": int(t)}
                                 for s, r, o, t, q in zip(probes["slots"], probes["rank"], ok, pp, ok_pred) if o != q]}
        held = {"all": quality(y, oof)}
        e = _entry(cand, full, quality(y, pred), held, {"classification": cls})
        cands[cand.form] = e
    return _select("kv", cands, method, "leave-one-out over the capacity measurements")


def fitted_model(entry: dict[str, Any], kind: str) -> PerfModel:
    """The :class:`PerfModel` of a fitted component entry."""
    return FORMS[(kind, entry["form"])](params=dict(entry["params"]))


__all__ = ["fit_backbone", "fit_lora", "fit_scheduler", "fit_load", "fit_kv", "window_backbone_ms", "window_lora_ms",
           "scheduler_predict_ms", "fitted_model", "Candidate"]
