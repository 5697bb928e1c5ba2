"""A validation's files: ``per_run.csv``, ``summary.json`` and the figures (``twin validate --out``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from twin.validation.figures import make_figures
from twin.validation.metrics import METRICS
from twin.validation.runner import ValidationResult

PER_RUN_COLUMNS = ["run_id", "source", "scenario", "run_dir", "ranks", "rates", "served_adapters", "adapter_slots",
                   "max_lora_rank", "status", "twin_status", "split", "load_basis", "client", "sent_fraction", "requests_sent",
                   "nominal_requests", "twin_requests", "twin_finished", "twin_unfinished", "twin_preemptions",
                   "twin_adapter_loads", "twin_client_failed", "twin_kv_tokens", "has_peer", "ts_mean_running",
                   "twin_mean_running", "ts_mean_kv_usage", "twin_mean_kv_usage", "ts_preemptions"]


def per_run_frame(res: ValidationResult) -> pd.DataFrame:
    """The per-run table of ``per_run.csv``: run facts, then real / twin / error (percent) per metric."""
    runs = res.runs
    cols = [c for c in PER_RUN_COLUMNS if c in runs]
    for m in METRICS:
        cols += [f"real_{m.name}", f"twin_{m.name}", f"err_{m.name}"]
        if m.peer:
            cols += [f"peer_{m.name}", f"peer_err_{m.name}"]
    cols += [c for c in ("sim_wall_s", "error") if c in runs]
    out = runs[cols].copy()
    for c in out.columns:
        if c.startswith("err_") or c.startswith("peer_err_"):
            out[c] = out[c] * 100.0  # percent, published-twin convention
    return out


def _json_default(o: Any):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return str(o)


def json_summary(res: ValidationResult) -> str:
    return json.dumps(res.summary, indent=2, default=_json_default)


def write_outputs(res: ValidationResult, out_dir: str | os.PathLike, figures: bool = True) -> list[Path]:
    """Write ``per_run.csv``, ``summary.json`` and (with ``figures``) the figures; the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out / "per_run.csv"
    per_run_frame(res).to_csv(p, index=False, float_format="%.6g")
    paths.append(p)
    p = out / "summary.json"
    p.write_text(json_summary(res))
    paths.append(p)
    if figures:
        paths += make_figures(res, out)
    return paths
