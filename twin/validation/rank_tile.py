"""The cost of a LoRA shrink rank tile beyond the first: the ``ranktile`` profile variant (issue 17).

vLLM 0.8.5's shrink kernel tiles the LoRA rank in blocks of 16 (``BLOCK_N``), so slots padded to
``max_lora_rank`` 32 launch two rank tiles where rank 8 or 16 launch one; the profile's kernel grid
(:class:`twin.perf.forms.KernelGridLora`) prices both tiles' working blocks alike. The calibration
measured rank 8 only, so the rank scaling is an extrapolation there. The fit split shows it is too
steep: in the 10 pairs of ``dt_modelling`` runs without a queue that differ only in the ranks
(``rank_16`` scenarios: max rank 16, ``rank_32``: 32; same slots, adapters and rates) the real mean
ITL grows by 1.01-1.19x from rank 16 to 32, the twin's by 1.06-1.47x.

Mechanism: the blocks of the second rank tile read the same input slice (rows x K split) as the
first, which the first has brought into L2, so they cost less. One constant, ``n_tile_cost`` (the
working-block cost of a rank tile beyond the first relative to the first, dimensionless), fitted
with ``curve_fit`` on the fit split only: for each pair, the real ITL difference (rank 32 - rank 16,
less the model's difference from the rank-32 run's larger batch at rank 16) against the model's
rank-32 - rank-16 difference at the rank-32 run's own mean step composition
(:func:`twin.validation.diagnostics._step_at_mix`), with the serving path's host time in the steps
(``--serving-us``, :data:`twin.validation.specs.SERVING_S_PER_RUNNING`). ``python -m twin.validation.rank_tile
[--write]``. ``twin validate`` applies it to any kernel-grid profile
(:data:`twin.validation.specs.RANK_TILE_COST`, ``--rank-tile-cost``, :meth:`twin.perf.profile.Profile.with_rank_tile_cost`;
stop 40); ``twin run``, the sweeps and ``twin configure search`` take it as an option. ``--write`` stores it in
the variant ``llama-3.1-8b_h100_vllm085_ranktile``, a profile file holding it. Slots of rank <= 16 are unchanged.
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from twin.perf.profile import PROFILE_DIR, Profile, load_profile
from twin.validation.diagnostics import _step_at_mix
from twin.validation.specs import SERVING_S_PER_RUNNING, script_inputs

BASE = "llama-3.1-8b_h100_vllm085"


def rank_pairs(per_run: pd.DataFrame, real: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(rank 16, rank 32) pairs of fit-split runs without a queue with the same rates, slots and adapters."""
    f = per_run[(per_run["split"] == "fit") & per_run["real_itl"].notna()]
    extra = [c for c in real.columns if c not in f.columns or c in ("run_dir", "scenario")]
    f = f.merge(real[extra], on=["run_dir", "scenario"], how="left")
    f = f[f["ts_mean_waiting"] < 1].assign(rates_key=f["scenario"].str.replace(r"^rank_\d+_", "", regex=True))
    out = []
    for _, g in f.groupby(["rates_key", "adapter_slots", "served_adapters"]):
        a, b = g[g["max_lora_rank"] == 16], g[g["max_lora_rank"] == 32]
        if len(a) == 1 and len(b) == 1:
            out.append((a.iloc[0], b.iloc[0]))
    return out


def _with_cost(raw: dict[str, Any], c: float, serving_s_per_running: float = 0.0) -> Profile:
    d = copy.deepcopy(raw)
    d["components"]["lora"]["params"]["n_tile_cost"] = float(c)
    return Profile.from_dict(d, d["name"]).with_serving_host(serving_s_per_running)


def _step(r: pd.Series, prof: Profile, rank: int) -> float:
    r = r.copy()
    r["max_lora_rank"] = rank
    return float(_step_at_mix(r, prof)["model_step_ms"])


def fit_rank_tile(per_run: pd.DataFrame, real: pd.DataFrame, raw: dict[str, Any],
                  serving_s_per_running: float = SERVING_S_PER_RUNNING) -> dict[str, Any]:
    """``n_tile_cost`` fitted on the pairs, with the per-pair real and model differences (ms).

    The steps carry the serving path's host time per running request (``serving_s_per_running``,
    :data:`twin.validation.specs.SERVING_S_PER_RUNNING` as ``twin validate`` uses it), so the
    correction for the rank-32 run's larger batch includes it."""
    h = float(serving_s_per_running)
    pairs = rank_pairs(per_run, real)
    if len(pairs) < 3:
        raise ValueError(f"rank_tile: {len(pairs)} rank-16/rank-32 pairs without a queue; need at least 3")
    p1 = _with_cost(raw, 1.0, h)
    y = np.array([float(b["real_itl"]) - float(a["real_itl"]) - (_step(b, p1, 16) - _step(a, p1, 16))
                  for a, b in pairs])

    def model(_x, c):
        pc = _with_cost(raw, float(c), h)
        return np.array([_step(b, pc, 32) - _step(b, pc, 16) for _, b in pairs])

    popt, pcov = curve_fit(model, None, y, p0=[0.5], bounds=([0.0], [1.0]))
    c = float(popt[0])
    return {"n_tile_cost": float(f"{c:.4g}"), "stderr": float(f"{np.sqrt(pcov[0, 0]):.3g}"), "pairs": len(pairs),
            "serving_us": round(h * 1e6, 3),
            "runs": [f"{b['scenario'].split('_rates_')[1]}/{int(b['adapter_slots'])}/{int(b['served_adapters'])}"
                     for _, b in pairs],
            "real_excess_ms": [round(float(v), 2) for v in y],
            "model_excess_ms_at_1": [round(float(v), 2) for v in model(None, 1.0)],
            "model_excess_ms_fitted": [round(float(v), 2) for v in model(None, c)]}


def ranktile_variant(raw: dict[str, Any], fit: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    out["name"] = raw["name"] + "_ranktile"
    out["description"] = (raw.get("description", "") + "; variant 'ranktile' (issue 17): the LoRA shrink's second "
                          "rank tile priced at n_tile_cost of the first (twin.validation.rank_tile)")
    lo = out["components"]["lora"]
    lo["params"]["n_tile_cost"] = fit["n_tile_cost"]
    lo.setdefault("stderr", {})["n_tile_cost"] = fit["stderr"]
    lo["units"]["n_tile_cost"] = "working-block cost of a shrink rank tile beyond the first, relative to the first"
    lo["n_tile_cost_fit"] = fit
    out["provenance"] = {**out.get("provenance", {}), "validation_data_used": True, "variant": {
        "of": raw["name"], "command": f"python -m twin.validation.rank_tile --base {raw['name']} --write",
        "changed": ["lora.n_tile_cost"],
        "data": "n_tile_cost: the dt_modelling (fit split) runs only, never ml_test; every other constant from "
                "the calibration tables"}}
    Profile.from_dict(out, out["name"])  # must load exactly as the engine will
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-run", default="results/validation/per_run.csv",
                    help="a validation pass's per_run.csv (the fit split's real ITL and gauges; default: the committed pass)")
    ap.add_argument("--real", default=None, help="real-run table (default: under $TWIN_DATA_DIR)")
    ap.add_argument("--base", default=BASE, help=f"profile the variant starts from (default {BASE}; e.g. "
                                                 f"{BASE}_interval for both variants together)")
    ap.add_argument("--serving-us", type=float, default=SERVING_S_PER_RUNNING * 1e6,
                    help="the serving path's host time per running request and step the steps carry (us; default "
                         "twin validate's)")
    ap.add_argument("--write", action="store_true", help="write the variant profile into calibration/profiles")
    a = ap.parse_args(argv)
    real_csv = script_inputs(a.real, a.per_run)
    raw = load_profile(a.base).raw
    fit = fit_rank_tile(pd.read_csv(a.per_run), pd.read_csv(real_csv), raw, a.serving_us * 1e-6)
    print(json.dumps(fit, indent=1))
    if a.write:
        out = ranktile_variant(raw, fit)
        dst = PROFILE_DIR / f"{out['name']}.json"
        dst.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
