"""What the calibration tables say about a 64-split working shrink block (issue 17; nothing is written).

vLLM 0.8.5's shrink kernel splits the reduction 64 ways in a step of fewer than 128 tokens and 8 ways in
a larger one. The calibrated ``kernel_grid`` prices a working block alike in both (``split64_cost`` 1,
:class:`twin.perf.forms.KernelGridLora`). The validation's runs without a queue read the profile's step
4-13 % above their real mean TPOT, more with more slots, and pricing a 64-split working block at about
0.6 of an 8-split one removes half of that (:mod:`twin.validation.light_step`). :func:`fit_split64` asks
the calibration instead: it fits the kernel grid's ``l_cta`` and ``l_active`` together with a free
``split64_cost`` on the LoRA fit's own data (the 300-slot windows and the published 600 s serving runs
without a queue, as ``twin calibrate fit`` weighs them), and reports the estimate, its standard error
and the fit's MAPE per source beside the calibrated two-parameter fit. Most of the rows with fewer than
128 tokens per step are the serving runs (rank 8, 8-448 slots; their table records neither the model
nor the vLLM version); the windows hold 2 such rows.

``python -m calibration.fitting.split64 [--data DIR] [--model NAME] [--json]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting import components as C
from calibration.fitting.core import ParamSpec, dropped_rows_reported, fit_params, quality
from calibration.fitting.tables import Vllm085Tables
from calibration.fitting.vllm085 import BACKBONE_METHOD, GRAPH_MAX_TOKENS, backbone_obs, lora_obs, serving_run_lora_obs
from traces.datadir import data_dir

#: rows whose steps have fewer tokens than this run the 64-split shrink (vLLM 0.8.5 ``lora_shrink``)
SPLIT64_BELOW_TOKENS = 128


def fit_split64(directory: str | Path, model: str = "llama-3.1-8b") -> dict[str, Any]:
    """The kernel grid fitted with and without a free ``split64_cost`` on the calibration's LoRA data."""
    t = Vllm085Tables.read(directory, model)
    bb = backbone_obs(t)
    backbone = C.fitted_model(C.fit_backbone(bb, GRAPH_MAX_TOKENS, 5, method=BACKBONE_METHOD), "backbone")
    lo, max_rank = lora_obs(t)
    runs, _ = serving_run_lora_obs(t, backbone)
    obs = pd.concat([lo, runs], ignore_index=True) if len(runs) else lo
    rank = np.concatenate([max_rank, np.full(len(runs), 8.0)])
    y = obs["comp_ms"].to_numpy(float)
    is_run = (obs["kind"] == "run").to_numpy()
    sig = C.runs_weighted_as_windows(obs["sigma"].to_numpy(float), is_run)  # as components.fit_lora weighs them
    base = next(c for c in C.lora_candidates(t.model, GRAPH_MAX_TOKENS)
                if c.form == "kernel_grid" and [s.name for s in c.specs] == ["l_cta", "l_active"])
    free = dataclasses.replace(base, specs=[*base.specs, ParamSpec("split64_cost", 1.0, 0.0, 3.0)])
    small = obs["D"].to_numpy(float) < SPLIT64_BELOW_TOKENS
    out: dict[str, Any] = {"rows": int(len(obs)), "windows": int((~is_run).sum()), "serving_runs": int(is_run.sum()),
                           "rows_under_128_tokens": {"windows": int((small & ~is_run).sum()),
                                                     "serving_runs": int((small & is_run).sum())}}
    for label, cand in (("calibrated (split64_cost 1)", base), ("split64_cost free", free)):
        names = [s.name for s in cand.specs]
        fit = fit_params(lambda *th, c=cand, n=names: C.window_lora_ms(backbone, c.model(dict(zip(n, th))), obs, rank),
                         cand.specs, y, sig, f"lora/{label}")
        pred = C.window_lora_ms(backbone, cand.model(fit.values), obs, rank)
        out[label] = {"params": {k: round(float(v), 6) for k, v in fit.values.items()},
                      "stderr": {k: (round(float(v), 6) if v is not None else None) for k, v in fit.stderr.items()},
                      "mape_pct": {"windows": round(quality(y[~is_run], pred[~is_run])["mape_pct"], 3),
                                   "serving_runs": round(quality(y[is_run], pred[is_run])["mape_pct"], 3)}}
    out["units"] = {"l_cta": "ns/launched block", "l_active": "ns/working block",
                    "split64_cost": "64-split working block / 8-split one"}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.fitting.split64", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="the vLLM 0.8.5 calibration directory (default: "
                                                 "$TWIN_DATA_DIR/calibration/vllm085_h100)")
    ap.add_argument("--model", default="llama-3.1-8b", help="model of the tables (default llama-3.1-8b)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    directory = Path(a.data) if a.data else Path(data_dir()) / "calibration" / "vllm085_h100"
    if not directory.is_dir():
        print(f"split64: no calibration directory {directory}; set TWIN_DATA_DIR or pass --data", file=sys.stderr)
        return 2
    try:
        with dropped_rows_reported("split64"):
            out = fit_split64(directory, a.model)
    except (ValueError, KeyError) as e:
        print(f"split64: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    u = out["rows_under_128_tokens"]
    print(f"kernel grid on the calibration's LoRA data: {out['windows']} windows, {out['serving_runs']} serving runs "
          f"(steps under 128 tokens: {u['windows']} windows, {u['serving_runs']} serving runs)")
    for label in ("calibrated (split64_cost 1)", "split64_cost free"):
        r = out[label]
        ps = "  ".join(f"{k} {v:.4g} +- {r['stderr'][k]:.2g}" for k, v in r["params"].items())
        print(f"  {label:<28} {ps}   MAPE windows {r['mape_pct']['windows']:.2f} %, serving runs "
              f"{r['mape_pct']['serving_runs']:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
