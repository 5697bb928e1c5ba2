"""The price of a 64-split working shrink block, fitted with the mixed-step term (issue 17).

vLLM 0.8.5's shrink kernel (``lora_shrink``) splits the reduction 64 ways in a step of fewer than
128 tokens and 8 ways in a larger one. A 64-split block reduces an eighth of the input features
of an 8-split one, so it need not cost the same; ``split64_cost`` of
:class:`twin.perf.forms.KernelGridLora` prices it relative to an 8-split block. The 300-slot LoRA
windows hold almost no step under 128 tokens (2 of the LoRA fit's rows); the published 600 s
serving runs without a queue (rank 8, 8-448 slots; their table records neither the model nor the
vLLM version, see :func:`calibration.fitting.vllm085.serving_run_lora_obs`) are mostly such steps,
so they identify it.

**Why a fixed point.** ``twin calibrate fit`` fitted the kernel grid first and the ``mixed``
component (:mod:`calibration.fitting.mixed`: the serving step's excess on steps with a prefill)
after it, on the same serving runs. The kernel grid's fit therefore saw the runs' mixed-step
excess as LoRA time: fitted alone, ``split64_cost`` comes out at 1.015 +- 0.029 (the serving
runs heavy in prefills, whose excess the grid cannot carry, pull it up; the light ones, where the
model runs 5-8 % slow, pull it down). :func:`fit_split64_with_mixed` fits the two together: for
each mixed form the engine can evaluate, it alternates (a) the kernel grid's ``l_cta``,
``l_active`` and ``split64_cost`` on the LoRA fit's own rows and weights, with the mixed form's
current excess subtracted from the target, and (b) :func:`calibration.fitting.mixed.fit_mixed`
of that form on the grid of (a), until the parameters stop moving. The pair whose mixed fit has
the lowest held-out criterion (mean over the three sources of the grouped 5-fold MAPE of the mean
step, :func:`~calibration.fitting.mixed.fit_mixed`'s own) becomes the profile's ``lora`` and
``mixed`` components (:func:`add_split64_and_mixed`, called by ``twin calibrate fit``).

``python -m calibration.fitting.split64 [--data DIR] [--model NAME] [--json]`` prints the grid
fitted alone (with ``split64_cost`` 1 and free) and every form's fixed point.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting import components as C
from calibration.fitting.core import (ParamSpec, cross_val_predict, dropped_rows_reported, fit_params,
                                     quality)
from calibration.fitting.mixed import CANDIDATES as MIXED_CANDIDATES, add_mixed, fit_mixed, with_mixed_inputs
from calibration.fitting.tables import FITTING_ERRORS, Vllm085Tables, fitting_error, fitting_parser, vllm085_directory
from calibration.fitting.vllm085 import (BACKBONE_METHOD, GRAPH_MAX_TOKENS, backbone_obs, fit_vllm085, lora_obs,
                                         serving_run_lora_obs)
from twin.perf.profile import Profile

#: rows whose steps have fewer tokens than this run the 64-split shrink (vLLM 0.8.5 ``lora_shrink``)
SPLIT64_BELOW_TOKENS = 128
#: the fixed point: stop when no fitted parameter moves by more than this, relative
FIXED_POINT_RTOL = 1e-7
FIXED_POINT_MAX_ITER = 200
#: mixed forms the engine can evaluate (one term each), in the order they are tried
ENGINE_MIXED_FORMS: tuple[str, ...] = tuple(c.name for c in MIXED_CANDIDATES if c.profile_form is not None)
MS = 1e-3


@dataclasses.dataclass(frozen=True)
class LoraRows:
    """The LoRA fit's rows (300-slot windows, then the serving runs without a queue), as ``twin calibrate
    fit`` builds and weighs them: target ``y`` (ms, step minus scheduler and load time), max rank, sigma."""

    obs: pd.DataFrame
    rank: np.ndarray
    y: np.ndarray
    sig: np.ndarray
    is_run: np.ndarray

    @classmethod
    def build(cls, t: Vllm085Tables, backbone) -> "LoraRows | None":
        """``None`` when the serving runs are not this model's (then nothing identifies the 64-split price)."""
        lo, max_rank = lora_obs(t)
        runs, info = serving_run_lora_obs(t, backbone)
        if not info.get("used") or not len(runs):
            return None
        obs = with_mixed_inputs(pd.concat([lo, runs], ignore_index=True))
        is_run = (obs["kind"] == "run").to_numpy()
        return cls(obs=obs, rank=np.concatenate([max_rank, np.full(len(runs), 8.0)]),
                   y=obs["comp_ms"].to_numpy(float), is_run=is_run,
                   sig=C.runs_weighted_as_windows(obs["sigma"].to_numpy(float), is_run))

    def under_128(self) -> dict[str, int]:
        small = self.obs["D"].to_numpy(float) < SPLIT64_BELOW_TOKENS
        return {"windows": int((small & ~self.is_run).sum()), "serving_runs": int((small & self.is_run).sum())}


def _grid_candidate(model, free_split64: bool) -> C.Candidate:
    """``twin calibrate fit``'s two-parameter kernel grid (``l_cta``, ``l_active``), optionally with a
    free ``split64_cost``."""
    base = next(c for c in C.lora_candidates(model, GRAPH_MAX_TOKENS)
                if c.form == "kernel_grid" and [s.name for s in c.specs] == ["l_cta", "l_active"])
    if not free_split64:
        return base
    return dataclasses.replace(base, specs=[*base.specs, ParamSpec("split64_cost", 1.0, 0.0, 3.0)])


def _fit_grid(cand: C.Candidate, rows: LoraRows, backbone, offset_ms: np.ndarray, idx: np.ndarray | None = None,
              p0: dict[str, float] | None = None):
    """The kernel grid on ``rows`` (all, or ``idx``) against the target minus ``offset_ms``."""
    idx = np.arange(len(rows.y)) if idx is None else idx
    sub, rank = rows.obs.iloc[idx], rows.rank[idx]
    names = [s.name for s in cand.specs]
    specs = [dataclasses.replace(s, p0=float(np.clip(p0[s.name], s.lo, s.hi))) if p0 and s.name in p0 else s
             for s in cand.specs]
    return fit_params(lambda *th: C.window_lora_ms(backbone, cand.model(dict(zip(names, th))), sub, rank),
                      specs, rows.y[idx] - offset_ms[idx], rows.sig[idx], f"lora/{cand.form}+split64")


def _with_grid(profile: dict[str, Any], cand: C.Candidate, values: dict[str, float]) -> dict[str, Any]:
    out = copy.deepcopy(profile)
    si = cand.si(values)
    out["components"]["lora"]["params"].update({k: float(f"{v:.8g}") for k, v in si.items()})
    return out


def fit_split64(directory: str | Path, model: str = "llama-3.1-8b") -> dict[str, Any]:
    """The kernel grid fitted alone (no mixed term) with and without a free ``split64_cost`` on the
    calibration's LoRA data, with a freshly fitted backbone as ``twin calibrate fit`` does."""
    t = Vllm085Tables.read(directory, model)
    backbone = C.fitted_model(C.fit_backbone(backbone_obs(t), GRAPH_MAX_TOKENS, 5, method=BACKBONE_METHOD),
                              "backbone")
    rows = LoraRows.build(t, backbone)
    if rows is None:
        raise ValueError(f"split64: the calibration's serving runs are not {model}'s (serving_run_lora_obs left them "
                         f"out), and nothing else has steps under {SPLIT64_BELOW_TOKENS} tokens")
    out: dict[str, Any] = {"rows": int(len(rows.y)), "windows": int((~rows.is_run).sum()),
                           "serving_runs": int(rows.is_run.sum()), "rows_under_128_tokens": rows.under_128()}
    zero = np.zeros(len(rows.y))
    for label, free in (("calibrated (split64_cost 1)", False), ("split64_cost free", True)):
        cand = _grid_candidate(t.model, free)
        fit = _fit_grid(cand, rows, backbone, zero)
        pred = C.window_lora_ms(backbone, cand.model(fit.values), rows.obs, rows.rank)
        out[label] = {"params": {k: round(float(v), 6) for k, v in fit.values.items()},
                      "stderr": {k: (round(float(v), 6) if v is not None else None) for k, v in fit.stderr.items()},
                      "mape_pct": _mape_by_kind(rows, pred)}
    out["units"] = {"l_cta": "ns/launched block", "l_active": "ns/working block",
                    "split64_cost": "64-split working block / 8-split one"}
    return out


def _mape_by_kind(rows: LoraRows, pred: np.ndarray) -> dict[str, float]:
    q = _heldout_by_kind(rows, pred)
    return {"windows": round(q["windows"]["mape_pct"], 3), "serving_runs": round(q["run"]["mape_pct"], 3)}


def _fixed_point(t: Vllm085Tables, profile: dict[str, Any], rows: LoraRows, backbone, form: str,
                 k: int) -> dict[str, Any]:
    """Alternate the kernel grid (with ``split64_cost``) and the mixed form ``form`` until neither moves."""
    cand = _grid_candidate(t.model, True)
    mixed_cand = next(c for c in MIXED_CANDIDATES if c.name == form)
    (term,) = mixed_cand.terms
    h_ms, values, trace = 0.0, None, []
    for it in range(1, FIXED_POINT_MAX_ITER + 1):
        offset = h_ms * rows.obs[term].to_numpy(float)
        fit = _fit_grid(cand, rows, backbone, offset, p0=values)
        prof = _with_grid(profile, cand, fit.values)
        entry = fit_mixed(t, Profile.from_dict(prof, prof.get("name", "<profile>")), k, forms=(form,))
        (h_si,) = entry["params"].values()
        new = {**fit.values, "h": h_si / MS}
        moved = (values is None or max(abs(new[p] - old) / max(abs(old), 1e-12)
                                       for p, old in {**values, "h": h_ms}.items()) > FIXED_POINT_RTOL)
        values, h_ms = dict(fit.values), h_si / MS
        trace.append({"split64_cost": round(float(values["split64_cost"]), 6), "h_ms": round(h_ms, 6)})
        if not moved:
            break
    else:
        raise ValueError(f"split64: the kernel grid and the mixed form {form!r} did not reach a fixed point in "
                         f"{FIXED_POINT_MAX_ITER} rounds")
    offset = h_ms * rows.obs[term].to_numpy(float)
    pred = C.window_lora_ms(backbone, cand.model(fit.values), rows.obs, rows.rank) + offset
    oof = offset + cross_val_predict(
        lambda idx: _fit_grid(cand, rows, backbone, offset, idx, p0=values),
        lambda f, idx: C.window_lora_ms(backbone, cand.model(f.values), rows.obs.iloc[idx], rows.rank[idx]),
        len(rows.y), rows.obs["group"], k)
    return {"form": form, "cand": cand, "fit": fit, "mixed": entry, "rounds": it, "trace": trace[:3] + trace[-1:],
            "criterion": float(entry["fit"]["heldout"]["all"]["mape_pct"]),
            "lora_train": {"all": quality(rows.y, pred), "windows": quality(rows.y[~rows.is_run], pred[~rows.is_run]),
                           "run": quality(rows.y[rows.is_run], pred[rows.is_run])},
            "lora_heldout": _heldout_by_kind(rows, oof)}


def _heldout_by_kind(rows: LoraRows, oof: np.ndarray) -> dict[str, Any]:
    """Held-out scores of the LoRA rows as ``components.fit_lora`` reports them: windows, serving runs, and all
    rows with the MAPE replaced by the mean of the two kinds' (its selection criterion)."""
    win = quality(rows.y[~rows.is_run], oof[~rows.is_run])
    run = quality(rows.y[rows.is_run], oof[rows.is_run])
    return {"all": {**quality(rows.y, oof), "mape_pct": float((win["mape_pct"] + run["mape_pct"]) / 2),
                    "note": "MAPE: mean of the windows' and the serving runs' held-out MAPE; the other scores are "
                            "over all rows"},
            "windows": win, "run": run}


def fit_split64_with_mixed(t: Vllm085Tables, profile: dict[str, Any], k: int = 5) -> dict[str, Any] | None:
    """Every engine mixed form's fixed point with the kernel grid (see the module docstring), best first by
    the mixed fit's held-out criterion; ``None`` when nothing identifies the 64-split price (the serving
    runs are not this model's) or the profile's LoRA form is not the two-parameter kernel grid."""
    lo = profile["components"]["lora"]
    if lo.get("form") != "kernel_grid" or lo.get("selection", {}).get("chosen") != "kernel_grid(l_cta,l_active)":
        return None
    backbone = Profile.from_dict(profile, profile.get("name", "<profile>")).components["backbone"]
    rows = LoraRows.build(t, backbone)
    if rows is None:
        return None
    points = [_fixed_point(t, profile, rows, backbone, form, k) for form in ENGINE_MIXED_FORMS]
    points.sort(key=lambda p: p["criterion"])
    return {"points": points, "rows": rows}


def add_split64_and_mixed(profile: dict[str, Any], directory, k: int = 5, command: str = "") -> dict[str, Any]:
    """``profile`` (a vLLM 0.8.5 profile's dict, as :func:`calibration.fitting.vllm085.fit_vllm085` gives it)
    with its kernel grid refitted with ``split64_cost`` and its ``mixed`` component, both at the best fixed
    point (:func:`fit_split64_with_mixed`). Where that cannot be done (the serving runs are not this model's),
    the ``mixed`` component alone as before (:func:`calibration.fitting.mixed.add_mixed`)."""
    t = Vllm085Tables.read(directory, profile["model"])
    res = fit_split64_with_mixed(t, profile, k)
    if res is None:
        return add_mixed(profile, directory, k, command)
    best, rows = res["points"][0], res["rows"]
    out = _with_grid(profile, best["cand"], best["fit"].values)
    lo = out["components"]["lora"]
    se = best["cand"].si(best["fit"].stderr)
    lo["stderr"] = {kk: (None if not np.isfinite(v) else float(f"{v:.6g}")) for kk, v in se.items()}
    lo["fit"] = {"train": best["lora_train"]["all"],
                 "heldout": {**best["lora_heldout"], "method": "with the mixed term of the same fixed point "
                             "subtracted; grouped 5-fold by run (each serving run its own group)"},
                 "before_split64": lo["fit"]}
    lo["split64"] = {
        "method": "fixed point with the mixed component (calibration.fitting.split64.fit_split64_with_mixed): "
                  "alternately the kernel grid's l_cta, l_active and split64_cost on the LoRA fit's rows with the "
                  "mixed excess subtracted, and the mixed form on that grid; the pair with the lowest held-out "
                  "criterion of the mixed fit",
        "rows_under_128_tokens": rows.under_128(),
        "fixed_points": {p["form"]: {"split64_cost": round(float(p["fit"].values["split64_cost"]), 6),
                                     "mixed_params": p["mixed"]["params"], "criterion_mape_pct": round(p["criterion"], 4),
                                     "rounds": p["rounds"], "trace (first 3 rounds, last)": p["trace"]}
                         for p in res["points"]},
        "chosen": best["form"]}
    mixed = best["mixed"]
    mixed["selection"] = {**mixed["selection"],
                          "joint": {p["form"]: round(p["criterion"], 4) for p in res["points"]},
                          "criterion": mixed["selection"]["criterion"] + "; each engine form at its own fixed point "
                                                                         "with the kernel grid (split64)"}
    if command:
        mixed["command"] = command
    out["components"] = {**out["components"], "mixed": mixed}
    Profile.from_dict(out, out.get("name", "<profile>"))  # must load exactly as the engine will
    return out


def main(argv: list[str] | None = None) -> int:
    a = fitting_parser("split64", __doc__).parse_args(argv)
    try:
        directory = vllm085_directory(a.data)
        with dropped_rows_reported("split64"):
            out = fit_split64(directory, a.model)
            t = Vllm085Tables.read(directory, a.model)
            res = fit_split64_with_mixed(t, fit_vllm085(directory, a.model))
    except FITTING_ERRORS as e:  # (an incomplete directory, an absent model)
        return fitting_error("split64", e)
    out["fixed_points"] = [] if res is None else [
        {"mixed_form": p["form"], "params": {kk: round(float(v), 6) for kk, v in p["fit"].values.items()},
         "stderr": {kk: (round(float(v), 6) if v is not None else None) for kk, v in p["fit"].stderr.items()},
         "mixed_params": p["mixed"]["params"], "criterion_mape_pct": round(p["criterion"], 4),
         "mixed_heldout_mape_pct": {s: round(v["mape_pct"], 3) for s, v in p["mixed"]["fit"]["heldout"].items()},
         "rounds": p["rounds"]} for p in res["points"]]
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    u = out["rows_under_128_tokens"]
    print(f"kernel grid on the calibration's LoRA data: {out['windows']} windows, {out['serving_runs']} serving runs "
          f"(steps under 128 tokens: {u['windows']} windows, {u['serving_runs']} serving runs)")
    print("fitted alone (no mixed term; before the fixed point):")
    for label in ("calibrated (split64_cost 1)", "split64_cost free"):
        r = out[label]
        ps = "  ".join(f"{kk} {v:.4g} +- {r['stderr'][kk]:.2g}" for kk, v in r["params"].items())
        print(f"  {label:<28} {ps}   MAPE windows {r['mape_pct']['windows']:.2f} %, serving runs "
              f"{r['mape_pct']['serving_runs']:.2f} %")
    print("fixed points with the mixed term (best first; criterion: the mixed fit's mean held-out MAPE over its "
          "three sources):")
    for p in out["fixed_points"]:
        ps = "  ".join(f"{kk} {v:.4g} +- {p['stderr'][kk]:.2g}" for kk, v in p["params"].items())
        (mk, mv), = p["mixed_params"].items()
        print(f"  mixed {p['mixed_form']:<17} {ps}  {mk} {mv * 1e3:.4g} ms   criterion {p['criterion_mape_pct']:.2f} % "
              f"({p['rounds']} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
